//! Gated DeltaNet's chunked backward on CUDA through the WY/UT form (docs/math.md §2.7, the
//! kernels' plan in docs/design.md), kernels in `kernels/loglinear_backward_chunked.cu`; the CPU
//! twin is `mixer-cpu/src/loglinear/backward_chunked.rs`.
//!
//! Per chunk of `n ≤ C` tokens (`C` = 64 in f32, 32 in f64), with `γ` the chunk-local prefix
//! sums of the log-decays, `Γ_{rs} = e^(γ_r − γ_s)`, `T = I + strict(diag(β)(KKᵀ ⊙ Γ))`,
//! `W = T⁻¹ diag(β e^γ) K`, `U = T⁻¹ diag(β) V`, `K̂ = diag(e^(γ_{n−1} − γ)) K`,
//! `P = σ (QKᵀ ⊙ Γ)` (lower, diagonal included) and `Z` the state entering the chunk, the forward
//! is `U' = U − W Z`, `Y = σ diag(e^γ) Q Z + P U'`, `Z_next = e^(γ_{n−1}) Z + K̂ᵀ U'`. With `X` the
//! adjoint of `Z_next` the backward is
//! - `dU' = Pᵀ dY + K̂ X` and `X_prev = e^(γ_{n−1}) X + σ Qᵀ diag(e^γ) dY − Wᵀ dU'` — the reverse
//!   pass over chunks, the forward pass's recurrence with `W` and `K̂` exchanged;
//! - with `E = T⁻ᵀ dU'`: `dV = diag(β) E`, and `dT = −E U'ᵀ` below the diagonal (from
//!   `dW = −dU' Zᵀ`, `dU = dU'` and `d T⁻¹ = −T⁻¹ dT T⁻¹`: `−T⁻ᵀ(dW Wᵀ + dU Uᵀ)`… `= −E (U − W Z)ᵀ`);
//! - `dQ = σ diag(e^γ) dY Zᵀ + Mp K`, `dK = Mpᵀ Q + (F + Fᵀ) K + diag(e^(γ_{n−1} − γ)) U' Xᵀ
//!   − diag(β e^γ) E Zᵀ` with `Mp = σ (dY U'ᵀ) ⊙ Γ` (lower) and `F = dT ⊙ diag(β) Γ` (strict);
//! - `β̄_r = Σ_s dT_{rs} Γ_{rs} (KKᵀ)_{rs} + v_r·E_r − e^(γ_r) k_r·(E Zᵀ)_r`;
//! - `γ̄` collects `Mp_{rs}(QKᵀ)_{rs} + F_{rs}(KKᵀ)_{rs}` (`+` at `r`, `−` at `s`), `q_r·dQ¹_r`,
//!   `−k_r·dK²_r − β_r e^(γ_r) k_r·(E Zᵀ)_r` and at `n − 1` `e^(γ_{n−1})⟨X, Z⟩ + Σ_r k_r·dK²_r`
//!   (`dQ¹`, `dK²` the `Z`- and `X`-terms above); `dg` is its reverse cumulative sum inside the
//!   chunk.
//!
//! From a state (docs/math.md §7.1, "The CUDA backward from a state"): the initial state `S_0`
//! enters only as the state entering chunk 0 (`Z = S_0ᵀ`) and the final state's cotangent `S̄_T`
//! only as the adjoint after the last chunk (`X = S̄_Tᵀ`), so the forward pass starts from `S_0ᵀ`,
//! the reverse pass from `S̄_Tᵀ`, and the adjoint the reverse pass leaves after chunk 0 is `S̄_0ᵀ`;
//! every chunk-local formula above holds as written.
//!
//! Five launches in the exact mode (and f64): the forward's WY step `llc_wy` (FMA, with `T⁻¹`),
//! `lgb_pass_fwd` (the states entering the chunks and `U'`), `lgb_pre` (`Pᵀ dY` and
//! `σ Qᵀ diag(e^γ) dY`, chunk-parallel), `lgb_pass_rev` (`X` per chunk and `dU'`), `lgb_grad`
//! (chunk-parallel, every gradient), all FMA in the element type of the call. In the tf32 and bf16
//! modes (f32 data; the bf16 mode's activations widened to f32) the WY step and both passes run on
//! tensor cores ([`Plan`]): the forward's own `llc_wy_tc` and state pass, and the reverse pass
//! `llc_delta_h_rg_rev_f32` (`Dk ≤ 128`); `lgb_pre` is `lgb_pre_tc_f32`, and with `Dv > 32` every
//! product of the gradients runs on tensor cores: those that read a state in `lgb_state_tc_f32`,
//! the chunk's own and the gradients in `lgb_grad_tc_f32`. The backward keeps two `Dk × Dv` states
//! per chunk (`Z` and `X`), `W`, `U'`, `dU'` (then `E`, except in `lgb_grad_tc_f32`) and `T⁻¹`:
//! `B·H·⌈T/C⌉·(2 Dk Dv + C²) + B·T·H·(Dk + 2 Dv)` values besides the gradients (plus
//! `B·T·H·(Dv + 3 Dk)` on tensor cores: `U'` and `dU'` in buffers of their own, the state
//! products). Every sum runs in a fixed order, so the same inputs give the same bits.

use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Precision, Result};

use super::common::{
    Device, Elem, FAMILY, Launch, Shape, Step, Storage, check_sizes, fixed_dims, kernel_ints, tensor_cores,
    view_or_zero,
};
use super::state_pass::{self, PassData, StatePass};
use super::wy;
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu, int, launch, max_dynamic_smem};
use crate::tensor::{DeviceTensor, GpuReal};

/// State columns per block of the passes (`LGB_NCOL` in the kernel file).
const NCOL: usize = 16;
/// The widest key head the passes take (each thread keeps `Dk·NCOL/256 ≤ 16` state entries).
pub const MAX_DK: usize = 256;
/// `LLC_LD`, `LLC_KT` and `LLC_NT` of `loglinear_common.cuh`: tile rows, reduction slices and
/// output tiles of the chunk kernels.
const LD: usize = 65;
const KT: usize = 16;
const NT: usize = 64;

/// Dynamic shared memory of `lgb_pass_*` (bytes) with `stages` stage buffers (each the chunk's
/// `W` and `k` rows `[C][Dk + 1]`, `NCOL` columns of `U` and the log-decays), the state slice
/// `[Dk][NCOL]` and the new values `[C][NCOL]`.
pub(crate) fn pass_smem(elem: Elem, dk: usize, stages: usize) -> usize {
    let ch = elem.chunk();
    let stage = 2 * ch * (dk + 1) + ch * NCOL + ch;
    (stages * stage + dk * NCOL + ch * NCOL) * elem.bytes()
}

/// The passes' stage buffers: two (the next chunk copied while one computes) where they fit in
/// `smem` bytes, else one.
pub(crate) fn pass_stages(elem: Elem, dk: usize, smem: usize) -> usize {
    if pass_smem(elem, dk, 2) <= smem { 2 } else { 1 }
}

/// Dynamic shared memory of `lgb_pre` (bytes): `P [C][C + 1]`, the `dY` and `Q` tiles `[64][65]`.
pub(crate) fn pre_smem(elem: Elem) -> usize {
    let ch = elem.chunk();
    (ch * (ch + 1) + 2 * NT * LD) * elem.bytes()
}

/// Dynamic shared memory of `lgb_grad` (bytes; `LgbGrad<T>` in the kernel): four `[C][C + 1]`
/// tiles, one `[64][65]`, five slices `[16][65]`, and the second `[64][65]` tile over the first
/// two `[C][C + 1]` where they are large enough.
pub(crate) fn grad_smem(elem: Elem) -> usize {
    let ch = elem.chunk();
    let (nn, wt) = (ch * (ch + 1), NT * LD);
    let end = 4 * nn + wt + 5 * KT * LD;
    (if 2 * nn >= wt { end } else { end + wt }) * elem.bytes()
}

