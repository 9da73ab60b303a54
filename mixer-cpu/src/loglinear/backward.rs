//! The log-linear family's fast backward on CPU (Fenwick mask). Linear attention and
//! Mamba-2, lifted or not, use the level decomposition below: `O(T log T)` per head, never
//! a `T×T` matrix. Gated DeltaNet (lifted or not) goes through reverse mode of its WY/UT
//! chunk form ([`super::backward_gdn`]).
//!
//! Every pair `s ≤ t` contributes `w_{t,s} a_{t,s} v_s` to `y_t`, with
//! `a_{t,s} = σ (q_t · k_s) e^(G_t − G_s)` and `w_{t,s} = λ_t^(ℓ(t,s))` (1 for
//! the base mixers). With `ā_{t,s} = ȳ_t · v_s` and `P_{t,s} = w a ā`:
//! `v̄_s += w a ȳ_t`, `q̄_t += w σ e^(G_t−G_s) ā k_s`,
//! `k̄_s += w σ e^(G_t−G_s) ā q_t`, `λ̄_t^(ℓ) += a ā`,
//! `Ḡ_t += P`, `Ḡ_s −= P`, and finally `ḡ_r = Σ_{t ≥ r} Ḡ_t`.
//!
//! The pairs are split by Fenwick level (MATH §2.2, §2.6):
//! - **inside a chunk** of `C = 2^c` tokens (levels `≤ c`): dense `C × C` tiles;
//! - **level `ℓ > c`**: in every block of `2^ℓ` tokens the upper half `U` reads the lower
//!   half `L` through one state `S = Σ_{s ∈ L} e^(G_{m−1} − G_s) k_s v_sᵀ` (`m` the first
//!   position of `U`), weighted by `λ^(ℓ)`. Its adjoint
//!   `S̄ = Σ_{t ∈ U} σ λ_t^(ℓ) e^(G_t − G_{m−1}) q_t ȳ_tᵀ` gives
//!   `k̄_s, v̄_s` on `L`, and `S` gives `q̄_t, λ̄_t^(ℓ)` on `U` —
//!   `O(T D_k D_v)` per level, `⌈ log_2 T ⌉ − c` levels.
//!
//! Exponents are differences of `f64` cumulative sums taken only where they are `≤ 0`.

use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, MatRef, Par};
use mixer_core::mixer::{Mixer, downcast};
use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::tensor::get;
use mixer_core::{Error, Form, Real, Requires, Result, Tensors, grad_name};
use mixer_registry::{BackwardEntry, every_config, register};
use ndarray::{Array4, ArrayD, IxDyn};
use rayon::prelude::*;

use super::common::{self, Head};

/// One head's gradients.
struct HeadGrads<F> {
    dq: Mat<F>,
    dk: Mat<F>,
    dv: Mat<F>,
    /// `Ḡ_t` while accumulating, `ḡ_t` once returned.
    dgc: Vec<f64>,
    /// `β̄_t` (gated DeltaNet; empty otherwise).
    dbeta: Vec<F>,
    /// `λ̄` of the weights, `T×L` (empty when not lifted).
    dlam: Mat<F>,
}

fn mm<F: Real>(dst: faer::MatMut<'_, F>, acc: Accum, a: MatRef<'_, F>, b: MatRef<'_, F>) {
    matmul(dst, acc, a, b, F::one(), Par::Seq);
}

