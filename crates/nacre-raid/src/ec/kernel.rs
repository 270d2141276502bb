//! The one hot loop of the erasure code: a GF(2^8) matrix-times-vectors
//! product over whole buffers, [`gf_dot`]. Encoding (k data → m parity),
//! reconstruction (k survivors → lost shards) and parity refresh are all this
//! same product with different coefficient rows, so all tuning lives here.
//!
//! Three implementations, chosen once per process by CPU feature detection
//! ([`Kernel::detect`]) and overridable per call ([`gf_dot_with`]) for tests
//! and benchmarks:
//! - [`Kernel::Scalar`]: portable, 256-entry product table per coefficient.
//! - [`Kernel::Avx2`]: split-nibble `vpshufb` (two 16-entry tables per
//!   coefficient), 32-byte vectors.
//! - [`Kernel::GfniAvx512`]: one `vgf2p8affineqb` per coefficient per
//!   64 bytes; multiplication by a constant is GF(2)-linear, so it is an 8×8
//!   bit matrix, which makes the instruction work for our 0x11D field even
//!   though its own `gf2p8mulb` is fixed to 0x11B.
//!
//! All `unsafe` code of the crate lives in this module (the SIMD kernels and,
//! under the `isal` feature, the ISA-L FFI reference). The safe entry points
//! check every length before a kernel touches memory.

// Every `unsafe` block states why it is sound (enforced here so it stays
// enforced when the module moves into another crate).
#![deny(clippy::undocumented_unsafe_blocks)]

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod gfni;
#[cfg(any(feature = "isal", feature = "isal-system"))]
pub mod isal;
mod scalar;

/// Outputs computed together in one pass over the inputs. Each pass reads
/// every input once, so bigger groups save input bandwidth; 4 covers every
/// parity count Nacre uses (m ≤ 4) in a single pass and, with up to 4
/// columns of 64 bytes in flight, needs 16 accumulators + 4 data registers,
/// inside the 32 zmm registers (no spills in the generated code).
const MAX_GROUP: usize = 4;

/// Inputs handled per pass; more are processed in further passes that
/// accumulate. Bounds the on-stack coefficient staging tables (no heap
/// allocation per call); 32 = the largest k Nacre uses.
const MAX_INPUTS: usize = 32;

/// The SIMD kernels walk raw pointers in their unrolled loops: gather them once, in
/// fixed arrays (no allocation per call).
fn raw_pointers(inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> ([*const u8; MAX_INPUTS], [*mut u8; MAX_GROUP]) {
    let mut ins = [std::ptr::null::<u8>(); MAX_INPUTS];
    for (p, i) in ins.iter_mut().zip(inputs) {
        *p = i.as_ptr();
    }
    let mut outs = [std::ptr::null_mut::<u8>(); MAX_GROUP];
    for (p, o) in outs.iter_mut().zip(outputs.iter_mut()) {
        *p = o.as_mut_ptr();
    }
    (ins, outs)
}

/// An implementation of [`gf_dot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Portable table-driven code; correct on any CPU.
    Scalar,
    /// x86-64 AVX2 split-nibble `vpshufb`.
    Avx2,
    /// x86-64 AVX-512 (F + BW) with GFNI affine transforms.
    GfniAvx512,
}

impl Kernel {
    /// Every kernel, fastest first.
    pub const ALL: [Kernel; 3] = [Kernel::GfniAvx512, Kernel::Avx2, Kernel::Scalar];

    /// The fastest kernel this CPU runs (detected once, then cached).
    pub fn detect() -> Kernel {
        static DETECTED: OnceLock<Kernel> = OnceLock::new();
        *DETECTED.get_or_init(|| Kernel::ALL.into_iter().find(|k| k.is_available()).unwrap_or(Kernel::Scalar))
    }

    /// Every kernel this CPU runs, fastest first (always ends with `Scalar`).
    pub fn all_available() -> Vec<Kernel> {
        Kernel::ALL.into_iter().filter(|k| k.is_available()).collect()
    }

    /// Whether this CPU supports the kernel. `std`'s feature detection is
    /// itself cached, so this is a few loads.
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Kernel::GfniAvx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("gfni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Short name for tables and logs.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            Kernel::Avx2 => "avx2",
            Kernel::GfniAvx512 => "gfni-avx512",
        }
    }
}

