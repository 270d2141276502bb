//! The data IO500's phases write and verify. Every 8-byte word of a file is a function of
//! the run's seed and the word's offset in the file, so a read checks both the bytes and
//! where they landed: a flipped bit, a stale block or a block written at the wrong offset
//! all fail. Cheap to make (one multiply a word), so the pattern does not cost the phases
//! the bandwidth they measure.

/// The word at byte `offset` (a multiple of 8) of a file written with `seed`.
#[inline]
fn word(seed: u64, offset: u64) -> u64 {
    (offset ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (seed >> 29)
}

/// Fill `buf` with the bytes found at `offset` (a multiple of 8) of a file of `seed`.
pub fn fill(buf: &mut [u8], seed: u64, offset: u64) {
    debug_assert!(offset.is_multiple_of(8), "pattern offsets are word-aligned");
    let mut chunks = buf.chunks_exact_mut(8);
    let mut at = offset;
    for c in &mut chunks {
        c.copy_from_slice(&word(seed, at).to_le_bytes());
        at += 8;
    }
    let tail = chunks.into_remainder();
    let n = tail.len();
    tail.copy_from_slice(&word(seed, at).to_le_bytes()[..n]);
}

/// The index of the first byte of `buf` that differs from what [`fill`] makes for
/// (`seed`, `offset`), if any.
pub fn first_difference(buf: &[u8], seed: u64, offset: u64) -> Option<usize> {
    debug_assert!(offset.is_multiple_of(8), "pattern offsets are word-aligned");
    let mut chunks = buf.chunks_exact(8);
    let mut at = offset;
    for (i, c) in (&mut chunks).enumerate() {
        let want = word(seed, at).to_le_bytes();
        if c != want {
            let j = c.iter().zip(want).position(|(a, b)| *a != b).unwrap_or(0);
            return Some(i * 8 + j);
        }
        at += 8;
    }
    let tail = chunks.remainder();
    let want = word(seed, at).to_le_bytes();
    tail.iter().zip(want).position(|(a, b)| *a != b).map(|j| buf.len() - tail.len() + j)
}

/// A seed for one stream of a run (a file, a task's files): `run` mixed with `parts`.
pub fn seed(run: u64, parts: &[u64]) -> u64 {
    let mut s = run;
    for &p in parts {
        s = (s ^ p).wrapping_mul(0xBF58_476D_1CE4_E5B9).rotate_left(31);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_verify_at_any_aligned_offset_and_length() {
        for (off, len) in [(0u64, 3901usize), (8, 47_008), (4096, 4096), (1 << 40, 13), (0, 0)] {
            let mut b = vec![0u8; len];
            fill(&mut b, 7, off);
            assert_eq!(first_difference(&b, 7, off), None);
            if len > 0 {
                assert_eq!(first_difference(&b, 8, off), Some(0), "another seed differs at once");
                let last = len - 1;
                b[last] ^= 0x10;
                assert_eq!(first_difference(&b, 7, off), Some(last));
            }
        }
    }

    #[test]
    fn a_block_read_at_the_wrong_offset_fails() {
        let mut b = vec![0u8; 47_008];
        fill(&mut b, 3, 47_008);
        assert_eq!(first_difference(&b, 3, 0), Some(0));
        assert_eq!(first_difference(&b, 3, 2 * 47_008), Some(0));
    }
}
