//! The coding matrix: which GF(2^8) combinations of the k data shards make
//! the m parity shards.
//!
//! We start from the Cauchy matrix `C[i][j] = 1 / (x_i ^ y_j)` with
//! `x_i = k + i`, `y_j = j` (the construction of ISA-L's
//! `gf_gen_cauchy1_matrix`, parity part only) and then divide every column by
//! its row-0 entry, then every row by its column-0 entry. Every square submatrix of a Cauchy matrix is invertible,
//! and scaling rows or columns by non-zero constants multiplies each minor by
//! a non-zero factor, so the normalised matrix keeps that property; hence the
//! systematic generator `[I; C]` is MDS (any k of the k+m shards recover the
//! rest). The normalisation makes row 0 all ones, so the first parity is the
//! plain XOR of the data: RAID5 is XOR, k = 1 is mirroring, and the kernels
//! can take an XOR-only fast path for that row; the row scaling makes
//! column 0 all ones as well, so k = 1 is mirroring for every m.

use super::gf;

/// The m×k coding matrix (row-major): parity `i` = sum over `j` of
/// `C[i][j] * data[j]`.
///
/// Defined for `k >= 1` and `k + m <= 256` (the Cauchy points `k+i` and `j`
/// must be distinct bytes); [`Codec`](super::codec::Codec) restricts itself to k ≤ 32,
/// m ≤ 4, the range the MDS tests below cover exhaustively.
pub fn coding_matrix(k: usize, m: usize) -> Vec<u8> {
    assert!(k >= 1, "coding_matrix: k must be at least 1");
    assert!(k + m <= 256, "coding_matrix: k + m must be at most 256");
    let mut c = vec![0u8; m * k];
    for i in 0..m {
        let x = (k + i) as u8;
        for j in 0..k {
            // x > j always, so x ^ j != 0.
            c[i * k + j] = gf::inv(x ^ j as u8);
        }
    }
    if m > 0 {
        // Columns divided by their row-0 entry: row 0 becomes all ones.
        for j in 0..k {
            let s = gf::inv(c[j]);
            for i in 0..m {
                c[i * k + j] = gf::mul(c[i * k + j], s);
            }
        }
        // Rows divided by their column-0 entry (row 0's is already 1):
        // column 0 becomes all ones too, which is what makes k = 1 plain
        // mirroring (column normalisation alone leaves [1, c1/c0, ...]).
        for i in 1..m {
            let s = gf::inv(c[i * k]);
            for j in 0..k {
                c[i * k + j] = gf::mul(c[i * k + j], s);
            }
        }
    }
    c
}

/// The (k+m)×k systematic generator `[I; C]`: row `s` gives shard `s` as a
/// combination of the data shards (rows 0..k are data, k..k+m parity).
pub fn generator_matrix(k: usize, m: usize) -> Vec<u8> {
    let mut g = gf::identity(k);
    g.extend_from_slice(&coding_matrix(k, m));
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls `f` with every `r`-subset of `0..n` in lexicographic order.
    fn for_each_subset(n: usize, r: usize, f: &mut dyn FnMut(&[usize])) {
        fn rec(start: usize, n: usize, r: usize, cur: &mut Vec<usize>, f: &mut dyn FnMut(&[usize])) {
            if cur.len() == r {
                f(cur);
                return;
            }
            for i in start..n {
                if n - i < r - cur.len() {
                    break;
                }
                cur.push(i);
                rec(i + 1, n, r, cur, f);
                cur.pop();
            }
        }
        rec(0, n, r, &mut Vec::with_capacity(r), f);
    }

    /// Whether the k rows `rows` of the generator form an invertible matrix.
    fn rows_invertible(g: &[u8], k: usize, rows: &[usize]) -> bool {
        let sub: Vec<u8> = rows.iter().flat_map(|&r| g[r * k..(r + 1) * k].iter().copied()).collect();
        gf::invert_matrix(&sub, k).is_ok()
    }

    #[test]
    fn row_zero_is_xor_and_k1_is_mirroring() {
        for k in 1..=32 {
            for m in 1..=4 {
                let c = coding_matrix(k, m);
                assert!(c[..k].iter().all(|&x| x == 1), "k={k} m={m}");
                assert!(c.iter().all(|&x| x != 0), "k={k} m={m}: zero coefficient");
            }
        }
        assert_eq!(coding_matrix(1, 4), vec![1, 1, 1, 1]);
        assert!(coding_matrix(7, 0).is_empty());
    }

    /// Exhaustive, by decoding: for k ≤ 16, m ≤ 4, every set of exactly m
    /// erasures leaves k invertible rows. (Fewer erasures leave a superset of
    /// such a set, so "up to m" follows.)
    #[test]
    fn mds_exhaustive_by_erasure_pattern() {
        for k in 1..=16 {
            for m in 1..=4 {
                let g = generator_matrix(k, m);
                let mut checked = 0;
                for_each_subset(k + m, k, &mut |survivors| {
                    assert!(rows_invertible(&g, k, survivors), "k={k} m={m}: survivors {survivors:?} not decodable");
                    checked += 1;
                });
                assert!(checked > 0);
            }
        }
    }

    /// Exhaustive for every k ≤ 32, m ≤ 4 through the equivalent criterion:
    /// `[I; C]` is MDS iff every square submatrix of C is non-singular.
    /// Enumerating the (≤ 4)-row minors is cheap where enumerating erasure
    /// patterns for k = 32 would take ~60k 32×32 inversions per (k, m).
    #[test]
    fn mds_exhaustive_by_minors_up_to_k32() {
        for k in 1..=32 {
            let m = 4;
            let c = coding_matrix(k, m);
            for s in 1..=m.min(k) {
                for_each_subset(m, s, &mut |rows| {
                    for_each_subset(k, s, &mut |cols| {
                        let sub: Vec<u8> = rows
                            .iter()
                            .flat_map(|&r| cols.iter().map(move |&j| (r, j)))
                            .map(|(r, j)| c[r * k + j])
                            .collect();
                        assert!(
                            gf::invert_matrix(&sub, s).is_ok(),
                            "k={k}: minor rows {rows:?} cols {cols:?} singular"
                        );
                    });
                });
            }
            // x_i depends on k and i only, and row 0 is the same, so the
            // m < 4 matrices are prefixes of this one and their minors are
            // among those just checked.
            for m2 in 1..m {
                let c2 = coding_matrix(k, m2);
                assert_eq!(&c2[..], &c[..m2 * k], "k={k}: m={m2} is a prefix of m=4");
            }
        }
    }

    /// Sampled decode check for large k, as the brief asks, with a printed seed.
    #[test]
    fn mds_sampled_large_k() {
        let seed = super::super::test_rng::seed_from_env();
        eprintln!("mds_sampled_large_k seed = {seed:#x}");
        let mut rng = super::super::test_rng::Rng::new(seed);
        for &k in &[17usize, 20, 24, 31, 32] {
            for m in 1..=4 {
                let g = generator_matrix(k, m);
                for _ in 0..150 {
                    let mut all: Vec<usize> = (0..k + m).collect();
                    rng.shuffle(&mut all);
                    let mut survivors = all[..k].to_vec();
                    survivors.sort_unstable();
                    assert!(
                        rows_invertible(&g, k, &survivors),
                        "k={k} m={m}: survivors {survivors:?} (seed {seed:#x})"
                    );
                }
            }
        }
    }
}
