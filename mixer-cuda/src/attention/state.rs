//! Attention from a KV cache on CUDA (docs/math.md §7.1), the `fast` form from a state: the run's
//! `T` queries against the cached keys and the run's own, without computing the cached tokens'
//! rows again (the extension's `O((ℓ + T)²)` work becomes `O((ℓ + T)·T)`).
//!
//! Batch row `b` with `ℓ_b` cached tokens reads the keys `[k_cache[b, 0 … ℓ_b − 1]; k[b]]` (and
//! the values alike) from one buffer of `R ≥ ℓ_b + T` token rows per batch row, and the forward
//! kernels are told that its query `t` sits at position `ℓ_b + t` among them ([`Keys`]); every
//! kernel of the plain run takes them (the FMA kernel, the split-tf32, tf32 and bf16 tensor-core
//! kernels). Without a window, in the state's own element type (the `exact` and `tf32` modes),
//! that buffer is the final cache itself (capacity `N ≥ ℓ_b + T`, its rows from `ℓ_b + T` on zero):
//! the cached rows are copied once. With a window (the final cache keeps the last `w − 1` tokens)
//! or in the `bf16` mode (the kernels read bf16 keys; the cache stays in `F`) the keys are put
//! together in a buffer of `max_b ℓ_b + T` rows in the kernels' type and the final cache is copied
//! from the cache's rows and the run's.
//!
//! The lengths are read back to the host (`B` numbers: the launch needs them) and checked as the
//! host checks them (whole numbers, `ℓ + T ≤ N` without a window); the cache rows past a length
//! are not read (the host path also refuses a cache whose rows there are not zero).

use cudarc::driver::{CudaView, CudaViewMut};
use mixer_core::mixers::attention::Attention;
use mixer_core::mixers::attention::state::{LENGTH, check_lengths, final_len};
use mixer_core::{Precision, Result};

use super::common::{FAMILY, Keys};
use super::fast::run_keys;
use crate::forms::input;
use crate::kernels;
use crate::pool;
use crate::runtime::{err, gpu, grid1, launch};
use crate::tensor::{AnyDeviceTensor, DeviceScalar, DeviceTensor, DeviceTensors, GpuReal, bf16};

/// `y` and the final cache of `a`'s `fast` form from the cache `s0` (`None`: empty) on device
/// tensors in mode `p` (module documentation): `q`, `k`, `v` as the mode stores them, the cache
/// `k [B, N, H, Dk]`, `v [B, N, H, Dv]`, `length [B]` in `F`.
pub fn run_from<F: GpuReal>(
    a: &Attention,
    x: &DeviceTensors,
    s0: Option<&DeviceTensors>,
    p: Precision,
) -> Result<(AnyDeviceTensor, DeviceTensors)> {
    let q = x.get("q").ok_or_else(|| err(FAMILY, "internal: no `q`"))?;
    let [b, t_len] = [q.shape()[0], q.shape()[1]];
    let cache = match s0 {
        Some(s) => {
            let (kc, vc, l) = (input::<F>(s, "k")?, input::<F>(s, "v")?, input::<F>(s, LENGTH)?);
            let n = kc.shape()[1];
            let lens = check_lengths(a, l.to_host()?.iter().map(|v| v.f64()), n, t_len)?;
            Some((kc.into_owned(), vc.into_owned(), lens, n))
        }
        None => None,
    };
    let (lens, cap) = match &cache {
        Some((_, _, lens, n)) => (lens.clone(), *n),
        None => (vec![0; b], a.window().map_or(t_len, |w| w - 1)),
    };
    let cached = cache.as_ref().map(|(k, v, _, _)| (k, v));
    match q {
        AnyDeviceTensor::Bf16(_) => run_typed::<F, bf16>(a, x, cached, &lens, cap, p),
        _ => run_typed::<F, F>(a, x, cached, &lens, cap, p),
    }
}

