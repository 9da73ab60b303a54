//! Per-(sequence, head) views of the log-linear family's inputs, the per-head forms run over
//! them ([`run_heads`]), and the masked decay factors.
//!
//! A *sequence* is one batch row of a plain call, or one `cu_seqlens` range of a packed call
//! (`B = 1`, docs/math.md §7.2): [`Layout`] says where each lies in the buffer. A head of a
//! packed sequence is a view of its rows only, so every per-head form restarts at each sequence
//! start and computes exactly what it computes on the sequence run alone.

use std::ops::Range;

use faer::{Mat, MatMut, MatRef};
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::parallel::min_len;
use mixer_core::tensor::get;
use mixer_core::{Error, Real, Result, Tensors};
use ndarray::{ArrayD, ArrayView3, Ix3};
use rayon::prelude::*;

use crate::vmath::VecMath;

/// One (sequence, head) slice of the inputs: strided views `x[b, r, h, :]` (the sequence's
/// batch row `b` and tokens `r`) into the (row-major) input tensors, no copies.
pub struct Head<'a, F: Real> {
    /// The sequence ([`Layout`]): the batch row of a plain call, the index of a packed sequence;
    /// so also the row of a state tensor.
    pub b: usize,
    /// Head.
    pub h: usize,
    /// Queries `T×Dk`.
    pub q: MatRef<'a, F>,
    /// Keys `T×Dk`.
    pub k: MatRef<'a, F>,
    /// Values `T×Dv`.
    pub v: MatRef<'a, F>,
    /// Log-decays in `f64` (zeros for linear attention).
    pub g: Vec<f64>,
    /// Delta-rule strengths (ones unless gated DeltaNet).
    pub beta: Vec<F>,
    /// λ weights (after the λ scheme), `T×L`; `None` for the base mixers.
    pub lam: Option<MatRef<'a, F>>,
}

fn view3<'a, F: Real>(x: &'a Tensors<F>, name: &str) -> Result<ArrayView3<'a, F>> {
    get(x, name)?
        .view()
        .into_dimensionality::<Ix3>()
        .map_err(|e| Error::shape(name, "rank 3 [B, T, H]", e.to_string()))
}

/// Sizes of a call's buffer.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Batch rows.
    pub b: usize,
    /// Tokens per batch row.
    pub t: usize,
    /// Heads.
    pub h: usize,
    /// Key dim.
    pub dk: usize,
    /// Value dim.
    pub dv: usize,
}

/// A rank-4 `[B, T, H, D]` tensor in standard (row-major) layout, as a flat slice and its
/// shape.
struct Flat4<'a, F> {
    data: &'a [F],
    shape: [usize; 4],
}

impl<'a, F: Real> Flat4<'a, F> {
    fn new(a: &'a ArrayD<F>, name: &str) -> Result<Self> {
        let shape: [usize; 4] = a.shape().try_into().map_err(|_| {
            Error::shape(name, "rank 4 [B, T, H, ·]", mixer_core::error::fmt_shape(a.shape()))
        })?;
        let data = a.as_slice().ok_or_else(|| Error::Backend {
            backend: "cpu".into(),
            family: Some("loglinear".into()),
            message: format!("input `{name}` is not in standard layout"),
        })?;
        Ok(Flat4 { data, shape })
    }
    /// `x[b, r, h, :]` as an `|r|×D` view with row stride `H·D`.
    /// With no rows or `D = 0` the view is empty and no offset into the data is formed
    /// (the start of head `h` would lie beyond an empty buffer).
    fn head(&self, b: usize, r: Range<usize>, h: usize) -> MatRef<'a, F> {
        let [_, t, nh, d] = self.shape;
        let n = r.len();
        if n == 0 || d == 0 {
            return MatRef::from_row_major_slice(&self.data[..0], n, d);
        }
        let start = ((b * t + r.start) * nh + h) * d;
        let len = (n - 1) * nh * d + d;
        MatRef::from_row_major_slice_with_stride(&self.data[start..start + len], n, d, nh * d)
    }
}

