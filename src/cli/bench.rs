//! `mixers bench`: time, tokens/s, peak working memory and decoding cache size of every
//! (mixer, form, backend) over a sweep of sequence lengths, the fitted scaling exponent of
//! time against `T`, and ratios between forms and backends measured in the same run.
//!
//! Method, the same for every mixer: inputs come from `Mixer::random_inputs` with
//! `B = batch`, `T`, `H = heads`, `Dk = Dv = dim`, `C = heads·dim`, cast to the bench dtype.
//! Each point runs once untimed (that run also measures peak working memory through
//! [`CountingAlloc`], see [`alloc`]; the first point of a series gets one more warm-up run
//! before it), then is timed with [`crate::timing::time`] for up to `reps` runs or
//! `max_seconds`. Forms other than `recurrent` are timed as wall time around
//! [`mixer_registry::run::run`] (input validation included; the CUDA backend synchronises
//! inside `run`, so its wall time includes host↔device copies). `recurrent` builds a decoder
//! ([`mixer_registry::run::decoder`]) and feeds every token ([`run_decoder`]); its cache size
//! is [`Decoder::cache_elems`](mixer_core::mixer::Decoder::cache_elems) after the last step.
//!
//! Guards: `materialized` (a dense `f64` solve) is skipped above `T = 4096`; a series stops
//! growing `T` after a point whose run took more than `max_seconds`, and the larger `T` are
//! listed as skipped — nothing is extrapolated.

pub mod alloc;
mod backward;
mod plot;
mod report;
pub mod seq;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mixer_core::mixer::{Mixer, run_decoder, validate};
use mixer_core::tensor::cast_tensors;
use mixer_core::{AnyTensors, DType, Dims, Error, Form, Result};
use mixer_registry::harness::Sizes;
use mixer_registry::run::{decoder, forms as available_forms, run as run_form};
use mixer_registry::{Backend, mixer_entry};
use serde::Serialize;

use crate::timing::{Timing, fit_exponent, time};

pub use alloc::CountingAlloc;
pub use report::{render_markdown, write_outputs};
pub use seq::parse_seq;

/// Largest `T` at which the materialized form (dense `f64` solve) is run.
pub const MATERIALIZED_MAX_SEQ: usize = 4096;

/// The default mixers, one per family: `(name, config)`.
pub fn default_mixers(heads: usize) -> Vec<(String, serde_json::Value)> {
    vec![
        ("glr".into(), serde_json::json!({"pattern": "pow2"})),
        ("attention".into(), serde_json::json!({})),
        ("mamba2".into(), serde_json::json!({})),
        ("loglinear-mamba2".into(), serde_json::json!({})),
        ("toeplitz".into(), serde_json::json!({"heads": heads})),
    ]
}

/// What to measure (the library form of `mixers bench`'s arguments).
#[derive(Clone, Debug)]
pub struct Options {
    /// `(mixer name, config)`; empty: [`default_mixers`] (those registered).
    pub mixers: Vec<(String, serde_json::Value)>,
    /// Forms; empty: `materialized`, `parallel`, `fast` where available (plus `recurrent`
    /// with `decode`).
    pub forms: Vec<Form>,
    /// Backend names; empty: every available backend.
    pub backends: Vec<String>,
    /// Sequence lengths.
    pub seqs: Vec<usize>,
    /// Batch `B`.
    pub batch: usize,
    /// Heads `H`.
    pub heads: usize,
    /// Head dim `Dk = Dv`; channels `C = heads·dim`.
    pub dim: usize,
    /// Also measure token-by-token decoding (the `recurrent` form) and its cache size.
    pub decode: bool,
    /// Scalar type of the inputs.
    pub dtype: DType,
    /// Time budget of one run, in seconds: a series stops growing `T` after a point whose
    /// run exceeded it; also the timing budget of one point.
    pub max_seconds: f64,
    /// Timed runs per point (after one untimed run).
    pub reps: usize,
    /// Seed of the random inputs.
    pub seed: u64,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mixers: Vec::new(),
            forms: Vec::new(),
            backends: Vec::new(),
            seqs: vec![1024, 2048, 4096, 8192, 16384, 32768, 65536],
            batch: 1,
            heads: 2,
            dim: 32,
            decode: false,
            dtype: DType::F32,
            max_seconds: 5.0,
            reps: 5,
            seed: 0,
            progress: true,
        }
    }
}

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

