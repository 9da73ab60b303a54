//! Fenwick levels (docs/math.md §2.2 "Fenwick levels", §2.6 "Chunked form").
//!
//! Token `t` sees token `s ≤ t` at level `ℓ(t,s)`: `ℓ(t,t) = 0` and, for `s < t`,
//! `ℓ(t,s) = bitlen(t ⊕ s) = ⌊ log_2 (t ⊕ s) ⌋ + 1`.
//! The levels of `t` partition `[0, t]` into buckets of sizes `1, 2^(ℓ−1)`.

use std::ops::Range;

/// Number of bits needed to write `x`: `bitlen(0) = 0`,
/// `bitlen(x) = ⌊ log_2 x ⌋ + 1` for `x ≥ 1`.
pub fn bitlen(x: usize) -> usize {
    (usize::BITS - x.leading_zeros()) as usize
}

/// Fenwick level `ℓ(t,s)` of docs/math.md §2.2: `0` when `s = t`, otherwise
/// `bitlen(t ⊕ s)`.
///
/// The definition is for `s ≤ t`; the formula is symmetric, so for `s > t` this returns
/// `ℓ(s,t)`.
pub fn level(t: usize, s: usize) -> usize {
    bitlen(t ^ s)
}

/// Number of levels needed for sequences of length `T` (docs/math.md §2.2):
/// `L(T) = bitlen(T−1) + 1`, with `L(1) = 1` and, by convention, `L(0) = 1`.
pub fn num_levels(t_len: usize) -> usize {
    bitlen(t_len.saturating_sub(1)) + 1
}

/// The bucket of token `t` at level `l` (docs/math.md §2.2): the positions `s ≤ t` with `ℓ(t,s) = l`.
///
/// Level `0` is `{t}`. Level `ℓ ≥ 1` is non-empty iff bit `ℓ−1` of `t` is `1`, and then is
/// `[(t ≫ ℓ) ≪ ℓ, ((t ≫ ℓ) ≪ ℓ) + 2^(ℓ−1))`; otherwise `None`.
/// Levels beyond the word size are empty (`None`); level 0 of `usize::MAX` is `None` too, as
/// its range end would not be representable.
pub fn bucket(t: usize, l: usize) -> Option<Range<usize>> {
    if l == 0 {
        return t.checked_add(1).map(|end| t..end);
    }
    let bit = u32::try_from(l - 1).ok().filter(|&b| b < usize::BITS)?;
    if (t >> bit) & 1 == 0 {
        return None;
    }
    // l = bit + 1 ≤ usize::BITS; (t >> l) << l clears the low l bits.
    let base = if bit + 1 == usize::BITS { 0 } else { (t >> (bit + 1)) << (bit + 1) };
    // base + 2^(l-1) ≤ t because bit l-1 of t is set: no overflow.
    Some(base..base + (1usize << bit))
}

/// Level between tokens in different chunks of the chunked form (docs/math.md §2.6): with chunk size
/// `C = 2^c`, chunk indices `i = ⌊ t/C ⌋ ≠ j = ⌊ s/C ⌋` give
/// `ℓ(t,s) = c + bitlen(i ⊕ j)`.
///
/// For `i = j` this returns `c`, which is only an upper bound on the intra-chunk level: use
/// [`level`] inside a chunk.
pub fn chunk_level(i: usize, j: usize, c: u32) -> usize {
    c as usize + bitlen(i ^ j)
}

/// The Fenwick merge at token (or, in the chunked form, chunk) `t` (MATH §2.5, §2.6):
/// for `t ≥ 1`, with `m = ctz(t)`, the states of levels `0..=m` are summed into
/// level `m+1` and emptied. Returns `Some(m)`, or `None` for `t = 0` (nothing to merge).
pub fn merge_level(t: usize) -> Option<usize> {
    (t >= 1).then(|| t.trailing_zeros() as usize)
}

/// Applies the merge at `t` ([`merge_level`]) to host-side level states (`None` is an empty
/// level), combining two states with `add`. `states` grows to hold level `m+1`.
pub fn merge_states<S>(states: &mut Vec<Option<S>>, t: usize, mut add: impl FnMut(S, S) -> S) {
    let Some(m) = merge_level(t) else { return };
    if states.len() < m + 2 {
        states.resize_with(m + 2, || None);
    }
    let mut merged = states[m + 1].take();
    for slot in &mut states[..=m] {
        if let Some(s) = slot.take() {
            merged = Some(match merged {
                Some(acc) => add(acc, s),
                None => s,
            });
        }
    }
    states[m + 1] = merged;
}