/// The backward's plan: `launches` in order the WY step, the forward state pass, `lgb_pre`, the
/// reverse pass and `lgb_grad`. The forward state pass is the backward's own `lgb_pass_fwd`
/// (`pass = None`; FMA) or, in the `tf32` and `bf16` modes with f32 data, the forward's own
/// tensor-core pass (`pass = Some`: [`StatePass::Registers`] or [`StatePass::Shared`], as
/// [`state_pass::select`] gives it for the `tf32` mode) after the forward's tensor-core WY step
/// (`llc_wy_tc`, with `T⁻¹`): both leave the states entering the chunks (`Dk × Dv`, the layout
/// `lgb_pre` and `lgb_grad` read) and the new values `U'`.
///
/// The reverse pass is `lgb_pass_rev` (FMA) or, on tensor cores where `Dk ≤ 128` and its buffers fit,
/// `llc_delta_h_rg_rev_f32` (`reverse_on_tensor_cores`): the forward's register pass run backwards
/// with `W` and `K` exchanged, one warp per 16 value columns: up to four warps a block as the
/// forward's register pass, but one where `B·H·⌈Dv/16⌉` does not exceed the multiprocessors and
/// `Dk ≤ 64` (see [`REV_ONE_WARP_MAX_DK`]).
///
/// On tensor cores `lgb_pre` is `lgb_pre_tc_f32`, and with `Dv > 32` (`products`) the products of
/// `lgb_grad` that read a state run before it in `lgb_state_tc_f32` (`dY Zᵀ`, `U' Xᵀ` and
/// `dU' Zᵀ`, a block per chunk, batch·head and 64 key columns), and the last launch is
/// `lgb_grad_tc_f32` (`E = T⁻ᵀ dU'`, the chunk's `dY U'ᵀ`, `E U'ᵀ`, `QKᵀ`, `KKᵀ`, then `Mp K`,
/// `Mpᵀ Q + (F + Fᵀ) K` and `T⁻ᵀ (dU' Zᵀ)`, and every gradient from them), both chunk-parallel on
/// tf32 `mma.sync`.
pub(crate) struct Plan {
    pub launches: Vec<Launch>,
    pub pass: Option<StatePass>,
    pub reverse_on_tensor_cores: bool,
    /// `lgb_state_tc`, run before the last launch (`lgb_grad_tc`).
    pub products: Option<Launch>,
}

/// The reverse pass takes one warp a block where its 16-column warps do not fill the device only up
/// to this `Dk`. Four warps put `B·H·⌈Dv/64⌉` blocks on the device: at (1, 16384, 16, 64) on an
/// H100 2.63 ms against one warp's 1.60; at `Dk = 128` each block stages the chunk's `W` and `K`
/// rows for fewer columns, and one warp made the whole backward at (1, 16384, 16, 128) 11.7 ms
/// against 8.4 with four.
const REV_ONE_WARP_MAX_DK: usize = 64;

/// Dynamic shared memory of `lgb_grad_tc_f32` (bytes): five `[64][68]` f32 tiles.
pub(crate) const GRAD_TC_SMEM: usize = 5 * 64 * 68 * 4;

/// Dynamic shared memory of `lgb_pre_tc_f32` (bytes): three `[64][68]` f32 tiles.
pub(crate) const PRE_TC_SMEM: usize = 3 * 64 * 68 * 4;

/// Dynamic shared memory of `lgb_state_tc_f32` (bytes): five `[64][68]` f32 tiles.
pub(crate) const STATE_TC_SMEM: usize = 5 * 64 * 68 * 4;

/// The products run on tensor cores for value heads wider than this. Since `lgb_grad_tc` is one
/// kernel, they win at `Dv = 64` too (H100, 2026-12-06, whole backward, the FMA `lgb_grad` against
/// the tensor-core products in the same call: tf32 7.48 → 5.29 ms at (8, 4096, 16, 64), 5.06 →
/// 3.93 at (1, 16384, 16, 64); bf16 7.73 → 5.51 at (8, 4096, 16, 64)); at `Dv ≤ 32` they were not
/// measured, and the FMA kernel keeps them.
const PRODUCTS_MIN_DV: usize = 32;

/// The backward's [`Plan`] for mode `p` on `device` (the passes' `stages` in [`Launch::stages`]).
pub(crate) fn plan(s: Shape, elem: Elem, p: Precision, device: Device) -> Plan {
    let (nc, bh, sfx) = (s.chunks(elem.chunk()), s.bh(), elem.suffix());
    let src = &kernels::LOGLINEAR_BACKWARD_CHUNKED;
    let on = |name: &str, grid: [usize; 3], smem: usize| {
        Launch::new(Step::Backward, src, format!("{name}_{sfx}"), fixed_dims(s))
            .on(grid, 256, smem)
            .opted_in(true)
    };
    let pass_grid = [bh, s.dv.div_ceil(NCOL), 1];
    let stages = pass_stages(elem, s.dk, device.smem);
    let own_pass = |name: &str| {
        let l = on(name, pass_grid, pass_smem(elem, s.dk, stages));
        Launch { stages: Some(stages), ..l }
    };
    let tc = tensor_cores(p, elem);
    // The forward's pass in the tf32 mode's form (the bf16 mode's f32 copies of bf16 activations
    // take the same kernels).
    let forward = tc
        .then(|| state_pass::select(s, Precision::Tf32, Storage::Real(elem), false, device))
        .filter(|pass| matches!(pass, StatePass::Registers { .. } | StatePass::Shared { .. }));
    // The reverse pass: the register pass's launch (its warps, buffers, grid and shared memory)
    // with the kernel run backwards; one warp a block where the value columns do not fill the device
    // and `Dk ≤ 64`.
    let few = bh * s.dv.div_ceil(16) <= device.sms;
    let warps = if few && s.dk <= REV_ONE_WARP_MAX_DK { 1 } else { state_pass::RG_MAX_WARPS };
    let rev_tc = tc.then(|| state_pass::registers(s.dk, s.dv, device.smem, warps)).flatten();
    let rev = match rev_tc {
        Some(pass) => {
            let l = state_pass::launches(pass, s, elem, Precision::Tf32, false).remove(0);
            Launch { step: Step::Backward, function: "llc_delta_h_rg_rev_f32".into(), ..l }
        }
        None => own_pass("lgb_pass_rev"),
    };
    let (wy, fwd) = match forward {
        Some(pass) => {
            let mut l = state_pass::launches(pass, s, elem, Precision::Tf32, false);
            (wy::launch(s, elem, Precision::Tf32), l.remove(0))
        }
        None => (wy::launch(s, elem, Precision::Exact), own_pass("lgb_pass_fwd")),
    };
    let products = (tc && s.dv > PRODUCTS_MIN_DV)
        .then(|| on("lgb_state_tc", [nc, bh, s.dk.div_ceil(64)], STATE_TC_SMEM));
    let (grad, g_smem) =
        if products.is_some() { ("lgb_grad_tc", GRAD_TC_SMEM) } else { ("lgb_grad", grad_smem(elem)) };
    Plan {
        launches: vec![
            wy,
            fwd,
            if tc {
                on("lgb_pre_tc", [nc, bh, 1], PRE_TC_SMEM)
            } else {
                on("lgb_pre", [nc, bh, 1], pre_smem(elem))
            },
            rev,
            on(grad, [nc, bh, 1], g_smem),
        ],
        pass: forward,
        reverse_on_tensor_cores: rev_tc.is_some(),
        products,
    }
}

