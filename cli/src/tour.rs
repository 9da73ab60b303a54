//! `mixers tour`: the README's main job. Lists what is registered, checks every mixer on the
//! automatically chosen backend at small sizes, and prints the structural table.

use std::collections::BTreeMap;

use indicatif::ProgressBar;
use mixer_core::Result;
use mixer_registry::harness::{CheckRow, Sizes};
use mixer_registry::{Backend, LAMBDAS, MASKS, MIXERS, PATTERNS, backends_status};

use super::check::{cases, check_cases};
use super::table::{markdown, sci};

/// Arguments of `mixers tour`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Sequence length of the checks.
    #[arg(long, default_value_t = 37)]
    seq: usize,
    /// Sequence length of the structural table.
    #[arg(long, default_value_t = 1024)]
    n: usize,
}

fn names(mut v: Vec<&str>) -> String {
    v.sort();
    v.join(", ")
}

/// Per (mixer, config): forms checked, worst errors per dtype, failures.
fn summarize(rows: &[CheckRow]) -> Vec<Vec<String>> {
    let mut by: BTreeMap<(String, String), Vec<&CheckRow>> = BTreeMap::new();
    for r in rows {
        by.entry((r.mixer.clone(), r.config.clone())).or_default().push(r);
    }
    by.into_iter()
        .map(|((m, c), rs)| {
            let mut forms: Vec<&str> = rs.iter().map(|r| r.form.name()).collect();
            forms.sort();
            forms.dedup();
            let worst =
                |d: &str| rs.iter().filter(|r| r.dtype.name() == d).map(|r| r.rel_rms).fold(0.0f64, f64::max);
            let failed: Vec<String> = rs
                .iter()
                .filter(|r| !r.pass)
                .map(|r| match &r.error {
                    Some(e) => format!("{} {}: {e}", r.form, r.dtype.name()),
                    None => format!("{} {}", r.form, r.dtype.name()),
                })
                .collect();
            vec![
                m,
                c,
                forms.join(", "),
                sci(worst("f64")),
                sci(worst("f32")),
                if failed.is_empty() { "ok".into() } else { format!("FAIL: {}", failed.join("; ")) },
            ]
        })
        .collect()
}

fn structure_table(n: usize) -> Vec<Vec<String>> {
    let mut pats: Vec<_> = PATTERNS.iter().collect();
    pats.sort_by_key(|e| e.name);
    let pb = ProgressBar::new(2 * pats.len() as u64);
    let mut rows = Vec::new();
    for e in pats {
        for ce in [false, true] {
            pb.inc(1);
            let row = match super::metrics::compute(e.name, n, ce, None) {
                Ok(m) => vec![
                    e.name.to_string(),
                    if ce { "cache-efficient" } else { "translation-inv." }.into(),
                    m.slots.to_string(),
                    m.paths.max.map(|x| x.to_string()).unwrap_or("∞".into()),
                    format!("{:.2}", m.paths.mean),
                    format!("{}{}", if m.congestion.is_bound { "≤ " } else { "" }, m.congestion.value),
                    format!("{:.1}", m.per_token_cost),
                    m.cache_positions.to_string(),
                ],
                Err(err) => vec![
                    e.name.to_string(),
                    if ce { "cache-efficient" } else { "translation-inv." }.into(),
                    format!("error: {err}"),
                ],
            };
            rows.push(row);
        }
    }
    pb.finish_and_clear();
    rows
}

/// Why a (mixer, config) is checked in fewer forms than its family offers, if there is a
/// reason the tour can name.
fn fewer_forms_note(name: &str, cfg: &serde_json::Value) -> Option<String> {
    let m = mixer_registry::mixer(name, cfg).ok()?;
    let ll = m.as_any().downcast_ref::<mixer_core::mixers::loglinear::LogLinear>()?;
    let mask = ll.lift?.mask.name;
    (!ll.has_fenwick_structure()).then(|| {
        format!(
            "`{}` {} (registered as `{name}`) is checked in `parallel` only: its level mask `{mask}` is not \
             Fenwick, and the chunked (`fast`) and `recurrent` forms exist only for Fenwick levels \
             (docs/math.md §2.3, §2.5–2.6).",
            m.name(),
            m.config()
        )
    })
}

