//! What the Toeplitz forms on CUDA share: the family's name in errors, the inputs of a form on
//! the device with the sizes the kernels take, and their checks.

use std::borrow::Cow;

use mixer_core::Result;
use mixer_core::mixers::toeplitz::Toeplitz;

use crate::fft::FftReal;
use crate::forms::{input, input_opt};
use crate::runtime::int;
use crate::tensor::{DeviceTensor, DeviceTensors};

/// Family name in errors.
pub(crate) const FAMILY: &str = mixer_core::mixers::toeplitz::FAMILY;

/// The inputs of a form on the device, with the sizes the kernels take.
pub(crate) struct Prepared<'a, F: FftReal> {
    pub x: Cow<'a, DeviceTensor<F>>,
    pub w: Cow<'a, DeviceTensor<F>>,
    pub bias: Option<Cow<'a, DeviceTensor<F>>>,
    /// `[B, T, C, H, Kw, Lw, Lb]` as kernel ints (`Lw`, `Lb`: row lengths of `w` and `bias`).
    pub dims: [i32; 7],
    pub b: usize,
    pub t: usize,
    pub c: usize,
}

/// `[B, T, C, H, Kw]` as kernel ints.
pub(crate) fn kernel_dims(tz: &Toeplitz, b: usize, t: usize, c: usize) -> Result<[i32; 5]> {
    Ok([
        int(FAMILY, "B", b)?,
        int(FAMILY, "T", t)?,
        int(FAMILY, "C", c)?,
        int(FAMILY, "H", tz.cfg.heads)?,
        int(FAMILY, "Kw", tz.cfg.kernel_width)?,
    ])
}

/// Checks the shapes of `x`, `w` and `bias` as every form does (through the same
/// [`Toeplitz::check_statics`], on the shapes alone: no host work that grows with `T`) and gathers the
/// device inputs.
pub(crate) fn prepare<'a, F: FftReal>(tz: &Toeplitz, x: &'a DeviceTensors) -> Result<Prepared<'a, F>> {
    let xs = input::<F>(x, "x")?;
    let s = xs.shape().to_vec();
    if s.len() != 3 {
        return Err(mixer_core::Error::shape("x", "[B, T, C]", mixer_core::error::fmt_shape(&s)));
    }
    let (b, t, c) = (s[0], s[1], s[2]);
    tz.head_dim(c)?;
    let w = input::<F>(x, "w")?;
    let bias = input_opt::<F>(x, "bias")?;
    tz.check_statics(w.shape(), bias.as_ref().map(|d| d.shape()), t)?;
    let lw = *w.shape().last().unwrap_or(&0);
    let lb = bias.as_ref().map_or(t, |d| *d.shape().last().unwrap_or(&0));
    let [bi, ti, ci, hi, kwi] = kernel_dims(tz, b, t, c)?;
    let dims = [bi, ti, ci, hi, kwi, int(FAMILY, "Tw", lw)?, int(FAMILY, "Tb", lb)?];
    Ok(Prepared { x: xs, w, bias, dims, b, t, c })
}
