//! The chunked form of the scalar-decay members (`linear-attention`, `mamba2` and their
//! Fenwick lifts), parallel over chunks — the state-space-duality ("SSD") algorithm, as the CPU's
//! `ssd.rs`: `kernels/loglinear_ssd.cu` for the chunk states and what joins them, then the
//! output step ([`super::output`]).
//!
//! The tokens are cut into chunks of `CH = 64` (f32) or `32` (f64) whatever the configured
//! `chunk` (the result does not depend on the chunking). Three passes:
//! 1. `llc_states`, per (chunk, batch·head, tile): the chunk state
//!    `Z_j = Σ_s e^(a_j − γ_s) k_s v_sᵀ` and the chunk's log-decay `a_j`;
//! 2. `llc_tree`, one launch per tree level `e ≥ 1`: every aligned block of `2^e` chunks gets its
//!    state decayed to its end, `F_e(m) = e^(A_{e−1}(2m+1)) F_{e−1}(2m) + F_{e−1}(2m+1)`, and its
//!    log-decay `A_e(m)`;
//! 3. the outputs ([`super::output`]), per (chunk, batch·head, value tile): the intra-chunk
//!    quadratic part (Fenwick levels inside the chunk) plus, for every set bit `e − 1` of the
//!    chunk index `i`, the bucket of chunks `j` with `bitlen(i ⊕ j) = e` — the tree entry
//!    `F_{e−1}(2⌊i/2^e⌋)`, decayed over the buckets of the lower set bits and read with
//!    `σ λ_r^(c+e) e^(γ_r) q_r` (`c = log₂ CH`).
//!
//! Without a lift, pass 2 is `llc_scan` instead of the tree: one launch in which every entry of
//! every chunk state is an independent recurrence over the chunks, `H_0 = 0`,
//! `H_{j+1} = e^(a_j) H_j + Z_j`; `Z_j` is overwritten in place by `H_j`, the state entering chunk
//! `j`, and pass 3 reads that one state per chunk (`direct`) instead of summing `popcount(i)`
//! tree entries (which made pass 3 read about four states per chunk at 16k tokens).
//!
//! Without a lift on tensor cores, where there are enough (batch·head, tile) blocks for the
//! device (`walk`), passes 1 and 2' are one launch, `llc_walk_tc`: each block walks its tile's
//! chunks in order with the state in registers and writes `H_j` only — bit for bit the states
//! and the scan, without writing and reading back the chunk states.
//!
//! In the tf32 mode `llc_states_tc` does the products of pass 1 on tensor cores (tf32
//! `mma.sync`, f32 accumulation), in the bf16 mode on bf16 activations `llc_states_tc_bf16` (bf16
//! `mma.sync` on `k` as stored times its decay rounded to bf16, and `v` as stored; f32
//! accumulation); in the bf16 mode without a lift, `Dk ≤ 128` and bf16 `q`, `k`, `v`,
//! [`run_bf16`] reads the activations as stored and writes a bf16 `y`.
//!
//! So the base mixers and the lifts share every pass; the lift costs one `CH × D_k × D_v` product
//! per set bit of the chunk index (`O(T log T)` work) and the tree holds `< 2 T/CH` states per
//! (batch, head) (`O(T)` memory). Work is parallel over `T/CH × B·H × ⌈D_v/64⌉` blocks; only
//! the `⌊log₂(T/CH)⌋` tree launches are ordered.

use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Precision, Result};

use super::common::{
    ChunkTable, ChunkedInputs, Device, Elem, FAMILY, Launch, Shape, Step, bf16_qkv, check_sizes, fixed_dims,
    kernel_ints, output_buffer, table_args, tensor_cores, unexpected, view_or_zero,
};
use super::output;
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu, launch};
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors, bf16};

/// Where the bf16 path ([`run_bf16`]) puts the states entering the chunks: rounded to bf16, the
/// output kernel's operand as it would round it (the forward: `llc_scan_hb` or `llc_walk_tc_hb`,
/// then `llc_out_direct_tc_hb`, half the bytes), or f32 (`llc_scan_f32` or `llc_walk_tc_bf16`,
/// then `llc_out_direct_tc_bf16`: a backward keeps them for its decay gradient). `y` has the same
/// bits either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bf16States {
    /// bf16 states, for the outputs alone.
    Bf16,
    /// f32 states, handed back.
    F32,
}

/// Tree entries per (batch, head): `Σ_e ⌊nc / 2^e⌋` over the levels that are read.
fn tree_entries(nc: usize) -> usize {
    (0..usize::BITS).map(|e| nc >> e).take_while(|&c| c > 0).sum()
}

