//! Toeplitz mixer on CUDA (docs/math.md §3):
//! `y_{t,e} = Σ_{i<K_w} Σ_{s ≤ t} w[i, h(e), t−s] x[s, e+i−(K_w−1)] + bias[h(e), t]`.
//!
//! - `fast`: batched real FFTs through cuFFT (plans cached): pack `x` and `w` into zero-padded
//!   rows of a fast size `p ≥ 2T−1`, R2C, multiply-accumulate the spectra over the kernel
//!   taps, C2R, keep the first `T` outputs and normalize once by `1/p` ([`fast`]). The kernel
//!   spectra are cached per kernel tensor ([`spectra`]): a model that keeps `w` on the device
//!   transforms it once.
//! - `parallel`: the direct `O(T²)` sum, one thread per output element ([`parallel`]).
//! - `recurrent`: for `decoder: "online"` (the default), the online (relaxed) FFT decoder,
//!   `O(log² t)` amortised work per token ([`online`]); for `decoder: "naive"`, `O(t)` work per
//!   token over the full input history ([`decoder`]). Both keep their state on the device.
//! - backward of `fast` ([`backward`]): `d_x` by the forward's spectral product in its adjoint
//!   form (conjugated kernel spectra), `d_w` by a cross-correlation of `x` and `dy` summed per
//!   head in the frequency domain, `d_bias` by a sum over the batch and the head's channels.
//!
//! Kernels and biases may be longer than `T` (`Tw, Tb ≥ T`); the kernels read the first `T`
//! entries of each row, so device tensors are used as given, without a truncating copy.

pub mod backward;
pub mod common;
pub mod decoder;
pub mod fast;
pub mod naive;
pub mod online;
pub mod parallel;
pub mod spectra;
pub mod state;

use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::{Result, Tensors};
use mixer_registry::StateDecoderFn;

use crate::fft::FftReal;
use crate::forms::{
    DeviceBackwardFn, DeviceDecoderFn, DeviceFamily, DeviceFormFn, DeviceStateBackwardFn, DeviceStateFn,
};

use common::FAMILY;

/// The Toeplitz mixer on CUDA.
pub struct ToeplitzCuda;

impl<F: FftReal> DeviceFamily<F> for ToeplitzCuda {
    type Mixer = Toeplitz;
    fn parallel() -> Option<DeviceFormFn<Toeplitz>> {
        Some(parallel::run::<F>)
    }
    fn fast() -> Option<DeviceFormFn<Toeplitz>> {
        Some(fast::run::<F>)
    }
    fn backward() -> Option<DeviceBackwardFn<Toeplitz>> {
        Some(backward::run::<F>)
    }
    fn decoder() -> Option<DeviceDecoderFn<Toeplitz, F>> {
        Some(decoder::make::<F>)
    }
    fn decoder_from_state() -> Option<StateDecoderFn<Toeplitz, F>> {
        Some(decoder::from_state::<F>)
    }
    /// From a state (the inputs the taps read): the fast form on the extension by them, on the
    /// device ([`state`]).
    fn fast_from_state() -> Option<DeviceStateFn<Toeplitz>> {
        Some(state::run_from::<F>)
    }
    /// The host's checks of a history: the positions and the zero rows from them on
    /// (`mixer_core::mixers::toeplitz::state::positions`).
    fn check_host_state(_tz: &Toeplitz, x: &Tensors<F>, s: &Tensors<F>) -> Result<()> {
        let t_len = x.get("x").map_or(0, |v| v.shape()[1]);
        mixer_core::mixers::toeplitz::state::positions(s, t_len).map(drop)
    }
    /// The backward from a state: the extension's, on the device ([`state`]).
    fn fast_backward_from_state() -> Option<DeviceStateBackwardFn<Toeplitz>> {
        Some(state::backward_from::<F>)
    }
}

cuda_family!(TOEPLITZ_CUDA, FAMILY, ToeplitzCuda);
