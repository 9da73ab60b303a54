//! `mixers metrics`: structural metrics of an offset pattern (docs/math.md §1.4).

use mixer_core::metrics::{PatternMetrics, pattern_metrics};
use mixer_core::pattern::Pattern;
use mixer_core::{Error, Result};

/// Arguments of `mixers metrics`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Registered pattern name (`mixers list` shows them).
    #[arg(long)]
    pattern: String,
    /// Sequence length T (≥ 1). Bounded: a T whose exact search would take more than
    /// about 2·10⁹ steps or more memory than available is refused with the estimate.
    #[arg(long)]
    n: usize,
    /// Use the cache-efficient lattice instead of translation-invariant offsets.
    #[arg(long)]
    cache_efficient: bool,
    /// Truncate to the first `order` offsets.
    #[arg(long)]
    order: Option<usize>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Metrics of a registered pattern.
pub fn compute(
    pattern: &str,
    n: usize,
    cache_efficient: bool,
    order: Option<usize>,
) -> Result<PatternMetrics> {
    let e = mixer_registry::pattern(pattern)?;
    let p = Pattern::new(e.name, e.offset, order, cache_efficient)?;
    mixer_core::metrics::check_cost(&p, n)?;
    p.check_lattice_invariant(n.min(100_000))?;
    pattern_metrics(&p, n)
}

/// The metrics as text.
pub fn render(name: &str, cache_efficient: bool, m: &PatternMetrics) -> String {
    let mut s = format!(
        "pattern {name}{} at T = {}: {} slots\n",
        if cache_efficient { " (cache-efficient lattice)" } else { "" },
        m.t_len,
        m.slots
    );
    let p = &m.paths;
    let max = p.max.map(|x| x.to_string()).unwrap_or_else(|| "∞ (some pairs unreachable)".into());
    s += &format!(
        "shortest path: max {max}, mean {:.3}{}\n",
        p.mean,
        if p.exact { "" } else { " (sampled sources)" }
    );
    let hist: Vec<String> =
        p.histogram.iter().enumerate().filter(|(_, c)| **c > 0).map(|(h, c)| format!("{h}:{c}")).collect();
    s += &format!("  distribution (hops:count): {}", hist.join(" "));
    if p.unreachable > 0 {
        s += &format!(" unreachable:{}", p.unreachable);
    }
    s += "\n";
    let c = &m.congestion;
    s += &format!(
        "congestion (worst over shifts): {}{} at shift {}{}\n",
        if c.is_bound { "≤ " } else { "" },
        c.value,
        c.worst_shift,
        if c.is_bound { " (upper bound from an explicit routing)" } else { "" }
    );
    if !c.exact_over_all_shifts {
        s += "  (shifts sampled)\n";
    }
    s +=
        &format!("per-token cost: mean {:.3}, max {} dependencies\n", m.per_token_cost, m.max_per_token_cost);
    s += &format!("cache: {} positions\n", m.cache_positions);
    s
}

pub(crate) fn run(a: Args) -> Result<i32> {
    if a.n == 0 {
        return Err(Error::Io("--n must be at least 1".into()));
    }
    let m = compute(&a.pattern, a.n, a.cache_efficient, a.order)?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "pattern": a.pattern, "n": a.n, "cache_efficient": a.cache_efficient, "order": a.order,
                "slots": m.slots, "max_shortest_path": m.paths.max, "mean_shortest_path": m.paths.mean,
                "histogram": m.paths.histogram, "unreachable": m.paths.unreachable, "paths_exact": m.paths.exact,
                "congestion": m.congestion.value, "congestion_is_bound": m.congestion.is_bound,
                "per_token_cost": m.per_token_cost, "max_per_token_cost": m.max_per_token_cost,
                "cache_positions": m.cache_positions,
            })
        );
    } else {
        print!("{}", render(&a.pattern, a.cache_efficient, &m));
    }
    Ok(0)
}