/// Gated DeltaNet's chunked backward: `[dq, dk, dv, dβ, dg]` from `[q, k, v, g, β, dy]` of
/// `[B, T, H, Dk, Dv]` (nothing empty), the same kernels in every mode; from the initial state
/// `s0` and with the final state's cotangent `d_final` (both `[B, H, Dv, Dk]`, checked by the
/// caller; `None`: zero), and with `s0` also the initial state's gradient `S̄_0`. See the module
/// documentation.
pub(crate) fn delta<F: GpuReal>(
    ll: &LogLinear,
    [q, k, v, gt, beta, dy]: [&DeviceTensor<F>; 6],
    dims: [usize; 5],
    p: Precision,
    s0: Option<&DeviceTensor<F>>,
    d_final: Option<&DeviceTensor<F>>,
) -> Result<([DeviceTensor<F>; 5], Option<DeviceTensor<F>>)> {
    let s = Shape::new(dims);
    let [b, t, h, dk, dv] = dims;
    if dk > MAX_DK {
        return Err(err(
            FAMILY,
            format!("gated DeltaNet's CUDA backward takes Dk ≤ {MAX_DK}, got Dk = {dk}"),
        ));
    }
    let elem = Elem::of::<F>();
    let (ch, nc, bh) = (elem.chunk(), s.chunks(elem.chunk()), s.bh());
    check_sizes(s, elem, 2 * nc)?;
    let [ti, hi, dki, dvi, nci, _] = kernel_ints([t, h, dk, dv, nc, bh])?;
    let device = Device::current();
    let plan = plan(s, elem, p, device);
    let [l_wy, l_fwd, l_pre, l_rev, l_grad] = &plan.launches[..] else {
        return Err(err(FAMILY, "internal: the backward plan has five launches"));
    };
    let stages = int(FAMILY, "stages", pass_stages(elem, dk, device.smem))?;
    for l in [l_fwd, l_rev, l_grad] {
        if l.shared_mem > max_dynamic_smem() {
            return Err(err(
                FAMILY,
                format!(
                    "gated DeltaNet's CUDA backward needs {} bytes of shared memory for `{}` (Dk = {dk}); the device \
                     allows {}",
                    l.shared_mem,
                    l.function,
                    max_dynamic_smem()
                ),
            ));
        }
    }
    let (qv, kv, vv, gv, bv, dyv) = (q.view(), k.view(), v.view(), gt.view(), beta.view(), dy.view());
    let mut w = pool::take::<F>(FAMILY, b * t * h * dk)?;
    let mut u = pool::take::<F>(FAMILY, b * t * h * dv)?;
    let mut tinv = pool::take::<F>(FAMILY, bh * nc * ch * ch)?;
    wy::run(l_wy, [&kv, &vv], (&gv, 1), &bv, [&mut w, &mut u], (&mut tinv, true), s, None)?;
    let g = gpu()?;
    let zero = pool::zeros::<F>(FAMILY, 1)?;
    let mut no_out = pool::take::<F>(FAMILY, 1)?;
    let (s0v, has_s0) = view_or_zero(s0, &zero);
    let (dfv, has_df) = view_or_zero(d_final, &zero);
    let mut zs = pool::take::<F>(FAMILY, bh * nc * dk * dv)?;
    // U' over U (the backward's own pass) or into a buffer of its own (the forward's).
    let u = match plan.pass {
        Some(pass) => {
            let mut vn = pool::take::<F>(FAMILY, b * t * h * dv)?;
            let data = PassData {
                k: &kv,
                g: (&gv, 1),
                w: &w,
                u: &u,
                vn: &mut vn,
                hs: &mut zs,
                s0: (&s0v, has_s0),
                fin: None,
            };
            state_pass::run(pass, std::slice::from_ref(l_fwd), data, s, elem, false, None)?;
            vn
        }
        None => {
            let (f, cfg) = l_fwd.function()?;
            launch!(g, FAMILY, f, cfg; &kv, &gv, &*w, &mut *u, &mut *zs, &s0v, &has_s0, &mut *no_out, &0i32,
                &ti, &hi, &dki, &dvi, &nci, &stages)?;
            u
        }
    };
    let scale = F::of(ll.scale);
    let mut du = pool::take::<F>(FAMILY, b * t * h * dv)?;
    let mut xs = pool::take::<F>(FAMILY, bh * nc * dk * dv)?;
    let (f, cfg) = l_pre.function()?;
    launch!(g, FAMILY, f, cfg; &qv, &kv, &gv, &dyv, &mut *du, &mut *xs, &ti, &hi, &dki, &dvi, &nci, &scale)?;
    let mut ds0 = if s0.is_some() { Some(pool::take::<F>(FAMILY, bh * dv * dk)?) } else { None };
    let has_ds0 = ds0.is_some() as i32;
    let ds0_out = match ds0.as_mut() {
        Some(d) => &mut **d,
        None => &mut *no_out,
    };
    let (f, cfg) = l_rev.function()?;
    // dU' over A (the FMA pass) or into a buffer of its own (the tensor-core pass).
    let mut du = if plan.reverse_on_tensor_cores {
        let mut du2 = pool::take::<F>(FAMILY, b * t * h * dv)?;
        launch!(g, FAMILY, f, cfg; &kv, &gv, &*w, &*du, &mut *du2, &mut *xs, &ti, &hi, &dki, &dvi, &nci,
            &dfv, &has_df, ds0_out, &has_ds0)?;
        drop(du);
        du2
    } else {
        launch!(g, FAMILY, f, cfg; &kv, &gv, &*w, &mut *du, &mut *xs, &dfv, &has_df, ds0_out, &has_ds0,
            &ti, &hi, &dki, &dvi, &nci, &stages)?;
        du
    };
    drop(w);
    let [mut d_q, mut d_k, mut d_v, mut d_b, mut d_g] = grad_buffers::<F>(dims)?;
    let (f, cfg) = l_grad.function()?;
    match &plan.products {
        // On tensor cores: the state products (they read dU'), then every gradient.
        Some(l_state) => {
            let n = b * t * h * dk;
            let (mut a1, mut a2, mut a3) =
                (pool::take::<F>(FAMILY, n)?, pool::take::<F>(FAMILY, n)?, pool::take::<F>(FAMILY, n)?);
            let mut xz = pool::take::<f64>(FAMILY, bh * nc * dk.div_ceil(64))?;
            let (fs, cs) = l_state.function()?;
            launch!(g, FAMILY, fs, cs; &dyv, &*u, &*du, &*zs, &*xs, &mut *a1, &mut *a2, &mut *a3, &mut *xz,
                &ti, &hi, &dki, &dvi, &nci)?;
            launch!(g, FAMILY, f, cfg; &qv, &kv, &vv, &gv, &bv, &dyv, &*u, &*tinv, &*du, &*a1, &*a2, &*a3,
                &*xz, &mut *d_q, &mut *d_k, &mut *d_v, &mut *d_b, &mut *d_g, &ti, &hi, &dki, &dvi, &nci, &scale)?;
        }
        None => launch!(g, FAMILY, f, cfg; &qv, &kv, &vv, &gv, &bv, &dyv, &*tinv, &*zs, &*xs, &*u, &mut *du,
            &mut *d_q, &mut *d_k, &mut *d_v, &mut *d_b, &mut *d_g, &ti, &hi, &dki, &dvi, &nci, &scale)?,
    }
    let grads = grad_tensors([d_q, d_k, d_v, d_b, d_g], dims)?;
    Ok((grads, ds0.map(|d| DeviceTensor::from_pooled(d, &[b, h, dv, dk])).transpose()?))
}

