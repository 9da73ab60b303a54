//! Gated DeltaNet and its Fenwick lift in the chunked form (`run_delta`,
//! `kernels/loglinear_delta.cu`), parallel over chunks except one pass:
//! 1. `llc_wy` (per chunk): the WY/UT pieces `W = T⁻¹ diag(β e^γ) K`, `U = T⁻¹ diag(β) V` and, for
//!    the lift, `T⁻¹`;
//! 2. the sequential pass over chunks: without a lift the state entering each chunk and the new
//!    values `U' = U − W S`; with it, every chunk-level state entering each chunk ([`Pass`]). The
//!    lift with f32 data takes the transition form (`kernels/loglinear_lift.cu`): `llc_lift_ab`
//!    forms each chunk's map `M_j = −K̂ᵀ W`, `B_j = K̂ᵀ U` in parallel, and `llc_lift_h` does one
//!    product `M_j S` per non-empty level and chunk;
//! 3. the outputs: the chunk-tree outputs with `v = U'` and the entering states, or the lift's
//!    `llc_out_dl`.
//!
//! In the tf32 and bf16 modes every product runs on tensor cores (tf32 `mma.sync`, f32
//! accumulation). The pass keeps its states in shared memory (`llc_delta_h_tc`, eight warps share
//! each chunk's products), or without a lift and with many batch·heads in registers
//! (`llc_delta_h_rg`: each warp owns 16 value columns for all keys, no barrier inside a chunk).

use cudarc::driver::LaunchConfig;
use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::{Precision, Result};

use super::FAMILY;
use super::chunk_tree::{
    bf16_qkv, check_sizes, chunk_len, fixed_dims, kernel_ints, out_direct, outputs, tensor_cores,
};
use super::chunked::{ChunkedInputs, view_or_zero};
use crate::forms::{input, input_opt};
use crate::kernels;
use crate::pool;
use crate::pool::Pooled;
use crate::runtime::{GpuReal, err, gpu, int, launch, max_dynamic_smem, opt_in};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors, bf16};

/// Dynamic shared memory of `llc_delta_h` (the layout in the kernel): `levels` state tiles, two
/// buffers of the chunk's `W`, `K` (rows padded to `Dk + 4` in f32 when `Dk` is a multiple of 4,
/// for 16-byte copies, else to `Dk + 1`), `U` and `g`, the new values and the decays.
pub(crate) fn delta_h_smem<F: GpuReal>(dk: usize, levels: usize) -> usize {
    let ch = chunk_len::<F>();
    let size = std::mem::size_of::<F>();
    let ldw = if size == 4 && dk.is_multiple_of(4) { dk + 4 } else { dk + 1 };
    (levels * dk * 16 + 4 * ch * ldw + 2 * ch * 16 + 2 * ch + ch * 17 + ch) * size
}

/// The tensor-core passes' key dims (`llc_delta_h_tc`, `llc_lift_h`): `DKP` = `Dk` rounded up to
/// 16 (whole k-steps), and `LDK` = `DKP` rounded up to 32, plus 4, the row length in floats of
/// their `W`, `K` and `M_j` tiles (≡ 4 mod 32, so that fragment loads hit 32 distinct banks).
fn tc_key_dims(dk: usize) -> (usize, usize) {
    let dkp = dk.div_ceil(16) * 16;
    (dkp, dkp.div_ceil(32) * 32 + 4)
}

/// Dynamic shared memory of `llc_delta_h_tc` (f32; the layout in the kernel) with `stages`
/// buffers and levels taken `group` at a time: `levels` state tiles of `DKP × 24` (`DKP` = `Dk`
/// rounded up to 16), per buffer the chunk's `W` and `K` (rows padded to `LDK ≡ 4 (mod 32)`) and
/// `U`; the new values `[64][24]` of each level of a group and two buffers of decays (`[2][65]`:
/// the decay warp fills chunk j + 1's during chunk j).
pub(crate) fn delta_h_tc_smem(dk: usize, levels: usize, stages: usize, group: usize) -> usize {
    let ch = 64;
    let (dkp, ldk) = tc_key_dims(dk);
    (levels * dkp * 24 + stages * (2 * ch * ldk + ch * 16) + group * ch * 24 + 2 * (ch + 1)) * 4
}

/// Dynamic shared memory of `llc_lift_h` (f32; the layout in the kernel) with `stages` buffers:
/// two copies of the states of levels `1 .. levels − 1` (`DKP × 24` each, `DKP` = `Dk` rounded up
/// to 16), per buffer the chunk's `M_j` (rows padded to `LDK ≡ 4 (mod 32)`), 16 columns of `B_j`
/// and `e^{a_j}`.
pub(crate) fn lift_h_smem(dk: usize, levels: usize, stages: usize) -> usize {
    let (dkp, ldk) = tc_key_dims(dk);
    (2 * levels.saturating_sub(1) * dkp * 24 + stages * (dkp * ldk + dkp * 16 + 1)) * 4
}

