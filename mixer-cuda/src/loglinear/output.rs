//! The output step of the chunked form (`kernels/loglinear_output.cu`), parallel over
//! (chunk, batch·head, value tile), for every member: per chunk the intra-chunk quadratic part
//! (the Fenwick levels inside the chunk, `ℓ = bitlen(r ⊕ s)`) plus the read of the states the
//! chunk sees between chunks.
//!
//! - The scalar-decay members and gated DeltaNet without a lift (`v = U'`, the new values of the
//!   state pass): `llc_out`, or `llc_out_tc` on tensor cores (the tf32 and bf16 modes with f32
//!   data), reading the tree of chunk states (lifts: for every set bit `e − 1` of the chunk index
//!   its bucket, read with `σ λ_r^(c+e) e^(γ_r) q_r`) or the one state entering the chunk
//!   (`direct`, without a lift). Reading one state per chunk with tensor cores and `Dk ≤ 128`
//!   (where its shared memory fits the device, [`direct_fits`]), it is `llc_out_direct_tc`: a block
//!   copies its four tiles (Q, K, V, the state) into shared memory at once and keeps the scores in
//!   registers as the A operand of `P·V`; its bf16 form reads `q`, `k`, `v` as stored, computes
//!   every product on bf16 tensor cores (the state rounded to bf16 as it is staged) and writes a
//!   bf16 `y`. Its `_k128` kernels hold 128 key columns (`64 < Dk ≤ 128`).
//! - Gated DeltaNet's lift: `llc_out_dl` (or `llc_out_dl_tc`), the λ-weighted intra coefficients
//!   `P T⁻¹ diag(β)` with `P = σ QKᵀ ⊙ Γ`, and every level state entering the chunk read with the
//!   carried queries `Q̃ = σ diag(e^γ) Q − P W`.

use cudarc::driver::{CudaFunction, CudaView, DeviceRepr, LaunchConfig};
use mixer_core::{Precision, Result};

use super::common::{
    ChunkTable, Device, Elem, FAMILY, Launch, Shape, Step, fixed_dims, kernel_ints, table_args, tensor_cores,
};
use super::ssd::Bf16States;
use crate::kernels;
use crate::pool::Pooled;
use crate::runtime::{gpu, int, launch};
use crate::tensor::GpuReal;

/// Dynamic shared memory of `llc_out_dl_tc`: three `[64][68]` f32 tiles.
const OUT_DL_TC_SMEM: usize = 3 * 64 * 68 * 4;

/// Dynamic shared memory of `llc_out_dl`: `Pt`, `At` `[CH][CH+1]`, `Qt` `[64][CH+1]`, two
/// `[16][65]` staging tiles.
fn out_dl_smem(elem: Elem) -> usize {
    let ch = elem.chunk();
    (2 * ch * (ch + 1) + 64 * (ch + 1) + 2 * 16 * 65) * elem.bytes()
}

/// Key columns of `llc_out_direct_tc`'s tiles for `dk`: 64, or 128 (its `_k128` kernels); `None`
/// above 128.
fn direct_columns(dk: usize) -> Option<usize> {
    match dk {
        0..=64 => Some(64),
        65..=128 => Some(128),
        _ => None,
    }
}

/// Dynamic shared memory of `llc_out_direct_tc` with `kt` key columns for activations of `bytes`
/// bytes: the Q, K tiles `[64][kt]`, the V tile `[64][64]` and the state tile `[kt][64]`, all in
/// the activations' type (the bf16 kernel rounds the state to bf16 as it stages it; `lld_smem` in
/// the kernel): 56 KiB in bf16 at `kt = 128`, 112 KiB in f32.
fn direct_smem(kt: usize, bytes: usize) -> usize {
    (3 * kt + 64) * 64 * bytes
}

/// Whether `llc_out_direct_tc` serves `dk` with activations of `bytes` bytes on `device`:
/// `Dk ≤ 128` and its shared memory within the device's.
pub(crate) fn direct_fits(dk: usize, bytes: usize, device: Device) -> bool {
    direct_columns(dk).is_some_and(|kt| direct_smem(kt, bytes) <= device.smem)
}

