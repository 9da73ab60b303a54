//! The log-linear family's fast backward on CPU, lifted (Fenwick) or not: reverse mode
//! through the chunk form of [`super::chunked`] (for gated DeltaNet its WY/UT form), with
//! matrix products per chunk. Cost `O(T (C (D_k + D_v) + C² + D_k D_v · #levels))` per head
//! like the forward (`C³` more per chunk with the delta rule), so `O(T)` for the base
//! mixers and `O(T log T)` for the lifts; memory: every chunk's pieces and its stacked start
//! states, `O(T (C + D) + (T/C) D_k D_v · #levels)`.
//!
//! A forward sweep ([`super::chunked::sweep`], the forward's own code) keeps, per chunk of
//! `n` tokens, the pieces `γ, Γ, P, Q̃, K̂` (and `KKᵀ⊙Γ, T⁻¹, W, Ũ` with the delta
//! rule) and the level states present at its start (after the merge), stacked as
//! `Z = [H^(e_1) | H^(e_2) | …]`. The reverse sweep runs over chunks from the last,
//! carrying `H̄^(e)`, the adjoints of the states after each chunk. Per chunk (written for
//! gated DeltaNet; without the delta rule `W = 0`, `Ũ = V`, `A = P`, and the
//! transition of linear attention has `e^(γ_{n−1}) = 1`):
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

use crate::vmath::VecMath;
use faer::{Accum, Mat, MatRef};
use mixer_core::Result;
use mixer_core::mixers::loglinear::LogLinear;

use super::chunked::{Chunk, Stacked, delta_intra, mm, own_state_factors, read_weights, sweep, visit_levels};
use super::common::Head;

/// One head's gradients: `dq, dk [T×Dk]`, `dv [T×Dv]`, `dg, dbeta [T]`, `dlam [T×L]`.
pub(crate) struct HeadGrads<F> {
    pub(crate) dq: Mat<F>,
    pub(crate) dk: Mat<F>,
    pub(crate) dv: Mat<F>,
    pub(crate) dg: Vec<f64>,
    pub(crate) dbeta: Vec<F>,
    pub(crate) dlam: Mat<F>,
}

impl<F: VecMath> HeadGrads<F> {
    /// Zero gradients of a head of `T` tokens with key width `Dk`, value width `Dv` and `L`
    /// levels of λ (0 for a base mixer).
    pub(crate) fn zeros(t_len: usize, dk: usize, dv: usize, nl: usize) -> Self {
        HeadGrads {
            dq: Mat::zeros(t_len, dk),
            dk: Mat::zeros(t_len, dk),
            dv: Mat::zeros(t_len, dv),
            dg: vec![0.0; t_len],
            dbeta: vec![F::zero(); t_len],
            dlam: Mat::zeros(t_len, nl),
        }
    }
}

/// The backward of one (batch, head); `dy` is `T×Dv`. A base mixer may run from the initial
/// state `h0` (`H_0 = S_0ᵀ`; `None`: zero), with `d_last` the cotangent of the final state `H_T`
/// (`None`: zero): the reverse sweep starts from `H̄_T = d_last` instead of zero, and the
/// adjoint of chunk 0's start state is `H̄_0`, returned as the second value (`D_k × D_v`; zero
/// without `h0`).
pub(crate) fn head_vjp_from<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    dy: MatRef<'_, F>,
    h0: Option<Mat<F>>,
    d_last: Option<Mat<F>>,
) -> Result<(HeadGrads<F>, Mat<F>)> {
    let (dk, dv) = (hd.q.ncols(), hd.v.ncols());
    let (out, d0) = head_vjp_levels(
        m,
        hd,
        dy,
        h0.into_iter().map(Some).collect(),
        0,
        d_last.into_iter().map(Some).collect(),
    )?;
    let d0 = d0.into_iter().next().flatten().unwrap_or_else(|| Mat::zeros(dk, dv));
    Ok((out, d0))
}