/// Most chunk levels `llc_lift_h` takes (`LIFT_EMAX` in the kernel: T ≤ 2²² tokens).
const LIFT_MAX_LEVELS: usize = 17;

/// Dynamic shared memory of `llc_lift_ab`: two `[64][68]` f32 tiles.
const LIFT_AB_SMEM: usize = 2 * 64 * 68 * 4;

/// Levels per group in the lift's two-product pass (`llc_delta_h_tc`'s `DH_LG`; the lift takes
/// that pass only where the transition form does not fit, or is not asked for), the first that
/// fits shared memory: a chunk's levels go through the two products a group at a time, with two barriers per
/// group and the W and K fragments loaded once per group. At T = 16k a chunk has five levels on
/// average (nine at most), at 1M eight (fifteen). Measured on the H200 (T = 16k, B·H = 16,
/// Dk = Dv = 64, loglinear-gated-deltanet tf32 through `mixers bench`): 2.81–2.82 / 2.77 /
/// 2.64–2.67 / 2.62 / 2.77–2.82 ms with groups of 1 / 3 / 4 / 5 / 8, 2.87–2.90 before groups; four
/// fits the H200's shared memory with three buffers up to T = 2¹⁹, with two beyond.
const LEVEL_GROUPS: [usize; 2] = [4, 1];

/// Largest `Dk` of `llc_delta_h_rg` (its state tile is `Dk/8 · 4` registers per lane).
const RG_MAX_DK: usize = 128;

/// Dynamic shared memory of `llc_delta_h_rg` (the layout in the kernel) with `warps` warps per
/// block and `stages` buffers: per buffer the chunk's `W` and `K` (`DKP` = `Dk` rounded up to
/// 16; rows padded to `≡ 8` and `≡ 4 (mod 32)` floats), `U` (the block's `16·warps` columns, rows
/// padded by 4) and log-decays.
pub(crate) fn delta_h_rg_smem(dk: usize, warps: usize, stages: usize) -> usize {
    let r = (dk.div_ceil(16) * 16).div_ceil(32) * 32;
    stages * 64 * ((r + 8) + (r + 4) + (16 * warps + 4) + 1) * 4
}

/// How gated DeltaNet's sequential pass runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Pass {
    /// `llc_delta_h_rg` (no lift, tensor cores, `Dk ≤ 128`): the state in registers, `warps`
    /// warps of 16 value columns per block, chunks loaded `stages − 1` ahead.
    Registers { warps: usize, stages: usize },
    /// `llc_delta_h_tc` (tensor cores): the states in shared memory, eight computing warps and a
    /// decay warp, chunks loaded `stages − 1` ahead, the lift's levels `group` at a time (1
    /// without a lift).
    Shared { stages: usize, group: usize },
    /// `llc_lift_h` (the lift with f32 data, tensor cores in the tf32 mode, FMA in the exact
    /// mode): one product `M_j S` per non-empty level and chunk, with the per-chunk maps formed
    /// beforehand by `llc_lift_ab`; chunks loaded `stages − 1` ahead.
    Transition { stages: usize },
    /// `llc_delta_h` (FMA; the exact mode, or where neither of the others fits).
    Fma,
}

impl Pass {
    /// The pass for `bh` batch·heads and these dims; `sms` multiprocessors, `limit` bytes of
    /// dynamic shared memory per block. Without a lift the state-in-registers kernel runs where
    /// the shared-memory kernel's blocks (one per batch·head and 16 value columns, one block per
    /// multiprocessor) would need more than one wave: each of its warps issues both products of
    /// every chunk alone, so with few warps it is slower (H200, T = 16k, Dk = Dv = 64, kernel
    /// alone: 0.80 ms against 0.68 at B·H = 16, 0.77 against 1.27 at B·H = 64). It takes four
    /// warps per block (fewer when Dv is narrower), whose warps share each chunk's loads, and
    /// three buffers where they fit, else two. With the lift the first group of levels that fits
    /// with three buffers or two: `group` when given, else (or when it does not fit) those of
    /// [`LEVEL_GROUPS`]. Before all of these, the lift with f32 data takes the transition form
    /// where `transition` allows it and its two copies of the states fit (with three buffers or
    /// two; up to T = 2²⁰ at `Dk` ≤ 64 on the H200, and T ≤ 2²² in any case), in either mode.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pick(
        tc: bool,
        lifted: bool,
        transition: bool,
        [bh, dk, dv]: [usize; 3],
        levels: usize,
        sms: usize,
        limit: usize,
        group: Option<usize>,
    ) -> Pass {
        if lifted
            && transition
            && levels <= LIFT_MAX_LEVELS
            && let Some(stages) = (2..=3).rev().find(|&s| lift_h_smem(dk, levels, s) <= limit)
        {
            return Pass::Transition { stages };
        }
        if !tc {
            return Pass::Fma;
        }
        if !lifted && dk <= RG_MAX_DK && bh * dv.div_ceil(16) > sms {
            let warps = dv.div_ceil(16).min(4);
            if let Some(stages) = (2..=3).rev().find(|&s| delta_h_rg_smem(dk, warps, s) <= limit) {
                return Pass::Registers { warps, stages };
            }
        }
        // Without a lift one level; with it the group asked for, then the defaults.
        let groups: &[usize] = if lifted { &LEVEL_GROUPS } else { &[1] };
        group
            .filter(|_| lifted)
            .into_iter()
            .chain(groups.iter().copied())
            .find_map(|group| {
                let stages = (2..=3).rev().find(|&s| delta_h_tc_smem(dk, levels, s, group) <= limit)?;
                Some(Pass::Shared { stages, group })
            })
            .unwrap_or(Pass::Fma)
    }
}

