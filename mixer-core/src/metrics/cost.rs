//! Bounds on [`pattern_metrics`](super::pattern_metrics): its memory and its number of search
//! steps are estimated from `T` and the offsets before anything is allocated, and a call over
//! either bound is refused. The metrics are exact searches; this module bounds them rather
//! than approximating them.
//!
//! - Translation-invariant: the shift search holds about 20 bytes per shift (distance,
//!   union-find link, queue) and takes at most `T · R` steps, `R` the number of runs of
//!   consecutive offsets (pow2: `R ≈ log_2 T`; sq1: `R ≈ √T`; linear: 1).
//! - Cache-efficient: the lattice graph has `E = Σ_k (T − f(k))` edges; congestion routes
//!   every source by breadth-first search, so about `E · (T + S)` steps with `S` the
//!   path sources, and memory for the edge lists, per-worker search state and per-shift
//!   load counters.

use super::sampling::{congestion_shifts, path_sources};
use crate::error::{Error, Result};
use crate::pattern::Pattern;

/// The most search steps one call may take (about a minute on one core at worst).
pub const MAX_SEARCH_STEPS: f64 = 2e9;

fn too_slow(p: &Pattern, t_len: usize, steps: f64, how: &str) -> Error {
    Error::pattern(
        p.name(),
        format!(
            "metrics at T = {t_len} need about {steps:.2e} search steps ({how}), above the limit of \
             {MAX_SEARCH_STEPS:.0e}; use a smaller T"
        ),
    )
}

/// Refuses `(p, T)` when the metrics would exceed the step limit or the memory budget.
/// Runs in `O(K(T))` time and memory, before the metrics allocate anything of size `T`.
pub fn check(p: &Pattern, t_len: usize) -> Result<()> {
    let t = t_len as f64;
    // Every shift (or token) is visited at least once: refuse before counting offsets, which
    // takes K(T) ≤ T steps.
    if t > MAX_SEARCH_STEPS {
        return Err(too_slow(p, t_len, t, "at least one per position"));
    }
    let slots = p.slots(t_len);
    let what = format!("metrics of pattern `{}` at T = {t_len}", p.name());
    if !p.cache_efficient() {
        crate::memory::check(&what, 20.0 * t + 16.0 * slots as f64)?;
        let offsets = p.offsets(t_len);
        let runs = 1 + offsets.windows(2).filter(|w| w[1] != w[0] + 1).count();
        let steps = t * runs as f64;
        if steps > MAX_SEARCH_STEPS {
            return Err(too_slow(p, t_len, steps, &format!("T × {runs} runs of consecutive offsets")));
        }
        return Ok(());
    }
    let offsets = p.offsets(t_len);
    let edges: f64 = offsets.iter().map(|&f| t - f as f64).sum();
    let sources = path_sources(t_len).len() as f64;
    let shifts = congestion_shifts(t_len).len() as f64;
    let threads = rayon::current_num_threads().max(1) as f64;
    let bytes = 24.0 * t + 8.0 * edges * 3.0 + 16.0 * t + threads * 12.0 * t + 4.0 * shifts * t;
    crate::memory::check(&what, bytes)?;
    let steps = (edges + t) * (t + sources);
    if steps > MAX_SEARCH_STEPS {
        return Err(too_slow(p, t_len, steps, &format!("{edges:.2e} edges, a search from every position")));
    }
    Ok(())
}