/// The buffers of gated DeltaNet's five input gradients `[dq, dk, dv, dβ, dg]` for `[B, T, H, Dk,
/// Dv]`, which the gradient kernel (`lgb_grad`, the lifted `lgl_grad`) writes whole.
pub(crate) fn grad_buffers<F: GpuReal>([b, t, h, dk, dv]: [usize; 5]) -> Result<[Pooled<F>; 5]> {
    let n = b * t * h;
    Ok([
        pool::take::<F>(FAMILY, n * dk)?,
        pool::take::<F>(FAMILY, n * dk)?,
        pool::take::<F>(FAMILY, n * dv)?,
        pool::take::<F>(FAMILY, n)?,
        pool::take::<F>(FAMILY, n)?,
    ])
}

/// [`grad_buffers`] as tensors `q`, `k` `[B, T, H, Dk]`, `v` `[B, T, H, Dv]`, `β`, `g` `[B, T, H]`.
pub(crate) fn grad_tensors<F: GpuReal>(
    [d_q, d_k, d_v, d_b, d_g]: [Pooled<F>; 5],
    [b, t, h, dk, dv]: [usize; 5],
) -> Result<[DeviceTensor<F>; 5]> {
    Ok([
        DeviceTensor::from_pooled(d_q, &[b, t, h, dk])?,
        DeviceTensor::from_pooled(d_k, &[b, t, h, dk])?,
        DeviceTensor::from_pooled(d_v, &[b, t, h, dv])?,
        DeviceTensor::from_pooled(d_b, &[b, t, h])?,
        DeviceTensor::from_pooled(d_g, &[b, t, h])?,
    ])
}

#[cfg(test)]
mod plan_tests {
    use super::*;

    const H200: Device = Device { sms: 132, smem: 227 << 10 };

    #[test]
    fn the_plan_is_five_launches_with_two_stages_where_they_fit() {
        let s = Shape { b: 1, t: 16384, h: 16, dk: 64, dv: 64 };
        let pl = plan(s, Elem::F32, Precision::Exact, H200);
        let l = &pl.launches;
        assert_eq!((pl.pass, pl.products.is_none()), (None, true));
        assert_eq!(
            names(&pl),
            ["llc_wy_f32", "lgb_pass_fwd_f32", "lgb_pre_f32", "lgb_pass_rev_f32", "lgb_grad_f32"]
        );
        assert_eq!((l[1].grid, l[2].grid, l[4].grid), ([16, 4, 1], [256, 16, 1], [256, 16, 1]));
        assert_eq!((l[1].stages, l[3].stages), (Some(2), Some(2)));
        // Two stages of W, k [64][65], U [64][16], g [64]; the state slice [64][16]; N [64][16].
        assert_eq!(l[1].shared_mem, (2 * (2 * 64 * 65 + 64 * 16 + 64) + 64 * 16 + 64 * 16) * 4);
        assert_eq!(l[4].shared_mem, (4 * 64 * 65 + 64 * 65 + 5 * 16 * 65) * 4);
        // f64: chunks of 32; the second wide tile after the slices.
        assert_eq!(grad_smem(Elem::F64), (4 * 32 * 33 + 2 * 64 * 65 + 5 * 16 * 65) * 8);
        assert_eq!(pre_smem(Elem::F64), (32 * 33 + 2 * 64 * 65) * 8);
        // Dk = 256: one stage; everything within the H200's shared memory in f32 and f64.
        for elem in [Elem::F32, Elem::F64] {
            let s = Shape { b: 1, t: 100, h: 1, dk: 256, dv: 256 };
            let l = plan(s, elem, Precision::Exact, H200).launches;
            assert_eq!(l[1].stages, Some(1), "{elem:?}");
            assert!(l.iter().all(|l| l.shared_mem <= H200.smem), "{elem:?}");
        }
        assert_eq!(pass_stages(Elem::F32, 128, H200.smem), 2);
    }

    fn names(p: &Plan) -> Vec<&str> {
        p.launches.iter().map(|l| l.function.as_str()).collect()
    }

    #[test]
    fn the_tensor_core_modes_take_the_forwards_wy_step_and_state_pass() {
        for p in [Precision::Tf32, Precision::Bf16] {
            // Few blocks: the shared-memory pass; many: the register pass (the forward's rule).
            let few = plan(Shape { b: 1, t: 16384, h: 16, dk: 64, dv: 64 }, Elem::F32, p, H200);
            assert!(matches!(few.pass, Some(StatePass::Shared { .. })), "{p:?}");
            assert_eq!(names(&few)[..2], ["llc_wy_tc_f32", "llc_delta_h_tc_f32"], "{p:?}");
            // The reverse pass on tensor cores, one warp a block where 16-column warps do not
            // fill the device (16 · 4 ≤ 132); lgb_pre, the state products and the gradients on
            // tensor cores.
            assert!(few.reverse_on_tensor_cores);
            assert_eq!((few.launches[3].grid, few.launches[3].block), ([16, 4, 1], 32));
            assert_eq!(names(&few)[2..], ["lgb_pre_tc_f32", "llc_delta_h_rg_rev_f32", "lgb_grad_tc_f32"]);
            assert_eq!(few.products.map(|l| l.grid), Some([256, 16, 1]));
            // At Dv = 32 the gradients' own FMA products.
            let narrow = plan(Shape { b: 1, t: 16384, h: 16, dk: 64, dv: 32 }, Elem::F32, p, H200);
            assert_eq!(names(&narrow)[4], "lgb_grad_f32");
            assert!(narrow.products.is_none());
            // As few columns at Dk = 128: four warps a block.
            let few128 = plan(Shape { b: 1, t: 16384, h: 16, dk: 128, dv: 128 }, Elem::F32, p, H200);
            assert_eq!((few128.launches[3].grid, few128.launches[3].block), ([16, 2, 1], 128));
            for d in [64, 128] {
                let many = plan(Shape { b: 8, t: 4096, h: 16, dk: d, dv: d }, Elem::F32, p, H200);
                assert!(matches!(many.pass, Some(StatePass::Registers { .. })), "{p:?} {d}");
                // The state products on tensor cores (a block per chunk, batch·head and 64 key
                // columns), then every gradient on tensor cores (a block per chunk).
                assert_eq!(
                    names(&many),
                    [
                        "llc_wy_tc_f32",
                        "llc_delta_h_rg_f32",
                        "lgb_pre_tc_f32",
                        "llc_delta_h_rg_rev_f32",
                        "lgb_grad_tc_f32"
                    ],
                    "{p:?} {d}"
                );
                let sp = many.products.as_ref().expect("the state products");
                assert_eq!((sp.function.as_str(), sp.grid), ("lgb_state_tc_f32", [64, 128, d as u32 / 64]));
                assert_eq!(
                    (many.launches[4].grid, many.launches[4].shared_mem),
                    ([64, 128, 1], 5 * 64 * 68 * 4)
                );
                // Four warps of 16 value columns a block, as the forward's register pass.
                assert_eq!(many.launches[3].block, 128);
                assert!(many.launches[3].defines.contains(&"DHR_WARPS=4".to_string()));
                // The bf16 mode's f32 copies run the tf32 mode's kernels (no DH_K_TF32).
                assert!(!many.launches[1].defines.iter().any(|d| d.starts_with("DH_K_TF32")));
            }
        }
        // f64, and head dims whose forward pass is the FMA one, keep the backward's own pass.
        let s = Shape { b: 1, t: 1000, h: 2, dk: 64, dv: 64 };
        assert_eq!(plan(s, Elem::F64, Precision::Tf32, H200).pass, None);
        let wide = Shape { b: 1, t: 1000, h: 2, dk: 256, dv: 64 };
        let w = plan(wide, Elem::F32, Precision::Tf32, H200);
        assert_eq!((w.pass, names(&w)[..2].to_vec()), (None, vec!["llc_wy_f32", "lgb_pass_fwd_f32"]));
        assert!(!w.reverse_on_tensor_cores);
        assert_eq!(names(&w)[3], "lgb_pass_rev_f32");
        // Tensor-core products at Dv = 64 with the FMA passes: four key tiles (Dk = 256).
        assert_eq!(w.products.map(|l| l.grid), Some([16, 2, 4]));
        assert!(plan(s, Elem::F64, Precision::Tf32, H200).products.is_none());
    }
}

