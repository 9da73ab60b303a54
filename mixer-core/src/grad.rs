//! Vector–Jacobian products (gradients) of the materialization, in `f64`: the reference
//! backward pass every fast backward is checked against.
//!
//! For one block, with `R = Σ_j A_j X_j`, `Y = (I − B)⁻¹ R + D` and an output cotangent
//! `Ȳ`, the cotangent of `R` is `R̄ = (I − B)^(−ᵀ) Ȳ` (one unit-upper
//! triangular solve), and
//! `X̄_j += A_jᵀ R̄,
//!  Ā_j = R̄ X_jᵀ,
//!  B̄ = R̄ (Y − D)ᵀ, D̄ = Ȳ .`
//! Only the lower triangle of `Ā_j` and the strictly lower triangle of `B̄` are
//! meaningful (the entries a mixer can move); the rest is set to zero. Each mixer then maps
//! these entry gradients back to its own inputs ([`Mixer::materialized_vjp`]).
//!
//! Gradients are keyed `d_<input>` ([`grad_name`]); a [`Requires`] set selects which ones
//! are wanted.

use std::collections::BTreeSet;

use faer::{Mat, Par};
use ndarray::{Array2, ArrayD, Axis, Ix3};
use rayon::prelude::*;

use crate::error::{Error, Result, fmt_shape};
use crate::materialize::{Block, Materialization};
use crate::mixer::Mixer;
use crate::tensor::{Tensors, get};

/// The name of the gradient of input `name`: `d_<name>`.
pub fn grad_name(name: &str) -> String {
    format!("d_{name}")
}

/// The name under which a backward may be given the forward's output for the same inputs: `y`,
/// of the mixed input's shape, as the forward returned it (in the same precision mode). A backward
/// that reads `y` (the GLR's `β̄_{t,k} = g_t y_{d_k(t)}`) takes it in place of running the forward
/// again; the others ignore it. It has no gradient. Not recognised for a mixer with an input of
/// that name.
pub const SAVED_OUTPUT: &str = "y";

/// The name under which a device backward may be given, beside [`SAVED_OUTPUT`], what the
/// forward saved for it (a backend's own record, from a forward run for a backward: on CUDA,
/// attention's per-row softmax statistics, `mixer_cuda::run_device_saving`): with both, the
/// backward skips the forward it would otherwise run again. Only backends that save something
/// accept it; it has no gradient.
pub const SAVED_STATISTICS: &str = "y_stats";

/// The forward's output among a backward's `inputs` ([`SAVED_OUTPUT`]), when it is given and `m`
/// has no input of that name.
pub fn saved_output<'a, F>(m: &dyn Mixer, inputs: &'a Tensors<F>) -> Option<&'a ArrayD<F>> {
    let y = inputs.get(SAVED_OUTPUT)?;
    takes_saved_output(m).then_some(y)
}

/// Whether a backward of `m` recognises [`SAVED_OUTPUT`] (`m` has no input of that name).
pub fn takes_saved_output(m: &dyn Mixer) -> bool {
    !m.spec().inputs.iter().any(|d| d.name == SAVED_OUTPUT)
}

/// Whether the entry `name` of a backward's inputs is the forward's output ([`SAVED_OUTPUT`],
/// which has no gradient) rather than an input of `m`.
pub fn is_saved_output(m: &dyn Mixer, name: &str) -> bool {
    name == SAVED_OUTPUT && takes_saved_output(m)
}

/// Which input gradients a backward pass must produce.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Requires {
    /// Every input that was given.
    #[default]
    All,
    /// Only these inputs (by input name, e.g. `"q"`, `"lambda"`).
    Only(BTreeSet<String>),
}

impl Requires {
    /// A set from input names.
    pub fn only<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Self {
        Requires::Only(names.into_iter().map(Into::into).collect())
    }
    /// Whether the gradient of input `name` is wanted.
    pub fn wants(&self, name: &str) -> bool {
        match self {
            Requires::All => true,
            Requires::Only(s) => s.contains(name),
        }
    }
}

/// Gradients with respect to one block's entries.
#[derive(Clone, Debug)]
pub struct BlockGrad {
    /// `Ā_j` per term (`T×T`, zero above the diagonal).
    pub terms: Vec<Array2<f64>>,
    /// `B̄` (`T×T`, zero on and above the diagonal), when the block has a `B`.
    pub b: Option<Array2<f64>>,
}

/// Gradients with respect to every entry of a [`Materialization`].
#[derive(Clone, Debug)]
pub struct MatGrad {
    /// One per block, in the materialization's order.
    pub blocks: Vec<BlockGrad>,
    /// `D̄` per offset (`T × |out_cols|`), in the materialization's order.
    pub offsets: Vec<Array2<f64>>,
}

fn as3(x: &ArrayD<f64>, name: &str) -> Result<ndarray::Array3<f64>> {
    let s = x.shape();
    if s.len() < 2 {
        return Err(Error::shape(name, "rank ≥ 2 [B, T, …]", fmt_shape(s)));
    }
    let m: usize = s[2..].iter().product();
    x.as_standard_layout()
        .to_shape((s[0], s[1], m))
        .map(|v| v.to_owned())
        .map_err(|e| Error::Numerical(format!("reshape: {e}")))
        .and_then(|a| a.into_dimensionality::<Ix3>().map_err(|e| Error::Numerical(e.to_string())))
}

