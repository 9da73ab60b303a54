//! The materialized (reference) backward of the log-linear family: entry gradients
//! $\bar A_{t,s}$ of [`crate::grad::vjp`] mapped back to `q`, `k`, `g`, `beta`, `lambda` and
//! `lambda_param` (the gradient of `v` comes from the generic VJP).
//!
//! With the lift, $A_{t,s} = \lambda_t^{(\ell)} A^{\text{base}}_{t,s}$, so
//! $\bar\lambda_t^{(\ell)} = \sum_{s: \ell(t,s) = \ell} \bar A_{t,s} A^{\text{base}}_{t,s}$ and
//! $\bar A^{\text{base}}_{t,s} = \lambda_t^{(\ell(t,s))} \bar A_{t,s}$. Then per base mixer:
//! - linear attention, $A = \sigma\, q_t \cdot k_s$: $\bar q_t = \sigma \sum_s \bar A_{t,s} k_s$,
//!   $\bar k_s = \sigma \sum_t \bar A_{t,s} q_t$;
//! - Mamba-2, $A = \sigma\,(q_t \cdot k_s)\, e^{G_t - G_s}$: the same with the decay, and with
//!   $P = \bar A \odot A$: $\bar G_t = \sum_s P_{t,s} - \sum_{t'} P_{t',t}$,
//!   $\bar g_r = \sum_{t \ge r} \bar G_t$;
//! - gated DeltaNet, $A_{t,s} = \beta_s\, k_s \cdot z^{(t)}_s$ with $z^{(t)}_t = \sigma q_t$ and
//!   $z^{(t)}_{s-1} = e^{g_s}(I - \beta_s k_s k_s^\top) z^{(t)}_s$: reverse mode through that
//!   recursion for every row $t$ (adjoint $\zeta_0 = \bar A_{t,0}\beta_0 k_0$,
//!   $\zeta_s = \bar A_{t,s}\beta_s k_s + e^{g_s}(I - \beta_s k_s k_s^\top)\zeta_{s-1}$,
//!   $\bar q_t = \sigma \zeta_t$), $O(T^2 D_k)$ per head: a reference, not a fast form.

use ndarray::{Array2, ArrayD, IxDyn};

use super::{Base, LogLinear, Views, view3, view4};
use crate::error::{Error, Result};
use crate::grad::{MatGrad, grad_name};
use crate::tensor::{Tensors, get};

/// See the module documentation.
pub(crate) fn materialized_vjp(m: &LogLinear, inputs: &Tensors<f64>, grad: &MatGrad) -> Result<Tensors<f64>> {
    let q = view4(inputs, "q")?;
    let k = view4(inputs, "k")?;
    let (nb, t_len, nh, dk) = q.dim();
    let zeros = ndarray::Array3::<f64>::zeros((nb, t_len, nh));
    let g = if m.base.has_decay() { view3(inputs, "g")? } else { zeros.view() };
    let beta = if m.base.has_beta() { view3(inputs, "beta")? } else { zeros.view() };
    let views = Views { q, k, g, beta };
    let raw = m.lift.map(|_| get(inputs, "lambda")).transpose()?;
    let param = inputs.get("lambda_param");
    let lam = raw.map(|r| m.lambda_weights(r, param)).transpose()?;
    if grad.blocks.len() != nb * nh {
        return Err(Error::Numerical(format!(
            "{} backward: {} entry-gradient blocks for B·H = {}",
            m.name,
            grad.blocks.len(),
            nb * nh
        )));
    }
    let mut dq = ArrayD::<f64>::zeros(IxDyn(q.shape()));
    let mut dkk = ArrayD::<f64>::zeros(IxDyn(k.shape()));
    let mut dg = ArrayD::<f64>::zeros(IxDyn(g.shape()));
    let mut dbeta = ArrayD::<f64>::zeros(IxDyn(beta.shape()));
    let mut dlam = lam.as_ref().map(|l| ArrayD::<f64>::zeros(l.raw_dim()));
    for b in 0..nb {
        for h in 0..nh {
            let ga = &grad.blocks[b * nh + h].terms[0];
            let ab = m.base_matrix(&views, b, h);
            // Ā of the base matrix, and λ̄ from Ā ⊙ A_base.
            let mut gb: Array2<f64> = ga.clone();
            if let (Some(lam), Some(dl)) = (lam.as_ref(), dlam.as_mut()) {
                let nl = lam.shape()[3];
                for t in 0..t_len {
                    for s in 0..=t {
                        let l = m.level_checked(t, s, nl)?;
                        dl[[b, t, h, l]] += ga[[t, s]] * ab[[t, s]];
                        gb[[t, s]] = ga[[t, s]] * lam[[b, t, h, l]];
                    }
                }
            }
            match m.base {
                Base::LinearAttention | Base::Mamba2 => {
                    let mut dgc = vec![0.0; t_len];
                    for t in 0..t_len {
                        let mut cum = 0.0f64;
                        for s in (0..=t).rev() {
                            let e = cum.exp();
                            let c = m.scale * gb[[t, s]] * e;
                            for d in 0..dk {
                                dq[[b, t, h, d]] += c * views.k[[b, s, h, d]];
                                dkk[[b, s, h, d]] += c * views.q[[b, t, h, d]];
                            }
                            let p = gb[[t, s]] * ab[[t, s]];
                            dgc[t] += p;
                            dgc[s] -= p;
                            cum += views.g[[b, s, h]];
                        }
                    }
                    if m.base == Base::Mamba2 {
                        let mut acc = 0.0;
                        for r in (0..t_len).rev() {
                            acc += dgc[r];
                            dg[[b, r, h]] = acc;
                        }
                    }
                }
                Base::GatedDeltaNet => gdn_rows(m, &views, &gb, b, h, &mut dq, &mut dkk, &mut dg, &mut dbeta),
            }
        }
    }
    let mut out = Tensors::new();
    out.insert(grad_name("q"), dq);
    out.insert(grad_name("k"), dkk);
    if m.base.has_decay() {
        out.insert(grad_name("g"), dg);
    }
    if m.base.has_beta() {
        out.insert(grad_name("beta"), dbeta);
    }
    if let (Some(raw), Some(dl)) = (raw, dlam) {
        let (d_raw, d_param) = m.lambda_vjp(raw, param, &dl)?;
        out.insert(grad_name("lambda"), d_raw);
        if let Some(dp) = d_param {
            out.insert(grad_name("lambda_param"), dp);
        }
    }
    Ok(out)
}