/// [`run_from`] with the run's activations in `E` (`F`, or bf16 in the bf16 mode).
fn run_typed<F: GpuReal, E: DeviceScalar>(
    a: &Attention,
    x: &DeviceTensors,
    cache: Option<(&DeviceTensor<F>, &DeviceTensor<F>)>,
    lens: &[usize],
    cap: usize,
    p: Precision,
) -> Result<(AnyDeviceTensor, DeviceTensors)> {
    let run = |name: &str| -> Result<&DeviceTensor<E>> {
        let t = x.get(name).ok_or_else(|| err(FAMILY, format!("internal: no `{name}`")))?;
        E::unwrap(t).ok_or_else(|| err(FAMILY, format!("`{name}` is {}, `q` is {}", t.dtype(), E::ELEM)))
    };
    let (k, v) = (run("k")?, run("v")?);
    let t_len = k.shape()[1];
    let keeps: Vec<usize> = lens.iter().map(|&l| final_len(a, l, t_len)).collect();
    let longest = lens.iter().copied().max().unwrap_or(0);
    let g = gpu()?;
    let prefix: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
    let prefix =
        g.stream().clone_htod(&prefix).map_err(|e| err(FAMILY, format!("uploading the lengths: {e}")))?;
    // The final cache is the key buffer where nothing is dropped and no type changes.
    let in_place = a.window().is_none() && E::ELEM == F::ELEM;
    let rows = if in_place { cap } else { longest + t_len };
    let (kc, vc) = (cache.map(|c| c.0), cache.map(|c| c.1));
    let kx = joined::<F, E>(kc, k, lens, rows)?;
    let vx = joined::<F, E>(vc, v, lens, rows)?;
    let mut inputs = DeviceTensors::new();
    for (name, t) in x {
        let t = match name.as_str() {
            "k" => E::wrap(kx.clone()),
            "v" => E::wrap(vx.clone()),
            _ => t.clone(),
        };
        inputs.insert(name.clone(), t);
    }
    let keys = Keys { prefix: &prefix, rows, longest };
    let y = run_keys::<F>(a, &inputs, p, Some(&keys))?;
    let (kf, vf) = if in_place {
        (unwrap_as::<E, F>(&kx)?, unwrap_as::<E, F>(&vx)?)
    } else {
        (finals::<F, E>(kc, k, lens, &keeps, cap)?, finals::<F, E>(vc, v, lens, &keeps, cap)?)
    };
    let fl: Vec<F> = keeps.iter().map(|&l| F::of(l as f64)).collect();
    let fl = DeviceTensor::<F>::upload(
        &ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[fl.len()]), fl)
            .map_err(|e| err(FAMILY, format!("internal: lengths: {e}")))?,
    )?;
    let fin =
        [("k", kf), ("v", vf), (LENGTH, fl)].into_iter().map(|(n, t)| (n.to_string(), F::wrap(t))).collect();
    Ok((y, fin))
}

/// `t` as the same tensor of type `B` (`A` and `B` the same type here).
fn unwrap_as<A: DeviceScalar, B: DeviceScalar>(t: &DeviceTensor<A>) -> Result<DeviceTensor<B>> {
    B::unwrap(&A::wrap(t.clone())).cloned().ok_or_else(|| err(FAMILY, "internal: key buffer of another type"))
}

/// `[B, rows, H, D]` in `E`: batch row `b` holds the cache's first `ℓ_b` rows (converted) and
/// then the run's `T`, zeros after.
fn joined<F: GpuReal, E: DeviceScalar>(
    cache: Option<&DeviceTensor<F>>,
    run: &DeviceTensor<E>,
    lens: &[usize],
    rows: usize,
) -> Result<DeviceTensor<E>> {
    let s = run.shape();
    let (t_len, w) = (s[1], s[2] * s[3]);
    let mut buf = pool::take::<E>(FAMILY, s[0] * rows * w)?;
    for (b, &l) in lens.iter().enumerate() {
        let dst = b * rows * w;
        if let Some(c) = cache {
            let src = b * c.shape()[1] * w;
            copy_as(&c.view().slice(src..src + l * w), &mut buf.slice_mut(dst..dst + l * w))?;
        }
        let (src, dst) = (b * t_len * w, dst + l * w);
        copy_as(&run.view().slice(src..src + t_len * w), &mut buf.slice_mut(dst..dst + t_len * w))?;
        zero(&mut buf.slice_mut(dst + t_len * w..(b + 1) * rows * w))?;
    }
    DeviceTensor::from_pooled(buf, &[s[0], rows, s[2], s[3]])
}

