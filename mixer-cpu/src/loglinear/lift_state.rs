//! The lifts' fast form run from a state and its backward, per (sequence, head) (docs/math.md
//! §7.1): the state is the decoder's merged-ahead Fenwick level states at a position `a`
//! ([`mixer_core::mixers::loglinear::lift_state`]).
//!
//! A run of `T` tokens from position `a` splits at the chunk boundaries `p = min(a + T, ⌈a/C⌉C)`
//! and `q = max(p, ⌊(a + T)/C⌋C)`:
//! - **head** `[a, p)` (the rest of a chunk, `< C` tokens) and **tail** `[q, a + T)` (`< C`
//!   tokens): the literal recurrence ([`run_tokens`], `O(L · D_k D_v)` per token, as the
//!   chunked form's reads);
//! - **middle** `[p, q)`, whole chunks: the chunked sweep of §2.6 ([`super::chunked`]) from
//!   chunk-level states. At a chunk boundary `p` the merged-ahead token levels `1 … c` are empty
//!   (bits `0 … c − 1` of `p` are 0), and token level `c + e` is chunk level `e` after the
//!   merge for chunk `p/C`, so the sweep starts from those with the absolute chunk index `p/C`;
//!   at `q` its states after the last chunk take the merge for chunk `q/C` and become token
//!   levels `c + e` again.
//!
//! The backward runs the three parts in reverse: the tail's reverse mode ([`vjp_tokens`]), the
//! adjoint of the merge at `q`, the chunked backward ([`super::backward_chunked`]) from those
//! adjoints, and the head's reverse mode, whose adjoint of the initial levels is the initial
//! state's gradient.

use faer::{Mat, MatRef};
use mixer_core::fenwick::{merge_level, merge_states};
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::mixers::loglinear::lift_state::{
    Levels, TokenGrads, TokenRows, load, positions, run_tokens, vjp_tokens,
};
use mixer_core::mixers::loglinear::state::STATE;
use mixer_core::state::state_row;
use mixer_core::tensor::get;
use mixer_core::{Error, Result, Tensors};
use ndarray::ArrayD;

use super::backward_chunked::{HeadGrads, head_vjp_levels};
use super::chunked::{run_head_levels, sweep};
use super::common::{Head, Layout};
use crate::vmath::VecMath;

/// The positions (one per sequence of `layout`) and the level tensor of a lift's initial state
/// (checked by [`positions`] for each sequence's length), or position 0 and no tensor without
/// one.
pub(crate) fn initial<'a, F: VecMath>(
    initial: Option<&'a Tensors<F>>,
    layout: &Layout,
) -> Result<(Vec<usize>, Option<&'a ArrayD<F>>)> {
    let Some(s) = initial else { return Ok((vec![0; layout.len()], None)) };
    let lens: Vec<usize> = (0..layout.len()).map(|i| layout.seq(i).1.len()).collect();
    let pos = match lens.first() {
        Some(&t_len) if lens.iter().all(|&n| n == t_len) => positions(s, t_len)?,
        _ => lens
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                positions(&state_row(s, i), n).map(|p| p[0]).map_err(|e| match e {
                    Error::Value { name, constraint, found } => {
                        Error::Value { name: name.replace("[0]", &format!("[{i}]")), constraint, found }
                    }
                    e => e,
                })
            })
            .collect::<Result<_>>()?,
    };
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

fn flat<F: VecMath>(a: MatRef<'_, F>) -> Vec<F> {
    (0..a.nrows()).flat_map(|r| (0..a.ncols()).map(move |c| a[(r, c)])).collect()
}

