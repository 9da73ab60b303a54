//! The `fast` backward of the lifted gated DeltaNet (`loglinear-gated-deltanet`) on CUDA
//! (docs/math.md §2.9; kernels in `kernels/loglinear_backward_lift_delta.cu`). Per chunk `j` of
//! `n ≤ C` tokens, with the WY/UT pieces of gated DeltaNet's chunked backward
//! ([`super::backward_chunked`]: `γ`, `Γ`, `T⁻¹`, `W`, `U`, `K̂ = diag(e^(a − γ)) K`,
//! `P = σ (QKᵀ ⊙ Γ)`), `N = T⁻¹ diag(β)`, `Q̃ = σ diag(e^γ) Q − P W`, `w_e` the λ weights of chunk
//! level `e` and `Λ_rs = λ_r^(bitlen(r ⊕ s))`, the forward is
//! `Y = Σ_e diag(w_e) Q̃ Z^e + (Λ ⊙ P N) V` over the levels `e` present at chunk `j`, each taken
//! through the chunk as `Z^e ← e^a Z^e − K̂ᵀ W Z^e`, and the chunk's own state `Z^0 = K̂ᵀ U`.
//! The backward:
//! - the forward's WY step, then the level states `Z^e` entering every chunk, in the slots the
//!   forward's output step reads: by the forward's own lifted state pass where
//!   [`state_pass::select`] gives one, else by `lgl_fwd` (merge, write,
//!   `Z^e ← e^a Z^e − K̂ᵀ (W Z^e)`, `Z^0 = K̂ᵀ U`);
//! - `Q̃` per chunk (`lgl_qt`), then one reverse pass over chunks for the adjoints — in the
//!   transition form where `Mᵀ_j` fits in shared memory (`lgl_src`, chunk-parallel: the map
//!   `Mᵀ_j = −Wᵀ K̂` and the sources `Q̃ᵀ diag(w_e) dY`; `lgl_rev_t`: `X^e ← e^a X^e + Mᵀ_j X^e +
//!   R^e_j`, one `D_k × D_k` product per level step), else `lgl_rev` (the same pass body as
//!   `lgl_fwd`) — for the adjoints
//!   `X^e` of the level states after every chunk: the forward's transition transposed,
//!   `X^e ← e^a X^e − Wᵀ (K̂ X^e) + Q̃ᵀ diag(w_e) dY`, and the merge's adjoint (levels `0 … m`,
//!   `m = ctz j`, take level `m + 1`'s);
//! - per chunk, the level terms summed over the levels (`lgl_levels`): `dQ̃ = Σ_e diag(w_e) dY Z^eᵀ`,
//!   `Hxz = Σ_e X^e Z^eᵀ` and `dλ^(c+e)_r = q̃_r·(dY Z^eᵀ)_r`;
//! - per chunk, every input gradient (`lgl_grad`) from those, `X^0`, `T⁻¹`, `W` and `U`: the
//!   level-independent remainder of gated DeltaNet's chunk backward (docs/math.md §2.9).
//!
//! Memory besides the gradients, in `D_k × D_v` states per (batch, head): the forward's level
//! states (`Σ_{j < T/C} popcount(j)`, about `(T/C) log₂(T/C) / 2`), the adjoints (that plus
//! `T/C`), `Hxz` (`T/C` matrices of `D_k × D_k`), plus `T⁻¹`, `W`, `U`, `Q̃`, `dQ̃` and the mapped λ.
//! The WY step and the forward's pass run in the forward's kernels for the mode (on tensor cores in
//! the tf32 and bf16 modes with f32 data, as the tf32 forward; exact kernels otherwise); every other
//! kernel is FMA in the element type of the call (f32 in the tf32 and bf16 modes, on activations
//! converted to f32). Every sum runs in a
//! fixed order, so the same inputs give the same bits. The λ scheme's backward is the scalar
//! lifts' (`backward_lift::lambda_backward`). The two passes keep their level states in
//! shared memory where they fit next to two stage buffers of chunk rows, else in global memory
//! (`pass_plan`).

