//! The online (relaxed) FFT decoder: each token after `O(log² t)` amortised work.
//!
//! Per output channel the decoder must produce `y_t = Σ_{s≤ t} w[t−s] x_s` knowing only
//! `x_0..x_t`. Split the pairs `(s, t')`, `s < t'`, by the highest bit `j` in which `s` and `t'`
//! differ: then `s` lies in an even block and `t'` in the next (odd) block of the aligned
//! blocks of length `k = 2^j`. Every pair falls in exactly one such tile, and the tile with
//! input block `[n−k, n)` (`n` an odd multiple of `k`, i.e. `k` = the lowest set bit of `n`)
//! can be computed as soon as `n` tokens are known. So after consuming token `n−1` the decoder
//! adds, for every `t' ∈ [n, n+k)`,
//!
//! `pending[t'] += Σ_{s=n−k}^(n−1) w[t'−s] x_s (1 ≤ t'−s ≤ 2k−1)`
//!
//! — a convolution of the block with `w[0..2k)` of which the outputs `k..2k` are needed;
//! a circular convolution of size `2k` does not alias there (the linear one ends at `3k−2`),
//! so one real FFT pair of size `2k` (power of two) suffices, with the kernel block's
//! spectrum (scaled once by `1/(2k)`) computed once per level. Then
//! `y_t = pending[t] + w[0]·x_t + bias[t]`. Level `j` fires every `2^{j+1}` tokens at cost
//! `O(2^j j)`: `O(T log² T)` in total (FutureFill; van der Hoeven's relaxed multiplication).
//! Small tiles (`k ≤` [`DIRECT_MAX`]) are computed directly, which is cheaper there.
//!
//! With kernel width `Kw`, input spectra are computed once per input channel and combined
//! per output channel over its valid shifts before one inverse transform.
//!
//! Cache: the input history (a tile may reach back `t/2` tokens, so all of it is kept) plus
//! the pending contributions to future outputs (at most `t` ahead).

use std::collections::VecDeque;

use mixer_core::mixer::Decoder;
use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::parallel::min_len;
use mixer_core::{Dims, Result, Tensors};
use ndarray::ArrayD;
use rayon::prelude::*;
use realfft::num_complex::Complex;

use super::decoder::History;
use super::fast::{Buffers, FftReal, plans};
use super::naive::dot_rev;

/// Tiles of at most this many inputs are computed directly (`O(k²)`), larger ones by FFT.
pub const DIRECT_MAX: usize = 32;

/// Work (`k × channels`) above which a tile is spread over threads.
const PAR_WORK: usize = 1 << 14;

/// Online FFT decoder.
pub struct OnlineDecoder<F> {
    base: History<F>,
    /// `pending[b·C + e][r]`: contributions already added to output `pos + r`.
    pending: Vec<VecDeque<F>>,
    /// Per level `j`: the spectra of `w[i, h, 0..2^{j+1})` (size `2^{j+1}`, scaled by its
    /// inverse), rows `i·H + h`; computed when the level first fires.
    levels: Vec<Option<Vec<Vec<Complex<F>>>>>,
}

impl<F: FftReal> OnlineDecoder<F> {
    /// From the static inputs `w`, `bias` and the sizes.
    pub fn new(m: &Toeplitz, statics: &Tensors<F>, dims: &Dims) -> Result<Self> {
        let base = History::new(m, statics, dims)?;
        let pending = (0..base.batch * base.channels).map(|_| VecDeque::new()).collect();
        Ok(OnlineDecoder { base, pending, levels: Vec::new() })
    }

    fn level_spectra(&mut self, j: usize) -> Result<&[Vec<Complex<F>>]> {
        if self.levels.len() <= j {
            self.levels.resize_with(j + 1, || None);
        }
        if self.levels[j].is_none() {
            let size = 2usize << j;
            let pl = plans::<F>(size);
            let scale = F::one() / F::of(size as f64);
            let rows = self.base.m.cfg.kernel_width * self.base.m.cfg.heads;
            let n = self.base.limit;
            let taps = self.base.taps();
            let mut buf = Buffers::new(&pl);
            let mut out = Vec::with_capacity(rows);
            for r in 0..rows {
                let row = &taps[r * n..(r + 1) * n];
                buf.forward(&pl, &row[..size.min(n)])?;
                out.push(buf.spec.iter().map(|z| z * scale).collect());
            }
            self.levels[j] = Some(out);
        }
        Ok(self.levels[j].as_deref().unwrap_or(&[]))
    }

