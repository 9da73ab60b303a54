//! What the attention forms on CUDA share: the family's name in errors and the window as the
//! kernels take it.

use mixer_core::mixers::attention::Attention;

/// Family name in errors.
pub(crate) const FAMILY: &str = "attention";

/// The window as the kernels take it: `0` for none (or one at least as long as `T`).
pub(crate) fn window_arg(a: &Attention, t_len: usize) -> i32 {
    match a.window() {
        Some(w) if w < t_len => w as i32,
        _ => 0,
    }
}
