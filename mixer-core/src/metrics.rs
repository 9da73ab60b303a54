//! Structural metrics of communication graphs (docs/math.md §1.4 "Structural metrics").
//!
//! The communication graph has an edge `s → t` when `B_{t,s} ≠ 0` (the recurrence reads
//! `y_s`), which chains, plus edges for `A_{t,s} ≠ 0` (one-hop direct influence of `x_s` on
//! `y_t`), which can only be the first hop of a path. A path from `s` starts at `s` itself
//! (token `s`'s own output holds its input at 0 hops). `d(s,t)` is the fewest hops.
//!
//! For a translation-invariant pattern `d(s,t) = d(t−s)` depends on the shift only and is
//! computed over shifts; for other graphs (cache-efficient lattices, materialized sparsities)
//! by breadth-first search.

use std::sync::atomic::{AtomicU32, Ordering};

use ndarray::ArrayView2;
use rayon::prelude::*;

use crate::error::{Error, Result, fmt_shape};
use crate::pattern::Pattern;

/// Up to this length, graph shortest paths are exact over all pairs `s < t`; above, sources are
/// sampled ([`SAMPLED_SOURCES`] evenly spaced plus the last [`LAST_SOURCES`]).
pub const EXACT_PATHS_MAX_T: usize = 4096;
/// Up to this length, graph congestion is computed for every shift `Δ ∈ [1, T)`; above,
/// for [`SAMPLED_SHIFTS`] evenly spaced shifts plus `2^j − 1`, `2^j` and `T − 1`.
pub const ALL_SHIFTS_MAX_T: usize = 2048;
/// Number of evenly spaced sources used for shortest paths above [`EXACT_PATHS_MAX_T`].
pub const SAMPLED_SOURCES: usize = 256;
/// Number of final sources (`T−2, T−3, …`) added to the sample above [`EXACT_PATHS_MAX_T`].
pub const LAST_SOURCES: usize = 8;
/// Number of evenly spaced shifts used for congestion above [`ALL_SHIFTS_MAX_T`].
pub const SAMPLED_SHIFTS: usize = 128;

const INF: u32 = u32::MAX;

/// Shortest-path statistics (docs/math.md §1.4): over pairs `s < t < T` for graphs, over shifts
/// `Δ ∈ [1, T)` for translation-invariant patterns.
#[derive(Clone, Debug, PartialEq)]
pub struct PathStats {
    /// `max d` over the counted pairs (or shifts); `None` when some are unreachable
    /// (`d = ∞`). `Some(0)` when there is nothing to count (`T ≤ 1`).
    pub max: Option<usize>,
    /// `histogram[h]` = number of pairs (or shifts) with `d = h`; unreachable ones are in
    /// [`PathStats::unreachable`].
    pub histogram: Vec<usize>,
    /// Number of unreachable pairs (or shifts).
    pub unreachable: usize,
    /// Mean of `d` over the reachable pairs (or shifts); `0` when there are none.
    pub mean: f64,
    /// `false` when the pairs come from sampled sources only.
    pub exact: bool,
}

impl PathStats {
    fn from_histogram(mut histogram: Vec<usize>, unreachable: usize, exact: bool) -> Self {
        while histogram.last() == Some(&0) {
            histogram.pop();
        }
        let count: usize = histogram.iter().sum();
        let total: f64 = histogram.iter().enumerate().map(|(h, &c)| h as f64 * c as f64).sum();
        let mean = if count == 0 { 0.0 } else { total / count as f64 };
        let max = (unreachable == 0).then(|| histogram.len().saturating_sub(1));
        Self { max, histogram, unreachable, mean, exact }
    }
}

/// Congestion of the copy routing with shift `Δ` (token `s` must reach `s + Δ`), docs/math.md
/// §1.4: the maximum over nodes of the number of routed paths that leave through the node,
/// worst case over shifts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Congestion {
    /// The worst congestion over the shifts considered.
    pub value: usize,
    /// A shift `Δ` attaining it (the smallest one); `0` when `T ≤ 1`.
    pub worst_shift: usize,
    /// `true` when the value comes from an explicit routing (BFS shortest paths) on a graph that
    /// is not translation-invariant: an upper bound on the minimum over routings.
    pub is_bound: bool,
    /// Whether every shift `Δ ∈ [1, T)` was considered (otherwise a sample).
    pub exact_over_all_shifts: bool,
}