struct Case {
    label: String,
    name: String,
    config: serde_json::Value,
    mixer: Box<dyn Mixer>,
    /// (backend, forms to run there)
    plan: Vec<(String, Vec<Form>)>,
}

fn plan(opts: &Options, notes: &mut Vec<String>) -> Result<(Vec<Case>, Vec<String>)> {
    let backends: Vec<String> = if opts.backends.is_empty() {
        Backend::available().iter().map(|b| b.name().to_string()).collect()
    } else {
        opts.backends
            .iter()
            .map(|b| Backend::by_name(b).map(|b| b.name().to_string()))
            .collect::<Result<_>>()?
    };
    if backends.is_empty() {
        return Err(Error::Io("no backend available to bench".into()));
    }
    let defaults = opts.mixers.is_empty();
    let list = if defaults { default_mixers(opts.heads) } else { opts.mixers.clone() };
    let mut wanted: Vec<Form> = if opts.forms.is_empty() {
        vec![Form::Materialized, Form::Parallel, Form::Fast]
    } else {
        opts.forms.clone()
    };
    if opts.decode && !wanted.contains(&Form::Recurrent) {
        wanted.push(Form::Recurrent);
    }
    wanted.sort();
    wanted.dedup();
    let mut cases = Vec::new();
    for (name, config) in list {
        let built = mixer_entry(&name).and_then(|e| (e.build)(e.name, &config));
        let mixer = match built {
            Ok(m) => m,
            Err(e) if defaults => {
                notes.push(format!("default mixer `{name}` left out: {e}"));
                continue;
            }
            Err(e) => return Err(e),
        };
        let label = label(&name, &config);
        let mut plan = Vec::new();
        for b in &backends {
            let have = available_forms(mixer.as_ref(), b);
            let mut forms = Vec::new();
            for f in &wanted {
                if have.contains(f) {
                    forms.push(*f);
                } else if !opts.forms.is_empty() || *f == Form::Recurrent {
                    notes.push(format!(
                        "{label}: form `{f}` is not available on `{b}` (available: {})",
                        have.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
                    ));
                }
            }
            plan.push((b.clone(), forms));
        }
        cases.push(Case { label, name, config, mixer, plan });
    }
    if cases.is_empty() {
        return Err(Error::Io(format!("nothing to bench: {}", notes.join("; "))));
    }
    Ok((cases, backends))
}

/// One run of a form; returns the decoder's cache size for `recurrent`.
fn run_once(
    m: &dyn Mixer,
    backend: &str,
    form: Form,
    inputs: &AnyTensors,
    dims: &Dims,
) -> Result<Option<usize>> {
    if form != Form::Recurrent {
        let y = run_form(m, backend, form, inputs)?;
        std::hint::black_box(&y);
        return Ok(None);
    }
    let spec = m.spec();
    match inputs {
        AnyTensors::F64(t) => {
            let mut dec = decoder::<f64>(m, backend, t, dims)?;
            let y = run_decoder(dec.as_mut(), &spec, t, |_, _| {})?;
            std::hint::black_box(&y);
            Ok(Some(dec.cache_elems()))
        }
        AnyTensors::F32(t) => {
            let mut dec = decoder::<f32>(m, backend, t, dims)?;
            let y = run_decoder(dec.as_mut(), &spec, t, |_, _| {})?;
            std::hint::black_box(&y);
            Ok(Some(dec.cache_elems()))
        }
    }
}

struct Measured {
    timing: Timing,
    peak: Option<usize>,
    cache: Option<usize>,
}

/// An untimed run that measures memory and cache size, then timed runs. The first point of
/// a series gets one more untimed run before that, so that one-time setup (FFT plans,
/// thread pools, kernel compilation, allocator arenas) is neither timed nor counted. A
/// point whose measured run already took more than `max_seconds` is timed by that run.
fn measure(
    m: &dyn Mixer,
    backend: &str,
    form: Form,
    inputs: &AnyTensors,
    dims: &Dims,
    opts: &Options,
    first: bool,
) -> Result<Measured> {
    if first {
        run_once(m, backend, form, inputs, dims)?;
    }
    let t0 = Instant::now();
    let (r, peak) = alloc::measure(|| run_once(m, backend, form, inputs, dims));
    let once = t0.elapsed().as_secs_f64();
    let cache = r?;
    let peak = if backend == "cpu" { peak } else { None };
    let timing = if once > opts.max_seconds {
        Timing { median: once, min: once, max: once, reps: 1 }
    } else {
        time(0, opts.reps.max(1), opts.max_seconds, || run_once(m, backend, form, inputs, dims))
    };
    Ok(Measured { timing, peak, cache })
}

