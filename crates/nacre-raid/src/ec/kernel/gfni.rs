//! AVX-512 + GFNI kernel: `vgf2p8affineqb` multiplies 64 bytes by a constant
//! in one instruction, given the constant as an 8×8 bit matrix.
//!
//! Shape of the loop: for each block of columns, every input vector is
//! loaded once and multiplied into up to [`MAX_GROUP`] output accumulators
//! held in registers; outputs are written once per block. Coefficient
//! matrices are staged contiguously per call and fed to the instruction as
//! 64-bit broadcast memory operands, so any k works without running out of
//! registers. The tail (< 64 bytes) uses byte-masked loads and stores, which
//! cannot fault on the masked-out bytes.
//!
//! Three choices were measured (`examples/kernels.rs`, and a throwaway
//! sweep of variants on the same buffers, against ISA-L 2.32 in the same
//! process, on the 2-core AMD Zen 5 VM this was written on):
//! - **Inputs per pass** ([`max_pass`]): at most 8 inputs (6 when there are
//!   3–4 outputs) are combined per pass over the columns; more inputs take
//!   further passes that accumulate into the outputs. With 4 KiB-aligned
//!   strips (what page-aligned I/O buffers give), all k+m streams map to the
//!   same L1 sets; 16+2 from L2 went from 61–68 GB/s in one pass to 117–135
//!   in two passes of 8 (ISA-L, one pass: 57–60). With strips at unrelated
//!   offsets, passes of 8 cost nothing measurable (16+2: 123–135 vs 128–139).
//! - **Columns per iteration** ([`L1_BUDGET`]): 4 columns (256 bytes) per
//!   iteration share each matrix load and loop step across more work and
//!   win when the data sits in L1 (8+2 with 4 KiB strips: 161 GB/s vs 113
//!   with 1 column); once the buffers spill to L2, 1 column per iteration
//!   was faster in every layout measured (8+2 with 32 KiB strips: 110–137
//!   vs 89–98 with 4, 86–130 with 2), and within noise of 2 or 4 when
//!   streaming from DRAM. So: 4 columns while a pass's buffers fit in L1.
//! - **XOR row** (`X0`): an all-ones row (the P parity) skips the affine
//!   instruction: +15–18% for 8+2 and 4+1 encode from L1, +5–10% streaming.

use std::arch::x86_64::*;

use super::super::gf;
use super::{CoeffBlock, MAX_GROUP, MAX_INPUTS, raw_pointers};

/// The bit matrix of "multiply by `c`" in the layout `vgf2p8affineqb`
/// expects: result bit `i` is the parity of `x & byte[7 - i]`, so byte
/// `7 - i` holds, for each input bit `j`, bit `i` of `c * 2^j`.
const fn affine_matrix(c: u8) -> u64 {
    let mut a = 0u64;
    let mut i = 0;
    while i < 8 {
        let mut row = 0u8;
        let mut j = 0;
        while j < 8 {
            if (gf::mul(c, 1 << j) >> i) & 1 != 0 {
                row |= 1 << j;
            }
            j += 1;
        }
        a |= (row as u64) << (8 * (7 - i));
        i += 1;
    }
    a
}

static MATRICES: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = affine_matrix(c as u8);
        c += 1;
    }
    t
};

/// Bytes of buffers (a pass's inputs plus the outputs) up to which the data
/// is assumed hot in L1 and 4 columns per iteration are used (see the module
/// doc). 48 KiB = L1D of Zen 4/5 and Intel since Ice Lake.
const L1_BUDGET: usize = 48 * 1024;

/// With several passes, columns are processed in chunks of this many bytes
/// so the outputs a later pass re-reads are still in L2 (4 outputs × 64 KiB)
/// even for multi-MiB strips; a chunk is long enough for the prefetchers to
/// stream each input.
const CHUNK: usize = 64 * 1024;

/// Most inputs combined per pass for `n_out` outputs: keeps inputs + outputs
/// within ~10 streams, below the 12 ways of the L1 sets they collide in
/// when strips are 4 KiB-aligned (measured best: 8 for m ≤ 2, 4–6 for
/// m = 3–4).
fn max_pass(n_out: usize) -> usize {
    if n_out <= 2 { 8 } else { 6 }
}

