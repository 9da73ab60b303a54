//! Gated DeltaNet's fast backward on CPU, lifted (Fenwick) or not: reverse mode through the
//! level recurrence of MATH §2.5 with checkpoints, `O(T · L · D_k D_v)` per head
//! (`L = 1` for the base mixer), memory `O((T/C + C) · L · D_k D_v)`.
//!
//! Forward step at token `t` on the level states `S^(ℓ) ∈ ℝ^(D_v × D_k)`:
//! merge (lifts, `t ≥ 1`, `m = ctz t`: `S^(m+1) += Σ_{ℓ ≤ m} S^(ℓ)`,
//! then `S^(ℓ ≤ m) = 0`); transition `S ← e^(g_t)(S − β_t (S k_t) k_tᵀ)` on every
//! level; insert `S^(0) += β_t v_t k_tᵀ`; read
//! `y_t = σ Σ_ℓ λ_t^(ℓ) S^(ℓ) q_t`.
//!
//! Backward step, with `S̄` the adjoints of the states after token `t`:
//! read: `S̄^(ℓ) += σλ^(ℓ) ȳ_t q_tᵀ`,
//! `λ̄^(ℓ)_t = σ ȳ_t · S^(ℓ) q_t`, `q̄_t = σ Σ_ℓ λ^(ℓ) S^((ℓ)ᵀ) ȳ_t`;
//! insert: `v̄_t = β S̄^(0) k`, `k̄_t += β S̄^((0)ᵀ) v`, `β̄_t += vᵀ S̄^(0) k`;
//! transition (per level, `S` the merged state, `u = S k`, `D = S̄`):
//! `ḡ_t += ⟨ D, S_{new} ⟩`, `β̄_t −= e^g uᵀ D k`,
//! `k̄_t −= β e^g (Sᵀ D k + Dᵀ u)`, `S̄ ← e^g(D − β (D k) kᵀ)`;
//! merge: the adjoint of level `m+1` is copied to levels `0..m`.
//!
//! The states are saved at every chunk start (`C` = the config's `chunk`) in a forward
//! sweep; the backward sweep recomputes each chunk's per-token states from its checkpoint.

use faer::{Mat, MatRef};
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Real, Result};

use super::common::Head;

/// One head's gradients: `dq, dk [T×Dk]`, `dv [T×Dv]`, `dg, dbeta [T]`, `dlam [T×L]`.
pub(crate) struct GdnGrads<F> {
    pub(crate) dq: Mat<F>,
    pub(crate) dk: Mat<F>,
    pub(crate) dv: Mat<F>,
    pub(crate) dg: Vec<F>,
    pub(crate) dbeta: Vec<F>,
    pub(crate) dlam: Mat<F>,
}

struct Ctx<'a, 'h, F: Real> {
    hd: &'a Head<'h, F>,
    lifted: bool,
    nl: usize,
    dk: usize,
    dv: usize,
}

impl<F: Real> Ctx<'_, '_, F> {
    /// Merge (lifts, `t ≥ 1`).
    fn merge(&self, st: &mut [Vec<F>], t: usize) {
        if !self.lifted || t == 0 {
            return;
        }
        let m = t.trailing_zeros() as usize;
        if m + 1 >= self.nl {
            return;
        }
        let (lo, hi) = st.split_at_mut(m + 1);
        for s in lo.iter_mut() {
            for (a, b) in hi[0].iter_mut().zip(s.iter_mut()) {
                *a += *b;
                *b = F::zero();
            }
        }
    }
    /// Transition of every level, then insert.
    fn step(&self, st: &mut [Vec<F>], t: usize) {
        let (dk, dv) = (self.dk, self.dv);
        let e = F::of(self.hd.g[t].exp());
        let b = self.hd.beta[t];
        let k = self.hd.k.row(t);
        for s in st.iter_mut() {
            for i in 0..dv {
                let row = &mut s[i * dk..(i + 1) * dk];
                let u: F = (0..dk).map(|j| row[j] * k[j]).fold(F::zero(), |x, y| x + y);
                for j in 0..dk {
                    row[j] = e * (row[j] - b * u * k[j]);
                }
            }
        }
        let v = self.hd.v.row(t);
        for i in 0..dv {
            for j in 0..dk {
                st[0][i * dk + j] += b * v[i] * k[j];
            }
        }
    }
    fn lam(&self, t: usize, l: usize) -> F {
        self.hd.lam.as_ref().map_or(F::one(), |x| x[(t, l)])
    }
}

fn row_dot<F: Real>(a: &[F], b: impl Iterator<Item = F>) -> F {
    a.iter().zip(b).map(|(x, y)| *x * y).fold(F::zero(), |p, q| p + q)
}

