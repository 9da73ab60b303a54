//! The fast (streaming) form of attention: flash-style tiling with an online softmax.
//!
//! For `f32` with `Dv ≤ 64` on CPUs with AVX-512 every tile is computed by the fused
//! register-tiled kernel of [`super::fused`] (query blocks of 96, keys and values packed once
//! from the inputs' layout). Elsewhere — `f64`, other CPUs, wider values, and inputs whose
//! scaled scores could approach the `f32` range — the two products of every tile are matrix
//! products (faer), as described below.
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
//! `f32` dot product beyond 3.4e38; checked per tile only where the bound
//! `Dk · max|q| · max|k|` does not rule it out, see [`may_overflow`]), or a scale `σ` that is
//! 0 or not representable in `F`, is computed by [`exact_block`] instead: keys formed again in
//! `f64` where needed and weights in `f64` (slower, and only ever taken on such inputs).
//!
//! Layout: the queries are read and `y` is written in the inputs' `[B,T,H,D]` layout directly;
//! only the keys and values are copied heads-major (every query block streams them, and
//! contiguous rows stream faster than rows `H·D` apart).
//!
//! Parallelism: a task is one (batch row, head) and the pair of query blocks `i` and
//! `n_b − 1 − i`, whose causal work adds up to the same for every pair, so the tasks are of
//! one size and the two halves of the triangle balance across threads; tasks run in parallel
//! with rayon, each product sequential inside its task, with its work buffers allocated once
//! per task (`O(B_q·B_k + B_q·D_v)`).

use std::borrow::Cow;
use std::collections::VecDeque;

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use mixer_core::error::fmt_shape;
use mixer_core::mixers::attention::{Attention, Logits};
use mixer_core::parallel::min_len;
use mixer_core::tensor::{contiguous, get};
use mixer_core::{Error, Result, Tensors};
use ndarray::{
    Array2, Array3, Array4, ArrayD, ArrayView2, ArrayViewMut, ArrayViewMut1, ArrayViewMut2, ArrayViewMut3,
    ArrayViewMut4, Axis, ShapeBuilder,
};
use rayon::prelude::*;

use super::{fused, heads_major, key};
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

/// `y [B,T,H,Dv]` by streaming over key blocks, read from and written to the token-major
/// layout of the inputs directly (no per-head copies).
pub fn fast<F: VecMath>(a: &Attention, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    fast_from(a, inputs, 0)
}

/// [`fast`] computing only the query blocks that hold a row `≥ from_row`: the rows from
/// `from_row` on are [`fast`]'s, bit for bit; the earlier rows are zero or computed (those of
/// the first block kept). A run from a KV cache of `ℓ` rows (the extension, docs/math.md §7.1)
/// needs only the rows from `ℓ` on, so it costs `O(T (ℓ + T))` rather than `O((ℓ + T)²)`.
pub fn fast_from<F: VecMath>(a: &Attention, inputs: &Tensors<F>, from_row: usize) -> Result<ArrayD<F>> {
    let q = get(inputs, "q")?;
    let v = get(inputs, "v")?;
    let (&[bn, tn, hn, dk], &[.., dv]) = (q.shape(), v.shape()) else {
        let bad = if q.ndim() != 4 { q } else { v };
        let name = if q.ndim() != 4 { "q" } else { "v" };
        return Err(Error::shape(name, "[B, T, H, D]", fmt_shape(bad.shape())));
    };
    let qs = contiguous(inputs, "q", &[bn, tn, hn, dk])?;
    // The fused kernel packs the keys and values itself, from the inputs' layout; the faer
    // path takes them heads-major: every query block streams them, and contiguous rows stream
    // faster than rows H·D apart (measured: about an eighth of the time at T = 16k).
    let (kc, vc, kh, vh);
    let (ks, vs, kv_heads_major): (&[F], &[F], bool) = if F::as_f32(&[]).is_some() && fused::available(dv) {
        kc = contiguous(inputs, "k", &[bn, tn, hn, dk])?;
        vc = contiguous(inputs, "v", &[bn, tn, hn, dv])?;
        (&kc, &vc, false)
    } else {
        contiguous(inputs, "k", &[bn, tn, hn, dk])?;
        (kh, vh) = (heads_major(inputs, "k")?, heads_major(inputs, "v")?);
        (kh.as_slice().expect("contiguous"), vh.as_slice().expect("contiguous"), true)
    };
    let x = Qkv { q: &qs, k: ks, v: vs, bn, tn, hn, dk, dv, q_heads_major: false, kv_heads_major };
    let mut y = Array4::<F>::zeros((bn, tn, hn, dv));
    let mut lse = vec![F::zero(); bn * tn * hn];
    let ys = y.as_slice_mut().expect("a new array is contiguous");
    drive(a, &x, ys, &mut lse, from_row)?;
    Ok(y.into_dyn())
}

