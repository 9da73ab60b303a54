//! Measuring one point: an untimed run (peak memory, cache size), then timed runs.

use std::time::Instant;

use mixer_core::mixer::{Mixer, run_decoder};
use mixer_core::{AnyTensors, Dims, Form, Precision, Result};
use mixer_registry::harness::Sizes;
use mixer_registry::run::{decoder, run_with};
use mixer_registry::{Backend, DeviceTimer};

use super::alloc;
use super::options::Options;
use mixers::timing::{Timing, time};

/// One run of a form; returns the decoder's cache size for `recurrent`.
fn run_once(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    inputs: &AnyTensors,
    dims: &Dims,
    precision: Precision,
) -> Result<Option<usize>> {
    if form != Form::Recurrent {
        let y = run_with(m, backend, form, inputs, precision)?;
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

pub(crate) struct Measured {
    pub(crate) timing: Timing,
    pub(crate) peak: Option<usize>,
    pub(crate) cache: Option<usize>,
    /// CUDA: (upload, download) seconds, measured apart from `timing`.
    pub(crate) transfers: Option<(f64, f64)>,
}

/// The measurement of a backend that registered a device timer: device-resident inputs,
/// device events (see the backend's timer, e.g. `mixer_cuda::timing`, for what a time
/// includes). The materialized form is the host oracle and is timed on the host like any
/// other backend's.
fn measure_device(
    timer: &dyn DeviceTimer,
    m: &dyn Mixer,
    form: Form,
    inputs: &AnyTensors,
    dims: &Dims,
    opts: &Options,
) -> Result<Measured> {
    let (t, cache) = if form == Form::Recurrent {
        let (t, c) = timer.time_decode(m, inputs, dims, opts.reps, opts.max_seconds)?;
        (t, Some(c))
    } else {
        (timer.time_form(m, form, inputs, opts.precision, opts.reps, opts.max_seconds)?, None)
    };
    Ok(Measured {
        timing: Timing { median: t.median, min: t.min, max: t.max, reps: t.reps },
        peak: None,
        cache,
        transfers: Some((t.upload_s, t.download_s)),
    })
}

/// An untimed run that measures memory and cache size, then timed runs. The first point of
/// a series gets one more untimed run before that, so that one-time setup (FFT plans,
/// thread pools, kernel compilation, allocator arenas) is neither timed nor counted. A
/// point whose measured run already took more than `max_seconds` is timed by that run.
pub(crate) fn measure(
    m: &dyn Mixer,
    backend: &str,
    form: Form,
    inputs: &AnyTensors,
    dims: &Dims,
    opts: &Options,
    first: bool,
) -> Result<Measured> {
    let backend = &Backend::by_name(backend)?;
    let timer = backend.entry().timer;
    if let Some(timer) = timer
        && form != Form::Materialized
    {
        return measure_device(timer, m, form, inputs, dims, opts);
    }
    let p = opts.precision;
    if first {
        run_once(m, backend, form, inputs, dims, p)?;
    }
    let t0 = Instant::now();
    let (r, peak) = alloc::measure(|| run_once(m, backend, form, inputs, dims, p));
    let once = t0.elapsed().as_secs_f64();
    let cache = r?;
    // Peak heap memory describes a host backend's run; a device backend's lives elsewhere.
    let peak = if timer.is_none() { peak } else { None };
    let timing = if once > opts.max_seconds {
        Timing { median: once, min: once, max: once, reps: 1 }
    } else {
        time(0, opts.reps.max(1), opts.max_seconds, || run_once(m, backend, form, inputs, dims, p))
    };
    Ok(Measured { timing, peak, cache, transfers: None })
}

pub(crate) fn sizes(opts: &Options, seq: usize) -> Sizes {
    Sizes {
        batch: opts.batch,
        seq,
        channels: opts.heads * opts.dim,
        heads: opts.heads,
        dk: opts.dim,
        dv: opts.dim,
    }
}