/// # Safety
/// The CPU must support AVX-512 F and BW and GFNI; `1 <= inputs.len() <=
/// MAX_INPUTS`, `1 <= outputs.len() <= MAX_GROUP`, and every buffer at
/// least `len` bytes long; `block` must cover exactly these inputs and
/// outputs.
pub(super) unsafe fn dot(
    block: &CoeffBlock<'_>,
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
    len: usize,
    accumulate: bool,
) {
    let n_in = inputs.len();
    let n_out = outputs.len();
    assert!((1..=MAX_INPUTS).contains(&n_in) && (1..=MAX_GROUP).contains(&n_out));

    // Matrices input-major ([c][r]) so the inner loop walks them linearly
    // and each pass's matrices are one contiguous slice.
    let mut mats = [0u64; MAX_INPUTS * MAX_GROUP];
    for c in 0..n_in {
        for r in 0..n_out {
            mats[c * n_out + r] = MATRICES[block.get(r, c) as usize];
        }
    }
    let (ins, outs) = raw_pointers(inputs, outputs);
    let ins = &ins[..n_in];
    let xor0 = block.row_is_xor(0);

    // Balanced passes: 16 inputs → 8 + 8, 12 inputs with 4 outputs → 6 + 6.
    let n_pass = n_in.div_ceil(max_pass(n_out));
    let pass = n_in.div_ceil(n_pass);
    let chunk = if n_pass > 1 { CHUNK } else { len };
    let wide = (pass + n_out) * len <= L1_BUDGET;

    let mut start = 0;
    while start < len {
        let end = len.min(start + chunk);
        for (p, pass_ins) in ins.chunks(pass).enumerate() {
            let pass_mats = &mats[p * pass * n_out..(p * pass + pass_ins.len()) * n_out];
            let acc = accumulate || p > 0;
            macro_rules! go {
                ($n:literal) => {
                    // SAFETY: forwarded from this function's contract:
                    // `pass_mats` holds pass_ins.len() * $n matrices, the
                    // first $n `outs` are valid, and start..end is within
                    // every buffer.
                    unsafe {
                        match (wide, xor0) {
                            (false, false) => run::<$n, 1, false>(pass_mats, pass_ins, &outs, start, end, acc),
                            (false, true) => run::<$n, 1, true>(pass_mats, pass_ins, &outs, start, end, acc),
                            (true, false) => run::<$n, 4, false>(pass_mats, pass_ins, &outs, start, end, acc),
                            (true, true) => run::<$n, 4, true>(pass_mats, pass_ins, &outs, start, end, acc),
                        }
                    }
                };
            }
            match n_out {
                1 => go!(1),
                2 => go!(2),
                3 => go!(3),
                4 => go!(4),
                _ => unreachable!(),
            }
        }
        start = end;
    }
}

/// Bytes `start..end` of `N` outputs from the inputs `ins`, `U` columns of
/// 64 bytes per iteration. `X0`: output 0 has all coefficients 1 and is
/// computed with plain XORs. `acc`: xor into the outputs' contents.
///
/// # Safety
/// See [`dot`]; `mats` holds `ins.len() * N` matrices (input-major),
/// `outs[..N]` and all of `ins` are valid for `start..end`.
#[target_feature(enable = "avx512f,avx512bw,gfni")]
unsafe fn run<const N: usize, const U: usize, const X0: bool>(
    mats: &[u64],
    ins: &[*const u8],
    outs: &[*mut u8; MAX_GROUP],
    start: usize,
    end: usize,
    acc: bool,
) {
    debug_assert!(mats.len() == ins.len() * N && !ins.is_empty());
    let mut off = start;
    while off + 64 * U <= end {
        // SAFETY: off + 64 * U <= end, inside the caller's valid range.
        unsafe { columns::<N, U, X0, false>(mats, ins, outs, off, !0, acc) };
        off += 64 * U;
    }
    while off + 64 <= end {
        // SAFETY: off + 64 <= end.
        unsafe { columns::<N, 1, X0, false>(mats, ins, outs, off, !0, acc) };
        off += 64;
    }
    if off < end {
        // 0 < end - off < 64, so the shift is in range and the mask selects
        // exactly the bytes off..end.
        let mask = (1u64 << (end - off)) - 1;
        // SAFETY: with this mask only bytes below `end` are accessed.
        unsafe { columns::<N, 1, X0, true>(mats, ins, outs, off, mask, acc) };
    }
}

