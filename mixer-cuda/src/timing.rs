//! Timing on the device with CUDA events, for `mixers bench --backend cuda` (forward, decoding,
//! and with `--backward` the `fast` backward): inputs are
//! uploaded once (timed separately), every timed run reads and writes device tensors only,
//! and the result's download is timed separately too.
//!
//! What a kernel time includes: every launch of the form (its kernels, cuFFT transforms,
//! device-to-device copies, the bf16 conversions of a mode), between two events recorded on
//! the backend's stream. It excludes the host→device upload of the inputs, the device→host
//! download of `y`, NVRTC compilation and plan creation (a warm-up run does those), and the
//! device-side value checks of the inputs (one checked run validates the inputs first).

use std::time::Instant;

use mixer_core::mixer::Mixer;
use mixer_core::{AnyTensors, Dims, Form, Precision, Requires, Result, Tensor, Tensors};
use mixer_registry::DeviceTimer;

use crate::device_run::{
    backward_device, decoder_device, device_saves, run_device, run_device_saving, run_device_with,
};
use crate::forms::{upload_inputs, upload_one};
use crate::runtime::{err, gpu};
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};
use mixer_core::grad::{SAVED_OUTPUT, SAVED_STATISTICS};

pub use mixer_registry::DeviceTiming;

/// This backend's [`DeviceTimer`], registered in its `BackendEntry`: `mixers bench` finds it
/// through the registry.
#[derive(Debug)]
pub struct CudaTimer;

impl DeviceTimer for CudaTimer {
    /// Times `form` of `m` (`parallel` or `fast`) on device-resident copies of `inputs`: one
    /// checked warm-up run (compiles, fills the caches, validates the values), then up to `reps`
    /// event-timed runs within `budget_s` seconds.
    fn time_form(
        &self,
        m: &dyn Mixer,
        form: Form,
        inputs: &AnyTensors,
        p: Precision,
        reps: usize,
        budget_s: f64,
    ) -> Result<DeviceTiming> {
        let (dev, upload_s) = upload_timed(inputs, p)?;
        let y = run_device(m, form, &dev, p)?;
        let download_s = download(&y)?;
        drop(y);
        let v = event_times(reps, budget_s, || run_device_with(m, form, &dev, p, false))?;
        Ok(summary(v, upload_s, download_s))
    }
    /// Times the `fast` backward of `m` (every input's gradient) on device-resident copies of
    /// `inputs` and `dy` (uploaded once; `dy` as bf16 in the `bf16` mode): one warm-up run, then
    /// up to `reps` event-timed runs of [`backward_device`] within `budget_s` seconds. A time
    /// includes every launch of the backward and its device-side value checks of the inputs
    /// and `dy` (the device backward always checks them); `download_s` is that of all the
    /// gradients. As in a training step, the backward is given what the forward saves for it
    /// where the family saves anything ([`crate::run_device_saving`]: attention's statistics, with
    /// its `y`), run once before the timed runs.
    fn time_backward(
        &self,
        m: &dyn Mixer,
        inputs: &AnyTensors,
        dy: &Tensor,
        p: Precision,
        reps: usize,
        budget_s: f64,
    ) -> Result<DeviceTiming> {
        let (mut dev, upload_s) = upload_timed(inputs, p)?;
        if device_saves(m)
            && !dev.contains_key(SAVED_OUTPUT)
            && let (y, Some(stats)) = run_device_saving(m, &dev, p, false)?
        {
            dev.insert(SAVED_OUTPUT.into(), y);
            dev.insert(SAVED_STATISTICS.into(), stats);
        }
        let e0 = event()?;
        let d = match dy {
            Tensor::F32(d) => upload_one(d, p == Precision::Bf16)?,
            Tensor::F64(d) => upload_one(d, p == Precision::Bf16)?,
        };
        let e1 = event()?;
        let upload_s = upload_s + seconds(&e0, &e1)?;
        let g = backward_device(m, &dev, &d, &Requires::All, p)?;
        gpu()?.sync("timing")?;
        let t0 = Instant::now();
        for v in g.values() {
            download(v)?;
        }
        let download_s = t0.elapsed().as_secs_f64();
        drop(g);
        let v = event_times(reps, budget_s, || backward_device(m, &dev, &d, &Requires::All, p))?;
        Ok(summary(v, upload_s, download_s))
    }
    /// Times decoding every token of `inputs` with the device decoder (all tokens uploaded
    /// first, one event pair around the whole loop); also returns the final cache size.
    fn time_decode(
        &self,
        m: &dyn Mixer,
        inputs: &AnyTensors,
        dims: &Dims,
        reps: usize,
        budget_s: f64,
    ) -> Result<(DeviceTiming, usize)> {
        match inputs {
            AnyTensors::F32(x) => decode_typed(m, x, AnyTensors::F32, dims, reps, budget_s),
            AnyTensors::F64(x) => decode_typed(m, x, AnyTensors::F64, dims, reps, budget_s),
        }
    }
    /// The device's name and the driver's version, for reports.
    fn device_info(&self) -> Result<(String, Option<String>)> {
        Ok((gpu()?.name.clone(), crate::runtime::driver_version()))
    }
}

