//! Measuring one point: an untimed run (peak memory, cache size), then timed runs.

use std::time::Instant;

use mixer_core::mixer::{Mixer, run_decoder};
use mixer_core::{AnyTensors, Dims, Form, Result};
use mixer_registry::Backend;
use mixer_registry::harness::Sizes;
use mixer_registry::run::{decoder, run as run_form};

use super::alloc;
use super::options::Options;
use crate::timing::{Timing, time};

/// One run of a form; returns the decoder's cache size for `recurrent`.
fn run_once(
    m: &dyn Mixer,
    backend: &Backend,
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

pub(crate) struct Measured {
    pub(crate) timing: Timing,
    pub(crate) peak: Option<usize>,
    pub(crate) cache: Option<usize>,
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
    let name = backend;
    let backend = &Backend::by_name(name)?;
    if first {
        run_once(m, backend, form, inputs, dims)?;
    }
    let t0 = Instant::now();
    let (r, peak) = alloc::measure(|| run_once(m, backend, form, inputs, dims));
    let once = t0.elapsed().as_secs_f64();
    let cache = r?;
    let peak = if name == "cpu" { peak } else { None };
    let timing = if once > opts.max_seconds {
        Timing { median: once, min: once, max: once, reps: 1 }
    } else {
        time(0, opts.reps.max(1), opts.max_seconds, || run_once(m, backend, form, inputs, dims))
    };
    Ok(Measured { timing, peak, cache })
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
