//! The non-mixer pieces of the model, forward and backward, on row-major `[rows, features]`
//! matrices in `f64`: linear maps, RMSNorm, GELU, the gate maps (sigmoid, softplus), a
//! per-head L2 normalisation, and softmax cross-entropy. Each backward is checked against
//! central finite differences in the tests below.

use ndarray::{Array1, Array2, ArrayView2, Axis, Zip};

/// RMSNorm's `ε`.
pub const NORM_EPS: f64 = 1e-6;

/// `x · w` (`[n, a] · [a, b]`).
pub fn linear(x: ArrayView2<f64>, w: ArrayView2<f64>) -> Array2<f64> {
    x.dot(&w)
}

/// Backward of [`linear`]: `(dx, dw) = (dy · wᵀ, xᵀ · dy)`.
pub fn linear_back(
    x: ArrayView2<f64>,
    w: ArrayView2<f64>,
    dy: ArrayView2<f64>,
) -> (Array2<f64>, Array2<f64>) {
    (dy.dot(&w.t()), x.t().dot(&dy))
}

/// Adds a bias `[b]` to every row.
pub fn add_bias(y: &mut Array2<f64>, b: &Array1<f64>) {
    *y += b;
}

/// Backward of [`add_bias`]: the column sums of `dy`.
pub fn bias_back(dy: ArrayView2<f64>) -> Array1<f64> {
    dy.sum_axis(Axis(0))
}

/// RMSNorm of every row with gain `g`: `y = g ⊙ x / rms(x)`; returns `y` and `1/rms` per row.
pub fn rmsnorm(x: ArrayView2<f64>, g: &Array1<f64>) -> (Array2<f64>, Array1<f64>) {
    let d = x.ncols() as f64;
    let r: Array1<f64> =
        x.rows().into_iter().map(|row| 1.0 / (row.dot(&row) / d + NORM_EPS).sqrt()).collect();
    let mut y = x.to_owned();
    for (mut row, &ri) in y.rows_mut().into_iter().zip(r.iter()) {
        Zip::from(&mut row).and(g).for_each(|a, &gi| *a *= ri * gi);
    }
    (y, r)
}

/// Backward of [`rmsnorm`]: `(dx, dg)`.
pub fn rmsnorm_back(
    x: ArrayView2<f64>,
    g: &Array1<f64>,
    r: &Array1<f64>,
    dy: ArrayView2<f64>,
) -> (Array2<f64>, Array1<f64>) {
    let d = x.ncols() as f64;
    let mut dx = Array2::zeros(x.raw_dim());
    let mut dg = Array1::zeros(g.len());
    for i in 0..x.nrows() {
        let (xr, dyr, ri) = (x.row(i), dy.row(i), r[i]);
        let a = &dyr * g; // ∂/∂(x·r)
        let dot = a.dot(&xr);
        Zip::from(dx.row_mut(i))
            .and(&a)
            .and(&xr)
            .for_each(|o, &ai, &xi| *o = ri * ai - ri * ri * ri * xi * dot / d);
        Zip::from(&mut dg).and(&dyr).and(&xr).for_each(|o, &dyi, &xi| *o += dyi * xi * ri);
    }
    (dx, dg)
}

const GELU_C: f64 = 0.797_884_560_802_865_4; // √(2/π)

/// GELU (tanh approximation).
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + (GELU_C * (x + 0.044_715 * x * x * x)).tanh())
}

/// `d gelu / dx`.
pub fn gelu_grad(x: f64) -> f64 {
    let u = GELU_C * (x + 0.044_715 * x * x * x);
    let th = u.tanh();
    0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * GELU_C * (1.0 + 3.0 * 0.044_715 * x * x)
}

/// Logistic sigmoid.
pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `ln(1 + eˣ)`, stable for large `|x|`.
pub fn softplus(x: f64) -> f64 {
    if x > 30.0 { x } else { x.exp().ln_1p() }
}

/// `softplus⁻¹(y) = ln(eʸ − 1)` for `y > 0`.
pub fn softplus_inv(y: f64) -> f64 {
    y + (-(-y).exp()).ln_1p()
}

