//! The channel-major layout the Toeplitz forms work in: `x [B,T,C]` stored as `B·C` signals
//! of length `T` one after another (`col(b·C + c)[t] = x[b, t, c]`), and back. Both
//! directions are cache-blocked transposes of each batch row, parallel over channel blocks.

use mixer_core::Real;
use mixer_core::parallel::min_len;
use ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;

/// Side of the square tiles of the blocked transpose.
const TILE: usize = 32;

/// `B·C` signals of length `len`, stored one after another.
#[derive(Clone, Debug)]
pub struct Columns<F> {
    /// The signals, `data[i·len .. (i+1)·len]` is signal `i`.
    pub data: Vec<F>,
    /// Length of each signal (`T`).
    pub len: usize,
}

impl<F> Columns<F> {
    /// Signal `i`.
    pub fn col(&self, i: usize) -> &[F] {
        &self.data[i * self.len..(i + 1) * self.len]
    }
}

/// Transposes each of the row-major `[rows, cols]` matrices stacked in `src` into `dst`
/// (`[cols, rows]` each), tile by tile, parallel over blocks of `TILE` output rows.
fn transpose_batched<F: Real>(src: &[F], dst: &mut [F], rows: usize, cols: usize) {
    if rows == 0 || cols == 0 {
        return;
    }
    dst.par_chunks_mut(TILE * rows).with_min_len(min_len()).enumerate().for_each(|(blk, out)| {
        // `out` holds output rows [blk·TILE, …) of the stacked [nb·cols, rows] result.
        let first = blk * TILE;
        let nrows_out = out.len() / rows;
        let mut r = 0;
        while r < nrows_out {
            let g = first + r; // global output row = b·cols + j
            let (b, j0) = (g / cols, g % cols);
            let span = (cols - j0).min(nrows_out - r); // rows of this batch in the block
            let base = b * rows * cols;
            for i0 in (0..rows).step_by(TILE) {
                let i1 = (i0 + TILE).min(rows);
                for dj in 0..span {
                    let o = &mut out[(r + dj) * rows..(r + dj + 1) * rows];
                    for i in i0..i1 {
                        o[i] = src[base + i * cols + j0 + dj];
                    }
                }
            }
            r += span;
        }
    });
}

/// `x [B,T,C]` as channel-major columns.
pub fn columns<F: Real>(x: &ArrayD<F>) -> Columns<F> {
    let (nb, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let x = x.as_standard_layout();
    let flat = x.as_slice().unwrap_or(&[]);
    let mut data = vec![F::zero(); nb * t * c];
    transpose_batched(flat, &mut data, t, c);
    Columns { data, len: t }
}

/// The inverse of [`columns`]: `y [B,T,C]`.
pub fn from_columns<F: Real>(cols: &Columns<F>, nb: usize, c: usize) -> ArrayD<F> {
    let t = cols.len;
    let mut flat = vec![F::zero(); nb * t * c];
    transpose_batched(&cols.data, &mut flat, c, t);
    ArrayD::from_shape_vec(IxDyn(&[nb, t, c]), flat).unwrap_or_else(|_| ArrayD::zeros(IxDyn(&[nb, t, c])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_layout_at_awkward_sizes() {
        for (nb, t, c) in [(1, 1, 1), (2, 37, 5), (3, 70, 33), (1, 5, 100), (2, 0, 3)] {
            let x = ArrayD::from_shape_fn(IxDyn(&[nb, t, c]), |i| (i[0] * 10000 + i[1] * 100 + i[2]) as f64);
            let cols = columns(&x);
            for b in 0..nb {
                for e in 0..c {
                    for s in 0..t {
                        assert_eq!(cols.col(b * c + e)[s], x[[b, s, e]]);
                    }
                }
            }
            assert_eq!(from_columns(&cols, nb, c), x);
        }
    }
}
