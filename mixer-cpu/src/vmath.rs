//! Vectorised elementwise kernels shared by the CPU forms.
//!
//! [`VecMath::exp_scaled_sum`] computes `xᵢ ← e^{a(xᵢ − m)}` over a slice and returns `Σ xᵢ`,
//! the inner step of every online softmax (`a` the softmax scale, `m` the running maximum;
//! the difference is formed before the product, so a large `a` or large scores cannot
//! overflow an intermediate). For `f32` it is a branch-free polynomial that the
//! compiler vectorises, built for AVX-512, AVX2 + FMA and NEON and chosen at run time
//! (`multiversion`), with the plain build as the fallback:
//!
//! `eˣ = 2ⁿ · eʳ`, `n = round(x·log₂e)` (by adding `1.5·2²³`, which leaves `n` in the low
//! mantissa bits), `r = x − n·ln 2` (ln 2 split in two parts so `r` is
//! exact), `eʳ ≈ 1 + r + r²·P(r)` with the degree-5 minimax `P` of the Cephes library
//! (max relative error ≈ 1 ulp on `[−½ ln 2, ½ ln 2]`). Arguments below `−87.3` (including
//! `−∞`, the masked scores) give exactly 0; the softmax never passes arguments above 0.
//! For `f64`, `exp` of the standard library.

use mixer_core::Real;
use multiversion::multiversion;

/// Elementwise kernels with a fast path per scalar type.
pub trait VecMath: Real {
    /// `xs[i] ← e^{a·(xs[i] − m)}` for every `i` (`a > 0`, `xs[i] ≤ m` or `−∞`); returns the
    /// sum of the new values.
    fn exp_scaled_sum(xs: &mut [Self], m: Self, a: Self) -> Self;

    /// `eˣ` of one value, written so that a loop over lanes vectorises ([`exp_f32`] for
    /// `f32`, the standard library's `exp` for `f64`); `−∞` gives 0. `fused`: the caller is
    /// built for a target with FMA (`multiversion::target::target_cfg_f!`), so the polynomial
    /// may use fused multiply-adds.
    fn exp_lane(x: Self, fused: bool) -> Self;

    /// These values as `f32` when `Self` is `f32` (kernels written for `f32` only, such as
    /// the fused attention tile, take their fast path through this), `None` otherwise.
    fn as_f32(xs: &[Self]) -> Option<&[f32]>;

    /// [`VecMath::as_f32`] for writing.
    fn as_f32_mut(xs: &mut [Self]) -> Option<&mut [f32]>;
}

impl VecMath for f32 {
    #[inline]
    fn exp_scaled_sum(xs: &mut [f32], m: f32, a: f32) -> f32 {
        exp_scaled_sum_f32(xs, m, a)
    }
    #[inline(always)]
    fn exp_lane(x: f32, fused: bool) -> f32 {
        exp_f32_with(x, fused)
    }
    fn as_f32(xs: &[f32]) -> Option<&[f32]> {
        Some(xs)
    }
    fn as_f32_mut(xs: &mut [f32]) -> Option<&mut [f32]> {
        Some(xs)
    }
}

impl VecMath for f64 {
    #[inline]
    fn exp_scaled_sum(xs: &mut [f64], m: f64, a: f64) -> f64 {
        let mut sum = 0.0;
        for x in xs.iter_mut() {
            *x = (a * (*x - m)).exp();
            sum += *x;
        }
        sum
    }
    #[inline(always)]
    fn exp_lane(x: f64, _fused: bool) -> f64 {
        x.exp()
    }
    fn as_f32(_: &[f64]) -> Option<&[f32]> {
        None
    }
    fn as_f32_mut(_: &mut [f64]) -> Option<&mut [f32]> {
        None
    }
}

/// Width of the independent partial sums (lets the sum vectorise without reassociation).
const LANES: usize = 16;

#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn exp_scaled_sum_f32(xs: &mut [f32], m: f32, a: f32) -> f32 {
    let fused = multiversion::target::target_cfg_f!(target_feature = "fma");
    let mut acc = [0.0f32; LANES];
    let mut chunks = xs.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            let e = exp_f32_with(a * (c[i] - m), fused);
            c[i] = e;
            acc[i] += e;
        }
    }
    let mut tail = 0.0f32;
    for x in chunks.into_remainder() {
        let e = exp_f32_with(a * (*x - m), fused);
        *x = e;
        tail += e;
    }
    acc.iter().sum::<f32>() + tail
}

/// `eˣ` for `f32`, branch-free (see the module docs).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    exp_f32_with(x, false)
}

/// `a·b + c`, one fused multiply-add when `fused` (a constant after inlining; pass `true` only
/// inside code built for a target with FMA, else it is a slow library call).
#[inline(always)]
fn madd(a: f32, b: f32, c: f32, fused: bool) -> f32 {
    if fused { a.mul_add(b, c) } else { a * b + c }
}

/// [`exp_f32`], with fused multiply-adds in the polynomial when `fused`.
#[inline(always)]
pub fn exp_f32_with(x: f32, fused: bool) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const LO: f32 = -87.33;
    const HI: f32 = 88.0;
    // 1.5·2²³: adding it rounds to the nearest integer, held in the low bits of the mantissa
    // (so n and 2ⁿ come from float and integer adds, with no float-to-int conversion).
    const SHIFTER: f32 = 12_582_912.0;
    let xc = x.clamp(LO, HI);
    let j = madd(xc, LOG2E, SHIFTER, fused);
    let n = j - SHIFTER;
    let r = madd(-n, LN2_LO, madd(-n, LN2_HI, xc, fused), fused);
    let mut p = 1.987_569_1e-4_f32;
    for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5] {
        p = madd(p, r, c, fused);
    }
    let er = madd(p, r * r, r, fused) + 1.0;
    let two_n = f32::from_bits(j.to_bits().wrapping_sub(SHIFTER.to_bits()).wrapping_add(127) << 23);
    if x < LO { 0.0 } else { er * two_n }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_f32_matches_std_within_two_ulp_over_the_softmax_range() {
        for fused in [false, true] {
            let mut worst = 0.0f64;
            let mut x = -87.0f32;
            while x <= 0.0 {
                let want = (x as f64).exp();
                let got = exp_f32_with(x, fused) as f64;
                worst = worst.max(((got - want) / want).abs());
                x += 0.0137;
            }
            assert!(worst < 2.5e-7, "fused {fused}: worst relative error {worst}");
        }
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-200.0), 0.0);
        assert!((exp_f32(80.0) as f64 / 80f64.exp() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn exp_scaled_sum_is_the_elementwise_exp_and_its_sum_for_every_length() {
        for n in [0usize, 1, 15, 16, 17, 100] {
            let xs: Vec<f32> = (0..n).map(|i| -((i * 7 % 13) as f32) * 0.9).collect();
            let mut got = xs.clone();
            let sum = f32::exp_scaled_sum(&mut got, -0.5, 0.75);
            let mut want_sum = 0.0f64;
            for (g, x) in got.iter().zip(&xs) {
                let w = (0.75 * (*x as f64 + 0.5)).exp();
                want_sum += w;
                assert!(((*g as f64) - w).abs() <= 3e-7 * w, "{g} vs {w}");
            }
            assert!((sum as f64 - want_sum).abs() <= 1e-6 * want_sum.max(1.0), "{sum} vs {want_sum}");
            let mut g64: Vec<f64> = xs.iter().map(|&x| x as f64).collect();
            let s64 = f64::exp_scaled_sum(&mut g64, -0.5, 0.75);
            assert!((s64 - want_sum).abs() <= 1e-12 * want_sum.max(1.0));
        }
    }
}
