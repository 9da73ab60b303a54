//! The structural columns of Table 1 of *Structured generalized linear token mixing* (ICML 2026,
//! arXiv 2605.31367; docs/math.md §1.4), measured from this library for T = 4096 and T = 65536.
//!
//! Columns: time per token (dependencies read per token, and fast-form ns per token), cache
//! (decoder `cache_elems`), shortest path and congestion (`mixer_core::metrics`). Only the
//! paper's asymptotic column is typed in; every other number comes from running the code.
//!
//! ```text
//! cargo run --release --example table1_structure [-- OUT_PREFIX]   # default out/table1
//! ```
//! writes `OUT_PREFIX.md` and `OUT_PREFIX.json`.
//!
//! Caps (stated in the output's notes): the dense recurrence's inputs hold β of size
//! T·(T−1)·C, so its fast form is timed at T ≤ 4096 and its decoder (O(t) per step) run for at
//! most 8192 tokens; full attention's fast form (O(T²)) is timed at T ≤ 16384 and its decoder
//! run for at most 8192 tokens; attention's shortest path / congestion come from the
//! materialized `A` at T = 512; cache-efficient lattices at T > 4096 have sampled shortest
//! paths (labelled by the metrics module) and no congestion bound (it needs a BFS from every
//! source).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use mixers::core::metrics::{self, CommGraph, PathStats};
use mixers::core::mixer::{Mixer, downcast, validate};
use mixers::core::mixers::attention::Attention;
use mixers::core::mixers::glr::Glr;
use mixers::core::{AnyTensors, Form, Tensors};
use mixers::registry::{Backend, family, mixer, run::decoder};
use mixers::timing::time;
use ndarray::{ArrayD, IxDyn};
use serde_json::{Value, json};

/// Channels of the timed fast form (attention: one head with Dk = Dv = CHANNELS).
const CHANNELS: usize = 4;
const DENSE_TIME_CAP: usize = 4096;
const ATTN_TIME_CAP: usize = 16384;
const LINEAR_DECODE_CAP: usize = 8192;
const ATTN_GRAPH_T: usize = 512;

