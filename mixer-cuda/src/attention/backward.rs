//! The backward pass of attention's `fast` form on CUDA (`kernels/attention_backward.cu`),
//! FlashAttention-2 style: the softmax is recomputed tile by tile from per-row statistics,
//! never stored as a `T × T` matrix.
//!
//! With the keys `u_{t,s} = sign(σ)·(q_t · k_s)`, the row maximum `M_t = max_s u_{t,s}` and
//! `ℓ_t = Σ_s e^{|σ|(u_{t,s} − M_t)}` over the visible keys (`s ≤ t`, `t − s < w`):
//! `P_{t,s} = e^{|σ|(u_{t,s} − M_t) − ln ℓ_t}` (the CPU's `e^{σ q_t·k_s − LSE_t}` with
//! `LSE_t = |σ| M_t + ln ℓ_t`, kept in two parts so that it cannot overflow),
//! `D_t = dy_t · y_t`, `dS_{t,s} = P_{t,s}(dy_t · v_s − D_t)`, and
//! `dv_s = Σ_t P_{t,s} dy_t`, `dk_s = σ Σ_t dS_{t,s} q_t`, `dq_t = σ Σ_s dS_{t,s} k_s`.
//!
//! Three launches, each deterministic (every output element is summed by one thread in a fixed
//! order, no atomics): `atb_stats` (one block per (batch·head, query tile): the forward with an
//! online softmax, keeping `M`, `ln ℓ` and `D`, `y` never written), `atb_dkdv` (one block per
//! (batch·head, key tile), looping over the query tiles that see it) and `atb_dq` (one block per
//! (batch·head, query tile), looping over the key tiles it sees). Tiles of `B_t` queries and
//! `B_t` keys in shared memory, 256 threads, each computing an `B_t/16 × B_t/16` register tile
//! of the scores and `B_t/16` rows of its accumulators in `f32` (`f64` for `f64` inputs) FMA.
//! `B_t` is 64 where `Dk, Dv ≤ 128` and the tiles fit in shared memory, else 32 or 16
//! ([`tile`]); any `Dk, Dv ≤ 256`. Extra memory: `M` (`f64`), `ln ℓ` and `D`, `B·H·T` each.
//!
//! Precision: every mode runs the tensor-core kernels of [`super::backward_fused`] where its plan
//! applies (`Dk = Dv ∈ {32, 64, 96, 128}`, `f32` inputs in the exact and tf32 modes, bf16 in bf16,
//! a positive scale; the exact mode's products split into three tf32 products), and these FMA
//! kernels elsewhere (bf16 activations and `dy` converted on the device; `f64` inputs). In the
//! exact mode they are also launched after the tensor-core kernels, into the same gradients, to
//! run only where the forward found a `q·k` beyond f32's range ([`Fallback`]); the gradients are
//! `f32` for `f32` and bf16 inputs.

use cudarc::driver::LaunchConfig;
use mixer_core::grad::{SAVED_OUTPUT, SAVED_STATISTICS};
use mixer_core::mixers::attention::Attention;
use mixer_core::{Error, Precision, Requires, Result, grad_name};

use super::backward_fused;
use super::common::{FAMILY, Storage, window_arg};
use crate::forms::{cotangent, input};
use crate::kernels;
use crate::pool;
use crate::runtime::{check_elems, err, gpu, int, launch, max_dynamic_smem, opt_in};
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// Threads per block (`ATB_THREADS`).
const THREADS: u32 = 256;
/// The largest head dim the kernels take.
pub const MAX_HEAD_DIM: usize = 256;

/// Shared memory of `atb_dkdv` / `atb_dq` (the larger kernels) at tile `bt`: `M` in `f64`, the
/// `q, k` tiles with odd row strides, the `dy, v` tiles, `P` and `dS`, `ln ℓ` and `D`.
pub fn smem(bt: usize, dk: usize, dv: usize, elem: usize) -> usize {
    let (sk, sv, sp) = (dk | 1, dv | 1, bt + 1);
    8 * bt + elem * (2 * bt * sk + 2 * bt * sv + 2 * bt * sp + 2 * bt)
}

/// The tile (`B_t` queries and keys) for these head dims and scalar size on this device: 64
/// where `Dk, Dv ≤ 128` (registers: at most 64 accumulators a thread), else 32; halved while
/// the tiles do not fit in the device's shared memory (down to 16).
pub fn tile(dk: usize, dv: usize, elem: usize) -> Result<usize> {
    if dk.max(dv) > MAX_HEAD_DIM {
        return Err(err(
            FAMILY,
            format!("the CUDA backward takes head dims up to {MAX_HEAD_DIM}, got Dk = {dk}, Dv = {dv}"),
        ));
    }
    let mut bt = if dk.max(dv) <= 128 { 64 } else { 32 };
    while smem(bt, dk, dv, elem) > max_dynamic_smem() {
        if bt == 16 {
            return Err(err(
                FAMILY,
                format!(
                    "the backward's tiles for Dk = {dk}, Dv = {dv} need {} bytes of shared memory; \
                     this device allows {}",
                    smem(bt, dk, dv, elem),
                    max_dynamic_smem()
                ),
            ));
        }
        bt /= 2;
    }
    Ok(bt)
}