/// The backward of one (batch, head) run from the initial states `h0` at the absolute chunk
/// index `c0` ([`sweep`]), with `d_last[e]` the cotangent of the state `e` after the last chunk
/// (absent: zero): the gradients and the adjoints of the initial states (index `e`; `None`:
/// zero). The reverse sweep starts from `H̄^(e) = d_last[e]`; the adjoint of the merge before
/// chunk `i ≥ 1` copies the adjoint of level `m + 1` to the merged levels `0..=m`.
pub(crate) fn head_vjp_levels<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    dy: MatRef<'_, F>,
    h0: Vec<Option<Mat<F>>>,
    c0: usize,
    d_last: Vec<Option<Mat<F>>>,
) -> Result<(HeadGrads<F>, Vec<Option<Mat<F>>>)> {
    let t_len = hd.q.nrows();
    let (dk, dv) = (hd.q.ncols(), hd.v.ncols());
    let mut saved = Vec::with_capacity(t_len.div_ceil(m.chunk));
    let finals = sweep(m, hd, h0, c0, false, |_, ck, st| {
        saved.push((ck, st));
        Ok(())
    })?;
    let mut out = HeadGrads::zeros(t_len, dk, dv, hd.lam.as_ref().map_or(0, |l| l.ncols()));
    // Adjoints of the level states after the chunk being processed. A final state the
    // forward dropped (decayed below the smallest normal number) passes no adjoint.
    let mut after: Vec<Option<Mat<F>>> = d_last
        .into_iter()
        .enumerate()
        .map(|(e, d)| d.filter(|_| finals.get(e).is_some_and(Option::is_some)))
        .collect();
    for (ci, (ck, st)) in saved.into_iter().enumerate().rev() {
        let dz = chunk_vjp(m, hd, dy, &ck, &st, &after, &mut out)?;
        // Adjoints of the states before this chunk's merge (= after the previous chunk).
        let top = st.present.last().map_or(0, |&e| e + 1);
        let mut before: Vec<Option<Mat<F>>> = vec![None; top.max(1)];
        for (j, &e) in st.present.iter().enumerate() {
            before[e] = Some(dz.submatrix(0, j * dv, dk, dv).to_owned());
        }
        let merged =
            if ci > 0 { hd.lam.as_ref().and(mixer_core::fenwick::merge_level(c0 + ci)) } else { None };
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
    Ok((out, after))
}

fn dot<F: VecMath>(a: impl Iterator<Item = F>, b: impl Iterator<Item = F>) -> F {
    a.zip(b).fold(F::zero(), |acc, (x, y)| acc + x * y)
}

/// The adjoints of one chunk's pieces, while they are accumulated.
struct Adj<F> {
    /// `Q̃̄`.
    qt: Mat<F>,
    /// `K̂̄`.
    khat: Mat<F>,
    /// `P̄` (only its lower triangle with the diagonal is used).
    p: Mat<F>,
    /// `W̄` (gated DeltaNet).
    w: Mat<F>,
    /// `Ũ̄` (gated DeltaNet).
    u: Mat<F>,
    /// `T̄` (gated DeltaNet; only its strict lower triangle is used).
    t: Mat<F>,
    /// `(e^γ)̄`.
    eg: Vec<F>,
    /// `β̄` of the chunk's tokens.
    beta: Vec<F>,
    /// `(e^(γ_{n−1}))̄`.
    total: F,
    /// `Z̄`, the adjoint of the stacked start states.
    z: Mat<F>,
}

impl<F: VecMath> Adj<F> {
    /// Zero adjoints for a chunk of `n` tokens (`W̄, Ũ̄, T̄` empty without the delta rule) and
    /// `zcols` columns of stacked start states.
    fn zeros(n: usize, dk: usize, dv: usize, delta: bool, zcols: usize) -> Self {
        let (nd, nt) = if delta { (n, n) } else { (0, 0) };
        Adj {
            qt: Mat::zeros(n, dk),
            khat: Mat::zeros(n, dk),
            p: Mat::zeros(n, n),
            w: Mat::zeros(nd, dk),
            u: Mat::zeros(nd, dv),
            t: Mat::zeros(nt, nt),
            eg: vec![F::zero(); n],
            beta: vec![F::zero(); n],
            total: F::zero(),
            z: Mat::zeros(dk, zcols),
        }
    }
}

/// The adjoint of one chunk: accumulates the input gradients of its tokens into `out` and
/// returns `Z̄`, the adjoint of its stacked start states (`D_k × (D_v · #present)`).
/// `after[e]` is the adjoint of level `e` after the chunk (absent: zero).
fn chunk_vjp<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    dy: MatRef<'_, F>,
    ck: &Chunk<F>,
    st: &Stacked<F>,
    after: &[Option<Mat<F>>],
    out: &mut HeadGrads<F>,
) -> Result<Mat<F>> {
    let (n, dk, dv) = (ck.n, hd.q.ncols(), hd.v.ncols());
    let mut adj = Adj::zeros(n, dk, dv, ck.wy.is_some(), dv * st.present.len());
    states_vjp(hd, dy, ck, st, after, &mut adj, out);
    intra_vjp(m, hd, dy, ck, ck.i0, &mut adj, out)?;
    pieces_vjp(m, hd, ck, &mut adj, out);
    Ok(adj.z)
}