struct RowDef {
    label: &'static str,
    mixer: &'static str,
    config: Value,
    paper: [&'static str; 4], // time/token, cache, shortest path, congestion
}

fn rows() -> Vec<RowDef> {
    let r = |label, mixer, config, paper| RowDef { label, mixer, config, paper };
    vec![
        r("Attention", "attention", json!({}), ["O(n)", "O(n)", "1", "1"]),
        r("Local attention (w = 64)", "local-attention", json!({"window": 64}), ["O(k)", "O(k)", "∞", "1"]),
        r("Diagonal SSM", "diagonal-ssm", json!({}), ["O(1)", "O(1)", "n", "n"]),
        r("k-th order recurrence (k = 8)", "kth-order", json!({"order": 8}), ["O(k)", "O(k)", "n/k", "n/k"]),
        r("Dense recurrence", "dense-recurrence", json!({}), ["O(n)", "O(n)", "1", "1"]),
        r("f(k) = 2^k", "glr", json!({"pattern": "pow2"}), ["O(log₂ n)", "O(n)", "≤ log₂ n", "≤ log₂ n"]),
        r(
            "f(k) = 2^k + cache-eff",
            "glr",
            json!({"pattern": "pow2", "cache_efficient": true}),
            ["O(log₂ n)", "O(log₂ n)", "—", "—"],
        ),
        r("f(k) = k²+1", "glr", json!({"pattern": "sq1"}), ["O(√n)", "O(n)", "≤ 4", "≤ 4"]),
        r(
            "f(k) = k²+1 + cache-eff",
            "glr",
            json!({"pattern": "sq1", "cache_efficient": true}),
            ["O(√n)", "O(√n)", "—", "—"],
        ),
    ]
}

#[derive(Default, serde::Serialize)]
struct Measured {
    row: String,
    t: usize,
    paper: BTreeMap<&'static str, &'static str>,
    deps_per_token_mean: f64,
    deps_per_token_max: usize,
    ns_per_token: f64,
    ns_timed_at_t: usize,
    cache_positions: usize,
    cache_elems: usize,
    cache_measured_at_t: usize,
    shortest_path_max: Option<usize>,
    shortest_path_mean: f64,
    shortest_path_unreachable: usize,
    shortest_path_exact: bool,
    shortest_path_at_t: usize,
    congestion: Option<usize>,
    congestion_is_bound: bool,
    congestion_all_shifts: bool,
    notes: Vec<String>,
}

/// Deterministic, stable f32 inputs for the fast form (β = 0.9/K on every slot: Σ|β| ≤ 0.9).
fn glr_inputs(g: &Glr, t: usize, c: usize) -> Tensors<f32> {
    let k = g.pattern().slots(t);
    let mut m = Tensors::new();
    let wave = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
    m.insert("x".into(), ArrayD::from_shape_fn(IxDyn(&[1, t, c]), |i| wave(i[1] * c + i[2])));
    if g.on().has_a() {
        m.insert("alpha".into(), ArrayD::from_elem(IxDyn(&[1, t, k + 1, c]), 0.5f32));
    } else {
        m.insert("alpha".into(), ArrayD::from_elem(IxDyn(&[1, t, c]), 1.0f32));
    }
    if g.on().has_b() {
        m.insert("beta".into(), ArrayD::from_elem(IxDyn(&[1, t, k, c]), 0.9 / k.max(1) as f32));
    }
    m
}

fn attn_inputs(t: usize, d: usize) -> Tensors<f32> {
    let wave = |i: &[usize]| (((i[1] * 31 + i[3] * 17) % 101) as f32 / 50.0) - 1.0;
    ["q", "k", "v"]
        .into_iter()
        .map(|n| {
            (n.to_string(), ArrayD::from_shape_fn(IxDyn(&[1, t, 1, d]), |i| wave(&[i[0], i[1], i[2], i[3]])))
        })
        .collect()
}

/// Median ns per token of the fast form (validated once, then the kernel timed directly).
fn time_fast(m: &dyn Mixer, inputs: Tensors<f32>, t: usize) -> f64 {
    let any = AnyTensors::F32(inputs);
    validate(m, &any).expect("valid inputs");
    let AnyTensors::F32(inputs) = any else { unreachable!() };
    let imp = family(m.family(), "cpu").expect("cpu implementation").f32;
    let tm =
        time(1, 3, 2.0, || imp.run(m, "cpu", Form::Fast, &inputs).expect("a fast form").expect("fast form"));
    tm.median * 1e9 / t as f64
}

/// Drives the decoder for `steps` tokens (B = C = 1, or one head with Dk = Dv = 1) and returns
/// the largest `cache_elems` seen.
fn decode_cache(m: &dyn Mixer, t: usize, steps: usize) -> usize {
    let mut dims: mixers::core::Dims =
        [("B", 1), ("T", t), ("C", 1), ("H", 1), ("Dk", 1), ("Dv", 1)].into_iter().collect();
    dims = mixers::core::mixer::complete_dims(m, &dims);
    let empty = Tensors::<f32>::new();
    let cpu = Backend::by_name("cpu").expect("the cpu backend is linked");
    let mut dec = decoder::<f32>(m, &cpu, &empty, &dims).expect("decoder");
    let spec = m.spec();
    let mut most = 0;
    for s in 0..steps {
        let tok: Tensors<f32> = spec
            .inputs
            .iter()
            .map(|d| {
                let shape: Vec<usize> = d.shape[..]
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i != 1)
                    .map(|(_, x)| match x {
                        mixers::core::Dim::Sym(n) => dims[n],
                        mixers::core::Dim::Fixed(n) => *n,
                    })
                    .collect();
                let v = if d.name == "beta" {
                    0.5 / dims.get("K").copied().unwrap_or(1).max(1) as f32
                } else {
                    0.3
                };
                (d.name.to_string(), ArrayD::from_elem(IxDyn(&shape), v + (s % 5) as f32 * 0.01))
            })
            .collect();
        dec.step(&tok).expect("decoder step");
        most = most.max(dec.cache_elems());
    }
    most
}

fn set_paths(m: &mut Measured, p: &PathStats, at: usize) {
    m.shortest_path_max = p.max;
    m.shortest_path_mean = p.mean;
    m.shortest_path_unreachable = p.unreachable;
    m.shortest_path_exact = p.exact;
    m.shortest_path_at_t = at;
}

