//! One query against a KV cache in `f32` with AVX-512 (checked at run time): the step of the
//! attention decoder ([`super::decoder`]) on the vector loops of the fused fast-form kernel
//! ([`super::fused`]: its base-2 exponential and row maximum).
//!
//! For token `t` the visible keys `s ∈ [first, t]` sit in ring slots `s mod cap`, rows of
//! `Dk` (keys) and `Dv` (values). Per group of 16 keys the scores `u_s = sign(σ)·q·k_s` are
//! 16 independent fused multiply-add chains over `Dk` (16 lanes at a time, the tail masked),
//! reduced to one register of 16 scores by a transposing tree of shuffles (45 operations for
//! 16 keys). With `m = maxₛ u_s` and `c = |σ|·log₂e`, the weights are
//! `w_s = 2^{c·(u_s − m)}` (the difference before the product, as in
//! [`Logits`](mixer_core::mixers::attention::Logits): never above 1, no intermediate
//! overflows), `ℓ = Σₛ w_s` in 16 partial sums (added in `f64`), and
//! `y = Σₛ w_s v_s / ℓ` with the outputs in registers, 64 columns at a time, two chains of
//! keys (even, odd) per register.
//!
//! Declines (the caller then takes the generic path, which forms what overflowed again in
//! `f64`) where a score is not finite in `f32`, where `max u − min u` overflows `f32`, or where
//! `c` is 0 or not finite in `f32`.

