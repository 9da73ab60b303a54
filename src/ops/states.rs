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
/// the lattice one row per slot), and the position per batch row.
#[derive(Clone, Debug, PartialEq)]
pub struct RowState<F> {
    /// The rows `[B, R, C]`.
    pub rows: Array3<F>,
    /// Per batch row, the tokens consumed before the state.
    pub position: Vec<usize>,
}

impl<F: Scalar> RowState<F> {
    pub(crate) fn to_tensors(&self, name: &str) -> Tensors<F> {
        [(name.to_string(), self.rows.clone().into_dyn()), (POSITION.to_string(), counts(&self.position))]
            .into_iter()
            .collect()
    }

    pub(crate) fn from_tensors(mut t: Tensors<F>, name: &str) -> Result<Self> {
        Ok(RowState { rows: take(&mut t, name)?, position: take_counts(&mut t, POSITION)? })
    }
}

/// The GLR state's tensor name for `on`.
pub(crate) fn glr_stream(on: &str) -> Result<&'static str> {
    match on {
        "b" => Ok("y"),
        "a" => Ok("x"),
        _ => Err(mixer_core::state::no_state(
            "glr",
            "the typed `glr_state` carries one stream of rows; a GLR with its pattern on both A and B \
             (`on = \"both\"`) keeps two (`x` and `y`): run it from a state through \
             `mixer_registry::state::run_state` with the tensors `x`, `y` and `position`",
        )),
    }
}
