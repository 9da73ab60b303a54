//! `mixers check`: every form on every backend against the f64 materialized oracle.

use indicatif::{ProgressBar, ProgressStyle};
use mixer_core::Precision;
use mixer_core::memory::{self, inputs_bytes};
use mixer_core::mixer::fit_dims;
use mixer_core::{Error, Result};
use mixer_registry::harness::{CheckRow, Sizes, check_with};
use mixer_registry::{Backend, MIXERS, mixer_entry};

use super::table::{check_row, check_table, sci};

/// Arguments of `mixers check`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Mixer to check (default: every registered mixer, with each of its example configs); a JSON
    /// config may follow the name (`attention{"window":100}`) instead of `--config`.
    #[arg(long)]
    mixer: Option<String>,
    /// JSON config for `--mixer` (default: the mixer's example configs).
    #[arg(long)]
    config: Option<String>,
    /// Backend (default: every available backend).
    #[arg(long)]
    backend: Option<String>,
    /// Sequence length T.
    #[arg(long, default_value_t = 37)]
    seq: usize,
    /// Batch size.
    #[arg(long, default_value_t = 2)]
    batch: usize,
    /// Channels C of channel mixers (glr, toeplitz). Default: 6, rounded up to what each
    /// config needs (a multiple of a Toeplitz mixer's `heads`).
    #[arg(long)]
    channels: Option<usize>,
    /// Head dim Dk = Dv of the attention and log-linear mixers (default: Dk = 5, Dv = 3; the
    /// tensor-core attention kernel of the tf32 and bf16 modes needs Dk = Dv, a multiple of 16).
    #[arg(long)]
    head_dim: Option<usize>,
    /// Random seed of the inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also write the rows as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Precision mode: `exact` (f64 and f32, the default), `tf32` (f32 inputs, tensor cores
    /// allowed) or `bf16` (bf16 storage of the activations and of `y`); each mode is held to
    /// its own tolerance against the f64 oracle.
    #[arg(long, default_value = "exact")]
    precision: String,
    /// `bf16`: the same as `--precision bf16` (f32 and f64 are both checked by default).
    #[arg(long)]
    dtype: Option<String>,
    /// Check the gradients instead: the materialized backward against finite differences,
    /// and every other backward form against it in f64 and f32 (with `--precision tf32|bf16`:
    /// in f32 in that mode, against the mode's tolerance).
    #[arg(long)]
    grad: bool,
}

/// The (mixer, config) pairs to check: one mixer with a config, or every example.
pub(crate) fn cases(mixer: Option<&str>, config: Option<&str>) -> Result<Vec<(String, serde_json::Value)>> {
    let entries: Vec<_> = match mixer {
        Some(name) => vec![mixer_entry(name)?],
        None => {
            let mut v: Vec<_> = MIXERS.iter().collect();
            v.sort_by_key(|e| (e.family, e.name));
            v
        }
    };
    let mut out = Vec::new();
    for e in entries {
        if let Some(c) = config {
            out.push((e.name.to_string(), super::parse_config(Some(c))?));
            continue;
        }
        if e.examples.is_empty() {
            out.push((e.name.to_string(), serde_json::json!({})));
        }
        for ex in e.examples {
            let v = serde_json::from_str(ex).map_err(|err| {
                Error::Io(format!("example config of `{}` is not JSON ({err}): {ex}", e.name))
            })?;
            out.push((e.name.to_string(), v));
        }
    }
    Ok(out)
}

/// `sizes` with the channels a configured mixer needs (see [`fit_dims`]), unless the caller
/// fixed them.
pub(crate) fn sized_for(m: &dyn mixer_core::Mixer, sizes: &Sizes, fixed_channels: bool) -> Sizes {
    if fixed_channels {
        return sizes.clone();
    }
    let d = fit_dims(m, &sizes.dims());
    Sizes { channels: d.get("C").copied().unwrap_or(sizes.channels), ..sizes.clone() }
}

/// Refuses sizes that would make a check vacuous (nothing to compare).
pub(crate) fn check_sizes(sizes: &Sizes) -> Result<()> {
    for (flag, v) in [
        ("--batch", sizes.batch),
        ("--seq", sizes.seq),
        ("--channels", sizes.channels),
        ("--head-dim", sizes.dk.min(sizes.dv)),
    ] {
        if v == 0 {
            return Err(Error::Io(format!(
                "{flag} must be ≥ 1, given 0: a check with no {} compares empty outputs and proves nothing",
                match flag {
                    "--batch" => "batch rows",
                    "--seq" => "tokens",
                    "--head-dim" => "head dims",
                    _ => "channels",
                }
            )));
        }
    }
    Ok(())
}