/// Chunk states per (batch, head): the tree (lifts) or one per chunk.
fn states(s: Shape, elem: Elem, lifted: bool) -> usize {
    let nc = s.chunks(elem.chunk());
    if lifted { tree_entries(nc) } else { nc }
}

/// The launches before the outputs, in order: the chunk states (`llc_states`, on tensor cores
/// `llc_states_tc`; on the bf16 path, `bf16` given: `llc_states_tc_bf16`, reading bf16 `k`, `v`),
/// then the tree's levels (lifts) or the scan — or, without a lift on tensor cores where [`walk`]
/// pays, the one launch of `llc_walk_tc` that does both; the bf16 path's scan and walk write the
/// entering states as `bf16` says ([`Bf16States`]). Checks the sizes ([`check_sizes`]).
pub(crate) fn launches(
    s: Shape,
    elem: Elem,
    p: Precision,
    lifted: bool,
    bf16: Option<Bf16States>,
    device: Device,
) -> Result<Vec<Launch>> {
    check_sizes(s, elem, states(s, elem, lifted))?;
    let nc = s.chunks(elem.chunk());
    let (bh, sfx) = (s.bh(), elem.suffix());
    let tiles = |n: usize| n.div_ceil(64);
    let k = |step, name: String| Launch::new(step, &kernels::LOGLINEAR_SSD, name, fixed_dims(s));
    let tc = bf16.is_some() || tensor_cores(p, elem);
    if !lifted && tc {
        let bytes = if bf16.is_some() { 2 } else { 4 };
        if let Some((vt, stages)) = walk(s, bytes, device) {
            let name = match bf16 {
                Some(Bf16States::Bf16) => "llc_walk_tc_hb".to_string(),
                Some(Bf16States::F32) => "llc_walk_tc_bf16".to_string(),
                None => format!("llc_walk_tc_{sfx}"),
            };
            let mut defines = fixed_dims(s);
            defines.extend([format!("LLW_VT={vt}"), format!("LLW_STAGES={stages}")]);
            let grid = [tiles(s.dk) * s.dv.div_ceil(vt), bh, 1];
            let l = Launch::new(Step::Walk, &kernels::LOGLINEAR_SSD, name, defines);
            return Ok(vec![l.on(grid, 128, walk_smem(vt, stages, bytes)).opted_in(true)]);
        }
    }
    let (name, threads) = match (bf16, tc) {
        (Some(_), _) => ("llc_states_tc_bf16".to_string(), 128),
        (None, true) => (format!("llc_states_tc_{sfx}"), 128),
        (None, false) => (format!("llc_states_{sfx}"), 256),
    };
    let mut out = vec![k(Step::States, name).on([nc, bh, tiles(s.dk) * tiles(s.dv)], threads, 0)];
    if !lifted {
        let scan = if bf16 == Some(Bf16States::Bf16) {
            "llc_scan_hb".to_string()
        } else {
            format!("llc_scan_{sfx}")
        };
        out.push(k(Step::Scan, scan).on([(s.dk * s.dv).div_ceil(256), bh, 1], 256, 0));
        return Ok(out);
    }
    for e in 1..usize::BITS as usize {
        let cnt = nc >> e;
        // Level e is read as the lower half of a level-(e + 1) block only, which needs
        // ⌊nc / 2^(e+1)⌋ ≥ 1 — but computing one more level is harmless and keeps this simple.
        if cnt == 0 {
            break;
        }
        out.push(k(Step::Tree { level: e }, format!("llc_tree_{sfx}")).on([cnt, bh, 1], 256, 0));
    }
    Ok(out)
}

/// Dynamic shared memory of `llc_walk_tc` with `vt` value columns and `stages` chunks in flight,
/// activations of `bytes` bytes: per stage a K tile `[64][72]` and a V tile `[64][vt + 8]`.
fn walk_smem(vt: usize, stages: usize, bytes: usize) -> usize {
    stages * 64 * (72 + vt + 8) * bytes
}

