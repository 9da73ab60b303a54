//! The results of a bench: points, fits, ratios, and how they were obtained.

use mixer_core::Form;
use serde::Serialize;

use mixers::timing::{Timing, fit_exponent};

/// One measured (or skipped) point.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// Display label of the mixer (name and the config given).
    pub mixer: String,
    /// Registered name.
    pub name: String,
    /// Config as given.
    pub config: serde_json::Value,
    /// Backend.
    pub backend: String,
    /// Form.
    pub form: Form,
    /// Sequence length `T`.
    pub seq: usize,
    /// `ok`, `skipped` or `error`.
    pub status: Status,
    /// Why it was skipped or failed.
    pub reason: Option<String>,
    /// Wall time over the timed runs, in seconds.
    pub timing: Option<Timing>,
    /// `B·T / median`.
    pub tokens_per_s: Option<f64>,
    /// Peak working memory of one run in bytes (`None`: not measurable here).
    pub peak_bytes: Option<usize>,
    /// Decoder cache/state size in scalars after the last token (`recurrent` only).
    pub cache_elems: Option<usize>,
    /// CUDA only: host→device copy of the inputs, seconds (not in `timing`).
    pub upload_s: Option<f64>,
    /// CUDA only: device→host copy of `y`, seconds (not in `timing`).
    pub download_s: Option<f64>,
    /// The device form's launch plan at this point's sizes and mode (what `mixers plan` prints:
    /// kernel, function, options, grid, shared memory), where the backend's family reports one;
    /// for a measured point it is the plan that ran.
    pub plan: Option<serde_json::Value>,
}

impl Point {
    /// The plan's kernel function (`attn_wgmma_bf16`, …), where a plan names one.
    pub fn kernel(&self) -> Option<&str> {
        self.plan.as_ref()?.get("function")?.as_str()
    }
}

/// Outcome of a point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Measured.
    Ok,
    /// Not run (guard).
    Skipped,
    /// The run returned an error.
    Error,
}

/// Least-squares fit of `log time = a + b log T` over a series' measured points.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Fit {
    /// Mixer label.
    pub mixer: String,
    /// Backend.
    pub backend: String,
    /// Form.
    pub form: Form,
    /// Exponent `b`.
    pub exponent: f64,
    /// Standard error of `b` (0 with two points).
    pub se: f64,
    /// Half-width of the interval `b ± 2·se` (`None` with two points: no error estimate).
    pub ci: Option<f64>,
    /// Number of points fitted.
    pub points: usize,
    /// Smallest `T` fitted.
    pub seq_min: usize,
    /// Largest `T` fitted.
    pub seq_max: usize,
}

impl Fit {
    /// Fits `(T, seconds)` pairs; `None` with fewer than two distinct `T`.
    pub fn of(mixer: &str, backend: &str, form: Form, pts: &[(usize, f64)]) -> Option<Fit> {
        let xs: Vec<f64> = pts.iter().map(|p| p.0 as f64).collect();
        let ys: Vec<f64> = pts.iter().map(|p| p.1).collect();
        let (b, se) = fit_exponent(&xs, &ys)?;
        Some(Fit {
            mixer: mixer.into(),
            backend: backend.into(),
            form,
            exponent: b,
            se,
            ci: (pts.len() > 2).then_some(2.0 * se),
            points: pts.len(),
            seq_min: pts.iter().map(|p| p.0).min().unwrap_or(0),
            seq_max: pts.iter().map(|p| p.0).max().unwrap_or(0),
        })
    }

    /// `1.02 ± 0.03` (or `1.02 (2 points)`).
    pub fn display(&self) -> String {
        match self.ci {
            Some(c) => format!("{:.2} ± {:.2}", self.exponent, c),
            None => format!("{:.2} (2 points, no error estimate)", self.exponent),
        }
    }
}

/// A time ratio measured in the same run: `time(numerator) / time(denominator)` at one `T`.
#[derive(Clone, Debug, Serialize)]
pub struct Ratio {
    /// Mixer label.
    pub mixer: String,
    /// E.g. `parallel / fast (cpu)` or `cuda / cpu (fast)`.
    pub comparison: String,
    /// Sequence length.
    pub seq: usize,
    /// The ratio of medians (> 1: the denominator is faster).
    pub ratio: f64,
}

/// How the numbers were obtained.
#[derive(Clone, Debug, Serialize)]
pub struct Meta {
    /// `mixers` version.
    pub version: String,
    /// Input dtype.
    pub dtype: String,
    /// Precision mode (`exact`, `tf32`, `bf16`).
    pub precision: String,
    /// The GPU's name, when the CUDA backend was measured.
    pub device: Option<String>,
    /// The CUDA driver's version, when the CUDA backend was measured.
    pub driver: Option<String>,
    /// Batch.
    pub batch: usize,
    /// Heads.
    pub heads: usize,
    /// Head dim.
    pub dim: usize,
    /// Channels `heads·dim`.
    pub channels: usize,
    /// Requested lengths.
    pub seqs: Vec<usize>,
    /// Timed runs per point.
    pub reps: usize,
    /// Time budget of one run, seconds.
    pub max_seconds: f64,
    /// Largest `T` of the materialized form.
    pub materialized_max_seq: usize,
    /// Backends measured.
    pub backends: Vec<String>,
    /// Logical CPUs of the machine.
    pub cpus: usize,
    /// Rayon worker threads.
    pub threads: usize,
    /// Timing method.
    pub timing: String,
    /// Memory method.
    pub memory: String,
    /// Wall time of the whole bench, seconds.
    pub elapsed_s: f64,
}

/// Everything a bench produced.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Method and sizes.
    pub meta: Meta,
    /// One per (mixer, backend, form, T), measured or skipped.
    pub points: Vec<Point>,
    /// One per series with at least two measured points.
    pub fits: Vec<Fit>,
    /// Form and backend ratios.
    pub ratios: Vec<Ratio>,
    /// Mixers or forms left out, and why.
    pub notes: Vec<String>,
}

/// Display label: the name, plus the given config's values (`glr pattern=pow2`).
pub fn label(name: &str, config: &serde_json::Value) -> String {
    match config.as_object() {
        Some(o) if !o.is_empty() => {
            let kv: Vec<String> = o
                .iter()
                .map(|(k, v)| match v {
                    serde_json::Value::String(s) => format!("{k}={s}"),
                    v => format!("{k}={v}"),
                })
                .collect();
            format!("{name} {}", kv.join(" "))
        }
        _ => name.to_string(),
    }
}