/// `outputs[r] = (accumulate ? outputs[r] : 0) ^ Σ_c coeffs[r * n_in + c] * inputs[c]`
/// over GF(2^8), byte by byte, with the kernel from [`Kernel::detect`].
///
/// `coeffs` is `outputs.len()` rows × `inputs.len()` columns, row-major. All
/// buffers must have the same length (any length; multiples of 64 are the
/// fast path). Panics on a shape or length mismatch.
pub fn gf_dot(coeffs: &[u8], inputs: &[&[u8]], outputs: &mut [&mut [u8]], accumulate: bool) {
    gf_dot_with(Kernel::detect(), coeffs, inputs, outputs, accumulate);
}

/// [`gf_dot`] with an explicit kernel. Panics if the CPU does not support
/// `kernel` (running it anyway would be undefined behaviour).
pub fn gf_dot_with(kernel: Kernel, coeffs: &[u8], inputs: &[&[u8]], outputs: &mut [&mut [u8]], accumulate: bool) {
    assert!(kernel.is_available(), "gf_dot: kernel {kernel:?} not supported by this CPU");
    let n_in = inputs.len();
    let n_out = outputs.len();
    assert_eq!(coeffs.len(), n_in * n_out, "gf_dot: coeffs must be outputs ({n_out}) x inputs ({n_in})");
    let Some(len) = outputs.first().map(|o| o.len()) else {
        return;
    };
    assert!(
        outputs.iter().all(|o| o.len() == len) && inputs.iter().all(|i| i.len() == len),
        "gf_dot: all buffers must have the same length"
    );
    if n_in == 0 {
        if !accumulate {
            outputs.iter_mut().for_each(|o| o.fill(0));
        }
        return;
    }
    if len == 0 {
        return;
    }

    // Outputs in groups of MAX_GROUP, inputs in passes of MAX_INPUTS; every
    // pass after the first over a group accumulates into what it left.
    for (g, out_group) in outputs.chunks_mut(MAX_GROUP).enumerate() {
        let rows = g * MAX_GROUP..g * MAX_GROUP + out_group.len();
        for (p, in_pass) in inputs.chunks(MAX_INPUTS).enumerate() {
            let cols = p * MAX_INPUTS..p * MAX_INPUTS + in_pass.len();
            let block = CoeffBlock { coeffs, n_in, rows: rows.clone(), cols };
            let acc = accumulate || p > 0;
            match kernel {
                Kernel::Scalar => scalar::dot(&block, in_pass, out_group, len, acc),
                #[cfg(target_arch = "x86_64")]
                Kernel::Avx2 => {
                    // SAFETY: `kernel.is_available()` was asserted above, so
                    // the CPU has AVX2; every buffer was checked to hold
                    // exactly `len` bytes; `block` is in range of `coeffs`.
                    unsafe { avx2::dot(&block, in_pass, out_group, len, acc) }
                }
                #[cfg(target_arch = "x86_64")]
                Kernel::GfniAvx512 => {
                    // SAFETY: as above, with AVX-512 F/BW and GFNI checked by
                    // `is_available()`.
                    unsafe { gfni::dot(&block, in_pass, out_group, len, acc) }
                }
                #[cfg(not(target_arch = "x86_64"))]
                _ => unreachable!("non-scalar kernels are never available here"),
            }
        }
    }
}

/// The coefficients of one (output group, input pass): rows `rows`, columns
/// `cols` of the full `coeffs` matrix (which has `n_in` columns).
struct CoeffBlock<'a> {
    coeffs: &'a [u8],
    n_in: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
}