/// The adjoint of the reads, the transition and the insert of the chunk's own state.
fn states_vjp<F: VecMath>(
    hd: &Head<'_, F>,
    dy: MatRef<'_, F>,
    ck: &Chunk<F>,
    st: &Stacked<F>,
    after: &[Option<Mat<F>>],
    adj: &mut Adj<F>,
    out: &mut HeadGrads<F>,
) {
    let (i0, n, dk, dv) = (ck.i0, ck.n, hd.q.ncols(), hd.v.ncols());
    let np = st.present.len();
    if np > 0 {
        let weights: Vec<Vec<F>> = st.cols.iter().map(|&col| read_weights(hd, i0, n, col)).collect();
        let mut dzp = Mat::<F>::zeros(dk, dv * np);
        let mut any = false;
        for (j, &e) in st.present.iter().enumerate() {
            if let (true, Some(Some(d))) = (st.kept[j], after.get(e)) {
                dzp.submatrix_mut(0, j * dv, dk, dv).copy_from(d);
                any = true;
            }
        }
        held_vjp(hd, dy, ck, &st.zcat, |j, r| (weights[j][r], st.cols[j]), any.then_some(&dzp), adj, out);
    }
    // Own state at level 0: K̂ᵀ Ũ (K̂ᵀ V without the delta rule).
    if let Some(Some(dh0)) = after.first() {
        match &ck.wy {
            Some(wy) => {
                mm(adj.khat.as_mut(), Accum::Add, wy.u.as_ref(), dh0.transpose(), F::one());
                mm(adj.u.as_mut(), Accum::Add, ck.khat.as_ref(), dh0.as_ref(), F::one());
            }
            None => {
                mm(adj.khat.as_mut(), Accum::Add, hd.v.subrows(i0, n), dh0.transpose(), F::one());
                mm(out.dv.as_mut().subrows_mut(i0, n), Accum::Add, ck.khat.as_ref(), dh0.as_ref(), F::one());
            }
        }
    }
}

