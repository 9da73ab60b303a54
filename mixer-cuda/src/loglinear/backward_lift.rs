//! The `fast` backward of the scalar-decay lifts on CUDA, `loglinear-attention` and
//! `loglinear-mamba2` (docs/math.md §2.8; kernels in `kernels/loglinear_backward_lift.cu`). Per
//! (batch, head), with `w_{ts} = σ λ_t^(ℓ(t,s)) e^(G_t − G_s)` (`s ≤ t`):
//! - `dq` is the lifted forward with `(q, k, v) ← (dy, v, k)` (λ weighs the query, which stays
//!   `t`): this backend's `fast` form, exact kernels;
//! - `dk`, `dv` and `dλ` come from the chunk form turned around (docs/math.md §2.8): the query
//!   side's λ-weighted sources `R^e_i = Σ_t σ λ_t^(c+e) e^(γ_t) q_t dy_tᵀ` for every chunk `i` and set
//!   bit `e − 1` of `i` (`llbl_src`, chunk-parallel), joined per level and aligned block into the
//!   upper half's sum `U^e_m` (`llbl_join`); key chunk `j` reads `X_j = Σ e^(d_e) U^e_(j ≫ e)` over
//!   its clear bits with the forward tree's decays `d_e` — the mirror of the forward's read of its
//!   tree — and per chunk (`llbl_kv`) adds the intra-chunk part (levels `0 … c`, `c = log₂ C`) to
//!   `dv_s += e^(a_j − γ_s) X_jᵀ k_s`, `dk_s += e^(a_j − γ_s) X_j v_s`, with `dλ` of the levels
//!   inside the chunk; `dλ` of the chunk levels (`llbl_dlam`) reads the forward's tree of chunk
//!   states (the `fast` form's own [`ssd::prefix`]);
//! - `dg` is the base mixers' reverse cumulative sum of `q·dq − k·dk` ([`super::backward`]: λ does
//!   not depend on `g`, so the argument there holds unchanged).
//!
//! Memory besides the gradients, in `D_k × D_v` states per (batch, head): the tree (`< 2 T/C`), the
//! sources (`Σ_{j < T/C} popcount(j)`, about `(T/C) log₂(T/C) / 2`; freed before `llbl_kv`) and `U`
//! (`< T/C`), plus the mapped λ. Every mode runs the same FMA kernels in the element type of the
//! call (f32 in the tf32 and bf16 modes): `dg` is a difference of nearly equal sums (its total is
//! exactly 0), which the tf32 rounding of `dq` and `dk` would spoil, as for Mamba-2. Every sum runs
//! in a fixed order, so the same inputs give the same bits. The λ scheme's backward runs on the
//! device for the identity scheme (`d_lambda = dλ`); any other scheme maps `dλ` back on the host
//! with its registered derivative (`LogLinear::lambda_vjp`), the one step that waits.

use std::borrow::Cow;

use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Error, Precision, Result};

use super::common::{ChunkedInputs, Elem, FAMILY, Launch, Shape, Step, fixed_dims, kernel_ints};
use super::{fast, ssd, state_pass};
use crate::forms::input_opt;
use crate::kernels;
use crate::pool;
use crate::runtime::{err, gpu, int, launch};
use crate::tensor::GpuReal;
use crate::tensor::{DeviceTensor, DeviceTensors};

/// The gradients of [`scalar`]: `dq`, `dk` `[B, T, H, Dk]`, `dv` `[B, T, H, Dv]`, and those of the
/// raw `lambda` and of `lambda_param` (given, and a scheme with a parameter gradient).
pub(crate) struct LiftGrads<F: GpuReal> {
    pub dq: DeviceTensor<F>,
    pub dk: DeviceTensor<F>,
    pub dv: DeviceTensor<F>,
    pub dlambda: DeviceTensor<F>,
    pub dparam: Option<DeviceTensor<F>>,
}

/// The `U` entries per batch·head for `nc` chunks: per level `e ≥ 1`, the aligned blocks of `2^e`
/// chunks whose upper half starts before `nc` (`kernels/loglinear_backward_lift.cu`, `llbl_ucount`).
pub(crate) fn u_entries(nc: usize) -> usize {
    (1..usize::BITS as usize)
        .map(|e| {
            let half = 1usize << (e - 1);
            if nc > half { (nc - half).div_ceil(1 << e) } else { 0 }
        })
        .sum()
}