use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Precision, Result};

use super::backward_chunked::{grad_buffers, grad_tensors};
use super::backward_lift::{LiftGrads, lambda_backward, lift_lambda};
use super::common::{
    Device, Elem, FAMILY, Launch, Shape, Step, Storage, check_sizes, fixed_dims, kernel_ints, max_bh,
    tensor_cores,
};
use super::state_pass::{self, PassData, StatePass};
use super::wy;
use crate::forms::input_opt;
use crate::kernels;
use crate::pitched::{put_axis, slice_axis};
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu, int, launch, max_dynamic_smem};
use crate::tensor::{DeviceTensor, DeviceTensors, GpuReal};

/// State columns per block of the passes (`LGL_NCOL` in the kernel file).
const NCOL: usize = 16;
/// `LLC_LD`, `LLC_KT`, `LLC_NT` of `loglinear_common.cuh`.
const LD: usize = 65;
const KT: usize = 16;
const NT: usize = 64;

/// Dynamic shared memory of `lgl_qt` (bytes): `P [C][C + 1]`, the `W` tile `[64][65]`, two slices
/// `[16][65]`.
pub(crate) fn qt_smem(elem: Elem) -> usize {
    let ch = elem.chunk();
    (ch * (ch + 1) + NT * LD + 2 * KT * LD) * elem.bytes()
}

/// Dynamic shared memory of the passes (bytes) with `e` levels: the states `[e][Dk][16]` where
/// `states` (else they are in global memory), `stages` stage buffers (the chunk's `W`, `k` and in
/// reverse (`rev`) `Q̃` rows `[C][Dk + 1]`, the source columns `[C][16]`, in reverse the weights
/// `[C][e]`, the log-decays `[C]`) and the new values `[C][16]`.
pub(crate) fn pass_smem(elem: Elem, dk: usize, e: usize, rev: bool, p: PassPlan) -> usize {
    let ch = elem.chunk();
    let rows = if rev { 3 } else { 2 };
    let stage = rows * ch * (dk + 1) + ch * NCOL + if rev { ch * e } else { 0 } + ch;
    let st = if p.shared_states { e * dk * NCOL } else { 0 };
    (st + p.stages * stage + ch * NCOL) * elem.bytes()
}

/// Where the passes keep their level states and how many stage buffers they take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PassPlan {
    /// The level states in shared memory (else in global memory).
    pub shared_states: bool,
    /// Stage buffers: 2 (the next chunk copied while this one computes) or 1.
    pub stages: usize,
}

/// The first of (states in shared memory, two stages), (global, two), (global, one) whose larger
/// pass (the reverse) fits in `smem` bytes; the last where none does (the caller reports it).
pub(crate) fn pass_plan(elem: Elem, dk: usize, e: usize, smem: usize) -> PassPlan {
    let plans =
        [(true, 2), (false, 2), (false, 1)].map(|(shared_states, stages)| PassPlan { shared_states, stages });
    plans.into_iter().find(|&p| pass_smem(elem, dk, e, true, p) <= smem).unwrap_or(plans[2])
}

/// Dynamic shared memory of `lgl_src` (bytes): two tiles `[C][65]`.
pub(crate) fn src_smem(elem: Elem) -> usize {
    2 * elem.chunk() * LD * elem.bytes()
}

/// `Dk` rounded up to whole 16-row tiles (`DKP` of `lgl_src` and `lgl_rev_t`).
fn dk_padded(dk: usize) -> usize {
    dk.div_ceil(16) * 16
}

/// Dynamic shared memory of `lgl_rev_t` (bytes) with `e` levels and `stages` stage buffers: two
/// buffers of the states `[e][DKP][16]`, `stages` of `Mᵀ_j [DKP][DKP + 4]` and of `e^{a_j}`.
pub(crate) fn rev_t_smem(elem: Elem, dk: usize, e: usize, stages: usize) -> usize {
    let dkp = dk_padded(dk);
    (2 * e * dkp * NCOL + stages * (dkp * (dkp + 4) + 1)) * elem.bytes()
}

