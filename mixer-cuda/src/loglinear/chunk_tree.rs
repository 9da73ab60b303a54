//! The chunked form of the scalar-decay members (`linear-attention`, `mamba2` and their
//! Fenwick lifts), parallel over chunks: `kernels/loglinear_chunked.cu`; gated DeltaNet and its
//! lift (`run_delta`): `kernels/loglinear_delta.cu`; both with the helpers of
//! `kernels/loglinear_chunk.cuh`.
//!
//! The tokens are cut into chunks of `CH = 64` (f32) or `32` (f64) whatever the configured
//! `chunk` (the result does not depend on the chunking). Three passes:
//! 1. `llc_states`, per (chunk, batch·head, tile): the chunk state
//!    `Z_j = Σ_s e^(a_j − γ_s) k_s v_sᵀ` and the chunk's log-decay `a_j`;
//! 2. `llc_tree`, one launch per tree level `e ≥ 1`: every aligned block of `2^e` chunks gets its
//!    state decayed to its end, `F_e(m) = e^(A_{e−1}(2m+1)) F_{e−1}(2m) + F_{e−1}(2m+1)`, and its
//!    log-decay `A_e(m)`;
//! 3. `llc_out`, per (chunk, batch·head, value tile): the intra-chunk quadratic part (Fenwick
//!    levels inside the chunk) plus, for every set bit `e − 1` of the chunk index `i`, the
//!    bucket of chunks `j` with `bitlen(i ⊕ j) = e` — the tree entry `F_{e−1}(2⌊i/2^e⌋)`,
//!    decayed over the buckets of the lower set bits and read with `σ λ_r^(c+e) e^(γ_r) q_r`
//!    (`c = log₂ CH`).
//!
//! Without a lift, pass 2 is `llc_scan` instead of the tree: one launch in which every entry of
//! every chunk state is an independent recurrence over the chunks, `H_0 = 0`,
//! `H_{j+1} = e^(a_j) H_j + Z_j`; `Z_j` is overwritten in place by `H_j`, the state entering chunk
//! `j`, and pass 3 reads that one state per chunk (`direct`) instead of summing `popcount(i)`
//! tree entries (which made pass 3 read about four states per chunk at 16k tokens). Reading one
//! state per chunk (these members and gated DeltaNet without a lift) with tensor cores and
//! `Dk ≤ 64`, pass 3 is `llc_out_direct_tc`: a block copies its four tiles (Q, K, V, the state)
//! into shared memory at once and keeps the scores in registers as the A operand of `P·V`.
//!
//! In the tf32 and bf16 modes `llc_states_tc` and `llc_out_tc` do the products of passes 1 and 3
//! on tensor cores (tf32 `mma.sync`, f32 accumulation), and gated DeltaNet's sequential pass runs
//! as `llc_delta_h_tc` (its two products per chunk and level as tf32 `mma.sync`; the state stays
//! f32); the WY/UT kernel and the lift's output kernel likewise (`llc_wy_tc`, `llc_out_dl_tc`).
//!
//! So the base mixers and the lifts share every pass; the lift costs one `CH × D_k × D_v` product
//! per set bit of the chunk index (`O(T log T)` work) and the tree holds `< 2 T/CH` states per
//! (batch, head) (`O(T)` memory). Work is parallel over `T/CH × B·H × ⌈D_v/64⌉` blocks; only
//! the `⌊log₂(T/CH)⌋` tree launches are ordered.

use cudarc::driver::{CudaFunction, CudaView, DeviceRepr, LaunchConfig};
use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::{Precision, Result};

use super::FAMILY;
use super::chunked::ChunkedInputs;
use crate::forms::input_opt;
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{GpuReal, err, gpu, int, launch, max_dynamic_smem, opt_in};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors, bf16};

/// Most bytes of chunk states the form allocates.
const MAX_TREE_BYTES: usize = 48 << 30;

/// Chunk length of the kernels for this scalar type (`Llc<T>::CH` in the source).
fn chunk_len<F: GpuReal>() -> usize {
    if std::mem::size_of::<F>() == 8 { 32 } else { 64 }
}

/// Tree entries per (batch, head): `Σ_e ⌊nc / 2^e⌋` over the levels that are read.
fn tree_entries(nc: usize) -> usize {
    (0..usize::BITS).map(|e| nc >> e).take_while(|&c| c > 0).sum()
}

