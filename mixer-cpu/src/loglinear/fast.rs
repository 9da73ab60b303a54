//! The `fast` form on CPU: the chunked algorithm of docs/math.md §2.6 (Fenwick structure; the
//! registry refuses other masks through [`Mixer::form_unsupported`](mixer_core::Mixer::form_unsupported)),
//! per (batch, head) in parallel: linear attention, Mamba-2 and their lifts (scalar transitions)
//! take the specialisation [`super::ssd`], gated DeltaNet and its lift the general
//! [`super::chunked`] form.

use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Result, Tensors};
use ndarray::ArrayD;

use super::common::run_heads;
use super::{chunked, ssd};
use crate::vmath::VecMath;

/// The `fast` form.
pub fn fast<F: VecMath>(m: &LogLinear, x: &Tensors<F>) -> Result<ArrayD<F>> {
    if ssd::applies(m) {
        return run_heads(m, x, |m, hd| flushed(|| ssd::run_head(m, hd)), true);
    }
    run_heads(m, x, |m, hd| flushed(|| chunked::run_head(m, hd)), false)
}

/// Runs one head's chunked form with subnormal results flushed to zero
/// ([`crate::flush::FlushToZero`]): its decaying level states would otherwise pass through
/// the subnormal range in every product.
fn flushed<T>(f: impl FnOnce() -> T) -> T {
    let _ftz = crate::flush::FlushToZero::new();
    f()
}
