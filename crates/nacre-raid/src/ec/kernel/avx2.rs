//! AVX2 kernel: the classic split-nibble method. `c * x = c * (x & 15) ^
//! c * (x >> 4 << 4)`, and each half is a 16-entry table lookup that
//! `vpshufb` does for 32 bytes at once. Per coefficient that is two 16-byte
//! tables (broadcast to both 128-bit lanes straight from memory by
//! `vbroadcasti128`), per input byte-vector two shuffles and two XORs.
//! Structure as in the GFNI kernel: inputs loaded once per 64-byte column,
//! up to [`MAX_GROUP`] accumulators in registers; the < 32-byte tail goes to
//! the scalar kernel.

use std::arch::x86_64::*;

use super::super::gf;
use super::{CoeffBlock, MAX_GROUP, MAX_INPUTS, raw_pointers, scalar};

/// Per coefficient: products with the 16 low nibbles, then with the 16 high
/// nibbles.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct Nibbles([u8; 32]);

static NIBBLES: [Nibbles; 256] = {
    let mut t = [Nibbles([0; 32]); 256];
    let mut c = 0;
    while c < 256 {
        let mut n = 0;
        while n < 16 {
            t[c].0[n] = gf::mul(c as u8, n as u8);
            t[c].0[16 + n] = gf::mul(c as u8, (n << 4) as u8);
            n += 1;
        }
        c += 1;
    }
    t
};

/// # Safety
/// The CPU must support AVX2; `1 <= inputs.len() <= MAX_INPUTS`,
/// `1 <= outputs.len() <= MAX_GROUP`, every buffer at least `len` bytes;
/// `block` must cover exactly these inputs and outputs.
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

    let mut tables = [Nibbles([0; 32]); MAX_INPUTS * MAX_GROUP];
    for c in 0..n_in {
        for r in 0..n_out {
            tables[c * n_out + r] = NIBBLES[block.get(r, c) as usize];
        }
    }
    let (ins, outs) = raw_pointers(inputs, outputs);
    let xor0 = block.row_is_xor(0);
    let vec_len = len / 32 * 32;

    macro_rules! run_n {
        ($n:literal) => {
            // SAFETY: forwarded from this function's contract; `tables`
            // holds n_in * $n entries, `ins`/`outs` the first n_in/$n
            // pointers, and run() stays below `vec_len <= len`.
            unsafe {
                let ins = &ins[..n_in];
                match (accumulate, xor0) {
                    (false, false) => run::<$n, false, false>(&tables, ins, &outs, vec_len),
                    (false, true) => run::<$n, false, true>(&tables, ins, &outs, vec_len),
                    (true, false) => run::<$n, true, false>(&tables, ins, &outs, vec_len),
                    (true, true) => run::<$n, true, true>(&tables, ins, &outs, vec_len),
                }
            }
        };
    }
    if vec_len > 0 {
        match n_out {
            1 => run_n!(1),
            2 => run_n!(2),
            3 => run_n!(3),
            4 => run_n!(4),
            _ => unreachable!(),
        }
    }
    if vec_len < len {
        scalar::dot_range(block, inputs, outputs, vec_len..len, accumulate);
    }
}

/// # Safety
/// See [`dot`]; `len` is a multiple of 32.
#[target_feature(enable = "avx2")]
unsafe fn run<const N: usize, const ACC: bool, const X0: bool>(
    tables: &[Nibbles],
    ins: &[*const u8],
    outs: &[*mut u8; MAX_GROUP],
    len: usize,
) {
    debug_assert!(len.is_multiple_of(32) && tables.len() >= ins.len() * N);
    let mut off = 0;
    while off + 64 <= len {
        // SAFETY: off + 64 <= len, the caller's valid range.
        unsafe { columns::<N, 2, ACC, X0>(tables, ins, outs, off) };
        off += 64;
    }
    if off < len {
        // SAFETY: len is a multiple of 32, so off + 32 == len here.
        unsafe { columns::<N, 1, ACC, X0>(tables, ins, outs, off) };
    }
}

/// `U` consecutive 32-byte vectors at byte `off` for `N` outputs.
///
/// # Safety
/// See [`run`]; all buffers valid at `off..off + 32 * U`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn columns<const N: usize, const U: usize, const ACC: bool, const X0: bool>(
    tables: &[Nibbles],
    ins: &[*const u8],
    outs: &[*mut u8; MAX_GROUP],
    off: usize,
) {
    let low4 = _mm256_set1_epi8(0x0f);
    let mut acc = [[_mm256_setzero_si256(); U]; N];
    for (c, &p) in ins.iter().enumerate() {
        let mut v = [_mm256_setzero_si256(); U];
        let mut lo = [_mm256_setzero_si256(); U];
        let mut hi = [_mm256_setzero_si256(); U];
        for u in 0..U {
            // SAFETY: 32 readable bytes at p + off + 32u (caller).
            v[u] = unsafe { _mm256_loadu_si256(p.add(off + 32 * u).cast()) };
            lo[u] = _mm256_and_si256(v[u], low4);
            hi[u] = _mm256_and_si256(_mm256_srli_epi16::<4>(v[u]), low4);
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            if X0 && r == 0 {
                for u in 0..U {
                    acc_r[u] = _mm256_xor_si256(acc_r[u], v[u]);
                }
            } else {
                // SAFETY: c * N + r < ins.len() * N <= tables.len().
                let t = unsafe { tables.get_unchecked(c * N + r) }.0.as_ptr();
                // SAFETY: `t` points at 32 bytes: low table then high table.
                let (tl, th) = unsafe {
                    (
                        _mm256_broadcastsi128_si256(_mm_load_si128(t.cast())),
                        _mm256_broadcastsi128_si256(_mm_load_si128(t.add(16).cast())),
                    )
                };
                for u in 0..U {
                    let prod = _mm256_xor_si256(_mm256_shuffle_epi8(tl, lo[u]), _mm256_shuffle_epi8(th, hi[u]));
                    acc_r[u] = _mm256_xor_si256(acc_r[u], prod);
                }
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (u, &a) in acc_r.iter().enumerate() {
            // SAFETY: 32 writable bytes at dst (caller).
            unsafe {
                let dst = outs.get_unchecked(r).add(off + 32 * u).cast::<__m256i>();
                let x = if ACC { _mm256_xor_si256(a, _mm256_loadu_si256(dst)) } else { a };
                _mm256_storeu_si256(dst, x);
            }
        }
    }
}
