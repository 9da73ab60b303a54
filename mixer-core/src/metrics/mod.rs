//! Structural metrics of communication graphs (MATH §1.4 "Structural metrics").
//!
//! The communication graph has an edge `s → t` when `B_{t,s} ≠ 0` (the recurrence reads
//! `y_s`), which chains, plus edges for `A_{t,s} ≠ 0` (one-hop direct influence of `x_s` on
//! `y_t`), which can only be the first hop of a path. A path from `s` starts at `s` itself
//! (token `s`'s own output holds its input at 0 hops). `d(s,t)` is the fewest hops.
//!
//! For a translation-invariant pattern `d(s,t) = d(t−s)` depends on the shift only and is
//! computed over shifts; for other graphs (cache-efficient lattices, materialized sparsities)
//! by breadth-first search.

mod cost;
mod graph;
mod sampling;
mod shifts;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use crate::pattern::Pattern;

pub use cost::{MAX_SEARCH_STEPS, check as check_cost};
pub use graph::CommGraph;
pub use shifts::shift_distances;

use sampling::{congestion_shifts, path_sources};
use shifts::shift_distances_raw;

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

/// Marks an unreachable shift or pair in the breadth-first searches.
const INF: u32 = u32::MAX;

/// Shortest-path statistics (MATH §1.4): over pairs `s < t < T` for graphs, over shifts
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
    pub(crate) fn from_histogram(mut histogram: Vec<usize>, unreachable: usize, exact: bool) -> Self {
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

/// Congestion of the copy routing with shift `Δ` (token `s` must reach `s + Δ`), MATH
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

/// All structural metrics of a pattern at length `T` (MATH §1.4).
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

/// Structural metrics of a pattern at length `T ≥ 1` (MATH §1.4).
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
/// Errors when `T = 0`, when the search would exceed [`MAX_SEARCH_STEPS`] or the memory budget
/// ([`check_cost`]; inputs are bounded, not approximated), or (cache-efficient) when the
/// lattice produces a non-causal position.
pub fn pattern_metrics(p: &Pattern, t_len: usize) -> Result<PatternMetrics> {
    if t_len == 0 {
        return Err(Error::pattern(p.name(), "metrics need a sequence length T ≥ 1, got T = 0"));
    }
    cost::check(p, t_len)?;
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
