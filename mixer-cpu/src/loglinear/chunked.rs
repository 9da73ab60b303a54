//! The chunked form (docs/math.md §2.6): O(T log T) for the lifts, O(T) for the base mixers.
//!
//! Chunks of size `C = 2^c` (the last one may be partial). States are kept as
//! `H = Sᵀ ∈ ℝ^(D_k × D_v)`, so a read is `y_tᵀ = q_tᵀ H`.
//!
//! **Inside chunk** `i` (positions `i_0 … i_0+n−1`), with chunk-local log-decay sums
//! `γ_r = Σ_{r' ≤ r} g_{i_0+r'}` (in `f64`) and the masked
//! `Γ_{r,s} = e^(γ_r − γ_s)` for `s ≤ r` (zero above the diagonal, taken
//! before exponentiating), `P = σ QKᵀ ⊙ Γ`:
//! - linear attention / Mamba-2: intra output `(P ⊙ M^H) V`; effective queries
//!   `Q̃ = σ diag(e^γ) Q`; chunk state
//!   `K̂ᵀ V` with `K̂ = diag(e^(γ_{n−1}−γ))K`; transition
//!   `H ↦ e^(γ_{n−1}) H`.
//! - gated DeltaNet (WY/UT form): `T⁻¹ = (I + strict(diag(β)
//!  (KKᵀ ⊙ Γ)))⁻¹` by a unit-lower triangular solve,
//!   `W = T⁻¹diag(β e^γ)K`, `Ũ = T⁻¹diag(β)V`. Then the
//!   intra output is `(M^H ⊙ P T⁻¹diag(β))V` (just `PŨ` unlifted),
//!   `Q̃ = σ diag(e^γ)Q − PW` (a query carried through the chunk's
//!   transitions), the chunk's own state is `K̂ᵀ Ũ`, and the chunk transition
//!   `Φ = e^(γ_{n−1}) I − K̂ᵀ W` acts on **every** level's state:
//!   `H ↦ e^(γ_{n−1}) H − K̂ᵀ (W H)`.
//!
//! **Between chunks** the chunk-granular Fenwick recurrence of §2.5 runs over chunk
//! indices: before chunk `i ≥ 1`, with `m = ctz(i)`, chunk-level states
//! `0..m` merge into level `m+1`; then chunk-level state `e ≥ 1` holds exactly the chunks
//! `j` with `bitlen(i ⊕ j) = e`, i.e. token level `c + e`, read as
//! `y_r += λ_{i_0+r}^(c+e) (Q̃ H^(e))_r`; then every state takes the
//! chunk transition and the chunk's own state is inserted at level 0. The base mixers keep
//! one state (single level, weight 1). Present states are stacked side by side so each read
//! and each transition is one matmul.
//!
//! The pieces of a chunk (`chunk_pieces`) and the state recurrence (`sweep`) are shared
//! with the backward pass (`backward_chunked`), which differentiates them.

use faer::linalg::matmul::matmul;
use faer::linalg::triangular_solve::solve_unit_lower_triangular_in_place;
use faer::{Accum, Mat, MatMut, MatRef, Par};
use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::{Error, Result};
use multiversion::multiversion;

use crate::vmath::VecMath;

use super::common::Head;
use super::parallel::col_mut;

/// `dst (+)= a b` sequentially.
pub(crate) fn mm<F: VecMath>(
    dst: faer::MatMut<'_, F>,
    acc: Accum,
    a: MatRef<'_, F>,
    b: MatRef<'_, F>,
    alpha: F,
) {
    matmul(dst, acc, a, b, alpha, Par::Seq);
}

/// The delta-rule pieces of one chunk (gated DeltaNet).
pub(crate) struct Wy<F> {
    /// `KKᵀ ⊙ Γ`, strictly lower (zero on and above the diagonal).
    pub kg: Mat<F>,
    /// `T⁻¹ = (I + diag(β) (KKᵀ ⊙ Γ))⁻¹` (unit lower triangular).
    pub tinv: Mat<F>,
    /// `W = T⁻¹ diag(β e^γ) K`.
    pub w: Mat<F>,
    /// `Ũ = T⁻¹ diag(β) V`.
    pub u: Mat<F>,
}

/// What one chunk contributes, computed from its inputs alone (see the module documentation).
pub(crate) struct Chunk<F> {
    /// First position.
    pub i0: usize,
    /// Length (the last chunk may be partial).
    pub n: usize,
    /// `e^(γ_r)`.
    pub eg: Vec<F>,
    /// `e^(γ_{n−1} − γ_r)`.
    pub tail: Vec<F>,
    /// `e^(γ_{n−1})`.
    pub total: F,
    /// `Γ` (lower with diagonal), when the base has a decay.
    pub gamma: Option<Mat<F>>,
    /// `P = σ QKᵀ ⊙ Γ` (lower with diagonal).
    pub p: Mat<F>,
    /// The effective queries `Q̃`.
    pub qt: Mat<F>,
    /// The chunk-state keys `K̂ = diag(e^(γ_{n−1} − γ)) K`.
    pub khat: Mat<F>,
    /// The delta-rule pieces (gated DeltaNet only).
    pub wy: Option<Wy<F>>,
}

