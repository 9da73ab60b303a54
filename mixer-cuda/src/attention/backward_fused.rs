//! The backward pass of attention's `fast` form on tensor cores (`kernels/attention_backward_fused.cu`),
//! for the `tf32` and `bf16` modes, FlashAttention-2 style, deterministic (no atomics).
//!
//! With `λ = σ·log₂e` and the keys `u_{t,s} = q_t · k_s`, the forward's tensor-core kernel
//! ([`super::fused`]) is run once more with a statistics buffer (or, given what a forward run for
//! the backward saved, [`Saved`], that forward's `y` and a copy of its statistics are taken) and
//! leaves per row
//! `m_t = max_s λ u_{t,s}` and `g_t = log₂ Σ_s 2^{λ u_{t,s} − m_t}` over the visible keys
//! (`s ≤ t`, `t − s < w`), so that `P_{t,s} = 2^{min(λ u_{t,s} − m_t, 0) − g_t}` (the CPU's
//! `e^{σ q_t·k_s − LSE_t}` with `LSE_t = (m_t + g_t)·ln 2`, kept in two parts so that it cannot
//! overflow; the clamp only acts where a product rounds differently from the forward's). Then
//! `D_t = dy_t · y_t` (`atc_delta`, from the forward's `y` in the mode's storage),
//! `dS_{t,s} = P_{t,s}(dy_t · v_s − D_t)`, `dv_s = Σ_t P_{t,s} dy_t`, `dk_s = σ Σ_t dS_{t,s} q_t`
//! (`atc_dkdv`, one block per key tile, over the query tiles that see it) and
//! `dq_t = σ Σ_s dS_{t,s} k_s` (`atc_dq`, one block per query tile, over its key tiles). Every
//! product runs on `mma.sync` (bf16 `m16n8k16` or tf32 `m16n8k8`, `f32` accumulation); the gradients
//! are `f32`.
//!
//! [`plan`] says where these kernels run (the same sizes as the forward's tensor-core kernels:
//! `Dk = Dv ∈ {32, 64, 96, 128}`, a positive scale, activations stored as the mode computes), with
//! which tiles and shared memory; elsewhere [`super::backward`]'s exact kernels run. Extra memory:
//! `y` (the mode's storage) and four `f32` per row (`m`, `g`, `D`, one unused: a 16-byte copy).

use cudarc::driver::LaunchConfig;
use mixer_core::mixers::attention::Attention;
use mixer_core::{Precision, Requires, Result, grad_name};
use serde::Serialize;

use super::common::{FAMILY, Kernel, Storage, window_arg};
use super::fused;
use crate::kernels;
use crate::pool;
use crate::runtime::{err, gpu, int, launch};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors, bf16};

/// The tiles of `atc_dkdv` or `atc_dq`: warps per block (`ATC_WARPS`, 16 rows each: keys in
/// `atc_dkdv`, queries in `atc_dq`) and columns per streamed tile (`ATC_BN`: queries in
/// `atc_dkdv`, keys in `atc_dq`). Each streamed column tile is read from L2 once per block, so the
/// bytes a kernel reads grow as `T² D / rows per block`; the score, `dP` and gradient accumulators
/// of a warp (`2·BN/4 + 2·D/2` floats a thread in `atc_dkdv`) bound the columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Tiles {
    /// Warps per block.
    pub warps: usize,
    /// Columns per streamed tile.
    pub bn: usize,
}

impl Tiles {
    /// Rows per block.
    pub fn rows(self) -> usize {
        16 * self.warps
    }
}

/// Warps per block of `atc_delta` (one row each).
const DELTA_WARPS: usize = 8;

/// One launch of a plan: the `extern "C"` function, its NVRTC options, grid, threads per block
/// and dynamic shared memory.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Launch {
    /// The function.
    pub function: String,
    /// NVRTC options (`-D…`).
    pub options: Vec<String>,
    /// Grid (x, y).
    pub grid: [u32; 2],
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory (bytes).
    pub shared_mem: usize,
}

/// The tensor-core backward for one shape and mode: the forward with statistics, then
/// `atc_delta`, `atc_dkdv`, `atc_dq`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackwardPlan {
    /// The forward's launch ([`fused::plan`]), run with the statistics buffer.
    pub forward: super::fast::Plan,
    /// The tiles of `atc_dkdv` and of `atc_dq` ([`tiles`]).
    pub tiles: [Tiles; 2],
    /// `D_t = dy_t · y_t`.
    pub delta: Launch,
    /// `d_k`, `d_v` per key tile.
    pub dkdv: Launch,
    /// `d_q` per query tile.
    pub dq: Launch,
}

