//! The fast (streaming) form of attention: flash-style tiling with an online softmax, the
//! two products of every tile done as matrix products (faer).
//!
//! For a block of queries `[i₀, i₁)` the key blocks `[j₀, j₁)` that intersect the visible
//! range `[max(0, i₀ + 1 − w), i₁)` are visited in order (tiles wholly outside the causal
//! triangle or the window are never touched). The queries are the lanes of every tile: the
//! block keeps `Qᵀ [Dk, n]`, `Oᵀ [Dv, n]` and per lane the running maximum key `m` and
//! denominator `ℓ` (`n` = the block's queries rounded up to a multiple of 32, padded with zero
//! queries whose results are dropped). Per tile:
//! `Sᵀ = K_j (sign(σ)·Q_i)ᵀ` (one matmul: the keys `u = sign(σ)·q·k` of
//! [`Logits`](mixer_core::mixers::attention::Logits), unscaled), then row by row of `Sᵀ`
//! (one key against every query, so every step below is elementwise over the lanes and
//! vectorises, with no horizontal reductions): keys outside `[first(t), t]` are set to `−∞` —
//! only on tiles that straddle the diagonal or the window's edge, where the visible lanes of a
//! key are one contiguous range — and
//! `m' = max(m, maxₛ u_s)`, `ℓ' = e^{|σ|(m − m')} ℓ + Σₛ e^{|σ|(u_s − m')}`,
//! `o' = e^{|σ|(m − m')} o + Σₛ e^{|σ|(u_s − m')} vₛ` — differences before products, so a
//! huge `σ` or huge scores never overflow an intermediate; the exponentials by the vectorised
//! [`VecMath::exp_lane`], the sum over `s` as one matmul `Oᵀ += V_jᵀ Pᵀ`. At the end
//! `y_t = o / ℓ`. The lane loops are built for AVX-512, AVX2 + FMA and NEON and chosen at run
//! time (`multiversion`).
//!
//! Exact fallback: a query block where some `q·k` of a visited tile overflowed in `F` (an
//! `f32` dot product beyond 3.4e38; checked per tile only in heads where the bound
//! `maxₜ‖q_t‖ · maxₛ‖k_s‖` does not rule it out, see [`may_overflow`]), or a scale `σ` that is
//! 0 or not representable in `F`, is computed by [`exact_block`] instead: keys formed again in
//! `f64` where needed and weights in `f64` (slower, and only ever taken on such inputs).
//!
//! Memory per task is `O(B_q·B_k + B_q·D_v)`; tasks (batch × head × query block) run in
//! parallel with rayon, each product sequential inside its task.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use mixer_core::mixers::attention::{Attention, Logits};
use mixer_core::{Result, Tensors};
use ndarray::{Array2, Array3, Array4, ArrayD, s};
use rayon::prelude::*;

use super::{heads_major, key};
use crate::vmath::VecMath;
use multiversion::multiversion;

/// Query block size of the backward pass.
pub const BLOCK_Q: usize = 128;
/// Key block size (forward and backward).
pub const BLOCK_K: usize = 128;
/// Query block size of the forward pass (the lanes of a tile; `Sᵀ [B_k, 64]` stays in L1).
/// Measured at T = 4k and 16k (f32, H = 4, D = 64, 2 threads) against 32, 128 and 256.
const FWD_BLOCK_Q: usize = 64;
/// Lane granularity of the fast path: a query block is padded to a multiple of this many
/// queries (two AVX-512 registers of `f32`).
const NR: usize = 32;
/// Lanes per register-resident chunk of the softmax passes (two AVX-512 registers of `f32`:
/// two independent dependency chains down the rows).
const LANES: usize = NR;

/// `y [B,T,H,Dv]` by streaming over key blocks.
pub fn flash<F: VecMath>(a: &Attention, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let (q, k, v) = (heads_major(inputs, "q")?, heads_major(inputs, "k")?, heads_major(inputs, "v")?);
    let (bn, hn, tn, _) = q.dim();
    let dv = v.dim().3;
    let (_, outs) = blocks(a, &q, &k, &v)?;
    // Task (b, h, block) is number (b·H + h)·blocks + block (see `blocks`); rows of y in parallel.
    let nblocks = tn.div_ceil(FWD_BLOCK_Q);
    let mut y = Array4::<F>::zeros((bn, tn, hn, dv));
    if let Some(data) = y.as_slice_mut().filter(|d| !d.is_empty()) {
        data.par_chunks_mut(hn * dv).enumerate().for_each(|(bt, row)| {
            let (b, t) = (bt / tn, bt % tn);
            for (h, out) in row.chunks_exact_mut(dv).enumerate() {
                let blk = &outs[(b * hn + h) * nblocks + t / FWD_BLOCK_Q];
                let r = t % FWD_BLOCK_Q;
                for (d, x) in out.iter_mut().enumerate() {
                    *x = blk.ot[d * blk.ld + r];
                }
            }
        });
    }
    Ok(y.into_dyn())
}

