//! Intel ISA-L as a reference implementation (cargo feature `isal`, or
//! `isal-system` for Debian's older library): the byte-for-byte oracle in
//! tests and the speed bar in the bench. Not used by the codec itself.
//!
//! `ec_init_tables` expands a coefficient matrix once (ISA-L 2.32 always
//! writes 32 bytes per coefficient, whichever SIMD path it will use), then
//! `ec_encode_data` computes `rows` outputs from `k` inputs, dispatching on
//! CPU features inside ISA-L (AVX-512 + GFNI on this machine).

use std::os::raw::{c_int, c_uchar};

use erasure_isa_l_sys as sys;

/// Which ISA-L this build links (the `isal-system` feature wins when both
/// are on, because the `-sys` build script then tries pkg-config first).
pub const ISAL_VERSION: &str = if cfg!(feature = "isal-system") {
    "ISA-L 2.30 (Debian libisal-dev)"
} else {
    "ISA-L 2.32 (vendored, from source)"
};

/// ISA-L's limit on inputs/outputs per call is far above ours; the pointer
/// arrays it needs live on the stack up to this size (no allocation per
/// call, so the bench times ISA-L alone).
const MAX_PTRS: usize = 256;

/// Expanded coefficient tables for [`isal_encode`].
pub struct IsalTables {
    k: usize,
    rows: usize,
    tables: Vec<u8>,
}

impl IsalTables {
    /// Tables for the `rows` × `k` coefficient matrix `coeffs` (row-major).
    pub fn new(coeffs: &[u8], rows: usize, k: usize) -> Self {
        assert_eq!(coeffs.len(), rows * k, "IsalTables: coeffs must be rows x k");
        assert!((1..MAX_PTRS).contains(&k) && rows < MAX_PTRS);
        let mut a = coeffs.to_vec();
        let mut tables = vec![0u8; 32 * k * rows];
        // SAFETY: ISA-L reads rows*k coefficients from `a` and writes
        // 32*k*rows bytes to `tables`, exactly the sizes allocated.
        unsafe { sys::ec_init_tables(k as c_int, rows as c_int, a.as_mut_ptr(), tables.as_mut_ptr()) };
        IsalTables { k, rows, tables }
    }
}

/// ISA-L's `ec_encode_data`: `outputs[r] = Σ_c coeffs[r][c] * inputs[c]`.
/// Panics on a count or length mismatch, or buffers over 2 GiB.
pub fn isal_encode(tables: &IsalTables, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) {
    assert_eq!(inputs.len(), tables.k, "isal_encode: wrong number of inputs");
    assert_eq!(outputs.len(), tables.rows, "isal_encode: wrong number of outputs");
    let Some(len) = inputs.first().map(|i| i.len()) else {
        return;
    };
    assert!(
        inputs.iter().all(|i| i.len() == len) && outputs.iter().all(|o| o.len() == len),
        "isal_encode: all buffers must have the same length"
    );
    let len = c_int::try_from(len).expect("isal_encode: buffer too large for ISA-L");
    let mut ins = [std::ptr::null_mut::<c_uchar>(); MAX_PTRS];
    for (p, i) in ins.iter_mut().zip(inputs) {
        // ISA-L takes `unsigned char **` but only reads the inputs.
        *p = i.as_ptr().cast_mut();
    }
    let mut outs = [std::ptr::null_mut::<c_uchar>(); MAX_PTRS];
    for (p, o) in outs.iter_mut().zip(outputs.iter_mut()) {
        *p = o.as_mut_ptr();
    }
    // SAFETY: `tables` was built for exactly k inputs and `rows` outputs;
    // each pointer addresses `len` bytes (checked above); inputs are only
    // read, outputs are distinct `&mut` buffers.
    unsafe {
        sys::ec_encode_data(
            len,
            tables.k as c_int,
            tables.rows as c_int,
            tables.tables.as_ptr().cast_mut(),
            ins.as_mut_ptr(),
            outs.as_mut_ptr(),
        )
    };
}

/// ISA-L's scalar `gf_mul`, for cross-checking the field.
pub fn isal_gf_mul(a: u8, b: u8) -> u8 {
    // SAFETY: pure function on two bytes.
    unsafe { sys::gf_mul(a, b) }
}

#[cfg(test)]
mod tests {
    use super::super::super::test_rng::{Rng, seed_from_env};
    use super::super::super::{Codec, gf};
    use super::*;

    #[test]
    fn field_matches_isal() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(gf::mul(a, b), isal_gf_mul(a, b), "{a} * {b}");
            }
        }
    }

    #[test]
    fn encode_matches_isal_ec_encode_data() {
        let seed = seed_from_env();
        eprintln!("encode_matches_isal_ec_encode_data seed = {seed:#x} ({ISAL_VERSION})");
        let mut rng = Rng::new(seed);
        for k in (1..=32).filter(|k| *k <= 17 || k % 5 == 0 || *k == 32) {
            for m in 1..=4 {
                let codec = Codec::new(k, m).unwrap();
                let tables = IsalTables::new(codec.matrix(), m, k);
                for len in [1, 15, 16, 31, 32, 63, 64, 65, 127, 200, 4096, 4096 + 77] {
                    let data: Vec<Vec<u8>> = (0..k).map(|_| rng.bytes(len)).collect();
                    let refs: Vec<&[u8]> = data.iter().map(|v| &v[..]).collect();
                    let mut ours = vec![vec![0u8; len]; m];
                    let mut theirs = vec![vec![0u8; len]; m];
                    let mut o: Vec<&mut [u8]> = ours.iter_mut().map(|v| &mut v[..]).collect();
                    codec.encode(&refs, &mut o);
                    let mut t: Vec<&mut [u8]> = theirs.iter_mut().map(|v| &mut v[..]).collect();
                    isal_encode(&tables, &refs, &mut t);
                    assert!(ours == theirs, "k={k} m={m} len={len} seed={seed:#x}");
                }
            }
        }
    }
}