/// The tiles of (`atc_dkdv`, `atc_dq`) at head dim `d` in mode `p`, the fastest of a sweep of warps
/// {2, 4, 8} × columns {32, 64, 128} per kernel on an H100 (docs/gradients.md, "Tiles"; at
/// `D = 64` two shapes agreed): bf16 at `D = 64` 4 warps with 64 columns and 4 with 128, at
/// `D = 128` 4 with 64 for both; tf32 at `D = 64` 4 with 32 and 8 with 128. Elsewhere (the
/// exact mode's split products, tf32 at `D = 128`, and the unmeasured head dims 32 and 96) 8 warps
/// with 64 columns up to `D = 64` and 32 above, for both.
pub fn tiles(d: usize, p: Precision) -> (Tiles, Tiles) {
    let t = |warps, bn| Tiles { warps, bn };
    match (p, d) {
        (Precision::Bf16, 64) => (t(4, 64), t(4, 128)),
        (Precision::Bf16, 128) => (t(4, 64), t(4, 64)),
        (Precision::Tf32, 64) => (t(4, 32), t(8, 128)),
        _ => (default_tiles(d), default_tiles(d)),
    }
}

/// 8 warps with 64 columns up to `D = 64`, 32 above: the tiles where none were measured faster,
/// and where the measured ones do not fit a device's shared memory.
fn default_tiles(d: usize) -> Tiles {
    Tiles { warps: 8, bn: if d <= 64 { 64 } else { 32 } }
}

/// Dynamic shared memory (bytes) of a kernel with tiles `t` at head dim `d`, for the mode's
/// storage (`bf16`: rows of `d` bf16; tf32: rows of `d + 8` floats): the block's rows of two
/// inputs, two stages of `t.bn` rows of two inputs, and with `stats` (`atc_dkdv`) two stages of
/// `t.bn` statistics (16 bytes each).
pub fn smem(d: usize, t: Tiles, p: Precision, stats: bool) -> usize {
    let row = if p == Precision::Bf16 { 2 * d } else { 4 * (d + 8) };
    (2 * t.rows() + 4 * t.bn) * row + if stats { 2 * t.bn * 16 } else { 0 }
}

/// The tensor-core backward for `shape = [B, T, H, Dk, Dv]` in mode `p` on activations stored as
/// `storage`, with `limit` bytes of dynamic shared memory per block and `wgmma` where the device has
/// Hopper's warpgroup MMA (for the forward's launch), or `None` where the FMA kernels run: a
/// storage other than the mode's (f32 for exact and tf32, bf16 for bf16), sizes the forward's
/// `mma.sync` kernels do not take ([`fused::applies`], [`fused::plan`]), a negative scale (the statistics are a maximum of `λ u` for
/// `λ ≥ 0`), tiles beyond `limit`, or nothing to compute. The exact mode's kernels are the
/// `tf32x3` ones: tf32's, every product split into three tf32 products.
#[rustfmt::skip]
pub fn plan(a: &Attention, shape: [usize; 5], p: Precision, storage: Storage, limit: usize, wgmma: bool)
    -> Result<Option<BackwardPlan>> {
    let [b, t, h, d, dv] = shape;
    let mode_storage = matches!(
        (p, storage),
        (Precision::Exact | Precision::Tf32, Storage::F32) | (Precision::Bf16, Storage::Bf16)
    );
    // The backward's kernels are mma.sync's, at mma.sync's head dims (not the wgmma forward's 256).
    if !mode_storage || a.scale(d) < 0.0 || !fused::applies(d, dv) {
        return Ok(None);
    }
    let Some(forward) = fused::plan(a, shape, p, wgmma)? else { return Ok(None) };
    let (tk, tq) = tiles(d, p);
    let fit = |t: Tiles, stats| if smem(d, t, p, stats) <= limit { t } else { default_tiles(d) };
    let (tk, tq) = (fit(tk, true), fit(tq, false));
    let (sm_dkdv, sm_dq) = (smem(d, tk, p, true), smem(d, tq, p, false));
    if sm_dkdv.max(sm_dq) > limit {
        return Ok(None);
    }
    let suffix = match p {
        Precision::Bf16 => "bf16",
        Precision::Tf32 => "tf32",
        Precision::Exact => "tf32x3",
    };
    // (atc_delta takes ATC_D alone: it is compiled with atc_dkdv's options, one module fewer)
    let kernel = |name: &str, tl: Tiles, grid: [usize; 2], block: usize, shared_mem: usize| {
        Ok::<_, mixer_core::Error>(Launch {
            function: format!("{name}_{suffix}"),
            options: vec![format!("-DATC_D={d}"), format!("-DATC_WARPS={}", tl.warps), format!("-DATC_BN={}", tl.bn)],
            grid: [int(FAMILY, "blocks", grid[0])? as u32, int(FAMILY, "B·H", grid[1])? as u32],
            block: block as u32,
            shared_mem,
        })
    };
    Ok(Some(BackwardPlan {
        delta: kernel("atc_delta", tk, [(b * t * h).div_ceil(DELTA_WARPS), 1], 32 * DELTA_WARPS, 0)?,
        dkdv: kernel("atc_dkdv", tk, [t.div_ceil(tk.rows()), b * h], 32 * tk.warps, sm_dkdv)?,
        dq: kernel("atc_dq", tq, [t.div_ceil(tq.rows()), b * h], 32 * tq.warps, sm_dq)?,
        forward,
        tiles: [tk, tq],
    }))
}

