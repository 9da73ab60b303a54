//! The generic quadratic form: one thread per (batch, token, head) sweeps `s = t, t−1, …, 0`
//! carrying `u_s = Φ_{s+1..t} q_t` (docs/math.md §2.1) and accumulates
//! `y_t = Σ_{s ≤ t} σ β_s (k_s · u_s) λ_t^(ℓ(t,s)) v_s`, with `ℓ` and
//! `λ = map(raw, 1)` from the spliced device functions. `O(T² (D_k + D_v))` work.

use std::sync::Arc;

use cudarc::driver::LaunchConfig;
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Error, Precision, Result};

use super::common::{FAMILY, base_code};
use crate::forms::{finish, input, input_opt};
use crate::kernels;
use crate::pool;
use crate::runtime::{check_elems, err, gpu, int, launch};
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, Deferred, DeviceTensor, DeviceTensors};

/// Shared memory one block may use without opting in (bytes).
const SMEM: usize = 48 * 1024;

/// The kernel source for this mixer: common helpers, the mask's and the λ scheme's device
/// functions (from their registry entries; [`kernels::NO_LIFT`] without a lift) — with the
/// scheme's device derivative where registered, which adds the λ map's backward kernels — then
/// the generic kernel.
pub fn kernel_source(ll: &LogLinear) -> Result<String> {
    let Some(lift) = ll.lift else {
        return Ok(kernels::LOGLINEAR_PARALLEL.full());
    };
    let mask = mixer_registry::mask(lift.mask.name)?;
    let mask_src = mask.cuda.ok_or_else(|| {
        err(FAMILY, format!("level mask `{}` has no CUDA device function (MaskEntry::cuda)", mask.name))
    })?;
    let lam = mixer_registry::lambda_scheme(lift.lambda.name)?;
    let lam_src = lam.cuda.ok_or_else(|| {
        err(FAMILY, format!("λ scheme `{}` has no CUDA device function (LambdaEntry::cuda)", lam.name))
    })?;
    // The scheme's derivative, when registered for the device, adds the λ map's backward kernels.
    let grad = match device_derivative(lam.name) {
        Some(src) => format!("#define MIXERS_LAMBDA_GRAD 1\n{src}"),
        None => String::new(),
    };
    Ok(kernels::with_prelude(&format!("{mask_src}\n{lam_src}\n{grad}"), kernels::LOGLINEAR_PARALLEL.body))
}

/// The device function of λ scheme `scheme`'s derivative (`LambdaGradEntry::cuda`), where it was
/// registered: [`kernel_source`] then adds the λ map's backward kernels.
pub fn device_derivative(scheme: &str) -> Option<&'static str> {
    mixer_registry::lambda_grad(scheme).and_then(|g| g.cuda)
}

/// The key of [`kernel_source`] for [`crate::runtime::Gpu::kernel_keyed`]: the mask and the λ
/// scheme (registry names are unique).
pub fn kernel_key(ll: &LogLinear) -> String {
    match ll.lift {
        Some(l) => format!("loglinear/{}/{}", l.mask.name, l.lambda.name),
        None => kernels::LOGLINEAR_PARALLEL.name.to_string(),
    }
}

/// Runs the quadratic form on device tensors.
pub fn run<F: GpuReal>(ll: &LogLinear, x: &DeviceTensors, p: Precision) -> Result<AnyDeviceTensor> {
    let (q, k, v) = (input::<F>(x, "q")?, input::<F>(x, "k")?, input::<F>(x, "v")?);
    let (b, t, h, dk) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let dv = v.shape()[3];
    if b * t * h * dv == 0 {
        return finish(DeviceTensor::<F>::zeros(&[b, t, h, dv])?, p);
    }
    let lifted = ll.lift.is_some();
    if x.contains_key("lambda_param") {
        return Err(err(
            FAMILY,
            "this quadratic kernel maps λ on the device with the parameter at 1, so it does not take \
             `lambda_param` yet; use the fast or recurrent form or the cpu backend",
        ));
    }
    let sz = std::mem::size_of::<F>();
    let per_thread = (dk + dv) * sz;
    let nt = (SMEM / per_thread.max(1)).min(128);
    if nt == 0 {
        return Err(err(
            FAMILY,
            format!("Dk + Dv = {} is too large for the per-thread shared memory", dk + dv),
        ));
    }
    let g = gpu()?;
    let f = g.kernel_keyed(FAMILY, &kernel_key(ll), &[], &format!("ll_quadratic_{}", F::SUFFIX), || {
        kernel_source(ll)
    })?;
    let zero = pool::zeros::<F>(FAMILY, 1)?;
    let gg = if ll.base.has_decay() { input_opt::<F>(x, "g")? } else { None };
    let bb = if ll.base.has_beta() { input_opt::<F>(x, "beta")? } else { None };
    let ll_raw = if lifted { input_opt::<F>(x, "lambda")? } else { None };
    let levels = ll_raw.as_ref().map_or(1, |l| l.shape()[3]);
    if let Some(l) = &ll_raw {
        check_elems(FAMILY, l.len())?;
    }
    let gv = gg.as_ref().map_or_else(|| zero.slice(0..1), |t| t.view());
    let bv = bb.as_ref().map_or_else(|| zero.slice(0..1), |t| t.view());
    let lv = ll_raw.as_ref().map_or_else(|| zero.slice(0..1), |t| t.view());
    let n = b * t * h;
    check_elems(FAMILY, n * dk.max(dv))?;
    let mut y = pool::take::<F>(FAMILY, n * dv)?;
    let (mask, scheme) = ll.lift.map_or(("", ""), |l| (l.mask.name, l.lambda.name));
    let flag = Arc::new(Deferred::new(FAMILY, move |c| Error::Value {
        name: "lambda".into(),
        constraint: if c == 1 {
            format!("mask `{mask}` must give levels in [0, L) for s ≤ t < T")
        } else {
            format!("λ scheme `{scheme}` must map raw values to finite weights ≥ 0")
        },
        found: format!("L = {levels}; the kernel found a violation (code {c})"),
    })?);
    let cfg = LaunchConfig {
        grid_dim: (int(FAMILY, "blocks", n.div_ceil(nt))? as u32, 1, 1),
        block_dim: (nt as u32, 1, 1),
        shared_mem_bytes: (nt * per_thread) as u32,
    };
    let (bi, ti, hi, dki, dvi, li) = (
        int(FAMILY, "B", b)?,
        int(FAMILY, "T", t)?,
        int(FAMILY, "H", h)?,
        int(FAMILY, "Dk", dk)?,
        int(FAMILY, "Dv", dv)?,
        int(FAMILY, "L", levels)?,
    );
    let (base, lifted_i, scale) = (base_code(ll.base), lifted as i32, ll.scale);
    let (qv, kv, vv) = (q.view(), k.view(), v.view());
    launch!(g, FAMILY, f, cfg;
        &qv, &kv, &vv, &gv, &bv, &lv, &mut *y, flag.flag(), &bi, &ti, &hi, &dki, &dvi, &li, &base, &lifted_i, &scale)?;
    finish(DeviceTensor::from_pooled(y, &[b, t, h, dv])?.with_checks([flag]), p)
}
