//! What both Toeplitz decoders on the GPU share ([`Statics`], as the CPU's `decoder.rs`): the
//! taps and bias on the device, the per-token checks and copy into the input history, and the
//! state read back from it. The decoders: [`super::naive`] and [`super::online`].
//!
//! From a state (docs/math.md §7.1, [`from_state`]): as on the CPU, the decoder consumes the
//! state's inputs `x_0 … x_{a−1}` (each uploaded, its output dropped, nothing waited for), which
//! leaves it exactly as after that prefix; rows at different positions get a decoder each.

use mixer_core::mixer::Decoder;
use mixer_core::mixers::toeplitz::state::{HISTORY, positions};
use mixer_core::mixers::toeplitz::{DecoderKind, Toeplitz};
use mixer_core::state::{POSITION, by_rows_if_uneven, position_tensor, resumed};
use mixer_core::tensor::get;
use mixer_core::{Dims, DimsExt, Error, Result, Tensors};
use ndarray::{ArrayD, Axis, IxDyn};

use super::common::{FAMILY, kernel_dims};
use crate::attention::decoder::token_shape;
use crate::fft::FftReal;
use crate::forms::{StatefulDeviceDecoder, hosted_decoder, input};
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu};
use crate::tensor::{DeviceTensor, DeviceTensors};

/// What both decoders keep on the device: the taps `[Kw·H, T]` and the bias `[H, T]` (truncated to
/// `T`), with the sizes as kernel ints.
pub(crate) struct Statics<F: FftReal> {
    pub w: Pooled<F>,
    pub bias: Pooled<F>,
    pub has_bias: i32,
    /// `[B, T, C, H, Kw]`.
    pub dims: [i32; 5],
    /// `B·C`.
    pub bc: usize,
    /// `T`.
    pub tmax: usize,
    /// `Tw`, the taps' length (the state's history rows).
    pub tw: usize,
}

impl<F: FftReal> Statics<F> {
    /// Checks and uploads the taps and bias.
    pub fn upload(tz: &Toeplitz, statics: &Tensors<F>, dims: &Dims) -> Result<Self> {
        let (b, t, c) = (dims.size("B")?, dims.size("T")?, dims.size("C")?);
        tz.head_dim(c)?;
        let (taps, bias) = tz.prepare_statics(get(statics, "w")?, statics.get("bias"), t)?;
        let w = pool::upload(FAMILY, &taps)?;
        let (bias, has_bias) = match bias {
            Some(v) => (pool::upload(FAMILY, &v)?, 1),
            None => (pool::zeros::<F>(FAMILY, 1)?, 0),
        };
        let tw = get(statics, "w")?.shape().last().copied().unwrap_or(0);
        Ok(Statics { w, bias, has_bias, dims: kernel_dims(tz, b, t, c)?, bc: b * c, tmax: t, tw })
    }

    /// Checks the capacity and the token's `x [B, C]` and copies it into row `t` of the history
    /// `[T, B, C]` (device to device, stream-ordered).
    pub fn append(&self, hist: &mut Pooled<F>, t: usize, token: &DeviceTensors) -> Result<()> {
        mixer_core::mixer::check_decoder_capacity(t, self.tmax)?;
        let [b, _, c, _, _] = self.dims;
        let xs = input::<F>(token, "x")?;
        token_shape("x", xs.shape(), &[b as usize, c as usize])?;
        if self.bc > 0 {
            let mut dst = hist.slice_mut(t * self.bc..(t + 1) * self.bc);
            gpu()?
                .stream()
                .memcpy_dtod(&xs.view(), &mut dst)
                .map_err(|e| err(FAMILY, format!("copy: {e}")))?;
        }
        Ok(())
    }

    /// The state after `t` tokens (docs/math.md §7.1): `x [B, Tw, C]` holding rows `0 … t − 1` of
    /// the history `[T, B, C]`, zeros after, and `position [B]`.
    pub fn state(&self, hist: &Pooled<F>, t: usize) -> Result<Tensors<F>> {
        let [b, _, c, _, _] = self.dims.map(|d| d as usize);
        let (bc, tw) = (self.bc, self.tw);
        let rows = pool::download(FAMILY, hist, t * bc)?;
        let mut x = vec![F::default(); b * tw * c];
        for (s, row) in rows.chunks(bc.max(1)).enumerate().take(t.min(tw)) {
            for (bi, xb) in row.chunks(c.max(1)).enumerate() {
                x[(bi * tw + s) * c..][..c].copy_from_slice(xb);
            }
        }
        let x = ArrayD::from_shape_vec(IxDyn(&[b, tw, c]), x)
            .map_err(|e| Error::Decoder(format!("the exported history: {e}")))?;
        Ok([(HISTORY.to_string(), x), (POSITION.to_string(), position_tensor::<F>(&vec![t; b]))]
            .into_iter()
            .collect())
    }
}

/// The decoder the config's `decoder` selects (`online` by default, or `naive`).
pub(crate) fn make<F: FftReal>(
    tz: &Toeplitz,
    statics: &Tensors<F>,
    dims: &Dims,
) -> Result<Box<dyn StatefulDeviceDecoder<F>>> {
    Ok(match tz.cfg.decoder {
        DecoderKind::Naive => Box::new(super::naive::NaiveDecoder::<F>::new(tz, statics, dims)?),
        DecoderKind::Online => Box::new(super::online::OnlineDecoder::<F>::new(tz, statics, dims)?),
    })
}

/// The decoder started from the state `initial` (module documentation; `None`: zeros), driven
/// with host arrays: the registry's decoder from a state on this backend.
pub fn from_state<F: FftReal>(
    tz: &Toeplitz,
    statics: &Tensors<F>,
    dims: &Dims,
    initial: Option<&Tensors<F>>,
) -> Result<Box<dyn Decoder<F>>> {
    let Some(s) = initial else { return Ok(hosted_decoder(make(tz, statics, dims)?)) };
    let pos = positions(s, dims.size("T")?)?;
    if let Some(d) = by_rows_if_uneven(&pos, s, dims, |one, row| from_state(tz, statics, one, Some(row))) {
        return d;
    }
    let a = pos.first().copied().unwrap_or(0);
    let mut more = dims.clone();
    more.insert("T", dims.size("T")? + a);
    let mut dec = make(tz, statics, &more)?;
    let hist = get(s, HISTORY)?;
    for t in 0..a {
        let x = DeviceTensor::upload(&hist.index_axis(Axis(1), t).to_owned())?;
        dec.step(&[("x".to_string(), F::wrap(x))].into_iter().collect())?;
    }
    Ok(resumed(hosted_decoder(dec), a))
}
