//! FFT machinery of the Toeplitz forms: fast sizes, the process-wide plan cache, the kernel
//! spectrum cache, and the `fast` form (docs/math.md §3).
//!
//! **Fast form.** With `p` a 7-smooth size `≥ 2T−1` (so the circular convolution of two
//! length-`T` signals has no wrap-around in its first `T` outputs), chosen by a cost model
//! ([`fft_size`]):
//! `y = irfft_p(Σ_i ŵ_{i,h} ⊙ rfft_p(x_{e−δ_i}))[0..T] + bias`,
//! where the kernel spectra `ŵ` already carry the single normalisation `1/p` (realfft's
//! transforms are unnormalised both ways).
//!
//! **Caches.**
//! - Plans: one `RealFftPlanner` per scalar type for the whole process (behind a mutex);
//!   it keeps every forward/inverse plan by size, so a size is planned once per process.
//! - Kernel spectra: within a call, each `(shift i, head h)` spectrum is computed once and
//!   shared by every batch row and channel of the head. Across calls, a small process-wide
//!   LRU cache ([`CACHE_CAPACITY`] entries per scalar type) keyed by `(p, T, rows)` and a
//!   64-bit hash of the truncated taps; a hit also compares the stored taps exactly, so a
//!   hash collision or a reused allocation can never return a stale spectrum.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use mixer_core::mixers::toeplitz::{Prepared, Toeplitz};
use mixer_core::parallel::min_len;
use mixer_core::{Error, Real, Result};

use super::columns::Columns;
use rayon::prelude::*;
use realfft::num_complex::Complex;
use realfft::{ComplexToReal, FftNum, RealFftPlanner, RealToComplex};

/// Number of kernel-spectrum sets kept across calls, per scalar type.
pub const CACHE_CAPACITY: usize = 8;

/// Modelled cost per point of one radix-`f` pass of an FFT, relative to a radix-2 pass:
/// `log₂ f` passes' worth of work times a penalty for the less regular odd-radix butterflies
/// (1.15, 1.3, 1.45 for 3, 5, 7).
const RADIX_COST: [(usize, f64); 4] = [(2, 1.0), (3, 1.82), (5, 3.02), (7, 4.07)];

/// The FFT length of the CPU forms for a linear convolution that needs `n` points: among the
/// 7-smooth sizes `p` in `[n, 2^⌈log₂ n⌉]`, the one of least modelled cost
/// `p · Σ_f c_f` (sum over the prime factors `f` of `p` with multiplicity, `c_f` from
/// [`RADIX_COST`]); ties go to the smaller size. The smallest 7-smooth size is not always the
/// cheapest: `n = 1999` gives 2048 (2¹¹, cost 11·2048) rather than 2000 (2⁴·5³,
/// cost 13.06·2000).
pub fn fft_size(n: usize) -> usize {
    let n = n.max(1);
    let top = n.next_power_of_two();
    let cost = |p: usize| {
        let (mut m, mut c) = (p, 0.0);
        for (f, cf) in RADIX_COST {
            while m.is_multiple_of(f) {
                m /= f;
                c += cf;
            }
        }
        p as f64 * c
    };
    let mut best = (cost(top), top);
    // Every 7-smooth p = 3^b 5^c 7^d · 2^a in [n, top]: for each odd part, the least power of
    // two that lifts it to n or above.
    let mut odd7 = 1;
    while odd7 <= top {
        let mut odd5 = odd7;
        while odd5 <= top {
            let mut odd = odd5;
            while odd <= top {
                let mut p = odd;
                while p < n {
                    p *= 2;
                }
                if p <= top {
                    let c = cost(p);
                    if c < best.0 || (c == best.0 && p < best.1) {
                        best = (c, p);
                    }
                }
                odd *= 3;
            }
            odd5 *= 5;
        }
        odd7 *= 7;
    }
    best.1
}

/// A forward/inverse real FFT pair of one size.
#[derive(Clone)]
pub struct Plans<F> {
    /// `rfft` of size `p`.
    pub fwd: Arc<dyn RealToComplex<F>>,
    /// `irfft` of size `p` (unnormalised).
    pub inv: Arc<dyn ComplexToReal<F>>,
}