/// The limits of these kernels: `states` chunk states of `Dk × Dv` per (batch, head) within
/// [`MAX_TREE_BYTES`], indices within `i32`, `B·H` within a grid dimension.
fn check_sizes<F: GpuReal>([b, t, h, dk, dv]: [usize; 5], states: usize) -> Result<()> {
    let bh = b * h;
    let bytes = bh * states * dk * dv * std::mem::size_of::<F>();
    if bytes > MAX_TREE_BYTES {
        return Err(err(
            FAMILY,
            format!(
                "the chunked form needs {bytes} bytes of chunk states (T = {t}, B·H = {bh}, Dk = {dk}, Dv = {dv}); \
                 at most {MAX_TREE_BYTES} are allocated: run fewer batch rows or heads per call"
            ),
        ));
    }
    int(FAMILY, "B·T·H·max(Dk, Dv)", b * t * h * dk.max(dv))?;
    if bh > 65535 {
        return Err(err(FAMILY, format!("the chunked form takes B·H ≤ 65535 per call, got {bh}")));
    }
    Ok(())
}

/// `[T, H, Dk, Dv, chunks, B·H]` as the kernels' `int` arguments (an error names the one too large).
fn kernel_ints(v: [usize; 6]) -> Result<[i32; 6]> {
    let names = ["T", "H", "Dk", "Dv", "chunks", "B·H"];
    let mut out = [0; 6];
    for ((o, n), name) in out.iter_mut().zip(v).zip(names) {
        *o = int(FAMILY, name, n)?;
    }
    Ok(out)
}

/// Whether the products run on tensor cores: the tf32 and bf16 modes, with f32 data.
fn tensor_cores<F: GpuReal>(p: Precision) -> bool {
    p != Precision::Exact && F::ELEM == "f32"
}

/// NVRTC options that fix the chunk kernels' head dims at compile time (`LLC_FIX_DIMS` in
/// `loglinear_chunk.cuh`): one module per (Dk, Dv), compiled on first use.
fn fixed_dims(dk: usize, dv: usize) -> [String; 2] {
    [format!("-DLLC_DK={dk}"), format!("-DLLC_DV={dv}")]
}

