//! Attention decoder with a device-resident KV cache: a ring buffer of
//! `min(T, w)` rows `[cap, B, H, D]` (the last `w` keys and values for local attention, all of
//! them otherwise). Step `t` copies `k_t, v_t` into row `t mod cap` (device to device) and
//! computes `y_t = softmax(scale· K q_t)ᵀ V` over the `min(t+1, cap)` filled rows, split over
//! the keys (flash-decoding): blocks of 256 keys per (batch, head), a warp per 32 keys reading
//! whole cache rows, write partial maxima, sums and weighted values, and one block per
//! (batch, head) combines them. Two launches per token; nothing waits for the stream.

use cudarc::driver::LaunchConfig;
use mixer_core::mixers::attention::Attention;
use mixer_core::{Dims, DimsExt, Error, Result};

use super::common::{FAMILY, window_arg};
use crate::forms::{DeviceDecoder, input};
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu, int, launch, max_dynamic_smem, opt_in};
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// Keys per split block (`ATTN_SPLIT_KEYS` in `attention.cu`).
const SPLIT_KEYS: usize = 256;
/// Threads per split block (`ATTN_SPLIT_THREADS`).
const SPLIT_THREADS: usize = 256;

/// Dynamic shared memory of a split block: each warp's weighted-value sums, `[warps, Dv]` doubles.
const fn split_smem(dv: usize) -> usize {
    SPLIT_THREADS / 32 * dv * 8
}

/// The attention decoder (KV cache on the device).
pub struct AttentionDecoder<F: GpuReal> {
    kc: Pooled<F>,
    vc: Pooled<F>,
    /// Partials `[B·H, S, 2 + Dv]` of the split steps (`S = ⌈cap / 256⌉`).
    part: Pooled<f64>,
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
        if split_smem(dv) > max_dynamic_smem() {
            return Err(err(
                FAMILY,
                format!(
                    "the CUDA decoder takes value heads up to Dv = {}, got Dv = {dv}",
                    max_dynamic_smem() / split_smem(1)
                ),
            ));
        }
        let w = window_arg(a, tmax);
        let cap = if w > 0 { w as usize } else { tmax.max(1) };
        Ok(AttentionDecoder {
            kc: pool::zeros::<F>(FAMILY, cap * b * h * dk)?,
            vc: pool::zeros::<F>(FAMILY, cap * b * h * dv)?,
            part: pool::zeros::<f64>(FAMILY, b * h * cap.div_ceil(SPLIT_KEYS) * (2 + dv))?,
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

/// Checks a token input's shape.
pub(crate) fn token_shape(name: &str, got: &[usize], want: &[usize]) -> Result<()> {
    if got != want {
        return Err(Error::shape(
            name,
            mixer_core::error::fmt_shape(want),
            mixer_core::error::fmt_shape(got),
        ));
    }
    Ok(())
}

impl<F: GpuReal> DeviceDecoder for AttentionDecoder<F> {
    fn step(&mut self, tok: &DeviceTensors) -> Result<AnyDeviceTensor> {
        mixer_core::mixer::check_decoder_capacity(self.t, self.tmax)?;
        let (b, h, dk, dv) = (self.b, self.h, self.dk, self.dv);
        let (q, k, v) = (input::<F>(tok, "q")?, input::<F>(tok, "k")?, input::<F>(tok, "v")?);
        token_shape("q", q.shape(), &[b, h, dk])?;
        token_shape("k", k.shape(), &[b, h, dk])?;
        token_shape("v", v.shape(), &[b, h, dv])?;
        let g = gpu()?;
        let slot = self.t % self.cap;
        let (nk, nv) = (b * h * dk, b * h * dv);
        let copy = |e| err(FAMILY, format!("copy into the KV cache: {e}"));
        if nk > 0 {
            g.stream()
                .memcpy_dtod(&k.view(), &mut self.kc.slice_mut(slot * nk..(slot + 1) * nk))
                .map_err(copy)?;
        }
        if nv > 0 {
            g.stream()
                .memcpy_dtod(&v.view(), &mut self.vc.slice_mut(slot * nv..(slot + 1) * nv))
                .map_err(copy)?;
        }
        self.t += 1;
        if nv == 0 || b * h == 0 {
            return Ok(F::wrap(DeviceTensor::<F>::zeros(&[b, h, dv])?));
        }
        let mut y = pool::take::<F>(FAMILY, nv)?;
        let split = g.kernel(FAMILY, &kernels::ATTENTION, &[], &format!("attn_split_{}", F::SUFFIX))?;
        let combine = g.kernel(FAMILY, &kernels::ATTENTION, &[], &format!("attn_combine_{}", F::SUFFIX))?;
        let n = self.filled();
        let splits = n.div_ceil(SPLIT_KEYS);
        let bhi = int(FAMILY, "B·H", b * h)? as u32;
        // Checked against the ceiling in `new`.
        let smem = split_smem(dv);
        if smem > 48 << 10 {
            opt_in(FAMILY, &split)?;
        }
        let cfg = LaunchConfig {
            grid_dim: (bhi, splits as u32, 1),
            block_dim: (SPLIT_THREADS as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (bi, hi, dki, dvi, ni, si) = (
            int(FAMILY, "B", b)?,
            int(FAMILY, "H", h)?,
            int(FAMILY, "Dk", dk)?,
            int(FAMILY, "Dv", dv)?,
            int(FAMILY, "n", n)?,
            int(FAMILY, "splits", splits)?,
        );
        let qv = q.view();
        launch!(g, FAMILY, split, cfg;
            &qv, &*self.kc, &*self.vc, &mut *self.part, &bi, &hi, &dki, &dvi, &ni, &self.scale)?;
        let cfg = LaunchConfig { grid_dim: (bhi, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        launch!(g, FAMILY, combine, cfg; &*self.part, &mut *y, &hi, &dvi, &si, &self.scale)?;
        Ok(F::wrap(DeviceTensor::from_pooled(y, &[b, h, dv])?))
    }
    fn cache_elems(&self) -> usize {
        self.filled() * self.b * self.h * (self.dk + self.dv)
    }
    fn position(&self) -> usize {
        self.t
    }
}