/// The streaming forward on heads-major `q, k [B,H,T,Dk]`, `v [B,H,T,Dv]`: the output
/// `[B,H,T,Dv]` and the per-row log-sum-exp `LSE_t = log Σ_s e^{σ q_t·k_s}` of the scaled,
/// masked scores (which the backward pass uses to recompute the softmax blockwise).
/// Query blocks wholly before `from_row` are left out ([`fast_from`]).
pub(crate) fn forward<F: VecMath>(
    a: &Attention,
    q: &Array4<F>,
    k: &Array4<F>,
    v: &Array4<F>,
    from_row: usize,
) -> Result<(Array4<F>, Array3<F>)> {
    let (bn, hn, tn, dk) = q.dim();
    let dv = v.dim().3;
    let std = |x: &Array4<F>| -> Vec<F> { x.as_standard_layout().iter().copied().collect() };
    let (qs, ks, vs): (Cow<'_, [F]>, Cow<'_, [F]>, Cow<'_, [F]>) = (
        q.as_slice().map_or_else(|| Cow::Owned(std(q)), Cow::Borrowed),
        k.as_slice().map_or_else(|| Cow::Owned(std(k)), Cow::Borrowed),
        v.as_slice().map_or_else(|| Cow::Owned(std(v)), Cow::Borrowed),
    );
    let x = Qkv { q: &qs, k: &ks, v: &vs, bn, tn, hn, dk, dv, q_heads_major: true, kv_heads_major: true };
    let mut y = Array4::<F>::zeros((bn, tn, hn, dv));
    let mut lse = Array3::<F>::zeros((bn, tn, hn));
    drive(
        a,
        &x,
        y.as_slice_mut().expect("a new array is contiguous"),
        lse.as_slice_mut().expect("a new array is contiguous"),
        from_row,
    )?;
    let y = y.permuted_axes([0, 2, 1, 3]).as_standard_layout().into_owned();
    let lse = lse.permuted_axes([0, 2, 1]).as_standard_layout().into_owned();
    Ok((y, lse))
}

/// `q, k [·, Dk]` and `v [·, Dv]` of every (batch row, head) as flat row-major data, in one of
/// two layouts: token-major `[B,T,H,D]` (the inputs) or heads-major `[B,H,T,D]`.
struct Qkv<'a, F> {
    q: &'a [F],
    k: &'a [F],
    v: &'a [F],
    bn: usize,
    tn: usize,
    hn: usize,
    dk: usize,
    dv: usize,
    q_heads_major: bool,
    kv_heads_major: bool,
}