/// A head's rows as the row-major vectors of [`TokenRows`].
fn owned<F: VecMath>(hd: &Head<'_, F>) -> TokenRows<F> {
    let lam = hd.lam.expect("a lift's head has λ");
    TokenRows {
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

/// Token level `c + e` (`S`, `Dv × Dk` row-major) as chunk level `e ≥ 1` (`H = Sᵀ`).
fn to_chunk_levels<F: VecMath>(
    levels: &Levels<F>,
    cbits: usize,
    dk: usize,
    dv: usize,
) -> Vec<Option<Mat<F>>> {
    let mut out: Vec<Option<Mat<F>>> = vec![None];
    for st in levels.iter().skip(cbits + 1) {
        let nonzero = st.iter().any(|&x| x != F::zero());
        out.push(nonzero.then(|| Mat::from_fn(dk, dv, |c, r| st[r * dk + c])));
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
    mut levels: Levels<F>,
) -> Result<(Mat<F>, Levels<F>)> {
    let (t_len, dk, dv) = (hd.q.nrows(), hd.q.ncols(), hd.v.ncols());
    let cbits = m.chunk_log2() as usize;
    let (p, q) = split(m, pos, t_len);
    let mut y = Mat::<F>::zeros(t_len, dv);
    let tokens = |range: std::ops::Range<usize>, levels: &mut Levels<F>, y: &mut Mat<F>| -> Result<()> {
        let o = owned(&rows(hd, range.clone()));
        let mut yt = vec![F::zero(); range.len() * dv];
        run_tokens(m, &o.tokens(), pos + range.start, levels, &mut yt, None)?;
        for (i, t) in range.enumerate() {
            for r in 0..dv {
                y[(t, r)] = yt[i * dv + r];
            }
        }
        Ok(())
    };
    tokens(0..p, &mut levels, &mut y)?;
    if q > p {
        let c0 = (pos + p) / m.chunk;
        let h0 = to_chunk_levels(&levels, cbits, dk, dv);
        let (ym, mut states) = run_head_levels(m, &rows(hd, p..q), h0, c0)?;
        y.as_mut().subrows_mut(p, q - p).copy_from(&ym);
        merge_states(&mut states, (pos + q) / m.chunk, |a, b| a + b);
        levels = to_token_levels(&states, cbits, levels.len(), dk, dv);
    }
    tokens(q..t_len, &mut levels, &mut y)?;
    Ok((y, levels))
}

/// Adds the token gradients of the rows `at..` into `out`.
fn put_tokens<F: VecMath>(out: &mut HeadGrads<F>, g: &TokenGrads<F>, at: usize) {
    let (dk, dv, nl) = (out.dq.ncols(), out.dv.ncols(), out.dlam.ncols());
    for i in 0..g.dg.len() {
        let t = at + i;
        for c in 0..dk {
            out.dq[(t, c)] = g.dq[i * dk + c];
            out.dk[(t, c)] = g.dk[i * dk + c];
        }
        for r in 0..dv {
            out.dv[(t, r)] = g.dv[i * dv + r];
        }
        out.dg[t] = g.dg[i].f64();
        out.dbeta[t] = g.dbeta[i];
        for l in 0..nl {
            out.dlam[(t, l)] = g.dlam[i * nl + l];
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
    let dy_rows = |r: std::ops::Range<usize>| flat(dy.subrows(r.start, r.len()));
    // Forward to the boundaries: the levels at p (head) and at q (middle).
    let head = owned(&rows(hd, 0..p));
    let mut at_p = initial.clone();
    let mut scratch = vec![F::zero(); p * dv];
    run_tokens(m, &head.tokens(), pos, &mut at_p, &mut scratch, None)?;
    let c0 = (pos + p) / m.chunk;
    let mid = rows(hd, p..q);
    let h0 = to_chunk_levels(&at_p, cbits, dk, dv);
    if q < t_len {
        let at_q = if q > p {
            let mut states = sweep(m, &mid, h0.clone(), c0, false, |_, _, _| Ok(()))?;
            merge_states(&mut states, (pos + q) / m.chunk, |a, b| a + b);
            to_token_levels(&states, cbits, at_p.len(), dk, dv)
        } else {
            at_p.clone()
        };
        // Tail.
        let tail = owned(&rows(hd, q..t_len));
        let gt = vjp_tokens(m, &tail.tokens(), pos + q, &at_q, &dy_rows(q..t_len), &mut d_levels)?;
        put_tokens(&mut out, &gt, q);
    }
    // Middle: the adjoint of the merge at q, then the chunked backward.
    if q > p {
        let mut d_chunks = to_chunk_levels(&d_levels, cbits, dk, dv);
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
    let gh = vjp_tokens(m, &head.tokens(), pos, &initial, &dy_rows(0..p), &mut d_levels)?;
    put_tokens(&mut out, &gh, 0);
    Ok((out, d_levels))
}