fn head_vjp<F: Real>(m: &LogLinear, hd: &Head<'_, F>, dy: MatRef<'_, F>) -> Result<HeadGrads<F>> {
    let t_len = hd.q.nrows();
    let (dk, dv) = (hd.q.ncols(), hd.v.ncols());
    let scale = m.scale;
    let n_levels = hd.lam.as_ref().map_or(0, |l| l.ncols());
    let mut gc = vec![0.0f64; t_len];
    let mut acc = 0.0;
    for t in 0..t_len {
        acc += hd.g[t];
        gc[t] = acc;
    }
    let lam = |t: usize, l: usize| -> F { hd.lam.as_ref().map_or(F::one(), |x| x[(t, l)]) };
    let mut out = HeadGrads {
        dq: Mat::zeros(t_len, dk),
        dk: Mat::zeros(t_len, dk),
        dv: Mat::zeros(t_len, dv),
        dgc: vec![0.0; t_len],
        dbeta: Vec::new(),
        dlam: Mat::zeros(t_len, n_levels),
    };
    // Inside chunks: dense tiles.
    let chunk = m.chunk;
    let mut i0 = 0;
    while i0 < t_len {
        let n = chunk.min(t_len - i0);
        let (qc, kc, vc, gy) =
            (hd.q.subrows(i0, n), hd.k.subrows(i0, n), hd.v.subrows(i0, n), dy.subrows(i0, n));
        let mut qk = Mat::<F>::zeros(n, n);
        mm(qk.as_mut(), Accum::Replace, qc, kc.transpose());
        let mut da = Mat::<F>::zeros(n, n);
        mm(da.as_mut(), Accum::Replace, gy, vc.transpose());
        // z = w σ e ā (for q̄, k̄) and wa = w a (for v̄), lower triangles.
        let mut z = Mat::<F>::zeros(n, n);
        let mut wa = Mat::<F>::zeros(n, n);
        for r in 0..n {
            for u in 0..=r {
                let e = F::of((gc[i0 + r] - gc[i0 + u]).exp() * scale);
                let a = e * qk[(r, u)];
                let w = if n_levels > 0 {
                    let l = m.level_checked(i0 + r, i0 + u, n_levels)?;
                    out.dlam[(i0 + r, l)] += a * da[(r, u)];
                    lam(i0 + r, l)
                } else {
                    F::one()
                };
                z[(r, u)] = w * e * da[(r, u)];
                wa[(r, u)] = w * a;
                let p = (w * a * da[(r, u)]).f64();
                out.dgc[i0 + r] += p;
                out.dgc[i0 + u] -= p;
            }
        }
        mm(out.dq.as_mut().subrows_mut(i0, n), Accum::Add, z.as_ref(), kc);
        mm(out.dk.as_mut().subrows_mut(i0, n), Accum::Add, z.transpose(), qc);
        mm(out.dv.as_mut().subrows_mut(i0, n), Accum::Add, wa.transpose(), gy);
        i0 += n;
    }
    // Levels above the chunk: lower half → upper half of every block of 2^ℓ tokens.
    let mut l = m.chunk_log2() as usize + 1;
    while l < usize::BITS as usize && (1usize << (l - 1)) < t_len {
        let (size, half) = (1usize << l, 1usize << (l - 1));
        let mut b0 = 0;
        while b0 + half < t_len {
            let (mid, end) = (b0 + half, (b0 + size).min(t_len));
            let (nl, nu) = (half, end - mid);
            let g_ref = gc[mid - 1];
            // Lower half: K̂ = diag(e^{G_{m−1} − G_s}) K, S = K̂ᵀ V.
            let el: Vec<F> = (b0..mid).map(|s| F::of((g_ref - gc[s]).exp())).collect();
            let (kl, vl) = (hd.k.subrows(b0, nl), hd.v.subrows(b0, nl));
            let khat = Mat::<F>::from_fn(nl, dk, |r, d| el[r] * kl[(r, d)]);
            let mut st = Mat::<F>::zeros(dk, dv);
            mm(st.as_mut(), Accum::Replace, khat.transpose(), vl);
            // Upper half: c_t = σ e^{G_t − G_{m−1}}, Q̂ = diag(c λ) Q, S̄ = Q̂ᵀ Ȳ.
            let cu: Vec<F> = (mid..end).map(|t| F::of((gc[t] - g_ref).exp() * scale)).collect();
            let wu: Vec<F> = (mid..end).map(|t| if n_levels > 0 { lam(t, l) } else { F::one() }).collect();
            let (qu, gu) = (hd.q.subrows(mid, nu), dy.subrows(mid, nu));
            let qhat = Mat::<F>::from_fn(nu, dk, |r, d| cu[r] * wu[r] * qu[(r, d)]);
            let mut ds = Mat::<F>::zeros(dk, dv);
            mm(ds.as_mut(), Accum::Replace, qhat.transpose(), gu);
            // R = Ȳ Sᵀ (nu × Dk): q̄_t += c λ R_t; λ̄_t = c q_t·R_t; Ḡ_t += λ λ̄_t.
            let mut rr = Mat::<F>::zeros(nu, dk);
            mm(rr.as_mut(), Accum::Replace, gu, st.transpose());
            for r in 0..nu {
                let qr: F = (0..dk).map(|d| qu[(r, d)] * rr[(r, d)]).fold(F::zero(), |a, b| a + b);
                let dl = cu[r] * qr;
                if n_levels > 0 {
                    out.dlam[(mid + r, l)] += dl;
                }
                out.dgc[mid + r] += (wu[r] * dl).f64();
                for d in 0..dk {
                    out.dq[(mid + r, d)] += cu[r] * wu[r] * rr[(r, d)];
                }
            }
            // k̄_s += e_s S̄ v_s, v̄_s += e_s S̄ᵀ k_s, Ḡ_s −= e_s k_s·(S̄ v_s).
            let mut kv = Mat::<F>::zeros(nl, dk);
            mm(kv.as_mut(), Accum::Replace, vl, ds.transpose());
            let mut vk = Mat::<F>::zeros(nl, dv);
            mm(vk.as_mut(), Accum::Replace, kl, ds.as_ref());
            for r in 0..nl {
                let s = b0 + r;
                let mut pi = F::zero();
                for d in 0..dk {
                    out.dk[(s, d)] += el[r] * kv[(r, d)];
                    pi += kl[(r, d)] * kv[(r, d)];
                }
                for d in 0..dv {
                    out.dv[(s, d)] += el[r] * vk[(r, d)];
                }
                out.dgc[s] -= (el[r] * pi).f64();
            }
            b0 += size;
        }
        l += 1;
    }
    // ḡ_r = Σ_{t ≥ r} Ḡ_t.
    let mut acc = 0.0;
    for x in out.dgc.iter_mut().rev() {
        acc += *x;
        *x = acc;
    }
    Ok(out)
}

