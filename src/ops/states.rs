//! The typed recurrent states of attention, the Toeplitz mixer and the GLR (docs/math.md §7.1):
//! a [`KvCache`] for [`attention_state`](super::attention_state), a [`RowState`] for
//! [`toeplitz_state`](super::toeplitz_state) and [`glr_state`](super::glr_state); the runs
//! from a state live with their families' functions.

use mixer_core::state::POSITION;
use mixer_core::{Error, Real, Result, Tensors};
use ndarray::{Array, Array3, Array4, ArrayD, Dimension};

use super::scalar::Scalar;

/// A per-row count (a position or a cached length) as a `[B]` tensor of the state's type.
fn counts<F: Real>(n: &[usize]) -> ArrayD<F> {
    mixer_core::state::position_tensor(n)
}

/// Takes the tensor `name` of a state, as rank `D`.
fn take<F: Clone, D: Dimension>(t: &mut Tensors<F>, name: &str) -> Result<Array<F, D>> {
    t.remove(name)
        .ok_or_else(|| Error::Decoder(format!("internal: the state has no tensor `{name}`")))?
        .into_dimensionality()
        .map_err(|e| Error::shape(name, format!("rank {}", D::NDIM.unwrap_or(0)), e.to_string()))
}

/// A per-row count tensor back as integers.
fn take_counts<F: Real>(t: &mut Tensors<F>, name: &str) -> Result<Vec<usize>> {
    Ok(take::<F, ndarray::Ix1>(t, name)?.iter().map(|&p| p.f64() as usize).collect())
}

/// Attention's recurrent state, a KV cache of capacity `N` (docs/math.md §7.1): row `b` holds
/// its `length[b]` most recent keys and values at rows `0 … length[b] − 1`, oldest first, and
/// zeros after. With a window `w` the capacity is `w − 1`; without one it is the caller's (a
/// run without a cache returns one of capacity `T`; pass a cache of zeros with length 0 and a
/// larger capacity to keep prefilling into it).
#[derive(Clone, Debug, PartialEq)]
pub struct KvCache<F> {
    /// `k [B, N, H, Dk]`.
    pub k: Array4<F>,
    /// `v [B, N, H, Dv]`.
    pub v: Array4<F>,
    /// The cached tokens per batch row.
    pub length: Vec<usize>,
}

impl<F: Scalar> KvCache<F> {
    /// An empty cache of capacity `n` for `B` rows and `H` heads.
    pub fn empty(b: usize, n: usize, h: usize, dk: usize, dv: usize) -> Self {
        KvCache { k: Array4::zeros((b, n, h, dk)), v: Array4::zeros((b, n, h, dv)), length: vec![0; b] }
    }

    pub(crate) fn to_tensors(&self) -> Tensors<F> {
        [
            ("k".to_string(), self.k.clone().into_dyn()),
            ("length".to_string(), counts(&self.length)),
            ("v".to_string(), self.v.clone().into_dyn()),
        ]
        .into_iter()
        .collect()
    }

    pub(crate) fn from_tensors(mut t: Tensors<F>) -> Result<Self> {
        Ok(KvCache { k: take(&mut t, "k")?, v: take(&mut t, "v")?, length: take_counts(&mut t, "length")? })
    }
}

/// The state of a mixer whose state is rows of past values at a position (docs/math.md
/// §7.1): the Toeplitz mixer's inputs `x [B, Tw, C]` (row `s` the input at position `s`), the
/// GLR's kept outputs or inputs `[B, R, C]` (the window of the last `f(K − 1)` positions, or on
/// the lattice one row per slot), and the position per batch row. A GLR with its pattern on both
/// sides (`on = "both"`) keeps two streams: its outputs in `rows` and its inputs in `inputs`.
#[derive(Clone, Debug, PartialEq)]
pub struct RowState<F> {
    /// The rows `[B, R, C]`: the kept outputs `y` of a GLR on `b` or on both sides, the kept
    /// inputs `x` of a GLR on `a` and of the Toeplitz mixer.
    pub rows: Array3<F>,
    /// A GLR with `on = "both"` only: its kept inputs `x [B, R, C]` (`None` for every other
    /// mixer and side).
    pub inputs: Option<Array3<F>>,
    /// Per batch row, the tokens consumed before the state.
    pub position: Vec<usize>,
}

impl<F: Scalar> RowState<F> {
    /// A state of one stream of rows.
    pub fn new(rows: Array3<F>, position: Vec<usize>) -> Self {
        RowState { rows, inputs: None, position }
    }

    /// The state's tensors: `rows` under `stream.rows`, and `inputs` under `stream.inputs` where the stream
    /// keeps them (an error where they are missing or not taken).
    pub(crate) fn to_tensors(&self, stream: Stream) -> Result<Tensors<F>> {
        let mut t: Tensors<F> = [
            (stream.rows.to_string(), self.rows.clone().into_dyn()),
            (POSITION.to_string(), counts(&self.position)),
        ]
        .into_iter()
        .collect();
        match (&self.inputs, stream.inputs) {
            (Some(x), Some(name)) => {
                t.insert(name.into(), x.clone().into_dyn());
            }
            (None, None) => {}
            (None, Some(_)) => {
                return Err(Error::Decoder(format!(
                    "{}: a state with two streams is expected (`rows`: the kept outputs y, `inputs`: the kept \
                     inputs x [B, R, C]), but `inputs` is None",
                    stream.mixer
                )));
            }
            (Some(_), None) => {
                return Err(Error::Decoder(format!(
                    "{}: a state with one stream (`rows`) is expected, but `inputs` is given (it is only \
                     for a GLR with on = \"both\")",
                    stream.mixer
                )));
            }
        }
        Ok(t)
    }

    pub(crate) fn from_tensors(mut t: Tensors<F>, stream: Stream) -> Result<Self> {
        let inputs = stream.inputs.map(|name| take(&mut t, name)).transpose()?;
        Ok(RowState { rows: take(&mut t, stream.rows)?, inputs, position: take_counts(&mut t, POSITION)? })
    }
}

/// What a [`RowState`] holds for one mixer: the name of its `rows` and, where it keeps
/// `inputs` too, theirs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stream {
    pub mixer: &'static str,
    pub rows: &'static str,
    pub inputs: Option<&'static str>,
}

/// The Toeplitz mixer's stream: its past inputs.
pub(crate) const TOEPLITZ: Stream = Stream { mixer: "toeplitz", rows: "x", inputs: None };

/// The GLR state's streams for `on`: the outputs `y` (`b`), the inputs `x` (`a`), or both.
pub(crate) fn glr_stream(on: &str) -> Result<Stream> {
    let (rows, inputs) = match on {
        "b" => ("y", None),
        "a" => ("x", None),
        "both" => ("y", Some("x")),
        _ => return Err(Error::config("glr", format!("`on` must be \"a\", \"b\" or \"both\", got {on:?}"))),
    };
    Ok(Stream { mixer: "glr", rows, inputs })
}