/// The `fast` backward on device tensors: `d_q`, `d_k`, `d_v` (those `req` asks for), `F`
/// storage, nothing waited for.
pub fn run<F: GpuReal>(
    a: &Attention,
    x: &DeviceTensors,
    dy: &AnyDeviceTensor,
    req: &Requires,
    p: Precision,
) -> Result<DeviceTensors> {
    if let Some(out) = tensor_cores(a, x, dy, req, p)? {
        return Ok(out);
    }
    run_fma::<F>(a, x, dy, req)
}

/// The FMA kernels' backward in any case (the tensor-core paths' reference in the GPU tests).
pub fn run_fma<F: GpuReal>(
    a: &Attention,
    x: &DeviceTensors,
    dy: &AnyDeviceTensor,
    req: &Requires,
) -> Result<DeviceTensors> {
    fma::<F>(a, x, dy, req, Fallback::default())
}

/// The FMA kernels as the exact tensor-core backward's fallback: the gradient buffers that path
/// wrote (or skipped), which these kernels write instead, and the device address of the flag
/// they run on (`stats[4·B·H·T]` of [`super::backward_fused::run`], nonzero where the forward
/// found a `q·k` beyond f32's range). The default: a plain run (own buffers, no flag).
pub(crate) struct Fallback<F: cudarc::driver::DeviceRepr + 'static> {
    /// Address of the flag (0: run unconditionally).
    pub only_if: u64,
    /// The buffers of `d_q`, `d_k`, `d_v` to write (where the caller has them).
    pub q: Option<pool::Pooled<F>>,
    pub k: Option<pool::Pooled<F>>,
    pub v: Option<pool::Pooled<F>>,
}

impl<F: cudarc::driver::DeviceRepr + 'static> Default for Fallback<F> {
    fn default() -> Self {
        Fallback { only_if: 0, q: None, k: None, v: None }
    }
}

