//! The systematic Reed-Solomon codec Nacre's RAID engine uses: `k` data
//! shards, `m` parity shards, shard indices `0..k` for data and `k..k+m` for
//! parity, generator `[I; C]` with `C` from [`coding_matrix`].
//!
//! Every operation reduces to one [`gf_dot`] call: encoding is `C` times the
//! data, a read-modify-write update is one column of `C` times the delta, and
//! reconstruction is a precomputed `wanted × k` matrix times k surviving
//! shards, so rebuilding costs exactly an encode of the same shape.

use std::fmt;

use super::gf;
use super::kernel::{Kernel, gf_dot_with};
use super::matrix::{coding_matrix, generator_matrix};

#[cfg(doc)]
use super::kernel::gf_dot;

/// Largest number of data shards supported (the MDS property is verified
/// exhaustively up to here by the matrix tests).
pub const MAX_DATA_SHARDS: usize = 32;
/// Largest number of parity shards supported.
pub const MAX_PARITY_SHARDS: usize = 4;

/// Why a codec or decoder could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodecError {
    /// `k` outside `1..=MAX_DATA_SHARDS`.
    BadDataShards(usize),
    /// `m` outside `0..=MAX_PARITY_SHARDS`.
    BadParityShards(usize),
    /// A shard index is not below `k + m`.
    ShardOutOfRange {
        /// The offending index.
        index: usize,
        /// `k + m`.
        shards: usize,
    },
    /// Fewer than `k` distinct shards are present.
    NotEnoughShards {
        /// Distinct shards present.
        present: usize,
        /// Shards needed (`k`).
        needed: usize,
    },
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::BadDataShards(k) => {
                write!(f, "data shard count {k} not in 1..={MAX_DATA_SHARDS}")
            }
            CodecError::BadParityShards(m) => {
                write!(f, "parity shard count {m} not in 0..={MAX_PARITY_SHARDS}")
            }
            CodecError::ShardOutOfRange { index, shards } => {
                write!(f, "shard index {index} out of range (codec has {shards} shards)")
            }
            CodecError::NotEnoughShards { present, needed } => {
                write!(f, "{present} distinct shards present, {needed} needed to decode")
            }
        }
    }
}

impl std::error::Error for CodecError {}

/// Row indices 0..MAX_PARITY_SHARDS, for updates of every parity row.
const ALL_ROWS: [usize; MAX_PARITY_SHARDS] = {
    let mut r = [0; MAX_PARITY_SHARDS];
    let mut i = 0;
    while i < MAX_PARITY_SHARDS {
        r[i] = i;
        i += 1;
    }
    r
};

/// A `k + m` erasure codec.
#[derive(Debug, Clone)]
pub struct Codec {
    k: usize,
    m: usize,
    /// m × k, row-major.
    matrix: Vec<u8>,
}

impl Codec {
    /// A codec with `k` data and `m` parity shards.
    pub fn new(k: usize, m: usize) -> Result<Self, CodecError> {
        if !(1..=MAX_DATA_SHARDS).contains(&k) {
            return Err(CodecError::BadDataShards(k));
        }
        if m > MAX_PARITY_SHARDS {
            return Err(CodecError::BadParityShards(m));
        }
        Ok(Codec { k, m, matrix: coding_matrix(k, m) })
    }

    /// Number of data shards.
    pub fn data_shards(&self) -> usize {
        self.k
    }

    /// Number of parity shards.
    pub fn parity_shards(&self) -> usize {
        self.m
    }

    /// The m × k coding matrix, row-major.
    pub fn matrix(&self) -> &[u8] {
        &self.matrix
    }

