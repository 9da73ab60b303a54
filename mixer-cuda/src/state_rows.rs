//! Token rows of device tensors moved for runs from a state whose state is a prefix of the
//! sequence (attention's KV cache, the Toeplitz mixer's input history; docs/math.md §7.1): the
//! *extension* of each batch row by its own prefix, built and read on the device.
//!
//! Tensors are `[B, T, …]` with the token axis 1 (a row: the elements of one token). Batch row `b`
//! has a prefix of `P_b` tokens; its extension holds them at rows `0 … P_b − 1`, the run's `T`
//! tokens at rows `P_b … P_b + T − 1`, and zeros after, in a buffer of `n ≥ max_b P_b + T` rows
//! per batch row, so that rows of different prefixes run in one launch (a causal form's rows past
//! `P_b + T` are never read by its rows before). Prefixes stay in the state's type `F`; the run's
//! rows and the extension are in the type the kernels read (`F`, or bf16 in the bf16 mode).

use cudarc::driver::{CudaView, CudaViewMut};
use mixer_core::Result;

use crate::kernels;
use crate::pool;
use crate::runtime::{err, gpu, grid1, launch};
use crate::tensor::{DeviceScalar, DeviceTensor, GpuReal};

const WHAT: &str = "state rows";

/// Elements per token row of a `[B, T, …]` shape.
fn row(shape: &[usize]) -> usize {
    shape[2..].iter().product()
}

/// `shape` with `n` token rows.
fn with_rows(shape: &[usize], n: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    s[1] = n;
    s
}

/// The extension `[B, n, …]` in `E`: batch row `b` holds rows `0 … P_b − 1` of `prefix` (converted
/// to `E`; zeros without one), then the run's `T` rows, zeros after (`n ≥ P_b + T`).
pub(crate) fn joined<F: GpuReal, E: DeviceScalar>(
    prefix: Option<&DeviceTensor<F>>,
    run: &DeviceTensor<E>,
    lens: &[usize],
    n: usize,
) -> Result<DeviceTensor<E>> {
    let s = run.shape();
    let (t_len, w) = (s[1], row(s));
    let mut buf = pool::take::<E>(WHAT, s[0] * n * w)?;
    for (b, &l) in lens.iter().enumerate() {
        let dst = b * n * w;
        match prefix {
            Some(c) => {
                let src = b * c.shape()[1] * w;
                copy_as(&c.view().slice(src..src + l * w), &mut buf.slice_mut(dst..dst + l * w))?;
            }
            None => zero(&mut buf.slice_mut(dst..dst + l * w))?,
        }
        let (src, dst) = (b * t_len * w, dst + l * w);
        copy_as(&run.view().slice(src..src + t_len * w), &mut buf.slice_mut(dst..dst + t_len * w))?;
        zero(&mut buf.slice_mut(dst + t_len * w..(b + 1) * n * w))?;
    }
    DeviceTensor::from_pooled(buf, &with_rows(s, n))
}

/// A final state `[B, cap, …]` in `F`: batch row `b` keeps the last `keep_b` of its `P_b + T`
/// tokens (the prefix's rows, then the run's), zeros after.
pub(crate) fn finals<F: GpuReal, E: DeviceScalar>(
    prefix: Option<&DeviceTensor<F>>,
    run: &DeviceTensor<E>,
    lens: &[usize],
    keeps: &[usize],
    cap: usize,
) -> Result<DeviceTensor<F>> {
    let s = run.shape();
    let (t_len, w) = (s[1], row(s));
    let mut buf = pool::take::<F>(WHAT, s[0] * cap * w)?;
    for (b, (&l, &keep)) in lens.iter().zip(keeps).enumerate() {
        let from = l + t_len - keep; // the first kept token among the P_b + T
        let dst = b * cap * w;
        let from_prefix = l.saturating_sub(from);
        if let (Some(c), true) = (prefix, from_prefix > 0) {
            let src = (b * c.shape()[1] + from) * w;
            copy_as(
                &c.view().slice(src..src + from_prefix * w),
                &mut buf.slice_mut(dst..dst + from_prefix * w),
            )?;
        }
        let (r0, m) = (from.max(l) - l, keep - from_prefix);
        let (src, dst) = ((b * t_len + r0) * w, dst + from_prefix * w);
        copy_as(&run.view().slice(src..src + m * w), &mut buf.slice_mut(dst..dst + m * w))?;
        zero(&mut buf.slice_mut(dst + m * w..(b + 1) * cap * w))?;
    }
    DeviceTensor::from_pooled(buf, &with_rows(s, cap))
}

/// Rows `P_b … P_b + t_len − 1` of batch row `b` of an extension `ext [B, n, …]`, as `[B, t_len, …]`.
pub(crate) fn gathered<E: DeviceScalar>(
    ext: &DeviceTensor<E>,
    lens: &[usize],
    t_len: usize,
) -> Result<DeviceTensor<E>> {
    let s = ext.shape();
    let (n, w) = (s[1], row(s));
    let mut buf = pool::take::<E>(WHAT, s[0] * t_len * w)?;
    for (b, &l) in lens.iter().enumerate() {
        let (src, dst) = ((b * n + l) * w, b * t_len * w);
        copy_as(&ext.view().slice(src..src + t_len * w), &mut buf.slice_mut(dst..dst + t_len * w))?;
    }
    DeviceTensor::from_pooled(buf, &with_rows(s, t_len))
}

