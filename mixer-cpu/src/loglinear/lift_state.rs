//! The lifts' fast form run from a state and its backward, per (sequence, head) (docs/math.md
//! §7.1): the state is the decoder's merged-ahead Fenwick level states at a position `a`
//! ([`mixer_core::mixers::loglinear::lift_state`]).
//!
//! A run of `T` tokens from position `a` splits at the chunk boundaries `p = min(a + T, ⌈a/C⌉C)`
//! and `q = max(p, ⌊(a + T)/C⌋C)`:
//! - **head** `[a, p)` (the rest of a chunk, `< C` tokens) and **tail** `[q, a + T)` (`< C`
//!   tokens): each one partial chunk ([`partial`]) from the merged-ahead token levels at its
//!   start, at the chunked form's cost per token: the chunk's pieces, its intra output with the
//!   levels of the tokens' absolute positions, the read of every held level `ℓ` with
//!   `λ^(max(ℓ, bitlen(t ⊕ start)))`, and the merged-ahead levels at its end formed directly
//!   (held levels transitioned and merged, the run's tokens added by their buckets);
//! - **middle** `[p, q)`, whole chunks: the chunked sweep of §2.6 ([`super::chunked`]) from
//!   chunk-level states. At a chunk boundary `p` the merged-ahead token levels `1 … c` are empty
//!   (bits `0 … c − 1` of `p` are 0), and token level `c + e` is chunk level `e` after the
//!   merge for chunk `p/C`, so the sweep starts from those with the absolute chunk index `p/C`;
//!   at `q` its states after the last chunk take the merge for chunk `q/C` and become token
//!   levels `c + e` again.
//!
//! The backward runs the three parts in reverse: the tail's reverse mode (the partial chunk's,
//! [`partial_vjp`]; only with a cotangent of the final levels, otherwise the chunked backward
//! takes the tail as its partial last chunk), the adjoint of the merge at `q`, the chunked
//! backward ([`super::backward_chunked`]) from those adjoints, and the head's reverse mode
//! ([`partial_vjp`]), whose adjoint of the initial levels is the initial state's gradient. The
//! partial chunk's reverse mode is the whole chunk's with the reads' weights and the adjoints
//! at its end remapped (docs/math.md §7.1, *its reverse mode*), so the head and the tail cost
//! per token what the chunked backward does; the literal recurrence's reverse mode
//! (`vjp_tokens`) is its reference in the tests.

use faer::{Accum, Mat, MatRef};
use mixer_core::fenwick::{bitlen, bucket, merge_level, merge_states};
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::mixers::loglinear::lift_state::{Levels, load, positions_each};
use mixer_core::mixers::loglinear::state::STATE;
use mixer_core::tensor::get;
use mixer_core::{Error, Result, Tensors};
use ndarray::ArrayD;

use super::backward_chunked::{HeadGrads, head_vjp_levels, partial_chunk_vjp};
use super::chunked::{
    Chunk, add_weighted_rows, chunk_pieces, intra_into, mm, own_state_factors, run_head_levels, sweep,
    transition,
};
use super::common::{Head, Layout};
use crate::vmath::VecMath;

/// The positions (one per sequence of `layout`) and the level tensor of a lift's initial state
/// (checked by [`positions_each`] for each sequence's length), or position 0 and no tensor without
/// one.
pub(crate) fn initial<'a, F: VecMath>(
    initial: Option<&'a Tensors<F>>,
    layout: &Layout,
) -> Result<(Vec<usize>, Option<&'a ArrayD<F>>)> {
    let Some(s) = initial else { return Ok((vec![0; layout.len()], None)) };
    let lens: Vec<usize> = (0..layout.len()).map(|i| layout.seq(i).1.len()).collect();
    let pos = positions_each(s, &lens)?;
    Ok((pos, Some(get(s, STATE)?)))
}

/// The levels `0 … L` of one head of a state tensor (zero without one).
pub(crate) fn levels_of<F: VecMath>(
    s: Option<&ArrayD<F>>,
    b: usize,
    h: usize,
    nl: usize,
    dk: usize,
    dv: usize,
) -> Levels<F> {
    match s {
        Some(s) => load(s, b, h),
        None => vec![vec![F::zero(); dv * dk]; nl + 1],
    }
}