/// Reverse mode through $z^{(t)}$ for every row $t$ of one (batch row, head) of gated DeltaNet
/// (see the module documentation), accumulating into the gradients.
#[allow(clippy::too_many_arguments)]
fn gdn_rows(
    m: &LogLinear,
    x: &Views<'_>,
    gb: &Array2<f64>,
    b: usize,
    h: usize,
    dq: &mut ArrayD<f64>,
    dk: &mut ArrayD<f64>,
    dg: &mut ArrayD<f64>,
    dbeta: &mut ArrayD<f64>,
) {
    let (_, t_len, _, dkn) = x.q.dim();
    let kv = |s: usize, d: usize| x.k[[b, s, h, d]];
    let dot = |a: &[f64], c: &[f64]| -> f64 { a.iter().zip(c).map(|(u, v)| u * v).sum() };
    // z[s] = z^{(t)}_s for s = 0..=t.
    let mut z = vec![vec![0.0; dkn]; t_len];
    let mut zeta = vec![0.0; dkn];
    for t in 0..t_len {
        for d in 0..dkn {
            z[t][d] = m.scale * x.q[[b, t, h, d]];
        }
        for s in (1..=t).rev() {
            let ks: Vec<f64> = (0..dkn).map(|d| kv(s, d)).collect();
            let kz = dot(&ks, &z[s]);
            let (e, bs) = (x.g[[b, s, h]].exp(), x.beta[[b, s, h]]);
            for d in 0..dkn {
                z[s - 1][d] = e * (z[s][d] - bs * ks[d] * kz);
            }
        }
        // ζ_{s} from s = 0 upwards; the transition of step s maps ζ_{s−1} to ζ_s.
        zeta.iter_mut().for_each(|v| *v = 0.0);
        for s in 0..=t {
            let ks: Vec<f64> = (0..dkn).map(|d| kv(s, d)).collect();
            let kz = dot(&ks, &z[s]);
            let bs = x.beta[[b, s, h]];
            if s >= 1 {
                // z_{s−1} = e (z_s − β k (k·z_s)), with adjoint ζ_{s−1} (held in `zeta`).
                let e = x.g[[b, s, h]].exp();
                let kzeta = dot(&ks, &zeta);
                dg[[b, s, h]] += dot(&zeta, &z[s - 1]);
                dbeta[[b, s, h]] -= e * kzeta * kz;
                for d in 0..dkn {
                    dk[[b, s, h, d]] -= e * bs * (kz * zeta[d] + kzeta * z[s][d]);
                }
                for d in 0..dkn {
                    zeta[d] = e * (zeta[d] - bs * ks[d] * kzeta);
                }
            }
            let c = gb[[t, s]];
            dbeta[[b, s, h]] += c * kz;
            for d in 0..dkn {
                dk[[b, s, h, d]] += c * bs * z[s][d];
                zeta[d] += c * bs * ks[d];
            }
        }
        for d in 0..dkn {
            dq[[b, t, h, d]] += m.scale * zeta[d];
        }
    }
}