/// The pieces of the chunk `[i0, i0 + n)` of one head.
pub(crate) fn chunk_pieces<F: VecMath>(m: &LogLinear, hd: &Head<'_, F>, i0: usize, n: usize) -> Chunk<F> {
    let (dk, dv) = (hd.q.ncols(), hd.v.ncols());
    let scale = F::of(m.scale);
    let (qc, kc, vc) = (hd.q.subrows(i0, n), hd.k.subrows(i0, n), hd.v.subrows(i0, n));
    // Chunk-local log-decay sums and the factors built from them (masked, ≤ 0 exponents).
    let mut gam = vec![0.0f64; n];
    let mut acc = 0.0f64;
    for r in 0..n {
        acc += hd.g[i0 + r];
        gam[r] = acc;
    }
    let last = gam[n - 1];
    let (mut eg, mut tail) = (vec![F::zero(); n], vec![F::zero(); n]);
    exps_into(&mut eg, &gam, 0.0, false);
    exps_into(&mut tail, &gam, last, true);
    let total = F::of(last.exp());

    // P = σ QKᵀ ⊙ Γ, lower with diagonal.
    let mut p = Mat::<F>::zeros(n, n);
    mm(p.as_mut(), Accum::Replace, qc, kc.transpose(), scale);
    let gamma = m.base.has_decay().then(|| decay_matrix::<F>(&gam));
    mask_decay(&mut p, gamma.as_ref(), true);

    let mut qt = Mat::<F>::from_fn(n, dk, |r, d| scale * eg[r] * qc[(r, d)]);
    let khat = Mat::<F>::from_fn(n, dk, |r, d| tail[r] * kc[(r, d)]);
    let wy = (m.base == Base::GatedDeltaNet).then(|| {
        let mut kg = Mat::<F>::zeros(n, n);
        mm(kg.as_mut(), Accum::Replace, kc, kc.transpose(), F::one());
        mask_decay(&mut kg, gamma.as_ref(), false);
        let lm = Mat::<F>::from_fn(n, n, |r, s| hd.beta[i0 + r] * kg[(r, s)]);
        let mut tinv = Mat::<F>::identity(n, n);
        solve_unit_lower_triangular_in_place(lm.as_ref(), tinv.as_mut(), Par::Seq);
        let bek = Mat::<F>::from_fn(n, dk, |r, d| hd.beta[i0 + r] * eg[r] * kc[(r, d)]);
        let bv = Mat::<F>::from_fn(n, dv, |r, d| hd.beta[i0 + r] * vc[(r, d)]);
        let mut w = Mat::<F>::zeros(n, dk);
        mm(w.as_mut(), Accum::Replace, tinv.as_ref(), bek.as_ref(), F::one());
        let mut u = Mat::<F>::zeros(n, dv);
        mm(u.as_mut(), Accum::Replace, tinv.as_ref(), bv.as_ref(), F::one());
        // Q̃ = σ diag(e^γ) Q − P W.
        mm(qt.as_mut(), Accum::Add, p.as_ref(), w.as_ref(), -F::one());
        Wy { kg, tinv, w, u }
    });
    Chunk { i0, n, eg, tail, total, gamma, p, qt, khat, wy }
}

/// The factors of the chunk's own state by token, `K̂ᵀ Ũ = X diag(β) V`: `X = K̂ᵀ T⁻¹`
/// (`D_k × n`; `K̂ᵀ` without the delta rule) and `diag(β) V` (`n × D_v`; `β = 1` without it).
/// Token `s` adds `X_{:,s} β_s v_sᵀ` (docs/math.md §7.1, a partial chunk's levels at its end).
pub(crate) fn own_state_factors<F: VecMath>(hd: &Head<'_, F>, ck: &Chunk<F>) -> (Mat<F>, Mat<F>) {
    let x = match &ck.wy {
        Some(wy) => {
            let mut x = Mat::<F>::zeros(ck.khat.ncols(), ck.n);
            mm(x.as_mut(), Accum::Replace, ck.khat.transpose(), wy.tinv.as_ref(), F::one());
            x
        }
        None => ck.khat.transpose().to_owned(),
    };
    let bv = Mat::<F>::from_fn(ck.n, hd.v.ncols(), |s, d| hd.beta[ck.i0 + s] * hd.v[(ck.i0 + s, d)]);
    (x, bv)
}

/// `P T⁻¹` (gated DeltaNet): the intra-chunk coefficients are `A = P T⁻¹ diag(β)`.
pub(crate) fn delta_intra<F: VecMath>(p: MatRef<'_, F>, wy: &Wy<F>) -> Mat<F> {
    let mut a = Mat::<F>::zeros(p.nrows(), p.ncols());
    mm(a.as_mut(), Accum::Replace, p, wy.tinv.as_ref(), F::one());
    a
}