/// The inputs in standard layout (a copy only of those that are not).
pub fn standard<F: Real>(x: &Tensors<F>) -> std::borrow::Cow<'_, Tensors<F>> {
    if x.values().all(|a| a.is_standard_layout()) {
        std::borrow::Cow::Borrowed(x)
    } else {
        std::borrow::Cow::Owned(
            x.iter().map(|(k, v)| (k.clone(), v.as_standard_layout().into_owned())).collect(),
        )
    }
}

/// Where the sequences of a call lie in its `[B, T, …]` buffer: sequence `i` is the tokens
/// `range` of batch row `row`. A plain call has one sequence per batch row (all its `T`
/// tokens); a packed call (`B = 1`) one per `cu_seqlens` range, in order. Tokens outside every
/// sequence (past the last offset) get zero outputs and gradients.
#[derive(Clone, Debug)]
pub struct Layout {
    seqs: Vec<(usize, Range<usize>)>,
}

impl Layout {
    /// The sequences of a plain call: every batch row, whole.
    pub fn rows(nb: usize, t_len: usize) -> Self {
        Layout { seqs: (0..nb).map(|b| (b, 0..t_len)).collect() }
    }

    /// The sequences of a packed call (`B = 1`): the row ranges of the checked `cu_seqlens`
    /// (`mixer_core::state::check_cu_seqlens`).
    pub fn packed(ranges: &[Range<usize>]) -> Self {
        Layout { seqs: ranges.iter().map(|r| (0, r.clone())).collect() }
    }

    /// The number of sequences.
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    /// Whether there is no sequence.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Sequence `i`: its batch row and its tokens.
    pub fn seq(&self, i: usize) -> (usize, Range<usize>) {
        self.seqs[i].clone()
    }

    /// The sequence that holds token `t` of batch row `b`, and the token's index in it (`None`
    /// past the last offset). The sequences are ordered by `(row, end)`, so the first whose
    /// end lies beyond `(b, t)` is the only one that can hold it.
    pub fn locate(&self, b: usize, t: usize) -> Option<(usize, usize)> {
        let i = self.seqs.partition_point(|(row, r)| (*row, r.end) <= (b, t));
        let (row, r) = self.seqs.get(i)?;
        (*row == b && r.contains(&t)).then(|| (i, t - r.start))
    }
}

/// Splits the (validated, standard-layout) inputs into per-(sequence, head) views, sequence
/// by sequence: the batch rows, or the `packed` ranges of a packed call (`B = 1`). `lam` holds
/// the λ weights (after the λ scheme) for the lifted mixers.
pub fn heads<'a, F: Real>(
    m: &LogLinear,
    x: &'a Tensors<F>,
    lam: Option<&'a ArrayD<F>>,
    packed: Option<&[Range<usize>]>,
) -> Result<(Sizes, Layout, Vec<Head<'a, F>>)> {
    let q = Flat4::new(get(x, "q")?, "q")?;
    let k = Flat4::new(get(x, "k")?, "k")?;
    let v = Flat4::new(get(x, "v")?, "v")?;
    let [nb, t_len, nh, dk] = q.shape;
    let dv = v.shape[3];
    if k.shape != q.shape || v.shape[..3] != q.shape[..3] {
        return Err(Error::shape(
            "k/v",
            format!("k {:?}, v [{nb}, {t_len}, {nh}, Dv]", q.shape),
            format!("k {:?}, v {:?}", k.shape, v.shape),
        ));
    }
    let lam = match lam {
        Some(l) => {
            let f = Flat4::new(l, "lambda")?;
            if f.shape[..3] != q.shape[..3] {
                return Err(Error::shape(
                    "lambda",
                    format!("[{nb}, {t_len}, {nh}, L]"),
                    mixer_core::error::fmt_shape(&f.shape),
                ));
            }
            Some(f)
        }
        None if m.lift.is_some() => return Err(Error::config(&m.name, "the lifted mixers need `lambda`")),
        None => None,
    };
    let g = if m.base.has_decay() { Some(view3(x, "g")?) } else { None };
    let beta = if m.base.has_beta() { Some(view3(x, "beta")?) } else { None };
    let layout = match packed {
        Some(ranges) => {
            if let Some(r) = ranges.iter().find(|r| r.end > t_len) {
                return Err(Error::shape(
                    "cu_seqlens",
                    format!("ranges within T = {t_len}"),
                    format!("{r:?}"),
                ));
            }
            Layout::packed(ranges)
        }
        None => Layout::rows(nb, t_len),
    };
    let mut out = Vec::with_capacity(layout.len() * nh);
    for (i, (b, r)) in layout.seqs.iter().enumerate() {
        let b = *b;
        for h in 0..nh {
            let g = r.clone().map(|t| g.as_ref().map_or(0.0, |g| g[[b, t, h]].f64())).collect();
            let beta = r.clone().map(|t| beta.as_ref().map_or(F::one(), |x| x[[b, t, h]])).collect();
            out.push(Head {
                b: i,
                h,
                q: q.head(b, r.clone(), h),
                k: k.head(b, r.clone(), h),
                v: v.head(b, r.clone(), h),
                g,
                beta,
                lam: lam.as_ref().map(|l| l.head(b, r.clone(), h)),
            });
        }
    }
    Ok((Sizes { b: nb, t: t_len, h: nh, dk, dv }, layout, out))
}

