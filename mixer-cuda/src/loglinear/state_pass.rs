//! Gated DeltaNet's sequential state pass over chunks (`kernels/loglinear_state_pass.cu`): the
//! one step of its chunked form that is not parallel over chunks. Per chunk `j`, with
//! `K̂_s = e^(a_j − γ_s) k_s`:
//! - without a lift the pass writes the state `S` entering the chunk and the new values
//!   `U' = U − W S`, then moves on: `S ← e^(a_j) S + K̂ᵀ U'`;
//! - with the lift it keeps the chunk-level Fenwick states `S^(e)`: it merges levels `0..m` into
//!   `m + 1` (`m = ctz j`), writes every non-empty level entering the chunk, takes each through
//!   the chunk, `S ← e^(a_j) S − K̂ᵀ (W S)`, and inserts the chunk's own state `K̂ᵀ U` at level 0.
//!   Level 0 is empty whenever a chunk starts, so every non-empty level goes through one map,
//!   `S ← e^(a_j) S + M_j S` with `M_j = −K̂ᵀ W`: the transition form forms `M_j` and
//!   `B_j = K̂ᵀ U` for every chunk in parallel first (`llc_lift_ab`) and does one product per
//!   level and chunk (`llc_lift_h`).
//!
//! Without a lift every variant may start from an initial state and write the final state (a run
//! from a state, docs/math.md §7): the state entering chunk 0 is then `H_0 = S_0ᵀ` instead of
//! zero, and the state after the last chunk, taken through that chunk's tokens only, is
//! `H_T = S_Tᵀ` (`S [B, H, Dv, Dk]`, `H = Sᵀ` per head, f32 or f64 as the states the pass keeps,
//! f32 in the bf16 pass too). So a run from a state takes the pass the rule gives without one.
//!
//! The pass has several kernels; [`select`] is the one rule that picks one, from the shapes, the
//! precision mode, the storage of the activations and the device's shared memory, and [`launches`]
//! says how it is launched. The rule, in order:
//! 1. the bf16 mode with bf16 `q`, `k`, `v` (rows 16-byte aligned), no lift, `Dk ≤ 128` (and the
//!    bf16 output kernel's tiles within the device's shared memory), `Dk` and `Dv` multiples of
//!    8: `llc_delta_h_rb` ([`StatePass::Bf16Registers`]: bf16 operands, the state in registers,
//!    two warps of 16 value columns, one where `Dv ≤ 16`), with three buffers or two where they
//!    fit;
//! 2. where the FMA pass's states and buffers do not fit in shared memory (on the H200 in f32 without
//!    the lift `Dk` above about 190: 188 fits, 192 does not): in the tf32 and bf16 modes rule 6's
//!    pass where it fits (the lift at `Dk = 128` up to T = 2¹⁶), else the whole form in one block
//!    per head ([`StatePass::Sequential`], `loglinear_sequential.cu`);
//! 3. the lift with f32 data, at most [`LIFT_MAX_LEVELS`] chunk levels, its two copies of the
//!    states fitting with three buffers or two: the transition form ([`StatePass::Transition`];
//!    tensor cores in the tf32 and bf16 modes, FMA in the exact mode);
//! 4. the exact mode (or f64): `llc_delta_h` ([`StatePass::Fma`]);
//! 5. without a lift, `Dk ≤ 128`, when the shared-memory kernel's blocks (one per batch·head and
//!    16 value columns) would need more than one wave (`B·H·⌈Dv/16⌉` above the multiprocessor
//!    count): `llc_delta_h_rg` ([`StatePass::Registers`], four warps, fewer when `Dv` is narrower,
//!    three buffers or two);
//! 6. `llc_delta_h_tc` ([`StatePass::Shared`]) with the first level group of [`LEVEL_GROUPS`]
//!    (one level without a lift) that fits with three buffers or two, else with the lift the first
//!    that fits with one (`Dk = 128` past T = 2048, where the transition form does not fit);
//! 7. else `llc_delta_h`.

use cudarc::driver::CudaView;
use mixer_core::fenwick::bitlen;
use mixer_core::{Precision, Result};
use serde::Serialize;

use super::common::{
    ChunkTable, Device, Elem, FAMILY, Launch, Shape, Step, Storage, fixed_dims, kernel_ints, tensor_cores,
    unexpected,
};
use super::output;
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{gpu, launch};
use crate::tensor::DeviceScalar;

