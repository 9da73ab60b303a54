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
