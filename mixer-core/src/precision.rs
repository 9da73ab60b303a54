//! Precision modes: how the arithmetic of one call is done, chosen per call (the `precision`
//! of the run options, `--precision` / `--dtype bf16` on the command line). The default is
//! [`Precision::Exact`].
//!
//! Like PyTorch's `allow_tf32`, a mode other than `exact` is a *permission*: a kernel that
//! has a tensor-core path for the mode uses it, and every other kernel runs its exact
//! arithmetic, which is more accurate than the mode promises. The tolerance of a mode is
//! therefore an upper bound that every form must meet, whichever arithmetic it ran.
//!
//! `bf16` is a storage mode: the activations ([`ACTIVATIONS`]: `x`, `q`, `k`, `v`) and the
//! output `y` are stored in bfloat16, while gates, decays, λ, kernels, biases and every
//! accumulation stay in `f32`. A backend without bf16 kernels (the CPU) converts at the
//! boundary: it rounds the activations to bf16, computes in `f32`, and rounds `y` to bf16,
//! so that every cross-check compares the same storage.

use std::fmt;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::tolerance::Tolerance;

/// The inputs that a `bf16` call stores in bfloat16: the activations a mixer mixes.
pub const ACTIVATIONS: &[&str] = &["x", "q", "k", "v"];

/// How the arithmetic of a call is done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// The element type's own arithmetic (FMA in `f32`/`f64`): the checked reference.
    #[default]
    Exact,
    /// `f32` inputs and outputs; products may run on tensor cores in TF32 (10-bit
    /// mantissa) with `f32` accumulation.
    Tf32,
    /// bfloat16 storage of the activations and of `y`; `f32` for everything else and for
    /// accumulation; products may run on tensor cores in bf16.
    Bf16,
}

impl Precision {
    /// Every mode, in report order.
    pub const ALL: [Precision; 3] = [Precision::Exact, Precision::Tf32, Precision::Bf16];

    /// The mode's name (`exact`, `tf32`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::Exact => "exact",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
        }
    }

    /// The mode of a name.
    pub fn parse(s: &str) -> Result<Precision> {
        Precision::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| Error::Value {
            name: "precision".into(),
            constraint: "one of exact, tf32, bf16".into(),
            found: format!("`{s}`"),
        })
    }

    /// The bound a call in this mode must meet against the `f64` oracle (for `exact`, the
    /// element type's own tolerance).
    ///
    /// - `tf32`: the unit roundoff of TF32 is `2⁻¹¹ ≈ 4.9·10⁻⁴`. Each product rounds its
    ///   operands once, and attention's logits pass that error through `exp`, which turns an
    ///   absolute logit error into a relative weight error of the same size; with logits of
    ///   order one the output's relative RMS error is a few units of `2⁻¹¹`. The bound is
    ///   `5·10⁻³` (about ten units), `5·10⁻²` max-abs.
    /// - `bf16`: the unit roundoff of bfloat16 is `2⁻⁹ ≈ 2·10⁻³`; storing `y` alone costs a
    ///   relative RMS error of about `2⁻⁹/√3 ≈ 1.1·10⁻³`, and the tensor-core paths also round
    ///   the softmax weights before `P·V`. The bound is `2·10⁻²` (about ten units), `10⁻¹`
    ///   max-abs. It is measured against the oracle evaluated on the bf16-rounded activations
    ///   (the inputs the call actually stores), so it bounds the arithmetic, not the rounding
    ///   of the caller's data.
    pub fn tolerance(self, dtype: &str) -> Tolerance {
        match self {
            Precision::Exact => Tolerance::for_dtype(dtype),
            Precision::Tf32 => Tolerance { rel_rms: 5e-3, max_abs: 5e-2 },
            Precision::Bf16 => Tolerance { rel_rms: 2e-2, max_abs: 1e-1 },
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `x` rounded to the nearest bfloat16 (ties to even), returned as `f32`; NaN stays NaN and
/// values beyond bf16's range become ±∞, as a conversion to bf16 does.
pub fn round_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000;
    f32::from_bits(rounded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_is_nearest_even() {
        assert_eq!(round_bf16(1.0), 1.0);
        // 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷: ties go to the even mantissa (1).
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 1.0);
        // 1 + 3·2⁻⁸ is halfway between 1 + 2⁻⁷ and 1 + 2⁻⁶: ties go to 1 + 2⁻⁶.
        assert_eq!(round_bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 1.0 + 2f32.powi(-7));
        assert_eq!(round_bf16(-2.5), -2.5);
        assert!(round_bf16(f32::NAN).is_nan());
        assert_eq!(round_bf16(f32::MAX), f32::INFINITY);
        for x in [0.1f32, -3.7, 1e-20, 6.02e23] {
            let r = round_bf16(x);
            assert_eq!(r.to_bits() & 0xFFFF, 0, "{x} → {r} keeps low bits");
            assert!(((r - x) / x).abs() <= 2f32.powi(-9), "{x} → {r}");
        }
    }

    #[test]
    fn names_round_trip() {
        for p in Precision::ALL {
            assert_eq!(Precision::parse(p.name()).unwrap(), p);
        }
        assert!(Precision::parse("fp8").unwrap_err().to_string().contains("exact, tf32, bf16"));
    }
}