/// The blocks `a[b, h]` (each the rest of the axes, in standard order) of a new array `a`
/// whose first two axes are the sequences of a call and its `nh` heads, one per head of `heads`
/// and in its order, so that each (sequence, head) job can write its own block.
pub fn head_blocks<'a, F: Real>(
    a: &'a mut ArrayD<F>,
    heads: &[Head<'_, F>],
    nh: usize,
) -> Result<Vec<&'a mut [F]>> {
    let rows = a.shape().iter().take(2).product::<usize>();
    let block = a.len().checked_div(rows).unwrap_or(0);
    let flat = a.as_slice_mut().ok_or_else(|| internal("a new array is not in standard layout"))?;
    let mut by: Vec<Option<&mut [F]>> = match block {
        0 => (0..rows).map(|_| Some(&mut [][..])).collect(),
        _ => flat.chunks_mut(block).map(Some).collect(),
    };
    heads
        .iter()
        .map(|hd| {
            by.get_mut(hd.b * nh + hd.h)
                .and_then(Option::take)
                .ok_or_else(|| internal("two heads, or a head outside the array, for one block"))
        })
        .collect()
}

fn internal(message: &str) -> Error {
    Error::Backend {
        backend: "cpu".into(),
        family: Some("loglinear".into()),
        message: format!("internal: {message}"),
    }
}