pub(crate) fn run(a: Args) -> Result<i32> {
    let sizes = Sizes { seq: a.seq, ..Sizes::default() };
    super::check::check_sizes(&sizes)?;
    if a.n == 0 {
        return Err(mixer_core::Error::Io(
            "--n must be ≥ 1, given 0: the structural table needs a sequence length".into(),
        ));
    }
    println!("# mixers tour\n");
    println!(
        "Every causal linear token mixer is Y = (I − B)⁻¹ A X. Each mixer below materializes its (A, B);"
    );
    println!("a dense f64 solve of that is the oracle every fast form and backend is checked against.");
    println!("The math, every input and every config field: docs/math.md.\n");
    println!("## Registered (link time)\n");
    println!("- patterns: {}", names(PATTERNS.iter().map(|e| e.name).collect()));
    println!("- level masks: {}", names(MASKS.iter().map(|e| e.name).collect()));
    println!("- λ schemes: {}", names(LAMBDAS.iter().map(|e| e.name).collect()));
    println!("- mixers: {}", names(MIXERS.iter().map(|e| e.name).collect()));
    for (b, av) in backends_status() {
        match av {
            mixer_registry::Availability::Available(d) => println!("- backend {b}: available ({d})"),
            mixer_registry::Availability::Unavailable(r) => println!("- backend {b}: not available ({r})"),
        }
    }
    let plugins = mixer_registry::plugin_crates();
    println!(
        "- plugin crates linked: {}",
        if plugins.is_empty() { "none".into() } else { plugins.join(", ") }
    );
    let dups = mixer_registry::duplicates();
    for d in &dups {
        println!("- **DUPLICATE**: {d}");
    }
    super::warn_duplicates();
    let backend = Backend::auto()?;
    println!(
        "\n## Check on backend `{}` (T = {}, every form, f64 and f32, against the oracle)\n",
        backend.name(),
        a.seq
    );
    println!(
        "One row per mixer and example config; `forms` are those this backend has (the oracle itself is \
         `materialized`); the error columns are the worst relative RMS error over the forms; a row \
         passes at ≤ 1e-9 (f64) and ≤ 1e-4 (f32).\n"
    );
    let sizes = Sizes { seq: a.seq, ..Sizes::default() };
    let all = cases(None, None)?;
    let rows = check_cases(&all, &[backend], &sizes, false, 0, mixer_core::Precision::Exact);
    print!(
        "{}",
        markdown(
            &["mixer", "config", "forms", "worst rel RMS f64", "worst rel RMS f32", "result"],
            &summarize(&rows)
        )
    );
    let notes: Vec<String> = all.iter().filter_map(|(n, c)| fewer_forms_note(n, c)).collect();
    if !notes.is_empty() {
        println!();
        for n in notes {
            println!("Note: {n}");
        }
    }
    let failed: Vec<&CheckRow> = rows.iter().filter(|r| !r.pass).collect();
    println!("\n## Structure of every registered pattern at T = {} (docs/math.md §1.4)\n", a.n);
    print!(
        "{}",
        markdown(
            &[
                "pattern",
                "layout",
                "slots K",
                "max shortest path",
                "mean path",
                "congestion",
                "deps/token",
                "cache"
            ],
            &structure_table(a.n)
        )
    );
    println!();
    println!(
        "- layout: slot k of token t reads t − f(k) (translation-invariant) or a lattice position (cache-efficient)."
    );
    println!("- slots K: K(T) = #{{k : f(k) ≤ T − 1}}, the most earlier positions one token reads.");
    println!("- max / mean shortest path: fewest hops from token s to a later token t, over all pairs.");
    println!(
        "- congestion: every token s sends to s + Δ at once; the most messages through one token, worst Δ; \
         `≤ n` is an upper bound from one explicit routing (lattices are not translation-invariant)."
    );
    println!(
        "- deps/token: mean number of earlier positions a token reads; cache: positions a decoder keeps."
    );
    println!("\n## Verdict\n");
    if failed.is_empty() && dups.is_empty() {
        println!(
            "PASS: {} checks on backend `{}`, every form of every registered mixer within tolerance of the oracle.",
            rows.len(),
            backend.name()
        );
    } else {
        println!("FAIL: {} of {} checks failed on backend `{}`.", failed.len(), rows.len(), backend.name());
        for r in &failed {
            println!(
                "- {} {} {} {}: {}",
                r.mixer,
                r.config,
                r.form,
                r.dtype.name(),
                r.error.clone().unwrap_or_else(|| format!("rel RMS {}", sci(r.rel_rms)))
            );
        }
        for d in &dups {
            println!("- {d}");
        }
    }
    println!("\nNext:");
    println!("  mixers list                                      # every input and form of every mixer");
    println!(
        "  mixers check --mixer glr --config '{{\"pattern\": \"sq1\"}}' --seq 100   # one mixer against the oracle"
    );
    println!(
        "  mixers metrics --pattern pow2 --n 4096           # paths, congestion, cost, cache of a pattern"
    );
    println!(
        "  mixers run --mixer mamba2 --inputs in.npz --out y.npz   # your own inputs (names: docs/math.md)"
    );
    println!("  mixers bench --mixer mamba2 --seq 1k..16k --decode      # scaling, tables and plots");
    Ok(if failed.is_empty() && dups.is_empty() { 0 } else { 1 })
}