#[cfg(test)]
mod tests {
    //! The chunk recipe of the kernels, emulated on the host in f64 (one loop nest per kernel,
    //! in the kernels' grouping of the products), against the CPU backward, from zero and from a
    //! state: fails if the algebra of the backward (docs/math.md §2.7, and §7.1 "The CUDA backward
    //! from a state") is wrong.
    use mixer_core::mixer::downcast;
    use mixer_core::mixers::loglinear::LogLinear;
    use mixer_core::mixers::loglinear::state::STATE;
    use mixer_core::{Form, Requires, Tensors};
    use mixer_cpu as _;
    use ndarray::{Array2, ArrayD, Axis, IxDyn, s};

    /// One (batch, head)'s inputs: `q, k [T×Dk]`, `v, dy [T×Dv]`, `g, β [T]`.
    struct HeadIn {
        q: Array2<f64>,
        k: Array2<f64>,
        v: Array2<f64>,
        dy: Array2<f64>,
        g: Vec<f64>,
        beta: Vec<f64>,
    }

    /// One chunk's WY pieces (`llc_wy`): `γ`, `T⁻¹`, `W`, `U`.
    struct Wy {
        gam: Vec<f64>,
        ti: Array2<f64>,
        w: Array2<f64>,
        u: Array2<f64>,
    }

    fn wy(x: &HeadIn, i0: usize, n: usize) -> Wy {
        let mut gam = vec![0.0; n];
        let mut acc = 0.0;
        for r in 0..n {
            acc += x.g[i0 + r];
            gam[r] = acc;
        }
        let kc = x.k.slice(s![i0..i0 + n, ..]);
        let kk = kc.dot(&kc.t());
        let mut ti = Array2::<f64>::eye(n);
        for c in 0..n {
            for r in c + 1..n {
                let mut a = 0.0;
                for s2 in c..r {
                    a += x.beta[i0 + r] * kk[(r, s2)] * (gam[r] - gam[s2]).exp() * ti[(s2, c)];
                }
                ti[(r, c)] = -a;
            }
        }
        let mut bk = kc.to_owned();
        let mut bv = x.v.slice(s![i0..i0 + n, ..]).to_owned();
        for r in 0..n {
            let b = x.beta[i0 + r];
            bk.row_mut(r).mapv_inplace(|e| e * b * gam[r].exp());
            bv.row_mut(r).mapv_inplace(|e| e * b);
        }
        Wy { w: ti.dot(&bk), u: ti.dot(&bv), ti, gam }
    }

    /// `K̂ = diag(e^(γ_{n−1} − γ)) K` of a chunk.
    fn khat(x: &HeadIn, i0: usize, c: &Wy) -> Array2<f64> {
        let n = c.gam.len();
        let mut kh = x.k.slice(s![i0..i0 + n, ..]).to_owned();
        for r in 0..n {
            let t = (c.gam[n - 1] - c.gam[r]).exp();
            kh.row_mut(r).mapv_inplace(|e| e * t);
        }
        kh
    }

    /// Gradients `dq, dk, dv, dg, dβ` of one head by the kernels' recipe with chunks of `ch`, from
    /// the state `z0 = S_0ᵀ` and with the final state's adjoint `xt = S̄_Tᵀ` (`Dk × Dv`), and the
    /// adjoint the reverse pass leaves after chunk 0 (`S̄_0ᵀ`).
    fn recipe(
        x: &HeadIn,
        sigma: f64,
        ch: usize,
        z0: Array2<f64>,
        xt: Array2<f64>,
    ) -> ([Array2<f64>; 5], Array2<f64>) {
        let (t, dk, dv) = (x.q.nrows(), x.q.ncols(), x.v.ncols());
        let nc = t.div_ceil(ch);
        let span = |j: usize| (j * ch, ch.min(t - j * ch));
        let wys: Vec<Wy> = (0..nc).map(|j| wy(x, span(j).0, span(j).1)).collect();
        // lgb_pass forward: entering states Z_j and new values U' = U − W Z_j.
        assert_eq!((z0.dim(), xt.dim()), ((dk, dv), (dk, dv)));
        let mut z = z0;
        let (mut zs, mut un) = (Vec::new(), Vec::new());
        for (j, c) in wys.iter().enumerate() {
            let (i0, n) = span(j);
            let u2 = &c.u - &c.w.dot(&z);
            zs.push(z.clone());
            z = z * c.gam[n - 1].exp() + khat(x, i0, c).t().dot(&u2);
            un.push(u2);
        }
        // lgb_pre: A = Pᵀ dY, B = σ Qᵀ diag(e^γ) dY.
        let mut pre = Vec::new();
        for (j, c) in wys.iter().enumerate() {
            let (i0, n) = span(j);
            let qc = x.q.slice(s![i0..i0 + n, ..]);
            let kc = x.k.slice(s![i0..i0 + n, ..]);
            let dyc = x.dy.slice(s![i0..i0 + n, ..]);
            let mut p = qc.dot(&kc.t());
            let mut qe = qc.to_owned();
            for r in 0..n {
                for s2 in 0..n {
                    p[(r, s2)] =
                        if s2 <= r { sigma * p[(r, s2)] * (c.gam[r] - c.gam[s2]).exp() } else { 0.0 };
                }
                qe.row_mut(r).mapv_inplace(|e| e * sigma * c.gam[r].exp());
            }
            pre.push((p.t().dot(&dyc), qe.t().dot(&dyc)));
        }
        // lgb_pass reverse: X_j (the adjoint of the state after chunk j) and dU' = A + K̂ X_j.
        let mut xa = xt;
        let mut xs = vec![Array2::<f64>::zeros((0, 0)); nc];
        let mut dun = vec![Array2::<f64>::zeros((0, 0)); nc];
        for j in (0..nc).rev() {
            let (i0, n) = span(j);
            let c = &wys[j];
            let d = &pre[j].0 + &khat(x, i0, c).dot(&xa);
            xs[j] = xa.clone();
            xa = &xa * c.gam[n - 1].exp() + &pre[j].1 - c.w.t().dot(&d);
            dun[j] = d;
        }
        // lgb_grad: every chunk's input gradients.
        let mut out = [
            Array2::zeros((t, dk)),
            Array2::zeros((t, dk)),
            Array2::zeros((t, dv)),
            Array2::zeros((t, 1)),
            Array2::zeros((t, 1)),
        ];
        for (j, c) in wys.iter().enumerate() {
            let (i0, n) = span(j);
            let qc = x.q.slice(s![i0..i0 + n, ..]);
            let kc = x.k.slice(s![i0..i0 + n, ..]);
            let vc = x.v.slice(s![i0..i0 + n, ..]);
            let dyc = x.dy.slice(s![i0..i0 + n, ..]);
            let (zj, xj, u2, du) = (&zs[j], &xs[j], &un[j], &dun[j]);
            let beta = &x.beta[i0..i0 + n];
            let eg: Vec<f64> = c.gam.iter().map(|g| g.exp()).collect();
            let tail: Vec<f64> = c.gam.iter().map(|g| (c.gam[n - 1] - g).exp()).collect();
            let gm = |r: usize, s2: usize| (c.gam[r] - c.gam[s2]).exp();
            // Values side: E = T⁻ᵀ dU', dV = diag(β) E, dT = −E U'ᵀ; dY U'ᵀ.
            let e = c.ti.t().dot(du);
            let et = e.dot(&u2.t());
            let dyu = dyc.dot(&u2.t());
            let (qk, kk) = (qc.dot(&kc.t()), kc.dot(&kc.t()));
            let mut dgam = vec![0.0; n];
            let mut dbeta = vec![0.0; n];
            let (mut mp, mut f) = (Array2::<f64>::zeros((n, n)), Array2::<f64>::zeros((n, n)));
            for r in 0..n {
                for s2 in 0..=r {
                    mp[(r, s2)] = sigma * dyu[(r, s2)] * gm(r, s2);
                    if s2 < r {
                        let dt = -et[(r, s2)];
                        f[(r, s2)] = dt * beta[r] * gm(r, s2);
                        dbeta[r] += dt * gm(r, s2) * kk[(r, s2)];
                        let pg = mp[(r, s2)] * qk[(r, s2)] + f[(r, s2)] * kk[(r, s2)];
                        dgam[r] += pg;
                        dgam[s2] -= pg;
                    }
                }
                dbeta[r] += vc.row(r).dot(&e.row(r));
                out[2].row_mut(i0 + r).assign(&(&e.row(r) * beta[r]));
            }
            // Keys side.
            let dq1 = dyc.dot(&zj.t());
            let dk2 = u2.dot(&xj.t());
            let ez = e.dot(&zj.t());
            let dq = mp.dot(&kc);
            let dkk = mp.t().dot(&qc) + (&f + &f.t()).dot(&kc);
            let mut dlast = eg[n - 1] * (xj * zj).sum();
            for r in 0..n {
                let a = sigma * eg[r];
                let q1 = &dq1.row(r) * a;
                dgam[r] += qc.row(r).dot(&q1);
                out[0].row_mut(i0 + r).assign(&(&dq.row(r) + &q1));
                let k2 = &dk2.row(r) * tail[r];
                let kd2 = kc.row(r).dot(&k2);
                let kez = kc.row(r).dot(&ez.row(r));
                dgam[r] += -kd2 - beta[r] * eg[r] * kez;
                dlast += kd2;
                dbeta[r] -= eg[r] * kez;
                out[1].row_mut(i0 + r).assign(&(&dkk.row(r) + &k2 - &ez.row(r) * (beta[r] * eg[r])));
            }
            dgam[n - 1] += dlast;
            let mut acc = 0.0;
            for r in (0..n).rev() {
                acc += dgam[r];
                out[3][(i0 + r, 0)] = acc;
                out[4][(i0 + r, 0)] = dbeta[r];
            }
        }
        (out, xa)
    }