/// Calls `f(r, s, l)` for every pair `s ≤ r` of the chunk, with `l = ℓ(i0 + r, i0 + s)`,
/// column by column; an error when `l` is beyond the `n_levels` given λ levels.
pub(crate) fn visit_levels(
    m: &LogLinear,
    i0: usize,
    n: usize,
    n_levels: usize,
    mut f: impl FnMut(usize, usize, usize),
) -> Result<()> {
    for s in 0..n {
        for r in s..n {
            f(r, s, m.level_checked(i0 + r, i0 + s, n_levels)?);
        }
    }
    Ok(())
}

/// `a_{r,s} ← λ^(ℓ)_{i0+r} Γ_{r,s} a_{r,s}` for every pair `s ≤ r` of the rows `[i0, i0 + n)`
/// of `lam` (`a` lower triangular, `ℓ = ℓ(at + r, at + s)` with `at` the absolute position of
/// row `i0`, `lam` the `T × L` weights, `Γ` the `n × n` decay when given, else 1); entries above
/// the diagonal are left as they are. An error when a level is beyond the given λ levels.
///
/// With the Fenwick mask, `ℓ(at + r, at + s) = bitlen((at + r) ⊕ (at + s))`: in column `s`
/// (absolute `σ = at + s`), level 0 is the diagonal, and level `l ≥ 1` is present when bit
/// `l − 1` of `σ` is clear, as the rows whose absolute positions lie in
/// `⌊σ/2^l⌋·2^l + 2^(l−1) … ⌊σ/2^l⌋·2^l + 2^l − 1` (cut to the `n` rows), so each column is
/// scaled by at most `bitlen((at + n − 1) ⊕ at) + 1` contiguous runs of λ's columns (read once
/// per call, level-major). A chunk of the chunked form starts at a multiple of `2^c ≥ n`, where
/// this is `bitlen(r ⊕ s)`; a lift's head from a state starts anywhere
/// ([`super::lift_state`]). Other masks go pair by pair through [`visit_levels`].
pub(crate) fn scale_by_levels<F: VecMath>(
    m: &LogLinear,
    mut a: MatMut<'_, F>,
    lam: MatRef<'_, F>,
    i0: usize,
    n: usize,
    at: usize,
    gamma: Option<MatRef<'_, F>>,
) -> Result<()> {
    let n_levels = lam.ncols();
    let top = mixer_core::fenwick::bitlen((at + n.saturating_sub(1)) ^ at);
    if !m.lift.is_some_and(|l| l.mask.is_fenwick()) || top >= n_levels {
        return visit_levels(m, at, n, n_levels, |r, s, l| {
            a[(r, s)] *= lam[(i0 + r, l)] * gamma.map_or(F::one(), |g| g[(r, s)]);
        });
    }
    // lt[l·n + r] = λ^(l)_{i0+r}.
    let mut lt = vec![F::zero(); (top + 1) * n];
    for r in 0..n {
        for l in 0..=top {
            lt[l * n + r] = lam[(i0 + r, l)];
        }
    }
    let unit = "unit row stride";
    for s in 0..n {
        let col = a.as_mut().col_mut(s).try_as_col_major_mut().expect(unit).as_slice_mut();
        let gcol = gamma.map(|g| g.col(s).try_as_col_major().expect(unit).as_slice());
        col[s] *= lt[s] * gcol.map_or(F::one(), |g| g[s]);
        let sigma = at + s;
        for l in 1..=top {
            let half = 1usize << (l - 1);
            if sigma & half != 0 {
                continue;
            }
            // The rows after s (bit l − 1 of σ is clear, so the start lies past σ ≥ at).
            let lo = (sigma >> l << l) + half - at;
            if lo >= n {
                continue;
            }
            let rows = lo..(lo + half).min(n);
            let w = &lt[l * n + rows.start..l * n + rows.end];
            match gcol {
                Some(g) => col[rows.clone()]
                    .iter_mut()
                    .zip(w.iter().zip(&g[rows]))
                    .for_each(|(x, (&lw, &gm))| *x *= lw * gm),
                None => col[rows].iter_mut().zip(w).for_each(|(x, &lw)| *x *= lw),
            }
        }
    }
    Ok(())
}

/// The level states present at a chunk's start (after the merge), stacked side by side.
pub(crate) struct Stacked<F> {
    /// The chunk levels `e` present, increasing.
    pub present: Vec<usize>,
    /// The λ column that reads each present level (`c + e`; `None` for the base mixers).
    pub cols: Vec<Option<usize>>,
    /// `[H^(e_1) | H^(e_2) | …]`, `D_k × (D_v · #present)`.
    pub zcat: Mat<F>,
    /// Whether each present level survived its transition (a state that decays below the
    /// smallest normal number is dropped).
    pub kept: Vec<bool>,
    /// The read `Q̃ Z` (`n × (D_v · #present)`), when the sweep was asked for it and formed it
    /// in one product with the transition (see [`transition`]).
    pub read: Option<Mat<F>>,
}

