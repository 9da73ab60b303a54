//! Toeplitz mixer scaling on CPU (docs/math.md §3).
//!
//! 1. Prefill: `fast` (real FFT, `O(T log T)`) against `parallel` (direct, `O(T²)`) across T;
//!    direct stops once one run exceeds its budget (nothing is extrapolated). Reports the
//!    crossover and fitted exponents.
//! 2. Generation of T tokens with the naive decoder (`O(t)` per token, `O(T²)` in total)
//!    and the online FFT decoder (`O(log² t)` amortised, `O(T log² T)` in total); reports the
//!    total-time exponents.
//!
//! Times are the minimum over repeated runs (reported as such): on a shared, oversubscribed
//! machine the median picks up whole scheduler time slices (several ms), the minimum much less.
//!
//! `MIXERS_BENCH_QUICK=1` shrinks everything to seconds.

use mixers::core::mixer::Mixer;
use mixers::core::{AnyTensors, Form};
use mixers::registry::run::run;
use mixers::timing::{fit_exponent, time};
use serde_json::json;

const B: usize = 1;
const C: usize = 8;
const H: usize = 2;

fn inputs(m: &dyn Mixer, t: usize) -> AnyTensors {
    let dims = [("B", B), ("T", t), ("C", C)].into_iter().collect();
    AnyTensors::F64(m.random_inputs(&dims, 7).expect("random inputs"))
}

fn fmt_s(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

fn fit(xs: &[f64], ys: &[f64]) -> String {
    match fit_exponent(xs, ys) {
        Some((b, se)) => {
            format!("{b:.2} ± {se:.2} (T = {:.0} … {:.0}, {} points)", xs[0], xs[xs.len() - 1], xs.len())
        }
        None => "n/a (fewer than 2 points)".into(),
    }
}

fn main() {
    let quick = std::env::var("MIXERS_BENCH_QUICK").is_ok_and(|v| v == "1");
    let threads = rayon_threads();
    println!(
        "# Toeplitz scaling (CPU, f64, B = {B}, C = {C}, H = {H}, {threads}{}; min over runs)\n",
        if quick { ", quick" } else { "" }
    );

    // ---- 1. prefill: fast vs direct ----
    let m = mixers::registry::mixer("toeplitz", &json!({"heads": H})).expect("toeplitz registered");
    let ts: Vec<usize> =
        if quick { (4..=12).map(|k| 1 << k).collect() } else { (4..=17).map(|k| 1 << k).collect() };
    let direct_budget = if quick { 0.2 } else { 2.0 };
    println!("## Prefill: fast (FFT) vs parallel (direct)\n");
    println!("| T | fast | direct | direct / fast |");
    println!("|---:|---:|---:|---:|");
    let (mut fx, mut fy, mut dx, mut dy) = (vec![], vec![], vec![], vec![]);
    let mut direct_on = true;
    let mut crossover: Option<usize> = None;
    let mut direct_stop: Option<usize> = None;
    for &t in &ts {
        let inp = inputs(m.as_ref(), t);
        let f = time(1, 9, if quick { 0.2 } else { 1.0 }, || {
            run(m.as_ref(), "cpu", Form::Fast, &inp).expect("fast")
        });
        fx.push(t as f64);
        fy.push(f.min);
        let d = if direct_on {
            let d = time(usize::from(t <= 4096), 9, if quick { 0.2 } else { 1.0 }, || {
                run(m.as_ref(), "cpu", Form::Parallel, &inp).expect("direct")
            });
            dx.push(t as f64);
            dy.push(d.min);
            if d.min > direct_budget {
                direct_on = false;
                direct_stop = Some(t);
            }
            if crossover.is_none() && f.min < d.min {
                crossover = Some(t);
            }
            Some(d)
        } else {
            None
        };
        match d {
            Some(d) => {
                println!("| {t} | {} | {} | {:.2} |", fmt_s(f.min), fmt_s(d.min), d.min / f.min)
            }
            None => println!("| {t} | {} | (stopped) | |", fmt_s(f.min)),
        }
    }
    println!();
    match crossover {
        Some(t) if t == ts[0] => println!("- crossover: fast is already faster at the smallest T = {t}"),
        Some(t) => println!("- crossover: fast becomes faster than direct at T = {t}"),
        None => println!("- crossover: not reached while direct ran"),
    }
    if let Some(t) = direct_stop {
        println!("- direct stopped after T = {t} (one run > {direct_budget} s); nothing extrapolated");
    }
    let big = |xs: &[f64], ys: &[f64]| {
        let i = xs.iter().position(|&x| x >= 1024.0).unwrap_or(0);
        (xs[i..].to_vec(), ys[i..].to_vec())
    };
    let (a, b) = big(&fx, &fy);
    println!("- fast exponent (T ≥ 1024): {}", fit(&a, &b));
    let (a, b) = big(&dx, &dy);
    println!("- direct exponent (T ≥ 1024): {}\n", fit(&a, &b));

    // ---- 2. generation: naive vs online decoder ----
    let naive = mixers::registry::mixer("toeplitz", &json!({"heads": H, "decoder": "naive"})).expect("naive");
    let online =
        mixers::registry::mixer("toeplitz", &json!({"heads": H, "decoder": "online"})).expect("online");
    let gs: Vec<usize> = if quick { vec![1000, 2000, 4000] } else { (0..7).map(|k| 1000 << k).collect() };
    let naive_budget = if quick { 0.5 } else { 8.0 };
    println!("## Generation of T tokens: naive vs online decoder\n");
    println!("| T | naive | online | naive / online | online per token |");
    println!("|---:|---:|---:|---:|---:|");
    let (mut nx, mut ny, mut ox, mut oy) = (vec![], vec![], vec![], vec![]);
    let mut naive_on = true;
    let mut naive_stop = None;
    for &t in &gs {
        let inp = inputs(online.as_ref(), t);
        let reps = if quick { 1 } else { 3 };
        let o = time(0, reps, 2.0, || run(online.as_ref(), "cpu", Form::Recurrent, &inp).expect("online"));
        ox.push(t as f64);
        oy.push(o.min);
        let n = if naive_on {
            let n = time(0, reps, 2.0, || run(naive.as_ref(), "cpu", Form::Recurrent, &inp).expect("naive"));
            nx.push(t as f64);
            ny.push(n.min);
            if n.min > naive_budget {
                naive_on = false;
                naive_stop = Some(t);
            }
            Some(n)
        } else {
            None
        };
        let per = fmt_s(o.min / t as f64);
        match n {
            Some(n) => {
                println!("| {t} | {} | {} | {:.2} | {per} |", fmt_s(n.min), fmt_s(o.min), n.min / o.min)
            }
            None => println!("| {t} | (stopped) | {} | | {per} |", fmt_s(o.min)),
        }
    }
    println!();
    if let Some(t) = naive_stop {
        println!("- naive stopped after T = {t} (one run > {naive_budget} s); nothing extrapolated");
    }
    println!("- naive total-time exponent: {}", fit(&nx, &ny));
    println!("- online total-time exponent: {}", fit(&ox, &oy));
    println!("  (expected ≈ 2 for naive; ≈ 1 plus log factors for online, T log² T)");
}

fn rayon_threads() -> String {
    match mixers::registry::backends_status().into_iter().find(|(n, _)| *n == "cpu") {
        Some((_, mixers::registry::Availability::Available(s))) => s,
        _ => "?".into(),
    }
}