/// The streaming forward on heads-major `q, k [B,H,T,Dk]`, `v [B,H,T,Dv]`: the output
/// `[B,H,T,Dv]` and the per-row log-sum-exp `LSE_t = log Σ_s e^{σ q_t·k_s}` of the scaled,
/// masked scores (which the backward pass uses to recompute the softmax blockwise).
pub(crate) fn forward<F: VecMath>(
    a: &Attention,
    q: &Array4<F>,
    k: &Array4<F>,
    v: &Array4<F>,
) -> Result<(Array4<F>, Array3<F>)> {
    let (bn, hn, tn, _) = q.dim();
    let dv = v.dim().3;
    let (tasks, outs) = blocks(a, q, k, v)?;
    let mut y = Array4::<F>::zeros((bn, hn, tn, dv));
    let mut lse = Array3::<F>::zeros((bn, hn, tn));
    for (&(b, h, i0), blk) in tasks.iter().zip(&outs) {
        for (r, &lr) in blk.lse.iter().enumerate() {
            for d in 0..dv {
                y[[b, h, i0 + r, d]] = blk.ot[d * blk.ld + r];
            }
            lse[[b, h, i0 + r]] = lr;
        }
    }
    Ok((y, lse))
}

/// The result of one query block of `nq` rows: `Oᵀ` (`ot[d·ld + r]`, `ld ≥ nq`, the normalised
/// outputs) and the rows' log-sum-exp.
struct Block<F> {
    ot: Vec<F>,
    ld: usize,
    lse: Vec<F>,
}

/// One head's keys and values, row-major `K [T, Dk]` and `V [T, Dv]`; `may_overflow`: the
/// norm bound of [`may_overflow`] does not rule out a non-finite `q·k` in `F`.
struct Head<'a, F> {
    k: &'a [F],
    v: &'a [F],
    dk: usize,
    dv: usize,
    may_overflow: bool,
}

/// Whether some computed `q·k` (queries `q [T, Dk]`, keys `k [T, Dk]` of one head, row-major)
/// may be non-finite in `F`: by Cauchy–Schwarz every partial sum of a dot product in `F` is at
/// most `maxₜ‖q_t‖ · maxₛ‖k_s‖ · (1 + 2·Dk·ε)`, so below `F::MAX` nothing overflows and the
/// per-tile check is skipped. Non-finite inputs give `true`.
fn may_overflow<F: VecMath>(q: &[F], k: &[F], dk: usize) -> bool {
    let max_norm = |x: &[F]| {
        x.chunks_exact(dk.max(1))
            .map(|row| row.iter().map(|&e| e.f64() * e.f64()).sum::<f64>().sqrt())
            .fold(0.0f64, |a, b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) })
    };
    let bound = max_norm(q) * max_norm(k) * (1.0 + 2.0 * dk as f64 * F::epsilon().f64());
    bound.is_nan() || bound >= F::max_value().f64()
}

/// The tasks (batch row, head, first query of the block) and, per task, its [`Block`].
#[allow(clippy::type_complexity)]
fn blocks<F: VecMath>(
    a: &Attention,
    q: &Array4<F>,
    k: &Array4<F>,
    v: &Array4<F>,
) -> Result<(Vec<(usize, usize, usize)>, Vec<Block<F>>)> {
    let (bn, hn, tn, dk) = q.dim();
    let dv = v.dim().3;
    let sigma = a.scale(dk);
    let abs = F::of(sigma.abs());
    let fast = sigma != 0.0 && abs.is_finite() && abs > F::zero();
    // The keys u = sign(σ)·q·k: the sign goes into the queries (exact).
    let qs_owned;
    let qsigned = if sigma < 0.0 {
        qs_owned = q.mapv(|x| -x);
        &qs_owned
    } else {
        q
    };
    let (qs, ks, vs) = (slice_of(qsigned), slice_of(k), slice_of(v));
    let tasks: Vec<(usize, usize, usize)> = (0..bn)
        .flat_map(|b| (0..hn).flat_map(move |h| (0..tn).step_by(FWD_BLOCK_Q).map(move |i0| (b, h, i0))))
        .collect();
    let risky: Vec<bool> = (0..bn * hn)
        .into_par_iter()
        .map(|bh| fast && may_overflow(&qs[bh * tn * dk..][..tn * dk], &ks[bh * tn * dk..][..tn * dk], dk))
        .collect();
    let lg = a.logits(dk);
    let outs = tasks
        .par_iter()
        .map(|&(b, h, i0)| {
            let i1 = (i0 + FWD_BLOCK_Q).min(tn);
            if fast {
                let bh = b * hn + h;
                let qb = &qs[(bh * tn + i0) * dk..][..(i1 - i0) * dk];
                let kh = &ks[bh * tn * dk..][..tn * dk];
                let head = Head { k: kh, v: &vs[bh * tn * dv..][..tn * dv], dk, dv, may_overflow: risky[bh] };
                if let Some(out) = query_block(a, qb, i0, i1 - i0, &head, abs) {
                    return Ok(out);
                }
            }
            exact_block(a, &lg, (q, k, v), (b, h, i0, i1))
        })
        .collect::<Result<_>>()?;
    Ok((tasks, outs))
}

