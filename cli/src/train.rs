//! `mixers train`: train a small model with one mixer on a synthetic task; progress bar,
//! periodic test evaluation, a JSON log, a plot of the curves and a checkpoint.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mixer_core::{Error, Result};

use mixers_train::{Event, TaskConfig, TaskKind, TrainConfig, checkpoint, train};

mod plot;

/// Arguments of `mixers train`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Task: copy, mqar, multihop.
    #[arg(long)]
    task: String,
    /// Registered mixer name (attention, local-attention, glr, diagonal-ssm, kth-order,
    /// dense-recurrence, mamba2, gated-deltanet, loglinear-*, toeplitz, …); a JSON config may
    /// follow the name (`glr{"pattern":"sq1"}`) instead of `--config`.
    #[arg(long)]
    mixer: String,
    /// The mixer's JSON config (default `{}`; e.g. `{"pattern": "sq1"}` for glr).
    #[arg(long)]
    config: Option<String>,
    /// Task settings as JSON over the task's defaults, e.g. `{"max_len": 16}` (copy),
    /// `{"pairs": 16, "seq_len": 96}` (mqar), `{"max_hops": 4}` (multihop).
    #[arg(long)]
    task_config: Option<String>,
    /// The whole run's settings as JSON or a file: a `TrainConfig`, or a log written by
    /// `mixers train` (its `config` is used); the other flags override it.
    #[arg(long, value_name = "JSON|FILE")]
    run_config: Option<String>,
    /// Optimiser steps.
    #[arg(long)]
    steps: Option<usize>,
    /// Seed of the initialisation and of the data.
    #[arg(long)]
    seed: Option<u64>,
    /// Model width D.
    #[arg(long)]
    width: Option<usize>,
    /// Number of blocks.
    #[arg(long)]
    layers: Option<usize>,
    /// Heads (D must be divisible by it).
    #[arg(long)]
    heads: Option<usize>,
    /// Sequences per step.
    #[arg(long)]
    batch: Option<usize>,
    /// Peak learning rate.
    #[arg(long)]
    lr: Option<f64>,
    /// Evaluate on the test split every N steps (and at the end).
    #[arg(long)]
    eval_every: Option<usize>,
    /// Size of the test set.
    #[arg(long)]
    test_size: Option<usize>,
    /// No learned position embedding.
    #[arg(long)]
    no_pos_emb: bool,
    /// Kernel of a short causal depthwise convolution before each mixer (0: none, the default).
    #[arg(long)]
    conv: Option<usize>,
    /// Backend of the mixer layers' forward and backward (`cpu`, `cuda`); the rest of the model
    /// runs on the host.
    #[arg(long)]
    backend: Option<String>,
    /// Output folder: `<task>-<mixer>.json` (log), `.svg` (curves), `.safetensors` (model).
    #[arg(long, default_value = "out/train")]
    out: PathBuf,
    /// Plot format: svg or png.
    #[arg(long, default_value = "svg")]
    plot: String,
    /// No progress bar (e.g. in logs).
    #[arg(long)]
    quiet: bool,
}

fn json_arg(s: &str, what: &str) -> Result<serde_json::Value> {
    let text = if s.trim_start().starts_with('{') {
        s.to_string()
    } else {
        std::fs::read_to_string(s).map_err(|e| Error::Io(format!("{what}: cannot read {s}: {e}")))?
    };
    serde_json::from_str(&text).map_err(|e| Error::Io(format!("{what} is not valid JSON ({e})")))
}