impl<F> Plans<F> {
    /// The real length `p`.
    pub fn len(&self) -> usize {
        self.fwd.len()
    }
    /// Whether `p = 0` (never, plans are made for `p ≥ 1`).
    pub fn is_empty(&self) -> bool {
        self.fwd.len() == 0
    }
}

/// One cached set of kernel spectra.
struct Entry<F> {
    p: usize,
    t: usize,
    rows: usize,
    hash: u64,
    taps: Vec<F>,
    spectra: Arc<Vec<Vec<Complex<F>>>>,
}

/// The process-wide state of one scalar type: its planner and its kernel-spectrum cache.
pub struct FftState<F: FftNum> {
    planner: Mutex<RealFftPlanner<F>>,
    spectra: Mutex<VecDeque<Entry<F>>>,
}

impl<F: FftNum> FftState<F> {
    fn new() -> Self {
        FftState { planner: Mutex::new(RealFftPlanner::new()), spectra: Mutex::new(VecDeque::new()) }
    }
}

/// A scalar type with a process-wide FFT state (`f32`, `f64`).
pub trait FftReal: Real + FftNum {
    /// This type's planner and spectrum cache.
    fn state() -> &'static FftState<Self>;
}

impl FftReal for f32 {
    fn state() -> &'static FftState<f32> {
        static S: OnceLock<FftState<f32>> = OnceLock::new();
        S.get_or_init(FftState::new)
    }
}

impl FftReal for f64 {
    fn state() -> &'static FftState<f64> {
        static S: OnceLock<FftState<f64>> = OnceLock::new();
        S.get_or_init(FftState::new)
    }
}

/// The plans of size `p ≥ 1`, from the process-wide planner.
pub fn plans<F: FftReal>(p: usize) -> Plans<F> {
    let mut pl = F::state().planner.lock().unwrap_or_else(PoisonError::into_inner);
    Plans { fwd: pl.plan_fft_forward(p), inv: pl.plan_fft_inverse(p) }
}

/// Work buffers for one thread: a real signal, its spectrum, and scratch.
pub struct Buffers<F> {
    /// Real signal (length `p`).
    pub real: Vec<F>,
    /// Spectrum (length `p/2 + 1`).
    pub spec: Vec<Complex<F>>,
    scratch: Vec<Complex<F>>,
}

impl<F: FftReal> Buffers<F> {
    /// Buffers sized for these plans.
    pub fn new(pl: &Plans<F>) -> Self {
        let n = pl.fwd.get_scratch_len().max(pl.inv.get_scratch_len());
        Buffers {
            real: pl.fwd.make_input_vec(),
            spec: pl.fwd.make_output_vec(),
            scratch: vec![Complex::default(); n],
        }
    }

    /// `spec ← rfft(signal zero-padded to p)`.
    pub fn forward(&mut self, pl: &Plans<F>, signal: &[F]) -> Result<()> {
        let n = signal.len().min(self.real.len());
        self.real[..n].copy_from_slice(&signal[..n]);
        self.real[n..].iter_mut().for_each(|v| *v = F::zero());
        self.forward_in_place(pl)
    }

    /// `spec ← rfft(real)`; `real` is clobbered.
    pub fn forward_in_place(&mut self, pl: &Plans<F>) -> Result<()> {
        pl.fwd
            .process_with_scratch(&mut self.real, &mut self.spec, &mut self.scratch)
            .map_err(|e| Error::Numerical(format!("rfft of size {}: {e}", pl.len())))
    }

    /// `real ← irfft(spec)` (unnormalised). The imaginary parts that a real signal's spectrum
    /// has zero (DC, and Nyquist for even `p`) are zeroed first; `spec` is clobbered.
    pub fn inverse(&mut self, pl: &Plans<F>) -> Result<()> {
        let p = pl.len();
        self.spec[0].im = F::zero();
        if p.is_multiple_of(2) {
            let last = self.spec.len() - 1;
            self.spec[last].im = F::zero();
        }
        pl.inv
            .process_with_scratch(&mut self.spec, &mut self.real, &mut self.scratch)
            .map_err(|e| Error::Numerical(format!("irfft of size {p}: {e}")))
    }
}

/// One step of a 64-bit multiply–xorshift hash.
fn mix(h: u64, v: u64) -> u64 {
    let h = (h ^ v).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^ (h >> 31)
}