/// L2 normalisation of consecutive groups of `d` entries in every row (per head):
/// `y = x / √(|x|² + ε)`; returns `y` and the inverse norms `[rows, groups]`.
pub fn l2norm_groups(x: ArrayView2<f64>, d: usize) -> (Array2<f64>, Array2<f64>) {
    let groups = x.ncols() / d;
    let mut y = x.to_owned();
    let mut inv = Array2::zeros((x.nrows(), groups));
    for i in 0..x.nrows() {
        for h in 0..groups {
            let seg = x.slice(ndarray::s![i, h * d..(h + 1) * d]);
            let r = 1.0 / (seg.dot(&seg) + NORM_EPS).sqrt();
            inv[[i, h]] = r;
            y.slice_mut(ndarray::s![i, h * d..(h + 1) * d]).mapv_inplace(|v| v * r);
        }
    }
    (y, inv)
}

/// Backward of [`l2norm_groups`]: `dx = r (dy − y (y·dy))`.
pub fn l2norm_groups_back(
    y: ArrayView2<f64>,
    inv: &Array2<f64>,
    dy: ArrayView2<f64>,
    d: usize,
) -> Array2<f64> {
    let mut dx = Array2::zeros(y.raw_dim());
    for i in 0..y.nrows() {
        for h in 0..inv.ncols() {
            let r = ndarray::s![i, h * d..(h + 1) * d];
            let (ys, dys) = (y.slice(r), dy.slice(r));
            let dot = ys.dot(&dys);
            let ri = inv[[i, h]];
            Zip::from(dx.slice_mut(r)).and(&ys).and(&dys).for_each(|o, &yy, &g| *o = ri * (g - yy * dot));
        }
    }
    dx
}

/// Softmax cross-entropy, averaged over the rows that have a target.
#[derive(Clone, Debug)]
pub struct CrossEntropy {
    /// Mean loss over labelled rows (0 when there are none).
    pub loss: f64,
    /// `∂ loss / ∂ logits` (zero on unlabelled rows).
    pub dlogits: Array2<f64>,
    /// Per row: `Some(argmax == target)` where labelled.
    pub correct: Vec<Option<bool>>,
}

/// Cross-entropy of `logits [rows, V]` against `targets` (`None`: no loss); a target `≥ V`
/// counts as unlabelled (the model rejects such targets before it gets here).
pub fn cross_entropy(logits: ArrayView2<f64>, targets: &[Option<usize>]) -> CrossEntropy {
    let n = targets.iter().flatten().filter(|&&t| t < logits.ncols()).count();
    let mut dlogits = Array2::zeros(logits.raw_dim());
    let mut loss = 0.0;
    let mut correct = vec![None; targets.len()];
    for (i, t) in targets.iter().enumerate() {
        let Some(t) = t.filter(|&t| t < logits.ncols()) else { continue };
        let row = logits.row(i);
        let m = row.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        let z: f64 = row.iter().map(|&v| (v - m).exp()).sum();
        loss += z.ln() + m - row[t];
        let argmax = row.iter().enumerate().fold(0, |a, (j, &v)| if v > row[a] { j } else { a });
        correct[i] = Some(argmax == t);
        let mut d = dlogits.row_mut(i);
        for j in 0..row.len() {
            d[j] = (row[j] - m).exp() / z / n as f64;
        }
        d[t] -= 1.0 / n as f64;
    }
    CrossEntropy { loss: if n == 0 { 0.0 } else { loss / n as f64 }, dlogits, correct }
}

/// Short causal depthwise convolution over the rows `[N·T, D]` of `n` sequences of `t` rows:
/// `y[r, c] = b[c] + Σ_j w[j, c] · x[r − (K−1−j), c]` over the taps `j` whose row lies in the
/// same sequence (`K` = rows of `w [K, D]`; `w[K−1]` weighs the row itself, as PyTorch's
/// `Conv1d(D, D, K, groups=D, padding=K−1)` truncated to the first `T` outputs).
pub fn causal_conv(x: ArrayView2<f64>, w: ArrayView2<f64>, b: &Array1<f64>, t: usize) -> Array2<f64> {
    let k = w.nrows();
    let mut y = Array2::zeros(x.raw_dim());
    for (r, mut row) in y.outer_iter_mut().enumerate() {
        row.assign(b);
        for j in (0..k).filter(|&j| k - 1 - j <= r % t.max(1)) {
            row.scaled_add(1.0, &(&w.row(j) * &x.row(r - (k - 1 - j))));
        }
    }
    y
}

