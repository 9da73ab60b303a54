//! Toeplitz mixer on CUDA (docs/math.md §3):
//! `y_{t,e} = Σ_{i<K_w} Σ_{s ≤ t} w[i, h(e), t−s] x[s, e+i−(K_w−1)] + bias[h(e), t]`.
//!
//! - `fast`: batched real FFTs through cuFFT (plans cached): pack `x` and `w` into zero-padded
//!   rows of a fast size `p ≥ 2T−1`, R2C, multiply-accumulate the spectra over the kernel
//!   taps, C2R, keep the first `T` outputs and normalize once by `1/p` ([`fast`]). The kernel
//!   spectra are cached per kernel tensor ([`spectra`]): a model that keeps `w` on the device
//!   transforms it once.
//! - `parallel`: the direct `O(T²)` sum, one thread per output element ([`direct`]).
//! - `recurrent`: for `decoder: "online"` (the default), the online (relaxed) FFT decoder,
//!   `O(log² t)` amortised work per token ([`online`]); for `decoder: "naive"`, `O(t)` work per
//!   token over the full input history ([`decoder`]). Both keep their state on the device.
//!
//! Kernels and biases may be longer than `T` (`Tw, Tb ≥ T`); the kernels read the first `T`
//! entries of each row, so device tensors are used as given, without a truncating copy.

pub mod decoder;
pub mod direct;
pub mod fast;
pub mod online;
pub mod spectra;

use std::borrow::Cow;

use mixer_core::Result;
use mixer_core::mixers::toeplitz::{DecoderKind, Toeplitz};
use mixer_registry::{FamilyEntry, register};

use crate::device_run::Device;
use crate::fft::FftReal;
use crate::forms::{DeviceDecoderFn, DeviceFamily, DeviceFormFn, Hosted, input, input_opt};
use crate::runtime::int;
use crate::tensor::{DeviceTensor, DeviceTensors};

/// Family name in errors.
pub(crate) const FAMILY: &str = mixer_core::mixers::toeplitz::FAMILY;

/// The Toeplitz mixer on CUDA.
pub struct ToeplitzCuda;

impl<F: FftReal> DeviceFamily<F> for ToeplitzCuda {
    type Mixer = Toeplitz;
    fn parallel() -> Option<DeviceFormFn<Toeplitz>> {
        Some(direct::run::<F>)
    }
    fn fast() -> Option<DeviceFormFn<Toeplitz>> {
        Some(fast::run::<F>)
    }
    fn decoder() -> Option<DeviceDecoderFn<Toeplitz, F>> {
        Some(|tz, statics, dims| -> Result<Box<dyn crate::forms::DeviceDecoder>> {
            Ok(match tz.cfg.decoder {
                DecoderKind::Naive => Box::new(decoder::NaiveDecoder::<F>::new(tz, statics, dims)?),
                DecoderKind::Online => Box::new(online::OnlineDecoder::<F>::new(tz, statics, dims)?),
            })
        })
    }
}

#[register]
static TOEPLITZ_CUDA: FamilyEntry = FamilyEntry {
    family: FAMILY,
    backend: "cuda",
    f64: &Hosted(ToeplitzCuda),
    f32: &Hosted(ToeplitzCuda),
    device: Some(&Device(ToeplitzCuda)),
};

/// The inputs of a form on the device, with the sizes the kernels take.
pub(crate) struct Prepared<'a, F: FftReal> {
    pub x: Cow<'a, DeviceTensor<F>>,
    pub w: Cow<'a, DeviceTensor<F>>,
    pub bias: Option<Cow<'a, DeviceTensor<F>>>,
    /// `[B, T, C, H, Kw, Lw, Lb]` as kernel ints (`Lw`, `Lb`: row lengths of `w` and `bias`).
    pub dims: [i32; 7],
    pub b: usize,
    pub t: usize,
    pub c: usize,
}

/// `[B, T, C, H, Kw]` as kernel ints.
pub(crate) fn kernel_dims(tz: &Toeplitz, b: usize, t: usize, c: usize) -> Result<[i32; 5]> {
    Ok([
        int(FAMILY, "B", b)?,
        int(FAMILY, "T", t)?,
        int(FAMILY, "C", c)?,
        int(FAMILY, "H", tz.cfg.heads)?,
        int(FAMILY, "Kw", tz.cfg.kernel_width)?,
    ])
}

/// Checks the shapes of `x`, `w` and `bias` as every form does (through the same
/// [`Toeplitz::check_statics`], on the shapes alone: no host work that grows with `T`) and gathers the
/// device inputs.
pub(crate) fn prepare<'a, F: FftReal>(tz: &Toeplitz, x: &'a DeviceTensors) -> Result<Prepared<'a, F>> {
    let xs = input::<F>(x, "x")?;
    let s = xs.shape().to_vec();
    if s.len() != 3 {
        return Err(mixer_core::Error::shape("x", "[B, T, C]", mixer_core::error::fmt_shape(&s)));
    }
    let (b, t, c) = (s[0], s[1], s[2]);
    tz.head_dim(c)?;
    let w = input::<F>(x, "w")?;
    let bias = input_opt::<F>(x, "bias")?;
    tz.check_statics(w.shape(), bias.as_ref().map(|d| d.shape()), t)?;
    let lw = *w.shape().last().unwrap_or(&0);
    let lb = bias.as_ref().map_or(t, |d| *d.shape().last().unwrap_or(&0));
    let [bi, ti, ci, hi, kwi] = kernel_dims(tz, b, t, c)?;
    let dims = [bi, ti, ci, hi, kwi, int(FAMILY, "Tw", lw)?, int(FAMILY, "Tb", lb)?];
    Ok(Prepared { x: xs, w, bias, dims, b, t, c })
}
