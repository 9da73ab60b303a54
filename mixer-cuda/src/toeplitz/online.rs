//! The online (relaxed) FFT decoder on the GPU (docs/math.md §3): each token after `O(log² t)`
//! amortised work, nothing waiting for the stream.
//!
//! Split the pairs `(s, t')`, `s < t'`, by the highest bit in which `s` and `t'` differ: each
//! falls in exactly one tile whose inputs are the aligned block `[n − k, n)` and whose outputs
//! are `[n, n + k)`, `k` the lowest set bit of `n`. After token `n − 1` the decoder adds that
//! tile to the pending sums of its outputs,
//! `pending[n + r] += Σ_{j<k} w[k + r − j] · x_{n−k+j}` (`r < k`),
//! and token `t`'s output is `y_t = pending[t] + w[0]·x_t + bias[t]` (with kernel width `K_w`,
//! summed over the taps' source channels). Small tiles (`k ≤` [`DIRECT_MAX`]) are one direct
//! kernel; larger ones a batched real FFT pair of size `2k` (outputs `k..2k` of the circular
//! convolution have no wrap-around), with the kernel block's spectrum computed once per level.
//! Level `j` fires every `2^{j+1}` tokens at cost `O(2^j j)`: `O(T log² T)` in total.
//!
//! Device state: the input history and the pending sums, both `[T, B, C]` (`O(T)`), and one
//! spectrum per level.

use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::{Dims, Result, Tensors};

use super::common::FAMILY;
use super::decoder::Statics;
use super::fast::tiles;
use super::spectra;
use crate::fft::{FftReal, irfft, rfft};
use crate::forms::{DeviceDecoder, StatefulDeviceDecoder};
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu, grid1, int, launch};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// Tiles of at most this many inputs are computed directly (`O(k²)` per channel), larger ones
/// by FFT.
pub const DIRECT_MAX: usize = 64;

/// The online Toeplitz decoder (device-resident history and pending sums).
pub struct OnlineDecoder<F: FftReal> {
    s: Statics<F>,
    hist: Pooled<F>,
    pending: Pooled<F>,
    /// Per level `j` (tile size `k = 2^j` above [`DIRECT_MAX`]): the spectra of `w[i, h, 0..2k)`,
    /// rows `i·H + h`, computed when the level first fires.
    levels: Vec<Option<Pooled<F::C>>>,
    t: usize,
    /// One past the furthest output a fired tile has reached.
    ahead: usize,
}

impl<F: FftReal> OnlineDecoder<F> {
    /// Uploads the taps and bias (truncated to `T`) and allocates the history and pending sums.
    pub fn new(tz: &Toeplitz, statics: &Tensors<F>, dims: &Dims) -> Result<Self> {
        let s = Statics::upload(tz, statics, dims)?;
        let n = s.tmax * s.bc;
        Ok(OnlineDecoder {
            s,
            hist: pool::zeros::<F>(FAMILY, n)?,
            pending: pool::zeros::<F>(FAMILY, n)?,
            levels: Vec::new(),
            t: 0,
            ahead: 0,
        })
    }

    /// The spectra of level `j` (tile size `k = 2^j`, transform size `2k`), computed on first use.
    fn level(&mut self, j: usize) -> Result<&Pooled<F::C>> {
        if self.levels.len() <= j {
            self.levels.resize_with(j + 1, || None);
        }
        if self.levels[j].is_none() {
            let m = 2usize << j;
            let [_, _, _, h, kw] = self.s.dims;
            let (rows, w) = ((kw * h) as usize, &self.s.w);
            self.levels[j] =
                Some(spectra::compute::<F>(&w.slice(0..w.len()), rows, self.s.tmax, m.min(self.s.tmax), m)?);
        }
        self.levels[j].as_ref().ok_or_else(|| err(FAMILY, "level spectrum missing"))
    }