/// The contiguous data of a standard-layout array.
fn slice_of<F: VecMath>(a: &Array4<F>) -> &[F] {
    a.as_slice().expect("heads_major returns a standard-layout array")
}

/// The fast path for the `nq` queries `qb [nq, Dk]` (row-major, sign-adjusted, rows
/// `i₀..i₀+nq`) of one head; `abs` is `|σ|`. The queries are the lanes of every tile
/// (`n = nq` rounded up to [`NR`], padded with zero queries whose results are dropped), so the
/// online softmax runs down the columns of `Sᵀ [B_k, n]` with no horizontal reductions.
/// `None` when a computed key `q·k` is not finite in `F` (the caller then takes the exact
/// path).
#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn query_block<F: VecMath>(
    a: &Attention,
    qb: &[F],
    i0: usize,
    nq: usize,
    head: &Head<'_, F>,
    abs: F,
) -> Option<Block<F>> {
    let Head { k, v, dk, dv, may_overflow } = *head;
    let fused = multiversion::target::target_cfg_f!(target_feature = "fma");
    let n = nq.div_ceil(NR) * NR;
    let i1 = i0 + nq;
    let mut qt = vec![F::zero(); dk * n];
    for (r, row) in qb.chunks_exact(dk.max(1)).take(nq).enumerate() {
        for (d, &x) in row.iter().enumerate() {
            qt[d * n + r] = x;
        }
    }
    // The first visible key of every lane (non-decreasing in the lane).
    let first: Vec<usize> = (0..n).map(|r| a.first_key(i0 + r)).collect();
    let (mut m, mut l) = (vec![F::neg_infinity(); n], vec![F::zero(); n]);
    let (mut mnew, mut msafe, mut corr, mut psum, mut bad) =
        (vec![F::zero(); n], vec![F::zero(); n], vec![F::zero(); n], vec![F::zero(); n], vec![F::zero(); n]);
    let mut ot = vec![F::zero(); dv * n];
    let mut st = vec![F::zero(); BLOCK_K * n];
    let mut j0 = a.first_key(i0) / BLOCK_K * BLOCK_K;
    while j0 < i1 {
        let j1 = (j0 + BLOCK_K).min(i1);
        let nk = j1 - j0;
        let s = &mut st[..nk * n];
        // Sᵀ = K_j Qᵀ.
        let kb = MatRef::from_row_major_slice(&k[j0 * dk..j1 * dk], nk, dk);
        let qm = MatRef::from_row_major_slice(&qt, dk, n);
        matmul(MatMut::from_row_major_slice_mut(s, nk, n), Accum::Replace, kb, qm, F::one(), Par::Seq);
        // Finiteness, only where the norm bound allows an overflow (x·0 is NaN exactly when x
        // is not finite).
        if may_overflow {
            bad.fill(F::zero());
            for row in s.chunks_exact(n) {
                for (z, &x) in bad.iter_mut().zip(row) {
                    *z += x * F::zero();
                }
            }
            if bad.iter().any(|z| z.is_nan()) {
                return None;
            }
        }
        // The mask of tiles that cross the diagonal or the window's edge (visible lanes of key
        // s: r ≥ s − i₀ and first(i₀ + r) ≤ s, a contiguous range).
        if j1 > i0 + 1 || j0 < first[nq - 1] {
            for (c, row) in s.chunks_exact_mut(n).enumerate() {
                let key = j0 + c;
                let lo = key.saturating_sub(i0).min(n);
                let hi = first.partition_point(|&f| f <= key).max(lo);
                row[..lo].fill(F::neg_infinity());
                row[hi..].fill(F::neg_infinity());
            }
        }
        // The running maximum, LANES lanes at a time down the rows (accumulators in registers).
        for w0 in (0..n).step_by(LANES) {
            let mut mx: [F; LANES] = m[w0..w0 + LANES].try_into().expect("LANES lanes");
            for row in s.chunks_exact(n) {
                // No NaN reaches this point (inputs are finite or the check above ran), so a
                // plain comparison (one vector max) is the maximum.
                for (a, &x) in mx.iter_mut().zip(&row[w0..w0 + LANES]) {
                    *a = if x > *a { x } else { *a };
                }
            }
            mnew[w0..w0 + LANES].copy_from_slice(&mx);
        }
        for r in 0..n {
            corr[r] = if m[r] == F::neg_infinity() {
                F::zero()
            } else {
                F::exp_lane(abs * (m[r] - mnew[r]), fused)
            };
            msafe[r] = if mnew[r] == F::neg_infinity() { F::zero() } else { mnew[r] };
        }
        m.copy_from_slice(&mnew);
        // Pᵀ = e^{|σ|(Sᵀ − m)} and its column sums, LANES lanes at a time.
        for w0 in (0..n).step_by(LANES) {
            let ms: [F; LANES] = msafe[w0..w0 + LANES].try_into().expect("LANES lanes");
            let mut acc = [F::zero(); LANES];
            for row in s.chunks_exact_mut(n) {
                for ((x, &mr), a) in row[w0..w0 + LANES].iter_mut().zip(&ms).zip(acc.iter_mut()) {
                    let e = F::exp_lane(abs * (*x - mr), fused);
                    *x = e;
                    *a += e;
                }
            }
            psum[w0..w0 + LANES].copy_from_slice(&acc);
        }
        for r in 0..n {
            l[r] = l[r] * corr[r] + psum[r];
        }
        // Oᵀ ← Oᵀ diag(corr) + V_jᵀ Pᵀ.
        for row in ot.chunks_exact_mut(n) {
            for (o, &cr) in row.iter_mut().zip(&corr) {
                *o *= cr;
            }
        }
        let vb = MatRef::from_row_major_slice(&v[j0 * dv..j1 * dv], nk, dv);
        let pm = MatRef::from_row_major_slice(s, nk, n);
        let om = MatMut::from_row_major_slice_mut(&mut ot, dv, n);
        matmul(om, Accum::Add, vb.transpose(), pm, F::one(), Par::Seq);
        j0 = j1;
    }
    for r in 0..nq {
        corr[r] = F::one() / l[r];
    }
    for row in ot.chunks_exact_mut(n) {
        for (o, &inv) in row.iter_mut().zip(&corr[..nq]) {
            *o *= inv;
        }
    }
    let lse = (0..nq).map(|r| abs * m[r] + l[r].ln()).collect();
    Some(Block { ot, ld: n, lse })
}