/// The adjoint of the reads and the transition of the states `Z = [H_1 | H_2 | …]` held at the
/// chunk's start (`D_k × (D_v · #held)`), into `adj` (`adj.z` replaced by `Z̄`) and `out`:
/// - **read** `y_r += w_j[r] (Q̃ Z_j)_r` with `(w_j[r], col) = read(j, r)`: `R̄_j = diag(w_j) Ȳ`,
///   `Q̃̄ += Σ_j R̄_j Z_jᵀ`, `Z̄_j = Q̃ᵀ R̄_j`, and `λ̄^(col)_r += ȳ_r · (Q̃ Z_j)_r` where `col` is
///   given (`None`: a weight that is no λ, as the base mixers' 1);
/// - **transition** `Z'_j = e^(γ_{n−1}) Z_j − K̂ᵀ W Z_j` with `Z̄'` = `dzp` (`None`: zero):
///   `Z̄ += e^(γ_{n−1}) Z̄' − Wᵀ K̂ Z̄'`, `K̂̄ −= W Z Z̄'ᵀ`, `W̄ −= K̂ Z̄' Zᵀ`,
///   `ē^(γ_{n−1}) += ⟨Z̄', Z⟩`.
#[allow(clippy::too_many_arguments)]
fn held_vjp<F: VecMath>(
    hd: &Head<'_, F>,
    dy: MatRef<'_, F>,
    ck: &Chunk<F>,
    zcat: &Mat<F>,
    read: impl Fn(usize, usize) -> (F, Option<usize>),
    dzp: Option<&Mat<F>>,
    adj: &mut Adj<F>,
    out: &mut HeadGrads<F>,
) {
    let (i0, n, dk, dv) = (ck.i0, ck.n, hd.q.ncols(), hd.v.ncols());
    let one = F::one();
    let gy = dy.subrows(i0, n);
    let np = zcat.ncols() / dv.max(1);
    if np == 0 {
        return;
    }
    // Read: y_r += w_j[r] (Q̃ Z_j)_r.
    let rc = hd.lam.as_ref().map(|_| {
        let mut r = Mat::<F>::zeros(n, dv * np);
        mm(r.as_mut(), Accum::Replace, ck.qt.as_ref(), zcat.as_ref(), one);
        r
    });
    let mut drc = Mat::<F>::zeros(n, dv * np);
    for j in 0..np {
        for r in 0..n {
            let (w, col) = read(j, r);
            for d in 0..dv {
                drc[(r, j * dv + d)] = w * gy[(r, d)];
            }
            if let (Some(l), Some(rc)) = (col, &rc) {
                out.dlam[(i0 + r, l)] +=
                    dot((0..dv).map(|d| gy[(r, d)]), (0..dv).map(|d| rc[(r, j * dv + d)]));
            }
        }
    }
    mm(adj.qt.as_mut(), Accum::Add, drc.as_ref(), zcat.transpose(), one);
    mm(adj.z.as_mut(), Accum::Replace, ck.qt.transpose(), drc.as_ref(), one);
    // Transition: Z' = e^(γ_{n−1}) Z − K̂ᵀ W Z (the last term with the delta rule only).
    let Some(dzp) = dzp else { return };
    for c in 0..adj.z.ncols() {
        for r in 0..dk {
            adj.z[(r, c)] += ck.total * dzp[(r, c)];
            adj.total += dzp[(r, c)] * zcat[(r, c)];
        }
    }
    if let Some(wy) = &ck.wy {
        let mut kd = Mat::<F>::zeros(n, dv * np);
        mm(kd.as_mut(), Accum::Replace, ck.khat.as_ref(), dzp.as_ref(), one);
        mm(adj.z.as_mut(), Accum::Add, wy.w.transpose(), kd.as_ref(), -one);
        mm(adj.w.as_mut(), Accum::Add, kd.as_ref(), zcat.transpose(), -one);
        let mut wz = Mat::<F>::zeros(n, dv * np);
        mm(wz.as_mut(), Accum::Replace, wy.w.as_ref(), zcat.as_ref(), one);
        mm(adj.khat.as_mut(), Accum::Add, wz.as_ref(), dzp.transpose(), -one);
    }
}