/// Whether this CPU runs [`head`].
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One head: query `q [Dk]` (`Dk ≥ 1`), the ring `keys [cap, Dk]`, `values [cap, Dv]`
/// (`Dv = out.len()`), visible tokens `first..=t` (`t − first < cap`); `neg` whether `σ < 0`,
/// `abs = |σ|`; `u` scratch of at least `t + 1 − first` entries. Writes `out = y_t` and
/// returns `true`, or returns `false` with `out` unspecified (see the module docs).
#[allow(clippy::too_many_arguments)]
pub fn head(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    (cap, first, t): (usize, usize, usize),
    neg: bool,
    abs: f64,
    u: &mut [f32],
    out: &mut [f32],
) -> bool {
    let c = (abs * std::f64::consts::LOG2_E) as f32;
    let (dk, n) = (q.len(), t + 1 - first);
    if dk == 0 || !(c > 0.0 && c.is_finite()) || !available() || u.len() < n || n > cap {
        return false;
    }
    // The visible rows as at most two runs of consecutive slots (the ring wraps once).
    let (s0, s1) = (first % cap, t % cap);
    let runs = if s0 <= s1 { [(s0, n), (0, 0)] } else { [(s0, cap - s0), (0, s1 + 1)] };
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `available()` above confirmed that this CPU executes AVX-512F, the only target
    // feature these functions are compiled for.
    unsafe {
        let (mut at, mut lo, mut hi, mut bad) = (0, f32::INFINITY, f32::NEG_INFINITY, false);
        for (slot, len) in runs {
            let (l, h) = avx512::scores(q, &keys[slot * dk..][..len * dk], neg, &mut u[at..at + len]);
            // Non-finite scores give NaN bounds (which `min`/`max` would skip).
            bad |= l.is_nan() || h.is_nan();
            (lo, hi) = (lo.min(l), hi.max(h));
            at += len;
        }
        if bad || !(hi - lo).is_finite() {
            return false;
        }
        let den = avx512::weights(&mut u[..n], hi, c);
        out.fill(0.0);
        let dv = out.len();
        let mut at = 0;
        for (slot, len) in runs {
            avx512::add_rows(&u[at..at + len], &values[slot * dv..][..len * dv], out);
            at += len;
        }
        let inv = (1.0 / den) as f32;
        out.iter_mut().for_each(|o| *o *= inv);
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (runs, values, out, neg);
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::fused::avx512::exp2;
    use std::arch::x86_64::*;

    /// The first `len` lanes (`len ≤ 16`).
    #[inline]
    fn lanes(len: usize) -> u16 {
        if len >= 16 { u16::MAX } else { (1u16 << len) - 1 }
    }

    /// `x[..len]` (`len ≤ 16`) into 16 lanes, zeros past `len`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load(x: &[f32], len: usize) -> __m512 {
        assert!(len <= 16 && len <= x.len());
        // SAFETY: the mask enables exactly the first `len` lanes, all inside `x`.
        unsafe { _mm512_maskz_loadu_ps(lanes(len), x.as_ptr()) }
    }

    /// `x[..len] ← v[..len]` (`len ≤ 16`).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn store(x: &mut [f32], len: usize, v: __m512) {
        assert!(len <= 16 && len <= x.len());
        // SAFETY: the mask enables exactly the first `len` lanes, all inside `x`.
        unsafe { _mm512_mask_storeu_ps(x.as_mut_ptr(), lanes(len), v) }
    }

    /// Lane `i` of the result is the sum of the lanes of `x[4·(i mod 4) + ⌊i/4⌋]` (the
    /// caller places key `i` of a group at that index, so that lane `i` is key `i`'s sum):
    /// halves, quarters, pairs and neighbours of two registers at a time.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) fn hsum16(x: [__m512; 16]) -> __m512 {
        let y: [__m512; 8] = std::array::from_fn(|i| {
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
            )
        });
        let z: [__m512; 4] = std::array::from_fn(|i| {
            let (a, b) = (y[2 * i], y[2 * i + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
            )
        });
        let w: [__m512; 2] = std::array::from_fn(|i| {
            let (a, b) = (_mm512_castps_pd(z[2 * i]), _mm512_castps_pd(z[2 * i + 1]));
            _mm512_add_ps(
                _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
            )
        });
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b10_00_10_00>(w[0], w[1]),
            _mm512_shuffle_ps::<0b11_01_11_01>(w[0], w[1]),
        )
    }

    /// The 16 dot products of `q` with the rows of `k [16, Dk]`, row `i` in register
    /// `4·(i mod 4) + ⌊i/4⌋` (the order [`hsum16`] takes), lanes still to be summed.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn dots_full(q: &[f32], k: &[f32]) -> [__m512; 16] {
        let dk = q.len();
        let mut acc = [_mm512_setzero_ps(); 16];
        for d0 in (0..dk).step_by(16) {
            let w = (dk - d0).min(16);
            let qv = load(&q[d0..], w);
            for i in 0..16 {
                let slot = 4 * (i % 4) + i / 4;
                acc[slot] = _mm512_fmadd_ps(qv, load(&k[i * dk + d0..], w), acc[slot]);
            }
        }
        acc
    }

    /// [`dots_full`] for `nk < 16` rows (zeros in the other registers).
    #[target_feature(enable = "avx512f")]
    fn dots_part(q: &[f32], k: &[f32], nk: usize) -> [__m512; 16] {
        let dk = q.len();
        let mut acc = [_mm512_setzero_ps(); 16];
        for i in 0..nk {
            let slot = 4 * (i % 4) + i / 4;
            for d0 in (0..dk).step_by(16) {
                let w = (dk - d0).min(16);
                acc[slot] = _mm512_fmadd_ps(load(&q[d0..], w), load(&k[i * dk + d0..], w), acc[slot]);
            }
        }
        acc
    }

    /// `u_i = sign·q·k_i` for the `u.len()` consecutive rows of `k`; returns their minimum and
    /// maximum (NaN where some score is not finite).
    #[target_feature(enable = "avx512f")]
    pub(super) fn scores(q: &[f32], k: &[f32], neg: bool, u: &mut [f32]) -> (f32, f32) {
        let dk = q.len();
        let sign = _mm512_set1_ps(if neg { -1.0 } else { 1.0 });
        let (mut lo, mut hi) = (_mm512_set1_ps(f32::INFINITY), _mm512_set1_ps(f32::NEG_INFINITY));
        let mut bad = _mm512_setzero_ps();
        for (g, ug) in u.chunks_mut(16).enumerate() {
            let nk = ug.len();
            let rows = &k[g * 16 * dk..][..nk * dk];
            let acc = if nk == 16 { dots_full(q, rows) } else { dots_part(q, rows, nk) };
            let s = _mm512_mul_ps(sign, hsum16(acc));
            let m = lanes(nk);
            lo = _mm512_mask_min_ps(lo, m, lo, s);
            hi = _mm512_mask_max_ps(hi, m, hi, s);
            // s − s is NaN exactly where s is not finite.
            bad = _mm512_mask_add_ps(bad, m, bad, _mm512_sub_ps(s, s));
            store(ug, nk, s);
        }
        let nan = if _mm512_reduce_add_ps(bad).is_nan() { f32::NAN } else { 0.0 };
        (_mm512_reduce_min_ps(lo) + nan, _mm512_reduce_max_ps(hi) + nan)
    }

    /// `u_i ← 2^{c·(u_i − m)}` (`u_i ≤ m`, all finite); returns `Σ u_i` (16 partial sums in
    /// `f32`, added in `f64`).
    #[target_feature(enable = "avx512f")]
    pub(super) fn weights(u: &mut [f32], m: f32, c: f32) -> f64 {
        let (mv, cv) = (_mm512_set1_ps(m), _mm512_set1_ps(c));
        let mut sum = _mm512_setzero_ps();
        for ug in u.chunks_mut(16) {
            let nk = ug.len();
            let w = exp2(_mm512_mul_ps(cv, _mm512_sub_ps(load(ug, nk), mv)));
            let w = _mm512_maskz_mov_ps(lanes(nk), w);
            sum = _mm512_add_ps(sum, w);
            store(ug, nk, w);
        }
        let mut part = [0.0f32; 16];
        store(&mut part, 16, sum);
        part.iter().map(|&x| x as f64).sum()
    }

    /// `out += Σᵢ w_i·v_i` over the rows of `v` (rows of `out.len()`), 64 columns at a time.
    #[target_feature(enable = "avx512f")]
    pub(super) fn add_rows(w: &[f32], v: &[f32], out: &mut [f32]) {
        let dv = out.len();
        for c0 in (0..dv).step_by(64) {
            let width = (dv - c0).min(64);
            match width.div_ceil(16) {
                1 => columns::<1>(w, v, out, c0, width),
                2 => columns::<2>(w, v, out, c0, width),
                3 => columns::<3>(w, v, out, c0, width),
                _ => columns::<4>(w, v, out, c0, width),
            }
        }
    }

    /// [`add_rows`] for columns `c0..c0 + width` (`NV = ⌈width/16⌉` registers), even and odd
    /// rows in two sets of accumulators.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn columns<const NV: usize>(w: &[f32], v: &[f32], out: &mut [f32], c0: usize, width: usize) {
        let dv = out.len();
        let len = |i: usize| width.saturating_sub(16 * i).min(16);
        let mut acc = [[_mm512_setzero_ps(); NV]; 2];
        for (j, &wj) in w.iter().enumerate() {
            let b = _mm512_set1_ps(wj);
            let row = &v[j * dv + c0..];
            for (i, a) in acc[j % 2].iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(b, load(&row[16 * i..], len(i)), *a);
            }
        }
        for i in 0..NV {
            let o = &mut out[c0 + 16 * i..];
            let sum = _mm512_add_ps(_mm512_add_ps(acc[0][i], acc[1][i]), load(o, len(i)));
            store(o, len(i), sum);
        }
    }

    #[cfg(test)]
    mod tests {
        use std::arch::x86_64::*;

        /// Lane `i` of the tree is the sum of register `4·(i mod 4) + ⌊i/4⌋`.
        #[test]
        fn hsum16_sums_each_register_into_its_lane() {
            if !super::super::available() {
                return;
            }
            let vals: Vec<[f32; 16]> =
                (0..16).map(|r| std::array::from_fn(|l| (r * 100 + l * l) as f32 * 0.5)).collect();
            let mut got = [0.0f32; 16];
            // SAFETY: AVX-512F was detected above; every array holds 16 f32.
            unsafe {
                let x: [__m512; 16] = std::array::from_fn(|r| _mm512_loadu_ps(vals[r].as_ptr()));
                _mm512_storeu_ps(got.as_mut_ptr(), super::hsum16(x));
            }
            for (i, &g) in got.iter().enumerate() {
                let want: f32 = vals[4 * (i % 4) + i / 4].iter().sum();
                assert_eq!(g, want, "lane {i}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// A ring that wraps (visible slots 1, 2, 3 then 0, `Dk = 1`): finite scores give the
    /// softmax average; a score that overflows `f32` in either run of slots, or a range
    /// `max u − min u` beyond `f32`, is declined.
    #[test]
    fn declines_what_f32_cannot_hold_in_either_run() {
        let values = [10.0f32, 20.0, 30.0, 40.0];
        let mut u = [0.0f32; 4];
        let mut out = [0.0f32; 1];
        let run = |q: f32, keys: [f32; 4], u: &mut [f32], out: &mut [f32]| {
            super::head(&[q], &keys, &values, (4, 1, 4), false, 1.0, u, out)
        };
        if super::available() {
            // Scores 0 for every key: the plain mean of the values.
            assert!(run(0.0, [1.0, 2.0, 3.0, 4.0], &mut u, &mut out));
            assert!((out[0] - 25.0).abs() < 1e-5, "{out:?}");
        }
        for keys in [[1e30f32, 1.0, 2.0, 3.0], [1.0, 1e30, 2.0, 3.0], [-3e38, 1.0, 3e38, 2.0]] {
            let q = if keys.contains(&1e30) { 1e30 } else { 1.0 };
            assert!(!run(q, keys, &mut u, &mut out), "{keys:?}");
        }
    }
}
