//! Gated DeltaNet's fast backward on CPU, lifted (Fenwick) or not: reverse mode through the
//! WY/UT chunk form of [`super::chunked`], with matrix products per chunk. Cost
//! `O(T (C (D_k + D_v) + C² + D_k D_v · #levels))` per head, like the forward; memory: every
//! chunk's pieces and its stacked start states, `O(T (C + D) + (T/C) D_k D_v · #levels)`.
//!
//! A forward sweep ([`super::chunked::sweep`], the forward's own code) keeps, per chunk of
//! `n` tokens, the pieces `γ, Γ, P, KKᵀ⊙Γ, T⁻¹, W, Ũ, Q̃, K̂` and the level states
//! present at its start (after the merge), stacked as `Z = [H^(e_1) | H^(e_2) | …]`. The
//! reverse sweep runs over chunks from the last, carrying `H̄^(e)`, the adjoints of the
//! states after each chunk, and per chunk (all products are matrix products):
//!
//! - **read** `y_r += w_j[r] (Q̃ Z_j)_r` (`w_j = λ^(c+e_j)`, or 1):
//!   `R̄_j = diag(w_j) Ȳ`, `Q̃̄ = Σ_j R̄_j Z_jᵀ`,
//!   `Z̄_j = Q̃ᵀ R̄_j`, `λ̄^(c+e_j)_r = ȳ_r · (Q̃ Z_j)_r`;
//! - **transition** `Z'_j = e^(γ_{n−1}) Z_j − K̂ᵀ W Z_j`, with `Z̄'_j = H̄^(e_j)`:
//!   `Z̄_j += e^(γ_{n−1}) Z̄'_j − Wᵀ K̂ Z̄'_j`,
//!   `K̂̄ −= Σ_j W Z_j Z̄'_jᵀ`, `W̄ −= Σ_j K̂ Z̄'_j Z_jᵀ`,
//!   `ē^(γ_{n−1}) += ⟨Z̄', Z⟩`;
//! - **own state** `H^(0) += K̂ᵀ Ũ`: `K̂̄ += Ũ H̄^(0)ᵀ`, `Ũ̄ += K̂ H̄^(0)`;
//! - **intra-chunk** `Y += P Ũ` (base): `P̄ += Ȳ Ũᵀ`, `Ũ̄ += Pᵀ Ȳ`; lifted,
//!   `Y += (Λ ⊙ A) V` with `A = P T⁻¹ diag(β)`: `Ā = Λ ⊙ Ȳ Vᵀ`,
//!   `λ̄_r^(ℓ(r,s)) += A_{rs} (Ȳ Vᵀ)_{rs}`, `V̄ += (Λ ⊙ A)ᵀ Ȳ`,
//!   `β̄_s += Σ_r (P T⁻¹)_{rs} Ā_{rs}`, and with `X = Ā diag(β) T^(−ᵀ)`:
//!   `P̄ += X`, `T̄ −= (P T⁻¹)ᵀ X`;
//! - **queries** `Q̃ = σ diag(e^γ) Q − P W`;
//! - **WY/UT** `W = T⁻¹ diag(β e^γ) K`, `Ũ = T⁻¹ diag(β) V`: with
//!   `B̄_k = T^(−ᵀ) W̄`, `B̄_v = T^(−ᵀ) Ũ̄`,
//!   `T̄ −= B̄_k Wᵀ + B̄_v Ũᵀ` (from `d T⁻¹ = −T⁻¹ dT T⁻¹`);
//! - **T** `= I + strict(diag(β)(KKᵀ ⊙ Γ))`: with `T̄` restricted to the strict lower
//!   triangle, `β̄_r += Σ_s T̄_{rs} (KKᵀ⊙Γ)_{rs}`, `K̄ += F K + Fᵀ K` for
//!   `F = T̄ ⊙ diag(β) Γ`, and `Γ̄ ⊙ Γ` goes to the log-decays;
//! - **P** `= σ QKᵀ ⊙ Γ`: `Q̄ += (σ P̄ ⊙ Γ) K`, `K̄ += (σ P̄ ⊙ Γ)ᵀ Q`;
//!
//! and the log-decays collect every `Γ_{rs} = e^(γ_r − γ_s)`, `e^(γ_r)`, `e^(γ_{n−1} − γ_r)`
//! and `e^(γ_{n−1})` as `γ̄`, then `ḡ_{i_0 + r} = Σ_{r' ≥ r} γ̄_{r'}` inside the chunk.
//! Between chunks, the adjoint of the merge (lifts) copies the adjoint of level `m + 1` to the
//! merged levels `0..=m`. A state the forward dropped (decayed below the smallest normal
//! number) passes no adjoint, as it passed no value.

