//! Attention decoder with a device-resident KV cache: a ring buffer of
//! `min(T, w)` rows `[cap, B, H, D]` (the last `w` keys and values for local attention, all of
//! them otherwise). Step `t` copies `k_t, v_t` into row `t mod cap` (device to device) and
//! computes `y_t = softmax(scale· K q_t)ᵀ V` over the `min(t+1, cap)` filled rows, split over
//! the keys (flash-decoding): blocks of 256 keys per (batch, head), a warp per 32 keys reading
//! whole cache rows, write partial maxima, sums and weighted values, and one block per
//! (batch, head) combines them. Two launches per token; nothing waits for the stream.
//!
//! From a KV cache (docs/math.md §7.1, [`from_state`]): the `ℓ` cached tokens become tokens
//! `0 … ℓ − 1` of the ring (built for `ℓ + T` tokens), as on the CPU; the exported state is the
//! last `ℓ'` tokens of the ring, oldest first, in a cache of the given capacity `N` (`T` without
//! a given cache, `w − 1` with a window), `ℓ'` all of them or the last `w − 1`. Rows with
//! different cached lengths get a decoder each.

use cudarc::driver::LaunchConfig;
use mixer_core::mixer::Decoder;
use mixer_core::mixers::attention::Attention;
use mixer_core::mixers::attention::state::lengths;
use mixer_core::state::{by_rows_if_uneven, resumed};
use mixer_core::tensor::{contiguous, get};
use mixer_core::{Dims, DimsExt, Error, Result, Tensors};
use ndarray::{ArrayD, IxDyn};