    /// Gradients `dq, dk, dv, dg, dβ, dλ` of one head of the lifted gated DeltaNet (λ weights
    /// `lam [T × L]`) by the aggregated chunk recipe planned for its CUDA backward, chunks of `ch`
    /// (a power of two): the forward's level states `Z^e` entering each chunk, a reverse level
    /// pass (the transition transposed, sources `Q̃ᵀ diag(w_e) dY`, the merge's adjoint copying
    /// level `m + 1`'s adjoint to levels `0 … m`), then per chunk the level-dependent terms summed
    /// into `dQ̃ = Σ_e diag(w_e) dY Z^eᵀ` and `Hxz = Σ_e X^e Z^eᵀ` and everything else as without
    /// the lift, with the intra-chunk part `(Λ ⊙ P T⁻¹ diag(β)) V`.
    fn lifted_recipe(x: &HeadIn, lam: &Array2<f64>, sigma: f64, ch: usize) -> [Array2<f64>; 6] {
        use mixer_core::fenwick::bitlen;
        let (t, dk, dv, nl) = (x.q.nrows(), x.q.ncols(), x.v.ncols(), lam.ncols());
        let cb = ch.trailing_zeros() as usize;
        let nc = t.div_ceil(ch);
        let span = |j: usize| (j * ch, ch.min(t - j * ch));
        let wys: Vec<Wy> = (0..nc).map(|j| wy(x, span(j).0, span(j).1)).collect();
        let present = |j: usize| (1..=bitlen(j)).filter(move |e| (j >> (e - 1)) & 1 == 1);
        let pmat = |j: usize| {
            let (i0, n) = span(j);
            let c = &wys[j];
            let qk = x.q.slice(s![i0..i0 + n, ..]).dot(&x.k.slice(s![i0..i0 + n, ..]).t());
            Array2::from_shape_fn((n, n), |(r, s2)| {
                if s2 <= r { sigma * qk[(r, s2)] * (c.gam[r] - c.gam[s2]).exp() } else { 0.0 }
            })
        };
        let qtil = |j: usize, p: &Array2<f64>| {
            let (i0, n) = span(j);
            let c = &wys[j];
            let mut qe = x.q.slice(s![i0..i0 + n, ..]).to_owned();
            for r in 0..n {
                qe.row_mut(r).mapv_inplace(|e| e * sigma * c.gam[r].exp());
            }
            qe - p.dot(&c.w)
        };
        let weighted = |j: usize, e: usize, a: &Array2<f64>| {
            let (i0, _) = span(j);
            let mut a = a.clone();
            for (r, mut row) in a.rows_mut().into_iter().enumerate() {
                row.mapv_inplace(|v| v * lam[(i0 + r, cb + e)]);
            }
            a
        };
        // Forward: the level states entering every chunk (after the merge).
        let zero = || Array2::<f64>::zeros((dk, dv));
        let mut levels: Vec<Array2<f64>> = vec![zero(); 40];
        let mut zs: Vec<Vec<(usize, Array2<f64>)>> = Vec::new();
        for (j, c) in wys.iter().enumerate() {
            let (i0, n) = span(j);
            if j >= 1 {
                let m = j.trailing_zeros() as usize;
                let sum = (0..=m).fold(zero(), |a, e| a + &levels[e]);
                for l in levels.iter_mut().take(m + 1) {
                    *l = zero();
                }
                levels[m + 1] = sum;
            }
            zs.push(present(j).map(|e| (e, levels[e].clone())).collect());
            let kh = khat(x, i0, c);
            for e in present(j) {
                let z = &levels[e];
                levels[e] = z * c.gam[n - 1].exp() - kh.t().dot(&c.w.dot(z));
            }
            levels[0] = kh.t().dot(&c.u);
        }
        // Reverse level pass: the adjoints after each chunk (levels 0 and the present ones).
        let mut after: Vec<Array2<f64>> = vec![zero(); 40];
        let mut xs: Vec<Vec<Array2<f64>>> = vec![Vec::new(); nc];
        for j in (0..nc).rev() {
            let (i0, n) = span(j);
            let c = &wys[j];
            let kh = khat(x, i0, c);
            let dyc = x.dy.slice(s![i0..i0 + n, ..]).to_owned();
            let qt = qtil(j, &pmat(j));
            xs[j] = after.clone();
            let mut entering = vec![zero(); 40];
            for e in present(j) {
                let xa = &after[e];
                entering[e] =
                    qt.t().dot(&weighted(j, e, &dyc)) + xa * c.gam[n - 1].exp() - c.w.t().dot(&kh.dot(xa));
            }
            after = vec![zero(); 40];
            if j >= 1 {
                let m = j.trailing_zeros() as usize;
                for l in after.iter_mut().take(m + 1) {
                    *l = entering[m + 1].clone();
                }
                for e in present(j).filter(|&e| e > m + 1) {
                    after[e] = entering[e].clone();
                }
            }
        }
        // Per chunk, every gradient.
        let mut out = [
            Array2::zeros((t, dk)),
            Array2::zeros((t, dk)),
            Array2::zeros((t, dv)),
            Array2::zeros((t, 1)),
            Array2::zeros((t, 1)),
            Array2::zeros((t, nl)),
        ];
        for (j, c) in wys.iter().enumerate() {
            let (i0, n) = span(j);
            let qc = x.q.slice(s![i0..i0 + n, ..]);
            let kc = x.k.slice(s![i0..i0 + n, ..]);
            let vc = x.v.slice(s![i0..i0 + n, ..]);
            let dyc = x.dy.slice(s![i0..i0 + n, ..]).to_owned();
            let beta = &x.beta[i0..i0 + n];
            let gm = |r: usize, s2: usize| (c.gam[r] - c.gam[s2]).exp();
            let eg: Vec<f64> = c.gam.iter().map(|g| g.exp()).collect();
            let ea = eg[n - 1];
            let p = pmat(j);
            let qt = qtil(j, &p);
            let kh = khat(x, i0, c);
            let (mut dqt, mut hxz) = (Array2::<f64>::zeros((n, dk)), Array2::<f64>::zeros((dk, dk)));
            for (e, z) in &zs[j] {
                let dz = dyc.dot(&z.t());
                dqt = dqt + weighted(j, *e, &dz);
                hxz = hxz + xs[j][*e].dot(&z.t());
                for r in 0..n {
                    out[5][(i0 + r, cb + e)] = qt.row(r).dot(&dz.row(r));
                }
            }
            let x0 = &xs[j][0];
            let dkh = -c.w.dot(&hxz.t()) + c.u.dot(&x0.t());
            let dw = -kh.dot(&hxz) - p.t().dot(&dqt);
            let du = kh.dot(x0);
            let mut da = ea * (0..dk).map(|i| hxz[(i, i)]).sum::<f64>();
            // Intra-chunk: A = P N, N = T⁻¹ diag(β); Y += (Λ ⊙ A) V.
            let nmat = Array2::from_shape_fn((n, n), |(r, s2)| c.ti[(r, s2)] * beta[s2]);
            let amat = p.dot(&nmat);
            let gmat = dyc.dot(&vc.t());
            let lv = |r: usize, s2: usize| lam[(i0 + r, bitlen((i0 + r) ^ (i0 + s2)))];
            let la = Array2::from_shape_fn(
                (n, n),
                |(r, s2)| if s2 <= r { lv(r, s2) * amat[(r, s2)] } else { 0.0 },
            );
            let da_m = Array2::from_shape_fn(
                (n, n),
                |(r, s2)| if s2 <= r { lv(r, s2) * gmat[(r, s2)] } else { 0.0 },
            );
            for r in 0..n {
                for s2 in 0..=r {
                    out[5][(i0 + r, bitlen((i0 + r) ^ (i0 + s2)))] += amat[(r, s2)] * gmat[(r, s2)];
                }
            }
            let dvv = la.t().dot(&dyc) + nmat.t().dot(&du);
            let dp = da_m.dot(&nmat.t()) - dqt.dot(&c.w.t());
            let dn = p.t().dot(&da_m) + du.dot(&vc.t());
            let mut dbeta = vec![0.0; n];
            let mut dgam = vec![0.0; n];
            let mut dq = Array2::<f64>::zeros((n, dk));
            let mut dkk = Array2::<f64>::zeros((n, dk));
            // N = T⁻¹ diag(β), W = T⁻¹ diag(β e^γ) K.
            let mut dti = Array2::from_shape_fn((n, n), |(r, s2)| dn[(r, s2)] * beta[s2]);
            for r in 0..n {
                for s2 in 0..n {
                    dbeta[s2] += dn[(r, s2)] * c.ti[(r, s2)];
                }
            }
            let tdw = c.ti.t().dot(&dw);
            for r in 0..n {
                let kd = kc.row(r).dot(&tdw.row(r));
                dbeta[r] += eg[r] * kd;
                dgam[r] += beta[r] * eg[r] * kd;
                dkk.row_mut(r).scaled_add(beta[r] * eg[r], &tdw.row(r));
                for s2 in 0..n {
                    dti[(r, s2)] += dw.row(r).dot(&kc.row(s2)) * beta[s2] * eg[s2];
                }
            }
            // T⁻¹ → T (strict lower), then T = I + strict(diag(β)(KKᵀ ⊙ Γ)).
            let dt = -c.ti.t().dot(&dti).dot(&c.ti.t());
            let kk = kc.dot(&kc.t());
            for r in 0..n {
                for s2 in 0..r {
                    let g = dt[(r, s2)];
                    dbeta[r] += g * kk[(r, s2)] * gm(r, s2);
                    let f = g * beta[r] * gm(r, s2);
                    let kr = kc.row(r).to_owned();
                    dkk.row_mut(r).scaled_add(f, &kc.row(s2));
                    dkk.row_mut(s2).scaled_add(f, &kr);
                    dgam[r] += f * kk[(r, s2)];
                    dgam[s2] -= f * kk[(r, s2)];
                }
            }
            // P = σ QKᵀ ⊙ Γ (lower, diagonal included).
            for r in 0..n {
                for s2 in 0..=r {
                    let f = sigma * dp[(r, s2)] * gm(r, s2);
                    dq.row_mut(r).scaled_add(f, &kc.row(s2));
                    dkk.row_mut(s2).scaled_add(f, &qc.row(r));
                    let pq = f * qc.row(r).dot(&kc.row(s2));
                    dgam[r] += pq;
                    dgam[s2] -= pq;
                }
            }
            // Q̃'s σ e^γ Q and K̂ = diag(e^(a − γ)) K.
            for r in 0..n {
                let a = sigma * eg[r];
                dq.row_mut(r).scaled_add(a, &dqt.row(r));
                dgam[r] += a * qc.row(r).dot(&dqt.row(r));
                let tl = (c.gam[n - 1] - c.gam[r]).exp();
                dkk.row_mut(r).scaled_add(tl, &dkh.row(r));
                let kd = tl * kc.row(r).dot(&dkh.row(r));
                dgam[r] -= kd;
                da += kd;
            }
            dgam[n - 1] += da;
            let mut acc = 0.0;
            for r in (0..n).rev() {
                acc += dgam[r];
                out[0].row_mut(i0 + r).assign(&dq.row(r));
                out[1].row_mut(i0 + r).assign(&dkk.row(r));
                out[2].row_mut(i0 + r).assign(&dvv.row(r));
                out[3][(i0 + r, 0)] = acc;
                out[4][(i0 + r, 0)] = dbeta[r];
            }
        }
        out
    }