/// The levels that hold a state after token `t` was merged and inserted (MATH §2.5): level 0
/// and every `ℓ ≥ 1` with bit `ℓ − 1` of `t` set, as a bit mask (bit `ℓ` for level
/// `ℓ`), i.e. `(t ≪ 1) | 1`; that is `1 + popcount(t)` states. For
/// `t < 2⁶³`.
pub fn occupied_levels(t: usize) -> u64 {
    ((t as u64) << 1) | 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Merging then inserting level 0 token by token leaves exactly the occupied levels, and
    /// every state is the sum of the tokens of its bucket.
    #[test]
    fn merge_states_keeps_buckets() {
        let mut states: Vec<Option<Vec<usize>>> = Vec::new();
        for t in 0..300usize {
            merge_states(&mut states, t, |mut a, b| {
                a.extend(b);
                a
            });
            if states.is_empty() {
                states.push(None);
            }
            assert!(states[0].is_none(), "level 0 not emptied at t = {t}");
            states[0] = Some(vec![t]);
            let mut occ = 0u64;
            for (l, s) in states.iter().enumerate() {
                if let Some(s) = s {
                    occ |= 1 << l;
                    let mut got = s.clone();
                    got.sort_unstable();
                    let want: Vec<usize> = bucket(t, l).expect("occupied level has a bucket").collect();
                    assert_eq!(got, want, "t = {t}, level {l}");
                }
            }
            assert_eq!(occ, occupied_levels(t), "t = {t}");
            assert_eq!(occ.count_ones() as usize, 1 + t.count_ones() as usize);
        }
        assert_eq!(merge_level(0), None);
        assert_eq!(merge_level(12), Some(2));
    }

    #[test]
    fn level_matches_bucket_enumeration_and_buckets_partition() {
        for t in 0..2048usize {
            let mut covered = vec![0u8; t + 1];
            for l in 0..num_levels(t + 1) + 2 {
                if let Some(r) = bucket(t, l) {
                    assert!(r.end <= t + 1, "bucket({t},{l}) = {r:?} exceeds t");
                    assert!(!r.is_empty());
                    for s in r {
                        covered[s] += 1;
                        assert_eq!(level(t, s), l, "t={t} s={s}");
                    }
                }
            }
            assert!(covered.iter().all(|&c| c == 1), "buckets of t={t} do not partition [0,t]");
            // Direct enumeration: level(t,s) is the unique l whose bucket holds s.
            for s in 0..t {
                let ls: Vec<usize> =
                    (0..64).filter(|&l| bucket(t, l).is_some_and(|r| r.contains(&s))).collect();
                assert_eq!(ls, vec![level(t, s)], "t={t} s={s}");
            }
        }
    }

    #[test]
    fn num_levels_values() {
        assert_eq!(num_levels(0), 1);
        assert_eq!(num_levels(1), 1);
        assert_eq!(num_levels(2), 2);
        assert_eq!(num_levels(3), 3);
        assert_eq!(num_levels(4), 3);
        assert_eq!(num_levels(5), 4);
        assert_eq!(num_levels(1024), 11);
        assert_eq!(num_levels(1025), 12);
        // Every level reached by some pair s ≤ t < T is < L(T).
        for t_len in 1..300usize {
            let max = (0..t_len).flat_map(|t| (0..=t).map(move |s| level(t, s))).max().unwrap();
            assert_eq!(max + 1, num_levels(t_len), "T={t_len}");
        }
    }

    #[test]
    fn bucket_edge_cases() {
        assert_eq!(bucket(0, 0), Some(0..1));
        assert_eq!(bucket(0, 1), None);
        assert_eq!(bucket(5, 1), Some(4..5));
        assert_eq!(bucket(5, 2), None);
        assert_eq!(bucket(5, 3), Some(0..4));
        assert_eq!(bucket(usize::MAX, 0), None);
        assert_eq!(bucket(usize::MAX, 64), Some(0..1 << 63));
        assert_eq!(bucket(usize::MAX, 65), None);
        assert_eq!(bucket(1, usize::MAX), None);
        assert_eq!(level(3, 7), level(7, 3));
    }

    #[test]
    fn chunk_level_matches_level() {
        for c in 0..5u32 {
            for t in 0..300usize {
                for s in 0..=t {
                    let (i, j) = (t >> c, s >> c);
                    if i != j {
                        assert_eq!(chunk_level(i, j, c), level(t, s), "c={c} t={t} s={s}");
                    } else {
                        assert!(level(t, s) <= chunk_level(i, j, c));
                    }
                }
            }
        }
    }

    proptest! {
        #[test]
        fn prop_level_in_its_bucket(t in 0usize..(1 << 40), back in 0usize..(1 << 40)) {
            let s = t.saturating_sub(back);
            let l = level(t, s);
            let r = bucket(t, l).expect("the bucket holding s is non-empty");
            prop_assert!(r.contains(&s));
            prop_assert!(l < num_levels(t + 1));
        }

        #[test]
        fn prop_chunk_level(t in 0usize..(1 << 30), s in 0usize..(1 << 30), c in 0u32..12) {
            let (t, s) = (t.max(s), t.min(s));
            if t >> c != s >> c {
                prop_assert_eq!(chunk_level(t >> c, s >> c, c), level(t, s));
            }
        }
    }
}
