//! Offset patterns of the generalized linear recurrence (docs/math.md §1.1 "Offset patterns").
//!
//! A pattern is a strictly increasing `f : ℕ → ℕ_{>0}`. Token `t` reads
//! slot `k` when `f(k) ≤ t`, at position `d_k(t)`:
//! - translation-invariant: `d_k(t) = t − f(k)`;
//! - cache-efficient (needs `f(0) = 1`): `d_k(t) = a_k ⌈ (t + 1 − f(k)) / a_k ⌉ − 1` with
//!   strides `a_0 = 1`, `a_{k+1} = a_k ⌈ (f(k+1) − f(k)) / a_k ⌉`.
//!
//! The cache-efficient positions satisfy the lattice invariant `P_t ⊆ [0, t−1]` and
//! `P_t ⊆ P_{t−1} ∪ {t−1}` for every strictly increasing `f` with `f(0) = 1`: when
//! `d_k(t) ≠ d_k(t−1)` one has `a_k | t − f(k)`, and then `d_k(t) = d_{k−1}(t−1)`
//! (slot `k−1` is active at `t−1` since `f(k−1) < f(k) ≤ t`). So no `f` breaks it; the checker
//! still verifies it from the positions actually produced.

use crate::error::{Error, Result};

/// An offset function `k ↦ f(k)`. It may saturate at `u64::MAX` for large `k`; the value
/// `u64::MAX` is treated as "beyond every sequence length".
pub type OffsetFn = fn(usize) -> u64;

/// Number of leading terms of `f` checked for strict increase by [`Pattern::new`].
const CHECKED_TERMS: usize = 64;

/// `pow2`: `f(k) = 2^k` (saturating at `u64::MAX`). docs/math.md §1.1.
pub fn pow2(k: usize) -> u64 {
    u32::try_from(k).ok().and_then(|k| 1u64.checked_shl(k)).unwrap_or(u64::MAX)
}

/// `sq1`: `f(k) = k² + 1` (saturating at `u64::MAX`). docs/math.md §1.1.
pub fn sq1(k: usize) -> u64 {
    (k as u64).saturating_mul(k as u64).saturating_add(1)
}

/// `linear`: `f(k) = k + 1` (saturating at `u64::MAX`). With `order` `= 1` it is the diagonal SSM,
/// with `order` `= k` a `k`-th order recurrence, untruncated the dense recurrence. docs/math.md §1.1.
pub fn linear(k: usize) -> u64 {
    (k as u64).saturating_add(1)
}

/// An offset pattern (docs/math.md §1.1): an offset function `f`, an optional truncation to the first
/// `order` slots, and the choice between translation-invariant and cache-efficient positions.
#[derive(Clone, Debug)]
pub struct Pattern {
    name: String,
    f: OffsetFn,
    order: Option<usize>,
    cache_efficient: bool,
}

impl Pattern {
    /// Builds a pattern after checking docs/math.md §1.1's requirements:
    /// `order` `≠ 0`; `f(0) ≥ 1`; `f(0) = 1` when `cache_efficient` (the lattice needs it);
    /// `f(k) < f(k+1)` for the first 64 terms (or until `f` saturates at `u64::MAX`).
    pub fn new(name: &str, f: OffsetFn, order: Option<usize>, cache_efficient: bool) -> Result<Self> {
        if order == Some(0) {
            return Err(Error::pattern(
                name,
                "order must be at least 1 (a positive number of slots) or absent (untruncated), got 0",
            ));
        }
        let f0 = f(0);
        if f0 == 0 {
            return Err(Error::pattern(
                name,
                "f(0) = 0, but offsets must be positive (f : ℕ → ℕ>0): a token cannot depend on itself",
            ));
        }
        if cache_efficient && f0 != 1 {
            return Err(Error::pattern(
                name,
                format!("f(0) = {f0}, the cache-efficient lattice needs f(0) = 1"),
            ));
        }
        let mut prev = f0;
        for k in 1..CHECKED_TERMS {
            if prev == u64::MAX {
                break;
            }
            let cur = f(k);
            if cur <= prev {
                return Err(Error::pattern(
                    name,
                    format!("f must be strictly increasing, but f({}) = {prev} and f({k}) = {cur}", k - 1),
                ));
            }
            prev = cur;
        }
        Ok(Self { name: name.to_string(), f, order, cache_efficient })
    }

