//! Causal communication graphs: shortest paths and the congestion of copy routings by
//! breadth-first search (MATH §1.4).

use std::sync::atomic::{AtomicU32, Ordering};

use ndarray::ArrayView2;
use rayon::prelude::*;

use super::sampling::{congestion_shifts, path_sources};
use super::{Congestion, INF, PathStats};
use crate::error::{Error, Result, fmt_shape};

/// A causal communication graph on tokens `0..T` (MATH §1.4): chaining edges `p → t`
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

    /// Graph from a materialized sparsity (MATH §1.4): first-hop edge `s → t` when
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

    /// Congestion of the copy routings (MATH §1.4) as an upper bound: every `s → s+Δ` is
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
    pub(super) fn analyze(&self, path_sources: &[usize], shifts: &[usize]) -> (PathStats, Congestion) {
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
