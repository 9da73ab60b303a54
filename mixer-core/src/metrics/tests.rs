//! Tests of the structural metrics against closed forms and brute force.

use super::*;
use crate::pattern::{linear, pow2, sq1};
use ndarray::Array2;
use proptest::prelude::*;

fn pat(f: crate::pattern::OffsetFn, order: Option<usize>, ce: bool) -> Pattern {
    Pattern::new("test", f, order, ce).unwrap()
}

#[test]
fn pow2_paths_are_popcount() {
    let p = pat(pow2, None, false);
    let d = shift_distances(&p, 4096);
    for (delta, d) in d.iter().enumerate() {
        assert_eq!(*d, Some(delta.count_ones() as usize), "Δ={delta}");
    }
    let m = pattern_metrics(&p, 4096).unwrap();
    assert_eq!(m.paths.max, Some(12));
    assert!(m.paths.exact);
    assert_eq!(m.paths.histogram.iter().sum::<usize>(), 4095);
    assert_eq!(m.paths.histogram[1], 12);
    assert_eq!(
        m.congestion,
        Congestion { value: 12, worst_shift: 4095, is_bound: false, exact_over_all_shifts: true }
    );
    assert_eq!(m.slots, 12);
    assert_eq!(m.max_per_token_cost, 12);
    assert_eq!(m.cache_positions, 2048);
    // Mean popcount over Δ ∈ [1, 4096) = 12·2048 / 4095.
    assert!((m.paths.mean - 12.0 * 2048.0 / 4095.0).abs() < 1e-12);
}

#[test]
fn sq1_at_most_four() {
    let m = pattern_metrics(&pat(sq1, None, false), 20000).unwrap();
    assert!(m.paths.max.unwrap() <= 4, "{:?}", m.paths);
    assert!(m.congestion.value <= 4);
    assert_eq!(m.paths.unreachable, 0);
}

#[test]
fn linear_order_k_is_ceil() {
    for k in 1..6usize {
        let p = pat(linear, Some(k), false);
        let d = shift_distances(&p, 500);
        for (delta, d) in d.iter().enumerate() {
            assert_eq!(*d, Some(delta.div_ceil(k)), "k={k} Δ={delta}");
        }
        let m = pattern_metrics(&p, 500).unwrap();
        assert_eq!(m.congestion.value, 499usize.div_ceil(k));
        assert_eq!(m.paths.max, Some(499usize.div_ceil(k)));
    }
    // Diagonal SSM: congestion T − 1.
    let m = pattern_metrics(&pat(linear, Some(1), false), 1000).unwrap();
    assert_eq!(m.congestion.value, 999);
    assert_eq!(m.congestion.worst_shift, 999);
    assert_eq!(m.per_token_cost, 999.0 / 1000.0);
}

#[test]
fn dense_is_one() {
    let m = pattern_metrics(&pat(linear, None, false), 2000).unwrap();
    assert_eq!(m.paths.max, Some(1));
    assert_eq!(m.congestion.value, 1);
    assert_eq!(m.slots, 1999);
    assert_eq!(m.max_per_token_cost, 1999);
    assert!((m.per_token_cost - 1999.0 / 2.0).abs() < 1e-9);
}

#[test]
fn translation_invariant_is_fast_at_65536() {
    for p in
        [pat(pow2, None, false), pat(sq1, None, false), pat(linear, None, false), pat(linear, Some(3), false)]
    {
        let m = pattern_metrics(&p, 65536).unwrap();
        assert_eq!(m.paths.unreachable, 0);
        assert!(m.paths.exact);
    }
    assert_eq!(pattern_metrics(&pat(pow2, None, false), 65536).unwrap().paths.max, Some(16));
    // Beyond: 2^20.
    assert_eq!(pattern_metrics(&pat(pow2, None, false), 1 << 20).unwrap().paths.max, Some(20));
}

fn plus2(k: usize) -> u64 {
    2 * k as u64 + 2
}

#[test]
fn unreachable_shifts() {
    // Even offsets only: odd shifts are unreachable.
    let m = pattern_metrics(&pat(plus2, None, false), 100).unwrap();
    assert_eq!(m.paths.unreachable, 50);
    assert_eq!(m.paths.max, None);
    assert_eq!(m.paths.mean, 1.0);
    assert_eq!(m.congestion.value, 1);
}