fn cols(x: &ndarray::Array3<f64>, batch: usize, c: &std::ops::Range<usize>, t: usize) -> Mat<f64> {
    Mat::<f64>::from_fn(t, c.len(), |i, j| x[[batch, i, c.start + j]])
}

fn dense(a: &Array2<f64>) -> Mat<f64> {
    Mat::<f64>::from_fn(a.nrows(), a.ncols(), |i, j| a[[i, j]])
}

/// One block: returns `(dX contributions per term, the block's entry gradients)`.
fn block_vjp(
    blk: &Block,
    x: &ndarray::Array3<f64>,
    dy: &ndarray::Array3<f64>,
    t: usize,
) -> Result<(Vec<Mat<f64>>, BlockGrad)> {
    use faer::linalg::matmul::matmul;
    let w = blk.out_cols.len();
    let mut r = Mat::<f64>::zeros(t, w);
    let xs: Vec<Mat<f64>> = blk.terms.iter().map(|term| cols(x, blk.batch, &term.cols, t)).collect();
    for (term, xj) in blk.terms.iter().zip(&xs) {
        if term.cols.len() != w || term.a.dim() != (t, t) {
            return Err(Error::Numerical(format!(
                "materialization block: term of {} columns and A {:?} for output of {w} columns, T = {t}",
                term.cols.len(),
                term.a.dim()
            )));
        }
        matmul(r.as_mut(), faer::Accum::Add, dense(&term.a).as_ref(), xj.as_ref(), 1.0, Par::Seq);
    }
    let mut dr = cols(dy, blk.batch, &blk.out_cols, t);
    let mut db = None;
    if let Some(b) = &blk.b {
        let l = Mat::<f64>::from_fn(t, t, |i, j| if j < i { -b[[i, j]] } else { 0.0 });
        // Y = (I − B)⁻¹ R (without the offset): B multiplies it.
        faer::linalg::triangular_solve::solve_unit_lower_triangular_in_place(
            l.as_ref(),
            r.as_mut(),
            Par::Seq,
        );
        // R̄ = (I − B)⁻ᵀ Ȳ.
        faer::linalg::triangular_solve::solve_unit_upper_triangular_in_place(
            l.transpose(),
            dr.as_mut(),
            Par::Seq,
        );
        let mut g = Mat::<f64>::zeros(t, t);
        matmul(g.as_mut(), faer::Accum::Replace, dr.as_ref(), r.transpose(), 1.0, Par::Seq);
        db = Some(Array2::from_shape_fn((t, t), |(i, j)| if j < i { g[(i, j)] } else { 0.0 }));
    }
    let mut dxs = Vec::with_capacity(blk.terms.len());
    let mut das = Vec::with_capacity(blk.terms.len());
    for (term, xj) in blk.terms.iter().zip(&xs) {
        let a = dense(&term.a);
        let mut dx = Mat::<f64>::zeros(t, w);
        matmul(dx.as_mut(), faer::Accum::Replace, a.transpose(), dr.as_ref(), 1.0, Par::Seq);
        dxs.push(dx);
        let mut g = Mat::<f64>::zeros(t, t);
        matmul(g.as_mut(), faer::Accum::Replace, dr.as_ref(), xj.transpose(), 1.0, Par::Seq);
        das.push(Array2::from_shape_fn((t, t), |(i, j)| if j <= i { g[(i, j)] } else { 0.0 }));
    }
    Ok((dxs, BlockGrad { terms: das, b: db }))
}

/// The VJP of the materialization: given the mixed input `x` and the output cotangent `dy`
/// (shape of `x`), returns `X̄` (shape of `x`) and the gradients of every entry.
pub fn vjp(mat: &Materialization, x: &ArrayD<f64>, dy: &ArrayD<f64>) -> Result<(ArrayD<f64>, MatGrad)> {
    if dy.shape() != x.shape() {
        return Err(Error::shape(
            "dy",
            format!("{} (the shape of y)", fmt_shape(x.shape())),
            fmt_shape(dy.shape()),
        ));
    }
    let x3 = as3(x, "mixed input")?;
    let dy3 = as3(dy, "dy")?;
    let t = x3.shape()[1];
    if t != mat.seq {
        return Err(Error::shape("mixed input", format!("T = {}", mat.seq), fmt_shape(x.shape())));
    }
    let parts: Vec<(Vec<Mat<f64>>, BlockGrad)> =
        mat.blocks.par_iter().map(|b| block_vjp(b, &x3, &dy3, t)).collect::<Result<_>>()?;
    let mut dx3 = ndarray::Array3::<f64>::zeros(x3.raw_dim());
    let mut blocks = Vec::with_capacity(parts.len());
    for (blk, (dxs, bg)) in mat.blocks.iter().zip(parts) {
        let mut dxb = dx3.index_axis_mut(Axis(0), blk.batch);
        for (term, dx) in blk.terms.iter().zip(&dxs) {
            for i in 0..t {
                for (j, c) in term.cols.clone().enumerate() {
                    dxb[[i, c]] += dx[(i, j)];
                }
            }
        }
        blocks.push(bg);
    }
    let mut offsets = Vec::with_capacity(mat.offsets.len());
    for off in &mat.offsets {
        if off.batch >= dy3.shape()[0] || off.out_cols.end > dy3.shape()[2] {
            return Err(Error::Numerical(format!(
                "materialization offset: batch {} columns {:?} for output {}",
                off.batch,
                off.out_cols,
                fmt_shape(dy.shape())
            )));
        }
        offsets.push(Array2::from_shape_fn((t, off.out_cols.len()), |(i, j)| {
            dy3[[off.batch, i, off.out_cols.start + j]]
        }));
    }
    let dx = dx3.into_shape_with_order(x.raw_dim()).map_err(|e| Error::Numerical(format!("reshape: {e}")))?;
    Ok((dx, MatGrad { blocks, offsets }))
}