/// The final cache `[B, cap, H, D]` in `F`: batch row `b` keeps the last `keep_b` of its
/// `ℓ_b + T` tokens (the cache's rows, then the run's), zeros after.
fn finals<F: GpuReal, E: DeviceScalar>(
    cache: Option<&DeviceTensor<F>>,
    run: &DeviceTensor<E>,
    lens: &[usize],
    keeps: &[usize],
    cap: usize,
) -> Result<DeviceTensor<F>> {
    let s = run.shape();
    let (t_len, w) = (s[1], s[2] * s[3]);
    let mut buf = pool::take::<F>(FAMILY, s[0] * cap * w)?;
    for (b, (&l, &keep)) in lens.iter().zip(keeps).enumerate() {
        let from = l + t_len - keep; // the first kept token among the ℓ_b + T
        let dst = b * cap * w;
        let from_cache = l.saturating_sub(from);
        if let (Some(c), true) = (cache, from_cache > 0) {
            let src = (b * c.shape()[1] + from) * w;
            copy_as(
                &c.view().slice(src..src + from_cache * w),
                &mut buf.slice_mut(dst..dst + from_cache * w),
            )?;
        }
        let (r0, n) = (from.max(l) - l, keep - from_cache);
        let (src, dst) = ((b * t_len + r0) * w, dst + from_cache * w);
        copy_as(&run.view().slice(src..src + n * w), &mut buf.slice_mut(dst..dst + n * w))?;
        zero(&mut buf.slice_mut(dst + n * w..(b + 1) * cap * w))?;
    }
    DeviceTensor::from_pooled(buf, &[s[0], cap, s[2], s[3]])
}

/// `dst = 0` on the stream.
fn zero<T: DeviceScalar>(dst: &mut CudaViewMut<'_, T>) -> Result<()> {
    if dst.len() > 0 {
        gpu()?.stream().memset_zeros(dst).map_err(|e| err(FAMILY, format!("zeroing: {e}")))?;
    }
    Ok(())
}

/// `dst = src` converted element by element: a device-to-device copy for one type, the
/// vectorized `f32_to_bf16` / `bf16_to_f32` and `copy_as_*` for f64 (`kernels/tensor.cu`).
fn copy_as<S: DeviceScalar, D: DeviceScalar>(
    src: &CudaView<'_, S>,
    dst: &mut CudaViewMut<'_, D>,
) -> Result<()> {
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    let n = src.len();
    if n != dst.len() {
        return Err(err(FAMILY, format!("internal: copying {n} elements into {}", dst.len())));
    }
    if n == 0 {
        return Ok(());
    }
    let g = gpu()?;
    let name = match (S::ELEM, D::ELEM) {
        (a, b) if a == b => {
            let stream = g.stream();
            let (sp, _read) = src.device_ptr(&stream);
            let (dp, _write) = dst.device_ptr_mut(&stream);
            // SAFETY: two live device buffers of n elements of one type, ordered on the stream.
            return unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    dp,
                    sp,
                    n * std::mem::size_of::<S>(),
                    stream.cu_stream(),
                )
            }
            .map_err(|e| err(FAMILY, format!("copying on the device: {e}")));
        }
        ("f32", "bf16") => "f32_to_bf16".to_string(),
        ("bf16", "f32") => "bf16_to_f32".to_string(),
        (a, b) => format!("copy_as_{a}_{b}"),
    };
    let f = g.kernel(FAMILY, &kernels::TENSOR, &[], &name)?;
    let ni = n as i64;
    launch!(g, FAMILY, f, grid1(n.min(1 << 20), 256); src, dst, &ni)
}
