//! Softmax attention and local attention on CUDA (docs/math.md §1.3):
//! $y_t = \sum_{s \le t,\ t-s < w} \mathrm{softmax}_s(\text{scale}\cdot q_t \cdot k_s)\, v_s$.
//!
//! - `fast`: a tiled online-softmax forward ([`flash`]): one block per (query tile, batch·head),
//!   key/value tiles staged in shared memory, a running maximum and normalizer per query,
//!   causal and window masks applied before exponentiating. $O(T^2)$ work (or $O(T w)$ with a
//!   window), $O(T)$ memory.
//! - `recurrent`: a decoder with the KV cache **on the device** ([`decoder`]), a ring buffer of
//!   $\min(T, w)$ positions; each step appends $k_t, v_t$ and runs one block per (batch, head).

pub mod decoder;
pub mod flash;

use mixer_core::mixer::{Decoder, Mixer, downcast};
use mixer_core::mixers::attention::Attention;
use mixer_core::{Dims, Form, Result, Tensors};
use mixer_registry::{KernelEntry, register};
use ndarray::ArrayD;

use crate::runtime::{GpuReal, err};

/// Kernel family name in errors.
pub(crate) const KERNEL: &str = "attention";
/// The kernels (`kernels/attention.cu`).
pub(crate) const SRC: &str = include_str!("../../kernels/attention.cu");

fn run<F: GpuReal>(m: &dyn Mixer, form: Form, x: &Tensors<F>) -> Result<ArrayD<F>> {
    let a = downcast::<Attention>(m, "cuda")?;
    match form {
        Form::Fast => flash::run(a, x),
        f => Err(err(KERNEL, format!("form `{f}` is not computed by this kernel entry"))),
    }
}

fn dec<F: GpuReal>(m: &dyn Mixer, _statics: &Tensors<F>, dims: &Dims) -> Result<Box<dyn Decoder<F>>> {
    let a = downcast::<Attention>(m, "cuda")?;
    Ok(Box::new(decoder::KvDecoder::new(a, dims)?))
}

#[register]
static ATTENTION_CUDA: KernelEntry = KernelEntry {
    kernel: "attention",
    backend: "cuda",
    forms: &[Form::Fast],
    run_f64: run::<f64>,
    run_f32: run::<f32>,
    decoder_f64: Some(dec::<f64>),
    decoder_f32: Some(dec::<f32>),
};

/// The window as the kernels take it: `0` for none (or one at least as long as `T`).
pub(crate) fn window_arg(a: &Attention, t_len: usize) -> i32 {
    match a.window() {
        Some(w) if w < t_len => w as i32,
        _ => 0,
    }
}