/// The materialized backward of any mixer that maps entry gradients to its inputs: the
/// gradients `d_<input>` of every given input selected by `requires`, in `f64`.
pub fn materialized_backward(
    m: &dyn Mixer,
    inputs: &Tensors<f64>,
    dy: &ArrayD<f64>,
    requires: &Requires,
) -> Result<Tensors<f64>> {
    let spec = m.spec();
    let mat = m.materialize(inputs)?;
    let x = get(inputs, spec.mixed)?;
    let (dx, grad) = vjp(&mat, x, dy)?;
    let mut out = m.materialized_vjp(inputs, &mat, &grad, requires)?;
    out.insert(grad_name(spec.mixed), dx);
    out.retain(|k, _| k.strip_prefix("d_").is_some_and(|n| requires.wants(n) && inputs.contains_key(n)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, Array3};
    use std::sync::Arc;

    /// Entry gradients of a dense block against central differences of ⟨Ȳ, Y⟩.
    #[test]
    fn vjp_matches_finite_differences_of_the_solve() {
        let t = 7;
        let a = Array2::from_shape_fn((t, t), |(i, j)| {
            if j <= i { ((i * 5 + j * 3) % 7) as f64 / 7.0 - 0.4 } else { 0.0 }
        });
        let b =
            Array2::from_shape_fn((t, t), |(i, j)| if j < i { 0.25 / (1.0 + (i - j) as f64) } else { 0.0 });
        let x = Array3::from_shape_fn((1, t, 2), |(_, i, c)| ((3 * i + 5 * c) % 11) as f64 / 5.0 - 1.0)
            .into_dyn();
        let dy =
            Array3::from_shape_fn((1, t, 2), |(_, i, c)| ((7 * i + c) % 5) as f64 / 3.0 - 0.6).into_dyn();
        let mk = |a: &Array2<f64>, b: &Array2<f64>| {
            let mut m = Materialization::new(t);
            m.push(0, 0..2, Arc::new(a.clone()), Some(Arc::new(b.clone())));
            m
        };
        let f = |a: &Array2<f64>, b: &Array2<f64>, x: &ArrayD<f64>| {
            let y = crate::oracle::solve(&mk(a, b), x).unwrap();
            (&y * &dy).sum()
        };
        let (dx, g) = vjp(&mk(&a, &b), &x, &dy).unwrap();
        let h = 1e-6;
        for (i, j) in [(3, 1), (6, 0), (4, 4), (5, 2)] {
            let (mut ap, mut am) = (a.clone(), a.clone());
            ap[[i, j]] += h;
            am[[i, j]] -= h;
            let fd = (f(&ap, &b, &x) - f(&am, &b, &x)) / (2.0 * h);
            assert!((fd - g.blocks[0].terms[0][[i, j]]).abs() < 1e-7, "dA[{i},{j}]");
            if j < i {
                let (mut bp, mut bm) = (b.clone(), b.clone());
                bp[[i, j]] += h;
                bm[[i, j]] -= h;
                let fd = (f(&a, &bp, &x) - f(&a, &bm, &x)) / (2.0 * h);
                assert!((fd - g.blocks[0].b.as_ref().unwrap()[[i, j]]).abs() < 1e-7, "dB[{i},{j}]");
            }
        }
        for (i, c) in [(0, 0), (3, 1), (6, 1)] {
            let (mut xp, mut xm) = (x.clone(), x.clone());
            xp[[0, i, c]] += h;
            xm[[0, i, c]] -= h;
            let fd = (f(&a, &b, &xp) - f(&a, &b, &xm)) / (2.0 * h);
            assert!((fd - dx[[0, i, c]]).abs() < 1e-7, "dX[{i},{c}]");
        }
        assert_eq!(g.blocks[0].terms[0][[1, 3]], 0.0);
        assert!(vjp(&mk(&a, &b), &x, &dy.slice(ndarray::s![.., ..3, ..]).to_owned().into_dyn()).is_err());
    }
}