    /// Computes all parity shards from the data shards.
    ///
    /// Panics unless `data.len() == k`, `parity.len() == m` and all buffers
    /// have the same length.
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) {
        self.encode_with(Kernel::detect(), data, parity);
    }

    /// [`Codec::encode`] with an explicit kernel (tests, benchmarks).
    pub fn encode_with(&self, kernel: Kernel, data: &[&[u8]], parity: &mut [&mut [u8]]) {
        assert_eq!(data.len(), self.k, "encode: expected {} data shards", self.k);
        assert_eq!(parity.len(), self.m, "encode: expected {} parity shards", self.m);
        gf_dot_with(kernel, &self.matrix, data, parity, false);
    }

    /// Read-modify-write: after data shard `data_index` changed by `delta`
    /// (old XOR new), brings every parity shard up to date:
    /// `parity[p] ^= C[p][data_index] * delta`.
    ///
    /// Panics if `data_index >= k`, `parity.len() != m`, or lengths differ.
    pub fn update(&self, data_index: usize, delta: &[u8], parity: &mut [&mut [u8]]) {
        assert!(data_index < self.k, "update: data index {data_index} >= k = {}", self.k);
        assert_eq!(parity.len(), self.m, "update: expected {} parity shards", self.m);
        self.update_rows(data_index, &ALL_ROWS[..self.m], delta, parity);
    }

    /// [`Codec::update`] for a subset of the parity rows: `parity[i]` is parity shard
    /// `rows[i]`. A degraded volume updates only the parity strips it can read.
    ///
    /// Panics if `data_index >= k`, a row is `>= m`, or `rows.len() != parity.len()`.
    pub fn update_rows(&self, data_index: usize, rows: &[usize], delta: &[u8], parity: &mut [&mut [u8]]) {
        assert!(data_index < self.k, "update: data index {data_index} >= k = {}", self.k);
        assert_eq!(rows.len(), parity.len(), "update: one parity buffer per row");
        // Column `data_index` of C, on the stack: no allocation per update.
        let mut column = [0u8; MAX_PARITY_SHARDS];
        for (c, &p) in column.iter_mut().zip(rows) {
            assert!(p < self.m, "update: parity row {p} >= m = {}", self.m);
            *c = self.matrix[p * self.k + data_index];
        }
        gf_dot_with(Kernel::detect(), &column[..rows.len()], &[delta], parity, true);
    }

    /// Plans the reconstruction of the shards `wanted` (data or parity
    /// indices) from the shards `present`.
    ///
    /// The decoder reads k of the present shards: data shards first (their
    /// generator rows are unit vectors, which keeps the inverse sparse),
    /// then parity, lowest index first; [`Decoder::inputs`] tells which.
    /// So one lost data shard is rebuilt from the other data and P, with
    /// all-ones coefficients: the kernels' XOR-only path.
    /// Duplicate indices are ignored. Errors if an index is `>= k + m` or
    /// fewer than k distinct shards are present.
    pub fn decoder(&self, present: &[usize], wanted: &[usize]) -> Result<Decoder, CodecError> {
        let (k, n) = (self.k, self.k + self.m);
        if let Some(&index) = present.iter().chain(wanted).find(|&&i| i >= n) {
            return Err(CodecError::ShardOutOfRange { index, shards: n });
        }
        let mut have = vec![false; n];
        for &i in present {
            have[i] = true;
        }
        let distinct = have.iter().filter(|&&h| h).count();
        if distinct < k {
            return Err(CodecError::NotEnoughShards { present: distinct, needed: k });
        }
        // Shard indices ascend, and data (0..k) sort before parity.
        let inputs: Vec<usize> = (0..n).filter(|&i| have[i]).take(k).collect();

        let generator = generator_matrix(k, self.m);
        let sub: Vec<u8> = inputs.iter().flat_map(|&s| generator[s * k..(s + 1) * k].iter().copied()).collect();
        // MDS: any k rows of [I; C] are invertible (tested in matrix.rs).
        let inverse = gf::invert_matrix(&sub, k).expect("coding matrix is MDS, so any k shards are decodable");
        // Data = inverse × inputs, so shard w = G[w] × inverse × inputs.
        let wanted_rows: Vec<u8> = wanted.iter().flat_map(|&w| generator[w * k..(w + 1) * k].iter().copied()).collect();
        let coeffs = gf::matrix_mul(&wanted_rows, &inverse, wanted.len(), k, k);
        Ok(Decoder { inputs, wanted: wanted.to_vec(), coeffs })
    }
}