    /// Adds the tile of inputs `[n − k, n)` to the pending sums of outputs `[n, n + k) ∩ [0, T)`.
    fn tile(&mut self, n: usize, k: usize) -> Result<()> {
        let rows = k.min(self.s.tmax - n);
        let [b, tn, c, h, kw] = self.s.dims;
        let g = gpu()?;
        let f = |name: &str| g.kernel(FAMILY, &kernels::TOEPLITZ, &[], &format!("{name}_{}", F::SUFFIX));
        let (ni, ki, ri) = (int(FAMILY, "n", n)?, int(FAMILY, "k", k)?, int(FAMILY, "rows", rows)?);
        if k <= DIRECT_MAX {
            launch!(g, FAMILY, f("toeplitz_online_direct")?, grid1(rows * self.s.bc, 128);
                &*self.hist, &mut *self.pending, &*self.s.w, &b, &c, &h, &kw, &ni, &ki, &ri, &tn)?;
            return Ok(());
        }
        let m = 2 * k;
        let (bc, bu, cu) = (self.s.bc, b as usize, c as usize);
        // The block's rows of the history [T, B, C] into zero-padded rows [B·C, 2k].
        let block = self.hist.slice((n - k) * bc..n * bc);
        let mut xp = pool::take::<F>(FAMILY, bc * m)?;
        let (mi, sb, st) = (int(FAMILY, "2k", m)?, c as i64, bc as i64);
        launch!(g, FAMILY, f("toeplitz_pack_x")?, tiles(m, cu, bu)?; &block, &mut *xp, &b, &ki, &c, &mi, &sb, &st)?;
        let xh = rfft::<F>(FAMILY, &xp, m, bc)?;
        drop(xp);
        let j = k.trailing_zeros() as usize;
        let nf = k + 1;
        let mut yh = pool::take::<F::C>(FAMILY, bc * nf)?;
        let nfi = int(FAMILY, "k+1", nf)?;
        let wh = self.level(j)?;
        launch!(g, FAMILY, f("toeplitz_mul")?, super::fast::mul_grid(bc, nf); &*xh, &**wh, &mut *yh, &b, &c, &h, &kw, &nfi, &0i32)?;
        drop(xh);
        let yr = irfft::<F>(FAMILY, yh, m, bc)?;
        launch!(g, FAMILY, f("toeplitz_online_acc")?, grid1(rows * bc, 256);
            &*yr, &mut *self.pending, &b, &c, &ni, &ki, &ri)?;
        Ok(())
    }
}

impl<F: FftReal> DeviceDecoder for OnlineDecoder<F> {
    fn step(&mut self, token: &DeviceTensors) -> Result<AnyDeviceTensor> {
        self.s.append(&mut self.hist, self.t, token)?;
        let [b, tn, c, h, kw] = self.s.dims;
        let want = [b as usize, c as usize];
        let g = gpu()?;
        let mut y = pool::take::<F>(FAMILY, self.s.bc)?;
        if self.s.bc > 0 {
            let f =
                g.kernel(FAMILY, &kernels::TOEPLITZ, &[], &format!("toeplitz_online_out_{}", F::SUFFIX))?;
            let ti = int(FAMILY, "t", self.t)?;
            // The taps and bias were truncated to T on upload: rows of T entries.
            launch!(g, FAMILY, f, grid1(self.s.bc, 128);
                &*self.hist, &*self.pending, &*self.s.w, &*self.s.bias, &self.s.has_bias, &mut *y, &b, &c, &h, &kw, &ti,
                &tn, &tn)?;
        }
        self.t += 1;
        let n = self.t;
        if n < self.s.tmax && self.s.bc > 0 {
            let k = 1usize << n.trailing_zeros();
            self.tile(n, k)?;
            self.ahead = self.ahead.max((n + k).min(self.s.tmax));
        }
        Ok(F::wrap(DeviceTensor::from_pooled(y, &want)?))
    }
    /// The input history plus the pending sums not yet consumed.
    fn cache_elems(&self) -> usize {
        self.t.max(self.ahead) * self.s.bc
    }
    fn position(&self) -> usize {
        self.t
    }
}

impl<F: FftReal> StatefulDeviceDecoder<F> for OnlineDecoder<F> {
    fn state(&self) -> Result<Tensors<F>> {
        self.s.state(&self.hist, self.t)
    }
}