/// Rows `r` of a head as a head of its own (views, no copies of `q, k, v, λ`).
fn rows<'a, F: VecMath>(hd: &Head<'a, F>, r: std::ops::Range<usize>) -> Head<'a, F> {
    let n = r.len();
    Head {
        b: hd.b,
        h: hd.h,
        q: hd.q.subrows(r.start, n),
        k: hd.k.subrows(r.start, n),
        v: hd.v.subrows(r.start, n),
        g: hd.g[r.clone()].to_vec(),
        beta: hd.beta[r.clone()].to_vec(),
        lam: hd.lam.map(|l| l.subrows(r.start, n)),
    }
}

#[cfg(test)]
fn flat<F: VecMath>(a: MatRef<'_, F>) -> Vec<F> {
    (0..a.nrows()).flat_map(|r| (0..a.ncols()).map(move |c| a[(r, c)])).collect()
}

/// A head's rows as the row-major vectors of `TokenRows` (the literal recurrence's, for the
/// tests).
#[cfg(test)]
fn owned<F: VecMath>(hd: &Head<'_, F>) -> mixer_core::mixers::loglinear::lift_state::TokenRows<F> {
    let lam = hd.lam.expect("a lift's head has λ");
    mixer_core::mixers::loglinear::lift_state::TokenRows {
        q: flat(hd.q),
        k: flat(hd.k),
        v: flat(hd.v),
        g: hd.g.clone(),
        beta: hd.beta.clone(),
        lam: flat(lam),
        dims: (hd.q.ncols(), hd.v.ncols(), lam.ncols()),
    }
}

/// The split points `(p, q)` of a run of `t_len` tokens from `pos`, relative to `pos`.
fn split(m: &LogLinear, pos: usize, t_len: usize) -> (usize, usize) {
    let (c, end) = (m.chunk, pos + t_len);
    let p = end.min(pos.div_ceil(c) * c);
    let q = p.max(end / c * c);
    (p - pos, q - pos)
}

/// Token level `c + e` (`S`, `Dv × Dk` row-major) as chunk level `e ≥ 1` (`H = Sᵀ`). An all-zero
/// level is left out unless it is live at the position `live_at` (a zero initial state still has
/// an adjoint: the initial state's gradient does not depend on its value).
fn to_chunk_levels<F: VecMath>(
    levels: &Levels<F>,
    cbits: usize,
    dk: usize,
    dv: usize,
    live_at: Option<usize>,
) -> Vec<Option<Mat<F>>> {
    let mut out: Vec<Option<Mat<F>>> = vec![None];
    for (l, st) in levels.iter().enumerate().skip(cbits + 1) {
        let nonzero = st.iter().any(|&x| x != F::zero());
        let live = live_at.is_some_and(|a| bucket(a, l).is_some());
        out.push((nonzero || live).then(|| as_h(st, dk, dv)));
    }
    out
}

/// Chunk level `e ≥ 1` as token level `c + e` of `nlev` levels (level `c` and below zero; chunk
/// level 0 is dropped: it is empty after a merge, and has no adjoint in the state).
fn to_token_levels<F: VecMath>(
    chunks: &[Option<Mat<F>>],
    cbits: usize,
    nlev: usize,
    dk: usize,
    dv: usize,
) -> Levels<F> {
    let mut levels = vec![vec![F::zero(); dv * dk]; nlev.max(cbits + chunks.len())];
    for (e, h) in chunks.iter().enumerate().skip(1) {
        if let Some(h) = h {
            let st = &mut levels[cbits + e];
            for c in 0..dk {
                for r in 0..dv {
                    st[r * dk + c] = h[(c, r)];
                }
            }
        }
    }
    levels
}

/// One head of a lift run from the merged-ahead `levels` at position `pos` (module
/// documentation): `y` (`T×Dv`) and the merged-ahead levels at `pos + T`.
pub(crate) fn run_head<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    pos: usize,
    levels: Levels<F>,
) -> Result<(Mat<F>, Levels<F>)> {
    let (t_len, dk, dv) = (hd.q.nrows(), hd.q.ncols(), hd.v.ncols());
    let cbits = m.chunk_log2() as usize;
    let (p, q) = split(m, pos, t_len);
    let mut y = Mat::<F>::zeros(t_len, dv);
    let mut levels = partial(m, hd, pos, 0..p, levels, y.as_mut())?;
    if q > p {
        let c0 = (pos + p) / m.chunk;
        let h0 = to_chunk_levels(&levels, cbits, dk, dv, Some(pos + p));
        let (ym, mut states) = run_head_levels(m, &rows(hd, p..q), h0, c0)?;
        y.as_mut().subrows_mut(p, q - p).copy_from(&ym);
        merge_states(&mut states, (pos + q) / m.chunk, |a, b| a + b);
        levels = to_token_levels(&states, cbits, levels.len(), dk, dv);
    }
    let levels = partial(m, hd, pos, q..t_len, levels, y.as_mut())?;
    Ok((y, levels))
}