/// The exact path for the query rows `[i₀, i₁)` of batch row `b`, head `h` (inputs `[B,H,T,D]`,
/// unscaled): keys through [`Logits`] (formed again in `f64` where `F` overflowed) and
/// weights in `f64`. Returns `Oᵀ [Dv, nq]` and the rows' log-sum-exp, like the fast path.
fn exact_block<F: VecMath>(
    a: &Attention,
    lg: &Logits,
    (q, k, v): (&Array4<F>, &Array4<F>, &Array4<F>),
    (b, h, i0, i1): (usize, usize, usize, usize),
) -> Result<Block<F>> {
    const BK: usize = 64;
    let nq = i1 - i0;
    let dv = v.dim().3;
    let qb = q.slice(s![b, h, i0..i1, ..]);
    // Running maximum key (f64), denominator and accumulator per row.
    let mut m = vec![f64::NEG_INFINITY; nq];
    let mut l = vec![F::zero(); nq];
    let mut o = Array2::<F>::zeros((nq, dv));
    let mut keys = [0.0f64; BK];
    let mut j0 = a.first_key(i0);
    while j0 < i1 {
        let j1 = (j0 + BK).min(i1);
        let kb = k.slice(s![b, h, j0..j1, ..]);
        let vb = v.slice(s![b, h, j0..j1, ..]);
        let mut p = qb.dot(&kb.t());
        for r in 0..nq {
            let t = i0 + r;
            let (slo, shi) = (a.first_key(t).max(j0), (t + 1).min(j1));
            let mut row = p.row_mut(r);
            if slo >= shi {
                row.fill(F::zero());
                continue;
            }
            let mut mx = m[r];
            for s in slo..shi {
                let u = key(lg, row[s - j0], qb.row(r), kb.row(s - j0), t, s)?;
                keys[s - j0] = u;
                mx = mx.max(u);
            }
            let corr = F::of(lg.weight(m[r], mx));
            let mut sum = F::zero();
            for c in 0..j1 - j0 {
                let s = j0 + c;
                row[c] = if s >= slo && s < shi {
                    let e = F::of(lg.weight(keys[c], mx));
                    sum += e;
                    e
                } else {
                    F::zero()
                };
            }
            l[r] = l[r] * corr + sum;
            m[r] = mx;
            o.row_mut(r).mapv_inplace(|x| x * corr);
        }
        o += &p.dot(&vb);
        j0 = j1;
    }
    let mut ot = vec![F::zero(); dv * nq];
    for r in 0..nq {
        let inv = F::one() / l[r];
        for d in 0..dv {
            ot[d * nq + r] = o[[r, d]] * inv;
        }
    }
    let abs = a.scale(q.dim().3).abs();
    let lse = (0..nq).map(|r| F::of(abs * m[r] + l[r].f64().ln())).collect();
    Ok(Block { ot, ld: nq, lse })
}