/// The stage buffers of `lgl_rev_t`: 2 (`Mᵀ_{j−1}` copied while chunk `j` computes) or 1, the
/// first that fits in `smem` bytes; `None` where neither does (`lgl_rev` runs instead).
pub(crate) fn rev_t_stages(elem: Elem, dk: usize, e: usize, smem: usize) -> Option<usize> {
    [2, 1].into_iter().find(|&st| rev_t_smem(elem, dk, e, st) <= smem)
}

/// Dynamic shared memory of `lgl_levels` (bytes) with `e` levels: two slices `[16][65]` and the
/// row sums `[C][e]`.
pub(crate) fn levels_smem(elem: Elem, e: usize) -> usize {
    (2 * KT * LD + elem.chunk() * e) * elem.bytes()
}

/// Dynamic shared memory of `lgl_grad` (bytes; `LglGrad<T>` in the kernel): six `[C][C + 1]`
/// matrices, four tiles `[64][65]`, two slices `[16][65]`.
pub(crate) fn grad_smem(elem: Elem) -> usize {
    let ch = elem.chunk();
    (6 * ch * (ch + 1) + 4 * NT * LD + 2 * KT * LD) * elem.bytes()
}

/// The launches of this module's kernels for `s` with `e` chunk levels on a device with `smem`
/// bytes of dynamic shared memory per block, in order: `lgl_fwd`, `lgl_qt`, `lgl_rev`,
/// `lgl_levels`, `lgl_grad`, `lgl_src`, `lgl_rev_t` (the reverse pass's transition form, taken
/// where `lgl_rev_t` fits: [`reverse_by_maps`]).
pub(crate) fn launches(s: Shape, elem: Elem, e: usize, smem: usize) -> [Launch; 7] {
    let (nc, bh, sfx) = (s.chunks(elem.chunk()), s.bh(), elem.suffix());
    let on = |name: &str, grid: [usize; 3], smem: usize| {
        Launch::new(
            Step::Backward,
            &kernels::LOGLINEAR_BACKWARD_LIFT_DELTA,
            format!("{name}_{sfx}"),
            fixed_dims(s),
        )
        .on(grid, 256, smem)
        .opted_in(true)
    };
    let pp = pass_plan(elem, s.dk, e, smem);
    let pass_grid = [bh, s.dv.div_ceil(NCOL), 1];
    let pass = |name: &str, rev: bool| {
        let l = on(name, pass_grid, pass_smem(elem, s.dk, e, rev, pp));
        Launch { stages: Some(pp.stages), ..l }
    };
    [
        pass("lgl_fwd", false),
        on("lgl_qt", [nc, bh, 1], qt_smem(elem)),
        pass("lgl_rev", true),
        on("lgl_levels", [nc, bh, 1], levels_smem(elem, e)),
        on("lgl_grad", [nc, bh, 1], grad_smem(elem)),
        on("lgl_src", [nc, bh, 1], src_smem(elem)),
        {
            let st = rev_t_stages(elem, s.dk, e, smem).unwrap_or(1);
            let l = on("lgl_rev_t", pass_grid, rev_t_smem(elem, s.dk, e, st));
            Launch { stages: Some(st), ..l }
        },
    ]
}

/// Whether the reverse pass runs in the transition form (`lgl_src` chunk-parallel, then
/// `lgl_rev_t`: one `Dk × Dk` product per level step) rather than `lgl_rev`: where `lgl_rev_t`'s
/// states and map fit in `smem` bytes.
pub(crate) fn reverse_by_maps(elem: Elem, dk: usize, e: usize, smem: usize) -> bool {
    rev_t_stages(elem, dk, e, smem).is_some()
}

/// The gradients of [`delta`]: the lift's, plus `dg` and `dβ` `[B, T, H]`.
pub(crate) struct LiftDeltaGrads<F: GpuReal> {
    pub lift: LiftGrads<F>,
    pub dg: DeviceTensor<F>,
    pub dbeta: DeviceTensor<F>,
}