    /// Decays that wipe the state (`g = −10⁴` on every third token) and gates at 0 and 1.
    fn wipe_and_gate(x: &mut Tensors<f64>) {
        for (i, g) in x.get_mut("g").unwrap().iter_mut().enumerate() {
            if i % 3 == 1 {
                *g = -1e4;
            }
        }
        for (i, e) in x.get_mut("beta").unwrap().iter_mut().enumerate() {
            *e = (i % 2) as f64;
        }
    }

    #[test]
    fn the_lifted_chunk_recipe_on_the_cpu_is_the_cpu_backward() {
        let boxed =
            mixer_registry::mixer("loglinear-gated-deltanet", &serde_json::json!({"scale": 0.8})).unwrap();
        for ((b, t, h, dk, dv), ch, strong) in [
            ((1, 37, 2, 5, 3), 4, false),
            ((1, 45, 1, 3, 4), 8, false),
            ((2, 1, 1, 2, 3), 4, false),
            ((1, 64, 1, 4, 4), 8, false),
            ((1, 41, 1, 3, 5), 4, true),
        ] {
            let dims = [("B", b), ("T", t), ("H", h), ("Dk", dk), ("Dv", dv)].into_iter().collect();
            let mut x = boxed.random_inputs(&dims, 7).unwrap();
            if strong {
                wipe_and_gate(&mut x);
                // and a zero level weight.
                for (i, l) in x.get_mut("lambda").unwrap().iter_mut().enumerate() {
                    if i % 5 == 3 {
                        *l = 0.0;
                    }
                }
            }
            let dy = x["v"].mapv(|e| (3.0 * e + 0.2).sin());
            let want = super::super::backward::cpu_backward(boxed.as_ref(), &x, &dy);
            let names = ["d_q", "d_k", "d_v", "d_g", "d_beta", "d_lambda"];
            let mut got: Vec<ArrayD<f64>> = names.iter().map(|k| ArrayD::zeros(want[*k].raw_dim())).collect();
            for bi in 0..b {
                for hi in 0..h {
                    let seq = |a: &ArrayD<f64>| a.index_axis(Axis(0), bi).index_axis(Axis(1), hi).to_owned();
                    let m2 = |a: &ArrayD<f64>| seq(a).into_dimensionality::<ndarray::Ix2>().unwrap();
                    let v1 = |a: &ArrayD<f64>| seq(a).iter().copied().collect::<Vec<_>>();
                    let hd = HeadIn {
                        q: m2(&x["q"]),
                        k: m2(&x["k"]),
                        v: m2(&x["v"]),
                        dy: m2(&dy),
                        g: v1(&x["g"]),
                        beta: v1(&x["beta"]),
                    };
                    let r = lifted_recipe(&hd, &m2(&x["lambda"]), 0.8, ch);
                    for (o, a) in got.iter_mut().zip(&r) {
                        let mut dst = o.index_axis_mut(Axis(0), bi);
                        let mut dst = dst.index_axis_mut(Axis(1), hi);
                        for (d, e) in dst.iter_mut().zip(a.iter()) {
                            *d = *e;
                        }
                    }
                }
            }
            for (k, a) in names.iter().zip(&got) {
                let w = &want[*k];
                let e = (a - w).mapv(|e| e * e).sum().sqrt() / w.mapv(|e| e * e).sum().sqrt().max(1.0);
                assert!(e < 1e-10, "{:?} chunk {ch} strong {strong} {k}: error {e:.3e}", (b, t, h, dk, dv));
            }
        }
    }

