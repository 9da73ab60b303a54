//! The Toeplitz mixer on CPU (MATH.md §3): `parallel` (direct `O(T²)` convolution), `fast`
//! (real FFT of a 7-smooth size `p ≥ 2T−1`, cached plans and kernel spectra) and two
//! decoders for `recurrent` — naive `O(t)` per token, or online FFT with `O(log² t)`
//! amortised work per token (config `decoder`).

pub mod backward;
pub mod decode;
pub mod direct;
pub mod fft;
pub mod naive;
pub mod online;

use mixer_core::mixer::{Decoder, Mixer, downcast};
use mixer_core::mixers::toeplitz::{DecoderKind, KERNEL, Toeplitz};
use mixer_core::tensor::get;
use mixer_core::{Dims, Error, Form, Real, Result, Tensors};
use mixer_registry::{KernelEntry, register};
use ndarray::{ArrayD, IxDyn};

use fft::FftReal;

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

/// The `parallel` and `fast` forms (inputs already validated by `run::run`; checked again).
pub fn run<F: FftReal>(m: &dyn Mixer, form: Form, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let tm = downcast::<Toeplitz>(m, "cpu")?;
    let p = tm.prepare(inputs)?;
    let xcols = columns(get(inputs, "x")?);
    let ycols = match form {
        Form::Parallel => direct::direct(tm, &p, &xcols),
        Form::Fast => fft::fast(tm, &p, &xcols)?,
        f => {
            return Err(Error::FormUnavailable {
                mixer: m.name().to_string(),
                form: f.name().to_string(),
                backend: "cpu".into(),
                available: "materialized, parallel, fast, recurrent".into(),
            });
        }
    };
    Ok(from_columns(&ycols, p.batch, p.seq, p.channels))
}

/// The decoder selected by the config's `decoder` (`online` by default, or `naive`).
pub fn decoder<F: FftReal>(m: &dyn Mixer, statics: &Tensors<F>, dims: &Dims) -> Result<Box<dyn Decoder<F>>> {
    let tm = downcast::<Toeplitz>(m, "cpu")?;
    Ok(match tm.cfg.decoder {
        DecoderKind::Online => Box::new(online::OnlineDecoder::new(tm, statics, dims)?),
        DecoderKind::Naive => Box::new(naive::NaiveDecoder::new(tm, statics, dims)?),
    })
}

#[register]
static TOEPLITZ_CPU: KernelEntry = KernelEntry {
    kernel: KERNEL,
    backend: "cpu",
    forms: &[Form::Parallel, Form::Fast],
    run_f64: run::<f64>,
    run_f32: run::<f32>,
    decoder_f64: Some(decoder::<f64>),
    decoder_f32: Some(decoder::<f32>),
};