fn hash_taps<F: Real>(taps: &[F]) -> u64 {
    // A hash of the bit patterns (speed matters more than quality: hits are confirmed by an
    // exact comparison), in `LANES` independent chains over interleaved taps (so the
    // multiplies overlap) that are combined at the end.
    const LANES: usize = 8;
    let mut lanes = [0x9E37_79B9_7F4A_7C15 ^ taps.len() as u64; LANES];
    let mut chunks = taps.chunks_exact(LANES);
    for c in &mut chunks {
        for (h, v) in lanes.iter_mut().zip(c) {
            *h = mix(*h, v.f64().to_bits());
        }
    }
    let mut h = lanes.iter().fold(0u64, |acc, &l| mix(acc, l));
    for v in chunks.remainder() {
        h = mix(h, v.f64().to_bits());
    }
    h
}

/// Spectra `rfft_p(row) / p` of `rows` consecutive length-`t` rows of `taps` (each zero-padded
/// to `p`), through the process-wide cache (see the module docs).
pub fn tap_spectra<F: FftReal>(
    taps: &[F],
    rows: usize,
    t: usize,
    pl: &Plans<F>,
) -> Result<Arc<Vec<Vec<Complex<F>>>>> {
    let p = pl.len();
    // Hashed (and, on a candidate hit, compared) in blocks in parallel: at T = 4k with one
    // kernel per channel the taps are as large as the input.
    const BLOCK: usize = 1 << 16;
    let block_hashes: Vec<u64> = taps.par_chunks(BLOCK).with_min_len(min_len()).map(hash_taps).collect();
    let hash = block_hashes.iter().fold(taps.len() as u64, |acc, &h| mix(acc, h));
    let same = |stored: &[F]| {
        stored.len() == taps.len()
            && stored
                .par_chunks(BLOCK)
                .with_min_len(min_len())
                .zip(taps.par_chunks(BLOCK).with_min_len(min_len()))
                .all(|(a, b)| a == b)
    };
    {
        let mut cache = F::state().spectra.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pos) = cache
            .iter()
            .position(|e| e.hash == hash && e.p == p && e.t == t && e.rows == rows && same(&e.taps))
        {
            let e = cache.remove(pos).expect("position found above");
            let s = e.spectra.clone();
            cache.push_back(e);
            return Ok(s);
        }
    }
    let scale = F::one() / F::of(p as f64);
    let spectra: Vec<Vec<Complex<F>>> = (0..rows)
        .into_par_iter()
        .with_min_len(min_len())
        .map_init(
            || Buffers::new(pl),
            |buf, r| {
                buf.forward(pl, &taps[r * t..(r + 1) * t])?;
                Ok(buf.spec.iter().map(|z| z * scale).collect())
            },
        )
        .collect::<Result<_>>()?;
    let spectra = Arc::new(spectra);
    let mut cache = F::state().spectra.lock().unwrap_or_else(PoisonError::into_inner);
    if cache.len() >= CACHE_CAPACITY {
        cache.pop_front();
    }
    cache.push_back(Entry { p, t, rows, hash, taps: taps.to_vec(), spectra: spectra.clone() });
    Ok(spectra)
}

/// Number of kernel-spectrum sets currently cached for `F` (for tests and diagnostics).
pub fn cached_spectra<F: FftReal>() -> usize {
    F::state().spectra.lock().unwrap_or_else(PoisonError::into_inner).len()
}

/// `rfft_p` of every column of `x` (zero-padded to `p`, unnormalised), in column order.
pub fn column_spectra<F: FftReal>(x: &Columns<F>, pl: &Plans<F>) -> Result<Vec<Vec<Complex<F>>>> {
    x.data
        .par_chunks(x.len.max(1))
        .with_min_len(min_len())
        .map_init(
            || Buffers::new(pl),
            |buf, col| {
                buf.forward(pl, col)?;
                Ok(buf.spec.clone())
            },
        )
        .collect()
}

/// Channels per task of [`fast_rows`]: 16 `f32` values of a row of `x` are one cache line.
const CHANNEL_BLOCK: usize = 16;

