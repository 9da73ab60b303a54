//! The one comparison used by tests, the CLI and the benches.

use ndarray::{ArrayViewD, Zip};
use serde::Serialize;

/// Acceptance thresholds for comparing an output against the `f64` oracle.
///
/// Relative RMS error `‖y−ŷ‖_2 / max(‖ŷ‖_2, ε)` and max-abs error
/// `max_i |y_i − ŷ_i|`; an output passes when both are within bounds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Tolerance {
    /// Bound on the relative RMS error.
    pub rel_rms: f64,
    /// Bound on the max-abs error, scaled by `max(1, max|ŷ|)`.
    pub max_abs: f64,
}

/// Outcome of one comparison.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// Relative RMS error.
    pub rel_rms: f64,
    /// Max-abs error.
    pub max_abs: f64,
    /// Largest magnitude in the reference (the scale of `max_abs`).
    pub ref_max: f64,
    /// Whether both errors are within the tolerance (and everything is finite).
    pub pass: bool,
}

impl Tolerance {
    /// For `f64` computations: tight.
    pub const F64: Tolerance = Tolerance { rel_rms: 1e-9, max_abs: 1e-8 };
    /// For `f32` computations.
    pub const F32: Tolerance = Tolerance { rel_rms: 1e-4, max_abs: 1e-3 };

    /// The default tolerance for a scalar type name (`"f32"` or `"f64"`).
    pub fn for_dtype(name: &str) -> Tolerance {
        if name == "f32" { Tolerance::F32 } else { Tolerance::F64 }
    }

    /// [`Tolerance::compare`] for a gradient: one whose reference is exactly zero (e.g. `d_k`
    /// of attention at `T = 1` or with a window of 1) has no relative error, so it passes when
    /// its largest absolute error is within the bound.
    pub fn compare_grad(&self, got: ArrayViewD<'_, f64>, want: ArrayViewD<'_, f64>) -> Comparison {
        let mut c = self.compare(got, want.view());
        if !c.pass && want.iter().all(|&v| v == 0.0) && c.max_abs <= self.max_abs {
            c.pass = true;
        }
        c
    }

    /// Compares `got` against the reference `want` (same shape required; a shape mismatch
    /// or any non-finite value fails with infinite error).
    pub fn compare(&self, got: ArrayViewD<'_, f64>, want: ArrayViewD<'_, f64>) -> Comparison {
        if got.shape() != want.shape() {
            return Comparison { rel_rms: f64::INFINITY, max_abs: f64::INFINITY, ref_max: 0.0, pass: false };
        }
        let mut num = 0.0f64;
        let mut den = 0.0f64;
        let mut max_abs = 0.0f64;
        let mut ref_max = 0.0f64;
        let mut finite = true;
        Zip::from(&got).and(&want).for_each(|&g, &w| {
            if !g.is_finite() || !w.is_finite() {
                finite = false;
            }
            let d = g - w;
            num += d * d;
            den += w * w;
            max_abs = max_abs.max(d.abs());
            ref_max = ref_max.max(w.abs());
        });
        let rel_rms = if finite { num.sqrt() / den.sqrt().max(1e-300) } else { f64::INFINITY };
        let max_abs = if finite { max_abs } else { f64::INFINITY };
        let pass = finite && rel_rms <= self.rel_rms && max_abs <= self.max_abs * ref_max.max(1.0);
        Comparison { rel_rms, max_abs, ref_max, pass }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::arr1;

    #[test]
    fn identical_passes_and_perturbed_fails() {
        let a = arr1(&[1.0, -2.0, 3.0]).into_dyn();
        let c = Tolerance::F64.compare(a.view(), a.view());
        assert!(c.pass && c.rel_rms == 0.0);
        let b = arr1(&[1.0, -2.0, 3.001]).into_dyn();
        let c = Tolerance::F64.compare(b.view(), a.view());
        assert!(!c.pass);
        assert!((c.max_abs - 0.001).abs() < 1e-12);
        let c = Tolerance::F32.compare(b.view(), a.view());
        assert!(!c.pass, "rel err {} must exceed 1e-4", c.rel_rms);
    }

    #[test]
    fn nan_and_shape_mismatch_fail() {
        let a = arr1(&[1.0, 2.0]).into_dyn();
        let n = arr1(&[1.0, f64::NAN]).into_dyn();
        assert!(!Tolerance::F32.compare(n.view(), a.view()).pass);
        let s = arr1(&[1.0]).into_dyn();
        assert!(!Tolerance::F32.compare(s.view(), a.view()).pass);
    }
}