/// `llc_walk_tc`'s value columns per block and stages in flight, where the walk replaces the
/// states and the scan. A walk is sequential over the chunks of its (batch·head, tile) block, so it
/// pays only with enough blocks to fill the device: at least 1.5 per multiprocessor, with 64
/// value columns a block, else 32. Measured on the H200 (Mamba-2, H = 16, `mixers bench`, whole
/// call): the walk 1.85 / 1.31 ms against 2.09 / 2.15 ms (tf32 / bf16) at (B, T, D) =
/// (8, 4096, 128) with 512 blocks; 1.77 / 1.39 against 2.10 / 2.15 at (4, 8192, 128), 256 blocks;
/// with 32 columns 0.53 / 0.46 against 0.56 / 0.58 at (8, 4096, 64), 256 blocks; but 1.26 / 1.12
/// against 1.08 / 1.12 at (1, 16384, 128) with 128 blocks, and 0.84 against 0.31 at
/// (1, 16384, 64) with 32: few blocks walking many chunks.
fn walk(s: Shape, bytes: usize, device: Device) -> Option<(usize, usize)> {
    let blocks = |vt: usize| s.dk.div_ceil(64) * s.dv.div_ceil(vt) * s.bh();
    let vt = [64, 32].into_iter().find(|&vt| 2 * blocks(vt) >= 3 * device.sms)?;
    // Three chunks in flight for bf16 (55 KiB), two for f32 (72 KiB at 64 columns).
    let stages = if bytes == 2 { 3 } else { 2 };
    (walk_smem(vt, stages, bytes) <= device.smem).then_some((vt, stages))
}

/// The chunk states of [`prefix`]: the tree's entries (lifts) or the state entering each chunk
/// (after the scan), their log-decays, and the final state where it was asked for.
pub(crate) struct Prefix<F: GpuReal> {
    /// `[BH][entries][Dk][Dv]` (the layout of `kernels/loglinear_ssd.cu`).
    pub tree: Pooled<F>,
    /// The entries' log-decays `[BH][entries]` (f64).
    pub decays: Pooled<f64>,
    /// The final state `S [B, H, Dv, Dk]` (a base mixer with `want_final`).
    pub fin: Option<Pooled<F>>,
}

/// Runs the launches of `plan` before the outputs ([`launches`]: the chunk states, then the tree
/// or the scan); the backward of the lifts reads the tree ([`super::backward_lift`]). A base mixer
/// may start from the state `s0` (`S [B, H, Dv, Dk]`, docs/math.md §7; `None`: zero) and, with
/// `want_final`, also returns its final state (both taken by the scan). With a chunk `table`
/// (a packed batch, `B = 1`, a base mixer, the plan's grids from [`ChunkTable::launches`]) the
/// chunks are the table's and `s0` and the final state have a row per sequence.
pub(crate) fn prefix<F: GpuReal>(
    ll: &LogLinear,
    x: &ChunkedInputs<'_, F>,
    plan: &[Launch],
    s0: Option<&DeviceTensor<F>>,
    want_final: bool,
    table: Option<&ChunkTable>,
) -> Result<Prefix<F>> {
    let s = x.shape();
    let [b, t, h, dk, dv] = s.dims();
    let lifted = ll.lift.is_some();
    if table.is_some() && lifted {
        return Err(err(FAMILY, "internal: a chunk table with a lift"));
    }
    let nc = table.map_or(s.chunks(Elem::of::<F>().chunk()), |c| c.chunks);
    let entries = if table.is_some() { nc } else { states(s, Elem::of::<F>(), lifted) };
    let rows = table.map_or(b, |c| c.seqs);
    let bh = s.bh();
    let g = gpu()?;
    let (gv, has_g) = x.g_view();
    let mut tree = pool::take::<F>(FAMILY, bh * entries * dk * dv)?;
    let mut decays = pool::take::<f64>(FAMILY, bh * entries)?;
    let [ti, hi, dki, dvi, nci, bhi] = kernel_ints([t, h, dk, dv, nc, bh])?;
    let (kv, vv) = (x.k.view(), x.v.view());
    if (s0.is_some() || want_final)
        && (lifted || !plan.iter().any(|l| matches!(l.step, Step::Scan | Step::Walk)))
    {
        return Err(err(FAMILY, "internal: a state needs the scan of a base mixer"));
    }
    let (s0v, has_s0) = view_or_zero(s0, &x.zero);
    let mut fin = if want_final { Some(pool::take::<F>(FAMILY, rows * h * dk * dv)?) } else { None };
    let none = pool::take::<i32>(FAMILY, 1)?;
    let (tab, has_tab) = table_args(table, &none);
    for l in plan {
        let (f, cfg) = l.function()?;
        match l.step {
            Step::States => launch!(g, FAMILY, f, cfg;
                &kv, &vv, &gv, &has_g, &mut *tree, &mut *decays, &ti, &hi, &dki, &dvi, &nci, &tab, &has_tab)?,
            Step::Scan => {
                let has_st = fin.is_some() as i32;
                let mut unused = pool::take::<F>(FAMILY, 1)?;
                let st = fin.as_deref_mut().unwrap_or(&mut *unused);
                launch!(g, FAMILY, f, cfg;
                    &mut *tree, &*decays, &dki, &dvi, &nci, &s0v, &has_s0, st, &has_st, &tab, &has_tab, &hi)?
            }
            Step::Walk => {
                let has_st = fin.is_some() as i32;
                let mut unused = pool::take::<F>(FAMILY, 1)?;
                let st = fin.as_deref_mut().unwrap_or(&mut *unused);
                launch!(g, FAMILY, f, cfg; &kv, &vv, &gv, &has_g, &mut *tree, &mut *decays,
                    &ti, &hi, &dki, &dvi, &nci, &s0v, &has_s0, st, &has_st, &tab, &has_tab)?
            }
            Step::Tree { level } => {
                let ei = level as i32;
                launch!(g, FAMILY, f, cfg; &mut *tree, &mut *decays, &ei, &bhi, &dki, &dvi, &nci)?
            }
            _ => return Err(unexpected(l)),
        }
    }
    Ok(Prefix { tree, decays, fin })
}