/// Dynamic shared memory of `llc_delta_h_rb` (bytes; the layout in the kernel) with `warps` warps
/// per block and `stages` buffers: per buffer the chunk's bf16 `W` and `K` (`Dk` rounded up to 16,
/// then to 32, plus 8 entries per row), `U` (the block's `16·warps` columns plus 8) and the f32
/// log-decays.
pub(crate) fn delta_h_rb_smem(dk: usize, warps: usize, stages: usize) -> usize {
    let ldw = (dk.div_ceil(16) * 16).div_ceil(32) * 32 + 8;
    stages * (64 * (2 * ldw + 16 * warps + 8) * 2 + 64 * 4)
}

/// A tuning variable's value: its text as a number that `ok` accepts, else none.
fn tuning_choice(over: Option<String>, ok: impl Fn(usize) -> bool) -> Option<usize> {
    over.and_then(|v| v.parse::<usize>().ok()).filter(|&v| ok(v))
}

/// Whether the lift may take the transition form (`llc_lift_h`): unless `MIXERS_DELTA_LIFT` is
/// `products`, which keeps the two-product passes, for comparisons.
fn transition_allowed(over: Option<String>) -> bool {
    over.as_deref() != Some("products")
}

/// The lift pass's levels per group asked for by `MIXERS_DELTA_LEVEL_GROUP` (1 to 16), for
/// tuning; anything else leaves the choice to [`Pass::pick`].
fn level_group_over() -> Option<usize> {
    parse_level_group(std::env::var("MIXERS_DELTA_LEVEL_GROUP").ok())
}

/// A level group from the variable's text: a number from 1 to 16, else none.
fn parse_level_group(over: Option<String>) -> Option<usize> {
    tuning_choice(over, |g| (1..=16).contains(&g))
}

/// Warps per block of `llc_delta_h_rb` (16 value columns each): two, or one where `Dv ≤ 16`
/// (H200, T = 16k, B·H = 16, Dk = Dv = 64, kernel alone: 0.350 / 0.347 / 0.435 ms with 1 / 2 / 4
/// warps). `MIXERS_DELTA_WARPS` (1, 2 or 4; the kernel's copies need a power of two) overrides it,
/// for tuning.
fn rb_warps(dv: usize, over: Option<String>) -> usize {
    tuning_choice(over, |w| [1, 2, 4].contains(&w)).unwrap_or(if dv <= 16 { 1 } else { 2 })
}

/// Dynamic shared memory of `llc_wy_tc` (`X`, `Lm`, `Tt`) and of `llc_out_dl_tc`: three
/// `[64][68]` f32 tiles each.
const TC_TILES_SMEM: usize = 3 * 64 * 68 * 4;

/// Dynamic shared memory of `llc_out_dl`: `Pt`, `At` `[CH][CH+1]`, `Qt` `[64][CH+1]`, two
/// `[16][65]` staging tiles.
fn out_dl_smem<F: GpuReal>() -> usize {
    let ch = chunk_len::<F>();
    (2 * ch * (ch + 1) + 64 * (ch + 1) + 2 * 16 * 65) * std::mem::size_of::<F>()
}

/// Chunk-level Fenwick levels of gated DeltaNet's lift for `t` tokens (1 without a lift).
pub(crate) fn delta_levels<F: GpuReal>(lifted: bool, t: usize) -> usize {
    if lifted { mixer_core::fenwick::bitlen(t.div_ceil(chunk_len::<F>()).max(1) - 1) + 1 } else { 1 }
}

/// `Σ_{j < n} popcount(j)`: the level states gated DeltaNet's lift writes for `n` chunks.
fn popsum(n: usize) -> usize {
    (0..n).map(|j| j.count_ones() as usize).sum()
}

