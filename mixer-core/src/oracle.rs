//! The generic dense oracle: `Y = (I−B)⁻¹ A X` in `f64`, via faer's unit-lower-triangular
//! solve. Every fast form, backend and plugin is checked against it.

use faer::{Mat, Par};
use ndarray::{ArrayD, Axis, Ix3};
use rayon::prelude::*;

use crate::error::{Error, Result, fmt_shape};
use crate::materialize::{Block, Materialization};
use crate::mixer::Mixer;
use crate::tensor::{Tensors, get};

/// Views `x` as `[B, T, M]` (trailing axes flattened).
fn as3(x: &ArrayD<f64>) -> Result<ndarray::Array3<f64>> {
    let s = x.shape();
    if s.len() < 2 {
        return Err(Error::shape("mixed input", "rank ≥ 2 [B, T, …]", fmt_shape(s)));
    }
    let m: usize = s[2..].iter().product();
    x.to_shape((s[0], s[1], m))
        .map(|v| v.to_owned())
        .map_err(|e| Error::Numerical(format!("reshape: {e}")))
        .and_then(|a| a.into_dimensionality::<Ix3>().map_err(|e| Error::Numerical(e.to_string())))
}

fn solve_block(blk: &Block, x: &ndarray::Array3<f64>, t_len: usize) -> Result<Mat<f64>> {
    let width = blk.out_cols.len();
    let mut r = Mat::<f64>::zeros(t_len, width);
    for term in &blk.terms {
        if term.cols.len() != width || term.a.dim() != (t_len, t_len) {
            return Err(Error::Numerical(format!(
                "materialization block: term of {} columns and A {:?} for output of {width} columns, T = {t_len}",
                term.cols.len(),
                term.a.dim()
            )));
        }
        let a = Mat::<f64>::from_fn(t_len, t_len, |i, j| term.a[[i, j]]);
        let xs = Mat::<f64>::from_fn(t_len, width, |i, j| x[[blk.batch, i, term.cols.start + j]]);
        faer::linalg::matmul::matmul(r.as_mut(), faer::Accum::Add, a.as_ref(), xs.as_ref(), 1.0, Par::Seq);
    }
    if let Some(b) = &blk.b {
        // (I − B) Y = R; faer's unit-lower solve reads only the strictly-lower part.
        let l = Mat::<f64>::from_fn(t_len, t_len, |i, j| if j < i { -b[[i, j]] } else { 0.0 });
        faer::linalg::triangular_solve::solve_unit_lower_triangular_in_place(
            l.as_ref(),
            r.as_mut(),
            Par::Seq,
        );
    }
    Ok(r)
}

/// The dense `f64` output of `m` on `inputs`: its materialization solved against its mixed
/// input ([`crate::spec::InputSpec::mixed`]), `Y = (I−B)⁻¹ A X`.
pub fn dense(m: &dyn Mixer, inputs: &Tensors<f64>) -> Result<ArrayD<f64>> {
    solve(&m.materialize(inputs)?, get(inputs, m.spec().mixed)?)
}

/// Solves the materialization against the mixed input `x` (shape `[B, T, …]`); the output has
/// the shape of `x`.
pub fn solve(mat: &Materialization, x: &ArrayD<f64>) -> Result<ArrayD<f64>> {
    let x3 = as3(x)?;
    let t_len = x3.shape()[1];
    if t_len != mat.seq {
        return Err(Error::shape("mixed input", format!("T = {}", mat.seq), fmt_shape(x.shape())));
    }
    let solved: Vec<Mat<f64>> =
        mat.blocks.par_iter().map(|b| solve_block(b, &x3, t_len)).collect::<Result<_>>()?;
    let mut y3 = ndarray::Array3::<f64>::zeros(x3.raw_dim());
    for (blk, r) in mat.blocks.iter().zip(&solved) {
        let mut yb = y3.index_axis_mut(Axis(0), blk.batch);
        for i in 0..t_len {
            for (j, c) in blk.out_cols.clone().enumerate() {
                yb[[i, c]] = r[(i, j)];
            }
        }
    }
    add_offsets(mat, &mut y3)?;
    y3.into_shape_with_order(x.raw_dim()).map_err(|e| Error::Numerical(format!("reshape: {e}")))
}

/// Adds the materialization's additive terms `D` to `y3` (`[B, T, M]`).
fn add_offsets(mat: &Materialization, y3: &mut ndarray::Array3<f64>) -> Result<()> {
    let (nb, t_len, m) = y3.dim();
    for off in &mat.offsets {
        if off.batch >= nb || off.out_cols.end > m || off.values.dim() != (t_len, off.out_cols.len()) {
            return Err(Error::Numerical(format!(
                "materialization offset: batch {} columns {:?} values {:?} for output [{nb}, {t_len}, {m}]",
                off.batch,
                off.out_cols,
                off.values.dim()
            )));
        }
        let mut yb = y3.index_axis_mut(Axis(0), off.batch);
        for i in 0..t_len {
            for (j, c) in off.out_cols.clone().enumerate() {
                yb[[i, c]] += off.values[[i, j]];
            }
        }
    }
    Ok(())
}