/// All structural metrics of a pattern at length `T` (docs/math.md §1.4).
#[derive(Clone, Debug, PartialEq)]
pub struct PatternMetrics {
    /// The sequence length `T`.
    pub t_len: usize,
    /// `K(T)`, the number of dependency slots.
    pub slots: usize,
    /// Shortest paths (over shifts when translation-invariant, over pairs otherwise).
    pub paths: PathStats,
    /// Worst-case congestion over shifts.
    pub congestion: Congestion,
    /// Mean number of dependencies read per token, `1/T Σ_{t<T} #{k : f(k) ≤ t}`.
    pub per_token_cost: f64,
    /// `max_{t<T}` of the number of dependencies read (`= K(T)`).
    pub max_per_token_cost: usize,
    /// Positions a decoder keeps: [`Pattern::max_cache`].
    pub cache_positions: usize,
}

/// Shortest path `d(Δ)` for every shift `Δ ∈ [0, T)` of the translation-invariant graph
/// with offsets `f(0..K(T))` (edges `t − f(k) → t`): `Some(0)` at `Δ = 0`, `None` when
/// `Δ` is not a sum of offsets. Uses only the offsets (and `order`), even for a
/// cache-efficient pattern.
///
/// Breadth-first search over shifts; offsets are grouped into runs of consecutive values and a
/// "next unvisited shift" union-find skips visited shifts, so the cost is
/// `O(T · #runs)` at most (pow2: `O(T log T)`; linear: `O(T)`), and the search stops
/// once every shift is reached.
pub fn shift_distances(p: &Pattern, t_len: usize) -> Vec<Option<usize>> {
    let offsets: Vec<usize> = p.offsets(t_len).into_iter().map(|f| f as usize).collect();
    shift_distances_raw(&offsets, t_len).into_iter().map(|d| (d != INF).then_some(d as usize)).collect()
}

fn find(next: &mut [usize], mut x: usize) -> usize {
    while next[x] != x {
        next[x] = next[next[x]];
        x = next[x];
    }
    x
}

/// `offsets` strictly increasing, all in `[1, t_len)`.
fn shift_distances_raw(offsets: &[usize], t_len: usize) -> Vec<u32> {
    let mut dist = vec![INF; t_len];
    if t_len == 0 {
        return dist;
    }
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &o in offsets {
        match runs.last_mut() {
            Some((_, hi)) if *hi + 1 == o => *hi = o,
            _ => runs.push((o, o)),
        }
    }
    // next[x] = x when x is unvisited; next[t_len] is the sentinel.
    let mut next: Vec<usize> = (0..=t_len).collect();
    dist[0] = 0;
    next[0] = 1;
    let mut remaining = t_len - 1;
    let mut queue = vec![0usize];
    let mut head = 0;
    'bfs: while head < queue.len() && remaining > 0 {
        let x = queue[head];
        head += 1;
        for &(lo, hi) in &runs {
            let a = x + lo;
            if a >= t_len {
                break;
            }
            let b = (x + hi).min(t_len - 1);
            let mut y = find(&mut next, a);
            while y <= b {
                dist[y] = dist[x] + 1;
                queue.push(y);
                next[y] = y + 1;
                remaining -= 1;
                if remaining == 0 {
                    break 'bfs;
                }
                y = find(&mut next, y + 1);
            }
        }
    }
    dist
}

/// A causal communication graph on tokens `0..T` (docs/math.md §1.4): chaining edges `p → t`
/// (recurrence, `B_{t,p} ≠ 0`, `p < t`) and first-hop-only edges (direct influence,
/// `A_{t,p} ≠ 0`, `p < t`).
#[derive(Clone, Debug)]
pub struct CommGraph {
    n: usize,
    /// CSR successors over chaining edges.
    b_start: Vec<usize>,
    b_succ: Vec<usize>,
    /// CSR successors over first-hop-only edges.
    a_start: Vec<usize>,
    a_succ: Vec<usize>,
}

