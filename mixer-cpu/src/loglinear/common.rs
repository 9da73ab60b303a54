//! Per-(batch, head) views of the log-linear family's inputs, and the masked decay factors.

use faer::Mat;
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::tensor::get;
use mixer_core::{Error, Real, Result, Tensors};
use ndarray::{ArrayD, ArrayView3, ArrayView4, Ix3, Ix4};

/// One (batch, head) slice of the inputs, as contiguous matrices.
pub struct Head<F: Real> {
    /// Batch row.
    pub b: usize,
    /// Head.
    pub h: usize,
    /// Queries `T×Dk`.
    pub q: Mat<F>,
    /// Keys `T×Dk`.
    pub k: Mat<F>,
    /// Values `T×Dv`.
    pub v: Mat<F>,
    /// Log-decays in `f64` (zeros for linear attention).
    pub g: Vec<f64>,
    /// Delta-rule strengths (ones unless gated DeltaNet).
    pub beta: Vec<F>,
    /// λ weights (after the λ scheme), `T×L`; `None` for the base mixers.
    pub lam: Option<Mat<F>>,
}

fn view4<'a, F: Real>(x: &'a Tensors<F>, name: &str) -> Result<ArrayView4<'a, F>> {
    get(x, name)?
        .view()
        .into_dimensionality::<Ix4>()
        .map_err(|e| Error::shape(name, "rank 4 [B, T, H, ·]", e.to_string()))
}

fn view3<'a, F: Real>(x: &'a Tensors<F>, name: &str) -> Result<ArrayView3<'a, F>> {
    get(x, name)?
        .view()
        .into_dimensionality::<Ix3>()
        .map_err(|e| Error::shape(name, "rank 3 [B, T, H]", e.to_string()))
}

/// Sizes of a call.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Batch.
    pub b: usize,
    /// Sequence length.
    pub t: usize,
    /// Heads.
    pub h: usize,
    /// Key dim.
    pub dk: usize,
    /// Value dim.
    pub dv: usize,
}

/// Splits the (validated) inputs into per-(batch, head) matrices, applying the λ scheme.
pub fn heads<F: Real>(m: &LogLinear, x: &Tensors<F>) -> Result<(Sizes, Vec<Head<F>>)> {
    let q = view4(x, "q")?;
    let k = view4(x, "k")?;
    let v = view4(x, "v")?;
    let (nb, t_len, nh, dk) = q.dim();
    let dv = v.dim().3;
    if k.dim() != q.dim() || v.dim().0 != nb || v.dim().1 != t_len || v.dim().2 != nh {
        return Err(Error::shape(
            "k/v",
            format!("k {:?}, v [{nb}, {t_len}, {nh}, Dv]", q.dim()),
            format!("k {:?}, v {:?}", k.dim(), v.dim()),
        ));
    }
    let g = if m.base.has_decay() { Some(view3(x, "g")?) } else { None };
    let beta = if m.base.has_beta() { Some(view3(x, "beta")?) } else { None };
    let lam_all: Option<ArrayD<F>> = match m.lift {
        Some(_) => Some(m.lambda_weights(get(x, "lambda")?)?),
        None => None,
    };
    let lam4 = match &lam_all {
        Some(l) => Some(
            l.view()
                .into_dimensionality::<Ix4>()
                .map_err(|e| Error::shape("lambda", "rank 4 [B, T, H, L]", e.to_string()))?,
        ),
        None => None,
    };
    let mut out = Vec::with_capacity(nb * nh);
    for b in 0..nb {
        for h in 0..nh {
            let q = Mat::from_fn(t_len, dk, |t, d| q[[b, t, h, d]]);
            let k = Mat::from_fn(t_len, dk, |t, d| k[[b, t, h, d]]);
            let v = Mat::from_fn(t_len, dv, |t, d| v[[b, t, h, d]]);
            let g = (0..t_len).map(|t| g.as_ref().map_or(0.0, |g| g[[b, t, h]].f64())).collect();
            let beta = (0..t_len).map(|t| beta.as_ref().map_or(F::one(), |x| x[[b, t, h]])).collect();
            let lam = lam4.as_ref().map(|l| Mat::from_fn(t_len, l.dim().3, |t, e| l[[b, t, h, e]]));
            out.push(Head { b, h, q, k, v, g, beta, lam });
        }
    }
    Ok((Sizes { b: nb, t: t_len, h: nh, dk, dv }, out))
}

/// Assembles per-head outputs `T×Dv` into `y [B, T, H, Dv]`.
pub fn assemble<F: Real>(s: Sizes, heads: &[Head<F>], ys: Vec<Mat<F>>) -> ArrayD<F> {
    let mut y = ndarray::Array4::<F>::zeros((s.b, s.t, s.h, s.dv));
    for (hd, yh) in heads.iter().zip(ys) {
        for t in 0..s.t {
            for d in 0..s.dv {
                y[[hd.b, t, hd.h, d]] = yh[(t, d)];
            }
        }
    }
    y.into_dyn()
}

/// Masked decay factors $M^S_{t,s} = e^{G_t - G_s}$ for rows `t ∈ [r0, r1)` and columns
/// `s ∈ [0, r1)` (zero for `s > t`), as an `(r1−r0) × r1` matrix.
///
/// The exponent $\sum_{r=s+1}^{t} g_r$ is never formed as a difference of global cumulative
/// sums: for `s < r0` it is `pre_t + suf_s` with `pre_t = Σ_{r0 ≤ r ≤ t} g_r` and
/// `suf_s = Σ_{s < r < r0} g_r` (both sums of non-positive terms, no cancellation), and
/// inside the tile it is a difference of tile-local sums. Exponentials are only taken of
/// masked (non-positive) exponents, so nothing overflows for any `g ≤ 0`.
pub fn decay_tile<F: Real>(g: &[f64], r0: usize, r1: usize) -> Mat<F> {
    let rows = r1 - r0;
    let mut pre = vec![0.0f64; rows];
    let mut acc = 0.0f64;
    for i in 0..rows {
        acc += g[r0 + i];
        pre[i] = acc;
    }
    let mut suf_exp = vec![0.0f64; r0];
    let mut acc = 0.0f64;
    for s in (0..r0).rev() {
        suf_exp[s] = acc.exp();
        acc += g[s];
    }
    let mut m = Mat::<F>::zeros(rows, r1);
    for i in 0..rows {
        let ep = pre[i].exp();
        for s in 0..r0 {
            m[(i, s)] = F::of(ep * suf_exp[s]);
        }
        for j in 0..=i {
            m[(i, r0 + j)] = F::of((pre[i] - pre[j]).exp());
        }
    }
    m
}