#[test]
fn tiny_lengths() {
    assert!(pattern_metrics(&pat(pow2, None, false), 0).is_err());
    assert!(pattern_metrics(&pat(pow2, None, true), 0).is_err());
    for ce in [false, true] {
        let m = pattern_metrics(&pat(pow2, None, ce), 1).unwrap();
        assert_eq!(m.paths.max, Some(0));
        assert_eq!(m.congestion.value, 0);
        assert_eq!(m.slots, 0);
        let m = pattern_metrics(&pat(pow2, None, ce), 2).unwrap();
        assert_eq!(m.paths.max, Some(1));
        assert_eq!(m.congestion.value, 1);
    }
    let g = CommGraph::from_preds(vec![]).unwrap();
    assert!(g.is_empty());
    assert_eq!(g.shortest_paths().max, Some(0));
    assert_eq!(g.congestion().value, 0);
}

#[test]
fn cache_efficient_pow2_4096() {
    let m = pattern_metrics(&pat(pow2, None, true), 4096).unwrap();
    assert!(m.cache_positions <= 13, "{}", m.cache_positions);
    assert!(m.paths.exact);
    assert_eq!(m.paths.unreachable, 0);
    assert_eq!(m.paths.histogram.iter().sum::<usize>(), 4096 * 4095 / 2);
    assert!(m.paths.max.unwrap() >= 12);
    assert!(m.congestion.is_bound);
    assert!(!m.congestion.exact_over_all_shifts);
    assert!(m.congestion.value >= 1);
    assert_eq!(m.slots, 12);
}

#[test]
fn cache_efficient_sampled_regime() {
    let m = pattern_metrics(&pat(pow2, None, true), 4100).unwrap();
    assert!(!m.paths.exact);
    assert!(!m.congestion.exact_over_all_shifts);
    assert_eq!(m.paths.unreachable, 0);
}

#[test]
fn cache_efficient_diagonal_routing_bound() {
    // Linear order 1 is a chain; the routing of s → s+Δ for s + Δ < T loads node v with
    // min(Δ, T − Δ) paths at most: worst ⌊T/2⌋.
    let m = pattern_metrics(&pat(linear, Some(1), true), 100).unwrap();
    assert_eq!(m.paths.max, Some(99));
    assert_eq!(m.congestion.value, 50);
    assert!(m.congestion.exact_over_all_shifts && m.congestion.is_bound);
    assert_eq!(m.cache_positions, 1);
}

#[test]
fn graph_of_translation_invariant_matches_shift_distances() {
    let t_len = 300;
    for p in [pat(pow2, None, false), pat(sq1, None, false), pat(linear, Some(3), false)] {
        let preds: Vec<Vec<usize>> =
            (0..t_len).map(|t| p.deps(t).into_iter().map(|(_, d)| d).collect()).collect();
        let g = CommGraph::from_preds(preds).unwrap();
        let stats = g.shortest_paths();
        let d = shift_distances(&p, t_len);
        let mut hist = vec![0usize; stats.histogram.len()];
        for delta in 1..t_len {
            hist[d[delta].unwrap()] += t_len - delta;
        }
        assert_eq!(stats.histogram, hist);
        assert!(stats.exact);
    }
}

#[test]
fn dense_attention_and_band() {
    let n = 40;
    let a = Array2::from_shape_fn((n, n), |(t, s)| if s <= t { 1.0 } else { 0.0 });
    let g = CommGraph::from_dense(a.view(), None).unwrap();
    let st = g.shortest_paths();
    assert_eq!(st.max, Some(1));
    assert_eq!(st.histogram[1], n * (n - 1) / 2);
    assert_eq!(g.congestion().value, 1);
    // Band (local attention, window w): pairs with t − s ≥ w are unreachable (A edges do not
    // chain).
    let w = 5;
    let band = Array2::from_shape_fn((n, n), |(t, s)| if s <= t && t - s < w { 0.5 } else { 0.0 });
    let st = CommGraph::from_dense(band.view(), None).unwrap().shortest_paths();
    assert_eq!(st.max, None);
    assert_eq!(st.unreachable, (n - w) * (n - w + 1) / 2);
    assert_eq!(st.histogram[1], n * (n - 1) / 2 - st.unreachable);
    // The same band as B (a recurrence) chains: ⌈(t−s)/(w−1)⌉.
    let st = CommGraph::from_dense(Array2::<f64>::eye(n).view(), Some(band.view())).unwrap().shortest_paths();
    assert_eq!(st.max, Some((n - 1).div_ceil(w - 1)));
}

