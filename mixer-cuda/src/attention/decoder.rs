//! Attention decoder with a device-resident KV cache: a ring buffer of
//! `min(T, w)` rows `[cap, B, H, D]` (the last `w` keys and values for local attention, all of
//! them otherwise). Step `t` copies `k_t, v_t` into row `t mod cap` and computes
//! `y_t = softmax(scale· K q_t)ᵀ V` over the `min(t+1, cap)` filled rows.

use cudarc::driver::{CudaSlice, LaunchConfig};
use mixer_core::mixer::{Decoder, check_decoder_capacity};
use mixer_core::mixers::attention::Attention;
use mixer_core::tensor::contiguous;
use mixer_core::{Dims, DimsExt, Result, Tensors};
use ndarray::ArrayD;

use super::{FAMILY, window_arg};
use crate::kernels;
use crate::runtime::{GpuReal, err, gpu, int, launch};

/// The attention decoder (KV cache on the device).
pub struct AttentionDecoder<F: GpuReal> {
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

impl<F: GpuReal> AttentionDecoder<F> {
    /// Allocates the cache for length `T`.
    pub fn new(a: &Attention, dims: &Dims) -> Result<Self> {
        let (b, tmax, h, dk, dv) =
            (dims.size("B")?, dims.size("T")?, dims.size("H")?, dims.size("Dk")?, dims.size("Dv")?);
        let w = window_arg(a, tmax);
        let cap = if w > 0 { w as usize } else { tmax.max(1) };
        let g = gpu()?;
        Ok(AttentionDecoder {
            kc: g.zeros::<F>(FAMILY, cap * b * h * dk)?,
            vc: g.zeros::<F>(FAMILY, cap * b * h * dv)?,
            scratch: g.zeros::<F>(FAMILY, b * h * cap)?,
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

impl<F: GpuReal> Decoder<F> for AttentionDecoder<F> {
    fn step(&mut self, tok: &Tensors<F>) -> Result<ArrayD<F>> {
        check_decoder_capacity(self.t, self.tmax)?;
        let (b, h, dk, dv) = (self.b, self.h, self.dk, self.dv);
        let q = contiguous(tok, "q", &[b, h, dk])?;
        let k = contiguous(tok, "k", &[b, h, dk])?;
        let v = contiguous(tok, "v", &[b, h, dv])?;
        let g = gpu()?;
        let slot = self.t % self.cap;
        let (nk, nv) = (b * h * dk, b * h * dv);
        let copy = |e| err(FAMILY, format!("copy into the KV cache: {e}"));
        if nk > 0 {
            g.stream.memcpy_htod(&k[..], &mut self.kc.slice_mut(slot * nk..(slot + 1) * nk)).map_err(copy)?;
        }
        if nv > 0 {
            g.stream.memcpy_htod(&v[..], &mut self.vc.slice_mut(slot * nv..(slot + 1) * nv)).map_err(copy)?;
        }
        self.t += 1;
        if nv == 0 || b * h == 0 {
            return Ok(ArrayD::zeros(ndarray::IxDyn(&[b, h, dv])));
        }
        let dq = g.upload_slice(FAMILY, &q[..])?;
        let mut y = g.zeros::<F>(FAMILY, nv)?;
        let f = g.function(FAMILY, &kernels::ATTENTION.full(), &[], &format!("attn_step_{}", F::SUFFIX))?;
        let cfg = LaunchConfig {
            grid_dim: (int(FAMILY, "B·H", b * h)? as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (bi, hi, dki, dvi, capi, ni) = (
            int(FAMILY, "B", b)?,
            int(FAMILY, "H", h)?,
            int(FAMILY, "Dk", dk)?,
            int(FAMILY, "Dv", dv)?,
            int(FAMILY, "cap", self.cap)?,
            int(FAMILY, "n", self.filled())?,
        );
        launch!(g, FAMILY, f, cfg;
            &dq, &self.kc, &self.vc, &mut self.scratch, &mut y, &bi, &hi, &dki, &dvi, &capi, &ni, &self.scale)?;
        g.sync(FAMILY)?;
        g.download(FAMILY, &y, &[b, h, dv])
    }
    fn cache_elems(&self) -> usize {
        self.filled() * self.b * self.h * (self.dk + self.dv)
    }
    fn position(&self) -> usize {
        self.t
    }
}
