//! Trains every structure of Table 1 of *Structured generalized linear token mixing* (attention,
//! local attention, diagonal SSM, k-th order, dense recurrence, f(k) = 2^k and k²+1 with their
//! cache-efficient variants), plus Mamba-2, gated DeltaNet, their log-linear lifts and the
//! Toeplitz mixer, on copy, MQAR and multi-hop recall at one small setting, and writes the
//! accuracy table next to the papers' numbers (docs/training.md).
//!
//! ```text
//! cargo run --release --example expressivity [-- --quick] [--jobs 2] [--out out/expressivity]
//!                                            [--only attention,mamba2] [--tasks copy,mqar]
//!                                            [--seeds 0,1] [--steps N] [--backend cuda]
//!                                            [--conv K] [--glr-on a|b|both]
//! ```
//! `--glr-on` puts the GLR rows' pattern on the input mixing (`a`), the output recurrence (`b`,
//! the layer's default) or both: the mixer's `on` (docs/math.md §1.2, docs/training.md).
//! writes `OUT.md` and `OUT.json` (`--quick`: `OUT-quick.*`).

use mixers_train::expressivity::{Setting, rows, run};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mut setting = if quick { Setting::quick() } else { Setting::default_setting() };
    if let Some(s) = arg(&args, "--seeds") {
        setting.seeds = s.split(',').filter_map(|x| x.trim().parse().ok()).collect();
    }
    if let Some(s) = arg(&args, "--steps").and_then(|s| s.parse().ok()) {
        setting.run.steps = s;
    }
    if let Some(t) = arg(&args, "--tasks") {
        let keep: Vec<&str> = t.split(',').map(str::trim).collect();
        setting.tasks.retain(|c| keep.contains(&c.task.name()));
    }
    if let Some(k) = arg(&args, "--conv").and_then(|s| s.parse().ok()) {
        setting.run.conv = k;
    }
    if let Some(b) = arg(&args, "--backend") {
        setting.run.backend = b;
    }
    let jobs = arg(&args, "--jobs").and_then(|s| s.parse().ok()).unwrap_or(2);
    let mut all = rows(setting.window, setting.order);
    if let Some(only) = arg(&args, "--only") {
        let keep: Vec<&str> = only.split(',').map(str::trim).collect();
        all.retain(|r| keep.contains(&r.mixer.as_str()) || keep.contains(&r.label.as_str()));
    }
    if let Some(on) = arg(&args, "--glr-on") {
        if !["a", "b", "both"].contains(&on.as_str()) {
            eprintln!("error: --glr-on: expected a, b or both, got `{on}`");
            std::process::exit(2);
        }
        for r in all.iter_mut() {
            let glr = mixer_registry::mixer_entry(&r.mixer).is_ok_and(|e| e.family == "glr");
            if let (true, Some(c)) = (glr, r.config.as_object_mut()) {
                c.insert("on".into(), on.clone().into());
            }
        }
    }
    let out = arg(&args, "--out").unwrap_or_else(|| "out/expressivity".into());
    let out = if quick { format!("{out}-quick") } else { out };
    eprintln!(
        "expressivity ({} setting): {} structures × {} tasks × {} seed(s), {} steps each, {jobs} threads",
        setting.name,
        all.len(),
        setting.tasks.len(),
        setting.seeds.len(),
        setting.run.steps
    );
    let report = run(&setting, &all, jobs, &|c| {
        let status = c.error.clone().unwrap_or_else(|| format!("accuracy {:.1} %", c.accuracy));
        eprintln!("  {:<32} {:<9} {status} ({:.0} s)", c.row, c.task, c.wall_s);
    });
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let md = report.markdown();
    print!("{md}");
    if let Some(dir) = std::path::Path::new(&out).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let json = serde_json::to_string_pretty(&report.json()).unwrap_or_default();
    for (path, body) in [(format!("{out}.md"), md), (format!("{out}.json"), json)] {
        if let Err(e) = std::fs::write(&path, body) {
            eprintln!("error: cannot write {path}: {e}");
            std::process::exit(2);
        }
    }
    eprintln!("wrote {out}.md and {out}.json");
}