/// Runs the passes of `plan` (from [`launches`], then [`output::launch`]); returns `y`
/// `[B, T, H, Dv]` and the [`Prefix`] the outputs read: with `want_final` the final state (a
/// chunk `table` as in [`prefix`], which needs the direct output kernel; rows past the table's
/// last token are zero), and without a lift the state entering every chunk (what the base
/// mixers' backward reads at the chunk boundaries, [`super::backward`]).
pub(crate) fn run<F: GpuReal>(
    ll: &LogLinear,
    x: &ChunkedInputs<'_, F>,
    plan: &[Launch],
    s0: Option<&DeviceTensor<F>>,
    want_final: bool,
    table: Option<&ChunkTable>,
) -> Result<(Pooled<F>, Prefix<F>)> {
    let s = x.shape();
    let [b, t, h, _, dv] = s.dims();
    let lifted = ll.lift.is_some();
    let (out_launch, before) = plan.split_last().ok_or_else(|| err(FAMILY, "internal: an empty plan"))?;
    if out_launch.step != Step::Output {
        return Err(unexpected(out_launch));
    }
    let pre = prefix(ll, x, before, s0, want_final, table)?;
    let (tree, decays) = (&pre.tree, &pre.decays);
    let (gv, has_g) = x.g_view();
    let levels = x.lam.as_ref().map_or(1, |(_, n)| *n);
    let n = b * t * h * dv;
    let mut y = output_buffer::<F>(table, n, h * dv)?;
    let (lv, scale) = (x.lam_view(), ll.scale);
    let (qv, kv, vv) = (x.q.view(), x.k.view(), x.v.view());
    output::run(
        out_launch,
        out_launch.function()?,
        [&qv, &kv, &vv],
        (&gv, has_g),
        &lv,
        tree,
        decays,
        levels,
        (lifted, s0.is_some()),
        s,
        scale,
        &mut y,
        table,
    )?;
    Ok((y, pre))
}

