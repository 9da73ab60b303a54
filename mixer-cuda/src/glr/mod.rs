//! Generalized linear recurrence on CUDA (docs/math.md §1.2), for any offset pattern, on `b`,
//! `a` or `both`, translation-invariant or cache-efficient:
//! $y_t = \alpha_{t,0} x_t + \sum_{k: f(k) \le t} \big(\alpha_{t,k+1} x_{d_k(t)} + \beta_{t,k} y_{d_k(t)}\big)$.
//!
//! The pattern reaches the GPU as a table computed on the host from
//! [`mixer_core::pattern::Pattern`] (offsets $f(k)$ and lattice strides $a_k$, $k < K(T)$), so
//! a plugin pattern works with no kernel of its own.
//! - `fast`: the sparse recurrence, one thread per (batch, channel), sequential over $t$
//!   ([`scan`]); $O(T \cdot K)$ work per thread.
//! - `recurrent`: a decoder whose cache holds exactly the positions later tokens read
//!   (the lattice's $P_{t+1}$, or the last $f(K-1)$ outputs for translation-invariant
//!   patterns), on the device; slots are assigned on the host ([`decoder`]).

pub mod decoder;
pub mod scan;

use mixer_core::mixer::{Decoder, Mixer, downcast};
use mixer_core::mixers::glr::Glr;
use mixer_core::{Dims, Form, Result, Tensors};
use mixer_registry::{KernelEntry, register};
use ndarray::ArrayD;

use crate::runtime::{GpuReal, err};

/// Kernel family name in errors.
pub(crate) const KERNEL: &str = "glr";
/// The kernels (`kernels/glr.cu`).
pub(crate) const SRC: &str = include_str!("../../kernels/glr.cu");

/// Dependency position of a slot with offset `fk ≤ t` and stride `ak` (docs/math.md §1.1):
/// $t - f(k)$, or $a_k \lceil (t + 1 - f(k)) / a_k \rceil - 1$ on the cache-efficient lattice.
pub(crate) fn dep(t: u64, fk: u64, ak: u64, cache_efficient: bool) -> u64 {
    if !cache_efficient {
        return t - fk;
    }
    let u = t + 1 - fk;
    let a = ak.max(1);
    u.div_ceil(a) * a - 1
}

fn run<F: GpuReal>(m: &dyn Mixer, form: Form, x: &Tensors<F>) -> Result<ArrayD<F>> {
    let glr = downcast::<Glr>(m, "cuda")?;
    match form {
        Form::Fast => scan::run(glr, x),
        f => Err(err(KERNEL, format!("form `{f}` is not computed by this kernel entry"))),
    }
}

fn dec<F: GpuReal>(m: &dyn Mixer, _statics: &Tensors<F>, dims: &Dims) -> Result<Box<dyn Decoder<F>>> {
    let glr = downcast::<Glr>(m, "cuda")?;
    Ok(Box::new(decoder::GlrDecoder::new(glr, dims)?))
}

#[register]
static GLR_CUDA: KernelEntry = KernelEntry {
    kernel: "glr",
    backend: "cuda",
    forms: &[Form::Fast],
    run_f64: run::<f64>,
    run_f32: run::<f32>,
    decoder_f64: Some(dec::<f64>),
    decoder_f32: Some(dec::<f32>),
};