impl<'a, F: VecMath> Qkv<'a, F> {
    /// Rows `t₀..t₀+n` of (batch row `b`, head `h`) of `x` (rows of width `d`), with the
    /// layout's row stride (`d` heads-major, `H·d` token-major).
    fn rows(
        &self,
        x: &'a [F],
        d: usize,
        hm: bool,
        (b, h): (usize, usize),
        t0: usize,
        n: usize,
    ) -> Rows<'a, F> {
        if n == 0 || d == 0 {
            return Rows { data: &[], n, d, stride: 1 };
        }
        let (first, stride) = if hm {
            ((b * self.hn + h) * self.tn * d, d)
        } else {
            ((b * self.tn * self.hn + h) * d, self.hn * d)
        };
        let start = first + t0 * stride;
        Rows { data: &x[start..start + (n - 1) * stride + d], n, d, stride }
    }
    fn q(&self, bh: (usize, usize), t0: usize, n: usize) -> Rows<'a, F> {
        self.rows(self.q, self.dk, self.q_heads_major, bh, t0, n)
    }
    fn k(&self, bh: (usize, usize), t0: usize, n: usize) -> Rows<'a, F> {
        self.rows(self.k, self.dk, self.kv_heads_major, bh, t0, n)
    }
    fn v(&self, bh: (usize, usize), t0: usize, n: usize) -> Rows<'a, F> {
        self.rows(self.v, self.dv, self.kv_heads_major, bh, t0, n)
    }
}

/// `n` rows of width `d`, row `r` at `data[r·stride..][..d]`.
#[derive(Clone, Copy)]
struct Rows<'a, F> {
    data: &'a [F],
    n: usize,
    d: usize,
    stride: usize,
}

impl<'a, F: VecMath> Rows<'a, F> {
    fn row(&self, r: usize) -> &'a [F] {
        &self.data[r * self.stride..][..self.d]
    }
    /// Rows `j₀..j₀+n` of these rows.
    fn sub(&self, j0: usize, n: usize) -> Rows<'a, F> {
        if n == 0 || self.d == 0 {
            return Rows { data: &[], n, ..*self };
        }
        Rows { data: &self.data[j0 * self.stride..][..(n - 1) * self.stride + self.d], n, ..*self }
    }
    /// As a faer view (`n, d > 0`).
    fn mat(&self) -> MatRef<'a, F> {
        MatRef::from_row_major_slice_with_stride(self.data, self.n, self.d, self.stride)
    }
    /// As an ndarray view (empty rows, `n = 0` or `d = 0`, as an empty `n × d` view).
    fn nd(&self) -> Result<ArrayView2<'a, F>> {
        let shape_err = |e: ndarray::ShapeError| Error::Numerical(format!("attention rows as a view: {e}"));
        if self.n == 0 || self.d == 0 {
            return ArrayView2::from_shape((self.n, self.d), &[]).map_err(shape_err);
        }
        ArrayView2::from_shape((self.n, self.d).strides((self.stride, 1)), self.data).map_err(shape_err)
    }
}

/// Whether some computed `q·k` (queries `q`, keys `k`, rows of length `dk`; all heads at
/// once) may be non-finite in `F`: by Cauchy–Schwarz and `‖x‖ ≤ √Dk · maxᵢ|xᵢ|`, every partial
/// sum of a dot product in `F` is at most `Dk · max|q| · max|k| · (1 + 2·Dk·ε)`, so below
/// `F::MAX` nothing overflows and the per-tile check is skipped. Non-finite inputs give
/// `true`.
#[cfg(test)]
fn may_overflow<F: VecMath>(q: &[F], k: &[F], dk: usize) -> bool {
    overflows::<F>(qk_bound::<F>(q, k, dk))
}

/// Whether a bound of [`qk_bound`] admits an overflow in `F` (NaN: a non-finite input).
fn overflows<F: VecMath>(bound: f64) -> bool {
    bound.is_nan() || bound >= F::max_value().f64()
}

/// The bound `Dk · max|q| · max|k| · (1 + 2·Dk·ε)` of every partial sum of a `q·k` in `F`
/// ([`may_overflow`]); NaN if some entry is not finite.
fn qk_bound<F: VecMath>(q: &[F], k: &[F], dk: usize) -> f64 {
    dk as f64 * max_abs(q) * max_abs(k) * (1.0 + 2.0 * dk as f64 * F::epsilon().f64())
}

