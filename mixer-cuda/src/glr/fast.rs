//! The sparse recurrence: one thread per (batch, channel), sequential over `t`, reading the
//! pattern's positions from the host-computed (offset, stride) table.

use mixer_core::mixers::glr::Glr;
use mixer_core::{Result, Tensors};
use ndarray::{ArrayD, IxDyn};

use super::FAMILY;
use crate::kernels;
use crate::runtime::{GpuReal, check_elems, err, gpu, grid1, int, launch};
use mixer_core::tensor::get;

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

/// Runs the fast (sparse recurrence) form on the GPU.
pub fn run<F: GpuReal>(glr: &Glr, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let x = get(inputs, "x")?;
    let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    if b * t * c == 0 {
        return Ok(ArrayD::zeros(IxDyn(&[b, t, c])));
    }
    let (off, strides) = table(glr, t)?;
    let k = off.len();
    let on = glr.on();
    let na = if on.has_a() { k + 1 } else { 1 };
    check_elems(FAMILY, b * t * na.max(k) * c)?;
    let g = gpu()?;
    let f = g.function(FAMILY, &kernels::GLR.full(), &[], &format!("glr_scan_{}", F::SUFFIX))?;
    let dx = g.upload(FAMILY, x)?;
    let da = g.upload(FAMILY, get(inputs, "alpha")?)?;
    let db = match inputs.get("beta") {
        Some(beta) if on.has_b() => g.upload(FAMILY, beta)?,
        _ => g.zeros::<F>(FAMILY, 1)?,
    };
    let doff = g.upload_slice(FAMILY, &off)?;
    let dstr = g.upload_slice(FAMILY, &strides)?;
    let mut y = g.zeros::<F>(FAMILY, b * t * c)?;
    let (bi, ti, ci, ki, nai) = (
        int(FAMILY, "B", b)?,
        int(FAMILY, "T", t)?,
        int(FAMILY, "C", c)?,
        int(FAMILY, "K", k)?,
        int(FAMILY, "K+1", na)?,
    );
    let (ha, hb, ce) = (on.has_a() as i32, on.has_b() as i32, glr.pattern().cache_efficient() as i32);
    launch!(g, FAMILY, f, grid1(b * c, 128);
        &dx, &da, &db, &doff, &dstr, &mut y, &bi, &ti, &ci, &ki, &nai, &ha, &hb, &ce)?;
    g.sync(FAMILY)?;
    g.download(FAMILY, &y, &[b, t, c])
}