#[test]
fn graph_errors() {
    let e = CommGraph::from_preds(vec![vec![], vec![1]]).unwrap_err();
    assert!(e.to_string().contains("preds[1]") && e.to_string().contains("holds 1"), "{e}");
    let a = Array2::<f64>::zeros((3, 4));
    let e = CommGraph::from_dense(a.view(), None).unwrap_err();
    assert!(e.to_string().contains("[3, 4]"), "{e}");
    let a = Array2::<f64>::zeros((3, 3));
    let b = Array2::<f64>::zeros((2, 2));
    let e = CommGraph::from_dense(a.view(), Some(b.view())).unwrap_err();
    assert!(e.to_string().contains("[3, 3]") && e.to_string().contains("[2, 2]"), "{e}");
}

#[test]
fn shift_samples() {
    assert_eq!(congestion_shifts(5), [1, 2, 3, 4]);
    let v = congestion_shifts(5000);
    assert!(v.windows(2).all(|w| w[0] < w[1]));
    assert!(v.contains(&1) && v.contains(&4095) && v.contains(&4999) && *v.last().unwrap() == 4999);
    let s = path_sources(5000);
    assert!(s.windows(2).all(|w| w[0] < w[1]) && *s.last().unwrap() == 4998 && s[0] == 0);
}

/// Brute-force distances: d(s,t) = min(1 if an A edge, 1 + min over B preds p ≥ s of d(s,p)).
fn brute(n: usize, a: &[Vec<usize>], b: &[Vec<usize>]) -> (Vec<usize>, usize) {
    let mut hist = vec![0usize; n + 1];
    let mut unreach = 0;
    for s in 0..n {
        let mut d = vec![usize::MAX; n];
        d[s] = 0;
        for t in s + 1..n {
            let mut best = if a[t].contains(&s) { 1 } else { usize::MAX };
            for &p in &b[t] {
                if p >= s && d[p] != usize::MAX {
                    best = best.min(d[p] + 1);
                }
            }
            d[t] = best;
            if best == usize::MAX {
                unreach += 1;
            } else {
                hist[best] += 1;
            }
        }
    }
    while hist.last() == Some(&0) {
        hist.pop();
    }
    (hist, unreach)
}

fn arb_graph() -> impl Strategy<Value = (usize, Vec<Vec<usize>>, Vec<Vec<usize>>)> {
    (1usize..24)
        .prop_flat_map(|n| {
            let m = proptest::collection::vec(proptest::collection::vec(any::<bool>(), n), n);
            (Just(n), m.clone(), m)
        })
        .prop_map(|(n, ma, mb)| {
            let pick = |m: &Vec<Vec<bool>>, dens: usize| -> Vec<Vec<usize>> {
                (0..n).map(|t| (0..t).filter(|&s| m[t][s] && (s * 7 + t * 3) % dens == 0).collect()).collect()
            };
            (n, pick(&ma, 3), pick(&mb, 1))
        })
}

proptest! {
    #[test]
    fn prop_bfs_matches_brute_force((n, a, b) in arb_graph()) {
        let am = Array2::from_shape_fn((n, n), |(t, s)| if a[t].contains(&s) { 1.0 } else { 0.0 });
        let bm = Array2::from_shape_fn((n, n), |(t, s)| if b[t].contains(&s) { -2.0 } else { 0.0 });
        let g = CommGraph::from_dense(am.view(), Some(bm.view())).unwrap();
        let st = g.shortest_paths();
        let (hist, unreach) = brute(n, &a, &b);
        prop_assert_eq!(&st.histogram, &hist);
        prop_assert_eq!(st.unreachable, unreach);
        prop_assert_eq!(st.max.is_none(), unreach > 0);
        let c = g.congestion();
        prop_assert!(c.exact_over_all_shifts && c.is_bound);
        // Some routed pair ⇒ congestion ≥ 1; never more than the number of sources.
        prop_assert_eq!(c.value >= 1, hist.len() > 1);
        prop_assert!(c.value < n.max(1));
    }

    #[test]
    fn prop_lattice_order_k(k in 1usize..5, n in 2usize..80) {
        // Linear order k has strides 1: the lattice is the translation-invariant graph, so
        // the longest shortest path is ⌈(T−1)/k⌉; the routing bound lies in [1, T−1].
        let p = pat(linear, Some(k), true);
        let m = pattern_metrics(&p, n).unwrap();
        prop_assert_eq!(m.paths.max, Some((n - 1).div_ceil(k)));
        prop_assert!(m.congestion.value >= 1);
        prop_assert!(m.congestion.value < n);
    }
}
