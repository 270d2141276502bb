//! Portable kernel: one 256-byte product row per coefficient, taken from a
//! 64 KiB full multiplication table built at compile time (no per-call table
//! setup). Bytes are looked up eight at a time and written back as one `u64`,
//! and coefficients 0 and 1 skip the table (1 becomes a plain XOR, which the
//! compiler vectorises). It is the reference for the SIMD kernels and the
//! fallback on CPUs without AVX2; it needs no `unsafe`.

use super::super::gf;
use super::CoeffBlock;

/// `MUL[a][b] = a * b`.
static MUL: [[u8; 256]; 256] = {
    let mut t = [[0u8; 256]; 256];
    let mut a = 0;
    while a < 256 {
        let mut b = 0;
        while b < 256 {
            t[a][b] = gf::mul(a as u8, b as u8);
            b += 1;
        }
        a += 1;
    }
    t
};

/// Bytes of each output finished before moving to the next input chunk: the
/// input chunks stay in L1 while every output of the group consumes them.
const CHUNK: usize = 4096;

pub(super) fn dot(block: &CoeffBlock<'_>, inputs: &[&[u8]], outputs: &mut [&mut [u8]], len: usize, accumulate: bool) {
    dot_range(block, inputs, outputs, 0..len, accumulate);
}

/// [`dot`] restricted to the byte range `range` of every buffer; the SIMD
/// kernels use it for the last few bytes that do not fill a vector.
pub(super) fn dot_range(
    block: &CoeffBlock<'_>,
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
    range: std::ops::Range<usize>,
    accumulate: bool,
) {
    let mut start = range.start;
    while start < range.end {
        let end = (start + CHUNK).min(range.end);
        for (r, out) in outputs.iter_mut().enumerate() {
            let out = &mut out[start..end];
            for (c, inp) in inputs.iter().enumerate() {
                let src = &inp[start..end];
                let coef = block.get(r, c);
                if c == 0 && !accumulate {
                    mul_set(coef, src, out);
                } else {
                    mul_add(coef, src, out);
                }
            }
        }
        start = end;
    }
}

/// `dst = coef * src`.
fn mul_set(coef: u8, src: &[u8], dst: &mut [u8]) {
    match coef {
        0 => dst.fill(0),
        1 => dst.copy_from_slice(src),
        _ => {
            let row = &MUL[coef as usize];
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = row[s as usize];
            }
        }
    }
}

/// `dst ^= coef * src`.
fn mul_add(coef: u8, src: &[u8], dst: &mut [u8]) {
    match coef {
        0 => {}
        1 => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d ^= s;
            }
        }
        _ => {
            let row = &MUL[coef as usize];
            let mut d8 = dst.chunks_exact_mut(8);
            let mut s8 = src.chunks_exact(8);
            for (d, s) in (&mut d8).zip(&mut s8) {
                let x = u64::from_le_bytes(s.try_into().unwrap());
                let mut y = 0u64;
                for b in 0..8 {
                    y |= (row[(x >> (8 * b)) as u8 as usize] as u64) << (8 * b);
                }
                let v = u64::from_le_bytes((&*d).try_into().unwrap()) ^ y;
                d.copy_from_slice(&v.to_le_bytes());
            }
            for (d, &s) in d8.into_remainder().iter_mut().zip(s8.remainder()) {
                *d ^= row[s as usize];
            }
        }
    }
}
