//! The scalar types the library computes in (`f32`, `f64`).

use std::fmt::{Debug, Display};
use std::iter::Sum;

/// The scalar type of a computation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
}

impl DType {
    /// `"f32"` or `"f64"`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }
}

/// A real scalar: `f32` or `f64`. Every fast form is generic over it; the oracle is `f64`.
pub trait Real:
    num_traits::Float
    + num_traits::FromPrimitive
    + num_traits::NumAssign
    + ndarray::ScalarOperand
    + ndarray::LinalgScalar
    + faer::traits::RealField
    + Sum
    + Debug
    + Display
    + Default
    + Send
    + Sync
    + 'static
{
    /// Name of the type as it appears in reports (`"f32"` / `"f64"`).
    const NAME: &'static str;
    /// The matching [`DType`](DType).
    const DTYPE: DType;
    /// Converts from `f64` (rounding for `f32`).
    fn of(x: f64) -> Self;
    /// Converts to `f64`.
    fn f64(self) -> f64;
}

impl Real for f32 {
    const NAME: &'static str = "f32";
    const DTYPE: DType = DType::F32;
    #[inline]
    fn of(x: f64) -> Self {
        x as f32
    }
    #[inline]
    fn f64(self) -> f64 {
        self as f64
    }
}

impl Real for f64 {
    const NAME: &'static str = "f64";
    const DTYPE: DType = DType::F64;
    #[inline]
    fn of(x: f64) -> Self {
        x
    }
    #[inline]
    fn f64(self) -> f64 {
        self
    }
}

/// `Σ_c a[c] b[c]` over the common length, in eight running sums added in a fixed order (the
/// compiler vectorises them; a single running sum is bound by the latency of each addition):
/// `((s₀ + s₄) + (s₁ + s₅)) + ((s₂ + s₆) + (s₃ + s₇))`, then the tail past the last multiple of
/// eight. The same inputs give the same bits on every call.
pub fn dot8<F: Real>(a: &[F], b: &[F]) -> F {
    let mut acc = [F::zero(); 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail = ca.remainder().iter().zip(cb.remainder()).fold(F::zero(), |s, (&x, &y)| s + x * y);
    for (x, y) in ca.zip(cb) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

#[cfg(test)]
mod tests {
    /// [`super::dot8`] equals the plain sum in `f64` at lengths around multiples of eight.
    #[test]
    fn dot8_is_the_dot_product() {
        for n in [0, 1, 7, 8, 9, 16, 23, 64, 70] {
            let a: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37).sin()).collect();
            let b: Vec<f64> = (0..n).map(|i| (i as f64 * 0.11).cos() - 0.2).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((super::dot8(&a, &b) - want).abs() <= 1e-13 * (1.0 + want.abs()), "n = {n}");
        }
    }
}
