//! The sparse recurrence: one thread per (batch, channel), sequential over `t`, reading the
//! pattern's positions from the host-computed (offset, stride) table.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use mixer_core::mixers::glr::Glr;
use mixer_core::{Mixer, Precision, Result};

use super::FAMILY;
use crate::forms::{finish, input, input_opt};
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{GpuReal, check_elems, err, gpu, grid1, int, launch};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// The pattern table the kernel takes for length `t_len`: [`Glr::slots`]'s offsets `f(k)`
/// and strides `a_k` for `k < K(T)`, as `i64`.
pub(crate) fn table(glr: &Glr, t_len: usize) -> Result<(Vec<i64>, Vec<i64>)> {
    let slots = glr.slots(t_len);
    let conv = |v: usize| i64::try_from(v).map_err(|_| err(FAMILY, format!("pattern value {v} exceeds i64")));
    Ok((
        slots.offsets().iter().map(|&v| conv(v)).collect::<Result<_>>()?,
        slots.strides().iter().map(|&v| conv(v.min(i64::MAX as usize))).collect::<Result<_>>()?,
    ))
}

/// A pattern table on the device: offsets, strides, and `K`.
type DeviceTable = Arc<(Pooled<i64>, Pooled<i64>, usize)>;

/// Device tables by (mixer name, mixer config, T), so that a repeated call uploads nothing.
/// The name is part of the key: aliases such as `diagonal-ssm` and `dense-recurrence` fix the
/// pattern by name and may share a config.
static TABLES: LazyLock<Mutex<HashMap<(String, String, usize), DeviceTable>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The device table of `glr` for length `t`, uploaded on first use.
fn device_table(glr: &Glr, t: usize) -> Result<DeviceTable> {
    let key = (glr.name().to_string(), glr.config().to_string(), t);
    let mut cache = TABLES.lock().map_err(|_| err(FAMILY, "pattern table cache poisoned"))?;
    if let Some(d) = cache.get(&key) {
        return Ok(d.clone());
    }
    let (off, strides) = table(glr, t)?;
    let g = gpu()?;
    let d = Arc::new((g.upload_slice(FAMILY, &off)?, g.upload_slice(FAMILY, &strides)?, off.len()));
    if cache.len() >= 1024 {
        cache.clear();
    }
    cache.insert(key, d.clone());
    Ok(d)
}

/// Runs the fast (sparse recurrence) form on device tensors.
pub fn run<F: GpuReal>(glr: &Glr, x: &DeviceTensors, p: Precision) -> Result<AnyDeviceTensor> {
    let xs = input::<F>(x, "x")?;
    let (b, t, c) = (xs.shape()[0], xs.shape()[1], xs.shape()[2]);
    if b * t * c == 0 {
        return finish(DeviceTensor::<F>::zeros(&[b, t, c])?, p);
    }
    let tab = device_table(glr, t)?;
    let k = tab.2;
    let on = glr.on();
    let na = if on.has_a() { k + 1 } else { 1 };
    check_elems(FAMILY, b * t * na.max(k) * c)?;
    let g = gpu()?;
    let f = g.kernel(FAMILY, &kernels::GLR, &[], &format!("glr_scan_{}", F::SUFFIX))?;
    let alpha = input::<F>(x, "alpha")?;
    let beta = if on.has_b() { input_opt::<F>(x, "beta")? } else { None };
    let zero = pool::zeros::<F>(FAMILY, 1)?;
    let bv = beta.as_ref().map_or_else(|| zero.slice(0..1), |d| d.view());
    let mut y = pool::take::<F>(FAMILY, b * t * c)?;
    let (bi, ti, ci, ki, nai) = (
        int(FAMILY, "B", b)?,
        int(FAMILY, "T", t)?,
        int(FAMILY, "C", c)?,
        int(FAMILY, "K", k)?,
        int(FAMILY, "K+1", na)?,
    );
    let (ha, hb, ce) = (on.has_a() as i32, on.has_b() as i32, glr.pattern().cache_efficient() as i32);
    let (xv, av) = (xs.view(), alpha.view());
    launch!(g, FAMILY, f, grid1(b * c, 128);
        &xv, &av, &bv, &*tab.0, &*tab.1, &mut *y, &bi, &ti, &ci, &ki, &nai, &ha, &hb, &ce)?;
    finish(DeviceTensor::from_pooled(y, &[b, t, c])?, p)
}