/// The weights `λ^(l)_{i0+r}` of the rows of the chunk `[i0, i0 + n)` for the read of λ
/// column `col` (ones for the base mixers, `col = None`).
pub(crate) fn read_weights<F: VecMath>(hd: &Head<'_, F>, i0: usize, n: usize, col: Option<usize>) -> Vec<F> {
    match (col, &hd.lam) {
        (Some(l), Some(lam)) => (0..n).map(|r| lam[(i0 + r, l)]).collect(),
        _ => vec![F::one(); n],
    }
}

/// The λ column that reads chunk level `e` at chunk `ci` (`c + e`), or the error when λ
/// has too few levels.
pub(crate) fn read_col(cbits: usize, e: usize, n_levels: usize, ci: usize) -> Result<usize> {
    let l = cbits + e;
    if l >= n_levels {
        return Err(Error::Value {
            name: "lambda".into(),
            constraint: format!("chunk {ci} reads level {l}, so λ needs more than {l} levels"),
            found: format!("L = {n_levels}"),
        });
    }
    Ok(l)
}

/// The state transition through a chunk, on stacked states:
/// `H ↦ e^(γ_{n−1}) H − K̂ᵀ (W H)` (gated DeltaNet), `H ↦ e^(γ_{n−1}) H` (Mamba-2),
/// `H ↦ H` (linear attention). Returns a matrix whose rows `off .. off + D_k` hold the new
/// stacked states, and `off`.
///
/// For gated DeltaNet with `N` stacked columns, the transition matrix
/// `Φ = e^(γ_{n−1}) I − K̂ᵀ W` (`D_k × D_k`, `n·D_k²` multiply-adds) is formed first and
/// applied as one product `Φ Z` (`D_k²·N`) when that is cheaper than the two products
/// `K̂ᵀ (W Z)` (`2·n·D_k·N`), i.e. when several level states are stacked. With `read`, the
/// queries are stacked on top of `Φ` so that the same product also gives the read
/// `Q̃ Z` in rows `0 .. off = n` (one wide product instead of two).
pub(crate) fn transition<F: VecMath>(
    ck: &Chunk<F>,
    base: Base,
    zcat: &Mat<F>,
    read: bool,
) -> (Mat<F>, usize) {
    let total = if base.has_decay() { ck.total } else { F::one() };
    let Some(wy) = &ck.wy else {
        return (zcat * faer::Scale(total), 0);
    };
    let (dk, cols) = (zcat.nrows(), zcat.ncols());
    if dk * (ck.n + cols) < 2 * ck.n * cols {
        let off = if read { ck.n } else { 0 };
        let mut lhs = Mat::<F>::zeros(off + dk, dk);
        if read {
            lhs.as_mut().subrows_mut(0, off).copy_from(&ck.qt);
        }
        let mut phi = lhs.as_mut().subrows_mut(off, dk);
        phi.as_mut().diagonal_mut().column_vector_mut().iter_mut().for_each(|x| *x = total);
        mm(phi, Accum::Add, ck.khat.transpose(), wy.w.as_ref(), -F::one());
        let mut out = Mat::<F>::zeros(off + dk, cols);
        mm(out.as_mut(), Accum::Replace, lhs.as_ref(), zcat.as_ref(), F::one());
        return (out, off);
    }
    let mut out = zcat * faer::Scale(total);
    let mut wz = Mat::<F>::zeros(ck.n, cols);
    mm(wz.as_mut(), Accum::Replace, wy.w.as_ref(), zcat.as_ref(), F::one());
    mm(out.as_mut(), Accum::Add, ck.khat.transpose(), wz.as_ref(), -F::one());
    (out, 0)
}

/// Whether every entry of `h` is zero.
fn is_zero<F: VecMath>(h: MatRef<'_, F>) -> bool {
    (0..h.ncols()).all(|c| h.col(c).iter().all(|&x| x == F::zero()))
}

/// Sets the entries of a decayed state whose magnitude is below the smallest normal number
/// to zero; returns whether a non-zero entry is left. Such an entry contributes less than
/// `F`'s resolution to any output of normal size, and products with subnormal operands or
/// results are very slow on most CPUs (a microcode assist per operation); without the flush
/// the high Fenwick levels of the lifted mixers, whose states decay for many chunks, pass
/// through the subnormal range in every product.
pub(crate) fn flush_subnormals<F: VecMath>(h: MatMut<'_, F>) -> bool {
    scale_and_flush(h, F::one())
}