/// Checks the cases on the backends with a progress bar; build errors become failed rows.
/// Channels are sized from each config unless `fixed_channels`.
pub(crate) fn check_cases(
    cases: &[(String, serde_json::Value)],
    backends: &[Backend],
    sizes: &Sizes,
    fixed_channels: bool,
    seed: u64,
    precision: Precision,
) -> Vec<CheckRow> {
    let pb = ProgressBar::new(cases.len() as u64);
    pb.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let failed = |name: &str, cfg: &serde_json::Value, error: String| CheckRow {
        mixer: name.to_string(),
        config: cfg.to_string(),
        backend: "-".into(),
        form: mixer_core::Form::Materialized,
        dtype: mixer_core::DType::F64,
        precision,
        seq: sizes.seq,
        rel_rms: f64::INFINITY,
        max_abs: f64::INFINITY,
        pass: false,
        error: Some(error),
        millis: 0.0,
    };
    let mut rows = Vec::new();
    for (name, cfg) in cases {
        pb.set_message(name.clone());
        match mixer_registry::mixer(name, cfg) {
            Ok(m) => {
                let s = sized_for(m.as_ref(), sizes, fixed_channels);
                // The f64 inputs are drawn before any form runs: refuse them when they alone
                // exceed the memory budget (each form's own memory is guarded where it runs).
                let dims = fit_dims(m.as_ref(), &s.dims());
                let bytes = inputs_bytes(&m.spec(), &dims, 8.0);
                match memory::check(&format!("the inputs of `{name}` at T = {}", s.seq), bytes) {
                    Ok(()) => rows.extend(check_with(m.as_ref(), backends, &s, seed, precision)),
                    Err(e) => rows.push(failed(name, cfg, format!("random inputs: {e}"))),
                }
            }
            Err(e) => rows.push(failed(name, cfg, format!("build: {e}"))),
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    rows
}

/// Renders check rows as a Markdown table.
pub(crate) fn render(rows: &[CheckRow]) -> String {
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let case = [&*r.mixer, &r.config, &r.backend, r.form.name(), r.dtype.name()];
            let (rel, abs) = (sci(r.rel_rms), sci(r.max_abs));
            let cells = [r.precision.name().into(), r.seq.to_string(), rel, abs, format!("{:.1}", r.millis)];
            check_row(case, cells, r.error.as_deref(), r.pass)
        })
        .collect();
    check_table(&["rel RMS", "max abs", "ms"], &body)
}

pub(crate) fn backends(name: Option<&str>) -> Result<Vec<Backend>> {
    match name {
        Some(n) => Ok(vec![Backend::by_name(n)?]),
        None => Ok(Backend::available()),
    }
}

pub(crate) fn run(a: Args) -> Result<i32> {
    if a.config.is_some() && a.mixer.is_none() {
        return Err(Error::Io("--config needs --mixer".into()));
    }
    super::warn_duplicates();
    let backends = backends(a.backend.as_deref())?;
    let defaults = Sizes::default();
    let (dk, dv) = a.head_dim.map_or((defaults.dk, defaults.dv), |d| (d, d));
    let sizes = Sizes {
        seq: a.seq,
        batch: a.batch,
        channels: a.channels.unwrap_or(defaults.channels),
        dk,
        dv,
        ..defaults
    };
    check_sizes(&sizes)?;
    let (mixer, config) = match a.mixer.as_deref() {
        Some(m) => {
            let (name, config) = super::mixer_spec(m, a.config.as_deref())?;
            (Some(name), config)
        }
        None => (None, None),
    };
    let cases = cases(mixer, config)?;
    let precision = precision_arg(&a.precision, a.dtype.as_deref())?;
    if a.grad {
        return super::check_grad::run(&cases, &backends, &sizes, a.seed, precision, a.json.as_deref());
    }
    let rows = check_cases(&cases, &backends, &sizes, a.channels.is_some(), a.seed, precision);
    print!("{}", render(&rows));
    if let Some(p) = &a.json {
        super::write_json(&rows, p)?;
    }
    let failed = rows.iter().filter(|r| !r.pass).count();
    println!("\n{} checks, {} passed, {} failed", rows.len(), rows.len() - failed, failed);
    Ok(if failed == 0 && !rows.is_empty() { 0 } else { 1 })
}

/// The precision mode of `--precision` and `--dtype` (`--dtype bf16` is `--precision bf16`;
/// `--dtype f32`/`f64` leave the mode as given).
pub(crate) fn precision_arg(precision: &str, dtype: Option<&str>) -> Result<Precision> {
    let p = Precision::parse(precision)?;
    match dtype {
        None | Some("f32") | Some("f64") => Ok(p),
        Some("bf16") if matches!(p, Precision::Exact | Precision::Bf16) => Ok(Precision::Bf16),
        Some("bf16") => Err(Error::Io(format!(
            "--dtype bf16 is its own mode; it cannot be combined with --precision {p}"
        ))),
        Some(other) => Err(Error::Io(format!("--dtype must be f32, f64 or bf16, got `{other}`"))),
    }
}