use faer::{Accum, Mat, MatRef};
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Error, Real, Result};

use super::chunked::{Chunk, Stacked, Wy, delta_intra, mm, sweep, visit_levels};
use super::common::Head;

/// One head's gradients: `dq, dk [T×Dk]`, `dv [T×Dv]`, `dg, dbeta [T]`, `dlam [T×L]`.
pub(crate) struct GdnGrads<F> {
    pub(crate) dq: Mat<F>,
    pub(crate) dk: Mat<F>,
    pub(crate) dv: Mat<F>,
    pub(crate) dg: Vec<f64>,
    pub(crate) dbeta: Vec<F>,
    pub(crate) dlam: Mat<F>,
}

/// The backward of one (batch, head) of (loglinear-)gated-deltanet; `dy` is `T×Dv`.
pub(crate) fn head_vjp<F: Real>(m: &LogLinear, hd: &Head<'_, F>, dy: MatRef<'_, F>) -> Result<GdnGrads<F>> {
    let t_len = hd.q.nrows();
    let (dk, dv) = (hd.q.ncols(), hd.v.ncols());
    let mut saved = Vec::with_capacity(t_len.div_ceil(m.chunk));
    sweep(m, hd, |_, ck, st| {
        saved.push((ck, st));
        Ok(())
    })?;
    let mut out = GdnGrads {
        dq: Mat::zeros(t_len, dk),
        dk: Mat::zeros(t_len, dk),
        dv: Mat::zeros(t_len, dv),
        dg: vec![0.0; t_len],
        dbeta: vec![F::zero(); t_len],
        dlam: Mat::zeros(t_len, hd.lam.as_ref().map_or(0, |l| l.ncols())),
    };
    // Adjoints of the level states after the chunk being processed.
    let mut after: Vec<Option<Mat<F>>> = Vec::new();
    for (ci, (ck, st)) in saved.into_iter().enumerate().rev() {
        let dz = chunk_vjp(m, hd, dy, &ck, &st, &after, &mut out)?;
        // Adjoints of the states before this chunk's merge (= after the previous chunk).
        let top = st.present.last().map_or(0, |&e| e + 1);
        let mut before: Vec<Option<Mat<F>>> = vec![None; top.max(1)];
        for (j, &e) in st.present.iter().enumerate() {
            before[e] = Some(dz.submatrix(0, j * dv, dk, dv).to_owned());
        }
        let merged = hd.lam.as_ref().and(mixer_core::fenwick::merge_level(ci));
        if let Some(mg) = merged
            && let Some(Some(d)) = before.get(mg + 1)
        {
            let d = d.clone();
            for slot in &mut before[..=mg] {
                *slot = Some(d.clone());
            }
        }
        after = before;
    }
    Ok(out)
}

fn dot<F: Real>(a: impl Iterator<Item = F>, b: impl Iterator<Item = F>) -> F {
    a.zip(b).fold(F::zero(), |acc, (x, y)| acc + x * y)
}