/// A partial chunk's rows `r` of a head run from position `pos`, and what [`partial`] and
/// [`partial_vjp`] both need: its first row `i0` and length `n`, the head's `Dk, Dv`, λ and its
/// levels `nl`, the absolute start `a` and end `E`, `h = bitlen(E ⊕ a)`, and the chunk's pieces.
struct Span<'a, F: VecMath> {
    i0: usize,
    n: usize,
    dk: usize,
    dv: usize,
    lam: MatRef<'a, F>,
    nl: usize,
    a: usize,
    end: usize,
    h: usize,
    ck: Chunk<F>,
}

impl<'a, F: VecMath> Span<'a, F> {
    /// `None` for an empty range; an error for a head without λ.
    fn of(m: &LogLinear, hd: &Head<'a, F>, pos: usize, r: &std::ops::Range<usize>) -> Result<Option<Self>> {
        let (i0, n) = (r.start, r.len());
        if n == 0 {
            return Ok(None);
        }
        let lam = hd.lam.ok_or_else(|| Error::config(&m.name, "a lift's head needs λ"))?;
        let (a, end) = (pos + i0, pos + r.end);
        Ok(Some(Span {
            i0,
            n,
            dk: hd.q.ncols(),
            dv: hd.v.ncols(),
            lam,
            nl: lam.ncols(),
            a,
            end,
            h: bitlen(end ^ a),
            ck: chunk_pieces(m, hd, i0, n),
        }))
    }
}

/// The rows `r` of a head (tokens `[a, E)`, `a = pos + r.start`, `E = pos + r.end`, inside one
/// chunk: `E ≤ (⌊a/C⌋ + 1)·C`) run as one partial chunk from the merged-ahead token `levels`
/// at `a` (docs/math.md §7.1, *head and tail*): writes rows `r` of `y` and returns the
/// merged-ahead levels at `E`. With the chunk's pieces ([`chunk_pieces`] of these rows, `γ`
/// local to them):
/// - `y = (Λ ⊙ A) V` inside the rows ([`intra_into`], `Λ` at the tokens' absolute positions),
///   plus, for every level `ℓ ≥ 1` held at `a`, the read `λ_t^(max(ℓ, bitlen(t ⊕ a))) (Q̃ H^(ℓ))_t`:
///   every token `s` of that bucket (`bitlen(a ⊕ s) = ℓ`) lies at level
///   `max(ℓ, bitlen(t ⊕ a))` of `t ≥ a`;
/// - the levels at `E`, with `h = bitlen(E ⊕ a)`: level `ℓ > h` is level `ℓ` at `a` after the
///   chunk's transition ([`transition`]), level `h` the sum of the transitioned levels `< h`,
///   and each level `ℓ ≤ h` also receives the run's tokens of its bucket at `E`
///   (`{ s ∈ [a, E) : bitlen(E ⊕ s) = ℓ }`, a contiguous block `B`): `X_B diag(β_B) V_B` with
///   `X = K̂ᵀ T⁻¹` (`K̂ᵀ` without the delta rule), the part of the chunk's own state `K̂ᵀ Ũ`
///   that those tokens add.
///
/// An error when a level that holds a state is read beyond λ's levels.
fn partial<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    pos: usize,
    r: std::ops::Range<usize>,
    levels: Levels<F>,
    mut y: faer::MatMut<'_, F>,
) -> Result<Levels<F>> {
    let Some(Span { i0, n, dk, dv, lam, nl, a, end, h, ck }) = Span::of(m, hd, pos, &r)? else {
        return Ok(levels);
    };
    let mut y = y.as_mut().subrows_mut(i0, n);
    intra_into(m, hd, i0, n, a, ck.p.clone(), ck.wy.as_ref(), y.as_mut())?;
    let mut out = vec![vec![F::zero(); dv * dk]; levels.len().max(h + 1)];
    // Reads and transition of the levels held at a, stacked: Z = [H^(ℓ_1) | H^(ℓ_2) | …].
    let live: Vec<usize> = (1..levels.len()).filter(|&l| levels[l].iter().any(|&x| x != F::zero())).collect();
    if !live.is_empty() {
        let mut zcat = Mat::<F>::zeros(dk, dv * live.len());
        for (j, &l) in live.iter().enumerate() {
            zcat.as_mut().submatrix_mut(0, j * dv, dk, dv).copy_from(as_h(&levels[l], dk, dv));
        }
        let (next, off) = transition(&ck, m.base, &zcat, true);
        let read = if off > 0 {
            next.subrows(0, off).to_owned()
        } else {
            let mut rd = Mat::<F>::zeros(n, zcat.ncols());
            mm(rd.as_mut(), Accum::Replace, ck.qt.as_ref(), zcat.as_ref(), F::one());
            rd
        };
        for (j, &l) in live.iter().enumerate() {
            let w = (0..n)
                .map(|x| {
                    let lt = l.max(bitlen((a + x) ^ a));
                    if lt >= nl {
                        return Err(m.level_error(a + x, a + x, lt, nl));
                    }
                    Ok(lam[(i0 + x, lt)])
                })
                .collect::<Result<Vec<F>>>()?;
            add_weighted_rows(y.as_mut(), read.subcols(j * dv, dv), &w);
            add_transposed(&mut out[l.max(h)], next.submatrix(off, j * dv, dk, dv));
        }
    }
    // The run's tokens by their buckets at E: X_B diag(β_B) V_B.
    let (x, bv) = own_state_factors(hd, &ck);
    let mut hb = Mat::<F>::zeros(dk, dv);
    for l in 1..=h {
        let Some(b) = bucket(end, l) else { continue };
        let (s0, s1) = (b.start.max(a), b.end.min(end));
        if s0 >= s1 {
            continue;
        }
        mm(hb.as_mut(), Accum::Replace, x.subcols(s0 - a, s1 - s0), bv.subrows(s0 - a, s1 - s0), F::one());
        add_transposed(&mut out[l], hb.as_ref());
    }
    Ok(out)
}

