//! Toeplitz mixer on CUDA (docs/math.md §3):
//! `y_{t,e} = Σ_{i<K_w} Σ_{s ≤ t} w[i, h(e), t−s] x[s, e+i−(K_w−1)] + bias[h(e), t]`.
//!
//! - `fast`: batched real FFTs through cuFFT (plans cached): pack `x` and `w` into zero-padded
//!   rows of a fast size `p ≥ 2T−1`, R2C, multiply-accumulate the spectra over the kernel
//!   taps, C2R, keep the first `T` outputs and normalize once by `1/p` ([`fast`]). The kernel
//!   spectra are recomputed per call (they are cheap next to the inputs' transforms).
//! - `parallel`: the direct `O(T²)` sum, one thread per output element ([`direct`]).
//! - `recurrent`: a naive decoder, `O(t)` work per token over the full input history kept on
//!   the device ([`decoder`]), for `decoder: "naive"`. The CPU's online (relaxed) FFT decoder
//!   is not ported: for `decoder: "online"` (the default) the recurrent form is unavailable on
//!   this backend, with that reason.

pub mod decoder;
pub mod direct;
pub mod fast;

use mixer_core::Form;
use mixer_core::mixers::toeplitz::{DecoderKind, Toeplitz};
use mixer_registry::{DecoderFn, Family, FamilyEntry, FormFn, register};

use crate::fft::FftReal;

/// Family name in errors.
pub(crate) const FAMILY: &str = mixer_core::mixers::toeplitz::FAMILY;

/// The Toeplitz mixer on CUDA.
struct ToeplitzCuda;

impl<F: FftReal> Family<F> for ToeplitzCuda {
    type Mixer = Toeplitz;
    fn parallel(&self) -> Option<FormFn<Toeplitz, F>> {
        Some(direct::run)
    }
    fn fast(&self) -> Option<FormFn<Toeplitz, F>> {
        Some(fast::run)
    }
    fn decoder(&self) -> Option<DecoderFn<Toeplitz, F>> {
        Some(|tz, statics, dims| Ok(Box::new(decoder::NaiveDecoder::<F>::new(tz, statics, dims)?)))
    }
    fn unsupported(&self, tz: &Toeplitz, form: Form) -> Option<String> {
        (form == Form::Recurrent && tz.cfg.decoder == DecoderKind::Online).then(|| {
            "the online FFT decoder is not ported to CUDA; configure `\"decoder\": \"naive\"`".to_string()
        })
    }
}

#[register]
static TOEPLITZ_CUDA: FamilyEntry =
    FamilyEntry { family: FAMILY, backend: "cuda", f64: &ToeplitzCuda, f32: &ToeplitzCuda };