fn csr(n: usize, preds: &[Vec<usize>]) -> (Vec<usize>, Vec<usize>) {
    let mut start = vec![0usize; n + 1];
    for ps in preds {
        for &p in ps {
            start[p + 1] += 1;
        }
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut fill = start.clone();
    let mut succ = vec![0usize; start[n]];
    for (t, ps) in preds.iter().enumerate() {
        for &p in ps {
            succ[fill[p]] = t;
            fill[p] += 1;
        }
    }
    (start, succ)
}

struct Work {
    dist: Vec<u32>,
    parent: Vec<usize>,
    queue: Vec<usize>,
    hist: Vec<usize>,
    unreachable: usize,
}

impl Work {
    fn new(n: usize) -> Self {
        Self { dist: vec![INF; n], parent: vec![0; n], queue: Vec::new(), hist: Vec::new(), unreachable: 0 }
    }
    fn merge(mut self, other: Self) -> Self {
        if self.hist.len() < other.hist.len() {
            self.hist.resize(other.hist.len(), 0);
        }
        for (h, c) in other.hist.into_iter().enumerate() {
            self.hist[h] += c;
        }
        self.unreachable += other.unreachable;
        self
    }
}

impl CommGraph {
    /// Graph from chaining predecessors: `preds[t]` lists the positions `p` token `t` reads
    /// (`y_p → y_t`, i.e. `B_{t,p} ≠ 0`). Every `p` must satisfy `p < t` (causal).
    pub fn from_preds(preds: Vec<Vec<usize>>) -> Result<Self> {
        let n = preds.len();
        for (t, ps) in preds.iter().enumerate() {
            if let Some(&p) = ps.iter().find(|&&p| p >= t) {
                return Err(Error::config(
                    "CommGraph",
                    format!("preds[{t}] must hold positions < {t} (causal), but holds {p}"),
                ));
            }
        }
        let (b_start, b_succ) = csr(n, &preds);
        Ok(Self { n, b_start, b_succ, a_start: vec![0; n + 1], a_succ: Vec::new() })
    }

    /// Graph from a materialized sparsity (docs/math.md §1.4): first-hop edge `s → t` when
    /// `A_{t,s} ≠ 0`, chaining edge `s → t` when `B_{t,s} ≠ 0`, for `s < t` (entries with
    /// `s ≥ t` are ignored; NaN counts as non-zero). `a` must be square `[T, T]` and `b`, when
    /// given, the same shape.
    pub fn from_dense(a: ArrayView2<f64>, b: Option<ArrayView2<f64>>) -> Result<Self> {
        let (rows, cols) = a.dim();
        if rows != cols {
            return Err(Error::shape("a", "[T, T] (square)", fmt_shape(a.shape())));
        }
        let n = rows;
        if let Some(b) = &b
            && b.dim() != (n, n)
        {
            return Err(Error::shape("b", fmt_shape(&[n, n]), fmt_shape(b.shape())));
        }
        let lower = |m: &ArrayView2<f64>| -> Vec<Vec<usize>> {
            (0..n).map(|t| (0..t).filter(|&s| m[[t, s]] != 0.0).collect()).collect()
        };
        let a_preds = lower(&a);
        let b_preds = b.as_ref().map(lower).unwrap_or_else(|| vec![Vec::new(); n]);
        let (a_start, a_succ) = csr(n, &a_preds);
        let (b_start, b_succ) = csr(n, &b_preds);
        Ok(Self { n, b_start, b_succ, a_start, a_succ })
    }

    /// Number of tokens `T`.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the graph has no tokens.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Exact shortest paths `d(s,t)` over all pairs `s < t`, by a BFS from every source
    /// (parallel; `O(T · E)` — meant for small `T`).
    pub fn shortest_paths(&self) -> PathStats {
        let sources: Vec<usize> = (0..self.n).collect();
        self.analyze(&sources, &[]).0
    }

    /// Shortest paths from the sources [`pattern_metrics`] uses: every source when
    /// `T ≤` [`EXACT_PATHS_MAX_T`] (then `exact`), else [`SAMPLED_SOURCES`] evenly spaced ones
    /// plus the last [`LAST_SOURCES`] (`exact = false`). `O(#sources · E)`, without
    /// the all-sources cost of [`CommGraph::congestion`].
    pub fn sampled_shortest_paths(&self) -> PathStats {
        self.analyze(&path_sources(self.n), &[]).0
    }

    /// Congestion of the copy routings (docs/math.md §1.4) as an upper bound: every `s → s+Δ` is
    /// routed along a BFS shortest path, and the worst node count is taken, worst over shifts
    /// (`Δ ∈ [1, T)` when `T ≤` [`ALL_SHIFTS_MAX_T`], sampled above). Unreachable pairs
    /// are not routed. `O(T · E)`.
    pub fn congestion(&self) -> Congestion {
        self.analyze(&[], &congestion_shifts(self.n)).1
    }

    fn bfs(&self, s: usize, w: &mut Work) {
        let n = self.n;
        w.dist[s..n].fill(INF);
        w.dist[s] = 0;
        w.queue.clear();
        w.queue.push(s);
        for &u in &self.a_succ[self.a_start[s]..self.a_start[s + 1]] {
            if w.dist[u] == INF {
                w.dist[u] = 1;
                w.parent[u] = s;
                w.queue.push(u);
            }
        }
        let mut head = 0;
        while head < w.queue.len() {
            let x = w.queue[head];
            head += 1;
            let dx = w.dist[x] + 1;
            for &u in &self.b_succ[self.b_start[x]..self.b_start[x + 1]] {
                if w.dist[u] == INF {
                    w.dist[u] = dx;
                    w.parent[u] = x;
                    w.queue.push(u);
                }
            }
        }
    }

    /// BFS from every needed source: path statistics from `path_sources` (sorted, distinct),
    /// congestion for `shifts` (routing every source). Exactness flags are set by the caller.
    fn analyze(&self, path_sources: &[usize], shifts: &[usize]) -> (PathStats, Congestion) {
        let n = self.n;
        let all_sources = !shifts.is_empty();
        let counts: Vec<AtomicU32> = (0..shifts.len() * n).map(|_| AtomicU32::new(0)).collect();
        let is_path_source = {
            let mut v = vec![false; n];
            for &s in path_sources {
                v[s] = true;
            }
            v
        };
        let sources: Vec<usize> = if all_sources { (0..n).collect() } else { path_sources.to_vec() };
        let work = sources
            .par_iter()
            .with_min_len(8)
            .fold(
                || Work::new(n),
                |mut w, &s| {
                    self.bfs(s, &mut w);
                    if is_path_source[s] {
                        for &d in &w.dist[s + 1..n] {
                            if d == INF {
                                w.unreachable += 1;
                            } else {
                                let d = d as usize;
                                if w.hist.len() <= d {
                                    w.hist.resize(d + 1, 0);
                                }
                                w.hist[d] += 1;
                            }
                        }
                    }
                    for (i, &delta) in shifts.iter().enumerate() {
                        let t = s + delta;
                        if t >= n {
                            break;
                        }
                        if w.dist[t] == INF {
                            continue;
                        }
                        let row = &counts[i * n..(i + 1) * n];
                        let mut v = t;
                        while v != s {
                            v = w.parent[v];
                            row[v].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    w
                },
            )
            .reduce(|| Work::new(0), Work::merge);
        let paths = PathStats::from_histogram(work.hist, work.unreachable, path_sources.len() == n);
        let mut congestion = Congestion {
            value: 0,
            worst_shift: 0,
            is_bound: true,
            exact_over_all_shifts: shifts.len() + 1 >= n,
        };
        for (i, &delta) in shifts.iter().enumerate() {
            let m = counts[i * n..(i + 1) * n].iter().map(|c| c.load(Ordering::Relaxed)).max().unwrap_or(0)
                as usize;
            if m > congestion.value {
                congestion.value = m;
                congestion.worst_shift = delta;
            }
        }
        if congestion.worst_shift == 0 && !shifts.is_empty() {
            congestion.worst_shift = shifts[0];
        }
        (paths, congestion)
    }
}

/// Shifts for graph congestion: all of `[1, T)` when `T ≤` [`ALL_SHIFTS_MAX_T`], else
/// [`SAMPLED_SHIFTS`] evenly spaced ones plus `2^j − 1`, `2^j` and `T − 1` (sorted, distinct).
fn congestion_shifts(n: usize) -> Vec<usize> {
    if n <= 1 {
        return Vec::new();
    }
    if n <= ALL_SHIFTS_MAX_T {
        return (1..n).collect();
    }
    let mut v: Vec<usize> = (0..SAMPLED_SHIFTS).map(|i| 1 + i * (n - 2) / (SAMPLED_SHIFTS - 1)).collect();
    let mut p = 1usize;
    while p < n {
        v.push(p);
        if p > 1 {
            v.push(p - 1);
        }
        p = p.saturating_mul(2);
    }
    v.push(n - 1);
    v.sort_unstable();
    v.dedup();
    v.retain(|&d| (1..n).contains(&d));
    v
}

/// Sources for graph shortest paths: all when `T ≤` [`EXACT_PATHS_MAX_T`], else
/// [`SAMPLED_SOURCES`] evenly spaced in `[0, T−1)` plus the last [`LAST_SOURCES`] before `T−1`.
fn path_sources(n: usize) -> Vec<usize> {
    if n <= EXACT_PATHS_MAX_T {
        return (0..n).collect();
    }
    let mut v: Vec<usize> = (0..SAMPLED_SOURCES).map(|i| i * (n - 1) / SAMPLED_SOURCES).collect();
    v.extend((2..2 + LAST_SOURCES).map(|j| n - j));
    v.sort_unstable();
    v.dedup();
    v
}

/// Structural metrics of a pattern at length `T ≥ 1` (docs/math.md §1.4).
///
/// - Translation-invariant: `d(s,t) = d(t−s)` from [`shift_distances`]; `paths` is over shifts
///   `Δ ∈ [1, T)` (exact). Congestion is `max_Δ d(Δ)`: translating one shortest
///   path puts every node on `d(Δ)` translated paths, and on the boundary-free line no
///   routing does better (each path leaves `≥ d(Δ)` nodes, so the mean load per node is
///   `≥ d(Δ)`); exact, not a bound. Shifts that are unreachable are skipped.
/// - Cache-efficient: BFS over the lattice graph (edges `d_k(t) → t`): `paths` over pairs
///   `s < t`, exact for `T ≤` [`EXACT_PATHS_MAX_T`], sampled sources above; congestion is the
///   bound of [`CommGraph::congestion`] (finite line: only `s + Δ < T` is routed). Cost
///   `O(T · E)`, `E ≈ T · K`.
///
/// Errors when `T = 0` or (cache-efficient) when the lattice produces a non-causal position.
pub fn pattern_metrics(p: &Pattern, t_len: usize) -> Result<PatternMetrics> {
    if t_len == 0 {
        return Err(Error::pattern(p.name(), "metrics need a sequence length T ≥ 1, got T = 0"));
    }
    let slots = p.slots(t_len);
    let offsets = p.offsets(t_len);
    if p.cache_efficient() {
        let deps = p.all_deps(t_len);
        let reads: usize = deps.iter().map(Vec::len).sum();
        let max_reads = deps.iter().map(Vec::len).max().unwrap_or(0);
        let cache = deps
            .iter()
            .map(|d| {
                let mut d = d.clone();
                d.sort_unstable();
                d.dedup();
                d.len()
            })
            .max()
            .unwrap_or(0);
        let graph = CommGraph::from_preds(deps).map_err(|e| Error::pattern(p.name(), e.to_string()))?;
        let (paths, congestion) = graph.analyze(&path_sources(t_len), &congestion_shifts(t_len));
        return Ok(PatternMetrics {
            t_len,
            slots,
            paths,
            congestion,
            per_token_cost: reads as f64 / t_len as f64,
            max_per_token_cost: max_reads,
            cache_positions: cache,
        });
    }
    let offs: Vec<usize> = offsets.iter().map(|&f| f as usize).collect();
    let dist = shift_distances_raw(&offs, t_len);
    let mut hist = Vec::new();
    let mut unreachable = 0;
    let mut congestion =
        Congestion { value: 0, worst_shift: 0, is_bound: false, exact_over_all_shifts: true };
    for (delta, &d) in dist.iter().enumerate().skip(1) {
        if d == INF {
            unreachable += 1;
            continue;
        }
        let d = d as usize;
        if hist.len() <= d {
            hist.resize(d + 1, 0);
        }
        hist[d] += 1;
        if d > congestion.value {
            congestion.value = d;
            congestion.worst_shift = delta;
        }
    }
    let reads: usize = offs.iter().map(|&f| t_len - f).sum();
    Ok(PatternMetrics {
        t_len,
        slots,
        paths: PathStats::from_histogram(hist, unreachable, true),
        congestion,
        per_token_cost: reads as f64 / t_len as f64,
        max_per_token_cost: slots,
        cache_positions: p.max_cache(t_len),
    })
}

#[cfg(test)]
mod tests {
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
        for p in [
            pat(pow2, None, false),
            pat(sq1, None, false),
            pat(linear, None, false),
            pat(linear, Some(3), false),
        ] {
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
        let st =
            CommGraph::from_dense(Array2::<f64>::eye(n).view(), Some(band.view())).unwrap().shortest_paths();
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
                    (0..n)
                        .map(|t| (0..t).filter(|&s| m[t][s] && (s * 7 + t * 3) % dens == 0).collect())
                        .collect()
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
}
