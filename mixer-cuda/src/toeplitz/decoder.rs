//! Naive decoder on the GPU: the input history `x_0..x_t` stays on the device
//! (`[T, B, C]`), and token $t$ costs $O(t)$ per channel:
//! $y_{t,e} = \sum_i \sum_{s \le t} w[i,h(e),t-s]\, x_s[e+i-(K_w-1)] + \text{bias}[h(e),t]$.
//! Its cache is the whole history ($t \cdot B \cdot C$ elements after $t$ tokens).

use cudarc::driver::CudaSlice;
use mixer_core::mixer::Decoder;
use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::{Dims, Error, Result, Tensors};
use ndarray::ArrayD;

use super::{KERNEL, SRC};
use crate::runtime::{GpuReal, gpu, grid1, input, int, launch, source};

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
        let get = |s: &str| {
            dims.get(s)
                .copied()
                .ok_or_else(|| Error::Decoder(format!("toeplitz decoder: size `{s}` not bound")))
        };
        let (b, t, c) = (get("B")?, get("T")?, get("C")?);
        tz.head_dim(c)?;
        let (taps, bias) = tz.prepare_statics(input(statics, KERNEL, "w")?, statics.get("bias"), t)?;
        let g = gpu()?;
        let w = g.upload_slice(KERNEL, &taps)?;
        let (bias, has_bias) = match bias {
            Some(v) => (g.upload_slice(KERNEL, &v)?, 1),
            None => (g.zeros::<F>(KERNEL, 1)?, 0),
        };
        let hist = g.zeros::<F>(KERNEL, t * b * c)?;
        let dims = [
            int(KERNEL, "B", b)?,
            int(KERNEL, "T", t)?,
            int(KERNEL, "C", c)?,
            int(KERNEL, "H", tz.cfg.heads)?,
            int(KERNEL, "Kw", tz.cfg.kernel_width)?,
        ];
        Ok(NaiveDecoder { w, bias, has_bias, hist, dims, bc: b * c, tmax: t, t: 0 })
    }
}

impl<F: GpuReal> Decoder<F> for NaiveDecoder<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        let x = input(token, KERNEL, "x")?;
        let [b, _, c, h, kw] = self.dims;
        let want = [b as usize, c as usize];
        if x.shape() != want {
            return Err(Error::shape("x", format!("{want:?} (one token)"), format!("{:?}", x.shape())));
        }
        if self.t >= self.tmax {
            return Err(Error::Decoder(format!(
                "toeplitz decoder: step {} beyond T = {}",
                self.t, self.tmax
            )));
        }
        let g = gpu()?;
        let xs = x.as_standard_layout();
        let xs = xs.as_slice().unwrap_or(&[]);
        let mut dst = self.hist.slice_mut(self.t * self.bc..(self.t + 1) * self.bc);
        g.stream.memcpy_htod(xs, &mut dst).map_err(|e| crate::runtime::err(KERNEL, format!("copy: {e}")))?;
        let f = g.function(KERNEL, &source(SRC), &[], &format!("toeplitz_step_{}", F::SUFFIX))?;
        let mut y = g.zeros::<F>(KERNEL, self.bc)?;
        let ti = self.t as i32;
        let tn = self.dims[1];
        launch!(g, KERNEL, f, grid1(self.bc, 128);
            &self.hist, &self.w, &self.bias, &self.has_bias, &mut y, &b, &tn, &c, &h, &kw, &ti)?;
        g.sync(KERNEL)?;
        self.t += 1;
        g.download(KERNEL, &y, &want)
    }
    fn cache_elems(&self) -> usize {
        self.t * self.bc
    }
    fn position(&self) -> usize {
        self.t
    }
}