fn sizes(opts: &Options, seq: usize) -> Sizes {
    Sizes {
        batch: opts.batch,
        seq,
        channels: opts.heads * opts.dim,
        heads: opts.heads,
        dk: opts.dim,
        dv: opts.dim,
    }
}

fn check_options(opts: &Options) -> Result<()> {
    let bad = |what: &str, v: String| Err(Error::Io(format!("--{what} must be ≥ 1, given {v}")));
    if opts.batch == 0 {
        return bad("batch", opts.batch.to_string());
    }
    if opts.heads == 0 {
        return bad("heads", opts.heads.to_string());
    }
    if opts.dim == 0 {
        return bad("dim", opts.dim.to_string());
    }
    if opts.seqs.is_empty() || opts.seqs.contains(&0) {
        return Err(Error::Io(format!("--seq needs lengths ≥ 1, given {:?}", opts.seqs)));
    }
    if !(opts.max_seconds.is_finite() && opts.max_seconds > 0.0) {
        return Err(Error::Io(format!("--max-seconds must be > 0, given {}", opts.max_seconds)));
    }
    Ok(())
}

/// Runs the bench. Per mixer and `T` (ascending), inputs are drawn once and shared by every
/// backend and form, so ratios compare the same data.
pub fn bench(opts: &Options) -> Result<Report> {
    check_options(opts)?;
    let start = Instant::now();
    let mut notes = Vec::new();
    let (cases, backends) = plan(opts, &mut notes)?;
    let mut seqs = opts.seqs.clone();
    seqs.sort_unstable();
    seqs.dedup();
    let total: usize =
        cases.iter().map(|c| c.plan.iter().map(|p| p.1.len()).sum::<usize>()).sum::<usize>() * seqs.len();
    let pb = ProgressBar::new(total as u64);
    if !opts.progress {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut points = Vec::new();
    for case in &cases {
        let m = case.mixer.as_ref();
        // Why a series stopped growing, per (backend, form).
        let mut stopped: BTreeMap<(String, Form), String> = BTreeMap::new();
        let mut measured_any: BTreeMap<(String, Form), bool> = BTreeMap::new();
        for &seq in &seqs {
            let base = |backend: &str, form: Form| Point {
                mixer: case.label.clone(),
                name: case.name.clone(),
                config: case.config.clone(),
                backend: backend.to_string(),
                form,
                seq,
                status: Status::Skipped,
                reason: None,
                timing: None,
                tokens_per_s: None,
                peak_bytes: None,
                cache_elems: None,
            };
            let todo = |b: &str, f: Form| {
                let too_long = f == Form::Materialized && seq > MATERIALIZED_MAX_SEQ;
                !too_long && !stopped.contains_key(&(b.to_string(), f))
            };
            let any = case.plan.iter().any(|(b, fs)| fs.iter().any(|&f| todo(b, f)));
            pb.set_message(format!("{} T={seq}: drawing inputs", case.label));
            let inputs: Result<(AnyTensors, Dims)> = if any {
                m.random_inputs(&sizes(opts, seq).dims(), opts.seed).and_then(|x| {
                    let any = match opts.dtype {
                        DType::F64 => AnyTensors::F64(x),
                        DType::F32 => AnyTensors::F32(cast_tensors::<f32>(&x)),
                    };
                    let dims = validate(m, &any)?;
                    Ok((any, dims))
                })
            } else {
                Err(Error::Io("not drawn".into()))
            };
            for (backend, forms) in &case.plan {
                for &form in forms {
                    pb.set_message(format!("{} {form} {backend} T={seq}", case.label));
                    let key = (backend.clone(), form);
                    let mut p = base(backend, form);
                    if form == Form::Materialized && seq > MATERIALIZED_MAX_SEQ {
                        p.reason = Some(format!("materialized is not run above T = {MATERIALIZED_MAX_SEQ}"));
                    } else if let Some(why) = stopped.get(&key) {
                        p.reason = Some(why.clone());
                    } else {
                        match &inputs {
                            Err(e) => {
                                p.status = Status::Error;
                                p.reason = Some(format!("inputs: {e}"));
                            }
                            Ok((x, dims)) => {
                                let first = !measured_any.get(&key).copied().unwrap_or(false);
                                match measure(m, backend, form, x, dims, opts, first) {
                                    Ok(r) => {
                                        measured_any.insert(key.clone(), true);
                                        p.status = Status::Ok;
                                        p.tokens_per_s = Some((opts.batch * seq) as f64 / r.timing.median);
                                        p.peak_bytes = r.peak;
                                        p.cache_elems = r.cache;
                                        if r.timing.median > opts.max_seconds {
                                            stopped.insert(
                                                key,
                                                format!(
                                                    "T = {seq} took {:.1} s > budget {} s",
                                                    r.timing.median, opts.max_seconds
                                                ),
                                            );
                                        }
                                        p.timing = Some(r.timing);
                                    }
                                    Err(e) => {
                                        p.status = Status::Error;
                                        p.reason = Some(e.to_string());
                                    }
                                }
                            }
                        }
                    }
                    points.push(p);
                    pb.inc(1);
                }
            }
        }
    }
    pb.finish_and_clear();
    let fits = fits(&points);
    let ratios = ratios(&points);
    let cpu = backends.iter().any(|b| b == "cpu");
    let meta = Meta {
        version: env!("CARGO_PKG_VERSION").into(),
        dtype: opts.dtype.name().into(),
        batch: opts.batch,
        heads: opts.heads,
        dim: opts.dim,
        channels: opts.heads * opts.dim,
        seqs,
        reps: opts.reps.max(1),
        max_seconds: opts.max_seconds,
        materialized_max_seq: MATERIALIZED_MAX_SEQ,
        backends,
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        threads: rayon::current_num_threads(),
        timing: "wall time (std::time::Instant) around mixer_registry::run::run (validation included), \
                 or around decoder construction plus every decode step for `recurrent`; one untimed \
                 run first; the CUDA backend synchronises inside run, so its times include \
                 host↔device copies (no device events)"
            .into(),
        memory: if alloc::counting() && cpu {
            "peak live heap bytes above the pre-run baseline during the untimed run, from a \
             counting global allocator (all threads); CUDA device memory: n/a"
                .into()
        } else {
            "n/a: the counting allocator is not installed in this binary".into()
        },
        elapsed_s: start.elapsed().as_secs_f64(),
    };
    Ok(Report { meta, points, fits, ratios, notes })
}

/// One fit per (mixer, backend, form) with at least two measured points.
pub fn fits(points: &[Point]) -> Vec<Fit> {
    let mut by: BTreeMap<(String, String, Form), Vec<(usize, f64)>> = BTreeMap::new();
    let mut order = Vec::new();
    for p in points {
        if let (Status::Ok, Some(t)) = (p.status, &p.timing) {
            let key = (p.mixer.clone(), p.backend.clone(), p.form);
            if !by.contains_key(&key) {
                order.push(key.clone());
            }
            by.entry(key).or_default().push((p.seq, t.median));
        }
    }
    order
        .into_iter()
        .filter_map(|k| {
            let pts = &by[&k];
            Fit::of(&k.0, &k.1, k.2, pts)
        })
        .collect()
}

/// Ratios of medians at equal `T`: every form against `fast` on the same backend, and every
/// other backend against `cpu` for the same form.
pub fn ratios(points: &[Point]) -> Vec<Ratio> {
    let mut t: BTreeMap<(String, String, Form, usize), f64> = BTreeMap::new();
    for p in points {
        if let (Status::Ok, Some(tm)) = (p.status, &p.timing) {
            t.insert((p.mixer.clone(), p.backend.clone(), p.form, p.seq), tm.median);
        }
    }
    let mut out = Vec::new();
    for ((mixer, backend, form, seq), &v) in &t {
        if *form != Form::Fast
            && let Some(&f) = t.get(&(mixer.clone(), backend.clone(), Form::Fast, *seq))
        {
            out.push(Ratio {
                mixer: mixer.clone(),
                comparison: format!("{form} / fast ({backend})"),
                seq: *seq,
                ratio: v / f,
            });
        }
        if backend != "cpu"
            && let Some(&c) = t.get(&(mixer.clone(), "cpu".to_string(), *form, *seq))
        {
            out.push(Ratio {
                mixer: mixer.clone(),
                comparison: format!("{backend} / cpu ({form})"),
                seq: *seq,
                ratio: v / c,
            });
        }
    }
    out
}

/// Arguments of `mixers bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Mixers to measure: `NAME` or `NAME{JSON config}` (e.g. `glr{"pattern":"sq1"}`),
    /// several after one --mixer or repeated; default: one per family (glr pow2, attention,
    /// mamba2, loglinear-mamba2, toeplitz), those registered.
    #[arg(long, num_args = 1..)]
    mixer: Vec<String>,
    /// JSON config, when exactly one --mixer is given.
    #[arg(long)]
    config: Option<String>,
    /// Forms (materialized, parallel, fast, recurrent); default: materialized, parallel, fast
    /// where available.
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    form: Vec<String>,
    /// Backends; default: every available backend.
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    backend: Vec<String>,
    /// Sequence lengths: `A..B` doubles from A up to B (`1k..64k` = 1024, 2048, …, 65536;
    /// k = 1024), or a comma list `1000,3000`.
    #[arg(long, default_value = "1k..64k")]
    seq: String,
    /// Batch B.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Heads H.
    #[arg(long, default_value_t = 2)]
    heads: usize,
    /// Head dim Dk = Dv (channels C = heads·dim).
    #[arg(long, default_value_t = 32)]
    dim: usize,
    /// Also measure token-by-token decoding (recurrent form) and the decoder's cache size.
    #[arg(long)]
    decode: bool,
    /// Input dtype (f32 or f64).
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Time budget of one run in seconds: a series stops growing T after a run over it.
    #[arg(long, default_value_t = 5.0)]
    max_seconds: f64,
    /// Timed runs per point, after one untimed run.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output folder for bench.md, bench.json, bench.png, bench.svg.
    #[arg(long, default_value = "out/bench")]
    out: PathBuf,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Measure the backward pass instead: backward/forward time ratio of the fast forms and
    /// both scaling exponents (default lengths 4k, 8k, 16k).
    #[arg(long)]
    backward: bool,
}