/// Dynamic shared memory of `llc_delta_h` (the layout in the kernel): `levels` state tiles, two
/// buffers of the chunk's `W`, `K` (rows padded to `Dk + 4` in f32 when `Dk` is a multiple of 4,
/// for 16-byte copies, else to `Dk + 1`), `U` and `g`, the new values and the decays.
pub(crate) fn delta_h_smem(elem: Elem, dk: usize, levels: usize) -> usize {
    let ch = elem.chunk();
    let size = elem.bytes();
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
pub const LIFT_MAX_LEVELS: usize = 17;

/// Dynamic shared memory of `llc_lift_ab`: two `[64][68]` f32 tiles.
const LIFT_AB_SMEM: usize = 2 * 64 * 68 * 4;

/// Levels per group in the lift's two-product pass (`llc_delta_h_tc`'s `DH_LG`; the lift takes
/// that pass only where the transition form does not fit), the first that fits shared memory: a
/// chunk's levels go through the two products a group at a time, with two barriers per group and
/// the W and K fragments loaded once per group. At T = 16k a chunk has five levels on average
/// (nine at most), at 1M eight (fifteen). Measured on the H200 (T = 16k, B·H = 16,
/// Dk = Dv = 64, loglinear-gated-deltanet tf32 through `mixers bench`): 2.81–2.82 / 2.77 /
/// 2.64–2.67 / 2.62 / 2.77–2.82 ms with groups of 1 / 3 / 4 / 5 / 8, 2.87–2.90 before groups; four
/// fits the H200's shared memory with three buffers up to T = 2¹⁹, with two beyond.
pub const LEVEL_GROUPS: [usize; 2] = [4, 1];

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

/// Dynamic shared memory of `llc_delta_h_rb` (bytes; the layout in the kernel) with `warps` warps
/// per block and `stages` buffers: per buffer the chunk's bf16 `W` and `K` (`Dk` rounded up to 16,
/// then to a power of two of at least 32, plus 8 entries per row), `U` (the block's `16·warps`
/// columns plus 8) and the f32 log-decays.
pub(crate) fn delta_h_rb_smem(dk: usize, warps: usize, stages: usize) -> usize {
    let ldw = (dk.div_ceil(16) * 16).max(32).next_power_of_two() + 8;
    stages * (64 * (2 * ldw + 16 * warps + 8) * 2 + 64 * 4)
}

/// Warps per block of `llc_delta_h_rb` (16 value columns each): two, or one where `Dv ≤ 16`
/// (H200, T = 16k, B·H = 16, Dk = Dv = 64, kernel alone: 0.350 / 0.347 / 0.435 ms with 1 / 2 / 4
/// warps).
fn rb_warps(dv: usize) -> usize {
    if dv <= 16 { 1 } else { 2 }
}

/// Chunk-level Fenwick levels of gated DeltaNet's lift for `t` tokens in chunks of `elem`'s
/// length (1 without a lift).
pub(crate) fn levels(elem: Elem, lifted: bool, t: usize) -> usize {
    if lifted { bitlen(t.div_ceil(elem.chunk()).max(1) - 1) + 1 } else { 1 }
}

/// The state slots the pass writes per batch·head for `nc` chunks: one per chunk without a lift;
/// with it `Σ_{j < nc} popcount(j)`, the level states entering the chunks.
pub(crate) fn slots(lifted: bool, nc: usize) -> usize {
    if lifted { (0..nc).map(|j| j.count_ones() as usize).sum() } else { nc }
}

/// How gated DeltaNet's sequential pass runs ([`select`]'s choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatePass {
    /// `llc_delta_h_rb_bf16` (the bf16 mode with bf16 activations, no lift): the state in
    /// registers on bf16 operands, `warps` warps of 16 value columns per block, chunks loaded
    /// `stages − 1` ahead; the WY/UT step and the outputs read and write bf16 too.
    Bf16Registers {
        /// Warps per block.
        warps: usize,
        /// Input buffers.
        stages: usize,
    },
    /// `llc_delta_h_rg` (no lift, tensor cores, `Dk ≤ 128`): the state in registers, `warps`
    /// warps of 16 value columns per block, chunks loaded `stages − 1` ahead.
    Registers {
        /// Warps per block.
        warps: usize,
        /// Input buffers.
        stages: usize,
    },
    /// `llc_delta_h_tc` (tensor cores): the states in shared memory, eight computing warps and a
    /// decay warp, chunks loaded `stages − 1` ahead, the lift's levels `group` at a time (1
    /// without a lift).
    Shared {
        /// Input buffers.
        stages: usize,
        /// Levels per group.
        group: usize,
    },
    /// `llc_lift_h` (the lift with f32 data, tensor cores in the tf32 and bf16 modes, FMA in the
    /// exact mode): one product `M_j S` per non-empty level and chunk, with the per-chunk maps
    /// formed beforehand by `llc_lift_ab`; chunks loaded `stages − 1` ahead.
    Transition {
        /// Input buffers.
        stages: usize,
    },
    /// `llc_delta_h` (FMA; the exact mode, or where none of the others fits).
    Fma,
    /// No pass of its own: the whole chunked form in one block per (batch, head)
    /// (`ll_chunked`, `loglinear_sequential.cu`), where the FMA pass does not fit.
    Sequential,
}

impl StatePass {
    /// Whether the pass keeps the state in registers (`llc_delta_h_rg`, `llc_delta_h_rb`): the
    /// passes that take a packed batch's chunk table.
    pub(crate) fn in_registers(self) -> bool {
        matches!(self, StatePass::Registers { .. } | StatePass::Bf16Registers { .. })
    }
}

/// Three buffers where `fits` allows them, else two, else none.
fn stages(fits: impl Fn(usize) -> bool) -> Option<usize> {
    (2..=3).rev().find(|&s| fits(s))
}

