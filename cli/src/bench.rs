//! `mixers bench`: time, tokens/s, peak working memory and decoding cache size of every
//! (mixer, form, backend) over a sweep of sequence lengths, the fitted scaling exponent of
//! time against `T`, and ratios between forms and backends measured in the same run.
//!
//! Method, the same for every mixer: inputs come from `Mixer::random_inputs` with
//! `B = batch`, `T`, `H = heads`, `Dk = Dv = dim`, `C = heads·dim`, cast to the bench dtype.
//! Each point runs once untimed (that run also measures peak working memory through
//! [`CountingAlloc`], see [`alloc`]; the first point of a series gets one more warm-up run
//! before it), then is timed with [`mixers::timing::time`] for up to `reps` runs or
//! `max_seconds`. Forms other than `recurrent` are timed as wall time around
//! [`mixer_registry::run::run`] (input validation included; the CUDA backend synchronises
//! inside `run`, so its wall time includes host↔device copies). `recurrent` builds a decoder
//! ([`mixer_registry::run::decoder`]) and feeds every token ([`run_decoder`](mixer_core::mixer::run_decoder)); its cache size
//! is [`Decoder::cache_elems`](mixer_core::mixer::Decoder::cache_elems) after the last step.
//!
//! Guards: `materialized` (a dense `f64` solve) is skipped above `T = 4096`; a series stops
//! growing `T` after a point whose run took more than `max_seconds`, and does not start a
//! point whose time, predicted from the series' measured points ([`guard`]), exceeds it; a
//! point whose inputs or working memory exceed the memory budget is skipped with the
//! estimate (`mixer_core::memory`); the larger `T` are listed as skipped — nothing is
//! extrapolated into the results. A point that fails (or panics) is recorded as an error
//! and the bench goes on; [`bench_to`] rewrites `bench.md` and `bench.json` after every
//! point.

mod analysis;
mod args;
mod backward;
mod format;
mod guard;
mod measure;
mod model;
mod options;
mod packed;
mod plan;
pub(crate) mod plot;
mod report;
pub mod seq;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mixer_core::mixer::validate;
use mixer_core::tensor::cast_tensors;
use mixer_core::{AnyTensors, DType, Dims, Error, Form, Result};

pub use analysis::{fits, ratios};
pub(crate) use args::run;
pub use args::{Args, bench_to};
// The counting allocator lives in the library (`mixers::alloc`): the robustness tests use it too.
pub use mixers::alloc::{self, CountingAlloc};
pub use model::{Fit, Meta, Point, Ratio, Report, Status, label};
pub use options::{MATERIALIZED_MAX_SEQ, Options, default_mixers};
pub use report::{render_markdown, write_outputs, write_tables};
pub use seq::parse_seq;

use measure::{measure, sizes};
use options::check_options;
use plan::plan;

/// Runs the bench. Per mixer and `T` (ascending), inputs are drawn once and shared by every
/// backend and form, so ratios compare the same data.
pub fn bench(opts: &Options) -> Result<Report> {
    bench_with(opts, |_| Ok(()))
}

/// What a series (one backend and form of one mixer) has done so far.
#[derive(Default)]
struct Series {
    /// Why it stopped growing `T`.
    stopped: Option<String>,
    /// Measured `(T, median seconds)`.
    measured: Vec<(usize, f64)>,
}

