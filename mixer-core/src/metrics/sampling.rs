//! Which shifts and sources the graph metrics use: all of them for small `T`, a fixed
//! sample above.

use super::{ALL_SHIFTS_MAX_T, EXACT_PATHS_MAX_T, LAST_SOURCES, SAMPLED_SHIFTS, SAMPLED_SOURCES};

/// Shifts for graph congestion: all of `[1, T)` when `T ≤` [`ALL_SHIFTS_MAX_T`], else
/// [`SAMPLED_SHIFTS`] evenly spaced ones plus `2^j − 1`, `2^j` and `T − 1` (sorted, distinct).
pub(super) fn congestion_shifts(n: usize) -> Vec<usize> {
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
pub(super) fn path_sources(n: usize) -> Vec<usize> {
    if n <= EXACT_PATHS_MAX_T {
        return (0..n).collect();
    }
    let mut v: Vec<usize> = (0..SAMPLED_SOURCES).map(|i| i * (n - 1) / SAMPLED_SOURCES).collect();
    v.extend((2..2 + LAST_SOURCES).map(|j| n - j));
    v.sort_unstable();
    v.dedup();
    v
}
