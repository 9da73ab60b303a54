//! λ on the device: the raw `lambda` mapped to weights by the scheme's registered CUDA device
//! function (`ll_map_lambda` of `kernels/loglinear_parallel.cu`, with the mask's and the scheme's
//! device functions spliced in) and the parameter `lambda_param [H, L]` (1 when absent).
//! A weight that is not finite and `≥ 0` is reported through a deferred check. A plugin
//! scheme without a device function is mapped on the host instead (its weights are read back,
//! mapped and uploaded: the one case in which a form of this family waits for the stream).
//! The map's backward ([`vjp`]) runs on the device with the scheme's registered device derivative
//! (`LambdaGradEntry::cuda`, spliced in the same way).

use std::sync::Arc;

use cudarc::driver::CudaView;
use mixer_core::mixers::loglinear::{LogLinear, lambda_shape};
use mixer_core::{Error, Result};

use super::common::FAMILY;
use super::parallel::{device_derivative, kernel_key, kernel_source};
use crate::pool::{self, Pooled};
use crate::runtime::{gpu, grid1, int, launch};
use crate::tensor::GpuReal;
use crate::tensor::{Deferred, DeviceTensor};

/// The λ weights of `raw` (`[…, H, L]`), on the device, with the check of their values.
pub fn weights<F: GpuReal>(
    ll: &LogLinear,
    raw: &DeviceTensor<F>,
    param: Option<&DeviceTensor<F>>,
) -> Result<DeviceTensor<F>> {
    let s = raw.shape();
    let n = raw.len();
    let (h, l) = lambda_shape(s, param.map(|p| p.shape()))?;
    let Some(lift) = ll.lift else {
        return Err(Error::config(&ll.name, "this mixer takes no `lambda`"));
    };
    let scheme = mixer_registry::lambda_scheme(lift.lambda.name)?;
    if scheme.cuda.is_none() {
        // No device function: map on the host with the scheme's own function.
        let w = ll.lambda_weights(&raw.to_host()?, param.map(|p| p.to_host()).transpose()?.as_ref())?;
        return DeviceTensor::upload(&w);
    }
    let name = lift.lambda.name;
    let flag = Arc::new(Deferred::new(FAMILY, move |i| Error::Value {
        name: "lambda".into(),
        constraint: format!("λ scheme `{name}` must map raw values to finite weights ≥ 0"),
        found: format!("a raw value at flat index {i} maps outside (checked on the device)"),
    })?);
    let mut out = pool::take::<F>(FAMILY, n)?;
    if n > 0 {
        let g = gpu()?;
        let f =
            g.kernel_keyed(FAMILY, &kernel_key(ll), &[], &format!("ll_map_lambda_{}", F::SUFFIX), || {
                kernel_source(ll)
            })?;
        let mut slot = None;
        let pv = param_view(param, &mut slot)?;
        let (rv, has, ni, hi, li) =
            (raw.view(), param.is_some() as i32, n as i64, int(FAMILY, "H", h)?, int(FAMILY, "L", l)?);
        launch!(g, FAMILY, f, grid1(n.min(1 << 20), 256); &rv, &pv, &has, &mut *out, &ni, &hi, &li, flag.flag())?;
    }
    Ok(DeviceTensor::from_pooled(out, s)?.with_checks([flag]).with_checks(raw.checks().iter().cloned()))
}

/// The λ map's backward on the device: from the gradient `dlam` of the weights, the gradients of
/// the raw `lambda` (`dλ · ∂map/∂raw`) and, when `param` was given, of `lambda_param [H, L]`
/// (`Σ_{b,t} dλ · ∂map/∂param`, summed in a fixed order). `None` when the scheme registered no
/// device derivative (`LambdaGradEntry::cuda`).
#[allow(clippy::type_complexity)]
pub fn vjp<F: GpuReal>(
    ll: &LogLinear,
    raw: &DeviceTensor<F>,
    param: Option<&DeviceTensor<F>>,
    dlam: &DeviceTensor<F>,
) -> Result<Option<(DeviceTensor<F>, Option<DeviceTensor<F>>)>> {
    let Some(lift) = ll.lift else {
        return Err(Error::config(&ll.name, "this mixer takes no `lambda`"));
    };
    if device_derivative(lift.lambda.name).is_none() {
        return Ok(None);
    }
    let s = raw.shape();
    if dlam.shape() != s {
        return Err(Error::shape("the gradient of lambda", format!("{s:?}"), format!("{:?}", dlam.shape())));
    }
    let (h, l) = lambda_shape(s, param.map(|p| p.shape()))?;
    let n = raw.len();
    let mut draw = pool::take::<F>(FAMILY, n)?;
    let g = gpu()?;
    let function = |name: &str| {
        g.kernel_keyed(FAMILY, &kernel_key(ll), &[], &format!("{name}_{}", F::SUFFIX), || kernel_source(ll))
    };
    let (hi, li) = (int(FAMILY, "H", h)?, int(FAMILY, "L", l)?);
    if n > 0 {
        let f = function("ll_lambda_vjp")?;
        let mut slot = None;
        let pv = param_view(param, &mut slot)?;
        let (rv, dv, has, ni) = (raw.view(), dlam.view(), param.is_some() as i32, n as i64);
        launch!(g, FAMILY, f, grid1(n.min(1 << 20), 256); &rv, &pv, &has, &dv, &mut *draw, &ni, &hi, &li)?;
    }
    let dparam = match param {
        None => None,
        Some(p) => {
            let mut out = pool::take::<F>(FAMILY, p.len())?;
            let hl = h * l;
            let rows = n / hl.max(1);
            // Parts of 4096 rows, at most 64 of them (a fixed function of the shape).
            let parts = rows.div_ceil(4096).clamp(1, 64);
            let mut partial = pool::zeros::<f64>(FAMILY, parts * hl)?;
            if rows > 0 {
                let f = function("ll_lambda_vjp_param")?;
                let cfg = cudarc::driver::LaunchConfig {
                    grid_dim: (int(FAMILY, "H·L", hl)? as u32, parts as u32, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                let (rv, pv, dv, ri, hli) = (raw.view(), p.view(), dlam.view(), rows as i64, hl as i32);
                launch!(g, FAMILY, f, cfg; &rv, &pv, &dv, &mut *partial, &ri, &hli)?;
            }
            let f = function("ll_lambda_param_sum")?;
            let (pi, hli) = (parts as i32, hl as i32);
            launch!(g, FAMILY, f, grid1(hl, 256); &*partial, &mut *out, &pi, &hli)?;
            Some(DeviceTensor::from_pooled(out, p.shape())?)
        }
    };
    Ok(Some((DeviceTensor::from_pooled(draw, s)?, dparam)))
}

/// `param`'s view, or (no parameter) a one-element placeholder held in `slot`: the kernels read
/// the parameter only when `has_param` says it was given.
fn param_view<'a, F: GpuReal>(
    param: Option<&'a DeviceTensor<F>>,
    slot: &'a mut Option<Pooled<F>>,
) -> Result<CudaView<'a, F>> {
    Ok(match param {
        Some(p) => p.view(),
        None => slot.insert(pool::zeros::<F>(FAMILY, 1)?).slice(0..1),
    })
}