    /// The pattern's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The truncation: at most `order` slots (`k <` `order`); `None` = untruncated.
    pub fn order(&self) -> Option<usize> {
        self.order
    }

    /// Whether positions are the cache-efficient lattice `d_k(t) = a_k⌈ (t+1−f(k))/a_k⌉ − 1`
    /// rather than the translation-invariant `d_k(t) = t − f(k)` (docs/math.md §1.1).
    pub fn cache_efficient(&self) -> bool {
        self.cache_efficient
    }

    /// The offset `f(k)` (ignores the truncation).
    pub fn offset(&self, k: usize) -> u64 {
        (self.f)(k)
    }

    /// Whether slot `k` is within the truncation.
    fn in_order(&self, k: usize) -> bool {
        self.order.is_none_or(|o| k < o)
    }

    /// Number of slots `k` (within the truncation) with `f(k) ≤` `limit`. Counting stops at the
    /// first term that does not increase (only the first 64 terms are validated) and after
    /// `limit` terms (a strictly increasing `f ≥ 1` has `f(k) ≥ k + 1`).
    fn count_le(&self, limit: u64) -> usize {
        let mut k = 0usize;
        let mut prev = 0u64;
        while self.in_order(k) && (k as u64) < limit {
            let fk = (self.f)(k);
            if fk > limit || (k > 0 && fk <= prev) {
                break;
            }
            prev = fk;
            k += 1;
        }
        k
    }

    /// Number of dependency slots for length `T` (docs/math.md §1.1):
    /// `K(T) = #{k : f(k) ≤ T − 1}`, capped by `order`. `K(0) = 0`.
    pub fn slots(&self, t_len: usize) -> usize {
        match t_len.checked_sub(1) {
            Some(limit) => self.count_le(limit as u64),
            None => 0,
        }
    }

    /// The active offsets `f(0), …, f(K(T) − 1)`.
    pub fn offsets(&self, t_len: usize) -> Vec<u64> {
        (0..self.slots(t_len)).map(self.f).collect()
    }

    /// The strides `a_0, …, a_{n−1}` of the cache-efficient lattice (docs/math.md §1.1):
    /// `a_0 = 1`, `a_{k+1} = a_k ⌈ (f(k+1) − f(k)) / a_k ⌉` (pow2: `1,1,2,4,8,…`; sq1:
    /// `1,1,3,6,12,12,12,24,…`). Saturates at `u64::MAX` once `f` does. Defined (and
    /// returned) whether or not the pattern is cache-efficient.
    pub fn strides(&self, n: usize) -> Vec<u64> {
        let mut out = Vec::with_capacity(n);
        let mut a = 1u64;
        let mut prev = (self.f)(0);
        for k in 0..n {
            if k > 0 {
                let cur = (self.f)(k);
                a = if cur == u64::MAX || a == u64::MAX {
                    u64::MAX
                } else {
                    // max(1): never divide by a zero stride, even for an f that stops increasing
                    // beyond its validated prefix.
                    let gap = cur.saturating_sub(prev).max(1);
                    a.saturating_mul(gap.div_ceil(a))
                };
                prev = cur;
            }
            out.push(a);
        }
        out
    }

    /// Position `d_k(t)` read by token `t` in slot `k` (docs/math.md §1.1), or `None` when slot `k`
    /// is truncated away (`k ≥ order`) or inactive (`f(k) > t`).
    /// Costs `O(k)` for cache-efficient patterns (the strides); use [`Slots`] for many tokens.
    pub fn dep(&self, t: usize, k: usize) -> Option<usize> {
        let slots = Slots::new(self, t.checked_add(1)?);
        (k < slots.len()).then(|| slots.pos(t, k))
    }

