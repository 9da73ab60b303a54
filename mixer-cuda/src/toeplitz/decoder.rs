//! Naive decoder on the GPU: the input history `x_0..x_t` stays on the device
//! (`[T, B, C]`), and token `t` costs `O(t)` per channel:
//! `y_{t,e} = Σ_i Σ_{s ≤ t} w[i,h(e),t−s] x_s[e+i−(K_w−1)] + bias[h(e),t]`.
//! Its cache is the whole history (`t · B · C` elements after `t` tokens). Each step copies
//! `x_t` into the history on the device and launches one kernel; nothing waits.

use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::tensor::get;
use mixer_core::{Dims, DimsExt, Result, Tensors};

use super::FAMILY;
use crate::attention::decoder::token_shape;
use crate::fft::FftReal;
use crate::forms::{DeviceDecoder, input};
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu, grid1, int, launch};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// The naive Toeplitz decoder (device-resident history).
pub struct NaiveDecoder<F: FftReal> {
    w: Pooled<F>,
    bias: Pooled<F>,
    has_bias: i32,
    hist: Pooled<F>,
    dims: [i32; 5],
    bc: usize,
    tmax: usize,
    t: usize,
}

impl<F: FftReal> NaiveDecoder<F> {
    /// Uploads the taps and bias (truncated to `T`) and allocates the history.
    pub fn new(tz: &Toeplitz, statics: &Tensors<F>, dims: &Dims) -> Result<Self> {
        let (b, t, c) = (dims.size("B")?, dims.size("T")?, dims.size("C")?);
        tz.head_dim(c)?;
        let (taps, bias) = tz.prepare_statics(get(statics, "w")?, statics.get("bias"), t)?;
        let g = gpu()?;
        let w = g.upload_slice(FAMILY, &taps)?;
        let (bias, has_bias) = match bias {
            Some(v) => (g.upload_slice(FAMILY, &v)?, 1),
            None => (pool::zeros::<F>(FAMILY, 1)?, 0),
        };
        let hist = pool::zeros::<F>(FAMILY, t * b * c)?;
        let dims = [
            int(FAMILY, "B", b)?,
            int(FAMILY, "T", t)?,
            int(FAMILY, "C", c)?,
            int(FAMILY, "H", tz.cfg.heads)?,
            int(FAMILY, "Kw", tz.cfg.kernel_width)?,
        ];
        Ok(NaiveDecoder { w, bias, has_bias, hist, dims, bc: b * c, tmax: t, t: 0 })
    }
}

impl<F: FftReal> DeviceDecoder for NaiveDecoder<F> {
    fn step(&mut self, token: &DeviceTensors) -> Result<AnyDeviceTensor> {
        mixer_core::mixer::check_decoder_capacity(self.t, self.tmax)?;
        let [b, tn, c, h, kw] = self.dims;
        let want = [b as usize, c as usize];
        let xs = input::<F>(token, "x")?;
        token_shape("x", xs.shape(), &want)?;
        let g = gpu()?;
        if self.bc > 0 {
            let mut dst = self.hist.slice_mut(self.t * self.bc..(self.t + 1) * self.bc);
            g.stream.memcpy_dtod(&xs.view(), &mut dst).map_err(|e| err(FAMILY, format!("copy: {e}")))?;
        }
        let f = g.kernel(FAMILY, &kernels::TOEPLITZ, &[], &format!("toeplitz_step_{}", F::SUFFIX))?;
        let mut y = pool::take::<F>(FAMILY, self.bc)?;
        let ti = self.t as i32;
        // The taps and bias were truncated to T on upload: rows of T entries.
        launch!(g, FAMILY, f, grid1(self.bc, 128);
            &*self.hist, &*self.w, &*self.bias, &self.has_bias, &mut *y, &b, &tn, &c, &h, &kw, &ti, &tn, &tn)?;
        self.t += 1;
        Ok(F::wrap(DeviceTensor::from_pooled(y, &want)?))
    }
    fn cache_elems(&self) -> usize {
        self.t * self.bc
    }
    fn position(&self) -> usize {
        self.t
    }
}