/// `h ← s·h`, then [`flush_subnormals`] (one pass): branch-free per column, the test for a
/// non-zero entry kept in sixteen lanes, so that it vectorises (built for AVX-512, AVX2 and
/// NEON, chosen at run time).
#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn scale_and_flush<F: VecMath>(mut h: MatMut<'_, F>, s: F) -> bool {
    const W: usize = 16;
    let tiny = F::min_positive_value();
    let mut big = [F::zero(); W];
    let step = |x: &mut F, b: &mut F| {
        let y = *x * s;
        let y = if y.abs() < tiny { F::zero() } else { y };
        *x = y;
        *b = if y.abs() > *b { y.abs() } else { *b };
    };
    for j in 0..h.ncols() {
        let mut col = h.as_mut().col_mut(j);
        match col.as_mut().try_as_col_major_mut() {
            Some(c) => {
                let mut chunks = c.as_slice_mut().chunks_exact_mut(W);
                for ch in &mut chunks {
                    for (x, b) in ch.iter_mut().zip(big.iter_mut()) {
                        step(x, b);
                    }
                }
                chunks.into_remainder().iter_mut().for_each(|x| step(x, &mut big[0]));
            }
            None => col.iter_mut().for_each(|x| step(x, &mut big[0])),
        }
    }
    big.iter().any(|&b| b != F::zero())
}

/// Runs the chunk recurrence of one head (module documentation) and hands every chunk's
/// pieces and its stacked start states to `visit`, in order. The states are advanced
/// before `visit` is called. With `read`, [`Stacked::read`] is filled where the transition
/// forms it at no extra cost (the forward asks for it, the backward does not).
/// `h0` holds the initial states (`H = Sᵀ`, `D_k × D_v`; empty: zero): the base mixers' one
/// state at index 0, or the lifts' chunk-level states `e` after the merge for the first chunk
/// (docs/math.md §7.1), whose absolute chunk index is `c0` (`hd`'s first row is token `c0·C`;
/// the merges before the later chunks use their absolute indices). The states after the last
/// chunk, before the next merge, are returned (index 0: the base mixers' final state; `None`
/// where a level is empty or decayed away).
pub(crate) fn sweep<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    h0: Vec<Option<Mat<F>>>,
    c0: usize,
    read: bool,
    mut visit: impl FnMut(usize, Chunk<F>, Stacked<F>) -> Result<()>,
) -> Result<Vec<Option<Mat<F>>>> {
    let t_len = hd.q.nrows();
    let (dk, dv) = (hd.q.ncols(), hd.v.ncols());
    let chunk = m.chunk;
    let cbits = m.chunk_log2() as usize;
    let lifted = hd.lam.is_some();
    let n_levels = hd.lam.as_ref().map_or(1, |l| l.ncols());
    // states[e]: chunk-level e (lifted), or the single state at index 0 (base mixers).
    let mut states = h0;
    for ci in 0..t_len.div_ceil(chunk) {
        let i0 = ci * chunk;
        let n = chunk.min(t_len - i0);
        let ck = chunk_pieces(m, hd, i0, n);
        // Chunk-granular Fenwick merge (lifted only): levels 0..=ctz(i) go to ctz(i)+1, for
        // the absolute chunk index i (the initial states are merged for chunk c0 already).
        if lifted && ci > 0 {
            mixer_core::fenwick::merge_states(&mut states, c0 + ci, |acc, s| acc + s);
        }
        let present: Vec<usize> = (0..states.len()).filter(|&e| states[e].is_some()).collect();
        let cols = present
            .iter()
            .map(|&e| lifted.then(|| read_col(cbits, e, n_levels, ci)).transpose())
            .collect::<Result<Vec<_>>>()?;
        let mut zcat = Mat::<F>::zeros(dk, dv * present.len());
        for (j, &e) in present.iter().enumerate() {
            if let Some(s) = &states[e] {
                zcat.submatrix_mut(0, j * dv, dk, dv).copy_from(s);
            }
        }
        let mut kept = Vec::with_capacity(present.len());
        let mut stacked_read = None;
        if !present.is_empty() {
            let (out, off) = transition(&ck, m.base, &zcat, read);
            if off > 0 {
                stacked_read = Some(out.subrows(0, off).to_owned());
            }
            let next = out.subrows(off, dk);
            // Entries that decayed below the smallest normal number are flushed to zero, and a
            // level that decayed to all zero is dropped (see [`flush_subnormals`]); a level that
            // entered the chunk all zero (a zero initial state, or a chunk with `v = 0`) is kept,
            // since the backward needs its adjoint (its inputs' and the initial state's gradients
            // do not vanish with its value).
            // The new states overwrite the old ones in place (no allocation per chunk).
            for (j, &e) in present.iter().enumerate() {
                let blk = states[e].as_mut().expect("a present level holds a state");
                let entered_zero = m.base.has_decay() && is_zero(blk.as_ref());
                blk.copy_from(next.submatrix(0, j * dv, dk, dv));
                let gone = m.base.has_decay() && !flush_subnormals(blk.as_mut()) && !entered_zero;
                if gone {
                    states[e] = None;
                }
                kept.push(!gone);
            }
        }
        // Insert the chunk's own state K̂ᵀ Ũ (K̂ᵀ V without the delta rule) at level 0.
        let vals = ck.wy.as_ref().map_or(hd.v.subrows(i0, n), |wy| wy.u.as_ref());
        if states.is_empty() {
            states.push(None);
        }
        let (acc, own) = match &mut states[0] {
            Some(s) => (Accum::Add, s),
            none => (Accum::Replace, none.insert(Mat::<F>::zeros(dk, dv))),
        };
        mm(own.as_mut(), acc, ck.khat.transpose(), vals, F::one());
        visit(ci, ck, Stacked { present, cols, zcat, kept, read: stacked_read })?;
    }
    Ok(states)
}