/// `U` consecutive 64-byte columns starting at byte `off`, for `N` outputs.
/// With `MASKED` (only with `U == 1`) just the bytes selected by `mask`.
///
/// # Safety
/// See [`run`]; every input and output must be readable/writable at
/// `off..off + 64 * U` (or at the masked bytes).
#[target_feature(enable = "avx512f,avx512bw,gfni")]
#[inline]
unsafe fn columns<const N: usize, const U: usize, const X0: bool, const MASKED: bool>(
    mats: &[u64],
    ins: &[*const u8],
    outs: &[*mut u8; MAX_GROUP],
    off: usize,
    mask: u64,
    acc: bool,
) {
    let load = |p: *const u8| -> __m512i {
        if MASKED {
            // SAFETY: masked-out bytes are never accessed (no fault).
            unsafe { _mm512_maskz_loadu_epi8(mask, p.cast()) }
        } else {
            // SAFETY: caller guarantees 64 readable bytes at `p`.
            unsafe { _mm512_loadu_si512(p.cast()) }
        }
    };
    let mat = |c: usize, r: usize| -> __m512i {
        // SAFETY: c < ins.len() and r < N, and mats.len() == ins.len() * N.
        _mm512_set1_epi64(unsafe { *mats.get_unchecked(c * N + r) } as i64)
    };

    let mut sum = [[_mm512_setzero_si512(); U]; N];
    let mut v = [_mm512_setzero_si512(); U];
    // The first input initialises the sums (saves one XOR each).
    for (u, vu) in v.iter_mut().enumerate() {
        // SAFETY: `ins` is non-empty; bytes in range per the contract.
        *vu = load(unsafe { ins.get_unchecked(0).add(off + 64 * u) });
    }
    for (r, sum_r) in sum.iter_mut().enumerate() {
        if X0 && r == 0 {
            *sum_r = v;
        } else {
            let m = mat(0, r);
            for u in 0..U {
                sum_r[u] = _mm512_gf2p8affine_epi64_epi8::<0>(v[u], m);
            }
        }
    }
    for (c, &p) in ins.iter().enumerate().skip(1) {
        for (u, vu) in v.iter_mut().enumerate() {
            // SAFETY: bytes in range per the contract.
            *vu = load(unsafe { p.add(off + 64 * u) });
        }
        for (r, sum_r) in sum.iter_mut().enumerate() {
            if X0 && r == 0 {
                for u in 0..U {
                    sum_r[u] = _mm512_xor_si512(sum_r[u], v[u]);
                }
            } else {
                let m = mat(c, r);
                for u in 0..U {
                    let t = _mm512_gf2p8affine_epi64_epi8::<0>(v[u], m);
                    sum_r[u] = _mm512_xor_si512(sum_r[u], t);
                }
            }
        }
    }
    for (r, sum_r) in sum.iter().enumerate() {
        for (u, &s) in sum_r.iter().enumerate() {
            // SAFETY: r < N, so outs[r] is a valid output; in range per the
            // contract.
            let dst = unsafe { outs.get_unchecked(r).add(off + 64 * u) };
            let x = if acc { _mm512_xor_si512(s, load(dst)) } else { s };
            if MASKED {
                // SAFETY: only the bytes selected by `mask` are written.
                unsafe { _mm512_mask_storeu_epi8(dst.cast(), mask, x) };
            } else {
                // SAFETY: 64 writable bytes at `dst`.
                unsafe { _mm512_storeu_si512(dst.cast(), x) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_matrices_multiply() {
        assert_eq!(MATRICES[0], 0);
        // Multiplying by 1 is the identity matrix of `vgf2p8affineqb`.
        assert_eq!(MATRICES[1], 0x0102_0408_1020_4080);
        // Apply the matrix in software the way the instruction defines it.
        for c in 0..=255u8 {
            for x in 0..=255u8 {
                let a = MATRICES[c as usize];
                let mut y = 0u8;
                for i in 0..8 {
                    let row = (a >> (8 * (7 - i))) as u8;
                    y |= (((row & x).count_ones() & 1) as u8) << i;
                }
                assert_eq!(y, gf::mul(c, x), "c={c} x={x}");
            }
        }
    }

    #[test]
    fn pass_split_is_balanced() {
        let split = |n_in: usize, n_out: usize| {
            let n_pass = n_in.div_ceil(max_pass(n_out));
            (n_pass, n_in.div_ceil(n_pass))
        };
        assert_eq!(split(8, 2), (1, 8));
        assert_eq!(split(16, 2), (2, 8));
        assert_eq!(split(12, 4), (2, 6));
        assert_eq!(split(32, 2), (4, 8));
        assert_eq!(split(13, 3), (3, 5));
    }
}