/// [`bench`], calling `after_point` with the report so far after every point (e.g. to save
/// it, so that the measurements survive whatever happens to a later point).
pub fn bench_with(opts: &Options, mut after_point: impl FnMut(&Report) -> Result<()>) -> Result<Report> {
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
        let mut series: BTreeMap<(String, Form), Series> = BTreeMap::new();
        for &seq in &seqs {
            // Why each (backend, form) is not run at this T, decided before drawing inputs.
            let mut skip: BTreeMap<(String, Form), String> = BTreeMap::new();
            for (b, forms) in &case.plan {
                for &f in forms {
                    let key = (b.clone(), f);
                    let s = series.entry(key.clone()).or_default();
                    let why = if f == Form::Materialized && seq > MATERIALIZED_MAX_SEQ {
                        Some(format!("materialized is not run above T = {MATERIALIZED_MAX_SEQ}"))
                    } else if let Some(why) = &s.stopped {
                        Some(why.clone())
                    } else {
                        guard::too_slow(&s.measured, seq, opts.max_seconds)
                    };
                    if let Some(w) = why {
                        skip.insert(key, w);
                    }
                }
            }
            let any = case.plan.iter().any(|(b, fs)| fs.iter().any(|&f| !skip.contains_key(&(b.clone(), f))));
            pb.set_message(format!("{} T={seq}: drawing inputs", case.label));
            let inputs: Result<(AnyTensors, Dims)> = if any {
                guard::inputs_fit(m, opts, seq).and_then(|()| {
                    let x = m.random_inputs(&sizes(opts, seq).dims(), opts.seed)?;
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
                    let s = series.entry(key.clone()).or_default();
                    let mut p = Point {
                        mixer: case.label.clone(),
                        name: case.name.clone(),
                        config: case.config.clone(),
                        backend: backend.to_string(),
                        form,
                        seq,
                        status: Status::Skipped,
                        reason: skip.get(&key).cloned(),
                        timing: None,
                        tokens_per_s: None,
                        peak_bytes: None,
                        cache_elems: None,
                        upload_s: None,
                        download_s: None,
                        plan: None,
                    };
                    if let Ok((_, dims)) = &inputs {
                        p.plan = launch_plan(m, backend, form, dims, opts);
                    }
                    if p.reason.is_none() {
                        let outcome = match &inputs {
                            Err(e) => Err(e.clone()),
                            Ok((x, dims)) => {
                                let first = s.measured.is_empty();
                                catch_unwind(AssertUnwindSafe(|| {
                                    measure(m, backend, form, x, dims, opts, first)
                                }))
                                .unwrap_or_else(|panic| Err(Error::Numerical(panicked(panic.as_ref()))))
                            }
                        };
                        match outcome {
                            Ok(r) => {
                                p.status = Status::Ok;
                                p.tokens_per_s = Some((opts.batch * seq) as f64 / r.timing.median);
                                p.peak_bytes = r.peak;
                                p.cache_elems = r.cache;
                                p.upload_s = r.transfers.map(|t| t.0);
                                p.download_s = r.transfers.map(|t| t.1);
                                s.measured.push((seq, r.timing.median));
                                if r.timing.median > opts.max_seconds {
                                    s.stopped = Some(format!(
                                        "T = {seq} took {:.1} s > budget {} s",
                                        r.timing.median, opts.max_seconds
                                    ));
                                }
                                p.timing = Some(r.timing);
                            }
                            // Larger T need more memory still: the series stops here.
                            Err(e) if guard::is_memory(&e) => {
                                s.stopped = Some(e.to_string());
                                p.reason = Some(e.to_string());
                            }
                            Err(e) => {
                                p.status = Status::Error;
                                p.reason = Some(if inputs.is_err() {
                                    format!("inputs: {e}")
                                } else {
                                    e.to_string()
                                });
                            }
                        }
                    }
                    points.push(p);
                    pb.inc(1);
                    after_point(&report(opts, &seqs, &backends, start, &points, &notes))?;
                }
            }
        }
    }
    pb.finish_and_clear();
    Ok(report(opts, &seqs, &backends, start, &points, &notes))
}

/// The launch plan of `form` on `backend` at `dims` in the bench's mode and dtype
/// ([`mixer_registry::device_plan`], what `mixers plan` prints), where the backend's family reports
/// one. `None` otherwise, a failed plan included: the plan is reported, not a condition of the run
/// (whose own error is the point's).
fn launch_plan(
    m: &dyn mixer_core::mixer::Mixer,
    backend: &str,
    form: Form,
    dims: &Dims,
    opts: &Options,
) -> Option<serde_json::Value> {
    let b = mixer_registry::Backend::by_name(backend).ok()?;
    mixer_registry::device_plan(m, &b, form, dims, opts.dtype, opts.precision).ok().flatten()
}

/// The message of a caught panic (library code should not panic; if a form does, the bench
/// records it as a failed point and goes on).
fn panicked(payload: &(dyn std::any::Any + Send)) -> String {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into());
    format!("panicked: {msg}")
}

/// The report of the points so far.
fn report(
    opts: &Options,
    seqs: &[usize],
    backends: &[String],
    start: Instant,
    points: &[Point],
    notes: &[String],
) -> Report {
    let cpu = backends.iter().any(|b| b == "cpu");
    // The first chosen backend with a device timer describes its device.
    let device_info = backends
        .iter()
        .find_map(|b| mixer_registry::Backend::registered(b).ok()?.entry().timer)
        .and_then(|t| t.device_info().ok());
    let meta = Meta {
        version: env!("CARGO_PKG_VERSION").into(),
        dtype: opts.dtype.name().into(),
        precision: opts.precision.name().into(),
        device: device_info.as_ref().map(|i| i.0.clone()),
        driver: device_info.as_ref().and_then(|i| i.1.clone()),
        batch: opts.batch,
        heads: opts.heads,
        dim: opts.dim,
        channels: opts.heads * opts.dim,
        seqs: seqs.to_vec(),
        reps: opts.reps.max(1),
        max_seconds: opts.max_seconds,
        materialized_max_seq: MATERIALIZED_MAX_SEQ,
        backends: backends.to_vec(),
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        threads: rayon::current_num_threads(),
        timing: "cpu: wall time (std::time::Instant) around mixer_registry::run::run_with (validation \
                 included), or around decoder construction plus every decode step for `recurrent`; one \
                 untimed run first. cuda: CUDA events around the form's launches on device-resident \
                 inputs (one checked, untimed warm-up run first; upload and download reported apart, \
                 in upload_s and download_s), or around all decode steps with every token already on \
                 the device; the materialized form is the host oracle, timed on the host"
            .into(),
        memory: if alloc::counting() && cpu {
            "peak live heap bytes above the pre-run baseline (or above the lower level left when \
             memory live before the run is freed during it) during the untimed run, from a \
             counting global allocator (all threads); CUDA device memory: n/a"
                .into()
        } else {
            "n/a: the counting allocator is not installed in this binary".into()
        },
        elapsed_s: start.elapsed().as_secs_f64(),
    };
    Report {
        meta,
        points: points.to_vec(),
        fits: fits(points),
        ratios: ratios(points),
        notes: notes.to_vec(),
    }
}
