//! Toeplitz mixer on CUDA (docs/math.md §3):
//! $y_{t,e} = \sum_{i<K_w} \sum_{s \le t} w[i, h(e), t-s]\, x[s, e+i-(K_w-1)] + \text{bias}[h(e), t]$.
//!
//! - `fast`: batched real FFTs through cuFFT (plans cached): pack `x` and `w` into zero-padded
//!   rows of a fast size $p \ge 2T-1$, R2C, multiply-accumulate the spectra over the kernel
//!   taps, C2R, keep the first $T$ outputs and normalize once by $1/p$ ([`fast`]). The kernel
//!   spectra are recomputed per call (they are cheap next to the inputs' transforms).
//! - `parallel`: the direct $O(T^2)$ sum, one thread per output element ([`direct`]).
//! - `recurrent`: a naive decoder, $O(t)$ work per token over the full input history kept on
//!   the device ([`decoder`]); the CPU's online (relaxed) FFT decoder is not ported.

pub mod decoder;
pub mod direct;
pub mod fast;

use mixer_core::mixer::{Decoder, Mixer, downcast};
use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::{Dims, Form, Result, Tensors};
use mixer_registry::{KernelEntry, register};
use ndarray::ArrayD;

use crate::fft::FftReal;
use crate::runtime::err;

/// Kernel family name in errors.
pub(crate) const KERNEL: &str = "toeplitz";
/// The kernels (`kernels/toeplitz.cu`).
pub(crate) const SRC: &str = include_str!("../../kernels/toeplitz.cu");

fn run<F: FftReal>(m: &dyn Mixer, form: Form, x: &Tensors<F>) -> Result<ArrayD<F>> {
    let tz = downcast::<Toeplitz>(m, "cuda")?;
    match form {
        Form::Fast => fast::run(tz, x),
        Form::Parallel => direct::run(tz, x),
        f => Err(err(KERNEL, format!("form `{f}` is not computed by this kernel entry"))),
    }
}

fn dec<F: FftReal>(m: &dyn Mixer, statics: &Tensors<F>, dims: &Dims) -> Result<Box<dyn Decoder<F>>> {
    let tz = downcast::<Toeplitz>(m, "cuda")?;
    Ok(Box::new(decoder::NaiveDecoder::new(tz, statics, dims)?))
}

#[register]
static TOEPLITZ_CUDA: KernelEntry = KernelEntry {
    kernel: "toeplitz",
    backend: "cuda",
    forms: &[Form::Parallel, Form::Fast],
    run_f64: run::<f64>,
    run_f32: run::<f32>,
    decoder_f64: Some(dec::<f64>),
    decoder_f32: Some(dec::<f32>),
};
