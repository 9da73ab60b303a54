//! The Toeplitz mixer on CPU (docs/math.md §3): `parallel` (direct `O(T²)` convolution), `fast`
//! (real FFT of a 7-smooth size `p ≥ 2T−1` chosen by a cost model, cached plans and kernel
//! spectra) and two decoders for `recurrent` — naive `O(t)` per token, or online FFT with
//! `O(log² t)` amortised work per token (config `decoder`).

pub mod backward;
pub mod columns;
pub mod decoder;
pub mod fast;
pub mod naive;
pub mod online;
pub mod parallel;

use mixer_core::Form;
use mixer_core::mixer::Decoder;
use mixer_core::mixers::toeplitz::{DecoderKind, FAMILY, Prepared, Toeplitz};
use mixer_core::tensor::get;
use mixer_core::{Dims, Real, Result, Tensors};
use mixer_registry::{BackwardFn, DecoderFn, Family, FamilyEntry, FormFn, register};
use ndarray::ArrayD;

use columns::Columns;

use fast::FftReal;

/// Runs a column form on the prepared inputs.
fn by_columns<F: Real>(
    tm: &Toeplitz,
    inputs: &Tensors<F>,
    form: fn(&Toeplitz, &Prepared<F>, &Columns<F>) -> Result<Columns<F>>,
) -> Result<ArrayD<F>> {
    let p = tm.prepare(inputs)?;
    let xcols = columns::columns(get(inputs, "x")?);
    let ycols = form(tm, &p, &xcols)?;
    Ok(columns::from_columns(&ycols, p.batch, p.channels))
}

/// The `parallel` form: the direct `O(T²)` convolution.
pub fn parallel<F: Real>(tm: &Toeplitz, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    by_columns(tm, inputs, |tm, p, x| Ok(parallel::direct(tm, p, x)))
}

/// The `fast` form: real FFTs of a 7-smooth size `≥ 2T − 1` ([`fast::fft_size`]).
pub fn fast<F: FftReal>(tm: &Toeplitz, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    if tm.cfg.kernel_width != 1 {
        return by_columns(tm, inputs, fast::fast);
    }
    let p = tm.prepare(inputs)?;
    let x = get(inputs, "x")?.as_standard_layout();
    let y = fast::fast_rows(&p, x.as_slice().unwrap_or(&[]))?;
    ArrayD::from_shape_vec(ndarray::IxDyn(&[p.batch, p.seq, p.channels]), y)
        .map_err(|e| mixer_core::Error::Numerical(format!("toeplitz fast form: output shape: {e}")))
}

/// The decoder selected by the config's `decoder` (`online` by default, or `naive`).
pub fn decoder<F: FftReal>(tm: &Toeplitz, statics: &Tensors<F>, dims: &Dims) -> Result<Box<dyn Decoder<F>>> {
    Ok(match tm.cfg.decoder {
        DecoderKind::Online => Box::new(online::OnlineDecoder::new(tm, statics, dims)?),
        DecoderKind::Naive => Box::new(naive::NaiveDecoder::new(tm, statics, dims)?),
    })
}

/// The Toeplitz mixer on CPU.
struct ToeplitzCpu;

impl<F: FftReal> Family<F> for ToeplitzCpu {
    type Mixer = Toeplitz;
    fn parallel(&self) -> Option<FormFn<Toeplitz, F>> {
        Some(parallel)
    }
    fn fast(&self) -> Option<FormFn<Toeplitz, F>> {
        Some(fast)
    }
    fn decoder(&self) -> Option<DecoderFn<Toeplitz, F>> {
        Some(decoder)
    }
    fn backward(&self, form: Form) -> Option<BackwardFn<Toeplitz, F>> {
        (form == Form::Fast).then_some(backward::vjp)
    }
}

#[register]
static TOEPLITZ_CPU: FamilyEntry =
    FamilyEntry { family: FAMILY, backend: "cpu", f64: &ToeplitzCpu, f32: &ToeplitzCpu, device: None };