/// Assembles per-(sequence, head) outputs `|r|×Dv` (views of any layout; a row-major one is
/// copied row by row) into `y [B, T, H, Dv]`, in parallel over the rows `(b, t)`; rows outside
/// every sequence of `layout` stay zero.
pub fn assemble<F: Real>(
    s: Sizes,
    layout: &Layout,
    heads: &[Head<'_, F>],
    ys: &[MatRef<'_, F>],
) -> ArrayD<F> {
    let mut y = ndarray::Array4::<F>::zeros((s.b, s.t, s.h, s.dv));
    let mut by_bh: Vec<Option<MatRef<'_, F>>> = vec![None; layout.len() * s.h];
    for (hd, yh) in heads.iter().zip(ys) {
        by_bh[hd.b * s.h + hd.h] = Some(*yh);
    }
    let row = s.h * s.dv;
    if row > 0 && s.t > 0 {
        let flat = y.as_slice_mut().expect("a new array is in standard layout");
        flat.par_chunks_mut(row).with_min_len(min_len()).enumerate().for_each(|(bt, dst)| {
            let Some((i, t)) = layout.locate(bt / s.t, bt % s.t) else { return };
            for (h, part) in dst.chunks_mut(s.dv).enumerate() {
                let Some(yh) = by_bh[i * s.h + h] else { continue };
                match yh.row(t).try_as_row_major() {
                    Some(src) => part.copy_from_slice(src.as_slice()),
                    None => part.iter_mut().zip(yh.row(t).iter()).for_each(|(d, &v)| *d = v),
                }
            }
        });
    }
    y.into_dyn()
}

/// Masked decay factors `M^S_{t,s} = e^(G_t − G_s)` for rows `t ∈ [r0, r1)` and columns
/// `s ∈ [0, r1)` (zero for `s > t`), as an `(r1−r0) × r1` matrix.
///
/// The exponent `Σ_{r=s+1}^t g_r` is never formed as a difference of global cumulative
/// sums: for `s < r0` it is `pre_t + suf_s` with `pre_t = Σ_{r0 ≤ r ≤ t} g_r` and
/// `suf_s = Σ_{s < r < r0} g_r` (both sums of non-positive terms, no cancellation), and
/// inside the tile it is a difference of tile-local sums. Exponentials are only taken of
/// masked (non-positive) exponents, so nothing overflows for any `g ≤ 0`.
pub fn decay_tile<F: Real>(g: &[f64], r0: usize, r1: usize) -> Mat<F> {
    let rows = r1 - r0;
    let mut pre = vec![0.0f64; rows];
    let mut acc = 0.0f64;
    for i in 0..rows {
        acc += g[r0 + i];
        pre[i] = acc;
    }
    let mut suf_exp = vec![0.0f64; r0];
    let mut acc = 0.0f64;
    for s in (0..r0).rev() {
        suf_exp[s] = acc.exp();
        acc += g[s];
    }
    let ep: Vec<f64> = pre.iter().map(|x| x.exp()).collect();
    Mat::<F>::from_fn(rows, r1, |i, s| {
        if s < r0 {
            F::of(ep[i] * suf_exp[s])
        } else if s - r0 <= i {
            F::of((pre[i] - pre[s - r0]).exp())
        } else {
            F::zero()
        }
    })
}

/// The full masked decay matrix `M^S` (`T×T`), assembled from [`decay_tile`]s of `tile` rows
/// so that only `O(T²/tile + T · tile)` exponentials are taken.
pub fn decay_matrix_tiled<F: Real>(g: &[f64], tile: usize) -> Mat<F> {
    let t_len = g.len();
    let mut m = Mat::<F>::zeros(t_len, t_len);
    let mut r0 = 0;
    while r0 < t_len {
        let r1 = (r0 + tile.max(1)).min(t_len);
        m.submatrix_mut(r0, 0, r1 - r0, r1).copy_from(decay_tile::<F>(g, r0, r1));
        r0 = r1;
    }
    m
}

/// The state tensor `S [B, H, Dv, Dk]` of a base mixer's run from a state (`None` without one;
/// an error for the lifts, whose state is a level tensor and a position: `lift_state` reads it).
pub(crate) fn state_tensor<'a, F: Real>(
    m: &LogLinear,
    s: Option<&'a Tensors<F>>,
) -> Result<Option<&'a ArrayD<F>>> {
    let Some(s) = s else { return Ok(None) };
    if m.lift.is_some() {
        return Err(mixer_core::Error::config(
            &m.name,
            "internal: the lifts' state (levels and a position) is read by `lift_state`, not as one `S`",
        ));
    }
    get(s, mixer_core::mixers::loglinear::state::STATE).map(Some)
}

/// `H = S_{b,h}ᵀ` (`D_k × D_v`) of a state `S [B, H, Dv, Dk]`.
pub(crate) fn state_head<F: Real>(s: &ArrayD<F>, b: usize, h: usize) -> Mat<F> {
    let (dv, dk) = (s.shape()[2], s.shape()[3]);
    // A copy of the block only where it is not contiguous; then one blocked transposed copy.
    let blk = s.slice(ndarray::s![b, h, .., ..]);
    let blk = blk.as_standard_layout();
    let flat = blk.as_slice().expect("a standard-layout array is contiguous");
    MatRef::from_row_major_slice(flat, dv, dk).transpose().to_owned()
}