    /// All active slots of token `t` as `(k, d_k(t))`, for `k < K(t+1)` (i.e. `f(k) ≤ t`).
    pub fn deps(&self, t: usize) -> Vec<(usize, usize)> {
        match t.checked_add(1) {
            Some(n) => Slots::new(self, n).deps(t).collect(),
            None => Vec::new(),
        }
    }

    /// The dependency positions of every token `t <` `t_len`, computed with one stride table.
    pub(crate) fn all_deps(&self, t_len: usize) -> Vec<Vec<usize>> {
        let slots = Slots::new(self, t_len);
        (0..t_len).map(|t| slots.deps(t).map(|(_, d)| d).collect()).collect()
    }

    /// Checks docs/math.md §1.1's lattice invariant for every `t <` `t_len`: `P_t ⊆ [0, t−1]` and,
    /// for cache-efficient patterns, `P_t ⊆ P_{t−1} ∪ {t−1}` (so a decoder's cache
    /// after token `t−1` is exactly `P_t`). Translation-invariant patterns only need
    /// `P_t ⊆ [0, t−1]`. The error names the token and the offending position.
    pub fn check_lattice_invariant(&self, t_len: usize) -> Result<()> {
        let slots = Slots::new(self, t_len);
        let positions = |t: usize| -> Vec<usize> { slots.deps(t).map(|(_, d)| d).collect() };
        check_positions(&self.name, t_len, positions, self.cache_efficient)
    }

    /// Positions a decoder must keep for length `T` (docs/math.md §1.1).
    /// Cache-efficient: `max_{t < T} |P_t|` (distinct positions; `≤ log_2 T + 1` for pow2).
    /// Translation-invariant: the largest active offset `f(K(T)−1)` (a window of the last
    /// `f(K−1)` outputs), `0` when `K(T) = 0`.
    pub fn max_cache(&self, t_len: usize) -> usize {
        if self.cache_efficient {
            let slots = Slots::new(self, t_len);
            (0..t_len).map(|t| slots.distinct_positions(t)).max().unwrap_or(0)
        } else {
            match self.slots(t_len) {
                0 => 0,
                k => (self.f)(k - 1) as usize,
            }
        }
    }
}

/// The dependency table of a pattern for one length `T`: offsets `f(k)` and lattice strides
/// `a_k` for the `K(T)` slots, so that `d_k(t)` costs `O(1)` (docs/math.md §1.1). This is the one place
/// the position formula is written; the GLR forms, its decoders (CPU and CUDA, whose kernels
/// take [`Slots::offsets`] and [`Slots::strides`] as tables), the materialization and the
/// lattice checks all read it.
#[derive(Clone, Debug)]
pub struct Slots {
    offsets: Vec<usize>,
    strides: Vec<usize>,
    cache_efficient: bool,
}

impl Slots {
    /// Offsets and strides of `p` for length `t_len` (`f(k) ≤ T − 1`, so they fit in `usize`;
    /// strides are `≤ f(k)`, docs/math.md §1.1).
    pub fn new(p: &Pattern, t_len: usize) -> Self {
        let offsets: Vec<usize> = p.offsets(t_len).into_iter().map(|f| f as usize).collect();
        let strides = if p.cache_efficient() {
            p.strides(offsets.len()).into_iter().map(|a| usize::try_from(a).unwrap_or(usize::MAX)).collect()
        } else {
            vec![1; offsets.len()]
        };
        Slots { offsets, strides, cache_efficient: p.cache_efficient() }
    }

    /// `K(T)`.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Whether there are no slots (`T ≤ 1` or an empty pattern).
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// The offsets `f(0..K)`.
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// The strides `a_0..a_{K−1}` (all 1 for a translation-invariant pattern).
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Whether positions are on the cache-efficient lattice.
    pub fn cache_efficient(&self) -> bool {
        self.cache_efficient
    }