/// Merges the JSON object `over` into `base` (recursively for objects).
fn merge(base: &mut serde_json::Value, over: &serde_json::Value) {
    match (base, over) {
        (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// The run's configuration from the arguments.
fn config(a: &Args) -> Result<TrainConfig> {
    let task = TaskKind::parse(&a.task)?;
    let mut cfg = TrainConfig { task: TaskConfig::new(task), ..TrainConfig::default() };
    let mut v = serde_json::to_value(&cfg).map_err(|e| Error::Io(e.to_string()))?;
    if let Some(r) = &a.run_config {
        let mut over = json_arg(r, "--run-config")?;
        // A log written by `mixers train` holds its configuration under `config`.
        if over.get("config").is_some() && over.get("steps").is_some_and(|s| s.is_array()) {
            over = over["config"].take();
        }
        merge(&mut v, &over);
    }
    if let Some(t) = &a.task_config {
        merge(&mut v["task"], &json_arg(t, "--task-config")?);
    }
    v["task"]["task"] = serde_json::json!(task.name());
    cfg = serde_json::from_value(v).map_err(|e| Error::Io(format!("run configuration: {e}")))?;
    let (name, config) = super::mixer_spec(&a.mixer, a.config.as_deref())?;
    cfg.mixer = name.to_string();
    if config.is_some() {
        cfg.mixer_config = super::parse_config(config)?;
    }
    macro_rules! set {
        ($($f:ident),*) => { $( if let Some(x) = a.$f { cfg.$f = x; } )* };
    }
    set!(steps, seed, width, layers, heads, batch, eval_every, test_size, conv);
    if let Some(lr) = a.lr {
        cfg.optim.lr = lr;
    }
    if a.no_pos_emb {
        cfg.pos_emb = false;
    }
    if let Some(b) = &a.backend {
        cfg.backend = b.clone();
    }
    Ok(cfg)
}

/// Runs `mixers train`.
pub(crate) fn run(a: Args) -> Result<i32> {
    let cfg = config(&a)?;
    if !matches!(a.plot.as_str(), "svg" | "png") {
        return Err(Error::Io(format!("--plot must be svg or png, got {}", a.plot)));
    }
    std::fs::create_dir_all(&a.out)
        .map_err(|e| Error::Io(format!("cannot create {}: {e}", a.out.display())))?;
    let stem = format!("{}-{}", cfg.task.task.name(), cfg.mixer);
    let pb = ProgressBar::new(cfg.steps as u64);
    if a.quiet {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut last_test = String::new();
    let mut ema: Option<(f64, f64)> = None;
    let (model, log) = train(&cfg, &mut |ev| match ev {
        Event::Step(s) => {
            let (l, acc) = match ema {
                Some((l, acc)) => (0.9 * l + 0.1 * s.loss, 0.9 * acc + 0.1 * s.accuracy),
                None => (s.loss, s.accuracy),
            };
            ema = Some((l, acc));
            pb.set_message(format!("loss {l:.3} acc {acc:.3}{last_test}"));
            pb.inc(1);
        }
        Event::Eval(e) => {
            last_test = format!(" | test loss {:.3} acc {:.3}", e.test.loss, e.test.accuracy);
            if a.quiet {
                eprintln!("step {}: test loss {:.4} accuracy {:.4}", e.step, e.test.loss, e.test.accuracy);
            }
        }
    })?;
    pb.finish_and_clear();
    let json = a.out.join(format!("{stem}.json"));
    crate::write_json(&log, &json)?;
    let fig = a.out.join(format!("{stem}.{}", a.plot));
    plot::plot(&log, &fig)?;
    let ckpt = a.out.join(format!("{stem}.safetensors"));
    checkpoint::save(&model, &ckpt)?;
    let m = log.final_test();
    println!(
        "{} (on {}) on {}: {} parameters, {} steps in {:.1} s; test loss {:.4}, accuracy {:.4}, sequence accuracy {:.4}",
        cfg.mixer,
        cfg.backend,
        cfg.task.task.name(),
        log.params,
        cfg.steps,
        log.wall_s,
        m.loss,
        m.accuracy,
        m.sequence_accuracy
    );
    if m.groups.len() > 1 {
        let g: Vec<String> = m.groups.iter().map(|(n, acc, c)| format!("{n}: {acc:.3} ({c})")).collect();
        println!("per group: {}", g.join(", "));
    }
    println!("wrote {}, {}, {}", json.display(), fig.display(), ckpt.display());
    Ok(0)
}