/// Gated DeltaNet and its lift, parallel over chunks except one pass: `llc_wy` (per chunk, the
/// WY/UT pieces `W = T⁻¹ diag(β e^γ) K`, `U = T⁻¹ diag(β) V`, and for the lift `T⁻¹`), `llc_delta_h`
/// (the sequential pass, a block per (batch·head, 16 value columns): without a lift the state
/// entering each chunk and the new values `U' = U − W S`; with it, every chunk-level state entering
/// each chunk), then the outputs: pass 3 with `v = U'` and the entering states, or `llc_out_dl`.
pub(crate) fn run_delta<F: GpuReal>(
    ll: &LogLinear,
    x: &ChunkedInputs<'_, F>,
    p: Precision,
) -> Result<Pooled<F>> {
    let [b, t, h, dk, dv] = x.dims;
    let ch = chunk_len::<F>();
    let nc = t.div_ceil(ch);
    let bh = b * h;
    let lifted = ll.lift.is_some();
    let levels = delta_levels::<F>(lifted, t);
    let slots = if lifted { popsum(nc) } else { nc };
    check_sizes::<F>(x.dims, slots.max(1))?;
    let g = gpu()?;
    let dims = fixed_dims(dk, dv);
    let k = |name: &str| g.kernel(FAMILY, &kernels::LOGLINEAR_DELTA, &dims, &format!("{name}_{}", F::SUFFIX));
    let (gv, has_g) = x.g_view();
    let beta = x.beta.as_ref().ok_or_else(|| err(FAMILY, "gated DeltaNet needs `beta`"))?;
    let (ti, hi, dki, dvi, nci) = (
        int(FAMILY, "T", t)?,
        int(FAMILY, "H", h)?,
        int(FAMILY, "Dk", dk)?,
        int(FAMILY, "Dv", dv)?,
        int(FAMILY, "chunks", nc)?,
    );
    let mut w = pool::take::<F>(FAMILY, b * t * h * dk)?;
    let mut u = pool::take::<F>(FAMILY, b * t * h * dv)?;
    let mut tinv = pool::take::<F>(FAMILY, if lifted { bh * nc * ch * ch } else { 1 })?;
    let (kv, vv, bv) = (x.k.view(), x.v.view(), beta.view());
    let want_ti = lifted as i32;
    let tc = tensor_cores::<F>(p);
    let wy = k(if tc { "llc_wy_tc" } else { "llc_wy" })?;
    if tc {
        opt_in(FAMILY, &wy)?;
    }
    let cfg = LaunchConfig {
        grid_dim: (nc as u32, bh as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: if tc { TC_TILES_SMEM as u32 } else { 0 },
    };
    launch!(g, FAMILY, wy, cfg;
        &kv, &vv, &gv, &has_g, &bv, &mut *w, &mut *u, &mut *tinv, &want_ti, &ti, &hi, &dki, &dvi)?;
    let mut vn = pool::take::<F>(FAMILY, if lifted { 1 } else { b * t * h * dv })?;
    let mut hs = pool::take::<F>(FAMILY, bh * slots.max(1) * dk * dv)?;
    let transition = F::SUFFIX == "f32" && transition_allowed(std::env::var("MIXERS_DELTA_LIFT").ok());
    let pass = Pass::pick(
        tc,
        lifted,
        transition,
        [bh, dk, dv],
        levels,
        g.sms,
        max_dynamic_smem(),
        level_group_over(),
    );
    let (name, smem, threads, grid_y) = match pass {
        Pass::Transition { stages } => (
            if tc { "llc_lift_h_tc" } else { "llc_lift_h" },
            lift_h_smem(dk, levels, stages),
            256,
            dv.div_ceil(16),
        ),
        Pass::Registers { warps, stages } => {
            ("llc_delta_h_rg", delta_h_rg_smem(dk, warps, stages), 32 * warps, dv.div_ceil(16 * warps))
        }
        // Eight computing warps and the decay warp (LDT_THREADS).
        Pass::Shared { stages, group } => {
            ("llc_delta_h_tc", delta_h_tc_smem(dk, levels, stages, group), 288, dv.div_ceil(16))
        }
        Pass::Fma => ("llc_delta_h", delta_h_smem::<F>(dk, levels), 256, dv.div_ceil(16)),
    };
    let mut opts = dims.to_vec();
    match pass {
        Pass::Registers { warps, stages } => {
            opts.extend([format!("-DDHR_WARPS={warps}"), format!("-DDHR_ST={stages}")]);
        }
        Pass::Shared { group, .. } if group > 1 => opts.push(format!("-DDH_LG={group}")),
        _ => {}
    }
    // In the bf16 mode k holds bf16 values, exact in tf32: the tensor cores take their bits as they are.
    if matches!(pass, Pass::Registers { .. } | Pass::Shared { .. }) && p == Precision::Bf16 {
        opts.push("-DDH_K_TF32=1".to_string());
    }
    let source = if matches!(pass, Pass::Transition { .. }) {
        &kernels::LOGLINEAR_LIFT
    } else {
        &kernels::LOGLINEAR_DELTA
    };
    let f = g.kernel(FAMILY, source, &opts, &format!("{name}_{}", F::SUFFIX))?;
    opt_in(FAMILY, &f)?;
    let cfg = LaunchConfig {
        grid_dim: (bh as u32, grid_y as u32, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let (lifted_i, levels_i, slots_i) = (lifted as i32, levels as i32, slots as i64);
    match pass {
        Pass::Registers { .. } => {
            launch!(g, FAMILY, f, cfg; &kv, &gv, &has_g, &*w, &*u, &mut *vn, &mut *hs, &ti, &hi, &dki, &dvi, &nci)?
        }
        Pass::Shared { stages, .. } => {
            let st = stages as i32;
            launch!(g, FAMILY, f, cfg; &kv, &gv, &has_g, &*w, &*u, &mut *vn, &mut *hs, &ti, &hi, &dki, &dvi, &nci,
                &lifted_i, &levels_i, &slots_i, &st)?
        }
        Pass::Transition { stages } => {
            // The per-chunk maps M_j, B_j (padded to whole 16-column pieces) and e^{a_j} first.
            let (dkp, dvp) = (tc_key_dims(dk).0, dv.div_ceil(16) * 16);
            let mut mg = pool::take::<F>(FAMILY, bh * nc * dkp * dkp)?;
            let mut bg = pool::take::<F>(FAMILY, bh * nc * dkp * dvp)?;
            let mut eg = pool::take::<F>(FAMILY, bh * nc)?;
            let ab_name = format!("{}_{}", if tc { "llc_lift_ab_tc" } else { "llc_lift_ab" }, F::SUFFIX);
            let ab = g.kernel(FAMILY, &kernels::LOGLINEAR_LIFT, &dims, &ab_name)?;
            let ab_cfg = LaunchConfig {
                grid_dim: (nc as u32, bh as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: LIFT_AB_SMEM as u32,
            };
            launch!(g, FAMILY, ab, ab_cfg; &kv, &gv, &has_g, &*w, &*u, &mut *mg, &mut *bg, &mut *eg,
                &ti, &hi, &dki, &dvi, &nci)?;
            let st = stages as i32;
            launch!(g, FAMILY, f, cfg; &*mg, &*bg, &*eg, &mut *hs, &dki, &dvi, &nci, &levels_i, &slots_i, &st)?
        }
        Pass::Fma => {
            launch!(g, FAMILY, f, cfg; &kv, &gv, &has_g, &*w, &*u, &mut *vn, &mut *hs, &ti, &hi, &dki, &dvi,
            &nci, &lifted_i, &levels_i, &slots_i)?
        }
    }
    drop(u);
    let mut y = pool::take::<F>(FAMILY, b * t * h * dv)?;
    if !lifted {
        drop((w, tinv));
        let decays = pool::zeros::<f64>(FAMILY, 1)?;
        outputs(ll, x, &vn.slice(0..vn.len()), &hs, &decays, 1, false, true, p, &mut y)?;
        return Ok(y);
    }
    let (lam, n_levels) = x.lam.as_ref().ok_or_else(|| err(FAMILY, "the lift needs `lambda`"))?;
    let f = k(if tc { "llc_out_dl_tc" } else { "llc_out_dl" })?;
    opt_in(FAMILY, &f)?;
    let cfg = LaunchConfig {
        grid_dim: (nc as u32, bh as u32, dv.div_ceil(64) as u32),
        block_dim: (256, 1, 1),
        shared_mem_bytes: if tc { TC_TILES_SMEM } else { out_dl_smem::<F>() } as u32,
    };
    let (qv, lv, li) = (x.q.view(), lam.view(), int(FAMILY, "L", *n_levels)?);
    let scale = ll.scale;
    launch!(g, FAMILY, f, cfg; &qv, &kv, &vv, &gv, &has_g, &bv, &lv, &*w, &*tinv, &*hs, &mut *y,
        &ti, &hi, &dki, &dvi, &li, &nci, &slots_i, &scale)?;
    Ok(y)
}

/// The bf16 mode of gated DeltaNet without a lift, with bf16 `q`, `k`, `v`, `Dk ≤ 64` and `Dk`, `Dv`
/// multiples of 8: every pass on bf16 operands, as flash-linear-attention's bf16 kernels do.
/// `llc_wy_tc_bf16` reads `k`, `v` as stored and writes `W`, `U` rounded to bf16;
/// `llc_delta_h_rb_bf16` (the state in registers, f32 accumulation, bf16 `m16n8k16` mma) writes
/// the entering states (f32) and the new values (bf16); `llc_out_direct_tc_bf16` writes a bf16
/// `y`. The state and the new values are rounded to bf16 where they enter a product, so this mode
/// is less exact than tf32 (about 10⁻³ relative against the f64 oracle). `None` where it does not
/// apply: the caller then takes the f32 path with tf32 products.
pub(crate) fn run_bf16(ll: &LogLinear, x: &DeviceTensors) -> Result<Option<AnyDeviceTensor>> {
    if ll.lift.is_some() || ll.base != Base::GatedDeltaNet {
        return Ok(None);
    }
    let Some(([q, k, v], [b, t, h, dk, dv])) = bf16_qkv(x) else {
        return Ok(None);
    };
    // 16-byte rows and row starts for the cp.async copies (whole multiples of 8 bf16).
    let aligned = [q, k, v].iter().all(|a| a.identity().1 % 8 == 0);
    if dk > 64 || dk % 8 != 0 || dv % 8 != 0 || !aligned || b * t * h * dk * dv == 0 {
        return Ok(None);
    }
    // Two warps of 16 value columns per block (one when Dv is narrower); three buffers where they fit
    // (decided before any launch, so that a fallback wastes no work).
    let warps = rb_warps(dv, std::env::var("MIXERS_DELTA_WARPS").ok());
    let limit = max_dynamic_smem();
    let Some(stages) = (2..=3).rev().find(|&s| delta_h_rb_smem(dk, warps, s) <= limit) else {
        return Ok(None);
    };
    let gt = input_opt::<f32>(x, "g")?;
    let beta = input::<f32>(x, "beta")?;
    let zero = pool::zeros::<f32>(FAMILY, 1)?;
    let (gv, has_g) = view_or_zero(gt.as_deref(), &zero);
    let nc = t.div_ceil(64);
    let bh = b * h;
    check_sizes::<f32>([b, t, h, dk, dv], nc)?;
    let gpu = gpu()?;
    let dims = fixed_dims(dk, dv);
    // The bf16 kernels are compiled apart from the f32 ones (`-DDH_BF16=1`), only when this mode runs.
    let mut opts = dims.to_vec();
    opts.push("-DDH_BF16=1".to_string());
    let ints = kernel_ints([t, h, dk, dv, nc, bh])?;
    let [ti, hi, dki, dvi, nci, _] = ints;
    let (qv, kv, vv, bv) = (q.view(), k.view(), v.view(), beta.view());
    let mut w = pool::take::<bf16>(FAMILY, b * t * h * dk)?;
    let mut u = pool::take::<bf16>(FAMILY, b * t * h * dv)?;
    let mut tinv = pool::take::<f32>(FAMILY, 1)?;
    let wy = gpu.kernel(FAMILY, &kernels::LOGLINEAR_DELTA, &opts, "llc_wy_tc_bf16")?;
    opt_in(FAMILY, &wy)?;
    let cfg = LaunchConfig {
        grid_dim: (nc as u32, bh as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: TC_TILES_SMEM as u32,
    };
    let no_ti = 0i32;
    launch!(gpu, FAMILY, wy, cfg;
        &kv, &vv, &gv, &has_g, &bv, &mut *w, &mut *u, &mut *tinv, &no_ti, &ti, &hi, &dki, &dvi)?;
    opts.extend([format!("-DDHR_WARPS={warps}"), format!("-DDHR_ST={stages}")]);
    let f = gpu.kernel(FAMILY, &kernels::LOGLINEAR_DELTA, &opts, "llc_delta_h_rb_bf16")?;
    opt_in(FAMILY, &f)?;
    let cfg = LaunchConfig {
        grid_dim: (bh as u32, dv.div_ceil(16 * warps) as u32, 1),
        block_dim: (32 * warps as u32, 1, 1),
        shared_mem_bytes: delta_h_rb_smem(dk, warps, stages) as u32,
    };
    let mut vn = pool::take::<bf16>(FAMILY, b * t * h * dv)?;
    let mut hs = pool::take::<f32>(FAMILY, bh * nc * dk * dv)?;
    launch!(gpu, FAMILY, f, cfg; &kv, &gv, &has_g, &*w, &*u, &mut *vn, &mut *hs, &ti, &hi, &dki, &dvi, &nci)?;
    drop((w, u, tinv));
    let mut y = pool::take::<bf16>(FAMILY, b * t * h * dv)?;
    let f = gpu.kernel(FAMILY, &kernels::LOGLINEAR_CHUNKED, &dims, "llc_out_direct_tc_bf16")?;
    let vnv = vn.slice(0..vn.len());
    out_direct(ll, f, [nc, dv], ints, [&qv, &kv, &vnv], (&gv, has_g), &hs, &mut y)?;
    Ok(Some(AnyDeviceTensor::Bf16(DeviceTensor::from_pooled(y, &[b, t, h, dv])?)))
}

#[cfg(test)]
mod tests {
    use super::{
        Pass, delta_h_rb_smem, delta_h_rg_smem, delta_h_smem, lift_h_smem, parse_level_group, rb_warps,
        transition_allowed,
    };

    const H200: (usize, usize) = (132, 219 << 10);

    #[test]
    fn the_pass_follows_mode_lift_and_size() {
        let (sms, limit) = H200;
        // The exact mode runs FMA whatever fits.
        assert_eq!(Pass::pick(false, false, false, [16, 64, 64], 1, sms, limit, None), Pass::Fma);
        // B·H = 16 or 32, Dv = 64: the shared-memory kernel's 64 or 128 blocks fit in one wave.
        assert_eq!(
            Pass::pick(true, false, false, [16, 64, 64], 1, sms, limit, None),
            Pass::Shared { stages: 3, group: 1 }
        );
        assert_eq!(
            Pass::pick(true, false, false, [32, 64, 64], 1, sms, limit, None),
            Pass::Shared { stages: 3, group: 1 }
        );
        // B·H = 64: 256 blocks would take two waves; four warps of 16 value columns per block.
        assert_eq!(
            Pass::pick(true, false, false, [64, 64, 64], 1, sms, limit, None),
            Pass::Registers { warps: 4, stages: 3 }
        );
        // Dv = 20: two warps cover it.
        assert_eq!(
            Pass::pick(true, false, false, [512, 64, 20], 1, sms, limit, None),
            Pass::Registers { warps: 2, stages: 3 }
        );
        // Dk = 70 (padded to 80) still takes three buffers; Dk = 128 only two.
        assert_eq!(
            Pass::pick(true, false, false, [512, 70, 70], 1, sms, limit, None),
            Pass::Registers { warps: 4, stages: 3 }
        );
        assert_eq!(
            Pass::pick(true, false, false, [512, 128, 128], 1, sms, limit, None),
            Pass::Registers { warps: 4, stages: 2 }
        );
        // The lift keeps the states in shared memory. At T = 16k (nine levels) groups of four
        // levels fit with three buffers, at T = 1M (fifteen levels) with two; a group asked for
        // is taken where it fits.
        assert_eq!(
            Pass::pick(true, true, false, [16, 64, 64], 9, sms, limit, None),
            Pass::Shared { stages: 3, group: 4 }
        );
        assert_eq!(
            Pass::pick(true, true, false, [16, 64, 64], 15, sms, limit, None),
            Pass::Shared { stages: 2, group: 4 }
        );
        assert_eq!(
            Pass::pick(true, true, false, [16, 64, 64], 9, sms, limit, Some(8)),
            Pass::Shared { stages: 3, group: 8 }
        );
        assert_eq!(
            Pass::pick(true, true, false, [16, 64, 64], 15, sms, limit, Some(1)),
            Pass::Shared { stages: 3, group: 1 }
        );
        // A group asked for that does not fit gives way to the defaults.
        assert_eq!(
            Pass::pick(true, true, false, [16, 64, 64], 15, sms, limit, Some(16)),
            Pass::Shared { stages: 2, group: 4 }
        );
        // Less shared memory: one level at a time where a group of four does not fit.
        assert_eq!(
            Pass::pick(true, true, false, [16, 64, 64], 15, sms, 190 << 10, None),
            Pass::Shared { stages: 2, group: 1 }
        );
        // So does Dk above 128.
        assert!(matches!(
            Pass::pick(true, false, false, [512, 129, 64], 1, sms, limit, None),
            Pass::Shared { .. }
        ));
        // Nothing fits in 48 KiB.
        assert_eq!(Pass::pick(true, false, false, [512, 64, 64], 1, sms, 48 << 10, None), Pass::Fma);
    }

    #[test]
    fn lift_with_f32_data_takes_the_transition_form_where_it_fits() {
        let (sms, limit) = H200;
        // T = 16k (nine levels): three buffers; T = 1M (fifteen): two; in both modes.
        for tc in [true, false] {
            assert_eq!(
                Pass::pick(tc, true, true, [16, 64, 64], 9, sms, limit, None),
                Pass::Transition { stages: 3 }
            );
            assert_eq!(
                Pass::pick(tc, true, true, [16, 64, 64], 15, sms, limit, None),
                Pass::Transition { stages: 2 }
            );
        }
        // T = 2M (sixteen levels) does not fit: the two-product passes take it.
        assert_eq!(
            Pass::pick(true, true, true, [16, 64, 64], 16, sms, limit, None),
            Pass::Shared { stages: 2, group: 4 }
        );
        assert_eq!(Pass::pick(false, true, true, [16, 64, 64], 16, sms, limit, None), Pass::Fma);
        // Not asked for (f64 data, or MIXERS_DELTA_LIFT=products), or without a lift: as before.
        assert_eq!(
            Pass::pick(true, true, false, [16, 64, 64], 9, sms, limit, None),
            Pass::Shared { stages: 3, group: 4 }
        );
        assert_eq!(
            Pass::pick(true, false, true, [16, 64, 64], 1, sms, limit, None),
            Pass::Shared { stages: 3, group: 1 }
        );
        // Dk = 128: M_j alone is 66 KiB a buffer; two levels' states still fit.
        assert_eq!(
            Pass::pick(true, true, true, [16, 128, 128], 3, sms, limit, None),
            Pass::Transition { stages: 2 }
        );
        // Dk = 16 fits eighteen levels (T = 2²³) but the pass takes seventeen at most.
        assert_eq!(
            Pass::pick(true, true, true, [16, 16, 16], 17, sms, limit, None),
            Pass::Transition { stages: 3 }
        );
        assert!(matches!(
            Pass::pick(true, true, true, [16, 16, 16], 18, sms, limit, None),
            Pass::Shared { .. }
        ));
        assert!(transition_allowed(None));
        assert!(transition_allowed(Some("transition".into())));
        assert!(!transition_allowed(Some("products".into())));
    }

    #[test]
    fn transition_pass_smem_is_two_copies_of_the_states_and_its_buffers() {
        // Dk = 64, nine levels: 2 · 8 state tiles of 64 × 24, per buffer M_j [64][68], B_j [64][16], e^{a_j}.
        assert_eq!(lift_h_smem(64, 9, 3), (2 * 8 * 64 * 24 + 3 * (64 * 68 + 64 * 16 + 1)) * 4);
        // Dk = 40 (padded to 48, rows of M_j to 68); one level (one chunk): no states.
        assert_eq!(lift_h_smem(40, 1, 2), 2 * (48 * 68 + 48 * 16 + 1) * 4);
    }

    #[test]
    fn level_group_asked_for_is_taken_from_1_to_16_only() {
        assert_eq!(parse_level_group(None), None);
        assert_eq!(parse_level_group(Some("4".into())), Some(4));
        assert_eq!(parse_level_group(Some("16".into())), Some(16));
        assert_eq!(parse_level_group(Some("0".into())), None);
        assert_eq!(parse_level_group(Some("17".into())), None);
        assert_eq!(parse_level_group(Some("all".into())), None);
    }

    #[test]
    fn bf16_pass_takes_two_warps_or_a_power_of_two_asked_for() {
        assert_eq!(rb_warps(64, None), 2);
        assert_eq!(rb_warps(24, None), 2);
        assert_eq!(rb_warps(16, None), 1);
        assert_eq!(rb_warps(64, Some("4".into())), 4);
        // Three warps' copies do not divide a chunk's rows: refused, as is anything unparsable.
        assert_eq!(rb_warps(64, Some("3".into())), 2);
        assert_eq!(rb_warps(64, Some("many".into())), 2);
        // Dk = 64: W and K rows of 72 bf16, U rows of 16·warps + 8, 64 f32 log-decays.
        assert_eq!(delta_h_rb_smem(64, 2, 3), 3 * (64 * (2 * 72 + 40) * 2 + 256));
        // Dk = 40 is copied as 64 columns (whole ldmatrix groups).
        assert_eq!(delta_h_rb_smem(40, 1, 2), 2 * (64 * (2 * 72 + 24) * 2 + 256));
    }

    #[test]
    fn register_pass_smem_is_its_buffers() {
        // Dk = 64: W rows of 72 floats, K rows of 68, U rows of 16·warps + 4, 64 log-decays.
        assert_eq!(delta_h_rg_smem(64, 1, 3), 3 * 64 * (72 + 68 + 20 + 1) * 4);
        // Dk = 70 is padded to 80 columns, rows to 96 + 8 and 96 + 4.
        assert_eq!(delta_h_rg_smem(70, 2, 2), 2 * 64 * (104 + 100 + 36 + 1) * 4);
    }

    #[test]
    fn fma_pass_smem_pads_f32_rows_for_16_byte_copies_only() {
        // States, two buffers of W and K rows, two of U (16 columns) and of g, Un [64][17], decays.
        let rest = |ch: usize| 2 * ch * 16 + 2 * ch + ch * 17 + ch;
        // f32, Dk = 64: rows of 68 floats (whole 16-byte pieces).
        assert_eq!(delta_h_smem::<f32>(64, 1), (64 * 16 + 4 * 64 * 68 + rest(64)) * 4);
        // f32, Dk = 70 (not a multiple of four) and f64: rows of Dk + 1, as 4- and 8-byte copies need.
        assert_eq!(delta_h_smem::<f32>(70, 3), (3 * 70 * 16 + 4 * 64 * 71 + rest(64)) * 4);
        let ch = super::chunk_len::<f64>();
        assert_eq!(delta_h_smem::<f64>(64, 1), (64 * 16 + 4 * ch * 65 + rest(ch)) * 8);
    }
}