/// The chunked form for one (batch, head) of a base mixer from the initial state `h0`
/// (`H_0 = S_0ᵀ`, `D_k × D_v`; `None`: zero): `y` (`T×Dv`) and the final state `H_T`
/// (`D_k × D_v`; zero when it decayed away).
pub fn run_head_from<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    h0: Option<Mat<F>>,
) -> Result<(Mat<F>, Mat<F>)> {
    let (dk, dv) = (hd.q.ncols(), hd.v.ncols());
    let (y, states) = run_head_levels(m, hd, h0.into_iter().map(Some).collect(), 0)?;
    let last = states.into_iter().next().flatten().unwrap_or_else(|| Mat::zeros(dk, dv));
    Ok((y, last))
}

/// The chunked form for one (batch, head) from the initial states `h0` at the absolute chunk
/// index `c0` (see [`sweep`]): `y` (`T×Dv`) and the states after the last chunk.
pub(crate) fn run_head_levels<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    h0: Vec<Option<Mat<F>>>,
    c0: usize,
) -> Result<(Mat<F>, Vec<Option<Mat<F>>>)> {
    let t_len = hd.q.nrows();
    let dv = hd.v.ncols();
    let mut y = Mat::<F>::zeros(t_len, dv);
    let states = sweep(m, hd, h0, c0, true, |_, ck, st| {
        let (i0, n) = (ck.i0, ck.n);
        intra_into(m, hd, i0, n, i0, ck.p, ck.wy.as_ref(), y.subrows_mut(i0, n))?;
        // Read every present state, stacked: R = Q̃ [H⁽ᵉ¹⁾ | H⁽ᵉ²⁾ | …].
        if st.present.is_empty() {
            return Ok(());
        }
        let r = st.read.unwrap_or_else(|| {
            let mut r = Mat::<F>::zeros(n, st.zcat.ncols());
            mm(r.as_mut(), Accum::Replace, ck.qt.as_ref(), st.zcat.as_ref(), F::one());
            r
        });
        for (j, &col) in st.cols.iter().enumerate() {
            let w = read_weights(hd, i0, n, col);
            add_weighted_rows(y.subrows_mut(i0, n), r.subcols(j * dv, dv), &w);
        }
        Ok(())
    })?;
    Ok((y, states))
}

/// The intra-chunk output of the chunk of `n` rows from row `i0` of `hd` into `dst` (`n × D_v`,
/// replaced), from its `P` and, for gated DeltaNet, its WY/UT pieces: `P Ũ` (gated DeltaNet),
/// `P V` (the others); lifted, `(Λ ⊙ A) V` with `A = P T⁻¹ diag(β)` (gated DeltaNet) or `A = P`,
/// and `Λ_{rs} = λ^(ℓ(at + r, at + s))_{i0+r}` for `at` the absolute position of row `i0` (see
/// [`scale_by_levels`]). `P` is taken to be scaled in place.
pub(crate) fn intra_into<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    i0: usize,
    n: usize,
    at: usize,
    p: Mat<F>,
    wy: Option<&Wy<F>>,
    dst: MatMut<'_, F>,
) -> Result<()> {
    let mut a = match (wy, &hd.lam) {
        (Some(wy), None) => {
            mm(dst, Accum::Replace, p.as_ref(), wy.u.as_ref(), F::one());
            return Ok(());
        }
        (Some(wy), Some(_)) => {
            let mut a = delta_intra(p.as_ref(), wy);
            for s in 0..n {
                col_mut(&mut a, s).iter_mut().for_each(|x| *x *= hd.beta[i0 + s]);
            }
            a
        }
        (None, _) => p,
    };
    if let Some(lam) = &hd.lam {
        scale_by_levels(m, a.as_mut(), *lam, i0, n, at, None)?;
    }
    mm(dst, Accum::Replace, a.as_ref(), hd.v.subrows(i0, n), F::one());
    Ok(())
}

/// `dst_r += w_r · src_r` for every row `r` (`dst`, `src`: `n × D_v`): a read of a level state,
/// weighted per row.
pub(crate) fn add_weighted_rows<F: VecMath>(mut dst: MatMut<'_, F>, src: MatRef<'_, F>, w: &[F]) {
    for d in 0..src.ncols() {
        let (s, mut t) = (src.col(d), dst.as_mut().col_mut(d));
        for row in 0..w.len() {
            t[row] += w[row] * s[row];
        }
    }
}

/// The masked chunk decay `Γ_{r,s} = e^(γ_r − γ_s)` for `s ≤ r`, zero above the
/// diagonal (see [`decay_into`]).
fn decay_matrix<F: VecMath>(gam: &[f64]) -> Mat<F> {
    let mut m = Mat::<F>::zeros(gam.len(), gam.len());
    decay_into(m.as_mut(), gam);
    m
}