/// Whether `l` is a launch of `llc_out_direct_tc` (its arguments differ from `llc_out`'s).
fn is_direct(l: &Launch) -> bool {
    l.function.starts_with("llc_out_direct_tc")
}

/// The outputs of the scalar-decay members and of gated DeltaNet without a lift: the tree
/// (`lifted`) or the state entering each chunk (otherwise): `llc_out_direct_tc_f32` with tensor
/// cores without a lift where [`direct_fits`] on `device`, else `llc_out` or `llc_out_tc`.
pub(crate) fn launch(s: Shape, elem: Elem, p: Precision, lifted: bool, device: Device) -> Launch {
    let nc = s.chunks(elem.chunk());
    let grid = [nc, s.bh(), s.dv.div_ceil(64)];
    let tc = tensor_cores(p, elem);
    if !lifted && tc && direct_fits(s.dk, 4, device) {
        return launch_direct(s, "llc_out_direct_tc_f32", 4);
    }
    let (name, threads) = if tc { ("llc_out_tc", 128) } else { ("llc_out", 256) };
    Launch::new(Step::Output, &kernels::LOGLINEAR_OUTPUT, format!("{name}_{}", elem.suffix()), fixed_dims(s))
        .on(grid, threads, 0)
}

/// `llc_out_direct_tc_bf16` (f32 states) or `llc_out_direct_tc_hb` (bf16 states, `states`): the
/// bf16 mode's one state per chunk, bf16 activations and `y` (the caller has checked
/// [`direct_fits`]).
pub(crate) fn launch_bf16(s: Shape, states: Bf16States) -> Launch {
    let name = match states {
        Bf16States::Bf16 => "llc_out_direct_tc_hb",
        Bf16States::F32 => "llc_out_direct_tc_bf16",
    };
    launch_direct(s, name, 2)
}

/// `llc_out_direct_tc` (`name`, with `_k128` where `Dk > 64`) for activations of `bytes` bytes.
fn launch_direct(s: Shape, name: &str, bytes: usize) -> Launch {
    let grid = [s.chunks(64), s.bh(), s.dv.div_ceil(64)];
    let kt = direct_columns(s.dk).unwrap_or(128);
    let name = if kt > 64 { format!("{name}_k128") } else { name.to_string() };
    Launch::new(Step::Output, &kernels::LOGLINEAR_OUTPUT, name, fixed_dims(s))
        .on(grid, 128, direct_smem(kt, bytes))
        .opted_in(true)
}

/// Gated DeltaNet's lift: `llc_out_dl`, or `llc_out_dl_tc` on tensor cores.
pub(crate) fn launch_lift(s: Shape, elem: Elem, p: Precision) -> Launch {
    let tc = tensor_cores(p, elem);
    let name = if tc { "llc_out_dl_tc" } else { "llc_out_dl" };
    let smem = if tc { OUT_DL_TC_SMEM } else { out_dl_smem(elem) };
    let grid = [s.chunks(elem.chunk()), s.bh(), s.dv.div_ceil(64)];
    Launch::new(Step::Output, &kernels::LOGLINEAR_OUTPUT, format!("{name}_{}", elem.suffix()), fixed_dims(s))
        .on(grid, 256, smem)
        .opted_in(true)
}