    /// The CPU's backward of gated DeltaNet from `s0` with `d_final` (`None`: the plain backward),
    /// every input gradient and `S̄_0` (empty without `s0`).
    fn cpu_grads(
        m: &dyn mixer_core::mixer::Mixer,
        x: &Tensors<f64>,
        dy: &ArrayD<f64>,
        s0: Option<&Tensors<f64>>,
        d_final: Option<&Tensors<f64>>,
    ) -> (Tensors<f64>, Tensors<f64>) {
        if s0.is_none() && d_final.is_none() {
            return (super::super::backward::cpu_backward(m, x, dy), Tensors::new());
        }
        let cpu = mixer_registry::Backend::by_name("cpu").unwrap();
        mixer_registry::state::backward_state(m, &cpu, Form::Fast, x, s0, dy, d_final, &Requires::All)
            .unwrap()
    }

    #[test]
    fn the_chunk_recipe_on_the_cpu_is_the_cpu_backward() {
        let boxed = mixer_registry::mixer("gated-deltanet", &serde_json::json!({"scale": 0.8})).unwrap();
        let ll: &LogLinear = downcast(boxed.as_ref(), "test").unwrap();
        for ((b, t, h, dk, dv), ch, strong) in [
            ((2, 37, 2, 5, 3), 8, false),
            ((1, 1, 1, 4, 6), 8, false),
            ((1, 70, 1, 3, 8), 16, false),
            ((1, 65, 2, 7, 4), 64, false),
            ((1, 63, 1, 6, 5), 8, true),
        ] {
            let dims = [("B", b), ("T", t), ("H", h), ("Dk", dk), ("Dv", dv)].into_iter().collect();
            let mut x = boxed.random_inputs(&dims, 7).unwrap();
            if strong {
                wipe_and_gate(&mut x);
            }
            let dy = x["v"].mapv(|e| (3.0 * e + 0.2).sin());
            let s0 = boxed.random_state(&dims, 8).unwrap();
            let df: Tensors<f64> = s0.iter().map(|(k, v)| (k.clone(), v.mapv(|e| (1.7 * e).cos()))).collect();
            // From zero (the plain backward), and from a state with and without a cotangent of the
            // final state, and a cotangent of the final state alone.
            for (with_s0, with_df) in [(false, false), (true, true), (true, false), (false, true)] {
                let (s0, df) = (with_s0.then_some(&s0), with_df.then_some(&df));
                let label = format!("{:?} chunk {ch} S_0: {with_s0}, S̄_T: {with_df}", (b, t, h, dk, dv));
                let (want, want_ds) = cpu_grads(boxed.as_ref(), &x, &dy, s0, df);
                let names = ["d_q", "d_k", "d_v", "d_g", "d_beta"];
                let mut got: Vec<ArrayD<f64>> =
                    names.iter().map(|k| ArrayD::zeros(want[*k].raw_dim())).collect();
                let mut ds = ArrayD::<f64>::zeros(IxDyn(&[b, h, dv, dk]));
                for bi in 0..b {
                    for hi in 0..h {
                        let seq =
                            |a: &ArrayD<f64>| a.index_axis(Axis(0), bi).index_axis(Axis(1), hi).to_owned();
                        let m2 = |a: &ArrayD<f64>| seq(a).into_dimensionality::<ndarray::Ix2>().unwrap();
                        let v1 = |a: &ArrayD<f64>| seq(a).iter().copied().collect::<Vec<_>>();
                        // A state's head `[Dv, Dk]`, transposed (`Dk × Dv`), or zeros.
                        let head_t = |st: Option<&Tensors<f64>>| {
                            st.map_or_else(
                                || Array2::zeros((dk, dv)),
                                |st| st[STATE].slice(s![bi, hi, .., ..]).t().to_owned(),
                            )
                        };
                        let hd = HeadIn {
                            q: m2(&x["q"]),
                            k: m2(&x["k"]),
                            v: m2(&x["v"]),
                            dy: m2(&dy),
                            g: v1(&x["g"]),
                            beta: v1(&x["beta"]),
                        };
                        let (r, x0) = recipe(&hd, ll.scale, ch, head_t(s0), head_t(df));
                        for (o, a) in got.iter_mut().zip(&r) {
                            let mut dst = o.index_axis_mut(Axis(0), bi);
                            let mut dst = dst.index_axis_mut(Axis(1), hi);
                            for (d, e) in dst.iter_mut().zip(a.iter()) {
                                *d = *e;
                            }
                        }
                        ds.slice_mut(s![bi, hi, .., ..]).assign(&x0.t());
                    }
                }
                let err = |a: &ArrayD<f64>, w: &ArrayD<f64>| {
                    (a - w).mapv(|e| e * e).sum().sqrt() / w.mapv(|e| e * e).sum().sqrt().max(1.0)
                };
                for (k, a) in names.iter().zip(&got) {
                    let e = err(a, &want[*k]);
                    assert!(e < 1e-10, "{label} {k}: error {e:.3e}");
                }
                if with_s0 {
                    let e = err(&ds, &want_ds[STATE]);
                    assert!(e < 1e-10, "{label} S̄_0: error {e:.3e}");
                }
            }
        }
    }
}