/// Runs the three passes; returns `y` `[B, T, H, Dv]`.
pub(crate) fn run<F: GpuReal>(ll: &LogLinear, x: &ChunkedInputs<'_, F>, p: Precision) -> Result<Pooled<F>> {
    let [b, t, h, dk, dv] = x.dims;
    let ch = chunk_len::<F>();
    let nc = t.div_ceil(ch);
    let bh = b * h;
    let lifted = ll.lift.is_some();
    // The tree of chunk states, or (without a lift) one state per chunk.
    let entries = if lifted { tree_entries(nc) } else { nc };
    check_sizes::<F>(x.dims, entries)?;
    let g = gpu()?;
    let dims = fixed_dims(dk, dv);
    let k =
        |name: &str| g.kernel(FAMILY, &kernels::LOGLINEAR_CHUNKED, &dims, &format!("{name}_{}", F::SUFFIX));
    debug_assert!(x.g.is_some() || ll.base == Base::LinearAttention);
    let (gv, has_g) = x.g_view();
    let levels = x.lam.as_ref().map_or(1, |(_, n)| *n);
    let mut tree = pool::take::<F>(FAMILY, bh * entries * dk * dv)?;
    let mut decays = pool::take::<f64>(FAMILY, bh * entries)?;
    let mut y = pool::take::<F>(FAMILY, b * t * h * dv)?;
    let tiles = |n: usize| n.div_ceil(64) as u32;
    let [ti, hi, dki, dvi, nci, bhi] = kernel_ints([t, h, dk, dv, nc, bh])?;
    let block = (256, 1, 1);
    let (kv, vv) = (x.k.view(), x.v.view());
    let (states, threads) = if tensor_cores::<F>(p) { ("llc_states_tc", 128) } else { ("llc_states", 256) };
    let cfg = LaunchConfig {
        grid_dim: (nc as u32, bhi as u32, tiles(dk) * tiles(dv)),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(g, FAMILY, k(states)?, cfg;
        &kv, &vv, &gv, &has_g, &mut *tree, &mut *decays, &ti, &hi, &dki, &dvi, &nci)?;
    if !lifted {
        // Without a lift each chunk reads one state: the level-0 entries become the states
        // entering the chunks (`llc_scan`, in place) and pass 3 reads them directly.
        scan(&k("llc_scan")?, &mut tree, &decays, [dk, dv], [dki, dvi, nci, bhi])?;
        outputs(ll, x, &vv, &tree, &decays, levels, false, true, p, &mut y)?;
        return Ok(y);
    }
    let tree_fn = k("llc_tree")?;
    for e in 1..usize::BITS as usize {
        let cnt = nc >> e;
        // Level e is read as the lower half of a level-(e + 1) block only, which needs
        // ⌊nc / 2^(e+1)⌋ ≥ 1 — but computing one more level is harmless and keeps this simple.
        if cnt == 0 {
            break;
        }
        let cfg =
            LaunchConfig { grid_dim: (cnt as u32, bhi as u32, 1), block_dim: block, shared_mem_bytes: 0 };
        let ei = e as i32;
        launch!(g, FAMILY, tree_fn.clone(), cfg; &mut *tree, &mut *decays, &ei, &bhi, &dki, &dvi, &nci)?;
    }
    outputs(ll, x, &vv, &tree, &decays, levels, true, false, p, &mut y)?;
    Ok(y)
}

/// The bf16 mode of linear attention and Mamba-2 without a lift, `Dk ≤ 64`: `llc_states_tc_bf16`
/// and `llc_out_direct_tc_bf16` read `q`, `k`, `v` as they are stored and the latter writes a bf16
/// `y` (no f32 copies of the activations or of `y`; a bf16 value is exact in tf32, so the products
/// are those of the f32 path on the same values); the states and the scan stay f32. `None` where
/// this path does not apply (a lift, gated DeltaNet, `Dk > 64`, an empty tensor): the caller then
/// takes the general path.
pub(crate) fn run_bf16(ll: &LogLinear, x: &DeviceTensors) -> Result<Option<AnyDeviceTensor>> {
    if ll.lift.is_some() || ll.base == Base::GatedDeltaNet {
        return Ok(None);
    }
    let (Some(AnyDeviceTensor::Bf16(q)), Some(AnyDeviceTensor::Bf16(k)), Some(AnyDeviceTensor::Bf16(v))) =
        (x.get("q"), x.get("k"), x.get("v"))
    else {
        return Ok(None);
    };
    let (b, t, h, dk) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let dv = v.shape()[3];
    if dk > 64 || b * t * h * dk * dv == 0 {
        return Ok(None);
    }
    let g = if ll.base.has_decay() { input_opt::<f32>(x, "g")? } else { None };
    let zero = pool::zeros::<f32>(FAMILY, 1)?;
    let (gv, has_g) = (g.as_ref().map_or_else(|| zero.slice(0..1), |d| d.view()), g.is_some() as i32);
    let nc = t.div_ceil(64);
    let bh = b * h;
    check_sizes::<f32>([b, t, h, dk, dv], nc)?;
    let gpu = gpu()?;
    let dims = fixed_dims(dk, dv);
    let kernel = |name: &str| gpu.kernel(FAMILY, &kernels::LOGLINEAR_CHUNKED, &dims, name);
    let [ti, hi, dki, dvi, nci, bhi] = kernel_ints([t, h, dk, dv, nc, bh])?;
    let mut states = pool::take::<f32>(FAMILY, bh * nc * dk * dv)?;
    let mut decays = pool::take::<f64>(FAMILY, bh * nc)?;
    let (qv, kv, vv) = (q.view(), k.view(), v.view());
    let cfg = LaunchConfig {
        grid_dim: (nc as u32, bhi as u32, (dk.div_ceil(64) * dv.div_ceil(64)) as u32),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(gpu, FAMILY, kernel("llc_states_tc_bf16")?, cfg;
        &kv, &vv, &gv, &has_g, &mut *states, &mut *decays, &ti, &hi, &dki, &dvi, &nci)?;
    scan(&kernel("llc_scan_f32")?, &mut states, &decays, [dk, dv], [dki, dvi, nci, bhi])?;
    let mut y = pool::take::<bf16>(FAMILY, b * t * h * dv)?;
    let f = kernel("llc_out_direct_tc_bf16")?;
    out_direct(
        ll,
        f,
        [nc, dv],
        [ti, hi, dki, dvi, nci, bhi],
        [&qv, &kv, &vv],
        (&gv, has_g),
        &states,
        &mut y,
    )?;
    Ok(Some(AnyDeviceTensor::Bf16(DeviceTensor::from_pooled(y, &[b, t, h, dv])?)))
}

/// Pass 3 (`llc_out`, or `llc_out_tc` on tensor cores in the tf32 and bf16 modes with f32 data):
/// `y` from the chunks and the states they read — the tree (`direct = false`), or the state entering
/// each chunk (`direct = true`, gated DeltaNet, with `v` its new values).
#[allow(clippy::too_many_arguments)]
pub(crate) fn outputs<F: GpuReal>(
    ll: &LogLinear,
    x: &ChunkedInputs<'_, F>,
    v: &CudaView<'_, F>,
    states: &Pooled<F>,
    decays: &Pooled<f64>,
    levels: usize,
    lifted: bool,
    direct: bool,
    p: Precision,
    y: &mut Pooled<F>,
) -> Result<()> {
    let [_, t, h, dk, dv] = x.dims;
    let nc = t.div_ceil(chunk_len::<F>());
    let g = gpu()?;
    let ((gv, has_g), lv) = (x.g_view(), x.lam_view());
    let (ti, hi, dki, dvi, nci, bh) =
        (t as i32, h as i32, dk as i32, dv as i32, nc as i32, (x.dims[0] * h) as u32);
    let (li, lifted, direct) = (int(FAMILY, "L", levels)?, lifted as i32, direct as i32);
    let scale = ll.scale;
    let (qv, kv) = (x.q.view(), x.k.view());
    if direct == 1 && lifted == 0 && tensor_cores::<F>(p) && dk <= 64 {
        // One state per chunk and Dk ≤ 64: every tile of a block copied at once (`llc_out_direct_tc`).
        let f =
            g.kernel(FAMILY, &kernels::LOGLINEAR_CHUNKED, &fixed_dims(dk, dv), "llc_out_direct_tc_f32")?;
        let ints = [ti, hi, dki, dvi, nci, bh as i32];
        return out_direct(ll, f, [nc, dv], ints, [&qv, &kv, v], (&gv, has_g), states, y);
    }
    let (name, threads) = if tensor_cores::<F>(p) { ("llc_out_tc", 128) } else { ("llc_out", 256) };
    let f =
        g.kernel(FAMILY, &kernels::LOGLINEAR_CHUNKED, &fixed_dims(dk, dv), &format!("{name}_{}", F::SUFFIX))?;
    let cfg = LaunchConfig {
        grid_dim: (nc as u32, bh, dv.div_ceil(64) as u32),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(g, FAMILY, f, cfg;
        &qv, &kv, v, &gv, &has_g, &lv, &**states, &**decays, &mut **y,
        &ti, &hi, &dki, &dvi, &li, &lifted, &direct, &nci, &scale)
}

/// Dynamic shared memory of `llc_delta_h` (the layout in the kernel): `levels` state tiles, two
/// buffers of the chunk's `W`, `K` (rows padded to `Dk + 1`), `U` and `g`, the new values and the
/// decays.
pub(crate) fn delta_h_smem<F: GpuReal>(dk: usize, levels: usize) -> usize {
    let ch = chunk_len::<F>();
    (levels * dk * 16 + 4 * ch * (dk + 1) + 2 * ch * 16 + 2 * ch + ch * 17 + ch) * std::mem::size_of::<F>()
}

/// Dynamic shared memory of `llc_delta_h_tc` (f32; the layout in the kernel) with `stages`
/// buffers: `levels` state tiles of `DKP × 24` (`DKP` = `Dk` rounded up to 16), per buffer the
/// chunk's `W` and `K` (rows padded to `LDK ≡ 4 (mod 32)`) and `U`; the new values `[64][24]`
/// and two buffers of decays (`[2][65]`: the decay warp fills chunk j + 1's during chunk j).
pub(crate) fn delta_h_tc_smem(dk: usize, levels: usize, stages: usize) -> usize {
    let (ch, dkp) = (64, dk.div_ceil(16) * 16);
    let ldk = dkp.div_ceil(32) * 32 + 4;
    (levels * dkp * 24 + stages * (2 * ch * ldk + ch * 16) + ch * 24 + 2 * (ch + 1)) * 4
}

/// Pass 2 without a lift (`llc_scan`, function `f`): every entry of the chunk states `[B·H][NC][Dk][Dv]`
/// becomes, in place, the state entering its chunk. `ints`: `[Dk, Dv, chunks, B·H]`.
fn scan<F: GpuReal>(
    f: &CudaFunction,
    states: &mut Pooled<F>,
    decays: &Pooled<f64>,
    [dk, dv]: [usize; 2],
    [dki, dvi, nci, bhi]: [i32; 4],
) -> Result<()> {
    let cfg = LaunchConfig {
        grid_dim: ((dk * dv).div_ceil(256) as u32, bhi as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(gpu()?, FAMILY, f.clone(), cfg; &mut **states, &**decays, &dki, &dvi, &nci)
}

/// Pass 3 with one state per chunk and `Dk ≤ 64` (`llc_out_direct_tc_f32` or `_bf16`, function `f`):
/// `q`, `k`, `v` and `y` of type `T` (f32, or bf16 as stored), `g` and the states entering the
/// chunks of type `S` (f32). Dynamic shared memory: the Q, K, V tiles `[64][64]` of `T` and the
/// state tile of f32 (`lld_smem` in the kernel). `ints`: `[T, H, Dk, Dv, chunks, B·H]`.
#[allow(clippy::too_many_arguments)]
fn out_direct<T: DeviceRepr, S: DeviceRepr>(
    ll: &LogLinear,
    f: CudaFunction,
    [nc, dv]: [usize; 2],
    [ti, hi, dki, dvi, nci, bhi]: [i32; 6],
    [q, k, v]: [&CudaView<'_, T>; 3],
    (g, has_g): (&CudaView<'_, S>, i32),
    states: &Pooled<S>,
    y: &mut Pooled<T>,
) -> Result<()> {
    opt_in(FAMILY, &f)?;
    let cfg = LaunchConfig {
        grid_dim: (nc as u32, bhi as u32, dv.div_ceil(64) as u32),
        block_dim: (128, 1, 1),
        shared_mem_bytes: (3 * 64 * 64 * std::mem::size_of::<T>() + 64 * 64 * 4) as u32,
    };
    let scale = ll.scale;
    launch!(gpu()?, FAMILY, f, cfg;
        q, k, v, g, &has_g, &**states, &mut **y, &ti, &hi, &dki, &dvi, &nci, &scale)
}

/// Dynamic shared memory of `llc_wy_tc` (`X`, `Lm`, `Tt`: `[64][68]`, `[64][65]`, `[64][68]`
/// floats) and of `llc_out_dl_tc` (three `[64][68]` tiles): the larger of the two.
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
    let smem = delta_h_smem::<F>(dk, levels);
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
    // The sequential pass on tensor cores in the tf32 / bf16 modes, loading three chunks ahead
    // where that fits in shared memory, else two (the FMA kernel when neither fits).
    let limit = max_dynamic_smem();
    let stages = if tc { (2..=3).rev().find(|&s| delta_h_tc_smem(dk, levels, s) <= limit) } else { None };
    let (name, smem, stages) = match stages {
        Some(s) => ("llc_delta_h_tc", delta_h_tc_smem(dk, levels, s), s),
        None => ("llc_delta_h", smem, 0),
    };
    // In the bf16 mode k holds bf16 values, exact in tf32: the pass takes their bits as they are.
    let f = if stages > 0 && p == Precision::Bf16 {
        let opts = [dims[0].clone(), dims[1].clone(), "-DDH_K_TF32=1".to_string()];
        g.kernel(FAMILY, &kernels::LOGLINEAR_DELTA, &opts, &format!("{name}_{}", F::SUFFIX))?
    } else {
        k(name)?
    };
    opt_in(FAMILY, &f)?;
    let cfg = LaunchConfig {
        grid_dim: (bh as u32, dv.div_ceil(16) as u32, 1),
        // llc_delta_h_tc: eight computing warps and the decay warp (LDT_THREADS).
        block_dim: (if stages > 0 { 288 } else { 256 }, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let (lifted_i, levels_i, slots_i) = (lifted as i32, levels as i32, slots as i64);
    if stages > 0 {
        let st = stages as i32;
        launch!(g, FAMILY, f, cfg; &kv, &gv, &has_g, &*w, &*u, &mut *vn, &mut *hs, &ti, &hi, &dki, &dvi, &nci,
            &lifted_i, &levels_i, &slots_i, &st)?;
    } else {
        launch!(g, FAMILY, f, cfg; &kv, &gv, &has_g, &*w, &*u, &mut *vn, &mut *hs, &ti, &hi, &dki, &dvi, &nci,
            &lifted_i, &levels_i, &slots_i)?;
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