/// Writes the masked chunk decay `Γ_{r,s} = e^(γ_r − γ_s)`, `s ≤ r`, into the lower part
/// (with the diagonal) of the `n × n` matrix `m` (unit row stride), `n = gam.len()`; entries
/// above the diagonal are left as they are. The exponent is a difference of the `f64` sums
/// (non-positive for the non-positive log-decays), rounded to `F`; the exponentials are
/// [`VecMath::exp_lane`], vectorised down each column (the loop is built for AVX-512,
/// AVX2 + FMA and NEON and chosen at run time). Exponents below `f32`'s range give 0.
#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn decay_into<F: VecMath>(m: MatMut<'_, F>, gam: &[f64]) {
    let fused = multiversion::target::target_cfg_f!(target_feature = "fma");
    let n = gam.len();
    let mut m = m;
    for (s, &gs) in gam.iter().enumerate() {
        let col = m.as_mut().col_mut(s).try_as_col_major_mut().expect("unit row stride").as_slice_mut();
        for (x, &gr) in col[s..n].iter_mut().zip(&gam[s..]) {
            *x = F::exp_lane(F::of(gr - gs), fused);
        }
    }
}

/// `dst[i] ← e^(σ (xs[i] − x0))` with `σ = −1` when `negate`, else `1`: the exponent is
/// formed in `f64` and rounded to `F`, the exponentials vectorised as in [`decay_into`].
#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn exps_into<F: VecMath>(dst: &mut [F], xs: &[f64], x0: f64, negate: bool) {
    let fused = multiversion::target::target_cfg_f!(target_feature = "fma");
    let sign = if negate { -1.0 } else { 1.0 };
    for (d, &x) in dst.iter_mut().zip(xs) {
        *d = F::exp_lane(F::of(sign * (x - x0)), fused);
    }
}