/// The FMA kernels' backward (the module's doc), writing into `into`'s buffers where it has them
/// and running only where its flag is set.
pub(crate) fn fma<F: GpuReal>(
    a: &Attention,
    x: &DeviceTensors,
    dy: &AnyDeviceTensor,
    req: &Requires,
    mut into: Fallback<F>,
) -> Result<DeviceTensors> {
    let (q, k, v) = (input::<F>(x, "q")?, input::<F>(x, "k")?, input::<F>(x, "v")?);
    let &[b, t, h, dk] = q.shape() else {
        return Err(Error::shape("q", "[B, T, H, Dk]", mixer_core::error::fmt_shape(q.shape())));
    };
    if k.shape() != q.shape() {
        return Err(Error::shape(
            "k",
            mixer_core::error::fmt_shape(q.shape()),
            mixer_core::error::fmt_shape(k.shape()),
        ));
    }
    let dv = match v.shape() {
        &[vb, vt, vh, dv] if (vb, vt, vh) == (b, t, h) => dv,
        s => {
            return Err(Error::shape("v", format!("[{b}, {t}, {h}, Dv]"), mixer_core::error::fmt_shape(s)));
        }
    };
    let g = cotangent::<F>(dy, &[b, t, h, dv])?;
    let (want_q, want_k, want_v) = (req.wants("q"), req.wants("k"), req.wants("v"));
    let mut out = DeviceTensors::new();
    let zeros = |d: usize| DeviceTensor::<F>::zeros(&[b, t, h, d]).map(F::wrap);
    if b * t * h == 0 || dv == 0 || !(want_q || want_k || want_v) {
        // No cotangent (Dv = 0) or nothing asked: every gradient is zero.
        for (name, d, w) in [("q", dk, want_q), ("k", dk, want_k), ("v", dv, want_v)] {
            if w {
                out.insert(grad_name(name), zeros(d)?);
            }
        }
        return Ok(out);
    }
    check_elems(FAMILY, b * t * h * dk.max(dv))?;
    let elem = std::mem::size_of::<F>();
    let bt = tile(dk, dv, elem)?;
    let gpu = gpu()?;
    let opts = [format!("-DATB_DK={dk}"), format!("-DATB_DV={dv}"), format!("-DATB_B={bt}")];
    let f = |name: &str| {
        gpu.kernel(FAMILY, &kernels::ATTENTION_BACKWARD, &opts, &format!("{name}_{}", F::SUFFIX))
    };
    let tiles = t.div_ceil(bt);
    let grid = (
        int(FAMILY, "B·H", b * h)? as u32,
        u32::try_from(tiles).ok().filter(|&n| n <= 65535).ok_or_else(|| {
            err(FAMILY, format!("T = {t} needs {tiles} tiles of {bt}; the backward takes at most 65535"))
        })?,
        1,
    );
    let cfg = |bytes: usize| LaunchConfig {
        grid_dim: grid,
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: bytes as u32,
    };
    let (ti, hi) = (int(FAMILY, "T", t)?, int(FAMILY, "H", h)?);
    let w = window_arg(a, t);
    // Passed as a double: the kernels apply it in double where an f32 σ would overflow.
    let scale: f64 = a.scale(dk);
    let (qv, kv, vv, gv) = (q.view(), k.view(), v.view(), g.view());
    let rows = b * h * t;
    let mut m = pool::take::<f64>(FAMILY, rows)?;
    let mut lnl = pool::take::<F>(FAMILY, rows)?;
    let mut dd = pool::take::<F>(FAMILY, rows)?;
    let stats = f("atb_stats")?;
    let sm_stats = elem * bt * (2 * (dk | 1) + (dv | 1) + bt + 1);
    if sm_stats > 48 << 10 {
        opt_in(FAMILY, &stats)?;
    }
    let only_if = into.only_if;
    launch!(gpu, FAMILY, stats, cfg(sm_stats);
        &qv, &kv, &vv, &gv, &mut *m, &mut *lnl, &mut *dd, &ti, &hi, &w, &scale, &only_if)?;
    let sm = smem(bt, dk, dv, elem);
    if want_k || want_v {
        let dkdv = f("atb_dkdv")?;
        if sm > 48 << 10 {
            opt_in(FAMILY, &dkdv)?;
        }
        let mut gk = into.k.take().map_or_else(|| pool::take::<F>(FAMILY, b * t * h * dk), Ok)?;
        let mut gvv = into.v.take().map_or_else(|| pool::take::<F>(FAMILY, b * t * h * dv), Ok)?;
        launch!(gpu, FAMILY, dkdv, cfg(sm);
            &qv, &kv, &vv, &gv, &*m, &*lnl, &*dd, &mut *gk, &mut *gvv, &ti, &hi, &w, &scale, &only_if)?;
        if want_k {
            out.insert(grad_name("k"), F::wrap(DeviceTensor::from_pooled(gk, &[b, t, h, dk])?));
        }
        if want_v {
            out.insert(grad_name("v"), F::wrap(DeviceTensor::from_pooled(gvv, &[b, t, h, dv])?));
        }
    }
    if want_q {
        let dqf = f("atb_dq")?;
        if sm > 48 << 10 {
            opt_in(FAMILY, &dqf)?;
        }
        let mut gq = into.q.take().map_or_else(|| pool::take::<F>(FAMILY, b * t * h * dk), Ok)?;
        launch!(gpu, FAMILY, dqf, cfg(sm);
            &qv, &kv, &vv, &gv, &*m, &*lnl, &*dd, &mut *gq, &ti, &hi, &w, &scale, &only_if)?;
        out.insert(grad_name("q"), F::wrap(DeviceTensor::from_pooled(gq, &[b, t, h, dk])?));
    }
    Ok(out)
}

/// The tensor-core backward ([`backward_fused`]) where its plan takes the shapes, the mode and the
/// storage of `q, k, v` and `dy` (all `f32` in the exact and tf32 modes, all bf16 in the bf16
/// mode), with the FMA kernels launched after it in the exact mode to run where its forward found
/// an overflow ([`Fallback`]); `None` elsewhere (the FMA kernels run, on inputs converted to `F`).
/// Shapes that do not match are left to the FMA path, which names them.
fn tensor_cores(
    a: &Attention,
    x: &DeviceTensors,
    dy: &AnyDeviceTensor,
    req: &Requires,
    p: Precision,
) -> Result<Option<DeviceTensors>> {
    let stats = x.get(SAVED_STATISTICS);
    let Some((pl, shape)) = fused_plan(a, x, Some(dy), p)? else {
        return match stats {
            // Statistics from a saving forward that found the tensor-core path: the backward must
            // find it too (another mode, other dtypes or sizes than the forward's).
            Some(_) => Err(err(
                FAMILY,
                format!(
                    "`{SAVED_STATISTICS}` was given, but the tensor-core backward, which reads it, does not run on these inputs in the {p} mode: give it only with the inputs and mode of the forward that saved it"
                ),
            )),
            None => Ok(None),
        };
    };
    let saved = match (stats, x.get(SAVED_OUTPUT)) {
        (Some(s), Some(y)) => Some(backward_fused::Saved { y, stats: s.typed::<f32>(SAVED_STATISTICS)? }),
        _ => None,
    };
    let grads = backward_fused::run(&pl, a, x, dy, req, shape, saved)?;
    if grads.flag == 0 {
        return grads.into_tensors(req).map(Some);
    }
    // The exact mode: the FMA kernels on the same buffers, running only where the flag is set;
    // the statistics (which hold the flag) live until they are enqueued (the pool orders their
    // reuse after them).
    let into = Fallback { only_if: grads.flag, q: grads.q, k: grads.k, v: grads.v };
    let out = fma::<f32>(a, x, dy, req, into);
    drop(grads.stats);
    out.map(Some)
}

