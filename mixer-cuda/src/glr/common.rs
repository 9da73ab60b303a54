//! What the GLR forms on CUDA share: the family's name in errors.

/// Family name in errors.
pub(crate) const FAMILY: &str = "glr";