/// What [`run`] leaves: the `f32` gradient buffers it wrote (`[B, T, H, D]`, those asked for),
/// and in the exact mode the device address of the overflow flag with the statistics buffer that
/// holds it: where the flag is set the tensor-core kernels wrote nothing, and the caller launches
/// the FMA kernels on the same buffers to run instead (`super::backward`'s `Fallback`).
pub struct Grads {
    /// `d_q`, `d_k`, `d_v`.
    pub q: Option<pool::Pooled<f32>>,
    pub k: Option<pool::Pooled<f32>>,
    pub v: Option<pool::Pooled<f32>>,
    /// The flag's address (0: none, not the exact mode).
    pub flag: u64,
    /// The buffer that holds the flag, kept until the FMA kernels are enqueued.
    pub stats: pool::Pooled<f32>,
    dims: [usize; 4],
}

impl Grads {
    /// The gradients as device tensors, those `req` asks for.
    pub fn into_tensors(self, req: &Requires) -> Result<DeviceTensors> {
        let mut out = DeviceTensors::new();
        for (name, g) in [("q", self.q), ("k", self.k), ("v", self.v)] {
            if let Some(g) = g.filter(|_| req.wants(name)) {
                out.insert(grad_name(name), AnyDeviceTensor::F32(DeviceTensor::from_pooled(g, &self.dims)?));
            }
        }
        Ok(out)
    }
}

/// The length of a statistics buffer of `rows` rows: `[rows][4]` floats (`m`, `g`, then `D` and
/// one unused, written by the backward) and the exact mode's overflow flag after them (0 in the
/// other modes).
pub fn stats_len(rows: usize) -> usize {
    fused::flag_index(rows) + 1
}

/// The first step of the backward, which a forward run for a backward takes instead of its plain
/// launch ([`crate::run_device_saving`]): the forward's kernel of `pl` with a fresh statistics
/// buffer ([`stats_len`], the flag zeroed first). Returns `y` (the plain forward's bits) and the
/// buffer.
pub fn forward_with_stats(
    pl: &BackwardPlan,
    a: &Attention,
    x: &DeviceTensors,
    shape: [usize; 5],
) -> Result<(AnyDeviceTensor, pool::Pooled<f32>)> {
    let [b, t, h, ..] = shape;
    let at = fused::flag_index(b * h * t);
    let mut stats = pool::take::<f32>(FAMILY, stats_len(b * h * t))?;
    gpu()?
        .stream()
        .memset_zeros(&mut stats.slice_mut(at..at + 1))
        .map_err(|e| err(FAMILY, format!("zeroing the overflow flag: {e}")))?;
    let y = fused::launch_with_stats(a, x, &pl.forward, shape, Some(&mut *stats), None)?;
    Ok((y, stats))
}

/// What a forward run for the backward left ([`forward_with_stats`]): its `y` (in the mode's
/// storage) and statistics buffer.
pub struct Saved<'a> {
    pub y: &'a AnyDeviceTensor,
    pub stats: &'a DeviceTensor<f32>,
}

