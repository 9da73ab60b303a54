//! GLR scaling benchmark (docs/math.md §1.2, §1.3): per-token cost of the fast form against T, the
//! fast/materialized and fast/recurrent ratios at T = 2048, and attention's streaming (flash)
//! form against its parallel form.
//!
//! `cargo bench --bench glr_scaling` (release); `MIXERS_BENCH_QUICK=1` shrinks it to seconds.
//!
//! Timings call the CPU kernel entry directly after one validated `run::run` (validation is a
//! pass over every input, as large as the sparse recurrence itself, so it would blur the
//! per-token cost); inputs are f32, batch 1.

use std::fmt::Write as _;

use mixers::core::mixer::{Mixer, downcast};
use mixers::core::mixers::glr::Glr;
use mixers::core::{AnyTensors, Form, Tensors};
use mixers::registry::run::run;
use mixers::registry::{kernel, mixer};
use mixers::timing::{fit_exponent, time};
use ndarray::{ArrayD, IxDyn};
use serde_json::json;

/// Deterministic stable inputs: β = 0.9/K on every slot, so Σ|β| ≤ 0.9.
fn glr_inputs(g: &Glr, t: usize, c: usize) -> Tensors<f32> {
    let k = g.pattern().slots(t);
    let wave = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
    let mut m = Tensors::new();
    m.insert("x".into(), ArrayD::from_shape_fn(IxDyn(&[1, t, c]), |i| wave(i[1] * c + i[2])));
    m.insert("alpha".into(), ArrayD::from_elem(IxDyn(&[1, t, c]), 1.0f32));
    m.insert("beta".into(), ArrayD::from_elem(IxDyn(&[1, t, k, c]), 0.9 / k.max(1) as f32));
    m
}

fn attn_inputs(t: usize, h: usize, d: usize) -> Tensors<f32> {
    let wave = |i: &[usize]| (((i[1] * 31 + i[2] * 7 + i[3] * 17) % 101) as f32 / 50.0) - 1.0;
    ["q", "k", "v"]
        .into_iter()
        .map(|n| {
            (n.to_string(), ArrayD::from_shape_fn(IxDyn(&[1, t, h, d]), |i| wave(&[i[0], i[1], i[2], i[3]])))
        })
        .collect()
}

/// Median seconds of one form (validated once through `run::run`, then the kernel entry or,
/// for the generic forms, `run::run` itself).
fn seconds(m: &dyn Mixer, form: Form, inputs: &Tensors<f32>, reps: usize, budget: f64) -> f64 {
    let any = AnyTensors::F32(inputs.clone());
    match form {
        Form::Fast | Form::Parallel => {
            run(m, "cpu", form, &any).expect("validated run");
            let k = kernel(m.kernel(), "cpu").expect("cpu kernel");
            time(0, reps, budget, || (k.run_f32)(m, form, inputs).expect("run")).median
        }
        _ => time(0, reps, budget, || run(m, "cpu", form, &any).expect("run")).median,
    }
}

