//! `mixers bench --backward`: backward/forward time ratio per mixer and length, and the
//! scaling exponents of both passes (the fast forms, on each backend that has a fast
//! backward). Inputs from `Mixer::random_inputs`, a standard-normal cotangent; median of
//! `reps` timed runs after one untimed run, in `--precision`'s mode. A backend with a device
//! timer (CUDA) is timed by device events on device-resident inputs and `dy`
//! ([`DeviceTimer::time_form`], [`DeviceTimer::time_backward`]); others on the host clock
//! around the host-array calls.

use mixer_core::mixer::{Mixer, validate};
use mixer_core::spec::{Gen, draw};
use mixer_core::tensor::cast_tensors;
use mixer_core::{AnyTensors, DType, Error, Form, Precision, Requires, Result, Tensor};
use mixer_registry::backward::{backward_forms, backward_with};
use mixer_registry::{Backend, DeviceTimer};
use rand::SeedableRng;

use super::{Options, default_mixers, label, sizes};
use crate::table::markdown;
use mixers::timing::{fit_exponent, time};

/// Lengths measured when `--seq` is left at its default.
pub const DEFAULT_SEQS: [usize; 3] = [4096, 8192, 16384];

/// One measured point.
struct Point {
    seq: usize,
    fwd: f64,
    bwd: f64,
}

fn fmt_exp(pts: &[Point], f: impl Fn(&Point) -> f64) -> String {
    let xs: Vec<f64> = pts.iter().map(|p| p.seq as f64).collect();
    let ys: Vec<f64> = pts.iter().map(f).collect();
    fit_exponent(&xs, &ys).map_or("-".into(), |(b, se)| format!("{b:.2} ± {se:.2}"))
}

