//! The materialization `Y = (I − B)⁻¹ A X` of a causal linear mixer, per group.
//!
//! The mixed input `X` (e.g. `x [B,T,C]` or `v [B,T,H,Dv]`) is viewed as `[B, T, M]` with the
//! trailing axes flattened. A [`Block`] produces the output columns `out_cols` of batch row
//! `batch` as `(I−B)⁻¹Σ_j A_j X[batch, :, cols_j]`. A plain mixer has one
//! term per block (per head or per channel); the Toeplitz kernel variant has one per shift.
//!
//! An affine mixer (e.g. the Toeplitz mixer's position bias, docs/math.md §3) adds an [`Offset`]
//! `D` that does not depend on `X`: `Y = (I − B)⁻¹ A X + D`.

use std::ops::Range;
use std::sync::Arc;

use ndarray::Array2;

/// One product `A_j X[batch, :, cols]`.
#[derive(Clone, Debug)]
pub struct Term {
    /// Lower-triangular `T×T` direct-influence matrix.
    pub a: Arc<Array2<f64>>,
    /// Columns of the flattened mixed input it multiplies.
    pub cols: Range<usize>,
}

/// One group's output: `Y[batch, :, out_cols] = (I − B)⁻¹ Σ_j A_j X[batch, :, cols_j]`.
#[derive(Clone, Debug)]
pub struct Block {
    /// Batch row.
    pub batch: usize,
    /// Output columns (flattened trailing axes).
    pub out_cols: Range<usize>,
    /// The `A` terms.
    pub terms: Vec<Term>,
    /// Optional strictly-lower `T×T` recurrence matrix.
    pub b: Option<Arc<Array2<f64>>>,
}

/// An additive output term independent of the mixed input:
/// `Y[batch, :, out_cols] += values` (`values` is `T × |out_cols|`), added after the solve.
#[derive(Clone, Debug)]
pub struct Offset {
    /// Batch row.
    pub batch: usize,
    /// Output columns (flattened trailing axes).
    pub out_cols: Range<usize>,
    /// `T × |out_cols|` values.
    pub values: Arc<Array2<f64>>,
}

/// A mixer's full materialization for one set of inputs.
#[derive(Clone, Debug, Default)]
pub struct Materialization {
    /// Sequence length `T`.
    pub seq: usize,
    /// The blocks; together they cover every output column of every batch row once.
    pub blocks: Vec<Block>,
    /// Additive terms `D` of an affine mixer (empty for a linear one).
    pub offsets: Vec<Offset>,
}

impl Materialization {
    /// An empty materialization for length `seq`.
    pub fn new(seq: usize) -> Self {
        Materialization { seq, blocks: Vec::new(), offsets: Vec::new() }
    }
    /// Adds a single-term block.
    pub fn push(
        &mut self,
        batch: usize,
        cols: Range<usize>,
        a: Arc<Array2<f64>>,
        b: Option<Arc<Array2<f64>>>,
    ) {
        self.blocks.push(Block { batch, out_cols: cols.clone(), terms: vec![Term { a, cols }], b });
    }
}
