//! What both Toeplitz decoders share ([`History`]): the static taps and bias, the input
//! history, and the per-token checks. A decoder runs for at most `Tw` tokens (the length of `w`).

use mixer_core::mixer::check_decoder_capacity;
use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::mixers::toeplitz::state::HISTORY;
use mixer_core::state::POSITION;
use mixer_core::tensor::{contiguous, get};
use mixer_core::{Dims, DimsExt, Real, Result, Tensors};
use ndarray::ArrayD;

/// Static inputs, sizes, history `x[b, 0..t, c]` and position of a Toeplitz decoder.
pub struct History<F> {
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

impl<F: Real> History<F> {
    /// From the static inputs (`w`, optional `bias`) and the sizes `B`, `C` (validated).
    pub fn new(m: &Toeplitz, statics: &Tensors<F>, dims: &Dims) -> Result<Self> {
        let (batch, channels) = (dims.size("B")?, dims.size("C")?);
        let head_dim = m.head_dim(channels)?;
        let w = get(statics, "w")?;
        let limit = w.shape().last().copied().unwrap_or(0);
        let (taps, bias) = m.prepare_statics(w, statics.get("bias"), limit)?;
        Ok(History {
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
    pub fn tap_row(&self, i: usize, h: usize) -> &[F] {
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
        let t = self.pos;
        // A decoder runs for at most Tw tokens (the taps of `w`).
        check_decoder_capacity(t, self.limit)?;
        let x = contiguous(token, "x", &[self.batch, self.channels])?;
        for (col, &v) in self.hist.iter_mut().zip(x.iter()) {
            col.push(v);
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

    /// The state after the tokens consumed (docs/math.md §7.1): `x [B, Tw, C]`, the history at
    /// rows `0 … pos − 1` and zeros after, and `position [B]`.
    pub fn state(&self) -> Tensors<F> {
        let mut x = ArrayD::zeros(ndarray::IxDyn(&[self.batch, self.limit, self.channels]));
        for (bc, col) in self.hist.iter().enumerate() {
            let (b, c) = (bc / self.channels, bc % self.channels);
            for (s, &v) in col.iter().enumerate() {
                x[[b, s, c]] = v;
            }
        }
        let pos = mixer_core::state::position_tensor(&vec![self.pos; self.batch]);
        [(HISTORY.to_string(), x), (POSITION.to_string(), pos)].into_iter().collect()
    }

    /// Number of scalars of input history held.
    pub fn hist_elems(&self) -> usize {
        self.hist.iter().map(Vec::len).sum()
    }
}