/// `llc_delta_h_tc` ([`StatePass::Shared`]): the first level group of `groups` that fits with
/// three buffers or two ([`stages`]); else, with the lift, the first that fits with one. The lift's
/// chunks end with a barrier, so with one buffer chunk `j`'s tiles are loaded at the chunk's start,
/// not overlapped with the products; its level states grow with `T` (at `Dk = 128` on 219 KiB two
/// buffers fit up to T = 2048, one up to T = 2¹⁵ with groups of four levels and up to 2¹⁶ with
/// one). Without the lift the pass prefetches after the chunk's first barrier and needs two.
fn shared_pass(lifted: bool, groups: &[usize], fits: impl Fn(usize, usize) -> bool) -> Option<StatePass> {
    let with = |group: usize| stages(|st| fits(st, group)).map(|stages| StatePass::Shared { stages, group });
    groups.iter().find_map(|&g| with(g)).or_else(|| {
        let one =
            |&group: &usize| (lifted && fits(1, group)).then_some(StatePass::Shared { stages: 1, group });
        groups.iter().find_map(one)
    })
}

/// Warps of 16 value columns a block of the register pass, at most.
pub(crate) const RG_MAX_WARPS: usize = 4;

/// The register pass ([`StatePass::Registers`]) for `Dk × Dv` states within `limit` bytes of
/// shared memory: `max_warps` warps of 16 value columns a block (fewer where `Dv` is narrower;
/// the forward takes [`RG_MAX_WARPS`]), three buffers or two; `None` where `Dk > RG_MAX_DK` or
/// two buffers do not fit. Gated DeltaNet's backward runs its reverse pass
/// (`llc_delta_h_rg_rev_f32`) on the same launch.
pub(crate) fn registers(dk: usize, dv: usize, limit: usize, max_warps: usize) -> Option<StatePass> {
    if dk > RG_MAX_DK {
        return None;
    }
    let warps = dv.div_ceil(16).min(max_warps);
    stages(|st| delta_h_rg_smem(dk, warps, st) <= limit).map(|stages| StatePass::Registers { warps, stages })
}

/// Whether the bf16 mode's pass may run on `device`: bf16 `q`, `k`, `v` with 16-byte aligned rows,
/// no lift, `Dk ≤ 128` with the bf16 output kernel fitting ([`output::direct_fits`]), `Dk` and
/// `Dv` multiples of 8, nothing empty.
fn bf16_applies(s: Shape, p: Precision, storage: Storage, lifted: bool, device: Device) -> bool {
    let Shape { b, t, h, dk, dv } = s;
    p == Precision::Bf16
        && storage == Storage::Bf16 { aligned: true }
        && !lifted
        && dk <= RG_MAX_DK
        && output::direct_fits(dk, 2, device)
        && dk.is_multiple_of(8)
        && dv.is_multiple_of(8)
        && b * t * h * dk * dv != 0
}

/// The pass for these shapes, mode, storage and device: the rule of the module's documentation.
pub fn select(s: Shape, p: Precision, storage: Storage, lifted: bool, device: Device) -> StatePass {
    let Device { sms, smem: limit } = device;
    let (dk, dv, bh) = (s.dk, s.dv, s.bh());
    if bf16_applies(s, p, storage, lifted, device) {
        let warps = rb_warps(dv);
        if let Some(stages) = stages(|st| delta_h_rb_smem(dk, warps, st) <= limit) {
            return StatePass::Bf16Registers { warps, stages };
        }
    }
    let elem = storage.elem();
    let levels = levels(elem, lifted, s.t);
    let groups: &[usize] = if lifted { &LEVEL_GROUPS } else { &[1] };
    let shared = || shared_pass(lifted, groups, |st, group| delta_h_tc_smem(dk, levels, st, group) <= limit);
    if delta_h_smem(elem, dk, levels) > limit {
        // Rule 2, unless the tensor-core pass fits (no FMA staging beside its states).
        return tensor_cores(p, elem).then(shared).flatten().unwrap_or(StatePass::Sequential);
    }
    if lifted
        && elem == Elem::F32
        && levels <= LIFT_MAX_LEVELS
        && let Some(stages) = stages(|st| lift_h_smem(dk, levels, st) <= limit)
    {
        return StatePass::Transition { stages };
    }
    if !tensor_cores(p, elem) {
        return StatePass::Fma;
    }
    if !lifted
        && bh * dv.div_ceil(16) > sms
        && let Some(pass) = registers(dk, dv, limit, RG_MAX_WARPS)
    {
        return pass;
    }
    shared().unwrap_or(StatePass::Fma)
}