/// A reconstruction plan from [`Codec::decoder`]: k input shards → the
/// wanted shards. Reusable for any number of stripes with the same loss
/// pattern.
#[derive(Debug, Clone)]
pub struct Decoder {
    inputs: Vec<usize>,
    wanted: Vec<usize>,
    /// wanted × k, row-major.
    coeffs: Vec<u8>,
}

impl Decoder {
    /// The shard indices [`Decoder::apply`] reads, in the order it expects
    /// them (ascending, exactly k of them).
    pub fn inputs(&self) -> &[usize] {
        &self.inputs
    }

    /// The shard indices [`Decoder::apply`] writes, in order.
    pub fn wanted(&self) -> &[usize] {
        &self.wanted
    }

    /// The wanted × k reconstruction coefficients, row-major.
    pub fn coefficients(&self) -> &[u8] {
        &self.coeffs
    }

    /// Rebuilds the wanted shards: `inputs[i]` is the shard
    /// `self.inputs()[i]`, `outputs[j]` receives shard `self.wanted()[j]`.
    ///
    /// Panics on a count or length mismatch.
    pub fn apply(&self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) {
        self.apply_with(Kernel::detect(), inputs, outputs);
    }

    /// [`Decoder::apply`] with an explicit kernel (tests, benchmarks).
    pub fn apply_with(&self, kernel: Kernel, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) {
        assert_eq!(inputs.len(), self.inputs.len(), "decode: wrong number of inputs");
        assert_eq!(outputs.len(), self.wanted.len(), "decode: wrong number of outputs");
        gf_dot_with(kernel, &self.coeffs, inputs, outputs, false);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_rng::{Rng, seed_from_env};
    use super::*;

    fn random_stripe(rng: &mut Rng, k: usize, m: usize, len: usize) -> Vec<Vec<u8>> {
        let mut shards: Vec<Vec<u8>> = (0..k).map(|_| rng.bytes(len)).collect();
        shards.extend((0..m).map(|_| vec![0u8; len]));
        shards
    }

    fn encode_stripe(codec: &Codec, kernel: Kernel, shards: &mut [Vec<u8>]) {
        let (data, parity) = shards.split_at_mut(codec.data_shards());
        let data: Vec<&[u8]> = data.iter().map(|v| &v[..]).collect();
        let mut parity: Vec<&mut [u8]> = parity.iter_mut().map(|v| &mut v[..]).collect();
        codec.encode_with(kernel, &data, &mut parity);
    }

    /// Calls `f` with every subset of `0..n` of size at most `max`.
    fn for_each_erasure(n: usize, max: usize, f: &mut dyn FnMut(&[usize])) {
        for mask in 0u64..1 << n {
            if mask.count_ones() as usize <= max {
                let set: Vec<usize> = (0..n).filter(|&i| mask >> i & 1 == 1).collect();
                f(&set);
            }
        }
    }

    #[test]
    fn encode_erase_decode_roundtrip() {
        let seed = seed_from_env();
        eprintln!("encode_erase_decode_roundtrip seed = {seed:#x}");
        let mut rng = Rng::new(seed);
        for kernel in Kernel::all_available() {
            for k in [1usize, 2, 4, 8, 16] {
                for m in 0..=4 {
                    let codec = Codec::new(k, m).unwrap();
                    let len = [1, 63, 64, 200, 777][rng.below(5)];
                    let mut shards = random_stripe(&mut rng, k, m, len);
                    encode_stripe(&codec, kernel, &mut shards);
                    let n = k + m;
                    let mut check = |lost: &[usize]| {
                        let present: Vec<usize> = (0..n).filter(|i| !lost.contains(i)).collect();
                        let dec = codec.decoder(&present, lost).unwrap();
                        assert_eq!(dec.inputs().len(), k);
                        let ins: Vec<&[u8]> = dec.inputs().iter().map(|&i| &shards[i][..]).collect();
                        let mut outs: Vec<Vec<u8>> = lost.iter().map(|_| vec![0xAA; len]).collect();
                        let mut out_refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
                        dec.apply_with(kernel, &ins, &mut out_refs);
                        for (j, &w) in lost.iter().enumerate() {
                            assert!(
                                outs[j] == shards[w],
                                "{kernel:?} k={k} m={m} len={len} lost={lost:?}: shard {w} wrong (seed {seed:#x})"
                            );
                        }
                    };
                    // Every erasure pattern of up to m shards.
                    for_each_erasure(n, m, &mut check);
                }
            }
        }
    }

    #[test]
    fn update_equals_reencode() {
        let seed = seed_from_env();
        eprintln!("update_equals_reencode seed = {seed:#x}");
        let mut rng = Rng::new(seed);
        for k in [1usize, 2, 3, 8, 16, 32] {
            for m in 0..=4 {
                let codec = Codec::new(k, m).unwrap();
                let len = rng.below(300) + 1;
                let mut shards = random_stripe(&mut rng, k, m, len);
                encode_stripe(&codec, Kernel::detect(), &mut shards);
                for _ in 0..3 {
                    let j = rng.below(k);
                    let new = rng.bytes(len);
                    let delta: Vec<u8> = shards[j].iter().zip(&new).map(|(a, b)| a ^ b).collect();
                    shards[j] = new;
                    let mut parity: Vec<&mut [u8]> = shards[k..].iter_mut().map(|v| &mut v[..]).collect();
                    codec.update(j, &delta, &mut parity);
                    let updated: Vec<Vec<u8>> = shards[k..].to_vec();
                    encode_stripe(&codec, Kernel::Scalar, &mut shards);
                    assert_eq!(updated, shards[k..].to_vec(), "k={k} m={m} j={j} seed={seed:#x}");
                }
            }
        }
    }

    #[test]
    fn p_parity_is_xor() {
        let codec = Codec::new(5, 2).unwrap();
        let data: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i.wrapping_mul(37) ^ 0x5A; 100]).collect();
        let refs: Vec<&[u8]> = data.iter().map(|v| &v[..]).collect();
        let (mut p, mut q) = (vec![0u8; 100], vec![0u8; 100]);
        codec.encode(&refs, &mut [&mut p[..], &mut q[..]]);
        let x = data.iter().fold(0u8, |a, v| a ^ v[0]);
        assert!(p.iter().all(|&b| b == x));
    }

    #[test]
    fn errors() {
        assert_eq!(Codec::new(0, 2).unwrap_err(), CodecError::BadDataShards(0));
        assert_eq!(Codec::new(33, 2).unwrap_err(), CodecError::BadDataShards(33));
        assert_eq!(Codec::new(4, 5).unwrap_err(), CodecError::BadParityShards(5));
        let c = Codec::new(4, 2).unwrap();
        assert_eq!(c.decoder(&[0, 1, 2], &[3]).unwrap_err(), CodecError::NotEnoughShards { present: 3, needed: 4 });
        assert_eq!(c.decoder(&[0, 1, 1, 2], &[3]).unwrap_err(), CodecError::NotEnoughShards { present: 3, needed: 4 });
        assert_eq!(c.decoder(&[0, 1, 2, 6], &[3]).unwrap_err(), CodecError::ShardOutOfRange { index: 6, shards: 6 });
        assert_eq!(c.decoder(&[0, 1, 2, 3], &[9]).unwrap_err(), CodecError::ShardOutOfRange { index: 9, shards: 6 });
        // Errors print something useful.
        assert!(Codec::new(0, 0).unwrap_err().to_string().contains("1..=32"));
        // Wanted may include present shards and parity.
        let d = c.decoder(&[5, 4, 3, 2, 1, 0], &[0, 5]).unwrap();
        assert_eq!(d.inputs(), &[0, 1, 2, 3]);
        assert_eq!(d.wanted(), &[0, 5]);
    }
}
