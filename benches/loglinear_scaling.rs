//! Scaling of the log-linear family on the CPU (docs/math.md §2.6, §2.5): the chunked `fast`
//! form against the quadratic `parallel` form across T (H = 4, Dk = Dv = 64, batch 1,
//! chunk 64, f64), with the crossover length and fitted exponents, then the decoder's
//! latency per token and cache at T = 1k, 16k and 64k.
//!
//! `MIXERS_BENCH_QUICK=1` shrinks it to seconds. Parallel runs are skipped where they would
//! take too long (the lifted gated DeltaNet's parallel form is cubic).

use std::time::Instant;

use mixers::core::mixer::{Mixer, complete_dims};
use mixers::core::tensor::{prefix, token_slice};
use mixers::prelude::*;
use mixers::registry::run::{decoder, run};
use mixers::timing::{fit_exponent, time};
use serde_json::json;

fn dims(m: &dyn Mixer, t: usize) -> mixers::core::Dims {
    let s = Sizes { batch: 1, seq: t, channels: 1, heads: 4, dk: 64, dv: 64 };
    complete_dims(m, &s.dims())
}

fn run_ms(m: &dyn Mixer, form: Form, x: &AnyTensors, budget: f64) -> f64 {
    time(0, 3, budget, || run(m, "cpu", form, x).expect("run")).median * 1e3
}

/// First length where `fast` beats `parallel`, interpolated in log-log between measured points.
fn crossover(ts: &[usize], fast: &[f64], par: &[Option<f64>]) -> String {
    let pts: Vec<(f64, f64)> = ts
        .iter()
        .zip(fast)
        .zip(par)
        .filter_map(|((&t, &f), p)| p.map(|p| (t as f64, (p / f).ln())))
        .collect();
    if let Some(&(t0, r0)) = pts.first()
        && r0 >= 0.0
    {
        return format!("≤ {t0} (fast already faster at the smallest T)");
    }
    for w in pts.windows(2) {
        let ((t0, r0), (t1, r1)) = (w[0], w[1]);
        if r0 < 0.0 && r1 >= 0.0 {
            let a = r0 / (r0 - r1);
            return format!("≈ {:.0}", (t0.ln() + a * (t1.ln() - t0.ln())).exp());
        }
    }
    match pts.last() {
        Some(&(t, _)) => format!("> {t} (not reached where parallel was measured)"),
        None => "n/a".into(),
    }
}

fn fmt_fit(xs: &[f64], ys: &[f64]) -> String {
    match fit_exponent(xs, ys) {
        Some((b, se)) => format!("{b:.2} ± {se:.2}"),
        None => "n/a".into(),
    }
}

fn main() {
    let quick = std::env::var("MIXERS_BENCH_QUICK").is_ok_and(|v| v != "0");
    let ts: Vec<usize> = if quick {
        vec![256, 512, 1024]
    } else {
        vec![32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
    };
    let t_max = *ts.last().unwrap_or(&256);
    let budget = if quick { 0.3 } else { 2.0 };
    println!("# log-linear family on CPU ({} cores), f64, B = 1, H = 4, Dk = Dv = 64, chunk 64\n", cores());
    // (mixer, largest T for the parallel form)
    let cases: [(&str, usize); 4] = if quick {
        [
            ("loglinear-mamba2", 1024),
            ("loglinear-gated-deltanet", 512),
            ("mamba2", 1024),
            ("gated-deltanet", 1024),
        ]
    } else {
        [
            ("loglinear-mamba2", 16384),
            ("loglinear-gated-deltanet", 2048),
            ("mamba2", 16384),
            ("gated-deltanet", 4096),
        ]
    };
    for (name, par_cap) in cases {
        let m = mixers::registry::mixer(name, &json!({ "chunk": 64 })).expect("mixer");
        let full = m.random_inputs(&dims(m.as_ref(), t_max), 1).expect("inputs");
        let per_token = m.spec().per_token();
        println!("## {name}\n");
        println!("| T | fast (ms) | parallel (ms) | parallel / fast | fast µs/token |");
        println!("|---:|---:|---:|---:|---:|");
        let (mut fast, mut par) = (Vec::new(), Vec::new());
        for &t in &ts {
            let x = AnyTensors::F64(prefix(&full, &per_token, t));
            let f = run_ms(m.as_ref(), Form::Fast, &x, budget);
            let p = (t <= par_cap).then(|| run_ms(m.as_ref(), Form::Parallel, &x, budget));
            println!(
                "| {t} | {f:.2} | {} | {} | {:.2} |",
                p.map_or("—".into(), |p| format!("{p:.2}")),
                p.map_or("—".into(), |p| format!("{:.2}", p / f)),
                f * 1e3 / t as f64
            );
            fast.push(f);
            par.push(p);
        }
        let xs: Vec<f64> = ts.iter().map(|&t| t as f64).collect();
        let big: Vec<usize> = (0..ts.len()).filter(|&i| ts[i] >= 1024.min(t_max)).collect();
        let fx: Vec<f64> = big.iter().map(|&i| xs[i]).collect();
        let fy: Vec<f64> = big.iter().map(|&i| fast[i]).collect();
        let (px, py): (Vec<f64>, Vec<f64>) =
            xs.iter().zip(&par).filter_map(|(&x, p)| p.map(|p| (x, p))).filter(|(x, _)| *x >= 1024.0).unzip();
        println!(
            "\nfitted exponent (T ≥ 1024): fast {}, parallel {}; crossover (fast faster from) T {}\n",
            fmt_fit(&fx, &fy),
            fmt_fit(&px, &py),
            crossover(&ts, &fast, &par)
        );
    }

    // Decoder latency per token at given positions: every step of the window before each
    // mark is timed on its own; the median resists load bursts on a shared machine.
    let marks: Vec<usize> = if quick { vec![256, 1024] } else { vec![1024, 16384, 65536] };
    let window = if quick { 128 } else { 512 };
    let t_dec = *marks.last().unwrap_or(&1024);
    println!("## decode (recurrent form), per token\n");
    println!(
        "| mixer | T | median µs/token ({window} tokens before T) | mean | cache elems | cache / (H·Dk·Dv) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for name in ["loglinear-mamba2", "loglinear-gated-deltanet", "mamba2"] {
        let m = mixers::registry::mixer(name, &json!({})).expect("mixer");
        let d = dims(m.as_ref(), t_dec);
        let x = m.random_inputs(&d, 2).expect("inputs");
        let per_token = m.spec().per_token();
        let mut dec = decoder::<f64>(m.as_ref(), "cpu", &x, &d).expect("decoder");
        let mut steps: Vec<f64> = Vec::new();
        for t in 0..t_dec {
            let tok = token_slice(&x, &per_token, t);
            let timed = marks.iter().any(|&mk| t < mk && t + window >= mk);
            let t0 = Instant::now();
            std::hint::black_box(dec.step(&tok).expect("step"));
            if timed {
                steps.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            if marks.contains(&(t + 1)) {
                let mean = steps.iter().sum::<f64>() / steps.len().max(1) as f64;
                steps.sort_by(f64::total_cmp);
                let median = steps.get(steps.len() / 2).copied().unwrap_or(f64::NAN);
                let c = dec.cache_elems();
                println!(
                    "| {name} | {} | {median:.1} | {mean:.1} | {c} | {:.0} |",
                    t + 1,
                    c as f64 / (4.0 * 64.0 * 64.0)
                );
                steps.clear();
            }
        }
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
