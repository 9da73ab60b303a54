//! What the GLR forms on CUDA share: the family's name in errors.

/// Family name in errors.
pub(crate) const FAMILY: &str = "glr";

/// The sizes `B, T, C, K` and the number of α slots `na` (`K + 1`, or 1 without per-slot α)
/// as the kernels' `int` arguments (an error names the one that does not fit).
pub(crate) fn dims(b: usize, t: usize, c: usize, k: usize, na: usize) -> mixer_core::Result<[i32; 5]> {
    use crate::runtime::int;
    Ok([
        int(FAMILY, "B", b)?,
        int(FAMILY, "T", t)?,
        int(FAMILY, "C", c)?,
        int(FAMILY, "K", k)?,
        int(FAMILY, "K+1", na)?,
    ])
}
