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

use faer::linalg::matmul::matmul;
use faer::linalg::triangular_solve::solve_unit_lower_triangular_in_place;
use faer::{Accum, Mat, Par};
use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::{Error, Real, Result};

use super::common::Head;
use super::parallel::col_mut;

/// The chunked form for one (batch, head): `T×Dv`.
pub fn run_head<F: Real>(m: &LogLinear, hd: &Head<'_, F>) -> Result<Mat<F>> {
    let t_len = hd.q.nrows();
    let (dk, dv) = (hd.q.ncols(), hd.v.ncols());
    let chunk = m.chunk;
    let cbits = m.chunk_log2() as usize;
    let scale = F::of(m.scale);
    let lifted = hd.lam.is_some();
    let n_levels = hd.lam.as_ref().map_or(1, |l| l.ncols());
    let mut y = Mat::<F>::zeros(t_len, dv);
    // states[e]: chunk-level e (lifted), or the single state at index 0 (base mixers).
    let mut states: Vec<Option<Mat<F>>> = Vec::new();
    let n_chunks = t_len.div_ceil(chunk);
    for ci in 0..n_chunks {
        let i0 = ci * chunk;
        let n = chunk.min(t_len - i0);
        let qc = hd.q.subrows(i0, n);
        let kc = hd.k.subrows(i0, n);
        let vc = hd.v.subrows(i0, n);

        // Chunk-local log-decay sums and the factors built from them (masked, ≤ 0 exponents).
        let mut gam = vec![0.0f64; n];
        let mut acc = 0.0f64;
        for r in 0..n {
            acc += hd.g[i0 + r];
            gam[r] = acc;
        }
        let last = gam[n - 1];
        let eg: Vec<F> = gam.iter().map(|&x| F::of(x.exp())).collect();
        let tail: Vec<F> = gam.iter().map(|&x| F::of((last - x).exp())).collect();
        let total = F::of(last.exp());

        // P = σ QKᵀ ⊙ Γ, lower with diagonal.
        let mut p = Mat::<F>::zeros(n, n);
        matmul(p.as_mut(), Accum::Replace, qc, kc.transpose(), scale, Par::Seq);
        let gamma = m.base.has_decay().then(|| decay_matrix::<F>(&gam));
        mask_decay(&mut p, gamma.as_ref(), true);

        // Effective queries, chunk-state keys, intra-chunk coefficients and the delta-rule
        // pieces (W, Ũ) where they apply.
        let mut qt = Mat::<F>::from_fn(n, dk, |r, d| scale * eg[r] * qc[(r, d)]);
        let khat = Mat::<F>::from_fn(n, dk, |r, d| tail[r] * kc[(r, d)]);
        let mut a_intra: Option<Mat<F>> = None;
        let mut wy: Option<(Mat<F>, Mat<F>)> = None;
        if m.base == Base::GatedDeltaNet {
            let mut lm = Mat::<F>::zeros(n, n);
            matmul(lm.as_mut(), Accum::Replace, kc, kc.transpose(), F::one(), Par::Seq);
            mask_decay(&mut lm, gamma.as_ref(), false);
            for s in 0..n {
                let col = col_mut(&mut lm, s);
                for r in s + 1..n {
                    col[r] *= hd.beta[i0 + r];
                }
            }
            let mut tinv = Mat::<F>::identity(n, n);
            solve_unit_lower_triangular_in_place(lm.as_ref(), tinv.as_mut(), Par::Seq);
            let bek = Mat::<F>::from_fn(n, dk, |r, d| hd.beta[i0 + r] * eg[r] * kc[(r, d)]);
            let bv = Mat::<F>::from_fn(n, dv, |r, d| hd.beta[i0 + r] * vc[(r, d)]);
            let mut w = Mat::<F>::zeros(n, dk);
            matmul(w.as_mut(), Accum::Replace, tinv.as_ref(), bek.as_ref(), F::one(), Par::Seq);
            let mut u = Mat::<F>::zeros(n, dv);
            matmul(u.as_mut(), Accum::Replace, tinv.as_ref(), bv.as_ref(), F::one(), Par::Seq);
            if lifted {
                let mut a = Mat::<F>::zeros(n, n);
                matmul(a.as_mut(), Accum::Replace, p.as_ref(), tinv.as_ref(), F::one(), Par::Seq);
                for s in 0..n {
                    col_mut(&mut a, s).iter_mut().for_each(|x| *x *= hd.beta[i0 + s]);
                }
                a_intra = Some(a);
            } else {
                matmul(y.subrows_mut(i0, n), Accum::Replace, p.as_ref(), u.as_ref(), F::one(), Par::Seq);
            }
            // Q̃ = σ diag(e^γ) Q − P W.
            matmul(qt.as_mut(), Accum::Add, p.as_ref(), w.as_ref(), -F::one(), Par::Seq);
            wy = Some((w, u));
        } else {
            a_intra = Some(p);
        }
        if let Some(mut a) = a_intra {
            if let Some(lam) = &hd.lam {
                for s in 0..n {
                    let col = col_mut(&mut a, s);
                    for r in s..n {
                        let l = m.level_checked(i0 + r, i0 + s, n_levels)?;
                        col[r] *= lam[(i0 + r, l)];
                    }
                }
            }
            matmul(y.subrows_mut(i0, n), Accum::Replace, a.as_ref(), vc, F::one(), Par::Seq);
        }

        // Chunk-granular Fenwick merge (lifted only): levels 0..=ctz(i) go to ctz(i)+1.
        if lifted {
            mixer_core::fenwick::merge_states(&mut states, ci, |acc, s| acc + s);
        }

        // Read every present state, stacked: R = Q̃ [H⁽ᵉ¹⁾ | H⁽ᵉ²⁾ | …].
        let present: Vec<usize> = (0..states.len()).filter(|&e| states[e].is_some()).collect();
        if !present.is_empty() {
            let mut zcat = Mat::<F>::zeros(dk, dv * present.len());
            for (j, &e) in present.iter().enumerate() {
                if let Some(s) = &states[e] {
                    zcat.submatrix_mut(0, j * dv, dk, dv).copy_from(s);
                }
            }
            let mut r = Mat::<F>::zeros(n, dv * present.len());
            matmul(r.as_mut(), Accum::Replace, qt.as_ref(), zcat.as_ref(), F::one(), Par::Seq);
            for (j, &e) in present.iter().enumerate() {
                let col = if lifted {
                    let l = cbits + e;
                    if l >= n_levels {
                        return Err(Error::Value {
                            name: "lambda".into(),
                            constraint: format!(
                                "chunk {ci} reads level {l}, so λ needs more than {l} levels"
                            ),
                            found: format!("L = {n_levels}"),
                        });
                    }
                    Some(l)
                } else {
                    None
                };
                let w: Vec<F> = (0..n)
                    .map(|row| match (col, &hd.lam) {
                        (Some(l), Some(lam)) => lam[(i0 + row, l)],
                        _ => F::one(),
                    })
                    .collect();
                for d in 0..dv {
                    let src = r.col(j * dv + d);
                    let mut dst = y.col_mut(d);
                    for row in 0..n {
                        dst[i0 + row] += w[row] * src[row];
                    }
                }
            }
            // Transition every state through the chunk.
            match (&wy, m.base) {
                (Some((w, _)), _) => {
                    let mut wz = Mat::<F>::zeros(n, zcat.ncols());
                    matmul(wz.as_mut(), Accum::Replace, w.as_ref(), zcat.as_ref(), F::one(), Par::Seq);
                    zcat *= faer::Scale(total);
                    matmul(zcat.as_mut(), Accum::Add, khat.transpose(), wz.as_ref(), -F::one(), Par::Seq);
                }
                (None, Base::Mamba2) => zcat *= faer::Scale(total),
                _ => {}
            }
            // A level whose entries all fell below the smallest normal number is dropped (its
            // contribution is below resolution; subnormal arithmetic is very slow).
            for (j, &e) in present.iter().enumerate() {
                let blk = zcat.submatrix(0, j * dv, dk, dv).to_owned();
                let tiny = F::min_positive_value();
                let gone = m.base.has_decay() && (0..dv).all(|c| blk.col(c).iter().all(|x| x.abs() < tiny));
                states[e] = if gone { None } else { Some(blk) };
            }
        }

        // Insert the chunk's own state at level 0.
        let mut own = Mat::<F>::zeros(dk, dv);
        let vals = match &wy {
            Some((_, u)) => u.as_ref(),
            None => vc,
        };
        matmul(own.as_mut(), Accum::Replace, khat.transpose(), vals, F::one(), Par::Seq);
        if states.is_empty() {
            states.push(None);
        }
        states[0] = Some(match states[0].take() {
            Some(acc) => acc + own,
            None => own,
        });
    }
    Ok(y)
}

