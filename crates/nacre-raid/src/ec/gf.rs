//! Arithmetic in GF(2^8) with the reduction polynomial x^8+x^4+x^3+x^2+1
//! (0x11D), the field Intel ISA-L and most storage Reed-Solomon codes use, so
//! that our parity is byte-for-byte interchangeable with ISA-L's for the same
//! coding matrix.
//!
//! Everything here is table driven and evaluated at compile time (`const fn`),
//! so there is no lazy initialisation on the hot path and the tables sit in
//! read-only memory. The small-matrix routines (inversion, products) are used
//! only when a codec or a decoder is set up, never per byte.

use std::fmt;

/// The field's reduction polynomial (bit 8 included), as in ISA-L.
pub const POLY: u16 = 0x11D;

/// `x` (= 2) generates the multiplicative group for 0x11D, so `EXP[i] = 2^i`.
const fn build_exp_log() -> ([u8; 512], [u8; 256]) {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLY;
        }
        i += 1;
    }
    // Doubled so that `EXP[log a + log b]` needs no `% 255`.
    while i < 512 {
        exp[i] = exp[i - 255];
        i += 1;
    }
    (exp, log)
}

const EXP_LOG: ([u8; 512], [u8; 256]) = build_exp_log();
/// `EXP[i] = 2^i` for i in 0..510 (period 255).
static EXP: [u8; 512] = EXP_LOG.0;
/// `LOG[a] = log2(a)` for a != 0; `LOG[0]` is unused (0).
static LOG: [u8; 256] = EXP_LOG.1;

/// Product `a * b` in GF(2^8).
#[inline]
pub const fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 { 0 } else { EXP_LOG.0[EXP_LOG.1[a as usize] as usize + EXP_LOG.1[b as usize] as usize] }
}

/// Multiplicative inverse. Panics on 0, which has none.
#[inline]
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "GF(2^8): 0 has no inverse");
    EXP[255 - LOG[a as usize] as usize]
}

/// Quotient `a / b`. Panics if `b == 0`.
#[inline]
pub fn div(a: u8, b: u8) -> u8 {
    assert!(b != 0, "GF(2^8): division by 0");
    if a == 0 { 0 } else { EXP[LOG[a as usize] as usize + 255 - LOG[b as usize] as usize] }
}

/// `2^e` (e taken mod 255).
#[inline]
pub fn exp(e: usize) -> u8 {
    EXP[e % 255]
}

/// Error returned by [`invert_matrix`] for a matrix with no inverse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SingularMatrix;

impl fmt::Display for SingularMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("matrix over GF(2^8) is singular")
    }
}

impl std::error::Error for SingularMatrix {}

/// Inverts the `n`×`n` row-major matrix `a` by Gauss-Jordan elimination.
///
/// Panics if `a.len() != n * n`.
pub fn invert_matrix(a: &[u8], n: usize) -> Result<Vec<u8>, SingularMatrix> {
    assert_eq!(a.len(), n * n, "invert_matrix: expected {n}x{n} matrix");
    let mut m = a.to_vec();
    let mut out = identity(n);
    for col in 0..n {
        // Find a pivot row at or below the diagonal.
        let pivot = (col..n).find(|&r| m[r * n + col] != 0).ok_or(SingularMatrix)?;
        if pivot != col {
            for j in 0..n {
                m.swap(pivot * n + j, col * n + j);
                out.swap(pivot * n + j, col * n + j);
            }
        }
        // Scale the pivot row so the pivot is 1.
        let s = inv(m[col * n + col]);
        for j in 0..n {
            m[col * n + j] = mul(m[col * n + j], s);
            out[col * n + j] = mul(out[col * n + j], s);
        }
        // Eliminate the column from every other row.
        for r in 0..n {
            let f = m[r * n + col];
            if r == col || f == 0 {
                continue;
            }
            for j in 0..n {
                m[r * n + j] ^= mul(f, m[col * n + j]);
                out[r * n + j] ^= mul(f, out[col * n + j]);
            }
        }
    }
    Ok(out)
}

/// The `n`×`n` identity matrix, row-major.
pub fn identity(n: usize) -> Vec<u8> {
    let mut m = vec![0u8; n * n];
    for i in 0..n {
        m[i * n + i] = 1;
    }
    m
}

/// Product of the `r`×`n` matrix `a` and the `n`×`c` matrix `b`, row-major.
pub fn matrix_mul(a: &[u8], b: &[u8], r: usize, n: usize, c: usize) -> Vec<u8> {
    assert_eq!(a.len(), r * n);
    assert_eq!(b.len(), n * c);
    let mut out = vec![0u8; r * c];
    for i in 0..r {
        for t in 0..n {
            let f = a[i * n + t];
            if f == 0 {
                continue;
            }
            for j in 0..c {
                out[i * c + j] ^= mul(f, b[t * c + j]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Carry-less multiply-and-reduce, independent of the tables.
    fn slow_mul(mut a: u8, mut b: u8) -> u8 {
        let mut p = 0u8;
        while b != 0 {
            if b & 1 != 0 {
                p ^= a;
            }
            let carry = a & 0x80 != 0;
            a <<= 1;
            if carry {
                a ^= (POLY & 0xFF) as u8;
            }
            b >>= 1;
        }
        p
    }

    #[test]
    fn mul_matches_bitwise_definition() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), slow_mul(a, b), "{a} * {b}");
            }
        }
    }

    #[test]
    fn inverse_and_division() {
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1, "a = {a}");
            for b in 1..=255u8 {
                assert_eq!(mul(div(a, b), b), a);
            }
        }
        assert_eq!(div(0, 7), 0);
        assert_eq!(exp(0), 1);
        assert_eq!(exp(8), 0x1D);
    }

    #[test]
    fn known_values_match_isal_field() {
        // 2^8 reduces by 0x11D to 0x1D; ISA-L's gf_mul(2, 0x80) is 0x1D too.
        assert_eq!(mul(2, 0x80), 0x1D);
        assert_eq!(inv(2), 0x8E);
    }

    #[test]
    fn matrix_inverse_roundtrip_and_singular() {
        let mut seed = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        };
        for n in 1..=12 {
            for _ in 0..20 {
                let a: Vec<u8> = (0..n * n).map(|_| next()).collect();
                if let Ok(b) = invert_matrix(&a, n) {
                    assert_eq!(matrix_mul(&a, &b, n, n, n), identity(n));
                    assert_eq!(matrix_mul(&b, &a, n, n, n), identity(n));
                }
            }
        }
        // Two equal rows: singular.
        let a = [1, 2, 3, 1, 2, 3, 4, 5, 6];
        assert_eq!(invert_matrix(&a, 3), Err(SingularMatrix));
        assert_eq!(invert_matrix(&[0], 1), Err(SingularMatrix));
        assert_eq!(invert_matrix(&[], 0), Ok(vec![]));
    }
}