/// The chunk states of `Dk × Dv` elements the backward keeps per (batch, head): the forward's
/// level states, the reverse sources, the adjoints (one more per chunk) and `Hxz` (`Dk × Dk` per
/// chunk).
fn chunk_states(s: Shape, elem: Elem) -> usize {
    let nc = s.chunks(elem.chunk());
    3 * state_pass::slots(true, nc) + nc + nc * s.dk.div_ceil(s.dv.max(1))
}

/// The backward of the lifted gated DeltaNet (module documentation) on the inputs `x` (for λ)
/// with `[q, k, v, g, β, dy]` as `F`, of `[B, T, H, Dk, Dv]` (nothing empty). Heads are
/// independent: where the chunk states of all `B·H` exceed a quarter of the device's memory (or
/// what the chunked forms allocate; [`max_bh`]) but those of all `B` rows of fewer heads do not,
/// the backward runs on groups of heads one after another ([`in_head_groups`]), with the same bits
/// as one call.
pub(crate) fn delta<F: GpuReal>(
    ll: &LogLinear,
    x: &DeviceTensors,
    qkvgbd: [&DeviceTensor<F>; 6],
    dims: [usize; 5],
    p: Precision,
) -> Result<LiftDeltaGrads<F>> {
    let [b, _, h, _, _] = dims;
    let (s, elem) = (Shape::new(dims), Elem::of::<F>());
    let heads = max_bh(s, elem, chunk_states(s, elem))? / b.max(1);
    if heads >= h || heads == 0 {
        return delta_heads(ll, x, qkvgbd, dims, p);
    }
    in_head_groups(ll, x, qkvgbd, dims, p, heads)
}

/// [`delta`] on groups of `heads` heads (the last one shorter): each group's inputs cut out of
/// the head axis (`lambda_param`'s axis 0, axis 2 of the rest), its gradients written into theirs.
pub(crate) fn in_head_groups<F: GpuReal>(
    ll: &LogLinear,
    x: &DeviceTensors,
    qkvgbd: [&DeviceTensor<F>; 6],
    dims: [usize; 5],
    p: Precision,
    heads: usize,
) -> Result<LiftDeltaGrads<F>> {
    let [b, t, h, dk, dv] = dims;
    let lambda = crate::forms::input::<F>(x, "lambda")?;
    let param = input_opt::<F>(x, "lambda_param")?;
    let nl = lambda.shape().get(3).copied().unwrap_or(0);
    let shapes = [
        vec![b, t, h, dk],
        vec![b, t, h, dk],
        vec![b, t, h, dv],
        vec![b, t, h, nl],
        vec![b, t, h],
        vec![b, t, h],
    ];
    let mut full: Vec<Pooled<F>> =
        shapes.iter().map(|s| pool::take::<F>(FAMILY, s.iter().product())).collect::<Result<_>>()?;
    let mut dparam = match &param {
        Some(pp) => Some((pool::take::<F>(FAMILY, pp.len())?, pp.shape().to_vec())),
        None => None,
    };
    for h0 in (0..h).step_by(heads.max(1)) {
        let r = h0..(h0 + heads).min(h);
        let mut xg = DeviceTensors::new();
        xg.insert("lambda".into(), F::wrap(slice_axis(&lambda, 2, r.clone())?));
        if let Some(pp) = &param {
            xg.insert("lambda_param".into(), F::wrap(slice_axis(pp, 0, r.clone())?));
        }
        let [q, k, v, g, beta, dy] = qkvgbd.map(|a| slice_axis(a, 2, r.clone()));
        let (q, k, v, g, beta, dy) = (q?, k?, v?, g?, beta?, dy?);
        let gr = delta_heads(ll, &xg, [&q, &k, &v, &g, &beta, &dy], [b, t, r.len(), dk, dv], p)?;
        let parts = [&gr.lift.dq, &gr.lift.dk, &gr.lift.dv, &gr.lift.dlambda, &gr.dg, &gr.dbeta];
        for ((part, buf), shape) in parts.into_iter().zip(full.iter_mut()).zip(&shapes) {
            put_axis(part, buf, shape, 2, r.clone())?;
        }
        match (dparam.as_mut(), gr.lift.dparam.as_ref()) {
            (Some((buf, shape)), Some(part)) => put_axis(part, buf, shape, 0, r.clone())?,
            // A scheme without a parameter gradient gives none for any group.
            _ => dparam = None,
        }
    }
    let grads = full.into_iter().zip(&shapes).map(|(buf, s)| DeviceTensor::from_pooled(buf, s));
    let Ok([dq, dk_, dv_, dlambda, dg, dbeta]) = <[_; 6]>::try_from(grads.collect::<Result<Vec<_>>>()?)
    else {
        return Err(err(FAMILY, "internal: a head group's gradients are not six"));
    };
    let dparam = dparam.map(|(buf, s)| DeviceTensor::from_pooled(buf, &s)).transpose()?;
    Ok(LiftDeltaGrads { lift: LiftGrads { dq, dk: dk_, dv: dv_, dlambda, dparam }, dg, dbeta })
}