/// The reverse mode of [`partial`] (docs/math.md §7.1, *its reverse mode*): from `dy` (the
/// head's cotangent, rows `r` read) and the adjoint `d_end` of the merged-ahead levels at `E`,
/// accumulates the gradients of rows `r` into `out` and returns the adjoint of the levels at
/// `a` (the held levels `ℓ` with bit `ℓ − 1` of `a` set, or holding a state; zero elsewhere).
/// Per held level `ℓ`: the read's weight at row `t` is `λ^(ℓ_t)`, `ℓ_t = max(ℓ, bitlen(t ⊕ a))`,
/// and the adjoint of its transitioned state is `H̄^(max(ℓ, h))` at `E`; the run's tokens of the
/// bucket `B` of level `ℓ ≤ h` at `E` take `H̄^(ℓ)` ([`partial_chunk_vjp`]). The chunk's pieces
/// are formed again from its rows. An error where [`partial`] gives one (a held level read
/// beyond λ's levels).
#[allow(clippy::too_many_arguments)]
fn partial_vjp<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    pos: usize,
    r: std::ops::Range<usize>,
    levels: &Levels<F>,
    dy: MatRef<'_, F>,
    d_end: Levels<F>,
    out: &mut HeadGrads<F>,
) -> Result<Levels<F>> {
    let Some(Span { i0, n, dk, dv, lam, nl, a, end, h, ck }) = Span::of(m, hd, pos, &r)? else {
        return Ok(d_end);
    };
    let nonzero = |st: &[F]| st.iter().any(|&x| x != F::zero());
    let held: Vec<usize> =
        (1..levels.len()).filter(|&l| bucket(a, l).is_some() || nonzero(&levels[l])).collect();
    let mut zcat = Mat::<F>::zeros(dk, dv * held.len());
    let mut dzp = Mat::<F>::zeros(dk, dv * held.len());
    let mut any = false;
    // λ column of held level j at row x (None: beyond λ, a level that holds no state).
    let mut cols = Vec::with_capacity(held.len());
    for (j, &l) in held.iter().enumerate() {
        zcat.as_mut().submatrix_mut(0, j * dv, dk, dv).copy_from(as_h(&levels[l], dk, dv));
        if let Some(d) = d_end.get(l.max(h)).filter(|d| nonzero(d)) {
            dzp.as_mut().submatrix_mut(0, j * dv, dk, dv).copy_from(as_h(d, dk, dv));
            any = true;
        }
        let col = (0..n)
            .map(|x| {
                let lt = l.max(bitlen((a + x) ^ a));
                match (lt < nl, nonzero(&levels[l])) {
                    (true, _) => Ok(Some(lt)),
                    (false, false) => Ok(None),
                    (false, true) => Err(m.level_error(a + x, a + x, lt, nl)),
                }
            })
            .collect::<Result<Vec<Option<usize>>>>()?;
        cols.push(col);
    }
    let read = |j: usize, x: usize| match cols[j][x] {
        Some(l) => (lam[(i0 + x, l)], Some(l)),
        None => (F::zero(), None),
    };
    // The adjoints of the run's tokens' blocks at E.
    let mut blocks = Vec::new();
    for l in 1..=h {
        let (Some(b), Some(d)) = (bucket(end, l), d_end.get(l)) else { continue };
        let (s0, s1) = (b.start.max(a), b.end.min(end));
        if s0 < s1 && nonzero(d) {
            blocks.push((s0 - a..s1 - a, as_h(d, dk, dv)));
        }
    }
    let dz = partial_chunk_vjp(m, hd, dy, &ck, a, &zcat, read, any.then_some(&dzp), &blocks, out)?;
    let mut d_start = vec![vec![F::zero(); dv * dk]; levels.len()];
    for (j, &l) in held.iter().enumerate() {
        add_transposed(&mut d_start[l], dz.submatrix(0, j * dv, dk, dv));
    }
    Ok(d_start)
}