fn measure_glr(def: &RowDef, m: &dyn Mixer, t: usize) -> Measured {
    let g = downcast::<Glr>(m, "example").expect("glr");
    let mut out = Measured { row: def.label.into(), t, ..Default::default() };
    let slots = g.slots(t);
    let reads: usize = (0..t).map(|s| slots.active(s)).sum();
    out.deps_per_token_mean = reads as f64 / t as f64;
    out.deps_per_token_max = slots.len();
    // Fast-form time.
    let tt = if def.mixer == "dense-recurrence" { t.min(DENSE_TIME_CAP) } else { t };
    if tt < t {
        out.notes.push(format!(
            "ns/token timed at T = {tt}: β holds T·(T−1)·C values (T = {t} would need {:.0} GB in f32)",
            (t as f64) * (t as f64 - 1.0) * CHANNELS as f64 * 4.0 / 1e9
        ));
    }
    out.ns_per_token = time_fast(m, glr_inputs(g, tt, CHANNELS), tt);
    out.ns_timed_at_t = tt;
    // Decoder cache.
    let steps = if def.mixer == "dense-recurrence" { t.min(LINEAR_DECODE_CAP) } else { t };
    if steps < t {
        out.notes.push(format!(
            "decoder run for {steps} of {t} tokens (O(t) work per token); its cache grows by one position per token"
        ));
    }
    out.cache_elems = decode_cache(m, t, steps);
    out.cache_positions = out.cache_elems; // B = C = 1, on = b: one scalar per position
    out.cache_measured_at_t = steps;
    // Shortest paths and congestion.
    if !g.pattern().cache_efficient() || t <= metrics::EXACT_PATHS_MAX_T {
        let pm = metrics::pattern_metrics(g.pattern(), t).expect("metrics");
        set_paths(&mut out, &pm.paths, t);
        out.congestion = Some(pm.congestion.value);
        out.congestion_is_bound = pm.congestion.is_bound;
        out.congestion_all_shifts = pm.congestion.exact_over_all_shifts;
        if pm.congestion.is_bound {
            out.notes.push(format!(
                "lattice graph: congestion is an upper bound from BFS routing{}",
                if pm.congestion.exact_over_all_shifts { "" } else { " over sampled shifts" }
            ));
        }
    } else {
        let preds: Vec<Vec<usize>> =
            (0..t).map(|s| (0..slots.active(s)).map(|k| slots.pos(s, k)).collect()).collect();
        let graph = CommGraph::from_preds(preds).expect("causal lattice");
        set_paths(&mut out, &graph.sampled_shortest_paths(), t);
        out.notes.push(format!(
            "lattice graph at T = {t}: shortest paths from {} sampled sources; congestion not computed (needs a BFS from all {t} sources)",
            metrics::SAMPLED_SOURCES + metrics::LAST_SOURCES
        ));
    }
    out
}

fn measure_attention(def: &RowDef, m: &dyn Mixer, t: usize) -> Measured {
    let a = downcast::<Attention>(m, "example").expect("attention");
    let mut out = Measured { row: def.label.into(), t, ..Default::default() };
    let reads: usize = (0..t).map(|s| s + 1 - a.first_key(s)).sum();
    out.deps_per_token_mean = reads as f64 / t as f64;
    out.deps_per_token_max = (0..t).map(|s| s + 1 - a.first_key(s)).max().unwrap_or(0);
    let full = a.window().is_none();
    let tt = if full { t.min(ATTN_TIME_CAP) } else { t };
    if tt < t {
        out.notes.push(format!("ns/token timed at T = {tt} (the streaming form is O(T²) in time)"));
    }
    out.ns_per_token = time_fast(m, attn_inputs(tt, CHANNELS), tt);
    out.ns_timed_at_t = tt;
    let steps = if full { t.min(LINEAR_DECODE_CAP) } else { t };
    if steps < t {
        out.notes.push(format!(
            "decoder run for {steps} of {t} tokens (O(t) work per token); its KV cache grows by one token per token"
        ));
    }
    out.cache_elems = decode_cache(m, t, steps);
    out.cache_positions = out.cache_elems / 2; // Dk + Dv = 2 scalars per cached token
    out.cache_measured_at_t = steps;
    // Paths and congestion of the materialized A (B = 0) at a small length.
    let n = ATTN_GRAPH_T;
    let dims: mixers::core::Dims = [("B", 1), ("T", n), ("H", 1), ("Dk", 2), ("Dv", 1)].into_iter().collect();
    let inp = m.random_inputs(&dims, 0).expect("inputs");
    let mat = m.materialize(&inp).expect("materialize");
    let g = CommGraph::from_dense(mat.blocks[0].terms[0].a.view(), None).expect("graph");
    set_paths(&mut out, &g.shortest_paths(), n);
    let c = g.congestion();
    out.congestion = Some(c.value);
    out.congestion_is_bound = c.is_bound;
    out.congestion_all_shifts = c.exact_over_all_shifts;
    out.notes.push(format!("shortest path / congestion from the materialized A at T = {n}"));
    out
}