/// The adjoint of a partial chunk from token levels (docs/math.md §7.1, *its reverse mode*):
/// the chunk `ck` of `hd`'s rows `[i0, i0 + n)`, whose first token is at the absolute position
/// `at`, read the held states `Z = [H_1 | H_2 | …]` (`D_k × (D_v · #held)`) with the weight and
/// λ column `read(j, r)` per held state `j` and row `r`, transitioned them (`Z̄'` = `dzp`;
/// `None`: zero), and added the blocks `H_B = X_{:,B} diag(β_B) V_B` (`X = K̂ᵀ T⁻¹`, `X = K̂ᵀ`
/// and `β = 1` without the delta rule) of its tokens to the levels at its end, whose adjoints
/// are `blocks` (rows `B` local to the chunk, `H̄_B` `D_k × D_v`). The adjoint of the blocks is
/// `X̄_{:,B} = H̄_B (diag(β) V)_Bᵀ`, `(diag(β) V)̄_B = X_{:,B}ᵀ H̄_B`; then, with the delta rule,
/// `K̂̄ += T⁻¹ X̄ᵀ` and `T̄ −= Xᵀ X̄ T^(−ᵀ)` (from `dX = −X dT T⁻¹`), and
/// `β̄_s += v_s · (diag(β) V)̄_s`, `v̄_s += β_s (diag(β) V)̄_s`. The rest is the whole chunk's
/// ([`intra_vjp`] with the levels of the absolute positions, [`pieces_vjp`]). Accumulates the
/// gradients of the chunk's tokens into `out` and returns `Z̄`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn partial_chunk_vjp<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    dy: MatRef<'_, F>,
    ck: &Chunk<F>,
    at: usize,
    zcat: &Mat<F>,
    read: impl Fn(usize, usize) -> (F, Option<usize>),
    dzp: Option<&Mat<F>>,
    blocks: &[(std::ops::Range<usize>, Mat<F>)],
    out: &mut HeadGrads<F>,
) -> Result<Mat<F>> {
    let (i0, n, dk, dv) = (ck.i0, ck.n, hd.q.ncols(), hd.v.ncols());
    let one = F::one();
    let delta = ck.wy.is_some();
    let mut adj = Adj::zeros(n, dk, dv, delta, zcat.ncols());
    held_vjp(hd, dy, ck, zcat, read, dzp, &mut adj, out);
    if !blocks.is_empty() {
        let vc = hd.v.subrows(i0, n);
        let bs = |s: usize| if delta { hd.beta[i0 + s] } else { one };
        let (x, bv) = own_state_factors(hd, ck);
        let mut dx = Mat::<F>::zeros(dk, n);
        let mut dbv = Mat::<F>::zeros(n, dv);
        for (b, dh) in blocks {
            let (s0, len) = (b.start, b.len());
            mm(
                dx.as_mut().subcols_mut(s0, len),
                Accum::Add,
                dh.as_ref(),
                bv.subrows(s0, len).transpose(),
                one,
            );
            mm(
                dbv.as_mut().subrows_mut(s0, len),
                Accum::Add,
                x.subcols(s0, len).transpose(),
                dh.as_ref(),
                one,
            );
        }
        for s in 0..n {
            for d in 0..dv {
                out.dv[(i0 + s, d)] += bs(s) * dbv[(s, d)];
            }
        }
        match &ck.wy {
            Some(wy) => {
                for s in 0..n {
                    adj.beta[s] += dot((0..dv).map(|d| vc[(s, d)]), (0..dv).map(|d| dbv[(s, d)]));
                }
                // Z = X̄ T^(−ᵀ); K̂̄ += Zᵀ; T̄ −= Xᵀ Z.
                let mut zt = Mat::<F>::zeros(dk, n);
                mm(zt.as_mut(), Accum::Replace, dx.as_ref(), wy.tinv.transpose(), one);
                adj.khat += zt.transpose();
                mm(adj.t.as_mut(), Accum::Add, x.transpose(), zt.as_ref(), -one);
            }
            None => adj.khat += dx.transpose(),
        }
    }
    intra_vjp(m, hd, dy, ck, at, &mut adj, out)?;
    pieces_vjp(m, hd, ck, &mut adj, out);
    Ok(adj.z)
}