    /// Adds the tile of inputs `[n−k, n)` to the pending outputs `[n, n + reach)`.
    fn fill(&mut self, n: usize) -> Result<()> {
        if n >= self.base.limit {
            return Ok(());
        }
        let k = n & n.wrapping_neg();
        let reach = k.min(self.base.limit - n);
        let (nb, c) = (self.base.batch, self.base.channels);
        let tiles: Vec<Vec<F>> =
            if k <= DIRECT_MAX { self.tile_direct(n, k, reach) } else { self.tile_fft(n, k, reach)? };
        for (pend, z) in self.pending.iter_mut().zip(tiles).take(nb * c) {
            if pend.len() < reach {
                pend.resize(reach, F::zero());
            }
            for (r, v) in z.into_iter().enumerate() {
                pend[r] += v;
            }
        }
        Ok(())
    }

    fn tile_direct(&self, n: usize, k: usize, reach: usize) -> Vec<Vec<F>> {
        let base = &self.base;
        let (c, d) = (base.channels, base.head_dim);
        (0..base.batch * c)
            .map(|idx| {
                let (b, e) = (idx / c, idx % c);
                let h = e / d;
                let mut z = vec![F::zero(); reach];
                for (i, dl) in base.m.shifts(e % d) {
                    let w = base.tap_row(i, h);
                    let u = &base.hist[b * c + e - dl][n - k..n];
                    for (r, zr) in z.iter_mut().enumerate() {
                        // Σ_a w[k + r − a] u[a]
                        *zr += dot_rev(&w[r + 1..k + r + 1], u);
                    }
                }
                z
            })
            .collect()
    }

    fn tile_fft(&mut self, n: usize, k: usize, reach: usize) -> Result<Vec<Vec<F>>> {
        let j = k.trailing_zeros() as usize;
        let size = 2 * k;
        let pl = plans::<F>(size);
        self.level_spectra(j)?;
        let w_hat = self.levels[j].as_deref().unwrap_or(&[]);
        let base = &self.base;
        let (c, d, heads) = (base.channels, base.head_dim, base.m.cfg.heads);
        let par = k * base.batch * c >= PAR_WORK;
        let fwd = |buf: &mut Buffers<F>, col: &Vec<F>| -> Result<Vec<Complex<F>>> {
            buf.forward(&pl, &col[n - k..n])?;
            Ok(buf.spec.clone())
        };
        let u_hat: Vec<Vec<Complex<F>>> = if par {
            base.hist
                .par_iter()
                .with_min_len(min_len())
                .map_init(|| Buffers::new(&pl), fwd)
                .collect::<Result<_>>()?
        } else {
            let mut buf = Buffers::new(&pl);
            base.hist.iter().map(|col| fwd(&mut buf, col)).collect::<Result<_>>()?
        };
        let inv = |buf: &mut Buffers<F>, idx: usize| -> Result<Vec<F>> {
            let (b, e) = (idx / c, idx % c);
            let h = e / d;
            buf.spec.iter_mut().for_each(|z| *z = Complex::default());
            for (i, dl) in base.m.shifts(e % d) {
                for ((acc, a), x) in
                    buf.spec.iter_mut().zip(&w_hat[i * heads + h]).zip(&u_hat[b * c + e - dl])
                {
                    *acc += a * x;
                }
            }
            buf.inverse(&pl)?;
            Ok(buf.real[k..k + reach].to_vec())
        };
        if par {
            (0..base.batch * c)
                .into_par_iter()
                .with_min_len(min_len())
                .map_init(|| Buffers::new(&pl), inv)
                .collect()
        } else {
            let mut buf = Buffers::new(&pl);
            (0..base.batch * c).map(|idx| inv(&mut buf, idx)).collect()
        }
    }
}

impl<F: FftReal> Decoder<F> for OnlineDecoder<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        let t = self.base.push(token)?;
        let base = &self.base;
        let (c, d) = (base.channels, base.head_dim);
        let pending = &mut self.pending;
        let y = base.output(|b, e| {
            let h = e / d;
            let mut acc = pending[b * c + e].pop_front().unwrap_or_else(F::zero) + base.bias(h, t);
            for (i, dl) in base.m.shifts(e % d) {
                acc += base.tap_row(i, h)[0] * base.hist[b * c + e - dl][t];
            }
            acc
        });
        self.fill(t + 1)?;
        Ok(y)
    }
    fn cache_elems(&self) -> usize {
        self.base.hist_elems() + self.pending.iter().map(VecDeque::len).sum::<usize>()
    }
    fn position(&self) -> usize {
        self.base.pos
    }
    fn state(&self) -> Result<Tensors<F>> {
        Ok(self.base.state())
    }
}