/// `maxᵢ |xᵢ|` in `f64`, NaN if some entry is not finite: in parallel blocks, each reduced in
/// sixteen independent lanes (so that the loop vectorises); `x·0` is NaN exactly for the
/// non-finite entries.
fn max_abs<F: VecMath>(x: &[F]) -> f64 {
    const W: usize = 16;
    let block = |b: &[F]| {
        let (mut mx, mut bad) = ([F::zero(); W], [F::zero(); W]);
        let mut chunks = b.chunks_exact(W);
        for c in &mut chunks {
            for ((m, z), &e) in mx.iter_mut().zip(bad.iter_mut()).zip(c) {
                let a = e.abs();
                *m = if a > *m { a } else { *m };
                *z += e * F::zero();
            }
        }
        let rest = chunks.remainder();
        let worst = mx.iter().chain(rest).fold(0.0f64, |w, &e| w.max(e.f64().abs()));
        if bad.iter().chain(rest).any(|&e| !e.is_finite()) { f64::NAN } else { worst }
    };
    x.par_chunks(1 << 16)
        .with_min_len(min_len())
        .map(block)
        .reduce(|| 0.0, |a, b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) })
}

/// `x` cut along `axis` into consecutive pieces of `size` (the last one shorter), each a view
/// of the whole lifetime.
fn pieces<'a, F, D: ndarray::Dimension>(
    x: ArrayViewMut<'a, F, D>,
    axis: usize,
    size: usize,
) -> Vec<ArrayViewMut<'a, F, D>> {
    let mut out = Vec::new();
    let mut rest = x;
    while rest.len_of(Axis(axis)) > size {
        let (a, b) = rest.split_at(Axis(axis), size);
        out.push(a);
        rest = b;
    }
    if rest.len_of(Axis(axis)) > 0 {
        out.push(rest);
    }
    out
}

/// One query block's outputs for one head: `y [nq, Dv]` and `lse [nq]` (views into the
/// `[B,T,H,·]` results).
struct Out<'a, F> {
    b: usize,
    h: usize,
    i0: usize,
    y: ArrayViewMut2<'a, F>,
    lse: ArrayViewMut1<'a, F>,
}

