//! Naive decoder on the GPU: the input history `x_0..x_t` stays on the device
//! (`[T, B, C]`), and token `t` costs `O(t)` per channel:
//! `y_{t,e} = Σ_i Σ_{s ≤ t} w[i,h(e),t−s] x_s[e+i−(K_w−1)] + bias[h(e),t]`.
//! Its cache is the whole history (`t · B · C` elements after `t` tokens). Each step copies
//! `x_t` into the history on the device and launches one kernel; nothing waits.

use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::tensor::get;
use mixer_core::{Dims, DimsExt, Result, Tensors};

use super::{FAMILY, kernel_dims};
use crate::attention::decoder::token_shape;
use crate::fft::FftReal;
use crate::forms::{DeviceDecoder, input};
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu, grid1, launch};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

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
        let g = gpu()?;
        let w = g.upload_slice(FAMILY, &taps)?;
        let (bias, has_bias) = match bias {
            Some(v) => (g.upload_slice(FAMILY, &v)?, 1),
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
            gpu()?.stream.memcpy_dtod(&xs.view(), &mut dst).map_err(|e| err(FAMILY, format!("copy: {e}")))?;
        }
        Ok(())
    }
}

/// The naive Toeplitz decoder (device-resident history).
pub struct NaiveDecoder<F: FftReal> {
    s: Statics<F>,
    hist: Pooled<F>,
    t: usize,
}

impl<F: FftReal> NaiveDecoder<F> {
    /// Uploads the taps and bias (truncated to `T`) and allocates the history.
    pub fn new(tz: &Toeplitz, statics: &Tensors<F>, dims: &Dims) -> Result<Self> {
        let s = Statics::upload(tz, statics, dims)?;
        let hist = pool::zeros::<F>(FAMILY, s.tmax * s.bc)?;
        Ok(NaiveDecoder { s, hist, t: 0 })
    }
}

impl<F: FftReal> DeviceDecoder for NaiveDecoder<F> {
    fn step(&mut self, token: &DeviceTensors) -> Result<AnyDeviceTensor> {
        self.s.append(&mut self.hist, self.t, token)?;
        let [b, tn, c, h, kw] = self.s.dims;
        let want = [b as usize, c as usize];
        let g = gpu()?;
        let f = g.kernel(FAMILY, &kernels::TOEPLITZ, &[], &format!("toeplitz_step_{}", F::SUFFIX))?;
        let mut y = pool::take::<F>(FAMILY, self.s.bc)?;
        let ti = self.t as i32;
        // The taps and bias were truncated to T on upload: rows of T entries.
        launch!(g, FAMILY, f, grid1(self.s.bc, 128);
            &*self.hist, &*self.s.w, &*self.s.bias, &self.s.has_bias, &mut *y, &b, &tn, &c, &h, &kw, &ti, &tn, &tn)?;
        self.t += 1;
        Ok(F::wrap(DeviceTensor::from_pooled(y, &want)?))
    }
    fn cache_elems(&self) -> usize {
        self.t * self.s.bc
    }
    fn position(&self) -> usize {
        self.t
    }
}