/// The adjoint of one chunk: accumulates the input gradients of its tokens into `out` and
/// returns `Z̄`, the adjoint of its stacked start states (`D_k × (D_v · #present)`).
/// `after[e]` is the adjoint of level `e` after the chunk (absent: zero).
fn chunk_vjp<F: Real>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    dy: MatRef<'_, F>,
    ck: &Chunk<F>,
    st: &Stacked<F>,
    after: &[Option<Mat<F>>],
    out: &mut GdnGrads<F>,
) -> Result<Mat<F>> {
    let wy: &Wy<F> = ck.wy.as_ref().ok_or_else(|| Error::Backend {
        backend: "cpu".into(),
        family: Some("loglinear".into()),
        message: "the WY/UT backward was given a chunk without delta-rule pieces".into(),
    })?;
    let (i0, n) = (ck.i0, ck.n);
    let (dk, dv) = (hd.q.ncols(), hd.v.ncols());
    let (one, sigma) = (F::one(), F::of(m.scale));
    let (qc, kc, vc, gy) = (hd.q.subrows(i0, n), hd.k.subrows(i0, n), hd.v.subrows(i0, n), dy.subrows(i0, n));
    let beta = &hd.beta[i0..i0 + n];
    let gamma = |r: usize, s: usize| ck.gamma.as_ref().map_or(one, |g| g[(r, s)]);
    let mut dgam = vec![0.0f64; n];
    let mut deg = vec![F::zero(); n];
    let mut dbeta = vec![F::zero(); n];
    let mut dtotal = F::zero();
    let mut dqt = Mat::<F>::zeros(n, dk);
    let mut dkhat = Mat::<F>::zeros(n, dk);
    let mut dw = Mat::<F>::zeros(n, dk);
    let mut du = Mat::<F>::zeros(n, dv);
    let mut dp = Mat::<F>::zeros(n, n);
    let mut dt = Mat::<F>::zeros(n, n);
    let np = st.present.len();
    let mut dz = Mat::<F>::zeros(dk, dv * np);
    if np > 0 {
        // Read.
        let rc = hd.lam.as_ref().map(|_| {
            let mut r = Mat::<F>::zeros(n, dv * np);
            mm(r.as_mut(), Accum::Replace, ck.qt.as_ref(), st.zcat.as_ref(), one);
            r
        });
        let mut drc = Mat::<F>::zeros(n, dv * np);
        for (j, col) in st.cols.iter().enumerate() {
            for r in 0..n {
                let w = match (col, &hd.lam) {
                    (Some(l), Some(lam)) => lam[(i0 + r, *l)],
                    _ => one,
                };
                for d in 0..dv {
                    drc[(r, j * dv + d)] = w * gy[(r, d)];
                }
                if let (Some(l), Some(rc)) = (col, &rc) {
                    out.dlam[(i0 + r, *l)] +=
                        dot((0..dv).map(|d| gy[(r, d)]), (0..dv).map(|d| rc[(r, j * dv + d)]));
                }
            }
        }
        mm(dqt.as_mut(), Accum::Add, drc.as_ref(), st.zcat.transpose(), one);
        mm(dz.as_mut(), Accum::Replace, ck.qt.transpose(), drc.as_ref(), one);
        // Transition.
        let mut dzp = Mat::<F>::zeros(dk, dv * np);
        let mut any = false;
        for (j, &e) in st.present.iter().enumerate() {
            if let (true, Some(Some(d))) = (st.kept[j], after.get(e)) {
                dzp.submatrix_mut(0, j * dv, dk, dv).copy_from(d);
                any = true;
            }
        }
        if any {
            for c in 0..dz.ncols() {
                for r in 0..dk {
                    dz[(r, c)] += ck.total * dzp[(r, c)];
                    dtotal += dzp[(r, c)] * st.zcat[(r, c)];
                }
            }
            let mut kd = Mat::<F>::zeros(n, dv * np);
            mm(kd.as_mut(), Accum::Replace, ck.khat.as_ref(), dzp.as_ref(), one);
            mm(dz.as_mut(), Accum::Add, wy.w.transpose(), kd.as_ref(), -one);
            mm(dw.as_mut(), Accum::Add, kd.as_ref(), st.zcat.transpose(), -one);
            let mut wz = Mat::<F>::zeros(n, dv * np);
            mm(wz.as_mut(), Accum::Replace, wy.w.as_ref(), st.zcat.as_ref(), one);
            mm(dkhat.as_mut(), Accum::Add, wz.as_ref(), dzp.transpose(), -one);
        }
    }
    // Own state at level 0.
    if let Some(Some(dh0)) = after.first() {
        mm(dkhat.as_mut(), Accum::Add, wy.u.as_ref(), dh0.transpose(), one);
        mm(du.as_mut(), Accum::Add, ck.khat.as_ref(), dh0.as_ref(), one);
    }
    // Intra-chunk part.
    match &hd.lam {
        None => {
            mm(dp.as_mut(), Accum::Add, gy, wy.u.transpose(), one);
            mm(du.as_mut(), Accum::Add, ck.p.transpose(), gy, one);
        }
        Some(lam) => {
            let pt = delta_intra(ck, wy);
            let mut e = Mat::<F>::zeros(n, n);
            mm(e.as_mut(), Accum::Replace, gy, vc.transpose(), one);
            let mut la = Mat::<F>::zeros(n, n);
            let mut dab = Mat::<F>::zeros(n, n);
            visit_levels(m, i0, n, lam.ncols(), |r, s, l| {
                let a = pt[(r, s)] * beta[s];
                let lw = lam[(i0 + r, l)];
                out.dlam[(i0 + r, l)] += a * e[(r, s)];
                la[(r, s)] = lw * a;
                let da = lw * e[(r, s)];
                dbeta[s] += pt[(r, s)] * da;
                dab[(r, s)] = da * beta[s];
            })?;
            mm(out.dv.as_mut().subrows_mut(i0, n), Accum::Add, la.transpose(), gy, one);
            let mut x = Mat::<F>::zeros(n, n);
            mm(x.as_mut(), Accum::Replace, dab.as_ref(), wy.tinv.transpose(), one);
            dp += &x;
            mm(dt.as_mut(), Accum::Add, pt.transpose(), x.as_ref(), -one);
        }
    }
    // Q̃ = σ diag(e^γ) Q − P W.
    for r in 0..n {
        for d in 0..dk {
            out.dq[(i0 + r, d)] += sigma * ck.eg[r] * dqt[(r, d)];
        }
        deg[r] += sigma * dot((0..dk).map(|d| qc[(r, d)]), (0..dk).map(|d| dqt[(r, d)]));
    }
    mm(dp.as_mut(), Accum::Add, dqt.as_ref(), wy.w.transpose(), -one);
    mm(dw.as_mut(), Accum::Add, ck.p.transpose(), dqt.as_ref(), -one);
    // W = T⁻¹ diag(β e^γ) K, Ũ = T⁻¹ diag(β) V.
    let mut dbk = Mat::<F>::zeros(n, dk);
    mm(dbk.as_mut(), Accum::Replace, wy.tinv.transpose(), dw.as_ref(), one);
    let mut dbv = Mat::<F>::zeros(n, dv);
    mm(dbv.as_mut(), Accum::Replace, wy.tinv.transpose(), du.as_ref(), one);
    mm(dt.as_mut(), Accum::Add, dbk.as_ref(), wy.w.transpose(), -one);
    mm(dt.as_mut(), Accum::Add, dbv.as_ref(), wy.u.transpose(), -one);
    for r in 0..n {
        let kb = dot((0..dk).map(|d| kc[(r, d)]), (0..dk).map(|d| dbk[(r, d)]));
        let vb = dot((0..dv).map(|d| vc[(r, d)]), (0..dv).map(|d| dbv[(r, d)]));
        dbeta[r] += ck.eg[r] * kb + vb;
        deg[r] += beta[r] * kb;
        for d in 0..dk {
            out.dk[(i0 + r, d)] += beta[r] * ck.eg[r] * dbk[(r, d)];
        }
        for d in 0..dv {
            out.dv[(i0 + r, d)] += beta[r] * dbv[(r, d)];
        }
    }
    // T = I + strict(diag(β)(KKᵀ ⊙ Γ)) and P = σ QKᵀ ⊙ Γ.
    let mut fk = Mat::<F>::zeros(n, n);
    let mut zp = Mat::<F>::zeros(n, n);
    for s in 0..n {
        // On the diagonal Γ = 1: no log-decay gradient.
        zp[(s, s)] = sigma * dp[(s, s)];
        for r in s + 1..n {
            let x = dt[(r, s)];
            let kg = wy.kg[(r, s)];
            dbeta[r] += x * kg;
            let pg = (x * beta[r] * kg + dp[(r, s)] * ck.p[(r, s)]).f64();
            dgam[r] += pg;
            dgam[s] -= pg;
            let gm = gamma(r, s);
            fk[(r, s)] = x * beta[r] * gm;
            zp[(r, s)] = sigma * dp[(r, s)] * gm;
        }
    }
    let fs = &fk + fk.transpose();
    mm(out.dk.as_mut().subrows_mut(i0, n), Accum::Add, fs.as_ref(), kc, one);
    mm(out.dk.as_mut().subrows_mut(i0, n), Accum::Add, zp.transpose(), qc, one);
    mm(out.dq.as_mut().subrows_mut(i0, n), Accum::Add, zp.as_ref(), kc, one);
    // K̂ = diag(e^(γ_{n−1} − γ)) K, the decays e^γ and e^(γ_{n−1}).
    let mut dlast = (ck.total * dtotal).f64();
    for r in 0..n {
        let dtl = dot((0..dk).map(|d| kc[(r, d)]), (0..dk).map(|d| dkhat[(r, d)]));
        for d in 0..dk {
            out.dk[(i0 + r, d)] += ck.tail[r] * dkhat[(r, d)];
        }
        let x = (ck.tail[r] * dtl).f64();
        dlast += x;
        dgam[r] += (ck.eg[r] * deg[r]).f64() - x;
    }
    dgam[n - 1] += dlast;
    // γ_r = Σ_{r' ≤ r} g_{i0 + r'}.
    let mut acc = 0.0;
    for r in (0..n).rev() {
        acc += dgam[r];
        out.dg[i0 + r] += acc;
        out.dbeta[i0 + r] += dbeta[r];
    }
    Ok(dz)
}
