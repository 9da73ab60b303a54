//! Attention decoder with a device-resident KV cache: a ring buffer of
//! $\min(T, w)$ rows `[cap, B, H, D]` (the last $w$ keys and values for local attention, all of
//! them otherwise). Step $t$ copies $k_t, v_t$ into row $t \bmod \text{cap}$ and computes
//! $y_t = \mathrm{softmax}(\text{scale}\cdot K q_t)^\top V$ over the $\min(t+1, \text{cap})$ filled rows.

use cudarc::driver::{CudaSlice, LaunchConfig};
use mixer_core::mixer::Decoder;
use mixer_core::mixers::attention::Attention;
use mixer_core::{Dims, Error, Result, Tensors};
use ndarray::ArrayD;

use super::{KERNEL, SRC, window_arg};
use crate::runtime::{GpuReal, err, gpu, input, int, launch, source};

/// The attention decoder (KV cache on the device).
pub struct KvDecoder<F: GpuReal> {
    kc: CudaSlice<F>,
    vc: CudaSlice<F>,
    scratch: CudaSlice<F>,
    b: usize,
    h: usize,
    dk: usize,
    dv: usize,
    cap: usize,
    tmax: usize,
    t: usize,
    /// The score scale, passed to the kernel as a double (overflow-free logits).
    scale: f64,
}

impl<F: GpuReal> KvDecoder<F> {
    /// Allocates the cache for length `T`.
    pub fn new(a: &Attention, dims: &Dims) -> Result<Self> {
        let get = |s: &str| {
            dims.get(s)
                .copied()
                .ok_or_else(|| Error::Decoder(format!("attention decoder: size `{s}` not bound")))
        };
        let (b, tmax, h, dk, dv) = (get("B")?, get("T")?, get("H")?, get("Dk")?, get("Dv")?);
        let w = window_arg(a, tmax);
        let cap = if w > 0 { w as usize } else { tmax.max(1) };
        let g = gpu()?;
        Ok(KvDecoder {
            kc: g.zeros::<F>(KERNEL, cap * b * h * dk)?,
            vc: g.zeros::<F>(KERNEL, cap * b * h * dv)?,
            scratch: g.zeros::<F>(KERNEL, b * h * cap)?,
            b,
            h,
            dk,
            dv,
            cap,
            tmax,
            t: 0,
            scale: a.scale(dk),
        })
    }

    fn filled(&self) -> usize {
        self.t.min(self.cap)
    }
}

/// Token input `name` as a row-major vector, after checking its shape.
fn token<F: GpuReal>(tok: &Tensors<F>, name: &str, want: &[usize]) -> Result<Vec<F>> {
    let a = input(tok, KERNEL, name)?;
    if a.shape() != want {
        return Err(Error::shape(name, format!("{want:?} (one token)"), format!("{:?}", a.shape())));
    }
    Ok(a.iter().copied().collect())
}

impl<F: GpuReal> Decoder<F> for KvDecoder<F> {
    fn step(&mut self, tok: &Tensors<F>) -> Result<ArrayD<F>> {
        if self.t >= self.tmax {
            return Err(Error::Decoder(format!(
                "attention decoder: step {} beyond T = {}",
                self.t, self.tmax
            )));
        }
        let (b, h, dk, dv) = (self.b, self.h, self.dk, self.dv);
        let q = token(tok, "q", &[b, h, dk])?;
        let k = token(tok, "k", &[b, h, dk])?;
        let v = token(tok, "v", &[b, h, dv])?;
        let g = gpu()?;
        let slot = self.t % self.cap;
        let (nk, nv) = (b * h * dk, b * h * dv);
        let copy = |e| err(KERNEL, format!("copy into the KV cache: {e}"));
        if nk > 0 {
            g.stream.memcpy_htod(&k, &mut self.kc.slice_mut(slot * nk..(slot + 1) * nk)).map_err(copy)?;
        }
        if nv > 0 {
            g.stream.memcpy_htod(&v, &mut self.vc.slice_mut(slot * nv..(slot + 1) * nv)).map_err(copy)?;
        }
        self.t += 1;
        if nv == 0 || b * h == 0 {
            return Ok(ArrayD::zeros(ndarray::IxDyn(&[b, h, dv])));
        }
        let dq = g.upload_slice(KERNEL, &q)?;
        let mut y = g.zeros::<F>(KERNEL, nv)?;
        let f = g.function(KERNEL, &source(SRC), &[], &format!("attn_step_{}", F::SUFFIX))?;
        let cfg = LaunchConfig {
            grid_dim: (int(KERNEL, "B·H", b * h)? as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (bi, hi, dki, dvi, capi, ni) = (
            int(KERNEL, "B", b)?,
            int(KERNEL, "H", h)?,
            int(KERNEL, "Dk", dk)?,
            int(KERNEL, "Dv", dv)?,
            int(KERNEL, "cap", self.cap)?,
            int(KERNEL, "n", self.filled())?,
        );
        launch!(g, KERNEL, f, cfg;
            &dq, &self.kc, &self.vc, &mut self.scratch, &mut y, &bi, &hi, &dki, &dvi, &capi, &ni, &self.scale)?;
        g.sync(KERNEL)?;
        g.download(KERNEL, &y, &[b, h, dv])
    }
    fn cache_elems(&self) -> usize {
        self.filled() * self.b * self.h * (self.dk + self.dv)
    }
    fn position(&self) -> usize {
        self.t
    }
}
