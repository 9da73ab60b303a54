//! The GLR's backward pass on CPU: the reverse sparse recurrence, `O(T · K)` per channel.
//!
//! With `ȳ` the output cotangent, the total cotangent of `y_t` gathers the reads of
//! `y_t` by later tokens through the *transposed* pattern:
//! `g_t = ȳ_t + Σ_{t' > t, k: d_k(t') = t} β_{t',k} g_{t'} .`
//! Tokens run from `T−1` down to 0; when token `t` is reached its `g_t` is complete, and it
//! scatters `β_{t,k} g_t` to `g_{d_k(t)}` (so the transposed pattern is never built, and
//! cache-efficient lattices work unchanged). Then
//! `ᾱ_t = g_t x_t` (or `ᾱ_{t,0}`), `ᾱ_{t,k+1} = g_t x_{d_k(t)}`,
//! `β̄_{t,k} = g_t y_{d_k(t)}`, `x̄_t += α_t g_t`,
//! `x̄_{d_k(t)} += α_{t,k+1} g_t`. The outputs `y` are recomputed by the
//! forward recurrence first (one `[T, w]` buffer per channel block). Inactive slots get 0.

use mixer_core::mixers::glr::{Glr, Slots};
use mixer_core::tensor::get;
use mixer_core::{Error, Real, Requires, Result, Tensors, grad_name};
use ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;

use super::fast::{Views, block, block_width, gather, views};

/// One channel block's gradients: `dx [T, w]`, `dalpha [T, A, w]`, `dbeta [T, K, w]`.
struct BlockGrads<F> {
    dx: Vec<F>,
    dalpha: Vec<F>,
    dbeta: Vec<F>,
}

fn block_vjp<F: Real>(
    v: &Views<'_, F>,
    slots: &Slots,
    gy: &[F],
    b: usize,
    c0: usize,
    w: usize,
) -> BlockGrads<F> {
    let (tn, cn, kn) = (v.t_len, v.c_len, v.k_len);
    let ka = if v.has_a { kn + 1 } else { 1 };
    let y = if v.has_b { block(v, slots, b, c0, w) } else { Vec::new() };
    let mut g = vec![F::zero(); tn * w];
    for t in 0..tn {
        let row = (b * tn + t) * cn + c0;
        g[t * w..(t + 1) * w].copy_from_slice(&gy[row..row + w]);
    }
    let mut dx = vec![F::zero(); tn * w];
    let mut dalpha = vec![F::zero(); tn * ka * w];
    let mut dbeta = vec![F::zero(); if v.has_b { tn * kn * w } else { 0 }];
    for t in (0..tn).rev() {
        let n = slots.active(t);
        let (before, rest) = g.split_at_mut(t * w);
        let gt = &rest[..w];
        let row = (b * tn + t) * cn + c0;
        let xt = &v.x[row..row + w];
        // α on x_t.
        let a0 = if v.has_a { &v.alpha[(b * tn + t) * ka * cn + c0..][..w] } else { &v.alpha[row..row + w] };
        let da0 = &mut dalpha[t * ka * w..][..w];
        for j in 0..w {
            da0[j] = gt[j] * xt[j];
            dx[t * w + j] += a0[j] * gt[j];
        }
        for k in 0..n {
            let d = slots.pos(t, k);
            if v.has_a {
                let ak = &v.alpha[((b * tn + t) * ka + k + 1) * cn + c0..][..w];
                let xd = &v.x[(b * tn + d) * cn + c0..][..w];
                let dak = &mut dalpha[(t * ka + k + 1) * w..][..w];
                for j in 0..w {
                    dak[j] = gt[j] * xd[j];
                    dx[d * w + j] += ak[j] * gt[j];
                }
            }
            if v.has_b {
                let bk = &v.beta[((b * tn + t) * kn + k) * cn + c0..][..w];
                let yd = &y[d * w..(d + 1) * w];
                let dbk = &mut dbeta[(t * kn + k) * w..][..w];
                let gd = &mut before[d * w..(d + 1) * w];
                for j in 0..w {
                    dbk[j] = gt[j] * yd[j];
                    gd[j] += bk[j] * gt[j];
                }
            }
        }
    }
    BlockGrads { dx, dalpha, dbeta }
}

/// The `fast` backward (see the module documentation).
pub fn vjp<F: Real>(g: &Glr, inputs: &Tensors<F>, dy: &ArrayD<F>, _req: &Requires) -> Result<Tensors<F>> {
    let xs = get(inputs, "x")?.shape().to_vec();
    let slots = g.slots(xs.get(1).copied().unwrap_or(0));
    let (x, alpha, beta) = gather(g, inputs, &slots)?;
    let v = views(g, &x, &alpha, &beta, &xs, &slots);
    if dy.shape() != xs.as_slice() {
        return Err(Error::shape(
            "dy",
            mixer_core::error::fmt_shape(&xs),
            mixer_core::error::fmt_shape(dy.shape()),
        ));
    }
    let gy: Vec<F> = dy.iter().copied().collect();
    let (bn, tn, cn, kn) = (xs[0], xs[1], xs[2], slots.len());
    let ka = if v.has_a { kn + 1 } else { 1 };
    let w = block_width(bn, cn);
    let tasks: Vec<(usize, usize)> =
        (0..bn).flat_map(|b| (0..cn).step_by(w.max(1)).map(move |c0| (b, c0))).collect();
    let parts: Vec<BlockGrads<F>> =
        tasks.par_iter().map(|&(b, c0)| block_vjp(&v, &slots, &gy, b, c0, w.min(cn - c0))).collect();
    let mut dx = vec![F::zero(); bn * tn * cn];
    let mut da = vec![F::zero(); bn * tn * ka * cn];
    let mut db = vec![F::zero(); if v.has_b { bn * tn * kn * cn } else { 0 }];
    for (&(b, c0), p) in tasks.iter().zip(&parts) {
        let wb = w.min(cn - c0);
        for t in 0..tn {
            dx[(b * tn + t) * cn + c0..][..wb].copy_from_slice(&p.dx[t * wb..][..wb]);
            for k in 0..ka {
                da[((b * tn + t) * ka + k) * cn + c0..][..wb]
                    .copy_from_slice(&p.dalpha[(t * ka + k) * wb..][..wb]);
            }
            if v.has_b {
                for k in 0..kn {
                    db[((b * tn + t) * kn + k) * cn + c0..][..wb]
                        .copy_from_slice(&p.dbeta[(t * kn + k) * wb..][..wb]);
                }
            }
        }
    }
    let shape = |s: &[usize], data: Vec<F>| {
        ArrayD::from_shape_vec(IxDyn(s), data).map_err(|e| Error::Numerical(format!("glr backward: {e}")))
    };
    let mut out = Tensors::new();
    out.insert(grad_name("x"), shape(&xs, dx)?);
    let a_shape = if v.has_a { vec![bn, tn, ka, cn] } else { xs.clone() };
    out.insert(grad_name("alpha"), shape(&a_shape, da)?);
    if v.has_b {
        out.insert(grad_name("beta"), shape(&[bn, tn, kn, cn], db)?);
    }
    Ok(out)
}
