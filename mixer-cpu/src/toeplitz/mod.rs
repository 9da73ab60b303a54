//! The Toeplitz mixer on CPU (MATH.md §3): `parallel` (direct `O(T²)` convolution), `fast`
//! (real FFT of a 7-smooth size `p ≥ 2T−1`, cached plans and kernel spectra) and two
//! decoders for `recurrent` — naive `O(t)` per token, or online FFT with `O(log² t)`
//! amortised work per token (config `decoder`).

pub mod decoder;
pub mod direct;
pub mod fast;
pub mod naive;
pub mod online;

use mixer_core::mixer::Decoder;
use mixer_core::mixers::toeplitz::{DecoderKind, FAMILY, Prepared, Toeplitz};
use mixer_core::tensor::get;
use mixer_core::{Dims, Real, Result, Tensors};
use mixer_registry::{DecoderFn, Family, FamilyEntry, FormFn, register};
use ndarray::{ArrayD, IxDyn};

use fast::FftReal;

/// `x [B,T,C]` as columns `cols[b·C + c][t]`.
pub fn columns<F: Real>(x: &ArrayD<F>) -> Vec<Vec<F>> {
    let (nb, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let x = x.as_standard_layout();
    let flat = x.as_slice().unwrap_or(&[]);
    (0..nb * c).map(|idx| (0..t).map(|s| flat[((idx / c) * t + s) * c + idx % c]).collect()).collect()
}

/// The inverse of [`columns`]: `y [B,T,C]` from `cols[b·C + c][t]`.
pub fn from_columns<F: Real>(cols: &[Vec<F>], nb: usize, t: usize, c: usize) -> ArrayD<F> {
    let mut flat = vec![F::zero(); nb * t * c];
    for (idx, col) in cols.iter().enumerate() {
        let (b, e) = (idx / c, idx % c);
        for (s, &v) in col.iter().enumerate() {
            flat[(b * t + s) * c + e] = v;
        }
    }
    ArrayD::from_shape_vec(IxDyn(&[nb, t, c]), flat).unwrap_or_else(|_| ArrayD::zeros(IxDyn(&[nb, t, c])))
}

/// Runs a column form on the prepared inputs.
fn by_columns<F: Real>(
    tm: &Toeplitz,
    inputs: &Tensors<F>,
    form: fn(&Toeplitz, &Prepared<F>, &[Vec<F>]) -> Result<Vec<Vec<F>>>,
) -> Result<ArrayD<F>> {
    let p = tm.prepare(inputs)?;
    let xcols = columns(get(inputs, "x")?);
    let ycols = form(tm, &p, &xcols)?;
    Ok(from_columns(&ycols, p.batch, p.seq, p.channels))
}

/// The `parallel` form: the direct `O(T²)` convolution.
pub fn parallel<F: Real>(tm: &Toeplitz, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    by_columns(tm, inputs, |tm, p, x| Ok(direct::direct(tm, p, x)))
}

/// The `fast` form: real FFTs of a 7-smooth size `≥ 2T − 1`.
pub fn fast<F: FftReal>(tm: &Toeplitz, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    by_columns(tm, inputs, fast::fast)
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
}

#[register]
static TOEPLITZ_CPU: FamilyEntry =
    FamilyEntry { family: FAMILY, backend: "cpu", f64: &ToeplitzCpu, f32: &ToeplitzCpu };