/// Every variant the rule chooses among that fits these shapes, mode, storage and device (each
/// with the stages and level group the rule would give it), for tuning: the rule's choice is
/// [`select`]'s. Empty where the FMA pass does not fit ([`StatePass::Sequential`]).
pub fn candidates(s: Shape, p: Precision, storage: Storage, lifted: bool, device: Device) -> Vec<StatePass> {
    let limit = device.smem;
    let (dk, dv) = (s.dk, s.dv);
    let elem = storage.elem();
    let levels = levels(elem, lifted, s.t);
    let mut out = Vec::new();
    if bf16_applies(s, p, storage, lifted, device) {
        let warps = rb_warps(dv);
        out.extend(
            stages(|st| delta_h_rb_smem(dk, warps, st) <= limit)
                .map(|stages| StatePass::Bf16Registers { warps, stages }),
        );
    }
    let groups: &[usize] = if lifted { &LEVEL_GROUPS } else { &[1] };
    let shared = |out: &mut Vec<StatePass>| {
        for &group in groups {
            out.extend(shared_pass(lifted, &[group], |st, g| delta_h_tc_smem(dk, levels, st, g) <= limit));
        }
    };
    if delta_h_smem(elem, dk, levels) > limit {
        if tensor_cores(p, elem) {
            shared(&mut out);
        }
        return out;
    }
    out.push(StatePass::Fma);
    if lifted && elem == Elem::F32 && levels <= LIFT_MAX_LEVELS {
        out.extend(
            stages(|st| lift_h_smem(dk, levels, st) <= limit).map(|stages| StatePass::Transition { stages }),
        );
    }
    if tensor_cores(p, elem) {
        if !lifted {
            out.extend(registers(dk, dv, limit, RG_MAX_WARPS));
        }
        shared(&mut out);
    }
    out
}

/// The launches of `pass` (not [`StatePass::Sequential`], which has none here), in order:
/// `llc_lift_ab` before the transition form's pass, then the pass.
pub(crate) fn launches(pass: StatePass, s: Shape, elem: Elem, p: Precision, lifted: bool) -> Vec<Launch> {
    let (bh, dk, dv) = (s.bh(), s.dk, s.dv);
    let levels = levels(elem, lifted, s.t);
    let tc = tensor_cores(p, elem);
    let sfx = elem.suffix();
    let src = &kernels::LOGLINEAR_STATE_PASS;
    let mut defines = fixed_dims(s);
    let pass_launch = |name: String, defines: Vec<String>, grid_y: usize, threads: usize, smem: usize| {
        Launch::new(Step::StatePass, src, name, defines).on([bh, grid_y, 1], threads, smem).opted_in(true)
    };
    // In the bf16 mode k holds bf16 values, exact in tf32: the tensor cores take their bits as they are.
    let k_tf32 = |d: &mut Vec<String>| {
        if p == Precision::Bf16 {
            d.push("DH_K_TF32=1".to_string());
        }
    };
    match pass {
        StatePass::Bf16Registers { warps, stages } => {
            defines.extend([
                "DH_BF16=1".to_string(),
                format!("DHR_WARPS={warps}"),
                format!("DHR_ST={stages}"),
            ]);
            let smem = delta_h_rb_smem(dk, warps, stages);
            vec![pass_launch(
                "llc_delta_h_rb_bf16".into(),
                defines,
                dv.div_ceil(16 * warps),
                32 * warps,
                smem,
            )]
        }
        StatePass::Registers { warps, stages } => {
            defines.extend([format!("DHR_WARPS={warps}"), format!("DHR_ST={stages}")]);
            k_tf32(&mut defines);
            let smem = delta_h_rg_smem(dk, warps, stages);
            vec![pass_launch(
                format!("llc_delta_h_rg_{sfx}"),
                defines,
                dv.div_ceil(16 * warps),
                32 * warps,
                smem,
            )]
        }
        // Eight computing warps and the decay warp (LDT_THREADS).
        StatePass::Shared { stages, group } => {
            if group > 1 {
                defines.push(format!("DH_LG={group}"));
            }
            k_tf32(&mut defines);
            let smem = delta_h_tc_smem(dk, levels, stages, group);
            let l = pass_launch(format!("llc_delta_h_tc_{sfx}"), defines, dv.div_ceil(16), 288, smem);
            vec![Launch { stages: Some(stages), ..l }]
        }
        StatePass::Transition { stages } => {
            let ab = if tc { "llc_lift_ab_tc" } else { "llc_lift_ab" };
            let h = if tc { "llc_lift_h_tc" } else { "llc_lift_h" };
            let maps = Launch::new(Step::LiftMaps, src, format!("{ab}_{sfx}"), defines.clone()).on(
                [s.chunks(elem.chunk()), bh, 1],
                256,
                LIFT_AB_SMEM,
            );
            let smem = lift_h_smem(dk, levels, stages);
            let l = pass_launch(format!("{h}_{sfx}"), defines, dv.div_ceil(16), 256, smem);
            vec![maps, Launch { stages: Some(stages), ..l }]
        }
        StatePass::Fma => {
            let smem = delta_h_smem(elem, dk, levels);
            vec![pass_launch(format!("llc_delta_h_{sfx}"), defines, dv.div_ceil(16), 256, smem)]
        }
        StatePass::Sequential => Vec::new(),
    }
}

/// What the pass reads and writes: `k`, `g`, the WY/UT step's `W` and `U` (activations of type
/// `T`), the new values `vn` (without a lift) and the entering states `hs` (of type `S`); from a
/// state (no lift), the initial state `s0` (`S_0 [B·H, Dv, Dk]` and 1, or any one-entry buffer
/// and 0 for zero) and the final state `fin` (`S_T [B·H, Dv, Dk]`, where wanted).
pub(crate) struct PassData<'a, 'b, T: DeviceScalar, S: DeviceScalar> {
    pub k: &'a CudaView<'b, T>,
    pub g: (&'a CudaView<'b, S>, i32),
    pub w: &'a Pooled<T>,
    pub u: &'a Pooled<T>,
    pub vn: &'a mut Pooled<T>,
    pub hs: &'a mut Pooled<S>,
    pub s0: (&'a CudaView<'b, S>, i32),
    pub fin: Option<&'a mut Pooled<S>>,
}