/// A level state `S` (`D_v × D_k`, row-major) as `H = Sᵀ` (`D_k × D_v`), the chunked form's
/// orientation.
fn as_h<F: VecMath>(st: &[F], dk: usize, dv: usize) -> Mat<F> {
    Mat::from_fn(dk, dv, |c, d| st[d * dk + c])
}

/// `st += Hᵀ` (`st` a level state `S`, `Dv × Dk` row-major; `H` its `Dk × Dv` transpose form).
fn add_transposed<F: VecMath>(st: &mut [F], h: MatRef<'_, F>) {
    let dk = h.nrows();
    for c in 0..dk {
        for d in 0..h.ncols() {
            st[d * dk + c] += h[(c, d)];
        }
    }
}

/// The backward of [`run_head`]: from `dy` (`T×Dv`) and the adjoint `d_levels` of the final
/// levels, the gradients and the adjoint of the initial levels.
pub(crate) fn head_vjp<F: VecMath>(
    m: &LogLinear,
    hd: &Head<'_, F>,
    pos: usize,
    initial: Levels<F>,
    dy: MatRef<'_, F>,
    mut d_levels: Levels<F>,
) -> Result<(HeadGrads<F>, Levels<F>)> {
    let (t_len, dk, dv) = (hd.q.nrows(), hd.q.ncols(), hd.v.ncols());
    let nl = hd.lam.map_or(0, |l| l.ncols());
    let cbits = m.chunk_log2() as usize;
    let (p, q) = split(m, pos, t_len);
    // Without an adjoint of the final levels, the chunked backward takes the partial last chunk
    // too (the adjoint after it is zero, whatever the levels' layout there): only a head that
    // starts off a chunk boundary runs token by token. With one, the tail does, from the token
    // levels at the last chunk boundary.
    let q = if d_levels.iter().all(|l| l.iter().all(|&x| x == F::zero())) { t_len } else { q };
    let mut out = HeadGrads::zeros(t_len, dk, dv, nl);
    // Forward to the boundaries: the levels at p (head, as a partial chunk) and at q (middle).
    let at_p = partial(m, hd, pos, 0..p, initial.clone(), Mat::<F>::zeros(p, dv).as_mut())?;
    let c0 = (pos + p) / m.chunk;
    let mid = rows(hd, p..q);
    let h0 = to_chunk_levels(&at_p, cbits, dk, dv, Some(pos + p));
    if q < t_len {
        let at_q = if q > p {
            let mut states = sweep(m, &mid, h0.clone(), c0, false, |_, _, _| Ok(()))?;
            merge_states(&mut states, (pos + q) / m.chunk, |a, b| a + b);
            to_token_levels(&states, cbits, at_p.len(), dk, dv)
        } else {
            at_p.clone()
        };
        // Tail.
        d_levels = partial_vjp(m, hd, pos, q..t_len, &at_q, dy, d_levels, &mut out)?;
    }
    // Middle: the adjoint of the merge at q, then the chunked backward.
    if q > p {
        let mut d_chunks = to_chunk_levels(&d_levels, cbits, dk, dv, None);
        if let Some(mg) = merge_level((pos + q) / m.chunk) {
            if d_chunks.len() < mg + 2 {
                d_chunks.resize(mg + 2, None);
            }
            let top = d_chunks[mg + 1].clone();
            for slot in &mut d_chunks[..=mg] {
                slot.clone_from(&top);
            }
        }
        let (gm, d_h0) = head_vjp_levels(m, &mid, dy.subrows(p, q - p), h0, c0, d_chunks)?;
        for t in 0..q - p {
            for c in 0..dk {
                out.dq[(p + t, c)] = gm.dq[(t, c)];
                out.dk[(p + t, c)] = gm.dk[(t, c)];
            }
            for r in 0..dv {
                out.dv[(p + t, r)] = gm.dv[(t, r)];
            }
            out.dg[p + t] = gm.dg[t];
            out.dbeta[p + t] = gm.dbeta[t];
            for l in 0..nl {
                out.dlam[(p + t, l)] = gm.dlam[(t, l)];
            }
        }
        d_levels = to_token_levels(&d_h0, cbits, at_p.len(), dk, dv);
    }
    // Head.
    let d_levels = partial_vjp(m, hd, pos, 0..p, &initial, dy, d_levels, &mut out)?;
    Ok((out, d_levels))
}

