//! The chunked form of the scalar-decay members (`linear-attention`, `mamba2` and their
//! Fenwick lifts), parallel over chunks: `kernels/loglinear_chunked.cu`, with the helpers of
//! `kernels/loglinear_chunk.cuh`. Gated DeltaNet (`super::delta`) reuses its outputs pass.
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
//! on tensor cores (tf32 `mma.sync`, f32 accumulation).
//!
//! So the base mixers and the lifts share every pass; the lift costs one `CH × D_k × D_v` product
//! per set bit of the chunk index (`O(T log T)` work) and the tree holds `< 2 T/CH` states per
//! (batch, head) (`O(T)` memory). Work is parallel over `T/CH × B·H × ⌈D_v/64⌉` blocks; only
//! the `⌊log₂(T/CH)⌋` tree launches are ordered.

use cudarc::driver::{CudaFunction, CudaView, DeviceRepr, LaunchConfig};
use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::{Precision, Result};

use super::FAMILY;
use super::chunked::{ChunkedInputs, view_or_zero};
use crate::forms::input_opt;
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{GpuReal, err, gpu, int, launch, opt_in};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors, bf16};

/// Most bytes of chunk states the form allocates.
const MAX_TREE_BYTES: usize = 48 << 30;

/// Chunk length of the kernels for this scalar type (`Llc<T>::CH` in the source).
pub(super) fn chunk_len<F: GpuReal>() -> usize {
    if std::mem::size_of::<F>() == 8 { 32 } else { 64 }
}

/// Tree entries per (batch, head): `Σ_e ⌊nc / 2^e⌋` over the levels that are read.
fn tree_entries(nc: usize) -> usize {
    (0..usize::BITS).map(|e| nc >> e).take_while(|&c| c > 0).sum()
}

/// The limits of these kernels: `states` chunk states of `Dk × Dv` per (batch, head) within
/// [`MAX_TREE_BYTES`], indices within `i32`, `B·H` within a grid dimension.
pub(super) fn check_sizes<F: GpuReal>([b, t, h, dk, dv]: [usize; 5], states: usize) -> Result<()> {
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
pub(super) fn kernel_ints(v: [usize; 6]) -> Result<[i32; 6]> {
    let names = ["T", "H", "Dk", "Dv", "chunks", "B·H"];
    let mut out = [0; 6];
    for ((o, n), name) in out.iter_mut().zip(v).zip(names) {
        *o = int(FAMILY, name, n)?;
    }
    Ok(out)
}

/// Whether the products run on tensor cores: the tf32 and bf16 modes, with f32 data.
pub(super) fn tensor_cores<F: GpuReal>(p: Precision) -> bool {
    p != Precision::Exact && F::ELEM == "f32"
}

/// NVRTC options that fix the chunk kernels' head dims at compile time (`LLC_FIX_DIMS` in
/// `loglinear_chunk.cuh`): one module per (Dk, Dv), compiled on first use.
pub(super) fn fixed_dims(dk: usize, dv: usize) -> [String; 2] {
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

/// The bf16 mode's `q`, `k`, `v` as stored and the dims `[B, T, H, Dk, Dv]`, where all three are
/// bf16 (`None` otherwise).
pub(super) fn bf16_qkv(x: &DeviceTensors) -> Option<([&DeviceTensor<bf16>; 3], [usize; 5])> {
    let (Some(AnyDeviceTensor::Bf16(q)), Some(AnyDeviceTensor::Bf16(k)), Some(AnyDeviceTensor::Bf16(v))) =
        (x.get("q"), x.get("k"), x.get("v"))
    else {
        return None;
    };
    let s = q.shape();
    Some(([q, k, v], [s[0], s[1], s[2], s[3], v.shape()[3]]))
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
    let Some(([q, k, v], [b, t, h, dk, dv])) = bf16_qkv(x) else {
        return Ok(None);
    };
    if dk > 64 || b * t * h * dk * dv == 0 {
        return Ok(None);
    }
    let g = if ll.base.has_decay() { input_opt::<f32>(x, "g")? } else { None };
    let zero = pool::zeros::<f32>(FAMILY, 1)?;
    let (gv, has_g) = view_or_zero(g.as_deref(), &zero);
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
pub(super) fn out_direct<T: DeviceRepr, S: DeviceRepr>(
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