/// The four launches of this module's kernels for `s`, in order: `llbl_src`, `llbl_join`,
/// `llbl_kv`, `llbl_dlam`.
pub(crate) fn launches(s: Shape, elem: Elem) -> [Launch; 4] {
    let (nc, bh, sfx) = (s.chunks(elem.chunk()), s.bh(), elem.suffix());
    let on = |name: &str, grid: [usize; 3]| {
        Launch::new(Step::Backward, &kernels::LOGLINEAR_BACKWARD_LIFT, format!("{name}_{sfx}"), fixed_dims(s))
            .on(grid, 256, 0)
    };
    [
        on("llbl_src", [nc, bh, s.dk.div_ceil(64) * s.dv.div_ceil(64)]),
        on("llbl_join", [u_entries(nc).max(1), bh, (s.dk * s.dv).div_ceil(256)]),
        on("llbl_kv", [nc, bh, s.dv.div_ceil(64) + s.dk.div_ceil(64)]),
        on("llbl_dlam", [nc, bh, 1]),
    ]
}

/// The backward of a scalar-decay lift (module documentation) on the inputs `x` (as given, for the
/// `dq` run and λ) with `[q, k, v, dy]` and `g` (Mamba-2) as `F`, of `[B, T, H, Dk, Dv]` (nothing
/// empty). The caller derives `dg` from `dq` and `dk`.
pub(crate) fn scalar<F: GpuReal>(
    ll: &LogLinear,
    x: &DeviceTensors,
    [q, k, v, dy]: [&DeviceTensor<F>; 4],
    g: Option<&DeviceTensor<F>>,
    dims: [usize; 5],
) -> Result<LiftGrads<F>> {
    let [b, t, h, dk, dv] = dims;
    let lambda = lift_lambda::<F>(ll, x, [b, t, h])?;
    let (lam, levels) = (lambda.weights.clone(), lambda.levels); // another handle, no copy

    // dq: the lifted forward of (dy, v, k), exact kernels.
    let mut xq = x.clone();
    for (name, a) in [("q", dy), ("k", v), ("v", k)] {
        xq.insert(name.to_string(), F::wrap(a.clone()));
    }
    if let Some(g) = g {
        xq.insert("g".into(), F::wrap(g.clone()));
    }
    let (dq, _) = fast::run_from::<F>(ll, &xq, Precision::Exact, None, false)?;
    let dq = F::unwrap(&dq).cloned().ok_or_else(|| {
        err(FAMILY, format!("internal: the forward returned {} where {} was expected", dq.dtype(), F::ELEM))
    })?;

    // The forward's tree of chunk states, for dλ of the chunk levels.
    let elem = Elem::of::<F>();
    let s = Shape::new(dims);
    let inp = ChunkedInputs {
        q: std::borrow::Cow::Borrowed(q),
        k: std::borrow::Cow::Borrowed(k),
        v: std::borrow::Cow::Borrowed(v),
        g: g.map(std::borrow::Cow::Borrowed),
        beta: None,
        lam: Some((lam, levels)),
        dims,
        zero: pool::zeros::<F>(FAMILY, 1)?,
    };
    let tree_plan = ssd::launches(s, elem, Precision::Exact, true, None, super::common::Device::current())?;
    let ssd::Prefix { tree, decays, .. } = ssd::prefix(ll, &inp, &tree_plan, None, false, None)?;

    let nc = s.chunks(elem.chunk());
    let bh = s.bh();
    let [ti, hi, dki, dvi, nci, _] = kernel_ints([t, h, dk, dv, nc, bh])?;
    let li = int(FAMILY, "L", levels)?;
    let (gv, has_g) = inp.g_view();
    let (qv, kv, vv, dyv, lv) = (q.view(), k.view(), v.view(), dy.view(), inp.lam_view());
    let scale = ll.scale;
    let gp = gpu()?;
    let [l_src, l_join, l_kv, l_dlam] = launches(s, elem);
    let dd = dk * dv;
    let mut rs = pool::take::<F>(FAMILY, (bh * state_pass::slots(true, nc) * dd).max(1))?;
    let (f, cfg) = l_src.function()?;
    launch!(gp, FAMILY, f, cfg; &qv, &dyv, &gv, &has_g, &lv, &mut *rs, &ti, &hi, &dki, &dvi, &li, &nci, &scale)?;
    let mut us = pool::take::<F>(FAMILY, (bh * u_entries(nc) * dd).max(1))?;
    if u_entries(nc) > 0 {
        let (f, cfg) = l_join.function()?;
        launch!(gp, FAMILY, f, cfg; &*rs, &*decays, &mut *us, &dki, &dvi, &nci)?;
    }
    drop(rs);
    let mut d_k = pool::take::<F>(FAMILY, b * t * h * dk)?;
    let mut d_v = pool::take::<F>(FAMILY, b * t * h * dv)?;
    let mut d_lam = pool::zeros::<F>(FAMILY, b * t * h * levels)?;
    let (f, cfg) = l_kv.function()?;
    launch!(gp, FAMILY, f, cfg; &qv, &kv, &vv, &dyv, &gv, &has_g, &lv, &*us, &*decays, &mut *d_k, &mut *d_v,
        &mut *d_lam, &ti, &hi, &dki, &dvi, &li, &nci, &scale)?;
    drop(us);
    let (f, cfg) = l_dlam.function()?;
    launch!(gp, FAMILY, f, cfg; &qv, &dyv, &gv, &has_g, &*tree, &*decays, &mut *d_lam,
        &ti, &hi, &dki, &dvi, &li, &nci, &scale)?;
    let dlam = DeviceTensor::from_pooled(d_lam, &[b, t, h, levels])?;
    let (dlambda, dparam) = lambda_backward(ll, &lambda, dlam)?;
    Ok(LiftGrads {
        dq,
        dk: DeviceTensor::from_pooled(d_k, &[b, t, h, dk])?,
        dv: DeviceTensor::from_pooled(d_v, &[b, t, h, dv])?,
        dlambda,
        dparam,
    })
}