/// The backward of one (batch, head) of (loglinear-)gated-deltanet; `dy` is `T×Dv`.
pub(crate) fn head_vjp<F: Real>(m: &LogLinear, hd: &Head<'_, F>, dy: MatRef<'_, F>) -> Result<GdnGrads<F>> {
    let t_len = hd.q.nrows();
    let (dk, dv) = (hd.q.ncols(), hd.v.ncols());
    let lifted = hd.lam.is_some();
    let nl = hd.lam.as_ref().map_or(1, |l| l.ncols()).max(1);
    let cx = Ctx { hd, lifted, nl, dk, dv };
    let scale = F::of(m.scale);
    let chunk = m.chunk.max(1);
    let zero_states = || vec![vec![F::zero(); dk * dv]; nl];
    // Forward sweep: checkpoints at chunk starts (states before token i0's merge).
    let n_chunks = t_len.div_ceil(chunk);
    let mut ckpt = Vec::with_capacity(n_chunks);
    let mut st = zero_states();
    for t in 0..t_len {
        if t % chunk == 0 {
            ckpt.push(st.clone());
        }
        cx.merge(&mut st, t);
        cx.step(&mut st, t);
    }
    let mut out = GdnGrads {
        dq: Mat::zeros(t_len, dk),
        dk: Mat::zeros(t_len, dk),
        dv: Mat::zeros(t_len, dv),
        dg: vec![F::zero(); t_len],
        dbeta: vec![F::zero(); t_len],
        dlam: Mat::zeros(t_len, if lifted { nl } else { 0 }),
    };
    let mut ds = zero_states();
    for ci in (0..n_chunks).rev() {
        let i0 = ci * chunk;
        let n = chunk.min(t_len - i0);
        // Per token of the chunk: the merged states (before the transition).
        let mut merged = Vec::with_capacity(n);
        let mut st = ckpt[ci].clone();
        for t in i0..i0 + n {
            cx.merge(&mut st, t);
            merged.push(st.clone());
            cx.step(&mut st, t);
        }
        for r in (0..n).rev() {
            let t = i0 + r;
            let mut fin = merged[r].clone();
            cx.step(&mut fin, t);
            let (q, k, v, gy) = (hd.q.row(t), hd.k.row(t), hd.v.row(t), dy.row(t));
            let e = F::of(hd.g[t].exp());
            let b = hd.beta[t];
            // Read.
            for l in 0..nl {
                let lw = cx.lam(t, l);
                let s = &fin[l];
                let mut dl = F::zero();
                for i in 0..dv {
                    let sq = row_dot(&s[i * dk..(i + 1) * dk], (0..dk).map(|j| q[j]));
                    dl += gy[i] * sq;
                    let c = scale * lw * gy[i];
                    for j in 0..dk {
                        ds[l][i * dk + j] += c * q[j];
                        out.dq[(t, j)] += c * s[i * dk + j];
                    }
                }
                if lifted {
                    out.dlam[(t, l)] += scale * dl;
                }
            }
            // Insert (level 0): S⁽⁰⁾ += β v kᵀ.
            {
                let d0 = &ds[0];
                let mut vdk = F::zero();
                for i in 0..dv {
                    let dki = row_dot(&d0[i * dk..(i + 1) * dk], (0..dk).map(|j| k[j]));
                    out.dv[(t, i)] += b * dki;
                    vdk += v[i] * dki;
                    for j in 0..dk {
                        out.dk[(t, j)] += b * v[i] * d0[i * dk + j];
                    }
                }
                out.dbeta[t] += vdk;
            }
            // Transition, level by level.
            let mut dkt = vec![F::zero(); dk];
            for l in 0..nl {
                let (s, d) = (&merged[r][l], &mut ds[l]);
                let post = &fin[l];
                let mut gsum = F::zero();
                let mut bsum = F::zero();
                // S_postᵀ... accumulate Sᵀ(D k) and Dᵀ u over rows.
                for i in 0..dv {
                    let srow = &s[i * dk..(i + 1) * dk];
                    let drow = &d[i * dk..(i + 1) * dk];
                    let u = row_dot(srow, (0..dk).map(|j| k[j]));
                    let dkv = row_dot(drow, (0..dk).map(|j| k[j]));
                    let post_row = if l == 0 {
                        // fin includes the insert at level 0; the transition output excludes it.
                        None
                    } else {
                        Some(&post[i * dk..(i + 1) * dk])
                    };
                    gsum += match post_row {
                        Some(p) => row_dot(drow, p.iter().copied()),
                        None => (0..dk)
                            .map(|j| drow[j] * e * (srow[j] - b * u * k[j]))
                            .fold(F::zero(), |x, y| x + y),
                    };
                    bsum += u * dkv;
                    for j in 0..dk {
                        dkt[j] += srow[j] * dkv + drow[j] * u;
                    }
                }
                out.dg[t] += gsum;
                out.dbeta[t] -= e * bsum;
                // D ← e (D − β (D k) kᵀ).
                for i in 0..dv {
                    let drow = &mut d[i * dk..(i + 1) * dk];
                    let dkv = row_dot(drow, (0..dk).map(|j| k[j]));
                    for j in 0..dk {
                        drow[j] = e * (drow[j] - b * dkv * k[j]);
                    }
                }
            }
            for j in 0..dk {
                out.dk[(t, j)] -= b * e * dkt[j];
            }
            // Merge: levels 0..=m receive the adjoint of level m + 1.
            if lifted && t >= 1 {
                let mm = t.trailing_zeros() as usize;
                if mm + 1 < nl {
                    let (lo, hi) = ds.split_at_mut(mm + 1);
                    for s in lo.iter_mut() {
                        s.copy_from_slice(&hi[0]);
                    }
                }
            }
        }
    }
    Ok(out)
}