impl CoeffBlock<'_> {
    /// Coefficient for group-local output `r` and pass-local input `c`.
    #[inline]
    fn get(&self, r: usize, c: usize) -> u8 {
        self.coeffs[(self.rows.start + r) * self.n_in + self.cols.start + c]
    }

    /// Whether group-local output `r` has every coefficient of this pass
    /// equal to 1 (plain XOR, e.g. the normalised P parity).
    fn row_is_xor(&self, r: usize) -> bool {
        (0..self.cols.len()).all(|c| self.get(r, c) == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::gf;
    use super::super::test_rng::{Rng, seed_from_env};
    use super::*;

    /// Straight from the definition, one byte at a time.
    fn reference(coeffs: &[u8], inputs: &[Vec<u8>], outputs: &mut [Vec<u8>], accumulate: bool) {
        let n_in = inputs.len();
        for (r, out) in outputs.iter_mut().enumerate() {
            for (i, o) in out.iter_mut().enumerate() {
                let mut x = if accumulate { *o } else { 0 };
                for (c, inp) in inputs.iter().enumerate() {
                    x ^= gf::mul(coeffs[r * n_in + c], inp[i]);
                }
                *o = x;
            }
        }
    }

    fn check_shape(rng: &mut Rng, kernel: Kernel, n_in: usize, n_out: usize, len: usize, seed: u64) {
        // Mix of special coefficients (0, 1, all-ones rows) and random ones.
        let mut coeffs: Vec<u8> = (0..n_in * n_out)
            .map(|_| match rng.below(8) {
                0 => 0,
                1 => 1,
                _ => rng.byte(),
            })
            .collect();
        if n_out > 0 && rng.below(2) == 0 {
            let r = rng.below(n_out);
            coeffs[r * n_in..(r + 1) * n_in].fill(1);
        }
        let inputs: Vec<Vec<u8>> = (0..n_in).map(|_| rng.bytes(len)).collect();
        let initial: Vec<Vec<u8>> = (0..n_out).map(|_| rng.bytes(len)).collect();
        for accumulate in [false, true] {
            let mut want = initial.clone();
            reference(&coeffs, &inputs, &mut want, accumulate);
            let mut got = initial.clone();
            let in_refs: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
            let mut out_refs: Vec<&mut [u8]> = got.iter_mut().map(|v| &mut v[..]).collect();
            gf_dot_with(kernel, &coeffs, &in_refs, &mut out_refs, accumulate);
            assert!(
                got == want,
                "{kernel:?} n_in={n_in} n_out={n_out} len={len} accumulate={accumulate} seed={seed:#x}"
            );
        }
    }

    #[test]
    fn every_kernel_matches_reference() {
        let seed = seed_from_env();
        eprintln!("every_kernel_matches_reference seed = {seed:#x}");
        let mut rng = Rng::new(seed);
        let kernels = Kernel::all_available();
        eprintln!("kernels: {kernels:?}");
        let lens: Vec<usize> = (0..=200).chain([255, 256, 257, 511, 1000, 4096, 4097, 65536 + 63]).collect();
        for &kernel in &kernels {
            for &len in &lens {
                let n_in = 1 + rng.below(10);
                let n_out = 1 + rng.below(6);
                check_shape(&mut rng, kernel, n_in, n_out, len, seed);
            }
            // Shapes, including > MAX_INPUTS inputs and > MAX_GROUP outputs.
            for n_in in [1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33, 40] {
                for n_out in [1, 2, 3, 4, 5, 6, 8, 9] {
                    let len = rng.below(300) + if rng.below(2) == 0 { 0 } else { 1024 };
                    check_shape(&mut rng, kernel, n_in, n_out, len, seed);
                }
            }
            // Long buffers: several column chunks and input passes in the
            // GFNI kernel (chunks of 64 KiB, passes of at most 8 inputs).
            for (n_in, n_out) in [(9, 1), (16, 2), (17, 3), (12, 4), (33, 2)] {
                let len = 2 * 65536 + 64 * rng.below(8) + rng.below(64);
                check_shape(&mut rng, kernel, n_in, n_out, len, seed);
            }
        }
    }

    #[test]
    fn degenerate_shapes() {
        for kernel in Kernel::all_available() {
            // No inputs: zero (or keep) the outputs.
            let mut a = [7u8; 100];
            gf_dot_with(kernel, &[], &[], &mut [&mut a[..]], true);
            assert!(a.iter().all(|&x| x == 7));
            gf_dot_with(kernel, &[], &[], &mut [&mut a[..]], false);
            assert!(a.iter().all(|&x| x == 0));
            // No outputs: nothing to do.
            gf_dot_with(kernel, &[], &[&[1, 2, 3][..]], &mut [], false);
            // Zero length.
            gf_dot_with(kernel, &[5], &[&[][..]], &mut [&mut [][..]], false);
        }
    }

    #[test]
    #[should_panic(expected = "same length")]
    fn length_mismatch_panics() {
        let mut o = [0u8; 3];
        gf_dot(&[1], &[&[1, 2][..]], &mut [&mut o[..]], false);
    }

    #[test]
    #[should_panic(expected = "coeffs must be")]
    fn coeff_shape_mismatch_panics() {
        let mut o = [0u8; 2];
        gf_dot(&[1, 2], &[&[1, 2][..]], &mut [&mut o[..]], false);
    }

    #[test]
    fn detect_is_available_and_listed() {
        let k = Kernel::detect();
        assert!(k.is_available());
        assert_eq!(Kernel::all_available()[0], k);
        assert_eq!(*Kernel::all_available().last().unwrap(), Kernel::Scalar);
    }
}
