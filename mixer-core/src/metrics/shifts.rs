//! Shortest paths of a translation-invariant graph, over shifts (MATH §1.4).

use super::INF;
use crate::pattern::Pattern;

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
pub(super) fn shift_distances_raw(offsets: &[usize], t_len: usize) -> Vec<u32> {
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
