//! λ on the device: the raw `lambda` mapped to weights by the scheme's registered CUDA device
//! function (`ll_map_lambda` of `kernels/loglinear_parallel.cu`, with the mask's and the scheme's
//! device functions spliced in) and the parameter `lambda_param [H, L]` (1 when absent).
//! A weight that is not finite and `≥ 0` is reported through a deferred check. A plugin
//! scheme without a device function is mapped on the host instead (its weights are read back,
//! mapped and uploaded: the one case in which a form of this family waits for the stream).

use std::sync::Arc;

use mixer_core::mixers::loglinear::{LogLinear, lambda_shape};
use mixer_core::{Error, Result};

use super::common::FAMILY;
use super::parallel::{kernel_key, kernel_source};
use crate::pool;
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
        let zero = pool::zeros::<F>(FAMILY, 1)?;
        let pv = param.map_or_else(|| zero.slice(0..1), |p| p.view());
        let (rv, has, ni, hi, li) =
            (raw.view(), param.is_some() as i32, n as i64, int(FAMILY, "H", h)?, int(FAMILY, "L", l)?);
        launch!(g, FAMILY, f, grid1(n.min(1 << 20), 256); &rv, &pv, &has, &mut *out, &ni, &hi, &li, flag.flag())?;
    }
    Ok(DeviceTensor::from_pooled(out, s)?.with_checks([flag]).with_checks(raw.checks().iter().cloned()))
}