#[cfg(test)]
mod tests {
    use super::may_overflow;

    /// The norm bound: ordinary inputs need no check; norms whose product nears `F::MAX`, or a
    /// non-finite input, do.
    #[test]
    fn overflow_bound() {
        let q: Vec<f32> = (0..3 * 5).map(|i| (i % 7) as f32 - 3.0).collect();
        assert!(!may_overflow(&q, &q, 5));
        let big: Vec<f32> = q.iter().map(|x| x * 4e18).collect();
        assert!(may_overflow(&big, &big, 5));
        let small: Vec<f32> = q.iter().map(|x| x * 1e-20).collect();
        assert!(!may_overflow(&big, &small, 5));
        let mut nan = q.clone();
        nan[7] = f32::NAN;
        assert!(may_overflow(&nan, &q, 5));
        assert!(may_overflow(&q, &[f32::INFINITY; 5], 5));
        // f64 has room where f32 has none.
        let big64: Vec<f64> = big.iter().map(|&x| x as f64).collect();
        assert!(!may_overflow(&big64, &big64, 5));
    }
    /// Prints the machine's `f32` matmul rate with faer: one large product on two threads, and
    /// the forward's tile shapes at `Dk = Dv = 64` (scores `K_j Qᵀ`: `128×64·64×64`, values
    /// `V_jᵀ Pᵀ`: `64×128·128×64`; and the same with 128 queries) sequential inside two tasks
    /// that run at once, as the fast form runs them, on operands that stay in cache.
    /// A measurement, not a check:
    /// `cargo test --release -p mixer-cpu --lib -- --ignored --nocapture matmul_rates`.
    #[test]
    #[ignore]
    fn matmul_rates() {
        use faer::linalg::matmul::matmul;
        use faer::{Accum, Mat, Par};
        use rayon::prelude::*;
        use std::time::Instant;
        let best = |f: &dyn Fn()| {
            f();
            (0..3)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        let big = 2048;
        let x = Mat::<f32>::from_fn(big, big, |i, j| ((i * 7 + j * 3) % 11) as f32 * 0.1);
        let t = best(&|| {
            let mut y = Mat::<f32>::zeros(big, big);
            matmul(y.as_mut(), Accum::Replace, x.as_ref(), x.as_ref(), 1.0, Par::rayon(2));
        });
        println!("faer {big}³ on 2 threads: {:.1} GFLOP/s", 2.0 * (big as f64).powi(3) / t / 1e9);
        for (m, k, n) in [(128usize, 64usize, 64usize), (64, 128, 64), (128, 64, 128), (64, 128, 128)] {
            let a = Mat::<f32>::from_fn(m, k, |i, j| ((i + 2 * j) % 5) as f32 * 0.1);
            let b = Mat::<f32>::from_fn(k, n, |i, j| ((3 * i + j) % 7) as f32 * 0.1);
            let reps = 200;
            let t = best(&|| {
                (0..2).into_par_iter().for_each(|_| {
                    let mut c = Mat::<f32>::zeros(m, n);
                    for _ in 0..reps {
                        matmul(c.as_mut(), Accum::Add, a.as_ref(), b.as_ref(), 1.0, Par::Seq);
                    }
                });
            });
            let flops = 2.0 * 2.0 * (m * k * n * reps) as f64;
            println!("faer {m}×{k}·{k}×{n}, two tasks at once: {:.1} GFLOP/s", flops / t / 1e9);
        }
    }
}