/// Gated DeltaNet through [`super::backward_gdn`], in the common shape.
fn gdn_head<F: Real>(m: &LogLinear, hd: &Head<'_, F>, dy: MatRef<'_, F>) -> Result<HeadGrads<F>> {
    let g = super::backward_gdn::head_vjp(m, hd, dy)?;
    Ok(HeadGrads { dq: g.dq, dk: g.dk, dv: g.dv, dgc: g.dg, dbeta: g.dbeta, dlam: g.dlam })
}

/// The `fast` backward (see the module documentation).
pub fn vjp<F: Real>(
    m: &dyn Mixer,
    form: Form,
    inputs: &Tensors<F>,
    dy: &ArrayD<F>,
    _req: &Requires,
) -> Result<Tensors<F>> {
    let ll: &LogLinear = downcast(m, "cpu")?;
    if form != Form::Fast || !ll.has_fenwick_structure() {
        return Err(Error::FormUnavailable {
            mixer: m.name().into(),
            form: format!("{form} (backward)"),
            backend: "cpu".into(),
            available: format!("materialized{}", if ll.has_fenwick_structure() { ", fast" } else { "" }),
        });
    }
    type PerHead<F> = fn(&LogLinear, &Head<'_, F>, MatRef<'_, F>) -> Result<HeadGrads<F>>;
    let per_head: PerHead<F> = if ll.base == Base::GatedDeltaNet { gdn_head::<F> } else { head_vjp::<F> };
    let x = common::standard(inputs);
    let raw = ll.lift.map(|_| get(&x, "lambda")).transpose()?;
    let param = x.get("lambda_param");
    let lam = raw.map(|r| ll.lambda_weights(r, param)).transpose()?;
    let (sz, heads) = common::heads(ll, &x, lam.as_ref())?;
    if dy.shape() != [sz.b, sz.t, sz.h, sz.dv] {
        return Err(Error::shape(
            "dy",
            format!("[{}, {}, {}, {}]", sz.b, sz.t, sz.h, sz.dv),
            mixer_core::error::fmt_shape(dy.shape()),
        ));
    }
    let grads: Vec<HeadGrads<F>> = heads
        .par_iter()
        .map(|hd| {
            let gy = Mat::<F>::from_fn(sz.t, sz.dv, |t, d| dy[[hd.b, t, hd.h, d]]);
            per_head(ll, hd, gy.as_ref())
        })
        .collect::<Result<_>>()?;
    let mut dq = Array4::<F>::zeros((sz.b, sz.t, sz.h, sz.dk));
    let mut dk = Array4::<F>::zeros((sz.b, sz.t, sz.h, sz.dk));
    let mut dv = Array4::<F>::zeros((sz.b, sz.t, sz.h, sz.dv));
    let mut dg = ArrayD::<F>::zeros(IxDyn(&[sz.b, sz.t, sz.h]));
    let mut dbeta = ArrayD::<F>::zeros(IxDyn(&[sz.b, sz.t, sz.h]));
    let nl = lam.as_ref().map_or(0, |l| l.shape()[3]);
    let mut dlam = ArrayD::<F>::zeros(IxDyn(&[sz.b, sz.t, sz.h, nl]));
    for (hd, g) in heads.iter().zip(&grads) {
        for t in 0..sz.t {
            dg[[hd.b, t, hd.h]] = F::of(g.dgc[t]);
            if let Some(&x) = g.dbeta.get(t) {
                dbeta[[hd.b, t, hd.h]] = x;
            }
            for d in 0..sz.dk {
                dq[[hd.b, t, hd.h, d]] = g.dq[(t, d)];
                dk[[hd.b, t, hd.h, d]] = g.dk[(t, d)];
            }
            for d in 0..sz.dv {
                dv[[hd.b, t, hd.h, d]] = g.dv[(t, d)];
            }
            for l in 0..nl {
                dlam[[hd.b, t, hd.h, l]] = g.dlam[(t, l)];
            }
        }
    }
    let mut out = Tensors::new();
    out.insert(grad_name("q"), dq.into_dyn());
    out.insert(grad_name("k"), dk.into_dyn());
    out.insert(grad_name("v"), dv.into_dyn());
    if ll.base.has_decay() {
        out.insert(grad_name("g"), dg);
    }
    if ll.base.has_beta() {
        out.insert(grad_name("beta"), dbeta);
    }
    if let Some(raw) = raw {
        let (d_raw, d_param) = ll.lambda_vjp(raw, param, &dlam)?;
        out.insert(grad_name("lambda"), d_raw);
        if let Some(dp) = d_param {
            out.insert(grad_name("lambda_param"), dp);
        }
    }
    Ok(out)
}

#[register]
static LOGLINEAR_CPU_BACKWARD: BackwardEntry = BackwardEntry {
    kernel: "loglinear",
    backend: "cpu",
    forms: &[Form::Fast],
    unsupported: every_config,
    vjp_f64: vjp::<f64>,
    vjp_f32: vjp::<f32>,
};