/// [`delta`] in one call over every head.
fn delta_heads<F: GpuReal>(
    ll: &LogLinear,
    x: &DeviceTensors,
    [q, k, v, g, beta, dy]: [&DeviceTensor<F>; 6],
    dims: [usize; 5],
    p: Precision,
) -> Result<LiftDeltaGrads<F>> {
    let [b, t, h, dk, dv] = dims;
    let lambda = lift_lambda::<F>(ll, x, [b, t, h])?;
    let n_lam = lambda.levels;
    let s = Shape::new(dims);
    let elem = Elem::of::<F>();
    let (ch, nc, bh) = (elem.chunk(), s.chunks(elem.chunk()), s.bh());
    let levels = state_pass::levels(elem, true, t);
    let slots = state_pass::slots(true, nc);
    check_sizes(s, elem, chunk_states(s, elem))?;
    let smem = max_dynamic_smem();
    let plan = launches(s, elem, levels, smem);
    let by_maps = reverse_by_maps(elem, dk, levels, smem);
    for l in &plan[..5] {
        if l.shared_mem > smem && !(by_maps && l.function.starts_with("lgl_rev")) {
            return Err(err(
                FAMILY,
                format!(
                    "the lifted gated DeltaNet's CUDA backward needs {} bytes of shared memory for `{}` (Dk = {dk}); \
                     the device allows {smem}",
                    l.shared_mem, l.function
                ),
            ));
        }
    }
    let [ti, hi, dki, dvi, nci, _] = kernel_ints([t, h, dk, dv, nc, bh])?;
    let (li, ei) = (int(FAMILY, "L", n_lam)?, int(FAMILY, "levels", levels)?);
    let (qv, kv, vv, gv, bv, dyv) = (q.view(), k.view(), v.view(), g.view(), beta.view(), dy.view());
    let lv = lambda.weights.view();
    // The forward's WY step and level states in the forward's kernels for the mode: on tensor cores
    // in the tf32 and bf16 modes with f32 data (the tf32 forward's), else exact.
    let fp = if tensor_cores(p, elem) { Precision::Tf32 } else { Precision::Exact };

    // The forward's WY step, then its level states (lgl_fwd).
    let mut w = pool::take::<F>(FAMILY, b * t * h * dk)?;
    let mut u = pool::take::<F>(FAMILY, b * t * h * dv)?;
    let mut tinv = pool::take::<F>(FAMILY, bh * nc * ch * ch)?;
    wy::run(
        &wy::launch(s, elem, fp),
        [&kv, &vv],
        (&gv, 1),
        &bv,
        [&mut w, &mut u],
        (&mut tinv, true),
        s,
        None,
    )?;
    let gp = gpu()?;
    let [l_fwd, l_qt, l_rev, l_levels, l_grad, l_src, l_rev_t] = &plan;
    // The passes' level states in global memory where they do not fit in shared memory and a pass
    // of this file runs (else one entry, never read: has_gst = 0).
    let pass = state_pass::select(s, fp, Storage::Real(elem), true, Device::current());
    let pp = pass_plan(elem, dk, levels, smem);
    let global = !pp.shared_states;
    let (has_gst, stages) = (global as i32, int(FAMILY, "stages", pp.stages)?);
    let lgl_pass_runs = pass == StatePass::Sequential || !by_maps;
    let gst_len = if global && lgl_pass_runs { bh * dv.div_ceil(NCOL) * levels * dk * NCOL } else { 1 };
    let mut gst = pool::take::<F>(FAMILY, gst_len)?;
    let mut zs = pool::take::<F>(FAMILY, (bh * slots * dk * dv).max(1))?;
    // The level states: the forward's own pass (exact kernels) where it keeps them, else lgl_fwd.
    if pass == StatePass::Sequential {
        let (f, cfg) = l_fwd.function()?;
        launch!(gp, FAMILY, f, cfg; &kv, &gv, &*w, &*u, &mut *zs, &mut *gst, &has_gst, &ti, &hi, &dki, &dvi,
            &nci, &ei, &stages)?;
    } else {
        let zero = pool::zeros::<F>(FAMILY, 1)?;
        let mut vn = pool::take::<F>(FAMILY, 1)?;
        let s0 = zero.slice(0..1);
        let data =
            PassData { k: &kv, g: (&gv, 1), w: &w, u: &u, vn: &mut vn, hs: &mut zs, s0: (&s0, 0), fin: None };
        state_pass::run(pass, &state_pass::launches(pass, s, elem, fp, true), data, s, elem, true, None)?;
    }
    let scale = F::of(ll.scale);
    let mut qt = pool::take::<F>(FAMILY, b * t * h * dk)?;
    let (f, cfg) = l_qt.function()?;
    launch!(gp, FAMILY, f, cfg; &qv, &kv, &gv, &*w, &mut *qt, &ti, &hi, &dki, &dvi, &scale)?;
    let mut xs = pool::take::<F>(FAMILY, bh * (slots + nc) * dk * dv)?;
    if by_maps {
        let dkp = dk_padded(dk);
        let mut mt = pool::take::<F>(FAMILY, bh * nc * dkp * dkp)?;
        let mut ea = pool::take::<F>(FAMILY, bh * nc)?;
        let mut rs = pool::take::<F>(FAMILY, (bh * slots * dk * dv).max(1))?;
        let (f, cfg) = l_src.function()?;
        launch!(gp, FAMILY, f, cfg; &kv, &gv, &*w, &*qt, &dyv, &lv, &mut *mt, &mut *ea, &mut *rs,
            &ti, &hi, &dki, &dvi, &li, &nci, &ei)?;
        let (f, cfg) = l_rev_t.function()?;
        let st = int(FAMILY, "stages", l_rev_t.stages.unwrap_or(1))?;
        launch!(gp, FAMILY, f, cfg; &*mt, &*ea, &*rs, &mut *xs, &dki, &dvi, &nci, &ei, &st)?;
    } else {
        let (f, cfg) = l_rev.function()?;
        launch!(gp, FAMILY, f, cfg; &kv, &gv, &*w, &*qt, &dyv, &lv, &mut *xs, &mut *gst, &has_gst,
            &ti, &hi, &dki, &dvi, &li, &nci, &ei, &stages)?;
    }
    drop(gst);
    let mut dqt = pool::take::<F>(FAMILY, b * t * h * dk)?;
    let mut hxz = pool::take::<F>(FAMILY, bh * nc * dk * dk)?;
    let mut d_lam = pool::zeros::<F>(FAMILY, b * t * h * n_lam)?;
    let (f, cfg) = l_levels.function()?;
    launch!(gp, FAMILY, f, cfg; &dyv, &*qt, &lv, &*zs, &*xs, &mut *dqt, &mut *d_lam, &mut *hxz,
        &ti, &hi, &dki, &dvi, &li, &nci, &ei)?;
    drop((zs, qt));
    let [mut d_q, mut d_k, mut d_v, mut d_b, mut d_g] = grad_buffers::<F>(dims)?;
    let (f, cfg) = l_grad.function()?;
    launch!(gp, FAMILY, f, cfg; &qv, &kv, &vv, &gv, &bv, &dyv, &lv, &*tinv, &*w, &*u, &*dqt, &*hxz, &*xs,
        &mut *d_q, &mut *d_k, &mut *d_v, &mut *d_b, &mut *d_g, &mut *d_lam, &ti, &hi, &dki, &dvi, &li, &nci, &scale)?;
    let dlam = DeviceTensor::from_pooled(d_lam, &[b, t, h, n_lam])?;
    let (dlambda, dparam) = lambda_backward(ll, &lambda, dlam)?;
    let [dq, d_k, d_v, dbeta, dg] = grad_tensors([d_q, d_k, d_v, d_b, d_g], dims)?;
    Ok(LiftDeltaGrads { lift: LiftGrads { dq, dk: d_k, dv: d_v, dlambda, dparam }, dg, dbeta })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The launches cover the chunks and value columns, and the shared memory follows the kernels'
    /// layouts (f32: `C = 64`; f64: `C = 32`); the passes' states leave shared memory for global
    /// memory only where they do not fit.
    #[test]
    fn the_launches_cover_the_chunks_and_columns() {
        let s = Shape::new([2, 1000, 3, 64, 40]);
        let [fwd, qt, rev, lv, grad, src, rev_t] = launches(s, Elem::F32, 5, 227 << 10);
        assert_eq!(src.grid, [16, 6, 1]);
        assert_eq!(rev_t.grid, [6, 3, 1]);
        assert_eq!(rev_t.shared_mem, (2 * 5 * 64 * 16 + 2 * (64 * 68 + 1)) * 4);
        assert_eq!(rev_t.stages, Some(2));
        // Dk = 128 with 7 levels: one stage buffer of Mᵀ.
        assert_eq!(rev_t_stages(Elem::F32, 128, 7, 227 << 10), Some(1));
        assert!(reverse_by_maps(Elem::F32, 64, 5, 227 << 10));
        assert!(!reverse_by_maps(Elem::F32, 256, 2, 227 << 10), "Mᵀ at Dk = 256 does not fit");
        for l in [&qt, &lv, &grad] {
            assert_eq!(l.grid, [16, 6, 1]);
        }
        assert_eq!(fwd.grid, [6, 3, 1]);
        assert_eq!(rev.grid, [6, 3, 1]);
        assert_eq!(qt.shared_mem, (64 * 65 + 64 * 65 + 2 * 16 * 65) * 4);
        // States in shared memory and two stage buffers at Dk = 64.
        assert_eq!(fwd.stages, Some(2));
        assert_eq!(fwd.shared_mem, (5 * 64 * 16 + 2 * (2 * 64 * 65 + 64 * 16 + 64) + 64 * 16) * 4);
        assert_eq!(rev.shared_mem, (5 * 64 * 16 + 2 * (3 * 64 * 65 + 64 * 16 + 64 * 5 + 64) + 64 * 16) * 4);
        assert_eq!(lv.shared_mem, (2 * 16 * 65 + 64 * 5) * 4);
        assert_eq!(grad.shared_mem, (6 * 64 * 65 + 4 * 64 * 65 + 2 * 16 * 65) * 4);
        assert_eq!(grad_smem(Elem::F64), (6 * 32 * 33 + 4 * 64 * 65 + 2 * 16 * 65) * 8);
        // Dk = 256 with 15 levels (T = 1M in f32): the states go to global memory and one stage
        // buffer fits.
        let wide = Shape::new([1, 1 << 20, 1, 256, 64]);
        let pp = pass_plan(Elem::F32, 256, 15, 227 << 10);
        assert_eq!(pp, PassPlan { shared_states: false, stages: 1 });
        for l in &launches(wide, Elem::F32, 15, 227 << 10)[..5] {
            assert!(l.shared_mem <= 227 << 10, "{} needs {} bytes", l.function, l.shared_mem);
        }
        assert!(grad_smem(Elem::F64) <= 227 << 10);
    }

    /// Heads run in groups (of 2, 2 and 1 of H = 5, the softplus scheme with `lambda_param`; f32
    /// in the tf32 mode and f64 in the exact mode) give the bits of one call over every head,
    /// `lambda_param`'s gradient included.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn head_groups_give_the_bits_of_one_call() {
        if crate::device::skip_reason().is_some() {
            return;
        }
        let m = mixer_registry::mixer(
            "loglinear-gated-deltanet",
            &serde_json::json!({"scale": 0.7, "lambda_scheme": "softplus"}),
        )
        .unwrap();
        let ll = m.as_any().downcast_ref::<LogLinear>().expect("a log-linear mixer");
        let [b, t, h, dk, dv] = [2, 333, 5, 32, 24];
        let dims = [("B", b), ("T", t), ("H", h), ("Dk", dk), ("Dv", dv)].into_iter().collect();
        let mut x = m.random_inputs(&dims, 5).unwrap();
        let l = x["lambda"].shape()[3];
        x.insert(
            "lambda_param".into(),
            ndarray::ArrayD::from_shape_fn(vec![h, l], |ix| 0.5 + 0.1 * (ix[0] + 2 * ix[1]) as f64),
        );
        let dy = ndarray::ArrayD::from_shape_fn(vec![b, t, h, dv], |ix| {
            ((ix[1] * 5 + ix[2] * 3 + ix[3]) as f64).sin()
        });
        fn bits<F: GpuReal>(
            ll: &LogLinear,
            x: &mixer_core::Tensors<f64>,
            dy: &ndarray::ArrayD<f64>,
            p: Precision,
        ) {
            let xf: mixer_core::Tensors<F> = mixer_core::tensor::cast_tensors(x);
            let dev = crate::forms::upload_inputs(&xf, Precision::Exact).unwrap();
            let up = |n: &str| crate::forms::input::<F>(&dev, n).unwrap().into_owned();
            let dyd = DeviceTensor::<F>::upload(&dy.mapv(F::of)).unwrap();
            let (q, k, v, g, beta) = (up("q"), up("k"), up("v"), up("g"), up("beta"));
            let args = [&q, &k, &v, &g, &beta, &dyd];
            let s = q.shape();
            let dims = [s[0], s[1], s[2], s[3], v.shape()[3]];
            let one = delta_heads(ll, &dev, args, dims, p).unwrap();
            let groups = in_head_groups(ll, &dev, args, dims, p, 2).unwrap();
            let pairs = [
                ("dq", &one.lift.dq, &groups.lift.dq),
                ("dk", &one.lift.dk, &groups.lift.dk),
                ("dv", &one.lift.dv, &groups.lift.dv),
                ("dlambda", &one.lift.dlambda, &groups.lift.dlambda),
                ("dg", &one.dg, &groups.dg),
                ("dbeta", &one.dbeta, &groups.dbeta),
                ("dparam", one.lift.dparam.as_ref().unwrap(), groups.lift.dparam.as_ref().unwrap()),
            ];
            for (name, a, b) in pairs {
                let (a, b) = (a.to_host().unwrap(), b.to_host().unwrap());
                assert_eq!(a.shape(), b.shape(), "{name}");
                let same = a.iter().zip(b.iter()).all(|(x, y)| x.f64().to_bits() == y.f64().to_bits());
                assert!(same, "{} {p:?}: {name} differs between one call and head groups", F::SUFFIX);
                assert!(a.iter().any(|x| x.f64() != 0.0), "{name} is not all zeros");
            }
        }
        bits::<f32>(ll, &x, &dy, Precision::Tf32);
        bits::<f64>(ll, &x, &dy, Precision::Exact);
    }
}