/// The state arguments of [`PassData`]: a view of `s0` and 1 (or of the one-entry `zero` and
/// 0), and with `want_final` a buffer of `n` entries for the final state.
pub(crate) fn state_io<'a, S: DeviceScalar>(
    s0: Option<&'a crate::tensor::DeviceTensor<S>>,
    zero: &'a Pooled<S>,
    want_final: bool,
    n: usize,
) -> Result<((CudaView<'a, S>, i32), Option<Pooled<S>>)> {
    let fin = if want_final { Some(pool::take::<S>(FAMILY, n)?) } else { None };
    Ok((super::common::view_or_zero(s0, zero), fin))
}

/// Runs `plan` (from [`launches`] for `pass`) on `x`; with a chunk `table` (a packed batch, the
/// register passes only) over the table's chunks, a block row per (sequence, head).
pub(crate) fn run<T: DeviceScalar, S: DeviceScalar>(
    pass: StatePass,
    plan: &[Launch],
    x: PassData<'_, '_, T, S>,
    s: Shape,
    elem: Elem,
    lifted: bool,
    table: Option<&ChunkTable>,
) -> Result<()> {
    let PassData { k, g: (g, has_g), w, u, vn, hs, s0: (s0, has_s0), fin } = x;
    if (has_s0 != 0 || fin.is_some()) && lifted {
        return Err(crate::runtime::err(
            FAMILY,
            format!("internal: the lift's state pass {pass:?} takes no initial or final state"),
        ));
    }
    // Without a final state the kernels are given a one-entry buffer for it (never written).
    let has_st = fin.is_some() as i32;
    let mut unused = None;
    let st: &mut Pooled<S> = match fin {
        Some(f) => f,
        None => unused.insert(pool::take::<S>(FAMILY, 1)?),
    };
    if table.is_some() && !pass.in_registers() {
        return Err(crate::runtime::err(
            FAMILY,
            format!("internal: a chunk table with the state pass {pass:?}"),
        ));
    }
    let nc = table.map_or(s.chunks(elem.chunk()), |c| c.chunks);
    let [ti, hi, dki, dvi, nci, _] = kernel_ints([s.t, s.h, s.dk, s.dv, nc, s.bh()])?;
    let none = pool::take::<i32>(FAMILY, 1)?;
    let (tab, has_tab) = super::common::table_args(table, &none);
    let levels = levels(elem, lifted, s.t);
    let (lifted_i, levels_i, slots_i) = (lifted as i32, levels as i32, slots(lifted, nc) as i64);
    let gpu = gpu()?;
    // The transition form's per-chunk maps M_j, B_j (padded to whole 16-column pieces) and e^{a_j}.
    let mut maps: Option<[Pooled<S>; 3]> = None;
    for l in plan {
        let (f, cfg) = l.function()?;
        match (l.step, pass) {
            (Step::LiftMaps, _) => {
                let (bhn, dkp, dvp) = (s.bh() * nc, tc_key_dims(s.dk).0, s.dv.div_ceil(16) * 16);
                let [mg, bg, eg] = maps.insert([
                    pool::take::<S>(FAMILY, bhn * dkp * dkp)?,
                    pool::take::<S>(FAMILY, bhn * dkp * dvp)?,
                    pool::take::<S>(FAMILY, bhn)?,
                ]);
                launch!(gpu, FAMILY, f, cfg; k, g, &has_g, &**w, &**u, &mut **mg, &mut **bg, &mut **eg,
                    &ti, &hi, &dki, &dvi, &nci)?
            }
            (Step::StatePass, StatePass::Transition { stages }) => {
                let [mg, bg, eg] = maps.as_ref().ok_or_else(|| unexpected(l))?;
                let st = stages as i32;
                launch!(gpu, FAMILY, f, cfg; &**mg, &**bg, &**eg, &mut **hs, &dki, &dvi, &nci, &levels_i, &slots_i, &st)?
            }
            (Step::StatePass, StatePass::Registers { .. } | StatePass::Bf16Registers { .. }) => {
                launch!(gpu, FAMILY, f, cfg; k, g, &has_g, &**w, &**u, &mut **vn, &mut **hs, &ti, &hi, &dki, &dvi, &nci,
                    s0, &has_s0, &mut **st, &has_st, &tab, &has_tab)?
            }
            (Step::StatePass, StatePass::Shared { stages, .. }) => {
                let stages = stages as i32;
                launch!(gpu, FAMILY, f, cfg; k, g, &has_g, &**w, &**u, &mut **vn, &mut **hs, &ti, &hi, &dki, &dvi, &nci,
                    &lifted_i, &levels_i, &slots_i, &stages, s0, &has_s0, &mut **st, &has_st)?
            }
            (Step::StatePass, StatePass::Fma) => {
                launch!(gpu, FAMILY, f, cfg; k, g, &has_g, &**w, &**u, &mut **vn, &mut **hs, &ti, &hi,
                    &dki, &dvi, &nci, &lifted_i, &levels_i, &slots_i, s0, &has_s0, &mut **st, &has_st)?
            }
            _ => return Err(unexpected(l)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device of `sms` multiprocessors and `smem` bytes of dynamic shared memory per block.
    fn dev(sms: usize, smem: usize) -> Device {
        Device { sms, smem }
    }

    const H200: Device = Device::H200;
    const F32: Storage = Storage::Real(Elem::F32);

    /// [`select`] for `[B·H, Dk, Dv]` (B = 1) and `levels` chunk levels (T at the start of the
    /// chunk that needs them) in f32.
    fn pick(p: Precision, lifted: bool, [bh, dk, dv]: [usize; 3], levels: usize, d: Device) -> StatePass {
        pick_in(p, F32, lifted, [bh, dk, dv], levels, d)
    }

    fn pick_in(
        p: Precision,
        st: Storage,
        lifted: bool,
        [bh, dk, dv]: [usize; 3],
        levels: usize,
        d: Device,
    ) -> StatePass {
        // `levels` levels: T = CH·2^(levels − 2) + 1 (one chunk past a power of two), or one chunk.
        let ch = st.elem().chunk();
        let t = if levels <= 1 { ch } else { ch * (1 << (levels - 2)) + 1 };
        let s = Shape { b: 1, t, h: bh, dk, dv };
        assert_eq!(super::levels(st.elem(), lifted, t), if lifted { levels.max(1) } else { 1 });
        select(s, p, st, lifted, d)
    }

    use Precision::{Bf16, Exact, Tf32};

    #[test]
    fn rule_4_the_exact_mode_runs_fma_whatever_fits() {
        assert_eq!(pick(Exact, false, [16, 64, 64], 1, H200), StatePass::Fma);
        assert_eq!(pick(Exact, false, [512, 64, 64], 1, H200), StatePass::Fma);
        // f64 data has no tensor-core pass in any mode.
        assert_eq!(pick_in(Tf32, Storage::Real(Elem::F64), false, [16, 64, 64], 1, H200), StatePass::Fma);
    }

    #[test]
    fn rule_6_the_shared_memory_pass_fills_one_wave() {
        // B·H = 16 or 32, Dv = 64: the shared-memory kernel's 64 or 128 blocks fit in one wave.
        assert_eq!(pick(Tf32, false, [16, 64, 64], 1, H200), StatePass::Shared { stages: 3, group: 1 });
        assert_eq!(pick(Tf32, false, [32, 64, 64], 1, H200), StatePass::Shared { stages: 3, group: 1 });
        // Dk above 128 has no register pass.
        assert!(matches!(pick(Tf32, false, [512, 129, 64], 1, H200), StatePass::Shared { .. }));
    }

    #[test]
    fn rule_5_the_register_pass_takes_more_than_one_wave() {
        // B·H = 64: 256 blocks would take two waves; four warps of 16 value columns per block.
        assert_eq!(pick(Tf32, false, [64, 64, 64], 1, H200), StatePass::Registers { warps: 4, stages: 3 });
        // Dv = 20: two warps cover it.
        assert_eq!(pick(Tf32, false, [512, 64, 20], 1, H200), StatePass::Registers { warps: 2, stages: 3 });
        // Dk = 70 (padded to 80) still takes three buffers; Dk = 128 only two.
        assert_eq!(pick(Tf32, false, [512, 70, 70], 1, H200), StatePass::Registers { warps: 4, stages: 3 });
        assert_eq!(pick(Tf32, false, [512, 128, 128], 1, H200), StatePass::Registers { warps: 4, stages: 2 });
        // The bf16 mode with f32 activations takes it too (k's bits as they are).
        assert_eq!(pick(Bf16, false, [64, 64, 64], 1, H200), StatePass::Registers { warps: 4, stages: 3 });
    }

    #[test]
    fn rule_6_the_lift_takes_levels_a_group_at_a_time_where_the_transition_form_does_not_fit() {
        // f64 data (no transition form, no tensor cores): FMA.
        assert_eq!(pick_in(Tf32, Storage::Real(Elem::F64), true, [16, 64, 64], 9, H200), StatePass::Fma);
        // T = 2M (sixteen levels): the transition form does not fit; groups of four with two buffers.
        assert_eq!(pick(Tf32, true, [16, 64, 64], 16, H200), StatePass::Shared { stages: 2, group: 4 });
        assert_eq!(pick(Exact, true, [16, 64, 64], 16, H200), StatePass::Fma);
        // Less shared memory: one level at a time where a group of four does not fit.
        assert_eq!(
            pick(Tf32, true, [16, 64, 64], 16, dev(132, 190 << 10)),
            StatePass::Shared { stages: 2, group: 1 }
        );
        // Dk = 16 fits eighteen levels (T = 2²³) but the transition form takes seventeen at most.
        assert!(matches!(pick(Tf32, true, [16, 16, 16], 18, H200), StatePass::Shared { .. }));
        // Dk = 128: from seven levels (T past 2048) neither the transition form nor two buffers
        // fit; one buffer, levels four at a time up to ten levels (T = 2¹⁵), one at a time at
        // eleven (T = 2¹⁶), then the one-block-per-head form. From ten levels the FMA pass does not
        // fit (rule 2): the exact mode takes that form there.
        assert_eq!(pick(Tf32, true, [16, 128, 128], 6, H200), StatePass::Shared { stages: 2, group: 1 });
        for levels in [7, 9, 10] {
            assert_eq!(
                pick(Tf32, true, [128, 128, 128], levels, H200),
                StatePass::Shared { stages: 1, group: 4 }
            );
        }
        assert_eq!(pick(Bf16, true, [16, 128, 128], 11, H200), StatePass::Shared { stages: 1, group: 1 });
        assert_eq!(pick(Tf32, true, [16, 128, 128], 12, H200), StatePass::Sequential);
        assert_eq!(pick(Exact, true, [16, 128, 128], 9, H200), StatePass::Fma);
        assert_eq!(pick(Exact, true, [16, 128, 128], 10, H200), StatePass::Sequential);
        // Two buffers in a smaller group come before one buffer; without the lift one is never taken.
        let fits = |st: usize, group: usize| st * group <= 2;
        assert_eq!(shared_pass(true, &LEVEL_GROUPS, fits), Some(StatePass::Shared { stages: 2, group: 1 }));
        let fits = |st: usize, group: usize| st == 1 && group == 4;
        assert_eq!(shared_pass(true, &LEVEL_GROUPS, fits), Some(StatePass::Shared { stages: 1, group: 4 }));
        assert_eq!(shared_pass(false, &[1], |st, _| st == 1), None);
    }

    #[test]
    fn rule_3_the_lift_with_f32_data_takes_the_transition_form_where_it_fits() {
        // T = 16k (nine levels): three buffers; T = 1M (fifteen): two; in every mode.
        for p in [Exact, Tf32, Bf16] {
            assert_eq!(pick(p, true, [16, 64, 64], 9, H200), StatePass::Transition { stages: 3 });
            assert_eq!(pick(p, true, [16, 64, 64], 15, H200), StatePass::Transition { stages: 2 });
        }
        // Dk = 128: M_j alone is 66 KiB a buffer; two levels' states still fit.
        assert_eq!(pick(Tf32, true, [16, 128, 128], 3, H200), StatePass::Transition { stages: 2 });
        // Dk = 16: seventeen levels, the most it takes.
        assert_eq!(pick(Tf32, true, [16, 16, 16], 17, H200), StatePass::Transition { stages: 3 });
    }

    #[test]
    fn rule_2_states_too_large_for_shared_memory_take_the_sequential_form() {
        // f32 Dk = 192 without a lift (the FMA pass alone needs more than 219 KiB); 188 fits (and no
        // tensor-core pass does).
        assert_eq!(pick(Tf32, false, [16, 192, 64], 1, H200), StatePass::Sequential);
        assert_eq!(pick(Tf32, false, [16, 188, 64], 1, H200), StatePass::Fma);
        assert_eq!(pick(Exact, false, [16, 256, 256], 1, H200), StatePass::Sequential);
        // Nothing fits in 48 KiB (no device) at Dk = 64: the FMA pass does (f32 rows of 68)…
        assert_eq!(
            delta_h_smem(Elem::F32, 64, 1),
            (64 * 16 + 4 * 64 * 68 + 2 * 64 * 16 + 2 * 64 + 64 * 17 + 64) * 4
        );
        assert!(delta_h_smem(Elem::F32, 64, 1) > 48 << 10);
        assert_eq!(pick(Tf32, false, [512, 64, 64], 1, dev(132, 48 << 10)), StatePass::Sequential);
        // … and Dk = 16 fits the FMA pass but no tensor-core pass.
        assert_eq!(pick(Tf32, false, [16, 16, 16], 1, dev(132, 48 << 10)), StatePass::Fma);
    }

    #[test]
    fn rule_1_the_bf16_mode_with_bf16_activations_runs_on_bf16_operands() {
        let bf = Storage::Bf16 { aligned: true };
        for (dims, warps) in [
            ([16, 64, 64], 2),
            ([512, 64, 64], 2),
            ([16, 32, 16], 1),
            ([16, 64, 24], 2),
            ([16, 72, 64], 2),
            ([128, 128, 128], 2),
        ] {
            let want = StatePass::Bf16Registers { warps, stages: 3 };
            assert_eq!(pick_in(Bf16, bf, false, dims, 1, H200), want, "{dims:?}");
        }
        // Dk = 128 on a device whose shared memory does not hold the bf16 output kernel's tiles
        // (72 KiB): not there.
        let small = Device { sms: 132, smem: 64 << 10 };
        assert!(!matches!(
            pick_in(Bf16, bf, false, [16, 128, 64], 1, small),
            StatePass::Bf16Registers { .. }
        ));
        // Not where the rows are unaligned, the dims are not multiples of 8, Dk > 128, with the
        // lift, or in another mode: the f32 rule then.
        let unaligned = Storage::Bf16 { aligned: false };
        for (p, storage, dims) in
            [(Bf16, unaligned, [16, 64, 64]), (Bf16, bf, [16, 60, 64]), (Tf32, bf, [16, 64, 64])]
        {
            let got = pick_in(p, storage, false, dims, 1, H200);
            assert_eq!(got, StatePass::Shared { stages: 3, group: 1 }, "{p:?} {storage:?} {dims:?}");
        }
        assert_eq!(pick_in(Bf16, bf, true, [16, 64, 64], 9, H200), StatePass::Transition { stages: 3 });
        assert_eq!(
            pick_in(Bf16, bf, false, [16, 136, 64], 1, H200),
            StatePass::Shared { stages: 2, group: 1 }
        );
    }

    #[test]
    fn shared_memory_sizes_follow_the_kernels_layouts() {
        // Dk = 64, nine levels: 2 · 8 state tiles of 64 × 24, per buffer M_j [64][68], B_j [64][16], e^{a_j}.
        assert_eq!(lift_h_smem(64, 9, 3), (2 * 8 * 64 * 24 + 3 * (64 * 68 + 64 * 16 + 1)) * 4);
        // Dk = 40 (padded to 48, rows of M_j to 68); one level (one chunk): no states.
        assert_eq!(lift_h_smem(40, 1, 2), 2 * (48 * 68 + 48 * 16 + 1) * 4);
        // Dk = 64: W and K rows of 72 bf16, U rows of 16·warps + 8, 64 f32 log-decays.
        assert_eq!(delta_h_rb_smem(64, 2, 3), 3 * (64 * (2 * 72 + 40) * 2 + 256));
        // Dk = 40 is copied as 64 columns (whole ldmatrix groups).
        assert_eq!(delta_h_rb_smem(40, 1, 2), 2 * (64 * (2 * 72 + 24) * 2 + 256));
        // Dk = 64: W rows of 72 floats, K rows of 68, U rows of 16·warps + 4, 64 log-decays.
        assert_eq!(delta_h_rg_smem(64, 1, 3), 3 * 64 * (72 + 68 + 20 + 1) * 4);
        // Dk = 70 is padded to 80 columns, rows to 96 + 8 and 96 + 4.
        assert_eq!(delta_h_rg_smem(70, 2, 2), 2 * 64 * (104 + 100 + 36 + 1) * 4);
        // FMA: states, two buffers of W and K rows, two of U (16 columns) and of g, Un [64][17], decays.
        let rest = |ch: usize| 2 * ch * 16 + 2 * ch + ch * 17 + ch;
        // f32, Dk = 64: rows of 68 floats (whole 16-byte pieces).
        assert_eq!(delta_h_smem(Elem::F32, 64, 1), (64 * 16 + 4 * 64 * 68 + rest(64)) * 4);
        // f32, Dk = 70 (not a multiple of four) and f64: rows of Dk + 1, as 4- and 8-byte copies need.
        assert_eq!(delta_h_smem(Elem::F32, 70, 3), (3 * 70 * 16 + 4 * 64 * 71 + rest(64)) * 4);
        assert_eq!(delta_h_smem(Elem::F64, 64, 1), (64 * 16 + 4 * 32 * 65 + rest(32)) * 8);
    }

    #[test]
    fn bf16_pass_takes_two_warps_or_one_for_narrow_values() {
        assert_eq!(rb_warps(64), 2);
        assert_eq!(rb_warps(24), 2);
        assert_eq!(rb_warps(16), 1);
    }

    #[test]
    fn launches_carry_the_defines_and_sizes_the_kernels_are_built_for() {
        let s = Shape { b: 1, t: 16384, h: 16, dk: 64, dv: 64 };
        let l = launches(StatePass::Shared { stages: 3, group: 4 }, s, Elem::F32, Bf16, true);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].function, "llc_delta_h_tc_f32");
        assert_eq!(l[0].defines, ["LLC_DK=64", "LLC_DV=64", "DH_LG=4", "DH_K_TF32=1"]);
        assert_eq!((l[0].grid, l[0].block), ([16, 4, 1], 288));
        assert_eq!(l[0].shared_mem, delta_h_tc_smem(64, 9, 3, 4));
        let l = launches(StatePass::Transition { stages: 3 }, s, Elem::F32, Tf32, true);
        assert_eq!(
            l.iter().map(|l| l.function.as_str()).collect::<Vec<_>>(),
            ["llc_lift_ab_tc_f32", "llc_lift_h_tc_f32"]
        );
        assert_eq!((l[0].grid, l[0].shared_mem, l[0].opt_in), ([256, 16, 1], 2 * 64 * 68 * 4, false));
        let l = launches(StatePass::Bf16Registers { warps: 2, stages: 3 }, s, Elem::F32, Bf16, false);
        assert_eq!(l[0].defines, ["LLC_DK=64", "LLC_DV=64", "DH_BF16=1", "DHR_WARPS=2", "DHR_ST=3"]);
        assert_eq!((l[0].grid, l[0].block), ([16, 2, 1], 64));
        assert!(launches(StatePass::Sequential, s, Elem::F32, Exact, false).is_empty());
    }
}