/// The adjoint of the intra-chunk part: `Y += P Ũ` (gated DeltaNet), `Y += P V`
/// (otherwise), or, lifted, `Y += (Λ ⊙ A) V` with `A = P T⁻¹ diag(β)` or `A = P`.
fn intra_vjp<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    dy: MatRef<'_, F>,
    ck: &Chunk<F>,
    at: usize,
    adj: &mut Adj<F>,
    out: &mut HeadGrads<F>,
) -> Result<()> {
    let (i0, n) = (ck.i0, ck.n);
    let one = F::one();
    let (vc, gy) = (hd.v.subrows(i0, n), dy.subrows(i0, n));
    let Some(lam) = &hd.lam else {
        let vals = ck.wy.as_ref().map_or(vc, |wy| wy.u.as_ref());
        mm(adj.p.as_mut(), Accum::Add, gy, vals.transpose(), one);
        let dvals = match &ck.wy {
            Some(_) => adj.u.as_mut(),
            None => out.dv.as_mut().subrows_mut(i0, n),
        };
        mm(dvals, Accum::Add, ck.p.transpose(), gy, one);
        return Ok(());
    };
    let beta = &hd.beta[i0..i0 + n];
    // A without β (P T⁻¹ or P), and Ā.
    let pt = ck.wy.as_ref().map(|wy| delta_intra(ck.p.as_ref(), wy));
    let a0 = pt.as_ref().unwrap_or(&ck.p);
    let bs = |s: usize| if pt.is_some() { beta[s] } else { one };
    let mut e = Mat::<F>::zeros(n, n);
    mm(e.as_mut(), Accum::Replace, gy, vc.transpose(), one);
    let mut la = Mat::<F>::zeros(n, n);
    let mut da = Mat::<F>::zeros(n, n);
    visit_levels(m, at, n, lam.ncols(), |r, s, l| {
        let a = a0[(r, s)] * bs(s);
        let lw = lam[(i0 + r, l)];
        out.dlam[(i0 + r, l)] += a * e[(r, s)];
        la[(r, s)] = lw * a;
        da[(r, s)] = lw * e[(r, s)];
    })?;
    mm(out.dv.as_mut().subrows_mut(i0, n), Accum::Add, la.transpose(), gy, one);
    match (&ck.wy, &pt) {
        (Some(wy), Some(pt)) => {
            // β̄_s += Σ_r (P T⁻¹)_{rs} Ā_{rs}; X = Ā diag(β) T^(−ᵀ); P̄ += X; T̄ −= (P T⁻¹)ᵀ X.
            for s in 0..n {
                for r in s..n {
                    adj.beta[s] += pt[(r, s)] * da[(r, s)];
                    da[(r, s)] *= beta[s];
                }
            }
            let mut x = Mat::<F>::zeros(n, n);
            mm(x.as_mut(), Accum::Replace, da.as_ref(), wy.tinv.transpose(), one);
            adj.p += &x;
            mm(adj.t.as_mut(), Accum::Add, pt.transpose(), x.as_ref(), -one);
        }
        _ => adj.p += &da,
    }
    Ok(())
}