/// The bf16 mode of linear attention and Mamba-2 without a lift, `Dk ≤ 128` (`g` as given), with
/// the launches of `plan`, made for `kind` ([`Bf16States`]): `llc_states_tc_bf16` (or the walk)
/// and the output kernel read `q`, `k`, `v` as they are stored and the latter writes a bf16 `y`
/// (no f32 copies of the activations or of `y`; every product on bf16 tensor cores, the decayed
/// keys, the entering state and the scores rounded to bf16 as operands); the chunk states and the
/// scan's sums are f32, the states entering the chunks f32 or bf16 as `kind` says. The scan may
/// start from the f32 state `s0` (`S [B, H, Dv, Dk]`; `None`: zero; chunk 0's outputs then read
/// it) and, with `want_final`, writes the f32 final state. A chunk `table` as in [`prefix`] (`y`
/// zero past its last token). Returns `y`, the final state and, for [`Bf16States::F32`], the f32
/// state entering every chunk (`[B·H][chunks][Dk][Dv]`, as [`Prefix::tree`] without a lift).
pub(crate) fn run_bf16(
    ll: &LogLinear,
    x: &DeviceTensors,
    g: Option<&DeviceTensor<f32>>,
    (plan, kind): (&[Launch], Bf16States),
    s0: Option<&DeviceTensor<f32>>,
    want_final: bool,
    table: Option<&ChunkTable>,
) -> Result<(AnyDeviceTensor, Option<DeviceTensor<f32>>, Option<Pooled<f32>>)> {
    let Some(([q, k, v], dims)) = bf16_qkv(x) else {
        return Err(err(FAMILY, "internal: the bf16 path needs bf16 q, k, v"));
    };
    let s = Shape::new(dims);
    let [b, t, h, dk, dv] = dims;
    let zero = pool::zeros::<f32>(FAMILY, 1)?;
    let (gv, has_g) = view_or_zero(g, &zero);
    let nc = table.map_or(s.chunks(64), |c| c.chunks);
    let (bh, rows) = (s.bh(), table.map_or(b, |c| c.seqs));
    let gpu = gpu()?;
    let [ti, hi, dki, dvi, nci, _] = kernel_ints([t, h, dk, dv, nc, bh])?;
    // The f32 chunk states (the scan's input, or what the walk writes for `F32`) and, for `Bf16`,
    // the bf16 states entering the chunks.
    let walks = plan.iter().any(|l| matches!(l.step, Step::Walk));
    let hb = kind == Bf16States::Bf16;
    let mut states = pool::take::<f32>(FAMILY, if hb && walks { 1 } else { bh * nc * dk * dv })?;
    let mut entering = pool::take::<bf16>(FAMILY, if hb { bh * nc * dk * dv } else { 1 })?;
    let mut decays = pool::take::<f64>(FAMILY, bh * nc)?;
    let mut unused = pool::zeros::<f32>(FAMILY, 1)?;
    let (s0v, has_s0) = view_or_zero(s0, &zero);
    let mut fin = if want_final { Some(pool::take::<f32>(FAMILY, rows * h * dk * dv)?) } else { None };
    let none = pool::take::<i32>(FAMILY, 1)?;
    let (tab, has_tab) = table_args(table, &none);
    let (qv, kv, vv) = (q.view(), k.view(), v.view());
    let mut y = None;
    for l in plan {
        let (f, cfg) = l.function()?;
        match l.step {
            Step::States => launch!(gpu, FAMILY, f, cfg;
                &kv, &vv, &gv, &has_g, &mut *states, &mut *decays, &ti, &hi, &dki, &dvi, &nci, &tab, &has_tab)?,
            Step::Scan => {
                let has_st = fin.is_some() as i32;
                let st = fin.as_deref_mut().unwrap_or(&mut *unused);
                if hb {
                    launch!(gpu, FAMILY, f, cfg; &mut *states, &mut *entering,
                        &*decays, &dki, &dvi, &nci, &s0v, &has_s0, st, &has_st, &tab, &has_tab, &hi)?
                } else {
                    launch!(gpu, FAMILY, f, cfg;
                        &mut *states, &*decays, &dki, &dvi, &nci, &s0v, &has_s0, st, &has_st, &tab, &has_tab, &hi)?
                }
            }
            Step::Walk => {
                let has_st = fin.is_some() as i32;
                let st = fin.as_deref_mut().unwrap_or(&mut *unused);
                if hb {
                    launch!(gpu, FAMILY, f, cfg; &kv, &vv, &gv, &has_g, &mut *entering, &mut *decays,
                        &ti, &hi, &dki, &dvi, &nci, &s0v, &has_s0, st, &has_st, &tab, &has_tab)?
                } else {
                    launch!(gpu, FAMILY, f, cfg; &kv, &vv, &gv, &has_g, &mut *states, &mut *decays,
                        &ti, &hi, &dki, &dvi, &nci, &s0v, &has_s0, st, &has_st, &tab, &has_tab)?
                }
            }
            Step::Output => {
                let n = b * t * h * dv;
                let y = y.insert(output_buffer::<bf16>(table, n, h * dv)?);
                let read0 = s0.is_some();
                let (qkv, gs) = ([&qv, &kv, &vv], (&gv, has_g));
                if hb {
                    let ev = entering.slice(0..entering.len());
                    output::run_direct(f, cfg, qkv, gs, (&ev, table), s, ll.scale, read0, y)?
                } else {
                    let sv = states.slice(0..states.len());
                    output::run_direct(f, cfg, qkv, gs, (&sv, table), s, ll.scale, read0, y)?
                }
            }
            _ => return Err(unexpected(l)),
        }
    }
    let y = y.ok_or_else(|| err(FAMILY, "internal: a plan without outputs"))?;
    let fin = fin.map(|f| DeviceTensor::from_pooled(f, &[rows, h, dv, dk])).transpose()?;
    Ok((AnyDeviceTensor::Bf16(DeviceTensor::from_pooled(y, &[b, t, h, dv])?), fin, (!hb).then_some(states)))
}