/// Runs `l` (from [`launch`]; `f`, `cfg` its function and configuration): `y` from the chunks and
/// the states they read — the tree (`lifted`), or the state entering each chunk (gated DeltaNet
/// without a lift passes its new values as `v`, and no decays); `first_state`: chunk 0 reads a
/// state too (a run from an initial state, without a lift: kernel `direct = 2`, or `read0` of
/// `llc_out_direct_tc`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<F: GpuReal>(
    l: &Launch,
    (f, cfg): (CudaFunction, LaunchConfig),
    [q, k, v]: [&CudaView<'_, F>; 3],
    (g, has_g): (&CudaView<'_, F>, i32),
    lam: &CudaView<'_, F>,
    states: &Pooled<F>,
    decays: &Pooled<f64>,
    levels: usize,
    (lifted, first_state): (bool, bool),
    s: Shape,
    scale: f64,
    y: &mut Pooled<F>,
    table: Option<&ChunkTable>,
) -> Result<()> {
    if first_state && lifted {
        return Err(crate::runtime::err(FAMILY, "internal: a state entering chunk 0 with a lift"));
    }
    if is_direct(l) {
        let sv = states.slice(0..states.len());
        return run_direct(f, cfg, [q, k, v], (g, has_g), (&sv, table), s, scale, first_state, y);
    }
    if table.is_some() && lifted {
        return Err(crate::runtime::err(FAMILY, "internal: a chunk table with a lift"));
    }
    let Shape { t, h, dk, dv, .. } = s;
    let nc = table.map_or(s.chunks(Elem::of::<F>().chunk()), |c| c.chunks);
    let (ti, hi, dki, dvi, nci) = (t as i32, h as i32, dk as i32, dv as i32, nc as i32);
    let direct = if lifted {
        0
    } else if first_state {
        2
    } else {
        1
    };
    let (li, lifted) = (int(FAMILY, "L", levels)?, lifted as i32);
    let none = crate::pool::take::<i32>(FAMILY, 1)?;
    let (tab, has_tab) = table_args(table, &none);
    launch!(gpu()?, FAMILY, f, cfg;
        q, k, v, g, &has_g, lam, &**states, &**decays, &mut **y,
        &ti, &hi, &dki, &dvi, &li, &lifted, &direct, &nci, &scale, &tab, &has_tab)
}

/// Runs `llc_out_direct_tc_f32`, `_bf16` or `_hb` (function `f`, configuration `cfg`): one state
/// per chunk, `q`, `k`, `v` and `y` of type `T` (f32, or bf16 as stored), `g` of type `S` (f32),
/// the states entering the chunks of type `H` (f32, or bf16 for `_hb`); chunk 0 reads its state
/// only with `read0` (a run from a state).
/// With a chunk table (a packed batch) the chunks are the table's and every sequence's first
/// chunk reads its state only with `read0`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_direct<T: DeviceRepr, S: DeviceRepr, H: DeviceRepr>(
    f: CudaFunction,
    cfg: LaunchConfig,
    [q, k, v]: [&CudaView<'_, T>; 3],
    (g, has_g): (&CudaView<'_, S>, i32),
    (states, table): (&CudaView<'_, H>, Option<&ChunkTable>),
    s: Shape,
    scale: f64,
    read0: bool,
    y: &mut Pooled<T>,
) -> Result<()> {
    let nc = table.map_or(s.chunks(64), |c| c.chunks);
    let [ti, hi, dki, dvi, nci, _] = kernel_ints([s.t, s.h, s.dk, s.dv, nc, s.bh()])?;
    let read0 = read0 as i32;
    let none = crate::pool::take::<i32>(FAMILY, 1)?;
    let (tab, has_tab) = table_args(table, &none);
    launch!(gpu()?, FAMILY, f, cfg;
        q, k, v, g, &has_g, states, &mut **y, &ti, &hi, &dki, &dvi, &nci, &scale, &read0, &tab, &has_tab)
}

/// Runs `llc_out_dl` or `llc_out_dl_tc` (function `f`, configuration `cfg`): the lift's outputs
/// from `W`, `T⁻¹` and the level states `hs` entering each chunk (`slots` per batch·head).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_lift<F: GpuReal>(
    (f, cfg): (CudaFunction, LaunchConfig),
    [q, k, v]: [&CudaView<'_, F>; 3],
    (g, has_g): (&CudaView<'_, F>, i32),
    beta: &CudaView<'_, F>,
    (lam, levels): (&CudaView<'_, F>, usize),
    [w, tinv, hs]: [&Pooled<F>; 3],
    slots: usize,
    s: Shape,
    scale: f64,
    y: &mut Pooled<F>,
) -> Result<()> {
    let nc = s.chunks(Elem::of::<F>().chunk());
    let [ti, hi, dki, dvi, nci, _] = kernel_ints([s.t, s.h, s.dk, s.dv, nc, s.bh()])?;
    let (li, slots_i) = (int(FAMILY, "L", levels)?, slots as i64);
    launch!(gpu()?, FAMILY, f, cfg; q, k, v, g, &has_g, beta, lam, &**w, &**tinv, &**hs, &mut **y,
        &ti, &hi, &dki, &dvi, &li, &nci, &slots_i, &scale)
}
