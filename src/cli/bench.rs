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
mod analysis;
mod args;
mod format;
mod measure;
mod model;
mod options;
mod plan;
mod plot;
mod report;
pub mod seq;

use std::collections::BTreeMap;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mixer_core::mixer::validate;
use mixer_core::tensor::cast_tensors;
use mixer_core::{AnyTensors, DType, Dims, Error, Form, Result};

pub use alloc::CountingAlloc;
pub use analysis::{fits, ratios};
pub(crate) use args::run;
pub use args::{Args, bench_to};
pub use model::{Fit, Meta, Point, Ratio, Report, Status, label};
pub use options::{MATERIALIZED_MAX_SEQ, Options, default_mixers};
pub use report::{render_markdown, write_outputs};
pub use seq::parse_seq;

use measure::{measure, sizes};
use options::check_options;
use plan::plan;

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