/// An extension's gradient `g [B, n, …]` split into the run's rows' (`[B, T, …]`) and the
/// prefix's (`[B, cap, …]`, zeros past `P_b`), with the cotangent `df [B, cap, …]` of a final state
/// made by [`finals`] added where that state copied a row (its row `i < keep_b` is the extension's
/// row `P_b + T − keep_b + i`).
pub(crate) fn split_grad<F: GpuReal>(
    g: &DeviceTensor<F>,
    df: Option<&DeviceTensor<F>>,
    lens: &[usize],
    keeps: &[usize],
    t_len: usize,
    cap: usize,
) -> Result<(DeviceTensor<F>, DeviceTensor<F>)> {
    let s = g.shape();
    let (n, w) = (s[1], row(s));
    let mut run = pool::take::<F>(WHAT, s[0] * t_len * w)?;
    let mut pre = pool::take::<F>(WHAT, s[0] * cap * w)?;
    for (b, &l) in lens.iter().enumerate() {
        let (src, dst) = ((b * n + l) * w, b * t_len * w);
        copy_as(&g.view().slice(src..src + t_len * w), &mut run.slice_mut(dst..dst + t_len * w))?;
        let (src, dst) = (b * n * w, b * cap * w);
        copy_as(&g.view().slice(src..src + l * w), &mut pre.slice_mut(dst..dst + l * w))?;
        zero(&mut pre.slice_mut(dst + l * w..(b + 1) * cap * w))?;
    }
    if let Some(df) = df {
        let gpu = gpu()?;
        let f = gpu.kernel(WHAT, &kernels::TENSOR, &[], &format!("add_into_{}", F::ELEM))?;
        let fc = df.shape()[1];
        // out[dst .. dst + m] += df[src .. src + m]
        let add = |src: usize, out: &mut pool::Pooled<F>, dst: usize, m: usize| -> Result<()> {
            if m == 0 {
                return Ok(());
            }
            let (a, mi, mut o) = (df.view().slice(src..src + m), m as i64, out.slice_mut(dst..dst + m));
            launch!(gpu, WHAT, &f, grid1(m.min(1 << 20), 256); &a, &mut o, &mi)
        };
        for (b, (&l, &keep)) in lens.iter().zip(keeps).enumerate() {
            let from = l + t_len - keep; // the extension's row of the final state's row 0
            let in_prefix = l.saturating_sub(from); // final rows 0 … in_prefix − 1 copy prefix rows
            add(b * fc * w, &mut pre, (b * cap + from) * w, in_prefix * w)?;
            let dst = (b * t_len + from.max(l) - l) * w;
            add((b * fc + in_prefix) * w, &mut run, dst, (keep - in_prefix) * w)?;
        }
    }
    Ok((
        DeviceTensor::from_pooled(run, &with_rows(s, t_len))?,
        DeviceTensor::from_pooled(pre, &with_rows(s, cap))?,
    ))
}

/// Counts (a state's lengths or positions) `[B]` as `F` on the device.
pub(crate) fn counts<F: GpuReal>(v: &[usize]) -> Result<DeviceTensor<F>> {
    let v: Vec<F> = v.iter().map(|&a| F::of(a as f64)).collect();
    DeviceTensor::<F>::upload(
        &ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[v.len()]), v)
            .map_err(|e| err(WHAT, format!("internal: counts: {e}")))?,
    )
}

/// `dst = 0` on the stream.
pub(crate) fn zero<T: DeviceScalar>(dst: &mut CudaViewMut<'_, T>) -> Result<()> {
    if !dst.is_empty() {
        gpu()?.stream().memset_zeros(dst).map_err(|e| err(WHAT, format!("zeroing: {e}")))?;
    }
    Ok(())
}

/// `dst = src` converted element by element: a device-to-device copy for one type, the
/// vectorized `f32_to_bf16` / `bf16_to_f32` (`kernels/tensor.cu`) between f32 and bf16.
pub(crate) fn copy_as<S: DeviceScalar, D: DeviceScalar>(
    src: &CudaView<'_, S>,
    dst: &mut CudaViewMut<'_, D>,
) -> Result<()> {
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    let n = src.len();
    if n != dst.len() {
        return Err(err(WHAT, format!("internal: copying {n} elements into {}", dst.len())));
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
            .map_err(|e| err(WHAT, format!("copying on the device: {e}")));
        }
        ("f32", "bf16") => "f32_to_bf16",
        ("bf16", "f32") => "bf16_to_f32",
        // The bf16 mode takes f32 states and inputs only (`f64` runs in the exact mode).
        (a, b) => return Err(err(WHAT, format!("internal: no conversion from {a} to {b}"))),
    };
    let f = g.kernel(WHAT, &kernels::TENSOR, &[], name)?;
    let ni = n as i64;
    launch!(g, WHAT, f, grid1(n.min(1 << 20), 256); src, dst, &ni)
}