/// The `fast` form with one kernel per head (`Kw = 1`) straight from `x [B, T, C]` (standard
/// layout) to `y [B, T, C]`, with no channel-major copies of `x` or `y`.
///
/// Tasks are blocks of [`CHANNEL_BLOCK`] channels of one batch row, spread over the threads in
/// contiguous runs; each thread has one set of FFT buffers, reused by all its tasks. A task
/// gathers its channels row by row from `x` straight into the (zero-padded) real FFT
/// buffers, transforms each, multiplies by the cached kernel spectrum, transforms back, and
/// writes `T × block` values (plus the bias); the blocks are then copied into the rows of
/// `y` in parallel.
pub fn fast_rows<F: FftReal>(p: &Prepared<F>, x: &[F]) -> Result<Vec<F>> {
    let (nb, t, c, d) = (p.batch, p.seq, p.channels, p.head_dim);
    let mut y = vec![F::zero(); nb * t * c];
    if t == 0 || c == 0 || nb == 0 {
        return Ok(y);
    }
    let pl = plans::<F>(fft_size(2 * t - 1));
    let w_hat = tap_spectra(&p.taps, p.heads, t, &pl)?;
    let nblk = c.div_ceil(CHANNEL_BLOCK);
    let tasks = nb * nblk;
    let per = tasks.div_ceil(rayon::current_num_threads().max(1));
    let run = |bufs: &mut Vec<Buffers<F>>, task: usize| -> Result<Vec<F>> {
        let (b, c0) = (task / nblk, (task % nblk) * CHANNEL_BLOCK);
        let cw = CHANNEL_BLOCK.min(c - c0);
        for buf in &mut bufs[..cw] {
            buf.real[t..].iter_mut().for_each(|v| *v = F::zero());
        }
        for (s, row) in x[b * t * c..(b + 1) * t * c].chunks_exact(c).enumerate() {
            for (buf, &v) in bufs.iter_mut().zip(&row[c0..c0 + cw]) {
                buf.real[s] = v;
            }
        }
        let mut out = vec![F::zero(); t * cw];
        for (j, buf) in bufs[..cw].iter_mut().enumerate() {
            let h = (c0 + j) / d;
            buf.forward_in_place(&pl)?;
            buf.spec.iter_mut().zip(&w_hat[h]).for_each(|(z, w)| *z *= w);
            buf.inverse(&pl)?;
            let bias = p.bias_row(h);
            for (s, o) in out.chunks_exact_mut(cw).enumerate() {
                o[j] = buf.real[s] + bias.map_or(F::zero(), |bv| bv[s]);
            }
        }
        Ok(out)
    };
    let blocks: Vec<Vec<Vec<F>>> = (0..tasks.div_ceil(per))
        .into_par_iter()
        .with_min_len(min_len())
        .map(|g| {
            let mut bufs: Vec<Buffers<F>> = (0..CHANNEL_BLOCK.min(c)).map(|_| Buffers::new(&pl)).collect();
            (g * per..((g + 1) * per).min(tasks)).map(|task| run(&mut bufs, task)).collect::<Result<_>>()
        })
        .collect::<Result<_>>()?;
    let blocks: Vec<&Vec<F>> = blocks.iter().flatten().collect();
    y.par_chunks_mut(c).with_min_len(min_len()).enumerate().for_each(|(bs, row)| {
        let (b, s) = (bs / t, bs % t);
        for (k, dst) in row.chunks_mut(CHANNEL_BLOCK).enumerate() {
            let cw = dst.len();
            dst.copy_from_slice(&blocks[b * nblk + k][s * cw..(s + 1) * cw]);
        }
    });
    Ok(y)
}