/// Every (batch row, head, query block) of `x`: the normalised outputs into `y [B,T,H,Dv]`
/// and the rows' log-sum-exp into `lse [B,T,H]`. A task takes, per batch row and head, query
/// block `i` together with block `n_b − 1 − i`: the causal work of the two blocks adds up to
/// the same for every pair, so the tasks are of one size and the threads stay balanced over
/// the triangle.
/// Query blocks whose rows all lie before `from_row` are left out (their rows stay zero).
fn drive<F: VecMath>(
    a: &Attention,
    x: &Qkv<'_, F>,
    y: &mut [F],
    lse: &mut [F],
    from_row: usize,
) -> Result<()> {
    let Qkv { bn, tn, hn, dk, dv, .. } = *x;
    if bn * tn * hn == 0 {
        return Ok(());
    }
    let sigma = a.scale(dk);
    let abs = F::of(sigma.abs());
    // A scale below the smallest normal `F` keeps too few bits for the tiled path: exact path.
    let fast = dk > 0 && dv > 0 && sigma != 0.0 && abs.is_finite() && abs >= F::min_positive_value();
    let bound = if fast { qk_bound(x.q, x.k, dk) } else { f64::NAN };
    let risky = fast && overflows::<F>(bound);
    // The fused kernel (f32, AVX-512, Dv ≤ 64) where `|σ|·log₂e·q·k` stays far inside f32.
    let packed = match (F::as_f32(x.k), F::as_f32(x.v)) {
        (Some(k), Some(v))
            if fast && !risky && fused::available(dv) && bound * sigma.abs() * 8.0 < f32::MAX as f64 =>
        {
            Some(fused::Packed::new(k, v, (bn, tn, hn, dk, dv), x.kv_heads_major))
        }
        _ => None,
    }
    .filter(|pk| fused::sums_fit(pk, tn));
    let block = if packed.is_some() { fused::QB } else { FWD_BLOCK_Q };
    let shape_err = |e: ndarray::ShapeError| Error::Numerical(e.to_string());
    let y = ArrayViewMut4::from_shape((bn, tn, hn, dv), y).map_err(shape_err)?;
    let lse = ArrayViewMut3::from_shape((bn, tn, hn), lse).map_err(shape_err)?;
    let mut tasks: Vec<Vec<Out<'_, F>>> = Vec::new();
    for (b, (yb, lb)) in pieces(y, 0, 1).into_iter().zip(pieces(lse, 0, 1)).enumerate() {
        for (h, (yh, lh)) in pieces(yb, 2, 1).into_iter().zip(pieces(lb, 2, 1)).enumerate() {
            let (yh, lh) = (
                yh.index_axis_move(Axis(0), 0).index_axis_move(Axis(1), 0),
                lh.index_axis_move(Axis(0), 0).index_axis_move(Axis(1), 0),
            );
            let mut outs: VecDeque<Out<'_, F>> = pieces(yh, 0, block)
                .into_iter()
                .zip(pieces(lh, 0, block))
                .enumerate()
                .map(|(i, (y, lse))| Out { b, h, i0: i * block, y, lse })
                .filter(|out| out.i0 + out.lse.len() > from_row)
                .collect();
            while let Some(first) = outs.pop_front() {
                tasks.push(std::iter::once(first).chain(outs.pop_back()).collect());
            }
        }
    }
    let lg = a.logits(dk);
    tasks.into_par_iter().with_min_len(min_len()).try_for_each(|task| {
        if let Some(pk) = &packed {
            let mut sc = fused::Scratch::new(dk);
            for mut out in task {
                let nq = out.lse.len();
                let bh = (out.b, out.h);
                let q = x.q(bh, out.i0, nq);
                let done = F::as_f32(q.data).is_some_and(|qf| {
                    let rows = (qf, q.stride, nq, out.i0);
                    fused::query_block(a, pk, out.b * hn + out.h, rows, sigma < 0.0, sigma.abs(), &mut sc)
                });
                if done {
                    for (r, (mut yr, l)) in out.y.rows_mut().into_iter().zip(out.lse.iter_mut()).enumerate() {
                        yr.iter_mut().zip(&sc.y[r]).for_each(|(y, &o)| *y = F::of(o as f64));
                        *l = F::of(sc.lse[r]);
                    }
                } else {
                    let head = Head { q, k: x.k(bh, 0, tn), v: x.v(bh, 0, tn) };
                    if !query_block(
                        a,
                        &head,
                        out.i0,
                        (abs, sigma < 0.0, risky),
                        &mut sc_fallback(nq, dk, dv),
                        &mut out,
                    ) {
                        exact_block(a, &lg, &head, out.i0, &mut out)?;
                    }
                }
            }
            return Ok(());
        }
        let mut sc = Scratch::new(FWD_BLOCK_Q.div_ceil(NR) * NR, dk, dv);
        for mut out in task {
            let nq = out.lse.len();
            let bh = (out.b, out.h);
            let head = Head { q: x.q(bh, out.i0, nq), k: x.k(bh, 0, tn), v: x.v(bh, 0, tn) };
            if !(fast && query_block(a, &head, out.i0, (abs, sigma < 0.0, risky), &mut sc, &mut out)) {
                exact_block(a, &lg, &head, out.i0, &mut out)?;
            }
        }
        Ok(())
    })
}

/// Work buffers of the faer-tiled path for one block (where the fused kernel declined it).
fn sc_fallback<F: VecMath>(nq: usize, dk: usize, dv: usize) -> Scratch<F> {
    Scratch::new(nq.div_ceil(NR) * NR, dk, dv)
}

