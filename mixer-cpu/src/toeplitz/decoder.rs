//! What both Toeplitz decoders share: the static kernel and bias, the input history, and the
//! per-token checks. A decoder runs for at most `Tw` tokens (the length of `w`).

use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::tensor::get;
use mixer_core::{Dims, Error, Real, Result, Tensors};
use ndarray::ArrayD;

use mixer_core::error::fmt_shape;

/// Static inputs, sizes, history `x[b, 0..t, c]` and position of a Toeplitz decoder.
pub struct Base<F> {
    /// The configured mixer.
    pub m: Toeplitz,
    /// Batch `B`.
    pub batch: usize,
    /// Channels `C`.
    pub channels: usize,
    /// `C/H`.
    pub head_dim: usize,
    /// Maximum number of tokens (`Tw`).
    pub limit: usize,
    /// `taps[(i·H + h)·Tw + j] = w[i, h, j]`.
    taps: Vec<F>,
    /// `bias[h·Tw + t]`.
    bias: Option<Vec<F>>,
    /// `hist[b·C + c][s] = x[b, s, c]` for `s < pos`.
    pub hist: Vec<Vec<F>>,
    /// Tokens consumed.
    pub pos: usize,
}

impl<F: Real> Base<F> {
    /// From the static inputs (`w`, optional `bias`) and the sizes `B`, `C` (validated).
    pub fn new(m: &Toeplitz, statics: &Tensors<F>, dims: &Dims) -> Result<Self> {
        let size = |s: &str| {
            dims.get(s).copied().ok_or_else(|| Error::Decoder(format!("size `{s}` not given to the decoder")))
        };
        let (batch, channels) = (size("B")?, size("C")?);
        let head_dim = m.head_dim(channels)?;
        let w = get(statics, "w")?;
        let limit = w.shape().last().copied().unwrap_or(0);
        let (taps, bias) = m.prepare_statics(w, statics.get("bias"), limit)?;
        Ok(Base {
            m: m.clone(),
            batch,
            channels,
            head_dim,
            limit,
            taps,
            bias,
            hist: (0..batch * channels).map(|_| Vec::new()).collect(),
            pos: 0,
        })
    }

    /// `w[i, h, 0..Tw)`.
    pub fn kernel(&self, i: usize, h: usize) -> &[F] {
        let n = self.limit;
        let r = i * self.m.cfg.heads + h;
        &self.taps[r * n..(r + 1) * n]
    }

    /// All taps, rows `(i, h)` of length `Tw`.
    pub fn taps(&self) -> &[F] {
        &self.taps
    }

    /// `bias[h, t]` (0 without bias).
    pub fn bias(&self, h: usize, t: usize) -> F {
        self.bias.as_ref().map(|b| b[h * self.limit + t]).unwrap_or_else(F::zero)
    }

    /// Checks the token (`x [B, C]`) and the position, and appends it to the history;
    /// returns its position `t`.
    pub fn push(&mut self, token: &Tensors<F>) -> Result<usize> {
        let x = get(token, "x")?;
        if x.shape() != [self.batch, self.channels] {
            return Err(Error::shape(
                "x",
                format!("[B = {}, C = {}] per token", self.batch, self.channels),
                fmt_shape(x.shape()),
            ));
        }
        let t = self.pos;
        if t >= self.limit {
            return Err(Error::Decoder(format!(
                "position {t} is past the kernel: w has Tw = {} taps, so at most {} tokens can be decoded",
                self.limit, self.limit
            )));
        }
        for b in 0..self.batch {
            for c in 0..self.channels {
                self.hist[b * self.channels + c].push(x[[b, c]]);
            }
        }
        self.pos = t + 1;
        Ok(t)
    }

    /// The output tensor `[B, C]` from a function of `(b, e)`.
    pub fn output(&self, mut f: impl FnMut(usize, usize) -> F) -> ArrayD<F> {
        let mut y = ArrayD::zeros(ndarray::IxDyn(&[self.batch, self.channels]));
        for b in 0..self.batch {
            for e in 0..self.channels {
                y[[b, e]] = f(b, e);
            }
        }
        y
    }

    /// Number of scalars of input history held.
    pub fn hist_elems(&self) -> usize {
        self.hist.iter().map(Vec::len).sum()
    }
}