use super::common::{FAMILY, window_arg};
use crate::forms::{DeviceDecoder, StatefulDeviceDecoder, hosted_decoder, input};
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
    /// The window `w`, if any.
    window: Option<usize>,
    /// The capacity `N` of the exported state's cache (docs/math.md §7.1).
    state_cap: usize,
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
            window: a.window(),
            state_cap: a.window().map_or(tmax, |w| w - 1),
        })
    }

    /// A decoder for `T` more tokens after the `len` tokens cached in `s` (`k [B, N, H, Dk]`,
    /// `v [B, N, H, Dv]`, every row holding `len`): they become tokens `0 … len − 1` of the ring.
    fn from_cache(a: &Attention, dims: &Dims, s: &Tensors<F>, len: usize) -> Result<Self> {
        let mut more = dims.clone();
        more.insert("T", dims.size("T")? + len);
        let mut d = Self::new(a, &more)?;
        let (b, h, dk, dv, cap) = (d.b, d.h, d.dk, d.dv, d.cap);
        let n = get(s, "k")?.shape()[1];
        for (name, dd, buf) in [("k", dk, &mut d.kc), ("v", dv, &mut d.vc)] {
            let c = contiguous(s, name, &[b, n, h, dd])?;
            *buf = pool::upload(FAMILY, &ring_of(&c, [b, n, h * dd], cap, len))?;
        }
        d.t = len;
        d.state_cap = n;
        Ok(d)
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

impl<F: GpuReal> StatefulDeviceDecoder<F> for AttentionDecoder<F> {
    /// The KV cache of the tokens the next one attends over (module documentation).
    fn state(&self) -> Result<Tensors<F>> {
        let (b, h, cap, n) = (self.b, self.h, self.cap, self.state_cap);
        let len = self.window.map_or(self.t, |w| self.t.min(w - 1));
        if len > n {
            return Err(Error::Decoder(format!(
                "the decoder holds {len} tokens, more than the state's capacity N = {n}"
            )));
        }
        let mut out: Tensors<F> = Tensors::new();
        for (name, dd, buf) in [("k", self.dk, &self.kc), ("v", self.dv, &self.vc)] {
            let ring = pool::download(FAMILY, buf, cap * b * h * dd)?;
            let c = cache_of(&ring, [b, n, h * dd], cap, (self.t, len));
            let c = ArrayD::from_shape_vec(IxDyn(&[b, n, h, dd]), c)
                .map_err(|e| Error::Decoder(format!("the exported cache: {e}")))?;
            out.insert(name.to_string(), c);
        }
        out.insert("length".to_string(), ArrayD::from_elem(IxDyn(&[b]), F::of(len as f64)));
        Ok(out)
    }
}

/// The ring `[cap, B, row]` holding rows `0 … len − 1` of the cache `c` (`[B, N, row]` row-major,
/// `row = H·D` per token) as tokens `0 … len − 1` (`len ≤ cap`).
fn ring_of<F: Copy + Default>(c: &[F], [b, n, row]: [usize; 3], cap: usize, len: usize) -> Vec<F> {
    let mut ring = vec![F::default(); cap * b * row];
    for (bi, j) in (0..b).flat_map(|bi| (0..len).map(move |j| (bi, j))) {
        ring[((j % cap) * b + bi) * row..][..row].copy_from_slice(&c[(bi * n + j) * row..][..row]);
    }
    ring
}

/// The cache `[B, N, row]` of the last `len` of the `t` tokens a ring `[cap, B, row]` holds
/// (token `s` in slot `s mod cap`), oldest first, zeros after.
fn cache_of<F: Copy + Default>(
    ring: &[F],
    [b, n, row]: [usize; 3],
    cap: usize,
    (t, len): (usize, usize),
) -> Vec<F> {
    let mut c = vec![F::default(); b * n * row];
    for (bi, j) in (0..b).flat_map(|bi| (0..len).map(move |j| (bi, j))) {
        let slot = (t - len + j) % cap;
        c[(bi * n + j) * row..][..row].copy_from_slice(&ring[(slot * b + bi) * row..][..row]);
    }
    c
}

/// The decoder started from the KV cache `initial` (docs/math.md §7.1; `None`: an empty one),
/// driven with host arrays: the registry's decoder from a state on this backend.
pub fn from_state<F: GpuReal>(
    a: &Attention,
    _statics: &Tensors<F>,
    dims: &Dims,
    initial: Option<&Tensors<F>>,
) -> Result<Box<dyn Decoder<F>>> {
    let Some(s) = initial else { return Ok(hosted_decoder(Box::new(AttentionDecoder::<F>::new(a, dims)?))) };
    let lens = lengths(a, s, dims.size("T")?)?;
    if let Some(d) = by_rows_if_uneven(&lens, s, dims, |one, row| from_state(a, _statics, one, Some(row))) {
        return d;
    }
    let len = lens.first().copied().unwrap_or(0);
    let d = AttentionDecoder::<F>::from_cache(a, dims, s, len)?;
    Ok(resumed(hosted_decoder(Box::new(d)), len))
}

#[cfg(test)]
mod tests {
    use super::{cache_of, ring_of};

    /// A cache loaded into the ring and read back before any step is the same cache; and a ring
    /// that tokens `0 … 6` wrote in turn (slot `s mod 4`) exports its last three, oldest first.
    #[test]
    fn a_cache_loaded_into_the_ring_reads_back_and_the_ring_exports_its_last_tokens() {
        let (b, n, row, cap) = (2, 5, 3, 4);
        let len = 3;
        let c: Vec<f64> =
            (0..b * n * row).map(|i| if (i / row) % n < len { i as f64 + 1.0 } else { 0.0 }).collect();
        assert_eq!(cache_of(&ring_of(&c, [b, n, row], cap, len), [b, n, row], cap, (len, len)), c);
        let ring: Vec<f64> = (0..cap * b * row)
            .map(|i| {
                let slot = i / (b * row);
                (if slot + cap <= 6 { slot + cap } else { slot }) as f64
            })
            .collect();
        let out = cache_of(&ring, [b, n, row], cap, (7, 3));
        let tokens: Vec<f64> = (0..n).map(|j| out[j * row]).collect();
        assert_eq!(tokens, [4.0, 5.0, 6.0, 0.0, 0.0]);
    }
}