#[cfg(test)]
mod tests {
    use super::super::common;
    use super::*;
    use mixer_core::Dims;
    use mixer_core::mixer::{Mixer, complete_dims};
    use mixer_core::mixers::loglinear::lift_state::{run_tokens, vjp_tokens};
    use mixer_core::mixers::loglinear::{Base, LambdaScheme, LevelMask, Lift};

    fn lift(base: Base, chunk: usize) -> LogLinear {
        let lift = Lift { mask: LevelMask::fenwick(), lambda: LambdaScheme::identity() };
        LogLinear::new(base.name(), base, Some(lift), 0.7, chunk).unwrap()
    }

    /// Merged-ahead levels `0 … nl` at position `a`: level `ℓ ≥ 1` holds entries in `[−1, 1]`
    /// exactly where bit `ℓ − 1` of `a` is set (a valid state), the others zero.
    fn levels_at(a: usize, nl: usize, width: usize, seed: usize) -> Levels<f64> {
        (0..=nl)
            .map(|l| {
                let live = l >= 1 && (a >> (l - 1)) & 1 == 1;
                (0..width)
                    .map(|i| if live { ((i * 7 + seed * 13 + l * 5) % 17) as f64 / 8.0 - 1.0 } else { 0.0 })
                    .collect()
            })
            .collect()
    }

    /// The largest entry-wise difference of two level arrays (the shorter padded with zeros),
    /// and the largest entry.
    fn level_error(got: &Levels<f64>, want: &Levels<f64>) -> (f64, f64) {
        let (mut err, mut big) = (0.0f64, 0.0f64);
        for l in 0..got.len().max(want.len()) {
            let (g, w) = (got.get(l), want.get(l));
            let width = g.or(w).map_or(0, Vec::len);
            for i in 0..width {
                let (x, y) = (g.map_or(0.0, |g| g[i]), w.map_or(0.0, |w| w[i]));
                err = err.max((x - y).abs());
                big = big.max(y.abs());
            }
        }
        (err, big)
    }