/// The same oracle through a system LAPACK (`dtrsm` via ndarray-linalg), for cross-checking
/// faer. Only with the `lapack` feature.
#[cfg(feature = "lapack")]
pub fn solve_lapack(mat: &Materialization, x: &ArrayD<f64>) -> Result<ArrayD<f64>> {
    use ndarray::{Array2, s};
    use ndarray_linalg::{Diag, SolveTriangular, UPLO};
    let x3 = as3(x)?;
    let t_len = x3.shape()[1];
    let mut y3 = ndarray::Array3::<f64>::zeros(x3.raw_dim());
    for blk in &mat.blocks {
        let mut r = Array2::<f64>::zeros((t_len, blk.out_cols.len()));
        for term in &blk.terms {
            r += &term.a.dot(&x3.slice(s![blk.batch, .., term.cols.clone()]));
        }
        if let Some(b) = &blk.b {
            let mut l = b.mapv(|v| -v);
            for i in 0..t_len {
                l[[i, i]] = 1.0;
                for j in i + 1..t_len {
                    l[[i, j]] = 0.0;
                }
            }
            r = l
                .solve_triangular(UPLO::Lower, Diag::Unit, &r)
                .map_err(|e| Error::Numerical(format!("LAPACK triangular solve: {e}")))?;
        }
        y3.slice_mut(s![blk.batch, .., blk.out_cols.clone()]).assign(&r);
    }
    add_offsets(mat, &mut y3)?;
    y3.into_shape_with_order(x.raw_dim()).map_err(|e| Error::Numerical(format!("reshape: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, Array3};
    use std::sync::Arc;

    /// A scalar recurrence y_t = a x_t + b y_{t−1}, solved by hand, against the oracle.
    #[test]
    fn first_order_recurrence_matches_loop() {
        let t = 9;
        let (ca, cb) = (0.7, -0.4);
        let a = Array2::from_shape_fn((t, t), |(i, j)| if i == j { ca } else { 0.0 });
        let b = Array2::from_shape_fn((t, t), |(i, j)| if j + 1 == i { cb } else { 0.0 });
        let x =
            Array3::from_shape_fn((1, t, 2), |(_, i, c)| (i as f64 + 1.0) * if c == 0 { 1.0 } else { -0.5 });
        let mut m = Materialization::new(t);
        m.push(0, 0..2, Arc::new(a), Some(Arc::new(b)));
        let y = solve(&m, &x.clone().into_dyn()).unwrap();
        for c in 0..2 {
            let mut prev = 0.0;
            for i in 0..t {
                let want = ca * x[[0, i, c]] + cb * prev;
                assert!((y[[0, i, c]] - want).abs() < 1e-12);
                prev = want;
            }
        }
    }

    /// An additive offset lands after the solve, on its own columns only.
    #[test]
    fn offsets_are_added_after_the_solve() {
        let t = 4;
        let a = Array2::from_shape_fn((t, t), |(i, j)| if i == j { 2.0 } else { 0.0 });
        let b = Array2::from_shape_fn((t, t), |(i, j)| if j + 1 == i { 0.5 } else { 0.0 });
        let x = Array3::from_shape_fn((1, t, 2), |(_, i, c)| (i + c) as f64).into_dyn();
        let mut m = Materialization::new(t);
        m.push(0, 0..2, Arc::new(a), Some(Arc::new(b)));
        let y0 = solve(&m, &x).unwrap();
        let d = Array2::from_shape_fn((t, 1), |(i, _)| 10.0 * i as f64 + 1.0);
        m.offsets.push(crate::materialize::Offset { batch: 0, out_cols: 1..2, values: Arc::new(d) });
        let y1 = solve(&m, &x).unwrap();
        for i in 0..t {
            assert_eq!(y1[[0, i, 0]], y0[[0, i, 0]]);
            assert!((y1[[0, i, 1]] - y0[[0, i, 1]] - (10.0 * i as f64 + 1.0)).abs() < 1e-12);
        }
        m.offsets[0].out_cols = 1..3;
        assert!(solve(&m, &x).is_err());
    }

    #[cfg(feature = "lapack")]
    #[test]
    fn lapack_oracle_agrees_with_faer() {
        let t = 37;
        let a =
            Array2::from_shape_fn(
                (t, t),
                |(i, j)| if j <= i { ((i * 7 + j * 3) % 11) as f64 / 11.0 } else { 0.0 },
            );
        let b =
            Array2::from_shape_fn((t, t), |(i, j)| if j < i { 0.3 / (1.0 + (i - j) as f64) } else { 0.0 });
        let x =
            Array3::from_shape_fn((2, t, 3), |(b, i, c)| ((b + 2 * i + 5 * c) % 7) as f64 - 3.0).into_dyn();
        let mut m = Materialization::new(t);
        m.push(0, 0..3, Arc::new(a.clone()), Some(Arc::new(b.clone())));
        m.push(1, 0..3, Arc::new(a), Some(Arc::new(b)));
        let y1 = solve(&m, &x).unwrap();
        let y2 = solve_lapack(&m, &x).unwrap();
        let c = crate::tolerance::Tolerance::F64.compare(y1.view(), y2.view());
        assert!(c.pass, "{c:?}");
    }
}