/// Runs the measurement and prints two tables (points, then exponents); exit code 1 when a
/// run failed.
pub(crate) fn run(opts: &Options) -> Result<i32> {
    let mixers = if opts.mixers.is_empty() { default_mixers(opts.heads) } else { opts.mixers.clone() };
    let backends: Vec<Backend> = if opts.backends.is_empty() {
        Backend::available()
    } else {
        opts.backends.iter().map(|b| Backend::by_name(b)).collect::<Result<_>>()?
    };
    let (mut rows, mut fits, mut failed) = (Vec::new(), Vec::new(), 0);
    for (name, cfg) in &mixers {
        let m = mixer_registry::mixer(name, cfg)?;
        let lab = label(name, cfg);
        for b in &backends {
            if !backward_forms(m.as_ref(), b.name()).contains(&Form::Fast) {
                rows.push(vec![
                    lab.clone(),
                    b.name().into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "no fast backward".into(),
                ]);
                continue;
            }
            let mut pts = Vec::new();
            for &seq in &opts.seqs {
                let x = m.random_inputs(&sizes(opts, seq).dims(), opts.seed)?;
                let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed ^ 0xb4c);
                let dy = draw(Gen::Normal(1.0), x[m.spec().mixed].shape(), &mut rng);
                let (inputs, dy) = match opts.dtype {
                    DType::F64 => (AnyTensors::F64(x), Tensor::F64(dy)),
                    DType::F32 => {
                        (AnyTensors::F32(cast_tensors::<f32>(&x)), Tensor::F32(dy.mapv(|v| v as f32)))
                    }
                };
                validate(m.as_ref(), &inputs)?;
                let (fwd, bwd, err) = match b.entry().timer {
                    Some(timer) => device_times(timer, m.as_ref(), b, &inputs, &dy, opts),
                    None => host_times(m.as_ref(), b, &inputs, &dy, opts),
                };
                if let Some(e) = err {
                    failed += 1;
                    rows.push(vec![
                        lab.clone(),
                        b.name().into(),
                        seq.to_string(),
                        "-".into(),
                        "-".into(),
                        format!("FAIL: {e}"),
                    ]);
                    break;
                }
                rows.push(vec![
                    lab.clone(),
                    b.name().into(),
                    seq.to_string(),
                    format!("{:.2}", fwd * 1e3),
                    format!("{:.2}", bwd * 1e3),
                    format!("{:.2}", bwd / fwd),
                ]);
                pts.push(Point { seq, fwd, bwd });
                if bwd > opts.max_seconds {
                    break;
                }
            }
            fits.push(vec![lab.clone(), b.name().into(), fmt_exp(&pts, |p| p.fwd), fmt_exp(&pts, |p| p.bwd)]);
        }
    }
    println!(
        "backward (all input gradients) vs forward, fast forms, {} {} B={} H={} D={}\n",
        opts.dtype.name(),
        opts.precision,
        opts.batch,
        opts.heads,
        opts.dim
    );
    for b in &backends {
        let how = if b.entry().timer.is_some() {
            "device events around runs on device-resident inputs and dy (uploaded once; transfers \
             excluded; the backward includes its device-side value checks of the inputs and dy, \
             and is given the forward's output where it reads it, as in a training step)"
        } else {
            "wall time of the host-array calls (validation included; the backward is given the \
             forward's output where it reads it, as in a training step)"
        };
        println!("{}: {how}", b.name());
    }
    println!();
    print!(
        "{}",
        markdown(&["mixer", "backend", "T", "forward ms", "backward ms", "backward/forward"], &rows)
    );
    println!();
    print!("{}", markdown(&["mixer", "backend", "forward exponent", "backward exponent"], &fits));
    if rows.is_empty() {
        return Err(Error::Io("nothing to measure".into()));
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

/// Forward and backward medians (seconds) timed on the host clock around the host-array calls,
/// and the first error.
fn host_times(
    m: &dyn Mixer,
    b: &Backend,
    inputs: &AnyTensors,
    dy: &Tensor,
    opts: &Options,
) -> (f64, f64, Option<Error>) {
    let mut err = None;
    let p = opts.precision;
    let fwd = time(1, opts.reps, opts.max_seconds, || {
        mixer_registry::run::run_with(m, b, Form::Fast, inputs, p).map_err(|e| err = Some(e))
    });
    let saved = match training_inputs(m, b, inputs, p) {
        Ok(x) => x,
        Err(e) => return (fwd.median, 0.0, Some(e)),
    };
    let bwd = time(1, opts.reps, opts.max_seconds, || {
        backward_with(m, b.name(), Form::Fast, &saved, dy, &Requires::All, p).map_err(|e| err = Some(e))
    });
    (fwd.median, bwd.median, err)
}

/// The backward's inputs in a training step: with the forward's output `y` under
/// `SAVED_OUTPUT` (dtypes as the forward gives them) where the backward reads it (the GLR's
/// `d_beta`, which then does not recompute it), else `inputs`.
fn training_inputs(m: &dyn Mixer, b: &Backend, inputs: &AnyTensors, p: Precision) -> Result<AnyTensors> {
    if !m.backward_reads_output() {
        return Ok(inputs.clone());
    }
    let y = mixer_registry::run::run_with(m, b, Form::Fast, inputs, p)?;
    let name = mixer_core::grad::SAVED_OUTPUT.to_string();
    Ok(match (inputs.clone(), y) {
        (AnyTensors::F32(mut x), Tensor::F32(y)) => {
            x.insert(name, y);
            AnyTensors::F32(x)
        }
        (AnyTensors::F64(mut x), Tensor::F64(y)) => {
            x.insert(name, y);
            AnyTensors::F64(x)
        }
        (x, _) => x,
    })
}

/// Forward and backward medians (seconds) from the backend's device timer (events around
/// device-resident runs), and the first error.
fn device_times(
    timer: &dyn DeviceTimer,
    m: &dyn Mixer,
    b: &Backend,
    inputs: &AnyTensors,
    dy: &Tensor,
    opts: &Options,
) -> (f64, f64, Option<Error>) {
    let (p, reps, budget) = (opts.precision, opts.reps, opts.max_seconds);
    // The backward of a training step (given the forward's output where it reads it).
    let r = timer.time_form(m, Form::Fast, inputs, p, reps, budget).and_then(|f| {
        let saved = training_inputs(m, b, inputs, p)?;
        let g = timer.time_backward(m, &saved, dy, p, reps, budget)?;
        Ok((f.median, g.median))
    });
    match r {
        Ok((f, g)) => (f, g, None),
        Err(e) => (0.0, 0.0, Some(e)),
    }
}
