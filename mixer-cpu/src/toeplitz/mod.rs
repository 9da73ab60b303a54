//! The Toeplitz mixer on CPU (docs/math.md §3): `parallel` (direct `O(T²)` convolution), `fast`
//! (real FFT of a 7-smooth size `p ≥ 2T−1` chosen by a cost model, cached plans and kernel
//! spectra) and two decoders for `recurrent` — naive `O(t)` per token, or online FFT with
//! `O(log² t)` amortised work per token (config `decoder`).
//!
//! Every form runs from a state and returns its final state (docs/math.md §7.1): `parallel` and
//! `fast` (and the `fast` backward) on the extension of [`toeplitz_state`], the decoders by
//! consuming the state's inputs ([`decoder_from_state`]).

pub mod backward;
pub mod columns;
pub mod decoder;
pub mod fast;
pub mod naive;
pub mod online;
pub mod parallel;

use mixer_core::Form;
use mixer_core::mixer::Decoder;
use mixer_core::mixers::toeplitz::state as toeplitz_state;
use mixer_core::mixers::toeplitz::{DecoderKind, FAMILY, Prepared, Toeplitz};
use mixer_core::state::StateVjp;
use mixer_core::tensor::get;
use mixer_core::{Dims, DimsExt, Real, Requires, Result, Tensors};
use mixer_registry::{
    BackwardFn, DecoderFn, Family, FamilyEntry, FormFn, StateBackwardFn, StateDecoderFn, StateFn, register,
};
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

/// The decoder of [`decoder`] started from a state (docs/math.md §7.1): it consumes the state's
/// inputs `x_0 … x_{a−1}` (outputs dropped), which leaves it exactly as after that prefix
/// (`O(a log² a)` for the online decoder, `O(a)` for the naive one). Rows at different positions
/// get one decoder each ([`mixer_core::state::decoder_by_rows`]): a decoder steps its rows
/// together.
pub fn decoder_from_state<F: FftReal>(
    tm: &Toeplitz,
    statics: &Tensors<F>,
    dims: &Dims,
    initial: Option<&Tensors<F>>,
) -> Result<Box<dyn Decoder<F>>> {
    let Some(s) = initial else { return decoder(tm, statics, dims) };
    let pos = toeplitz_state::positions(s, dims.size("T")?)?;
    let a = pos.first().copied().unwrap_or(0);
    if let Some(d) = mixer_core::state::by_rows_if_uneven(&pos, s, dims, |one, row| {
        decoder_from_state(tm, statics, one, Some(row))
    }) {
        return d;
    }
    let mut dec = decoder(tm, statics, dims)?;
    let hist = get(s, toeplitz_state::HISTORY)?;
    for t in 0..a {
        let token: Tensors<F> =
            std::iter::once(("x".to_string(), hist.index_axis(ndarray::Axis(1), t).to_owned())).collect();
        dec.step(&token)?;
    }
    Ok(mixer_core::state::resumed(dec, a))
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
    /// `parallel` and `fast` from a state: the form on the extension by the state's inputs
    /// ([`toeplitz_state::run`]).
    fn stateful(&self, form: Form) -> Option<StateFn<Toeplitz, F>> {
        match form {
            Form::Parallel => Some(|m, x, s| toeplitz_state::run(x, s, |e| parallel(m, e))),
            Form::Fast => Some(|m, x, s| toeplitz_state::run(x, s, |e| fast(m, e))),
            _ => None,
        }
    }
    fn stateful_backward(&self, form: Form) -> Option<StateBackwardFn<Toeplitz, F>> {
        (form == Form::Fast).then_some(|m, x, s, dy, df, req| {
            toeplitz_state::vjp(StateVjp { x, initial: s, dy, d_final: df, requires: req }, |e, d| {
                backward::vjp(m, e, d, &Requires::All)
            })
        })
    }
    fn decoder_from_state(&self) -> Option<StateDecoderFn<Toeplitz, F>> {
        Some(decoder_from_state)
    }
}

#[register]
static TOEPLITZ_CPU: FamilyEntry =
    FamilyEntry { family: FAMILY, backend: "cpu", f64: &ToeplitzCpu, f32: &ToeplitzCpu, device: None };