/// A lift's λ as its backward takes it: the raw `lambda` (read once), `lambda_param`, and the
/// weights mapped on the device with their level count ([`fast::map_lambda`]).
pub(crate) struct LiftLambda<'a, F: GpuReal> {
    pub raw: Cow<'a, DeviceTensor<F>>,
    pub param: Option<Cow<'a, DeviceTensor<F>>>,
    pub weights: DeviceTensor<F>,
    pub levels: usize,
}

/// [`LiftLambda`] of the inputs `x` of a `[B, T, H, ·]` call: `lambda` must be `[B, T, H, L]` with
/// the levels `T` tokens read.
pub(crate) fn lift_lambda<'a, F: GpuReal>(
    ll: &LogLinear,
    x: &'a DeviceTensors,
    [b, t, h]: [usize; 3],
) -> Result<LiftLambda<'a, F>> {
    let raw = crate::forms::input::<F>(x, "lambda")?;
    if raw.shape().len() != 4 || raw.shape()[..3] != [b, t, h] {
        return Err(Error::shape("lambda", format!("[{b}, {t}, {h}, L]"), format!("{:?}", raw.shape())));
    }
    let param = input_opt::<F>(x, "lambda_param")?;
    let (weights, levels) = fast::map_lambda(ll, &raw, param.as_deref(), t)?;
    Ok(LiftLambda { raw, param, weights, levels })
}

/// The λ scheme's backward of `dlam` (the gradient of the mapped weights): the identity's as is
/// (`d_lambda = dλ`, no parameter gradient), a scheme with a device derivative on the device
/// ([`super::lambda::vjp`]), any other on the host with its registered derivative (which reads
/// `lambda` back: the stream waits, and a CUDA graph cannot capture the call).
pub(crate) fn lambda_backward<F: GpuReal>(
    ll: &LogLinear,
    lambda: &LiftLambda<'_, F>,
    dlam: DeviceTensor<F>,
) -> Result<(DeviceTensor<F>, Option<DeviceTensor<F>>)> {
    if ll.lift.is_some_and(|l| l.lambda.is_identity()) {
        return Ok((dlam, None));
    }
    if let Some(d) = super::lambda::vjp(ll, &lambda.raw, lambda.param.as_deref(), &dlam)? {
        return Ok(d);
    }
    let param = lambda.param.as_deref().map(|p| p.to_host()).transpose()?;
    let (dr, dp) = ll.lambda_vjp(&lambda.raw.to_host()?, param.as_ref(), &dlam.to_host()?)?;
    Ok((DeviceTensor::upload(&dr)?, dp.map(|d| DeviceTensor::upload(&d)).transpose()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `u_entries` counts the aligned blocks whose upper half starts before the last chunk, as the
    /// kernels' `llbl_ucount` does: against a direct count.
    #[test]
    fn u_entries_counts_the_blocks_with_an_upper_half() {
        for nc in [0usize, 1, 2, 3, 4, 5, 7, 8, 9, 38, 64, 255, 256, 1000] {
            let mut direct = 0;
            for e in 1..20 {
                let (half, size) = (1usize << (e - 1), 1usize << e);
                direct += (0..nc.div_ceil(size) + 1).filter(|m| m * size + half < nc).count();
            }
            assert_eq!(u_entries(nc), direct, "nc = {nc}");
        }
    }

    /// The launches: sources per chunk and state tile, one join block per entry and 256 state
    /// entries, dv tiles then dk tiles per chunk.
    #[test]
    fn the_launches_cover_the_chunks_and_tiles() {
        let s = Shape { b: 2, t: 1000, h: 3, dk: 70, dv: 64 };
        let [src, join, kv, dlam] = launches(s, Elem::F32);
        assert_eq!(src.grid, [16, 6, 2]);
        assert_eq!(join.grid, [u_entries(16) as u32, 6, (70 * 64u32).div_ceil(256)]);
        assert_eq!(kv.grid, [16, 6, 1 + 2]);
        assert_eq!(dlam.grid, [16, 6, 1]);
        assert!([&src, &join, &kv, &dlam].iter().all(|l| l.block == 256 && l.function.ends_with("_f32")));
    }
}