/// The adjoint of the chunk's pieces (`Q̃`, `W`, `Ũ`, `T`, `P`, `K̂` and the decays)
/// with respect to the chunk's `q, k, v, g, β`, accumulated into `out`.
fn pieces_vjp<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    ck: &Chunk<F>,
    adj: &mut Adj<F>,
    out: &mut HeadGrads<F>,
) {
    let (i0, n, dk, dv) = (ck.i0, ck.n, hd.q.ncols(), hd.v.ncols());
    let (one, sigma) = (F::one(), F::of(m.scale));
    let (qc, kc, vc) = (hd.q.subrows(i0, n), hd.k.subrows(i0, n), hd.v.subrows(i0, n));
    let beta = &hd.beta[i0..i0 + n];
    let gamma = |r: usize, s: usize| ck.gamma.as_ref().map_or(one, |g| g[(r, s)]);
    let mut dgam = vec![0.0f64; n];
    // Q̃ = σ diag(e^γ) Q (− P W with the delta rule).
    for r in 0..n {
        for d in 0..dk {
            out.dq[(i0 + r, d)] += sigma * ck.eg[r] * adj.qt[(r, d)];
        }
        adj.eg[r] += sigma * dot((0..dk).map(|d| qc[(r, d)]), (0..dk).map(|d| adj.qt[(r, d)]));
    }
    if let Some(wy) = &ck.wy {
        mm(adj.p.as_mut(), Accum::Add, adj.qt.as_ref(), wy.w.transpose(), -one);
        mm(adj.w.as_mut(), Accum::Add, ck.p.transpose(), adj.qt.as_ref(), -one);
        // W = T⁻¹ diag(β e^γ) K, Ũ = T⁻¹ diag(β) V.
        let mut dbk = Mat::<F>::zeros(n, dk);
        mm(dbk.as_mut(), Accum::Replace, wy.tinv.transpose(), adj.w.as_ref(), one);
        let mut dbv = Mat::<F>::zeros(n, dv);
        mm(dbv.as_mut(), Accum::Replace, wy.tinv.transpose(), adj.u.as_ref(), one);
        mm(adj.t.as_mut(), Accum::Add, dbk.as_ref(), wy.w.transpose(), -one);
        mm(adj.t.as_mut(), Accum::Add, dbv.as_ref(), wy.u.transpose(), -one);
        for r in 0..n {
            let kb = dot((0..dk).map(|d| kc[(r, d)]), (0..dk).map(|d| dbk[(r, d)]));
            let vb = dot((0..dv).map(|d| vc[(r, d)]), (0..dv).map(|d| dbv[(r, d)]));
            adj.beta[r] += ck.eg[r] * kb + vb;
            adj.eg[r] += beta[r] * kb;
            for d in 0..dk {
                out.dk[(i0 + r, d)] += beta[r] * ck.eg[r] * dbk[(r, d)];
            }
            for d in 0..dv {
                out.dv[(i0 + r, d)] += beta[r] * dbv[(r, d)];
            }
        }
        // T = I + strict(diag(β)(KKᵀ ⊙ Γ)).
        let mut fk = Mat::<F>::zeros(n, n);
        for s in 0..n {
            for r in s + 1..n {
                let x = adj.t[(r, s)];
                let kg = wy.kg[(r, s)];
                adj.beta[r] += x * kg;
                let pg = (x * beta[r] * kg).f64();
                dgam[r] += pg;
                dgam[s] -= pg;
                fk[(r, s)] = x * beta[r] * gamma(r, s);
            }
        }
        let fs = &fk + fk.transpose();
        mm(out.dk.as_mut().subrows_mut(i0, n), Accum::Add, fs.as_ref(), kc, one);
    }
    // P = σ QKᵀ ⊙ Γ (lower with the diagonal, where Γ = 1).
    let mut zp = Mat::<F>::zeros(n, n);
    for s in 0..n {
        zp[(s, s)] = sigma * adj.p[(s, s)];
        for r in s + 1..n {
            let x = adj.p[(r, s)];
            let pg = (x * ck.p[(r, s)]).f64();
            dgam[r] += pg;
            dgam[s] -= pg;
            zp[(r, s)] = sigma * x * gamma(r, s);
        }
    }
    mm(out.dk.as_mut().subrows_mut(i0, n), Accum::Add, zp.transpose(), qc, one);
    mm(out.dq.as_mut().subrows_mut(i0, n), Accum::Add, zp.as_ref(), kc, one);
    // K̂ = diag(e^(γ_{n−1} − γ)) K, the decays e^γ and e^(γ_{n−1}).
    let mut dlast = (ck.total * adj.total).f64();
    for r in 0..n {
        let dtl = dot((0..dk).map(|d| kc[(r, d)]), (0..dk).map(|d| adj.khat[(r, d)]));
        for d in 0..dk {
            out.dk[(i0 + r, d)] += ck.tail[r] * adj.khat[(r, d)];
        }
        let x = (ck.tail[r] * dtl).f64();
        dlast += x;
        dgam[r] += (ck.eg[r] * adj.eg[r]).f64() - x;
    }
    dgam[n - 1] += dlast;
    // γ_r = Σ_{r' ≤ r} g_{i0 + r'}.
    let mut acc = 0.0;
    for r in (0..n).rev() {
        acc += dgam[r];
        out.dg[i0 + r] += acc;
        if let Some(b) = out.dbeta.get_mut(i0 + r) {
            *b += adj.beta[r];
        }
    }
}