/// One head's rows for one query block: its queries `q [nq, Dk]` and all keys and values
/// `k [T, Dk]`, `v [T, Dv]`; `h` of `hn` heads (where its outputs go).
struct Head<'a, F> {
    q: Rows<'a, F>,
    k: Rows<'a, F>,
    v: Rows<'a, F>,
}

/// Work buffers of the fast path for query blocks of up to `n` lanes, reused across blocks.
struct Scratch<F> {
    qt: Vec<F>,
    st: Vec<F>,
    ot: Vec<F>,
    m: Vec<F>,
    l: Vec<F>,
    mnew: Vec<F>,
    msafe: Vec<F>,
    corr: Vec<F>,
    psum: Vec<F>,
    bad: Vec<F>,
    first: Vec<usize>,
}

impl<F: VecMath> Scratch<F> {
    fn new(n: usize, dk: usize, dv: usize) -> Self {
        let lanes = || vec![F::zero(); n];
        Scratch {
            qt: vec![F::zero(); dk * n],
            st: vec![F::zero(); BLOCK_K * n],
            ot: vec![F::zero(); dv * n],
            m: lanes(),
            l: lanes(),
            mnew: lanes(),
            msafe: lanes(),
            corr: lanes(),
            psum: lanes(),
            bad: lanes(),
            first: vec![0; n],
        }
    }
}

