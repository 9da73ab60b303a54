//! The naive decoder on the GPU (as the CPU's `naive.rs`): the input history `x_0..x_t` stays on
//! the device (`[T, B, C]`), and token `t` costs `O(t)` per channel:
//! `y_{t,e} = Σ_i Σ_{s ≤ t} w[i,h(e),t−s] x_s[e+i−(K_w−1)] + bias[h(e),t]`.
//! Its cache is the whole history (`t · B · C` elements after `t` tokens). Each step copies
//! `x_t` into the history on the device and launches one kernel; nothing waits.

use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::{Dims, Result, Tensors};

use super::common::FAMILY;
use super::decoder::Statics;
use crate::fft::FftReal;
use crate::forms::{DeviceDecoder, StatefulDeviceDecoder};
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{gpu, grid1, launch};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

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

impl<F: FftReal> StatefulDeviceDecoder<F> for NaiveDecoder<F> {
    fn state(&self) -> Result<Tensors<F>> {
        self.s.state(&self.hist, self.t)
    }
}