/// The tensor-core backward's plan and `[B, T, H, Dk, Dv]` for these inputs (and `dy`, where
/// given, of `v`'s shape and dtype), or `None` where the FMA kernels run: shapes that do not
/// match (left to the FMA path, which names them), mixed storages, or no plan.
fn fused_plan(
    a: &Attention,
    x: &DeviceTensors,
    dy: Option<&AnyDeviceTensor>,
    p: Precision,
) -> Result<Option<(backward_fused::BackwardPlan, [usize; 5])>> {
    let (Some(q), Some(k), Some(v)) = (x.get("q"), x.get("k"), x.get("v")) else { return Ok(None) };
    let (&[b, t, h, dk], &[.., dv]) = (q.shape(), v.shape()) else { return Ok(None) };
    let shape = [b, t, h, dk, dv];
    let dy = dy.unwrap_or(v);
    if k.shape() != q.shape() || v.shape() != [b, t, h, dv] || dy.shape() != v.shape() {
        return Ok(None);
    }
    let storage = match [q, k, v, dy].map(AnyDeviceTensor::dtype) {
        ["f32", "f32", "f32", "f32"] => Storage::F32,
        ["bf16", "bf16", "bf16", "bf16"] => Storage::Bf16,
        _ => return Ok(None),
    };
    let wgmma = gpu()?.has_wgmma();
    Ok(backward_fused::plan(a, shape, p, storage, max_dynamic_smem(), wgmma)?.map(|pl| (pl, shape)))
}

/// The `fast` form run for a backward ([`crate::run_device_saving`]): where the tensor-core
/// backward runs on these inputs, the forward's kernel with the statistics buffer that backward
/// reads ([`backward_fused::forward_with_stats`]; `y` has the plain forward's bits), returned as
/// `SAVED_STATISTICS` (`f32`, [`backward_fused::stats_len`]`(B·H·T)` floats); elsewhere the plain
/// forward and nothing saved.
pub fn run_saving<F: GpuReal>(
    a: &Attention,
    x: &DeviceTensors,
    p: Precision,
) -> Result<(AnyDeviceTensor, Option<AnyDeviceTensor>)> {
    let Some((pl, shape)) = fused_plan(a, x, None, p)? else {
        return Ok((super::fast::run::<F>(a, x, p)?, None));
    };
    let (y, stats) = backward_fused::forward_with_stats(&pl, a, x, shape)?;
    let len = stats.len();
    Ok((y, Some(AnyDeviceTensor::F32(DeviceTensor::from_pooled(stats, &[len])?))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tile rule: the largest of 64 (32 above head dims of 128) and its halves whose tiles
    /// fit in the device's shared memory (48 KiB without a device); head dims above 256 are refused.
    #[test]
    fn tiles_follow_the_head_dims_and_the_shared_memory() {
        // f32, Dk = Dv = 64 at tile 64: M, then q, k, dy, v rows of 65, P and dS rows of 65, ln ℓ, D.
        assert_eq!(smem(64, 64, 64, 4), 8 * 64 + 4 * (6 * 64 * 65 + 128));
        assert_eq!(smem(16, 5, 70, 8), 8 * 16 + 8 * (2 * 16 * 5 + 2 * 16 * 71 + 2 * 16 * 17 + 32));
        assert!(tile(257, 4, 4).is_err());
        let max = max_dynamic_smem();
        for (dk, dv, elem) in
            [(5, 70, 4), (16, 16, 4), (64, 64, 4), (128, 128, 4), (70, 256, 4), (64, 64, 8), (128, 5, 8)]
        {
            let cap = if dk.max(dv) <= 128 { 64 } else { 32 };
            match tile(dk, dv, elem) {
                Ok(bt) => {
                    assert!(smem(bt, dk, dv, elem) <= max && bt >= 16, "{dk} {dv} {elem}: {bt}");
                    assert!(bt == cap || smem(2 * bt, dk, dv, elem) > max, "{dk} {dv} {elem}: {bt}");
                }
                Err(_) => assert!(smem(16, dk, dv, elem) > max, "{dk} {dv} {elem}"),
            }
        }
    }
}