impl Saved<'_> {
    /// The host's checks of what was saved against the call's shape and storage `dtype` (that of
    /// `q, k, v` and `dy`): `y` as the forward returns it (`[B, T, H, Dv]` in that storage), the
    /// statistics of [`stats_len`]`(B·H·T)` floats.
    fn check(&self, shape: [usize; 5], dtype: &str) -> Result<()> {
        use mixer_core::Error;
        let [b, t, h, _, dv] = shape;
        if self.y.dtype() != dtype || self.y.shape() != [b, t, h, dv] {
            return Err(Error::Value {
                name: mixer_core::grad::SAVED_OUTPUT.into(),
                constraint: format!(
                    "with `{}`, the saving forward's output: a {dtype} device tensor of shape [{b}, {t}, {h}, {dv}]",
                    mixer_core::grad::SAVED_STATISTICS
                ),
                found: format!(
                    "a {} device tensor of shape {}",
                    self.y.dtype(),
                    mixer_core::error::fmt_shape(self.y.shape())
                ),
            });
        }
        let want = stats_len(b * h * t);
        if self.stats.shape() != [want] {
            return Err(Error::Value {
                name: mixer_core::grad::SAVED_STATISTICS.into(),
                constraint: format!(
                    "the saving forward's statistics at B·H·T = {}: {want} floats (4 per row and a flag)",
                    b * h * t
                ),
                found: format!("shape {}", mixer_core::error::fmt_shape(self.stats.shape())),
            });
        }
        Ok(())
    }
}