/// Multiplies the lower part of `a` by the decay matrix (when given) and zeroes the part
/// above the diagonal (`diag = true` keeps the diagonal, otherwise it is zeroed as well).
fn mask_decay<F: VecMath>(a: &mut Mat<F>, gamma: Option<&Mat<F>>, diag: bool) {
    let n = a.nrows();
    for s in 0..n {
        let start = if diag { s } else { s + 1 };
        let col = col_mut(a, s);
        col[..start.min(n)].iter_mut().for_each(|x| *x = F::zero());
        if let Some(gm) = gamma {
            let gc = gm.col(s);
            for r in start..n {
                col[r] *= gc[r];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{decay_matrix, exps_into, flush_subnormals, scale_and_flush, scale_by_levels};
    use faer::Mat;
    use mixer_core::mixers::loglinear::{Base, LambdaScheme, LevelMask, Lift, LogLinear};

    /// The Fenwick fast path of `scale_by_levels`, with and without the decay `Γ`, against
    /// `λ^(ℓ(at + r, at + s))_{i0+r} Γ_{r,s} a_{r,s}` formed pair by pair from the mask's level
    /// function: full chunks of 16 and the partial last chunk of a length that is no multiple of
    /// it (T = 45) at their own positions, and rows whose absolute position `at` is off a chunk
    /// boundary (a lift's head from a state: 5, 100, 127, 129, and rows that cross a power of
    /// two); entries above the diagonal are left as they are.
    #[test]
    fn level_scaling_matches_the_mask_pair_by_pair() {
        let lift = Lift { mask: LevelMask::fenwick(), lambda: LambdaScheme::identity() };
        let m = LogLinear::new("x", Base::Mamba2, Some(lift), 1.0, 16).unwrap();
        let t_len = 45;
        let lam = Mat::<f64>::from_fn(t_len, 9, |t, l| 0.25 + ((t * 7 + l * 5) % 11) as f64 / 8.0);
        let cases = [
            (0usize, 16usize, 0usize),
            (16, 16, 16),
            (32, 13, 32),
            (3, 11, 5),
            (7, 16, 100),
            (0, 1, 127),
            (2, 15, 127),
            (10, 9, 129),
            (29, 16, 120),
        ];
        for (i0, n, at) in cases {
            let a = Mat::<f64>::from_fn(n, n, |r, s| 1.0 + ((r * 3 + s * 13) % 17) as f64 / 4.0);
            let gam =
                Mat::<f64>::from_fn(n, n, |r, s| if s <= r { (-0.1 * (r - s) as f64).exp() } else { 9.0 });
            for with_gamma in [false, true] {
                let mut got = a.clone();
                let g = with_gamma.then(|| gam.as_ref());
                scale_by_levels(&m, got.as_mut(), lam.as_ref(), i0, n, at, g).unwrap();
                for r in 0..n {
                    for s in 0..n {
                        let want = if s <= r {
                            let l = mixer_core::fenwick::level(at + r, at + s);
                            a[(r, s)] * lam[(i0 + r, l)] * if with_gamma { gam[(r, s)] } else { 1.0 }
                        } else {
                            a[(r, s)]
                        };
                        let err = (got[(r, s)] - want).abs();
                        assert!(err <= 1e-15 * want.abs(), "i0 {i0} at {at} r {r} s {s} gamma {with_gamma}");
                    }
                }
            }
        }
        // Rows whose levels reach past λ's are refused, not read out of bounds.
        let e = scale_by_levels(&m, Mat::<f64>::zeros(4, 4).as_mut(), lam.as_ref(), 0, 4, 254, None);
        assert!(e.unwrap_err().to_string().contains("level 9"));
    }

    /// Scaling with the flush: entries that end up below the smallest normal `f32` become
    /// exactly 0, the others are `s·x` rounded once; the result says whether a non-zero entry
    /// is left — on contiguous columns of a length that is no multiple of the lanes, and on a
    /// strided view (the transpose).
    #[test]
    fn scale_and_flush_zeroes_what_falls_below_normal() {
        let tiny = f32::MIN_POSITIVE;
        let x = Mat::<f32>::from_fn(37, 3, |i, j| match (i * 3 + j) % 5 {
            0 => 0.0,
            1 => 3.0 * tiny,
            2 => -1.5 * tiny,
            3 => 0.75,
            _ => -2.0e-30,
        });
        for s in [1.0f32, 0.5, 1e-10] {
            for transposed in [false, true] {
                let mut y = if transposed { x.transpose().to_owned() } else { x.clone() };
                let want: Vec<f32> = y
                    .col_iter()
                    .flat_map(|c| {
                        c.iter().map(|&v| if (v * s).abs() < tiny { 0.0 } else { v * s }).collect::<Vec<_>>()
                    })
                    .collect();
                let alive = if transposed {
                    let mut t = y.as_mut().transpose_mut();
                    scale_and_flush(t.as_mut(), s)
                } else {
                    scale_and_flush(y.as_mut(), s)
                };
                let got: Vec<f32> =
                    y.col_iter().flat_map(|c| c.iter().copied().collect::<Vec<_>>()).collect();
                assert_eq!(got, want, "s = {s}, transposed = {transposed}");
                assert_eq!(alive, want.iter().any(|&v| v != 0.0));
                assert!(alive, "0.75·s is normal for every s here");
            }
        }
        let mut gone = Mat::<f32>::from_fn(19, 2, |i, _| if i % 2 == 0 { 0.5 * tiny } else { 0.0 });
        assert!(!flush_subnormals(gone.as_mut()));
        assert!(gone.col_iter().all(|c| c.iter().all(|&v| v == 0.0)));
    }

    /// `n` cumulative log-decays `Γ_i = Σ_{j ≤ i} g_j` with `g_j = −(5j mod 7)/div`, except
    /// `g_j = spike` where `j mod every = at`.
    fn cumulative_gates(n: usize, (every, at, spike): (usize, usize, f64), div: f64) -> Vec<f64> {
        let mut gam = Vec::new();
        let mut acc = 0.0;
        for i in 0..n {
            acc += if i % every == at { spike } else { -((i * 5 % 7) as f64) / div };
            gam.push(acc);
        }
        gam
    }

    #[test]
    fn decay_matrix_matches_direct_exponentials() {
        let gam = cumulative_gates(53, (9, 4, -1e4), 10.0);
        let m = decay_matrix::<f64>(&gam);
        for r in 0..53 {
            for s in 0..53 {
                let want = if s <= r { (gam[r] - gam[s]).exp() } else { 0.0 };
                let got = m[(r, s)];
                assert!(
                    got.is_finite() && (got - want).abs() <= 1e-14 * want,
                    "r={r} s={s}: {got} vs {want}"
                );
            }
        }
    }

    /// The `f32` decay factors and exponentials (vectorised polynomial) against `f64` ones:
    /// within a few ulp, plus the rounding of the exponent to `f32`.
    #[test]
    fn f32_decay_factors_match_f64() {
        let gam = cumulative_gates(77, (13, 6, -90.0), 9.0);
        let m = decay_matrix::<f32>(&gam);
        for r in 0..77 {
            for s in 0..77 {
                let x = gam[r] - gam[s];
                let want = if s <= r { x.exp() } else { 0.0 };
                let got = m[(r, s)] as f64;
                let tol = 4e-7 * want + (x.abs() * 6e-8) * want + 1e-38;
                assert!((got - want).abs() <= tol, "r={r} s={s}: {got} vs {want}");
            }
        }
        let mut tail = vec![0.0f32; 77];
        exps_into(&mut tail, &gam, gam[76], true);
        let mut eg = vec![0.0f32; 77];
        exps_into(&mut eg, &gam, 0.0, false);
        for r in 0..77 {
            let (wt, we) = ((gam[76] - gam[r]).exp(), gam[r].exp());
            assert!((tail[r] as f64 - wt).abs() <= 1e-6 * wt + 1e-38, "tail {r}");
            assert!((eg[r] as f64 - we).abs() <= 1e-6 * we + 1e-38, "eg {r}");
        }
    }
}