impl Args {
    /// The options these arguments describe.
    pub fn options(&self) -> Result<Options> {
        if self.config.is_some() && self.mixer.len() != 1 {
            return Err(Error::Io(format!(
                "--config applies to exactly one --mixer, given {} mixers",
                self.mixer.len()
            )));
        }
        let cfg = super::parse_config(self.config.as_deref())?;
        let forms = self.form.iter().map(|f| f.parse::<Form>()).collect::<Result<Vec<_>>>()?;
        let dtype = match self.dtype.as_str() {
            "f32" => DType::F32,
            "f64" => DType::F64,
            d => return Err(Error::Io(format!("--dtype: expected f32 or f64, given `{d}`"))),
        };
        let mixers = self
            .mixer
            .iter()
            .map(|m| match m.find('{') {
                Some(_) if self.config.is_some() => Err(Error::Io(format!(
                    "--mixer `{m}` has an inline config and --config is given too; use one"
                ))),
                Some(i) => {
                    serde_json::from_str(&m[i..]).map(|c| (m[..i].trim().to_string(), c)).map_err(|e| {
                        Error::Io(format!("--mixer `{m}`: the config after the name is not valid JSON ({e})"))
                    })
                }
                None => Ok((m.trim().to_string(), cfg.clone())),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Options {
            mixers,
            forms,
            backends: self.backend.clone(),
            seqs: parse_seq(&self.seq)?,
            batch: self.batch,
            heads: self.heads,
            dim: self.dim,
            decode: self.decode,
            dtype,
            max_seconds: self.max_seconds,
            reps: self.reps,
            seed: self.seed,
            progress: !self.quiet,
        })
    }
}

/// Runs the bench and writes `bench.md`, `bench.json`, `bench.png`, `bench.svg` to `out`;
/// returns the paths written.
pub fn bench_to(opts: &Options, out: &Path) -> Result<(Report, Vec<PathBuf>)> {
    let report = bench(opts)?;
    let files = write_outputs(&report, out)?;
    Ok((report, files))
}

pub(crate) fn run(a: Args) -> Result<i32> {
    let mut opts = a.options()?;
    if a.backward {
        if a.seq == "1k..64k" {
            opts.seqs = backward::DEFAULT_SEQS.to_vec();
        }
        return backward::run(&opts);
    }
    let (report, files) = bench_to(&opts, &a.out)?;
    print!("{}", render_markdown(&report));
    println!();
    for f in files {
        println!("wrote {}", f.display());
    }
    let errors = report.points.iter().filter(|p| p.status == Status::Error).count();
    Ok(if errors == 0 { 0 } else { 1 })
}