/// Runs the plan `pl` (from [`plan`]) on `x` and `dy` (all bf16 for the bf16 kernels, f32 for
/// exact and tf32): `d_q`, `d_k`, `d_v` (those `req` asks for) as `f32`, nothing waited for. With
/// `saved` (a forward run for the backward on the same inputs and mode) its `y` and a copy of its
/// statistics are used, else the forward runs first ([`forward_with_stats`]). The exact mode's
/// forward sets a flag after the statistics where some `q·k` is beyond f32's range; the
/// tensor-core kernels then skip ([`Grads`]).
pub fn run(
    pl: &BackwardPlan,
    a: &Attention,
    x: &DeviceTensors,
    dy: &AnyDeviceTensor,
    req: &Requires,
    shape: [usize; 5],
    saved: Option<Saved<'_>>,
) -> Result<Grads> {
    let [b, t, h, d, _] = shape;
    let g = gpu()?;
    let rows = b * h * t;
    let split = pl.forward.kernel == Kernel::MmaTf32x3;
    let at = fused::flag_index(rows);
    let (y, mut stats) = match saved {
        Some(s) => {
            s.check(shape, dy.dtype())?;
            // A copy: the backward writes `D` into its statistics, and the saved ones may serve
            // several backwards.
            let mut stats = pool::take::<f32>(FAMILY, stats_len(rows))?;
            g.stream()
                .memcpy_dtod(&s.stats.view(), &mut stats.slice_mut(0..stats_len(rows)))
                .map_err(|e| err(FAMILY, format!("copying the saved statistics: {e}")))?;
            (s.y.clone(), stats)
        }
        None => forward_with_stats(pl, a, x, shape)?,
    };
    let f = |l: &Launch| {
        let func = g.kernel(FAMILY, &kernels::ATTENTION_BACKWARD_FUSED, &l.options, &l.function)?;
        if l.shared_mem > 48 << 10 {
            crate::runtime::opt_in(FAMILY, &func)?;
        }
        let cfg = LaunchConfig {
            grid_dim: (l.grid[0], l.grid[1], 1),
            block_dim: (l.block, 1, 1),
            shared_mem_bytes: l.shared_mem as u32,
        };
        Ok::<_, mixer_core::Error>((func, cfg))
    };
    let (ti, hi, w) = (int(FAMILY, "T", t)?, int(FAMILY, "H", h)?, window_arg(a, t));
    let scale = a.scale(d);
    let (sl2, sc) = ((scale * std::f64::consts::LOG2_E) as f32, scale as f32);
    let n = b * t * h * d;
    let rows_i = rows as i64;
    let (want_q, want_kv) = (req.wants("q"), req.wants("k") || req.wants("v"));
    let mut gq = pool::take::<f32>(FAMILY, if want_q { n } else { 0 })?;
    let mut gk = pool::take::<f32>(FAMILY, if want_kv { n } else { 0 })?;
    let mut gv = pool::take::<f32>(FAMILY, if want_kv { n } else { 0 })?;
    // The flag's address for the exact mode's kernels (0: none).
    let flag = if split {
        use cudarc::driver::DevicePtr;
        let stream = g.stream();
        let (p, _guard) = stats.device_ptr(&stream);
        p + 4 * at as u64
    } else {
        0
    };
    // One argument list for both storages.
    macro_rules! steps {
        ($ty:ty) => {{
            let typed = |name: &str| x.get(name).ok_or_else(|| err(FAMILY, format!("internal: {name}")));
            let (q, k, v) = (typed("q")?.typed::<$ty>("q")?, typed("k")?.typed::<$ty>("k")?, typed("v")?.typed::<$ty>("v")?);
            let (dyt, yt) = (dy.typed::<$ty>("dy")?, y.typed::<$ty>("y")?);
            let (qv, kv, vv, dyv, yv) = (q.view(), k.view(), v.view(), dyt.view(), yt.view());
            let (func, cfg) = f(&pl.delta)?;
            launch!(g, FAMILY, func, cfg; &yv, &dyv, &mut *stats, &ti, &hi, &rows_i)?;
            if want_kv {
                let (func, cfg) = f(&pl.dkdv)?;
                launch!(g, FAMILY, func, cfg;
                    &qv, &kv, &vv, &dyv, &*stats, &mut *gk, &mut *gv, &ti, &hi, &w, &sl2, &sc, &flag)?;
            }
            if want_q {
                let (func, cfg) = f(&pl.dq)?;
                launch!(g, FAMILY, func, cfg;
                    &qv, &kv, &vv, &dyv, &*stats, &mut *gq, &ti, &hi, &w, &sl2, &sc, &flag)?;
            }
        }};
    }
    if pl.forward.kernel == Kernel::MmaTf32 || split {
        steps!(f32);
    } else {
        steps!(bf16);
    }
    Ok(Grads {
        q: want_q.then_some(gq),
        k: want_kv.then_some(gk),
        v: want_kv.then_some(gv),
        flag,
        stats,
        dims: [b, t, h, d],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mixer_core::mixers::attention::AttentionConfig;

    /// The opt-in dynamic shared memory of the H200 less the static reserve (219 KiB).
    const H200: usize = 219 << 10;

    fn attention(scale: Option<f64>, window: Option<usize>) -> Attention {
        Attention::new("attention", AttentionConfig { window, scale }).unwrap()
    }

    /// Tensor cores at Dk = Dv ∈ {32, 64, 96, 128} in the exact and tf32 modes on f32 and the bf16
    /// mode on bf16 (the exact mode's forward step the split-tf32 kernel at 128 too); the FMA
    /// kernels for another storage, other head dims, negative or huge scales, and tiles that do
    /// not fit.
    #[test]
    fn the_plan_takes_the_forward_tensor_core_sizes() {
        let a = attention(None, Some(100));
        for d in [32, 64, 96, 128] {
            for (p, s, suffix) in [
                (Precision::Exact, Storage::F32, "tf32x3"),
                (Precision::Tf32, Storage::F32, "tf32"),
                (Precision::Bf16, Storage::Bf16, "bf16"),
            ] {
                let pl = plan(&a, [2, 1000, 3, d, d], p, s, H200, true).unwrap().unwrap();
                assert_eq!(pl.dkdv.function, format!("atc_dkdv_{suffix}"), "{d} {p}");
                assert_eq!(pl.dq.grid, [1000usize.div_ceil(pl.tiles[1].rows()) as u32, 6], "{d} {p}");
                assert_eq!(pl.delta.grid, [750, 1], "{d} {p}");
                assert!(pl.dq.options.contains(&format!("-DATC_D={d}")));
                if p == Precision::Exact {
                    assert_eq!(pl.forward.kernel, Kernel::MmaTf32x3, "{d}");
                }
            }
        }
        for (shape, p, s) in [
            ([1, 10, 1, 64, 64], Precision::Exact, Storage::F64),
            ([1, 10, 1, 64, 64], Precision::Tf32, Storage::F64),
            ([1, 10, 1, 64, 64], Precision::Bf16, Storage::F32),
            ([1, 10, 1, 70, 70], Precision::Tf32, Storage::F32),
            ([1, 10, 1, 256, 256], Precision::Bf16, Storage::Bf16),
            ([1, 10, 1, 64, 32], Precision::Tf32, Storage::F32),
            ([1, 0, 1, 64, 64], Precision::Tf32, Storage::F32),
        ] {
            assert!(plan(&a, shape, p, s, H200, true).unwrap().is_none(), "{shape:?} {p} {s:?}");
        }
        let f32_64 =
            |sc| plan(&attention(sc, None), [1, 10, 1, 64, 64], Precision::Tf32, Storage::F32, H200, true);
        assert!(f32_64(Some(-0.5)).unwrap().is_none());
        assert!(f32_64(Some(1e35)).unwrap().is_none());
        assert!(f32_64(Some(0.0)).unwrap().is_some());
        // Measured tiles that do not fit give way to the default ones (tf32's 8 × 128 at D = 64
        // needs 216 KiB); tf32 at D = 128 needs 211 KiB: not without opting in.
        let small = 160 << 10;
        let pl = plan(&a, [1, 10, 1, 64, 64], Precision::Tf32, Storage::F32, small, true).unwrap().unwrap();
        assert_eq!(pl.tiles[1], default_tiles(64));
        assert!(pl.dq.shared_mem <= small);
        assert!(
            plan(&a, [1, 10, 1, 128, 128], Precision::Tf32, Storage::F32, 48 << 10, true).unwrap().is_none()
        );
    }

    /// The tiles of each kernel; the shared memory counted from the layout.
    #[test]
    fn tiles_and_shared_memory_follow_the_head_dim() {
        let eight = |bn| Tiles { warps: 8, bn };
        assert_eq!(tiles(64, Precision::Exact), (eight(64), eight(64)));
        assert_eq!(tiles(128, Precision::Tf32), (eight(32), eight(32)));
        assert_eq!(tiles(96, Precision::Bf16), (eight(32), eight(32)));
        assert_eq!(tiles(64, Precision::Tf32), (Tiles { warps: 4, bn: 32 }, eight(128)));
        // bf16 D = 64, 8 warps: K, V 128 × 64, two stages of Q, dY 64 × 64, and 2 × 64 statistics.
        assert_eq!(smem(64, eight(64), Precision::Bf16, true), (2 * 128 + 4 * 64) * 128 + 2 * 64 * 16);
        assert_eq!(smem(64, eight(64), Precision::Bf16, false), (2 * 128 + 4 * 64) * 128);
        // tf32 D = 128: rows of 136 floats; 4 warps: 64 rows.
        assert_eq!(
            smem(128, Tiles { warps: 4, bn: 32 }, Precision::Tf32, false),
            (2 * 64 + 4 * 32) * 136 * 4
        );
        let a = attention(None, None);
        for (shape, p, s) in [
            ([8, 4096, 16, 128, 128], Precision::Tf32, Storage::F32),
            ([1, 16384, 16, 64, 64], Precision::Bf16, Storage::Bf16),
            ([2, 1000, 3, 96, 96], Precision::Exact, Storage::F32),
        ] {
            let pl = plan(&a, shape, p, s, H200, true).unwrap().unwrap();
            let (tk, tq) = tiles(shape[3], p);
            assert_eq!(pl.tiles, [tk, tq]);
            assert_eq!(
                (pl.dkdv.shared_mem, pl.dkdv.block as usize),
                (smem(shape[3], tk, p, true), 32 * tk.warps)
            );
            assert_eq!(
                (pl.dq.shared_mem, pl.dq.block as usize),
                (smem(shape[3], tq, p, false), 32 * tq.warps)
            );
            assert_eq!(pl.dkdv.grid, [shape[1].div_ceil(tk.rows()) as u32, (shape[0] * shape[2]) as u32]);
            assert_eq!(pl.dq.grid, [shape[1].div_ceil(tq.rows()) as u32, (shape[0] * shape[2]) as u32]);
            assert!(pl.dq.options.contains(&format!("-DATC_WARPS={}", tq.warps)));
            assert!(pl.dq.options.contains(&format!("-DATC_BN={}", tq.bn)));
        }
        let pl =
            plan(&a, [1, 16384, 16, 64, 64], Precision::Bf16, Storage::Bf16, H200, true).unwrap().unwrap();
        assert_eq!(pl.forward.kernel, Kernel::WgmmaBf16);
    }
}