/// The `fast` form with several kernels per head (`Kw > 1`, one kernel per head goes through
/// [`fast_rows`]) on channel-major columns (`b·C + c`, each of length `T`); returns the output
/// columns in the same order. An output mixes `Kw` neighbouring input channels, so the input
/// spectra are computed once and kept (one per column) before the products, in parallel over
/// batch × channel.
pub fn fast<F: FftReal>(m: &Toeplitz, p: &Prepared<F>, x: &Columns<F>) -> Result<Columns<F>> {
    let (t, c, d) = (p.seq, p.channels, p.head_dim);
    let mut out = Columns { data: vec![F::zero(); p.batch * c * t], len: t };
    if t == 0 || c == 0 || p.batch == 0 {
        return Ok(out);
    }
    let pl = plans::<F>(fft_size(2 * t - 1));
    let w_hat = tap_spectra(&p.taps, p.kernel_width * p.heads, t, &pl)?;
    let x_hat = column_spectra(x, &pl)?;
    out.data
        .par_chunks_mut(t)
        .with_min_len(min_len())
        .enumerate()
        .try_for_each_init(
            || Buffers::new(&pl),
            |buf, (idx, y)| {
                let (b, e) = (idx / c, idx % c);
                let h = e / d;
                buf.spec.iter_mut().for_each(|z| *z = Complex::default());
                for (i, dl) in m.shifts(e % d) {
                    let wk = &w_hat[i * p.heads + h];
                    let xk = &x_hat[b * c + e - dl];
                    for ((acc, a), bb) in buf.spec.iter_mut().zip(wk).zip(xk) {
                        *acc += a * bb;
                    }
                }
                buf.inverse(&pl)?;
                y.copy_from_slice(&buf.real[..t]);
                if let Some(bias) = p.bias_row(h) {
                    y.iter_mut().zip(bias).for_each(|(v, &bv)| *v += bv);
                }
                Ok(())
            },
        )
        .map(|()| out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chosen FFT size is 7-smooth, within [n, next power of two], and the cheapest by
    /// the model; hand-worked cases of the model (costs in radix-2 passes × size).
    #[test]
    fn fft_size_follows_the_cost_model() {
        use mixer_core::mixers::toeplitz::is_fast_size;
        // 1999: 2000 = 2⁴5³ costs (4 + 3·3.02)·2000 = 26 120, 2048 = 2¹¹ costs 22 528.
        assert_eq!(fft_size(1999), 2048);
        // 5999: 6000 = 2⁴·3·5³ costs 89 280, 6144 = 2¹¹·3 costs 78 766, 8192 costs 106 496.
        assert_eq!(fft_size(5999), 6144);
        // 8191 and 32767: the power of two is the only candidate.
        assert_eq!(fft_size(8191), 8192);
        assert_eq!(fft_size(32767), 32768);
        // 2·100 − 1 = 199: 200 = 2³5² costs 1 808, 224 = 2⁵·7 costs 2 032, 256 costs 2 048.
        assert_eq!(fft_size(199), 200);
        for n in [1usize, 2, 3, 7, 97, 199, 1000, 4097, 20001] {
            let p = fft_size(n);
            assert!(p >= n && p <= n.next_power_of_two() && is_fast_size(p), "n = {n}: p = {p}");
        }
    }

    /// A round trip through the buffers recovers the signal times p (unnormalised).
    #[test]
    fn round_trip_is_unnormalised() {
        for p in [1usize, 2, 9, 14, 60] {
            let pl = plans::<f64>(p);
            let mut buf = Buffers::new(&pl);
            let sig: Vec<f64> = (0..p).map(|i| (i as f64 * 0.7).sin() + 0.1).collect();
            buf.forward(&pl, &sig).unwrap();
            buf.inverse(&pl).unwrap();
            for i in 0..p {
                assert!((buf.real[i] - p as f64 * sig[i]).abs() < 1e-10, "p = {p}");
            }
        }
    }

    /// Spectra are reused across calls for equal taps and recomputed for different ones.
    #[test]
    fn spectrum_cache_hits_only_on_equal_taps() {
        let pl = plans::<f32>(30);
        let taps: Vec<f32> = (0..2 * 15).map(|i| 0.37 * i as f32 - 1.0).collect();
        // Other tests share the process-wide cache and may evict between two calls: a hit
        // must happen in at least one of a few back-to-back attempts.
        let a = tap_spectra(&taps, 2, 15, &pl).unwrap();
        let hit = (0..10).any(|_| {
            let a = tap_spectra(&taps, 2, 15, &pl).unwrap();
            let b = tap_spectra(&taps, 2, 15, &pl).unwrap();
            Arc::ptr_eq(&a, &b)
        });
        assert!(hit);
        let mut other = taps.clone();
        other[7] += 1.0;
        let c = tap_spectra(&other, 2, 15, &pl).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        assert!((c[0][0].re - a[0][0].re - 1.0 / 30.0).abs() < 1e-6);
        assert!(cached_spectra::<f32>() <= CACHE_CAPACITY);
    }
}