/// The event-timed seconds of up to `reps` calls of `run` (at least one) within `budget_s`
/// seconds: an event on the backend's stream before and after each call, whose result is dropped
/// after the second. Warm up first (compilation, plans, the pool).
pub fn event_times<R>(reps: usize, budget_s: f64, mut run: impl FnMut() -> Result<R>) -> Result<Vec<f64>> {
    let start = Instant::now();
    let mut v = Vec::new();
    while v.is_empty() || (v.len() < reps.max(1) && start.elapsed().as_secs_f64() < budget_s) {
        let e0 = event()?;
        let r = run()?;
        let e1 = event()?;
        v.push(seconds(&e0, &e1)?);
        drop(r);
    }
    Ok(v)
}

/// The median of [`event_times`] after one warm-up call of `run` (compilation, plans, the pool),
/// in seconds: what the benches report per shape.
pub fn median_event_time<R>(reps: usize, budget_s: f64, mut run: impl FnMut() -> Result<R>) -> Result<f64> {
    drop(run()?);
    let mut v = event_times(reps, budget_s, run)?;
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// The options of this crate's benches from the command line: `--quick` (the first shapes only)
/// and `--reps N` (timed calls per measurement, default 20).
pub fn bench_options() -> (bool, usize) {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let reps = args
        .iter()
        .position(|a| a == "--reps")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    (quick, reps)
}

/// Records an event on the backend's stream.
fn event() -> Result<cudarc::driver::CudaEvent> {
    let g = gpu()?;
    g.stream()
        .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| err("timing", format!("recording an event: {e}")))
}

fn seconds(a: &cudarc::driver::CudaEvent, b: &cudarc::driver::CudaEvent) -> Result<f64> {
    crate::runtime::count_sync();
    Ok(f64::from(a.elapsed_ms(b).map_err(|e| err("timing", format!("event timing: {e}")))?) * 1e-3)
}

fn download(y: &AnyDeviceTensor) -> Result<f64> {
    gpu()?.sync("timing")?;
    let t0 = Instant::now();
    match y {
        AnyDeviceTensor::F32(t) => drop(t.to_host()?),
        AnyDeviceTensor::F64(t) => drop(t.to_host()?),
        AnyDeviceTensor::Bf16(t) => drop(t.to_host()?),
    }
    Ok(t0.elapsed().as_secs_f64())
}

fn summary(mut v: Vec<f64>, upload_s: f64, download_s: f64) -> DeviceTiming {
    v.sort_by(f64::total_cmp);
    DeviceTiming {
        median: v[v.len() / 2],
        min: v[0],
        max: v[v.len() - 1],
        reps: v.len(),
        upload_s,
        download_s,
    }
}

fn upload_timed(inputs: &AnyTensors, p: Precision) -> Result<(DeviceTensors, f64)> {
    let e0 = event()?;
    let dev = match inputs {
        AnyTensors::F32(t) => upload_inputs(t, p)?,
        AnyTensors::F64(t) => upload_inputs(t, p)?,
    };
    let e1 = event()?;
    Ok((dev, seconds(&e0, &e1)?))
}

/// The per-token device inputs of every position, and the static inputs on the host.
fn tokens<F: GpuReal>(m: &dyn Mixer, x: &Tensors<F>) -> Result<(Vec<DeviceTensors>, Tensors<F>)> {
    let per_token = m.spec().per_token();
    let t_len = x
        .iter()
        .find(|(k, _)| per_token.contains(k))
        .map(|(_, v)| v.shape().get(1).copied().unwrap_or(0))
        .unwrap_or(0);
    let statics =
        x.iter().filter(|(k, _)| !per_token.contains(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    let toks = (0..t_len)
        .map(|t| {
            x.iter()
                .filter(|(k, _)| per_token.contains(k))
                .map(|(k, v)| {
                    let a = v.index_axis(ndarray::Axis(1), t).to_owned();
                    Ok((k.clone(), F::wrap(DeviceTensor::upload(&a)?)))
                })
                .collect::<Result<DeviceTensors>>()
        })
        .collect::<Result<_>>()?;
    Ok((toks, statics))
}

fn decode_typed<F: GpuReal>(
    m: &dyn Mixer,
    x: &Tensors<F>,
    any: impl Fn(Tensors<F>) -> AnyTensors,
    dims: &Dims,
    reps: usize,
    budget_s: f64,
) -> Result<(DeviceTiming, usize)> {
    let t0 = Instant::now();
    let (toks, statics) = tokens(m, x)?;
    gpu()?.sync("timing")?;
    let upload_s = t0.elapsed().as_secs_f64();
    let statics = any(statics);
    let run = |timed: bool| -> Result<(f64, Option<AnyDeviceTensor>, usize)> {
        let mut dec = decoder_device(m, &statics, dims)?;
        let e0 = event()?;
        let mut last = None;
        for tok in &toks {
            last = Some(dec.step(tok)?);
        }
        let e1 = event()?;
        let s = if timed { seconds(&e0, &e1)? } else { 0.0 };
        Ok((s, last, dec.cache_elems()))
    };
    let (_, last, cache) = run(false)?;
    let download_s = match &last {
        Some(y) => download(y)?,
        None => 0.0,
    };
    let start = Instant::now();
    let mut v = Vec::new();
    while v.is_empty() || (v.len() < reps.max(1) && start.elapsed().as_secs_f64() < budget_s) {
        v.push(run(true)?.0);
    }
    Ok((summary(v, upload_s, download_s), cache))
}