/// The fast path for the `nq` queries of `head` (rows `i₀..i₀+nq`); `abs` is `|σ|`, `neg`
/// whether `σ < 0` (the sign goes into the queries, exactly), `risky` the bound of
/// [`may_overflow`] for this head. The queries are the lanes of every tile (`n = nq` rounded
/// up to [`NR`], padded with zero queries whose results are dropped), so the online softmax
/// runs down the columns of `Sᵀ [B_k, n]` with no horizontal reductions. Writes the block's
/// normalised outputs and log-sum-exp into `out`; `false` (nothing written) when a computed
/// key `q·k` is not finite in `F` (the caller then takes the exact path).
#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn query_block<F: VecMath>(
    a: &Attention,
    head: &Head<'_, F>,
    i0: usize,
    (abs, neg, risky): (F, bool, bool),
    sc: &mut Scratch<F>,
    out: &mut Out<'_, F>,
) -> bool {
    let Head { q, k, v } = *head;
    let (nq, dk, dv) = (q.n, q.d, v.d);
    let fused = multiversion::target::target_cfg_f!(target_feature = "fma");
    let n = nq.div_ceil(NR) * NR;
    let i1 = i0 + nq;
    let qt = &mut sc.qt[..dk * n];
    qt.fill(F::zero());
    let sign = if neg { -F::one() } else { F::one() };
    for r in 0..nq {
        for (d, &x) in q.row(r).iter().enumerate() {
            qt[d * n + r] = sign * x;
        }
    }
    let qm = MatRef::from_row_major_slice(qt, dk, n);
    // The first visible key of every lane (non-decreasing in the lane).
    let first = &mut sc.first[..n];
    first.iter_mut().enumerate().for_each(|(r, f)| *f = a.first_key(i0 + r));
    let (m, l) = (&mut sc.m[..n], &mut sc.l[..n]);
    m.fill(F::neg_infinity());
    l.fill(F::zero());
    let (mnew, msafe, corr, psum, bad) =
        (&mut sc.mnew[..n], &mut sc.msafe[..n], &mut sc.corr[..n], &mut sc.psum[..n], &mut sc.bad[..n]);
    let ot = &mut sc.ot[..dv * n];
    ot.fill(F::zero());
    let mut j0 = a.first_key(i0) / BLOCK_K * BLOCK_K;
    while j0 < i1 {
        let j1 = (j0 + BLOCK_K).min(i1);
        let nk = j1 - j0;
        let s = &mut sc.st[..nk * n];
        // Sᵀ = K_j Qᵀ.
        let kb = k.sub(j0, nk).mat();
        matmul(MatMut::from_row_major_slice_mut(s, nk, n), Accum::Replace, kb, qm, F::one(), Par::Seq);
        // Finiteness, only where the norm bound allows an overflow (x·0 is NaN exactly when x
        // is not finite).
        if risky {
            bad.fill(F::zero());
            for row in s.chunks_exact(n) {
                for (z, &x) in bad.iter_mut().zip(row) {
                    *z += x * F::zero();
                }
            }
            if bad.iter().any(|z| z.is_nan()) {
                return false;
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
        m.copy_from_slice(mnew);
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
            for (o, &cr) in row.iter_mut().zip(corr.iter()) {
                *o *= cr;
            }
        }
        let pm = MatRef::from_row_major_slice(s, nk, n);
        let om = MatMut::from_row_major_slice_mut(ot, dv, n);
        matmul(om, Accum::Add, v.sub(j0, nk).mat().transpose(), pm, F::one(), Par::Seq);
        j0 = j1;
    }
    for r in 0..nq {
        let inv = F::one() / l[r];
        for (d, y) in out.y.row_mut(r).iter_mut().enumerate() {
            *y = ot[d * n + r] * inv;
        }
        out.lse[r] = abs * m[r] + l[r].ln();
    }
    true
}

/// The exact path for the queries of `head` (rows `i₀..i₀+nq`), unscaled inputs: keys through
/// [`Logits`] (formed again in `f64` where `F` overflowed) and weights in `f64`. Writes the
/// normalised outputs and log-sum-exp into `out`, like the fast path.
fn exact_block<F: VecMath>(
    a: &Attention,
    lg: &Logits,
    head: &Head<'_, F>,
    i0: usize,
    out: &mut Out<'_, F>,
) -> Result<()> {
    const BK: usize = 64;
    let Head { q, k, v } = *head;
    let (nq, dv) = (q.n, v.d);
    let i1 = i0 + nq;
    let qb = q.nd()?;
    // Running maximum key (f64), denominator and accumulator per row.
    let mut m = vec![f64::NEG_INFINITY; nq];
    let mut l = vec![F::zero(); nq];
    let mut o = Array2::<F>::zeros((nq, dv));
    let mut keys = [0.0f64; BK];
    let mut j0 = a.first_key(i0);
    while j0 < i1 {
        let j1 = (j0 + BK).min(i1);
        let (kb, vb) = (k.sub(j0, j1 - j0).nd()?, v.sub(j0, j1 - j0).nd()?);
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
    let abs = a.scale(q.d).abs();
    for r in 0..nq {
        let inv = F::one() / l[r];
        for (y, &x) in out.y.row_mut(r).iter_mut().zip(o.row(r)) {
            *y = x * inv;
        }
        out.lse[r] = F::of(abs * m[r] + l[r].f64().ln());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{max_abs, may_overflow};

    /// The bound: ordinary inputs need no check; entries whose product nears `F::MAX`, or a
    /// non-finite entry, do — in the vectorised part (lengths ≥ 16) and in the remainder.
    #[test]
    fn overflow_bound() {
        for len in [15usize, 37 * 5] {
            let q: Vec<f32> = (0..len).map(|i| (i % 7) as f32 - 3.0).collect();
            assert_eq!(max_abs(&q), 3.0);
            assert!(!may_overflow(&q, &q, 5));
            let big: Vec<f32> = q.iter().map(|x| x * 4e18).collect();
            assert!(may_overflow(&big, &big, 5));
            let small: Vec<f32> = q.iter().map(|x| x * 1e-20).collect();
            assert!(!may_overflow(&big, &small, 5));
            for at in [0, len / 2, len - 1] {
                let mut nan = q.clone();
                nan[at] = f32::NAN;
                assert!(may_overflow(&nan, &q, 5));
                let mut inf = q.clone();
                inf[at] = f32::NEG_INFINITY;
                assert!(may_overflow(&q, &inf, 5));
            }
            // f64 has room where f32 has none.
            let big64: Vec<f64> = big.iter().map(|&x| x as f64).collect();
            assert!(!may_overflow(&big64, &big64, 5));
        }
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
