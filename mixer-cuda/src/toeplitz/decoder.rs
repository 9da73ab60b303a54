//! What both Toeplitz decoders on the GPU share ([`Statics`], as the CPU's `decoder.rs`): the
//! taps and bias on the device, and the per-token checks and copy into the input history. The
//! decoders: [`super::naive`] and [`super::online`].

use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::tensor::get;
use mixer_core::{Dims, DimsExt, Result, Tensors};

use super::common::{FAMILY, kernel_dims};
use crate::attention::decoder::token_shape;
use crate::fft::FftReal;
use crate::forms::input;
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu};
use crate::tensor::DeviceTensors;

/// What both decoders keep on the device: the taps `[Kw·H, T]` and the bias `[H, T]` (truncated to
/// `T`), with the sizes as kernel ints.
pub(crate) struct Statics<F: FftReal> {
    pub w: Pooled<F>,
    pub bias: Pooled<F>,
    pub has_bias: i32,
    /// `[B, T, C, H, Kw]`.
    pub dims: [i32; 5],
    /// `B·C`.
    pub bc: usize,
    /// `T`.
    pub tmax: usize,
}

impl<F: FftReal> Statics<F> {
    /// Checks and uploads the taps and bias.
    pub fn upload(tz: &Toeplitz, statics: &Tensors<F>, dims: &Dims) -> Result<Self> {
        let (b, t, c) = (dims.size("B")?, dims.size("T")?, dims.size("C")?);
        tz.head_dim(c)?;
        let (taps, bias) = tz.prepare_statics(get(statics, "w")?, statics.get("bias"), t)?;
        let w = pool::upload(FAMILY, &taps)?;
        let (bias, has_bias) = match bias {
            Some(v) => (pool::upload(FAMILY, &v)?, 1),
            None => (pool::zeros::<F>(FAMILY, 1)?, 0),
        };
        Ok(Statics { w, bias, has_bias, dims: kernel_dims(tz, b, t, c)?, bc: b * c, tmax: t })
    }

    /// Checks the capacity and the token's `x [B, C]` and copies it into row `t` of the history
    /// `[T, B, C]` (device to device, stream-ordered).
    pub fn append(&self, hist: &mut Pooled<F>, t: usize, token: &DeviceTensors) -> Result<()> {
        mixer_core::mixer::check_decoder_capacity(t, self.tmax)?;
        let [b, _, c, _, _] = self.dims;
        let xs = input::<F>(token, "x")?;
        token_shape("x", xs.shape(), &[b as usize, c as usize])?;
        if self.bc > 0 {
            let mut dst = hist.slice_mut(t * self.bc..(t + 1) * self.bc);
            gpu()?
                .stream()
                .memcpy_dtod(&xs.view(), &mut dst)
                .map_err(|e| err(FAMILY, format!("copy: {e}")))?;
        }
        Ok(())
    }
}