/// Writes `H` (`D_k × D_v`) as `S_{b,h} = Hᵀ` into a state `S [B, H, Dv, Dk]`.
pub(crate) fn put_state<F: Real>(s: &mut ArrayD<F>, b: usize, h: usize, hm: MatRef<'_, F>) {
    let (dv, dk) = (s.shape()[2], s.shape()[3]);
    let mut blk = s.slice_mut(ndarray::s![b, h, .., ..]);
    match blk.as_slice_mut() {
        Some(flat) => MatMut::from_row_major_slice_mut(flat, dv, dk).copy_from(hm.transpose()),
        None => blk.indexed_iter_mut().for_each(|((r, c), v)| *v = hm[(c, r)]),
    }
}

/// A form on one head: `y` of the head as a `T×Dv` matrix, or as its transpose
/// `Dv×T` (row-major `y`) for the forms that write rows.
pub(crate) type HeadFn<F> = fn(&LogLinear, &Head<'_, F>) -> Result<Mat<F>>;

/// Runs a per-head form over every (sequence, head) in parallel, as one job list: the batch
/// rows, or the `packed` ranges of a packed call; `transposed`: the form returns `yᵀ`
/// (`Dv×T`).
pub(crate) fn run_heads<F: VecMath>(
    m: &LogLinear,
    x: &Tensors<F>,
    f: HeadFn<F>,
    transposed: bool,
    packed: Option<&[Range<usize>]>,
) -> Result<ArrayD<F>> {
    let x = standard(x);
    let lam = match m.lift {
        Some(_) => Some(m.lambda_weights_ref(get(&x, "lambda")?, x.get("lambda_param"))?),
        None => None,
    };
    let (sizes, layout, heads) = heads(m, &x, lam.as_deref(), packed)?;
    let ys: Vec<Mat<F>> =
        heads.par_iter().with_min_len(min_len()).map(|hd| f(m, hd)).collect::<Result<_>>()?;
    let views: Vec<_> = ys.iter().map(|y| if transposed { y.transpose() } else { y.as_ref() }).collect();
    Ok(assemble(sizes, &layout, &heads, &views))
}

#[cfg(test)]
mod tests {
    use super::{decay_matrix_tiled, decay_tile};

    #[test]
    fn tiled_decay_matrix_equals_one_tile() {
        let g: Vec<f64> = (0..77).map(|i| -((i * 3 % 5) as f64) / 7.0).collect();
        let a = decay_matrix_tiled::<f64>(&g, 16);
        let b = decay_tile::<f64>(&g, 0, 77);
        for t in 0..77 {
            for s in 0..77 {
                assert!((a[(t, s)] - b[(t, s)]).abs() <= 1e-14, "t={t} s={s}");
            }
        }
    }

    #[test]
    fn decay_tile_matches_direct_segment_sums() {
        let g: Vec<f64> =
            (0..150).map(|i| if i % 37 == 5 { -1e4 } else { -((i * 7 % 11) as f64) / 20.0 }).collect();
        for (r0, r1) in [(0, 150), (0, 1), (64, 128), (128, 150), (149, 150)] {
            let m = decay_tile::<f64>(&g, r0, r1);
            assert_eq!((m.nrows(), m.ncols()), (r1 - r0, r1));
            for i in 0..r1 - r0 {
                let t = r0 + i;
                for s in 0..r1 {
                    let want = if s <= t { g[s + 1..=t].iter().sum::<f64>().exp() } else { 0.0 };
                    let got = m[(i, s)];
                    assert!(got.is_finite() && (got - want).abs() <= 1e-11 * want.max(1e-300), "t={t} s={s}");
                }
            }
        }
    }
}