    /// [`run_head`] (partial chunks for the head and the tail, the chunked sweep between) against
    /// the literal recurrence from the same state, for the three lifts with chunks of 64 and
    /// 16: runs from positions on and off chunk and Fenwick boundaries (0, 1, 5, 47, 62, 63, 64,
    /// 100, 127, 129), so heads of 63, 59, 17, 2 and 1 tokens and none, and lengths that leave
    /// tails of 1, 2, 17 and 63 tokens, whole runs inside one chunk, and runs with whole chunks
    /// between: the outputs and the final merged-ahead levels.
    #[test]
    fn partial_chunks_from_a_state_are_the_literal_recurrence() {
        let (dk, dv, nl) = (5, 3, 10);
        for base in [Base::LinearAttention, Base::Mamba2, Base::GatedDeltaNet] {
            for chunk in [64, 16] {
                let m = lift(base, chunk);
                for (case, t_len) in [1usize, 2, 17, 63, 64, 81, 150].into_iter().enumerate() {
                    let dims: Dims = [("B", 1), ("T", t_len), ("H", 1), ("Dk", dk), ("Dv", dv), ("L", nl)]
                        .into_iter()
                        .collect();
                    let x = m.random_inputs(&complete_dims(&m, &dims), case as u64).unwrap();
                    let lam = m.lambda_weights_ref(get(&x, "lambda").unwrap(), None).unwrap();
                    let (_, _, heads) = common::heads(&m, &x, Some(&lam), None).unwrap();
                    let hd = &heads[0];
                    let o = owned(hd);
                    for a in [0usize, 1, 5, 47, 62, 63, 64, 100, 127, 129] {
                        let what = format!("{} C = {chunk}, T = {t_len} from {a}", m.name);
                        let levels = levels_at(a, nl, dv * dk, case + a);
                        let (y, fin) = run_head(&m, hd, a, levels.clone()).unwrap();
                        let mut want_fin = levels;
                        let mut want_y = vec![0.0; t_len * dv];
                        run_tokens(&m, &o.tokens(), a, &mut want_fin, &mut want_y, None).unwrap();
                        let big = want_y.iter().fold(1.0f64, |b, &v| b.max(v.abs()));
                        for t in 0..t_len {
                            for d in 0..dv {
                                let err = (y[(t, d)] - want_y[t * dv + d]).abs();
                                assert!(err <= 1e-12 * big, "{what}: y[{t}, {d}] off by {err:e}");
                            }
                        }
                        let (err, big) = level_error(&fin, &want_fin);
                        assert!(err <= 1e-12 * big.max(1.0), "{what}: final levels off by {err:e}");
                    }
                }
            }
        }
    }

    /// The largest entry-wise difference of `got` against `want`, relative to `want`'s largest
    /// entry (at least 1).
    fn rel_error(got: impl Iterator<Item = f64>, want: &[f64]) -> f64 {
        let big = want.iter().fold(1.0f64, |b, &v| b.max(v.abs()));
        got.zip(want).fold(0.0f64, |e, (g, &w)| e.max((g - w).abs())) / big
    }