    /// Number of active slots of token `t`: `#{k < K : f(k) ≤ t}`.
    pub fn active(&self, t: usize) -> usize {
        self.offsets.partition_point(|&f| f <= t)
    }

    /// `d_k(t)` for an active slot (`f(k) ≤ t`): `t − f(k)`, or on the lattice
    /// `a_k ⌈ (t + 1 − f(k)) / a_k ⌉ − 1`.
    #[inline]
    pub fn pos(&self, t: usize, k: usize) -> usize {
        let u = t - self.offsets[k];
        if self.cache_efficient {
            let a = self.strides[k];
            // a ⌈(u + 1)/a⌉ − 1 = u + (a − 1 − u mod a); never exceeds t − 1 (module docs).
            u + (a - 1 - u % a)
        } else {
            u
        }
    }

    /// The active slots of token `t` as `(k, d_k(t))`.
    pub fn deps(&self, t: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.active(t)).map(move |k| (k, self.pos(t, k)))
    }

    /// `|P_t|`: the number of distinct positions token `t` reads.
    pub fn distinct_positions(&self, t: usize) -> usize {
        let mut p: Vec<usize> = self.deps(t).map(|(_, d)| d).collect();
        p.sort_unstable();
        p.dedup();
        p.len()
    }
}

/// Checks position sets `P_t` (given by `positions(t)` for `t <` `t_len`): `P_t ⊆ [0, t−1]`,
/// and when `nested`, `P_t ⊆ P_{t−1} ∪ {t−1}`. Errors name `t` and the position.
fn check_positions(
    name: &str,
    t_len: usize,
    mut positions: impl FnMut(usize) -> Vec<usize>,
    nested: bool,
) -> Result<()> {
    let mut prev: Vec<usize> = Vec::new();
    for t in 0..t_len {
        let mut cur = positions(t);
        cur.sort_unstable();
        cur.dedup();
        if let Some(&p) = cur.iter().find(|&&p| p >= t) {
            return Err(Error::pattern(
                name,
                format!(
                    "lattice invariant P_t ⊆ [0, t−1] fails at t = {t}: position {p} is not before t \
                     (P_t = {cur:?})"
                ),
            ));
        }
        if nested
            && t > 0
            && let Some(&p) = cur.iter().find(|&&p| p != t - 1 && prev.binary_search(&p).is_err())
        {
            return Err(Error::pattern(
                name,
                format!(
                    "lattice invariant P_t ⊆ P_(t−1) ∪ {{t−1}} fails at t = {t}: position {p} is in \
                         P_t = {cur:?} but not in P_(t−1) = {prev:?} ∪ {{{}}}",
                    t - 1
                ),
            ));
        }
        prev = cur;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pat(f: OffsetFn, order: Option<usize>, ce: bool) -> Pattern {
        Pattern::new("test", f, order, ce).unwrap()
    }

    #[test]
    fn builtins() {
        assert_eq!((0..5).map(pow2).collect::<Vec<_>>(), [1, 2, 4, 8, 16]);
        assert_eq!(pow2(63), 1 << 63);
        assert_eq!(pow2(64), u64::MAX);
        assert_eq!(pow2(usize::MAX), u64::MAX);
        assert_eq!((0..5).map(sq1).collect::<Vec<_>>(), [1, 2, 5, 10, 17]);
        assert_eq!(sq1(usize::MAX), u64::MAX);
        assert_eq!((0..3).map(linear).collect::<Vec<_>>(), [1, 2, 3]);
        for f in [pow2 as OffsetFn, sq1, linear] {
            for ce in [false, true] {
                assert!(Pattern::new("b", f, None, ce).is_ok());
            }
        }
    }

    #[test]
    fn strides_match_math() {
        assert_eq!(pat(pow2, None, true).strides(8), [1, 1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(pat(sq1, None, true).strides(8), [1, 1, 3, 6, 12, 12, 12, 24]);
        assert_eq!(pat(linear, None, true).strides(6), [1; 6]);
        assert!(pat(pow2, None, true).strides(0).is_empty());
        // Saturation: no panic, saturated strides.
        let s = pat(pow2, None, true).strides(70);
        assert_eq!(s[64], u64::MAX);
        assert_eq!(s[69], u64::MAX);
    }

    #[test]
    fn pow2_cache_efficient_t19() {
        let p = pat(pow2, None, true);
        let d: Vec<usize> = p.deps(19).into_iter().map(|(_, d)| d).collect();
        assert_eq!(d, [18, 17, 15, 11, 7]);
        assert_eq!(p.deps(19).iter().map(|&(k, _)| k).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        for (k, d) in p.deps(19) {
            assert_eq!(p.dep(19, k), Some(d));
        }
        assert_eq!(p.dep(19, 5), None); // f(5) = 32 > 19
        let ti = pat(pow2, None, false);
        assert_eq!(ti.deps(19), [(0, 18), (1, 17), (2, 15), (3, 11), (4, 3)]);
    }

    #[test]
    fn slots_offsets_and_order() {
        let p = pat(pow2, None, false);
        assert_eq!(p.slots(0), 0);
        assert_eq!(p.slots(1), 0);
        assert_eq!(p.slots(2), 1);
        assert_eq!(p.slots(3), 2);
        assert_eq!(p.slots(4096), 12);
        assert_eq!(p.slots(4097), 13);
        assert_eq!(p.offsets(9), [1, 2, 4, 8]);
        let o = pat(linear, Some(3), false);
        assert_eq!(o.slots(100), 3);
        assert_eq!(o.slots(3), 2);
        assert_eq!(o.dep(10, 3), None);
        assert_eq!(o.dep(10, 2), Some(7));
        assert_eq!(o.deps(10).len(), 3);
        assert_eq!(pat(linear, None, false).slots(100), 99);
        assert_eq!(pat(pow2, None, false).slots(usize::MAX), 64);
        assert_eq!(pat(pow2, None, false).dep(0, 0), None);
        assert!(pat(pow2, None, true).deps(0).is_empty());
    }

    #[test]
    fn invariant_holds_for_builtins() {
        for f in [pow2 as OffsetFn, sq1, linear] {
            for order in [None, Some(1), Some(3)] {
                for ce in [false, true] {
                    pat(f, order, ce).check_lattice_invariant(3000).unwrap();
                }
            }
        }
    }

    #[test]
    fn max_cache_values() {
        let p = pat(pow2, None, true);
        assert!(p.max_cache(4096) <= 13, "{}", p.max_cache(4096));
        assert!(p.max_cache(4096) >= 12);
        assert_eq!(pat(pow2, None, false).max_cache(4096), 2048);
        assert_eq!(pat(pow2, None, false).max_cache(1), 0);
        assert_eq!(pat(linear, Some(1), true).max_cache(100), 1);
        assert_eq!(pat(linear, Some(4), false).max_cache(100), 4);
    }

    #[test]
    fn checker_rejects_bad_positions() {
        // P_2 = {0} but P_1 ∪ {0}... fine; P_3 = {0} ⊆ P_2 ∪ {2}; P_4 = {1}: 1 ∉ P_3 ∪ {3}.
        let sets = [vec![], vec![0], vec![0, 1], vec![0, 2], vec![1, 3]];
        let e = check_positions("bad", 5, |t| sets[t].clone(), true).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("t = 4") && msg.contains("position 1"), "{msg}");
        assert!(check_positions("bad", 5, |t| sets[t].clone(), false).is_ok());
        // Position not before t.
        let e = check_positions("bad", 3, |t| if t == 2 { vec![2] } else { vec![] }, false).unwrap_err();
        assert!(e.to_string().contains("t = 2") && e.to_string().contains("position 2"), "{e}");
        assert!(matches!(e, Error::Pattern { .. }));
    }

    fn zero(_: usize) -> u64 {
        0
    }
    fn plus2(k: usize) -> u64 {
        k as u64 + 2
    }
    fn bump(k: usize) -> u64 {
        if k < 5 { k as u64 + 1 } else { 5 }
    }
    fn late_flat(k: usize) -> u64 {
        if k < 100 { k as u64 + 1 } else { 100 }
    }

    #[test]
    fn constructor_errors() {
        let e = Pattern::new("p", pow2, Some(0), false).unwrap_err();
        assert!(e.to_string().contains("got 0"), "{e}");
        let e = Pattern::new("z", zero, None, false).unwrap_err();
        assert!(e.to_string().contains("f(0) = 0"), "{e}");
        let e = Pattern::new("p2", plus2, None, true).unwrap_err();
        assert!(e.to_string().contains("f(0) = 2, the cache-efficient lattice needs f(0) = 1"), "{e}");
        assert!(Pattern::new("p2", plus2, None, false).is_ok());
        let e = Pattern::new("bump", bump, None, false).unwrap_err();
        assert!(e.to_string().contains("f(4) = 5 and f(5) = 5"), "{e}");
        // Beyond the validated prefix a flat f does not hang or panic.
        let p = Pattern::new("late", late_flat, None, true).unwrap();
        assert_eq!(p.slots(1000), 100);
        let _ = p.strides(200);
        p.check_lattice_invariant(300).unwrap();
    }

    #[test]
    fn translation_invariant_shift_not_one() {
        let p = pat(plus2, None, false);
        assert_eq!(p.deps(4), [(0, 2), (1, 1), (2, 0)]);
        p.check_lattice_invariant(100).unwrap();
    }

    fn arb_f() -> impl Strategy<Value = OffsetFn> {
        fn cube1(k: usize) -> u64 {
            (k as u64).saturating_pow(3).saturating_add(1)
        }
        fn tri1(k: usize) -> u64 {
            (k as u64) * (k as u64 + 1) / 2 + 1
        }
        fn fib1(k: usize) -> u64 {
            let (mut a, mut b) = (1u64, 2u64);
            for _ in 0..k {
                (a, b) = (b, a.saturating_add(b));
            }
            a
        }
        fn pow3(k: usize) -> u64 {
            3u64.saturating_pow(k as u32)
        }
        prop_oneof![
            Just(pow2 as OffsetFn),
            Just(sq1 as OffsetFn),
            Just(linear as OffsetFn),
            Just(cube1 as OffsetFn),
            Just(tri1 as OffsetFn),
            Just(fib1 as OffsetFn),
            Just(pow3 as OffsetFn),
        ]
    }

    proptest! {
        #[test]
        fn prop_invariant_and_dep_consistency(f in arb_f(), order in proptest::option::of(1usize..6), t in 0usize..5000) {
            let p = Pattern::new("prop", f, order, true).unwrap();
            let deps = p.deps(t);
            prop_assert_eq!(deps.len(), p.slots(t + 1));
            for &(k, d) in &deps {
                prop_assert_eq!(p.dep(t, k), Some(d));
                prop_assert!(d < t);
                // Nested: d ∈ P_{t−1} ∪ {t−1}.
                prop_assert!(d == t - 1 || p.deps(t - 1).iter().any(|&(_, e)| e == d));
                // The lattice position is within one stride of the translation-invariant one.
                let ti = t - p.offset(k) as usize;
                prop_assert!(d >= ti && d < ti + p.strides(k + 1)[k] as usize);
            }
        }

        #[test]
        fn prop_strides_divide(f in arb_f(), n in 1usize..40) {
            let p = Pattern::new("prop", f, None, true).unwrap();
            let a = p.strides(n);
            for k in 1..n {
                if a[k] != u64::MAX {
                    prop_assert_eq!(a[k] % a[k - 1], 0);
                    prop_assert!(a[k] >= p.offset(k) - p.offset(k - 1));
                    prop_assert!(a[k] <= p.offset(k));
                }
            }
        }
    }
}
