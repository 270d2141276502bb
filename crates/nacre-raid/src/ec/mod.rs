//! Erasure coding for Nacre's software RAID: a systematic Reed-Solomon code
//! over GF(2^8) (polynomial 0x11D, as Intel ISA-L) with a normalised Cauchy
//! coding matrix whose first parity row is plain XOR, and SIMD kernels
//! (AVX-512 + GFNI, AVX2, portable) selected at run time.
//!
//! Layout: [`gf`] field arithmetic and small matrices, [`matrix`] the coding
//! matrix, [`kernel`] the hot `gf_dot` product (all `unsafe` lives there),
//! [`codec`] encode / update / decode on shards.
//!
//! Items refer to each other through `super::`, never `crate::`, so the module
//! stays self-contained.

pub mod codec;
pub mod gf;
pub mod kernel;
pub mod matrix;

#[cfg(test)]
mod test_rng;

pub use codec::{Codec, CodecError, Decoder, MAX_DATA_SHARDS, MAX_PARITY_SHARDS};
#[cfg(any(feature = "isal", feature = "isal-system"))]
pub use kernel::isal;
pub use kernel::{Kernel, gf_dot, gf_dot_with};
pub use matrix::coding_matrix;

/// The kernel this process uses, for reports.
pub fn kernel_name() -> &'static str {
    Kernel::detect().name()
}