fn fmt_path(m: &Measured) -> String {
    let mut s = match m.shortest_path_max {
        Some(v) => format!("{v} (mean {:.2})", m.shortest_path_mean),
        None => format!("∞ ({} pairs unreachable)", m.shortest_path_unreachable),
    };
    if !m.shortest_path_exact {
        s.push_str(", sampled");
    }
    if m.shortest_path_at_t != m.t {
        let _ = write!(s, ", T={}", m.shortest_path_at_t);
    }
    s
}

fn fmt_congestion(m: &Measured) -> String {
    match m.congestion {
        None => "— (not computed)".into(),
        Some(v) => {
            let mut s = format!("{}{v}", if m.congestion_is_bound { "≤ " } else { "" });
            if m.congestion_is_bound && !m.congestion_all_shifts {
                s.push_str(", sampled shifts");
            }
            if m.shortest_path_at_t != m.t {
                let _ = write!(s, ", T={}", m.shortest_path_at_t);
            }
            s
        }
    }
}

fn main() {
    let prefix = std::env::args().nth(1).unwrap_or_else(|| "out/table1".to_string());
    let ts: Vec<usize> = match std::env::var("TABLE1_T") {
        Ok(v) => v.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) => vec![4096, 65536],
    };
    let mut all = Vec::new();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Table 1, structural columns, measured\n\n\
         Paper columns (asymptotic, typed in) beside values measured from this library. deps/token: \
         mean (max) number of dependencies read per token; ns/token: median fast-form time per token on \
         CPU, f32, B = 1, C = {CHANNELS} channels (attention: one head, Dk = Dv = {CHANNELS}); cache: the \
         decoder's largest `cache_elems` with B = C = 1 (attention: positions × (Dk + Dv), Dk = Dv = 1), \
         in positions; shortest path: max (mean) hops over pairs s < t (over shifts for translation-invariant \
         patterns); congestion: worst copy-routing congestion over shifts (≤: an upper bound from an explicit \
         routing).\n"
    );
    for &t in &ts {
        let _ = writeln!(
            md,
            "## T = {t}\n\n| Structure | Time/token (paper) | deps/token | ns/token | Cache (paper) | cache (positions) | Shortest path (paper) | shortest path | Congestion (paper) | congestion |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        let mut notes = Vec::new();
        for def in rows() {
            let t0 = std::time::Instant::now();
            let m = mixer(def.mixer, &def.config).expect("mixer");
            let mut r = if def.mixer.contains("attention") {
                measure_attention(&def, m.as_ref(), t)
            } else {
                measure_glr(&def, m.as_ref(), t)
            };
            for (k, v) in
                ["time_per_token", "cache", "shortest_path", "congestion"].into_iter().zip(def.paper)
            {
                r.paper.insert(k, v);
            }
            let ns = if r.ns_timed_at_t == t {
                format!("{:.1}", r.ns_per_token)
            } else {
                format!("{:.1} (T={})", r.ns_per_token, r.ns_timed_at_t)
            };
            let cache = if r.cache_measured_at_t == t {
                r.cache_positions.to_string()
            } else {
                format!("{} (after {} tokens)", r.cache_positions, r.cache_measured_at_t)
            };
            let _ = writeln!(
                md,
                "| {} | {} | {:.2} ({}) | {} | {} | {} | {} | {} | {} | {} |",
                def.label,
                def.paper[0],
                r.deps_per_token_mean,
                r.deps_per_token_max,
                ns,
                def.paper[1],
                cache,
                def.paper[2],
                fmt_path(&r),
                def.paper[3],
                fmt_congestion(&r)
            );
            for n in &r.notes {
                notes.push(format!("{}: {n}", def.label));
            }
            eprintln!("T = {t}: {} measured in {:.1} s", def.label, t0.elapsed().as_secs_f64());
            all.push(r);
        }
        let _ = writeln!(md, "\nNotes (T = {t}):\n");
        for n in notes {
            let _ = writeln!(md, "- {n}");
        }
        md.push('\n');
    }
    print!("{md}");
    let path = std::path::Path::new(&prefix);
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).expect("create output dir");
    }
    std::fs::write(format!("{prefix}.md"), &md).expect("write md");
    let json = serde_json::to_string_pretty(&json!({ "channels": CHANNELS, "rows": all })).expect("json");
    std::fs::write(format!("{prefix}.json"), json).expect("write json");
    eprintln!("wrote {prefix}.md and {prefix}.json");
}