fn main() {
    let quick = std::env::var("MIXERS_BENCH_QUICK").is_ok_and(|v| v == "1");
    let (reps, budget) = if quick { (2, 0.5) } else { (5, 3.0) };
    let channels = 64;
    let ts: Vec<usize> =
        if quick { vec![1000, 2000, 4000] } else { vec![1000, 2000, 4000, 8000, 16000, 32000, 64000] };
    // sq1 holds β of T·K(T)·C values (K ≈ √T): cap its length so the inputs stay ≤ ~0.5 GB.
    let sq1_cap = 16384;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# glr_scaling\n\nFast form (sparse recurrence), f32, B = 1, C = {channels}, {} threads. \
         ns/token = median time / T.\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let _ = writeln!(out, "| pattern | T | K(T) | deps/token | ms | ns/token | ns/token ÷ deps/token |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    let cases = [
        ("pow2", "glr", json!({"pattern": "pow2"})),
        ("pow2 + cache-eff", "glr", json!({"pattern": "pow2", "cache_efficient": true})),
        ("sq1", "glr", json!({"pattern": "sq1"})),
        ("sq1 + cache-eff", "glr", json!({"pattern": "sq1", "cache_efficient": true})),
        ("k-th order (k = 8)", "kth-order", json!({"order": 8})),
    ];
    let mut fits = Vec::new();
    for (label, name, cfg) in &cases {
        let m = mixer(name, cfg).expect("mixer");
        let g = downcast::<Glr>(m.as_ref(), "bench").expect("glr");
        let (mut xs, mut ys, mut deps) = (Vec::new(), Vec::new(), Vec::new());
        for &t in &ts {
            if label.starts_with("sq1") && t > sq1_cap {
                continue;
            }
            let inputs = glr_inputs(g, t, channels);
            let s = seconds(m.as_ref(), Form::Fast, &inputs, reps, budget);
            let slots = g.slots(t);
            let d = (0..t).map(|u| slots.active(u)).sum::<usize>() as f64 / t as f64;
            let ns = s * 1e9 / t as f64;
            let _ = writeln!(
                out,
                "| {label} | {t} | {} | {d:.2} | {:.2} | {ns:.1} | {:.2} |",
                slots.len(),
                s * 1e3,
                ns / d.max(1e-9)
            );
            xs.push(t as f64);
            ys.push(ns);
            deps.push(d);
        }
        fits.push((label.to_string(), xs, ys, deps));
    }
    let _ = writeln!(
        out,
        "\nPer-token growth: fitted exponent b of ns/token ∝ T^b (± standard error), per-token cost \
         at the largest T over the smallest, and the same ratio for log₂T and √T.\n"
    );
    let _ = writeln!(
        out,
        "| pattern | T range | b (ns/token) | b (deps/token) | growth ns/token | log₂T ratio | √T ratio |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for (label, xs, ys, deps) in &fits {
        let (b, se) = fit_exponent(xs, ys).unwrap_or((f64::NAN, f64::NAN));
        let (bd, _) = fit_exponent(xs, deps).unwrap_or((f64::NAN, f64::NAN));
        let (x0, x1) = (xs[0], xs[xs.len() - 1]);
        let _ = writeln!(
            out,
            "| {label} | {x0}–{x1} | {b:.3} ± {se:.3} | {bd:.3} | {:.2}× | {:.2}× | {:.2}× |",
            ys[ys.len() - 1] / ys[0],
            x1.log2() / x0.log2(),
            (x1 / x0).sqrt()
        );
    }
    if !quick {
        let _ = writeln!(
            out,
            "\nsq1 rows stop at T = {sq1_cap}: β has T·K(T)·C entries (4.3 GB in f32 at T = 65536, C = 64)."
        );
    }

    // Fast against materialized (the f64 oracle) and recurrent at T = 2048.
    let t = if quick { 512 } else { 2048 };
    let c = 4;
    let _ = writeln!(
        out,
        "\n## Forms at T = {t} (B = 1, C = {c}; the oracle materializes 2·C dense T×T matrices)\n\n\
         The GLR has no `parallel` form; `recurrent` (the decoder) stands in for it.\n\n\
         | mixer | materialized ms | recurrent ms | fast ms | materialized/fast | recurrent/fast |\n|---|---|---|---|---|---|"
    );
    for (label, name, cfg) in &cases {
        let m = mixer(name, cfg).expect("mixer");
        let g = downcast::<Glr>(m.as_ref(), "bench").expect("glr");
        let inputs = glr_inputs(g, t, c);
        let fast = seconds(m.as_ref(), Form::Fast, &inputs, reps, budget);
        let rec = seconds(m.as_ref(), Form::Recurrent, &inputs, reps.min(3), budget);
        let mat = seconds(m.as_ref(), Form::Materialized, &inputs, 1, budget);
        let _ = writeln!(
            out,
            "| {label} | {:.1} | {:.2} | {:.3} | {:.0}× | {:.1}× |",
            mat * 1e3,
            rec * 1e3,
            fast * 1e3,
            mat / fast,
            rec / fast
        );
    }

    // Attention: streaming (flash) against parallel.
    let (h, d) = (4, 32);
    let ats: Vec<usize> = if quick { vec![256, 512] } else { vec![512, 1024, 2048, 4096] };
    let _ = writeln!(
        out,
        "\n## Attention: streaming (fast) vs parallel (f32, B = 1, H = {h}, Dk = Dv = {d})\n\n\
         | mixer | T | parallel ms | fast ms | parallel/fast |\n|---|---|---|---|---|"
    );
    for (name, cfg) in [("attention", json!({})), ("local-attention", json!({"window": 64}))] {
        let m = mixer(name, &cfg).expect("mixer");
        let (mut xs, mut ps, mut fs) = (Vec::new(), Vec::new(), Vec::new());
        for &t in &ats {
            let inputs = attn_inputs(t, h, d);
            let p = seconds(m.as_ref(), Form::Parallel, &inputs, reps, budget);
            let f = seconds(m.as_ref(), Form::Fast, &inputs, reps, budget);
            let _ = writeln!(out, "| {name} | {t} | {:.2} | {:.2} | {:.2}× |", p * 1e3, f * 1e3, p / f);
            xs.push(t as f64);
            ps.push(p);
            fs.push(f);
        }
        let (bp, _) = fit_exponent(&xs, &ps).unwrap_or((f64::NAN, 0.0));
        let (bf, _) = fit_exponent(&xs, &fs).unwrap_or((f64::NAN, 0.0));
        let _ = writeln!(out, "| {name} | exponent of time vs T | {bp:.2} | {bf:.2} | |");
    }
    print!("{out}");
}