    /// The reverse mode of the partial chunk ([`partial_vjp`]) against the literal recurrence's
    /// ([`vjp_tokens`]) from the same levels, for the three lifts with chunks of 64 and 16: from
    /// positions 0, 1, 5, 47, 62, 63, 64, 100, 127, 129, runs of 1, 2, 17 and 63 tokens and the
    /// rest of the chunk (those inside one chunk), from a row inside a longer head (so rows are
    /// offset), with random cotangents of `y` and of the levels at the end (the levels that hold
    /// tokens there): every input's gradient (the other rows' zero) and the adjoint of the
    /// levels held at the start, to 1e-10.
    #[test]
    fn the_partial_chunks_reverse_mode_is_the_literal_recurrences() {
        let (dk, dv, nl) = (5, 3, 10);
        let mut checked = 0;
        for base in [Base::LinearAttention, Base::Mamba2, Base::GatedDeltaNet] {
            for chunk in [64, 16] {
                let m = lift(base, chunk);
                for a in [0usize, 1, 5, 47, 62, 63, 64, 100, 127, 129] {
                    let room = (a / chunk + 1) * chunk - a;
                    let mut lens: Vec<usize> =
                        [1, 2, 17, 63, room].into_iter().filter(|&n| n <= room).collect();
                    lens.dedup();
                    for n in lens {
                        let what = format!("{} C = {chunk}, {n} tokens from {a}", m.name);
                        let i0 = a.min(3);
                        let t_len = i0 + n + 2;
                        let dims: Dims =
                            [("B", 1), ("T", t_len), ("H", 1), ("Dk", dk), ("Dv", dv), ("L", nl)]
                                .into_iter()
                                .collect();
                        let seed = (a * 131 + n) as u64;
                        let x = m.random_inputs(&complete_dims(&m, &dims), seed).unwrap();
                        let lam = m.lambda_weights_ref(get(&x, "lambda").unwrap(), None).unwrap();
                        let (_, _, heads) = common::heads(&m, &x, Some(&lam), None).unwrap();
                        let hd = &heads[0];
                        let levels = levels_at(a, nl, dv * dk, n + a);
                        let end = a + n;
                        let d_end: Levels<f64> = levels_at(end, nl + 1, dv * dk, 3 * n + 1)
                            .into_iter()
                            .map(|l| l.into_iter().map(|v| 0.5 * v + 0.125).collect::<Vec<f64>>())
                            .enumerate()
                            .map(
                                |(l, v)| {
                                    if l >= 1 && (end >> (l - 1)) & 1 == 1 { v } else { vec![0.0; v.len()] }
                                },
                            )
                            .collect();
                        let dy =
                            Mat::<f64>::from_fn(t_len, dv, |t, d| ((t * 5 + d * 3) % 7) as f64 / 3.0 - 1.0);
                        let mut out = HeadGrads::zeros(t_len, dk, dv, nl);
                        let r = i0..i0 + n;
                        let d_start = partial_vjp(
                            &m,
                            hd,
                            a - i0,
                            r.clone(),
                            &levels,
                            dy.as_ref(),
                            d_end.clone(),
                            &mut out,
                        )
                        .unwrap();
                        let o = owned(&rows(hd, r.clone()));
                        let mut want_start = d_end;
                        let want = vjp_tokens(
                            &m,
                            &o.tokens(),
                            a,
                            &levels,
                            &flat(dy.subrows(i0, n)),
                            &mut want_start,
                        )
                        .unwrap();
                        let row = |mat: &Mat<f64>, t: usize| {
                            (0..mat.ncols()).map(move |c| mat[(t, c)]).collect::<Vec<_>>()
                        };
                        let rows_of =
                            |mat: &Mat<f64>| r.clone().flat_map(|t| row(mat, t)).collect::<Vec<f64>>();
                        let errs = [
                            ("q", rel_error(rows_of(&out.dq).into_iter(), &want.dq)),
                            ("k", rel_error(rows_of(&out.dk).into_iter(), &want.dk)),
                            ("v", rel_error(rows_of(&out.dv).into_iter(), &want.dv)),
                            ("g", rel_error(out.dg[r.clone()].iter().copied(), &want.dg)),
                            ("beta", rel_error(out.dbeta[r.clone()].iter().copied(), &want.dbeta)),
                            ("lambda", rel_error(rows_of(&out.dlam).into_iter(), &want.dlam)),
                        ];
                        for (name, err) in errs {
                            // Linear attention takes no log-decays (its g̃ is not an input).
                            if name == "g" && !base.has_decay() {
                                continue;
                            }
                            assert!(err <= 1e-10, "{what}: d{name} off by {err:e} (relative)");
                        }
                        // The other rows get nothing.
                        for t in (0..t_len).filter(|t| !r.contains(t)) {
                            let z = row(&out.dq, t)
                                .iter()
                                .chain(&row(&out.dk, t))
                                .chain(&row(&out.dv, t))
                                .chain(&row(&out.dlam, t))
                                .all(|&v| v == 0.0)
                                && (out.dg[t] == 0.0 || !base.has_decay())
                                && out.dbeta[t] == 0.0;
                            assert!(z, "{what}: row {t} outside the chunk got a gradient");
                        }
                        // The adjoint of the levels held at a (the state's subspace).
                        for l in (1..=nl).filter(|&l| (a >> (l - 1)) & 1 == 1) {
                            let err = rel_error(d_start[l].iter().copied(), &want_start[l]);
                            assert!(err <= 1e-10, "{what}: adjoint of level {l} at the start off by {err:e}");
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 100, "{checked} cases");
    }

    /// A level that holds a state and is read beyond λ's levels is an error of the partial chunk
    /// (a head, and a tail after whole chunks), not a read out of bounds.
    #[test]
    fn a_partial_chunk_reading_past_lambda_is_refused() {
        let (dk, dv, nl) = (2, 2, 4);
        let m = lift(Base::Mamba2, 4);
        for (t_len, a) in [(3usize, 5usize), (9, 4)] {
            let dims: Dims =
                [("B", 1), ("T", t_len), ("H", 1), ("Dk", dk), ("Dv", dv), ("L", nl)].into_iter().collect();
            let x = m.random_inputs(&complete_dims(&m, &dims), 1).unwrap();
            let lam = m.lambda_weights_ref(get(&x, "lambda").unwrap(), None).unwrap();
            let (_, _, heads) = common::heads(&m, &x, Some(&lam), None).unwrap();
            // Level 5 (slot 4) held, λ has levels 0 … 3.
            let mut levels = levels_at(a, nl, dv * dk, 0);
            levels.push(vec![0.5; dv * dk]);
            let e = run_head(&m, &heads[0], a, levels).unwrap_err().to_string();
            assert!(e.contains("λ needs more than"), "T = {t_len} from {a}: {e}");
        }
    }
}