/// The masked chunk decay `Γ_{r,s} = e^(γ_r − γ_s)` for `s ≤ r`, zero above the
/// diagonal. Exponents are only taken of masked (non-positive) differences. To save
/// exponentials, a pair whose column `s` lies in an earlier block of 16 than row `r` is
/// factored through the block's last index `p` (`s ≤ p < r`) as
/// `e^(γ_r − γ_p) e^(γ_p − γ_s)`: both factors lie in `[0, 1]`, so the
/// product neither overflows nor loses anything that the direct exponential would keep.
fn decay_matrix<F: Real>(gam: &[f64]) -> Mat<F> {
    const SUB: usize = 16;
    let n = gam.len();
    let mut m = Mat::<F>::zeros(n, n);
    let mut j0 = 0;
    while j0 < n {
        let j1 = (j0 + SUB).min(n);
        let piv = gam[j1 - 1];
        let after: Vec<f64> = (j1..n).map(|r| (gam[r] - piv).exp()).collect();
        for s in j0..j1 {
            let col = col_mut(&mut m, s);
            for r in s..j1 {
                col[r] = F::of((gam[r] - gam[s]).exp());
            }
            let before = (piv - gam[s]).exp();
            for (r, &a) in (j1..n).zip(&after) {
                col[r] = F::of(a * before);
            }
        }
        j0 = j1;
    }
    m
}

/// Multiplies the lower part of `a` by the decay matrix (when given) and zeroes the part
/// above the diagonal (`diag = true` keeps the diagonal, otherwise it is zeroed as well).
fn mask_decay<F: Real>(a: &mut Mat<F>, gamma: Option<&Mat<F>>, diag: bool) {
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
    use super::decay_matrix;

    #[test]
    fn decay_matrix_matches_direct_exponentials() {
        let mut gam = Vec::new();
        let mut acc = 0.0;
        for i in 0..53usize {
            acc += if i % 9 == 4 { -1e4 } else { -((i * 5 % 7) as f64) / 10.0 };
            gam.push(acc);
        }
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
}
