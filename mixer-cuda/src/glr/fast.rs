//! The sparse recurrence: one thread per (batch, channel), sequential over $t$, reading the
//! pattern's positions from the host-computed (offset, stride) table.

use mixer_core::mixers::glr::Glr;
use mixer_core::{Result, Tensors};
use ndarray::{ArrayD, IxDyn};

use super::{KERNEL, SRC};
use crate::runtime::{GpuReal, check_elems, err, gpu, grid1, input, int, launch, source};

/// The pattern table for length `t_len`: offsets $f(k)$ and strides $a_k$ for $k < K(T)$.
pub(crate) fn table(glr: &Glr, t_len: usize) -> Result<(Vec<i64>, Vec<i64>)> {
    let p = glr.pattern();
    let off = p.offsets(t_len);
    let strides = if p.cache_efficient() { p.strides(off.len()) } else { vec![1; off.len()] };
    let conv = |v: u64| i64::try_from(v).map_err(|_| err(KERNEL, format!("pattern value {v} exceeds i64")));
    Ok((
        off.iter().map(|&v| conv(v)).collect::<Result<_>>()?,
        strides.iter().map(|&v| conv(v.min(i64::MAX as u64))).collect::<Result<_>>()?,
    ))
}

/// Runs the fast (sparse recurrence) form on the GPU.
pub fn run<F: GpuReal>(glr: &Glr, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let x = input(inputs, KERNEL, "x")?;
    let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    if b * t * c == 0 {
        return Ok(ArrayD::zeros(IxDyn(&[b, t, c])));
    }
    let (off, strides) = table(glr, t)?;
    let k = off.len();
    let on = glr.on();
    let na = if on.has_a() { k + 1 } else { 1 };
    check_elems(KERNEL, b * t * na.max(k) * c)?;
    let g = gpu()?;
    let f = g.function(KERNEL, &source(SRC), &[], &format!("glr_scan_{}", F::SUFFIX))?;
    let dx = g.upload(KERNEL, x)?;
    let da = g.upload(KERNEL, input(inputs, KERNEL, "alpha")?)?;
    let db = match inputs.get("beta") {
        Some(beta) if on.has_b() => g.upload(KERNEL, beta)?,
        _ => g.zeros::<F>(KERNEL, 1)?,
    };
    let doff = g.upload_slice(KERNEL, &off)?;
    let dstr = g.upload_slice(KERNEL, &strides)?;
    let mut y = g.zeros::<F>(KERNEL, b * t * c)?;
    let (bi, ti, ci, ki, nai) = (
        int(KERNEL, "B", b)?,
        int(KERNEL, "T", t)?,
        int(KERNEL, "C", c)?,
        int(KERNEL, "K", k)?,
        int(KERNEL, "K+1", na)?,
    );
    let (ha, hb, ce) = (on.has_a() as i32, on.has_b() as i32, glr.pattern().cache_efficient() as i32);
    launch!(g, KERNEL, f, grid1(b * c, 128);
        &dx, &da, &db, &doff, &dstr, &mut y, &bi, &ti, &ci, &ki, &nai, &ha, &hb, &ce)?;
    g.sync(KERNEL)?;
    g.download(KERNEL, &y, &[b, t, c])
}
