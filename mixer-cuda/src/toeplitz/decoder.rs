//! Naive decoder on the GPU: the input history `x_0..x_t` stays on the device
//! (`[T, B, C]`), and token `t` costs `O(t)` per channel:
//! `y_{t,e} = Σ_i Σ_{s ≤ t} w[i,h(e),t−s] x_s[e+i−(K_w−1)] + bias[h(e),t]`.
//! Its cache is the whole history (`t · B · C` elements after `t` tokens).

use cudarc::driver::CudaSlice;
use mixer_core::mixer::{Decoder, check_decoder_capacity};
use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::tensor::{contiguous, get};
use mixer_core::{Dims, DimsExt, Result, Tensors};
use ndarray::ArrayD;

use super::FAMILY;
use crate::kernels;
use crate::runtime::{GpuReal, gpu, grid1, int, launch};

/// The naive Toeplitz decoder (device-resident history).
pub struct NaiveDecoder<F: GpuReal> {
    w: CudaSlice<F>,
    bias: CudaSlice<F>,
    has_bias: i32,
    hist: CudaSlice<F>,
    dims: [i32; 5],
    bc: usize,
    tmax: usize,
    t: usize,
}

impl<F: GpuReal> NaiveDecoder<F> {
    /// Uploads the taps and bias (truncated to `T`) and allocates the history.
    pub fn new(tz: &Toeplitz, statics: &Tensors<F>, dims: &Dims) -> Result<Self> {
        let (b, t, c) = (dims.size("B")?, dims.size("T")?, dims.size("C")?);
        tz.head_dim(c)?;
        let (taps, bias) = tz.prepare_statics(get(statics, "w")?, statics.get("bias"), t)?;
        let g = gpu()?;
        let w = g.upload_slice(FAMILY, &taps)?;
        let (bias, has_bias) = match bias {
            Some(v) => (g.upload_slice(FAMILY, &v)?, 1),
            None => (g.zeros::<F>(FAMILY, 1)?, 0),
        };
        let hist = g.zeros::<F>(FAMILY, t * b * c)?;
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

impl<F: GpuReal> Decoder<F> for NaiveDecoder<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        check_decoder_capacity(self.t, self.tmax)?;
        let [b, _, c, h, kw] = self.dims;
        let want = [b as usize, c as usize];
        let xs = contiguous(token, "x", &want)?;
        let g = gpu()?;
        let mut dst = self.hist.slice_mut(self.t * self.bc..(self.t + 1) * self.bc);
        g.stream
            .memcpy_htod(&xs[..], &mut dst)
            .map_err(|e| crate::runtime::err(FAMILY, format!("copy: {e}")))?;
        let f =
            g.function(FAMILY, &kernels::TOEPLITZ.full(), &[], &format!("toeplitz_step_{}", F::SUFFIX))?;
        let mut y = g.zeros::<F>(FAMILY, self.bc)?;
        let ti = self.t as i32;
        let tn = self.dims[1];
        launch!(g, FAMILY, f, grid1(self.bc, 128);
            &self.hist, &self.w, &self.bias, &self.has_bias, &mut y, &b, &tn, &c, &h, &kw, &ti)?;
        g.sync(FAMILY)?;
        self.t += 1;
        g.download(FAMILY, &y, &want)
    }
    fn cache_elems(&self) -> usize {
        self.t * self.bc
    }
    fn position(&self) -> usize {
        self.t
    }
}