/// The backward of [`causal_conv`]: from `dy`, the gradients of `x`, `w` and `b`.
pub fn causal_conv_back(
    x: ArrayView2<f64>,
    w: ArrayView2<f64>,
    dy: ArrayView2<f64>,
    t: usize,
) -> (Array2<f64>, Array2<f64>, Array1<f64>) {
    let k = w.nrows();
    let mut dx = Array2::zeros(x.raw_dim());
    let mut dw = Array2::zeros(w.raw_dim());
    for (r, g) in dy.outer_iter().enumerate() {
        for j in (0..k).filter(|&j| k - 1 - j <= r % t.max(1)) {
            let src = r - (k - 1 - j);
            dx.row_mut(src).scaled_add(1.0, &(&w.row(j) * &g));
            dw.row_mut(j).scaled_add(1.0, &(&x.row(src) * &g));
        }
    }
    (dx, dw, bias_back(dy))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    pub(crate) fn rand2(rng: &mut StdRng, r: usize, c: usize) -> Array2<f64> {
        Array2::from_shape_fn((r, c), |_| rng.random_range(-1.0..1.0))
    }

    /// Central difference of `f` at `x` along `dir`, against the analytic `⟨grad, dir⟩`.
    /// Returns the relative error (against max(1, |analytic|)).
    pub(crate) fn fd_check(
        f: &dyn Fn(&Array2<f64>) -> f64,
        x: &Array2<f64>,
        grad: &Array2<f64>,
        dir: &Array2<f64>,
    ) -> f64 {
        let h = 1e-5;
        let num = (f(&(x + &(dir * h))) - f(&(x - &(dir * h)))) / (2.0 * h);
        let ana = (grad * dir).sum();
        (num - ana).abs() / ana.abs().max(1e-3)
    }

    const TOL: f64 = 1e-6;

    #[test]
    fn causal_conv_is_causal_per_sequence_and_matches_finite_differences() {
        let mut rng = StdRng::seed_from_u64(4);
        let (n, t, d, k) = (3, 5, 4, 3);
        let (x, w, c) = (rand2(&mut rng, n * t, d), rand2(&mut rng, k, d), rand2(&mut rng, n * t, d));
        let b = Array1::from_vec(vec![0.1, -0.2, 0.3, 0.05]);
        // By hand: row 1 of sequence 2 sees its own row (w[2]) and the row before (w[1]), not
        // the last row of sequence 1.
        let y = causal_conv(x.view(), w.view(), &b, t);
        let r = 2 * t + 1;
        for ch in 0..d {
            let want = b[ch] + w[[2, ch]] * x[[r, ch]] + w[[1, ch]] * x[[r - 1, ch]];
            assert!((y[[r, ch]] - want).abs() < 1e-12);
            assert!((y[[2 * t, ch]] - (b[ch] + w[[2, ch]] * x[[2 * t, ch]])).abs() < 1e-12);
        }
        let loss = |x: &Array2<f64>, w: &Array2<f64>, b: &Array1<f64>| {
            (causal_conv(x.view(), w.view(), b, t) * &c).sum()
        };
        let (dx, dw, db) = causal_conv_back(x.view(), w.view(), c.view(), t);
        let dir = rand2(&mut rng, n * t, d);
        assert!(fd_check(&|x| loss(x, &w, &b), &x, &dx, &dir) < TOL);
        let dir = rand2(&mut rng, k, d);
        assert!(fd_check(&|w| loss(&x, w, &b), &w, &dw, &dir) < TOL);
        let db2 = Array2::from_shape_vec((1, d), db.to_vec()).unwrap();
        let b2 = Array2::from_shape_vec((1, d), b.to_vec()).unwrap();
        let dir = rand2(&mut rng, 1, d);
        assert!(fd_check(&|b| loss(&x, &w, &b.row(0).to_owned()), &b2, &db2, &dir) < TOL);
    }

    #[test]
    fn linear_and_bias_match_finite_differences() {
        let mut rng = StdRng::seed_from_u64(1);
        let (x, w, c) = (rand2(&mut rng, 5, 4), rand2(&mut rng, 4, 3), rand2(&mut rng, 5, 3));
        let b = Array1::from_vec(vec![0.1, -0.2, 0.3]);
        let loss = |x: &Array2<f64>, w: &Array2<f64>, b: &Array1<f64>| {
            let mut y = linear(x.view(), w.view());
            add_bias(&mut y, b);
            (&y * &c).sum()
        };
        let (dx, dw) = linear_back(x.view(), w.view(), c.view());
        let db = bias_back(c.view());
        assert!(fd_check(&|x| loss(x, &w, &b), &x, &dx, &rand2(&mut rng, 5, 4)) < TOL);
        assert!(fd_check(&|w| loss(&x, w, &b), &w, &dw, &rand2(&mut rng, 4, 3)) < TOL);
        let b2 = b.clone().insert_axis(Axis(0));
        let db2 = db.insert_axis(Axis(0));
        let f = |bb: &Array2<f64>| loss(&x, &w, &bb.row(0).to_owned());
        assert!(fd_check(&f, &b2, &db2, &rand2(&mut rng, 1, 3)) < TOL);
    }

    #[test]
    fn rmsnorm_matches_finite_differences() {
        let mut rng = StdRng::seed_from_u64(2);
        let (x, c) = (rand2(&mut rng, 4, 6), rand2(&mut rng, 4, 6));
        let g = Array1::from_shape_fn(6, |i| 0.5 + 0.1 * i as f64);
        let loss = |x: &Array2<f64>, g: &Array1<f64>| (&rmsnorm(x.view(), g).0 * &c).sum();
        let (_, r) = rmsnorm(x.view(), &g);
        let (dx, dg) = rmsnorm_back(x.view(), &g, &r, c.view());
        assert!(fd_check(&|x| loss(x, &g), &x, &dx, &rand2(&mut rng, 4, 6)) < TOL);
        let f = |gg: &Array2<f64>| loss(&x, &gg.row(0).to_owned());
        let g2 = g.clone().insert_axis(Axis(0));
        assert!(fd_check(&f, &g2, &dg.insert_axis(Axis(0)), &rand2(&mut rng, 1, 6)) < TOL);
    }

    #[test]
    fn scalar_maps_match_finite_differences() {
        let h = 1e-6;
        for &x in &[-3.0, -0.7, 0.0, 0.4, 2.5] {
            let num = (gelu(x + h) - gelu(x - h)) / (2.0 * h);
            assert!((num - gelu_grad(x)).abs() < 1e-8, "gelu' at {x}");
            let s = sigmoid(x);
            let num = (sigmoid(x + h) - sigmoid(x - h)) / (2.0 * h);
            assert!((num - s * (1.0 - s)).abs() < 1e-8, "sigmoid' at {x}");
            let num = (softplus(x + h) - softplus(x - h)) / (2.0 * h);
            assert!((num - sigmoid(x)).abs() < 1e-8, "softplus' at {x}");
            assert!((softplus(softplus_inv(softplus(x))) - softplus(x)).abs() < 1e-12);
        }
    }

    #[test]
    fn l2norm_matches_finite_differences() {
        let mut rng = StdRng::seed_from_u64(3);
        let (x, c) = (rand2(&mut rng, 3, 6), rand2(&mut rng, 3, 6));
        let loss = |x: &Array2<f64>| (&l2norm_groups(x.view(), 3).0 * &c).sum();
        let (y, inv) = l2norm_groups(x.view(), 3);
        let dx = l2norm_groups_back(y.view(), &inv, c.view(), 3);
        assert!(fd_check(&loss, &x, &dx, &rand2(&mut rng, 3, 6)) < TOL);
        for row in y.rows() {
            assert!((row.slice(ndarray::s![..3]).dot(&row.slice(ndarray::s![..3])) - 1.0).abs() < 1e-5);
        }
    }

    #[test]
    fn cross_entropy_matches_finite_differences() {
        let mut rng = StdRng::seed_from_u64(4);
        let logits = rand2(&mut rng, 5, 7) * 3.0;
        let targets = vec![Some(1), None, Some(6), Some(0), None];
        let ce = cross_entropy(logits.view(), &targets);
        assert!(ce.dlogits.row(1).iter().all(|&v| v == 0.0));
        let f = |l: &Array2<f64>| cross_entropy(l.view(), &targets).loss;
        assert!(fd_check(&f, &logits, &ce.dlogits, &rand2(&mut rng, 5, 7)) < TOL);
        // A perfectly confident correct row has (almost) no loss.
        let mut sure = Array2::zeros((1, 3));
        sure[[0, 2]] = 50.0;
        let ce = cross_entropy(sure.view(), &[Some(2)]);
        assert!(ce.loss < 1e-12 && ce.correct[0] == Some(true));
    }
}
