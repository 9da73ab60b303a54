//! The tensor-core forward (`kernels/attention_fused.cu`), FlashAttention-2 style, for the
//! `tf32` and `bf16` modes and the `exact` mode on f32 inputs: a block of warps owns up to 128
//! query rows of one (batch, head) (see [`shape`]); K and V tiles of 64 keys (32 or 128 in one
//! case each, [`keys_per_tile`]) stream through shared memory with `cp.async` (two stages); `mma.sync`
//! computes `QKᵀ` and `PV` (bf16 `m16n8k16` or tf32 `m16n8k8`, `f32` accumulation); the
//! online softmax runs in `f32` with `exp2` (scale·log₂e folded in, the exponent formed from the
//! product rounded as the row maximum's, so that it is never positive); tiles wholly outside the
//! causal window are skipped, masks are applied only on tiles that cross a boundary.
//!
//! On compute capability 9.0 (H100/H200) the bf16 mode at `D ∈ {64, 128, 256}` runs
//! `attn_wgmma_bf16` instead: Hopper's warpgroup MMA (`wgmma.mma_async`, compiled for `sm_90a`), two
//! warpgroups of 64 query rows per block, tiles stored as panels of 64 columns in 128-byte swizzle
//! atoms, `Q Kᵀ` with both operands read from shared memory through matrix descriptors, `P V` per
//! 64-column panel of `V` with `P` from registers and `V` from shared memory, one barrier per K/V
//! tile, the same online softmax ([`Bf16Kernel`]; at `D = 64` 1.21–1.26× faster than the `mma.sync`
//! kernel on the H200 at T = 4k–64k, kernel alone). It is the only tensor-core kernel at `D = 256`.
//!
//! The exact mode runs `attn_mma_tf32x3`, the tf32 kernel with every product `a·b` split into
//! three tf32 products `a_lo·b_hi + a_hi·b_lo + a_hi·b_hi` (`hi` = `x` rounded to tf32, `lo` = the
//! rest rounded to tf32; the dropped `a_lo·b_lo` is about 2⁻²² of the product), which keeps f32
//! accuracy; a block where some `q·k` is not finite in f32 computes its rows again in double
//! (`attn_row_f64`), as the FMA kernel does.
//!
//! It applies when `Dk = Dv ∈ {32, 64, 96, 128}` ([`applies`]), and in the bf16 mode on compute
//! capability 9.0 also at 256 ([`applies_wgmma`]); otherwise the FMA kernel (`attn_exact_*`) runs
//! (the modes permit tensor cores, they do not require them). [`plan`] gives the launch, [`super::fast::plan`] picks between it
//! and the FMA kernel.

use cudarc::driver::LaunchConfig;
use cudarc::driver::sys::CUfunction_attribute_enum;
use mixer_core::mixers::attention::Attention;
use mixer_core::{Precision, Result};

use super::common::{FAMILY, Kernel, Keys, Plan, key_args};
use crate::kernels;
use crate::pool;
use crate::runtime::{err, gpu, int, launch};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors, bf16};

/// Warps per block and 16-row m-tiles per warp (128 query rows per block).
const WARPS: usize = 4;
const WM: usize = 2;
/// Keys per K/V tile.
const BK: usize = 64;
/// Warps per block of the `wgmma` kernel (two warpgroups, 16 query rows per warp; three at `D = 128`, [`shape`]).
const WG_WARPS: usize = 8;

/// The kernel of the bf16 mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Kernel {
    /// `mma.sync` m16n8k16 (any architecture from sm_80).
    MmaSync,
    /// Hopper's `wgmma` (compute capability 9.0 only).
    Wgmma,
}

impl Bf16Kernel {
    /// The bf16 kernel for this device: `Wgmma` where the device has it.
    pub fn for_device() -> Result<Bf16Kernel> {
        Ok(if gpu()?.has_wgmma() { Bf16Kernel::Wgmma } else { Bf16Kernel::MmaSync })
    }
}

/// Whether the `mma.sync` tensor-core kernels handle head dims `dk`, `dv`: `Dk = Dv ∈ {32, 64,
/// 96, 128}` (the fragment loops run over `D/8` or `D/16` steps; at 256 the output and Q fragments
/// alone would take 192 registers a thread, so the FMA kernel runs there).
pub fn applies(dk: usize, dv: usize) -> bool {
    dk == dv && matches!(dk, 32 | 64 | 96 | 128)
}

/// Whether the `wgmma` kernel (bf16 mode, compute capability 9.0) handles head dims `dk`, `dv`:
/// `Dk = Dv ∈ {64, 128, 256}`, whole 64-column panels of 128-byte swizzle atoms (Q and Q's output
/// fragments are not held across tiles as `mma.sync`'s are: `Q` is read by the tensor core from
/// shared memory, so 256 fits: 227 registers a thread, no spills, 193 KiB of shared memory).
pub fn applies_wgmma(dk: usize, dv: usize) -> bool {
    dk == dv && matches!(dk, 64 | 128 | 256)
}

/// The rule for the tensor-core kernel's shape at head dim `d`: `(m-tiles per warp, warps)`.
/// `wgmma` (bf16 on compute capability 9.0, [`applies_wgmma`]): two warpgroups of one m-tile per
/// warp (128 rows), three (192 rows) at `D = 128`, where with 128-key tiles a third warpgroup
/// shares each K/V tile for one more third of the queries: on the H200 1.52 against 1.73 ms at
/// (8, 4096, 16, 128) and 2.67 against 3.11 ms at (1, 16384, 16, 128), while at `D = 64` it does
/// not win (1.04 against 0.98 ms at (8, 4096, 16, 64); `bench/gpu/attn_tune.py`). `mma.sync`: four warps of two
/// m-tiles (128 rows) up to `D = 64`, of one (64 rows) above, where two m-tiles' output and Q
/// fragments (`2·D/2 + 2·D/4` registers at `D = 128`) would spill. The split-tf32 kernel of the
/// exact mode (`split`): eight warps of one m-tile (128 rows; its split fragments take the
/// registers a second m-tile would, 239–255 a thread, so a block of 256 threads fills the
/// register file): on the H200 12.5 ms against 13.5 with four warps at (1, 16384, 16, 64),
/// 18.2 against 18.7 at (8, 4096, 16, 128) (`bench/gpu/attn_tune.py --mode exact`).
pub fn shape(d: usize, wgmma: bool, split: bool) -> (usize, usize) {
    match (wgmma, split, d <= 64) {
        (true, ..) if d == 128 => (1, 3 * WG_WARPS / 2),
        (true, ..) => (1, WG_WARPS),
        (false, true, _) => (1, 2 * WARPS),
        (false, false, true) => (WM, WARPS),
        (false, false, false) => (1, WARPS),
    }
}

/// Keys per K/V tile: 64; 32 for the split-tf32 kernel at `D = 128`, where 64-key tiles' score
/// fragments spill (ptxas: 412 bytes at 64, 212 at 32) and measured 25.9 against 18.7 ms at
/// (8, 4096, 16, 128) on the H200 (`bench/gpu/attn_tune.py --mode exact`, four warps); 128 for the
/// `wgmma` kernel at `D = 128` (two n64 products per k-step, half the barriers per key): 1.74
/// against 2.02 ms at (8, 4096, 16, 128), 3.09 against 3.60 at (1, 16384, 16, 128) on the H200,
/// while at `D = 64` 128-key tiles lose (1.18 against 1.00 ms at (8, 4096, 16, 64)) and at 256
/// they spill.
pub fn keys_per_tile(d: usize, split: bool, wgmma: bool) -> usize {
    if split && d > 96 {
        BK / 2
    } else if wgmma && d == 128 {
        2 * BK
    } else {
        BK
    }
}

/// The tensor-core launch for `shape = [B, T, H, Dk, Dv]` in mode `p` (`wgmma`: the device has
/// Hopper's warpgroup MMA; the exact mode takes the split-tf32 kernel, for f32 inputs), or `None`
/// where the FMA kernel runs instead: head dims outside [`applies`] (and, for the bf16 mode with
/// `wgmma`, outside [`applies_wgmma`]), or a scale whose
/// `scale·log₂e` is beyond `1e30` or, as an f32, neither zero nor a normal number (logits this
/// large or scales this small need the FMA kernel's overflow-free form in double). Shared
/// memory: Q `[BQ, D]` and two stages of K and V `[BK, D]`, bf16; in tf32 and the exact mode two
/// stages of K `[BK, D + 8]` and V `[BK, D + 4]` floats ([`keys_per_tile`]).
pub fn plan(a: &Attention, shape_: [usize; 5], p: Precision, wgmma: bool) -> Result<Option<Plan>> {
    let [b, t, h, d, dv] = shape_;
    let wgmma = p == Precision::Bf16 && wgmma && applies_wgmma(d, dv);
    if !(applies(d, dv) || wgmma) || b * t * h == 0 {
        return Ok(None);
    }
    let scale_log2 = a.scale(d) * std::f64::consts::LOG2_E;
    let f32_ok = scale_log2 == 0.0 || (scale_log2 as f32).is_normal();
    if !(scale_log2.is_finite() && scale_log2.abs() < 1e30 && f32_ok) {
        return Ok(None);
    }
    let split = p == Precision::Exact;
    let (wm, warps) = shape(d, wgmma, split);
    let (bq, bk) = (16 * wm * warps, keys_per_tile(d, split, wgmma));
    let (kernel, smem) = match p {
        // The wgmma kernel aligns its tiles to 1024 bytes (128-byte swizzle atoms) itself.
        Precision::Bf16 if wgmma => (Kernel::WgmmaBf16, (bq * d + 4 * bk * d) * 2 + 1024),
        Precision::Bf16 => (Kernel::MmaBf16, (bq * d + 4 * bk * d) * 2),
        Precision::Tf32 | Precision::Exact => (
            if split { Kernel::MmaTf32x3 } else { Kernel::MmaTf32 },
            (2 * bk * (d + 8) + 2 * bk * (d + 4)) * 4,
        ),
    };
    let function = match kernel {
        Kernel::WgmmaBf16 => "attn_wgmma_bf16",
        Kernel::MmaBf16 => "attn_mma_bf16",
        Kernel::MmaTf32x3 => "attn_mma_tf32x3",
        _ => "attn_mma_tf32",
    };
    let mut options = vec![
        format!("-DATT_D={d}"),
        format!("-DATT_BK={bk}"),
        format!("-DATT_WM={wm}"),
        format!("-DATT_WARPS={warps}"),
    ];
    if wgmma {
        options.extend(["-DATT_WGMMA=1".to_string(), "--gpu-architecture=sm_90a".to_string()]);
    }
    Ok(Some(Plan {
        kernel,
        function: function.into(),
        options,
        grid: [int(FAMILY, "query tiles", t.div_ceil(bq))? as u32, int(FAMILY, "B·H", b * h)? as u32],
        block: (32 * warps) as u32,
        shared_mem: smem,
        tile: None,
        force_exact: false,
    }))
}

/// [`super::fast::run`]'s tensor-core path with the bf16 mode's kernel chosen by the caller
/// (`Wgmma` needs compute capability 9.0: an error elsewhere; it runs at `D ∈ {64, 128, 256}`,
/// other head dims take `mma.sync`); the tf32 mode ignores `kernel`. `None` where [`plan`] gives none.
pub fn run_with(
    a: &Attention,
    x: &DeviceTensors,
    p: Precision,
    kernel: Bf16Kernel,
) -> Result<Option<AnyDeviceTensor>> {
    let (Some(q), Some(v)) = (x.get("q"), x.get("v")) else { return Ok(None) };
    let s = q.shape();
    let shape_ = [s[0], s[1], s[2], s[3], v.shape()[3]];
    let g = gpu()?;
    let wgmma = p == Precision::Bf16 && kernel == Bf16Kernel::Wgmma;
    if wgmma && !g.has_wgmma() {
        return Err(err(
            FAMILY,
            format!("the wgmma attention kernel needs compute capability 9.0; this device has {}", g.arch()),
        ));
    }
    match plan(a, shape_, p, wgmma)? {
        Some(pl) => launch(a, x, &pl, shape_).map(Some),
        None => Ok(None),
    }
}

/// Launches the tensor-core plan `pl` (from [`plan`]) on `x` (bf16 tensors for the bf16 kernels,
/// f32 for tf32); `y` in the inputs' storage.
pub(crate) fn launch(
    a: &Attention,
    x: &DeviceTensors,
    pl: &Plan,
    shape_: [usize; 5],
) -> Result<AnyDeviceTensor> {
    launch_with_stats(a, x, pl, shape_, None, None)
}

/// Where the exact mode's overflow flag sits in a statistics buffer of `rows` rows: the float
/// after the rows' `[rows][4]` statistics (a buffer for the exact mode holds `flag_index + 1`).
pub(crate) fn flag_index(rows: usize) -> usize {
    4 * rows
}

/// [`launch`], also writing each row's softmax statistics `(m, log₂ ℓ)` into `stats`
/// (`[B·H·T][4]` floats, entries 0 and 1; see `att_store` in `kernels/attention_fused.cu`) where
/// given: the first step of the tensor-core backward ([`super::backward_fused`]). The exact mode's
/// kernel also sets the float after them, `stats[4·B·H·T]`, to 1 where a block's scores overflow
/// (those rows are computed again in double and get no statistics); the caller zeroes it first.
/// With `keys`, `k` and `v` hold a KV cache before the queries ([`Keys`]).
pub(crate) fn launch_with_stats(
    a: &Attention,
    x: &DeviceTensors,
    pl: &Plan,
    shape_: [usize; 5],
    stats: Option<&mut cudarc::driver::CudaSlice<f32>>,
    keys: Option<&Keys<'_>>,
) -> Result<AnyDeviceTensor> {
    use cudarc::driver::DevicePtrMut;
    let [b, t, h, d, _] = shape_;
    let g = gpu()?;
    let f = g.kernel(FAMILY, &kernels::ATTENTION_FUSED, &pl.options, &pl.function)?;
    let smem = pl.shared_mem;
    f.set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
        .map_err(|e| err(FAMILY, format!("opting in to {smem} bytes of shared memory: {e}")))?;
    let split = pl.kernel == Kernel::MmaTf32x3;
    // Key splits where a KV cache leaves few query tiles over many keys (not the exact mode, whose
    // blocks may compute their rows again in double; not with statistics, the backward's).
    let splits = match keys {
        Some(k) if !split && stats.is_none() => {
            let bk = keys_per_tile(d, split, pl.kernel == Kernel::WgmmaBf16);
            key_splits(pl.grid[0] as usize * pl.grid[1] as usize, (k.longest + t).div_ceil(bk), g.sms)
        }
        _ => 1,
    };
    let cfg = LaunchConfig {
        grid_dim: (pl.grid[0], pl.grid[1], splits as u32),
        block_dim: (pl.block, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    int(FAMILY, "B·T·H·D", b * t * h * d)?;
    let (bi, ti, hi) = (int(FAMILY, "B", b)?, int(FAMILY, "T", t)?, int(FAMILY, "H", h)?);
    let scale_log2 = (a.scale(d) * std::f64::consts::LOG2_E) as f32;
    let (q, k, v) = (input_any(x, "q")?, input_any(x, "k")?, input_any(x, "v")?);
    let n = b * t * h * d;
    let s = q.shape();
    if let Some(st) = &stats {
        int(FAMILY, "B·H·T statistics", st.len() / 4)?;
        if st.len() < flag_index(b * h * t) + usize::from(split) {
            return Err(err(FAMILY, format!("internal: {} statistics for {} rows", st.len() / 4, b * h * t)));
        }
    }
    // The statistics' device address, or null (the forward alone); the guard orders the launch
    // after earlier uses of the buffer.
    let stream = g.stream();
    let (pre, nk, w, _keys_guard) = key_args(a, keys, t, &stream)?;
    let (st_ptr, _guard) = match stats {
        Some(st) => {
            let (p, guard) = st.device_ptr_mut(&stream);
            (p, Some(guard))
        }
        None => (0, None),
    };
    // The splits' partial results ([`key_splits`]), combined into y after the launch.
    let mut part =
        if splits > 1 { Some(pool::take::<f32>(FAMILY, splits * b * h * t * (d + 2))?) } else { None };
    let (part_ptr, _part_guard) = match part.as_mut() {
        Some(p) => {
            let (ptr, guard) = p.device_ptr_mut(&stream);
            (ptr, Some(guard))
        }
        None => (0, None),
    };
    let combine = |yb: u64, yf: u64| -> Result<()> {
        if splits == 1 {
            return Ok(());
        }
        let c = g.kernel(FAMILY, &kernels::ATTENTION_FUSED, &pl.options, "attn_combine_splits")?;
        let cfg = LaunchConfig {
            grid_dim: (t as u32, (b * h) as u32, 1),
            block_dim: (64, 1, 1),
            shared_mem_bytes: 0,
        };
        let z = splits as i32;
        launch!(g, FAMILY, c, cfg; &part_ptr, &yb, &yf, &ti, &hi, &z)
    };
    Ok(match pl.kernel {
        Kernel::MmaBf16 | Kernel::WgmmaBf16 => {
            let (q, k, v) = (q.typed::<bf16>("q")?, k.typed::<bf16>("k")?, v.typed::<bf16>("v")?);
            let mut y = pool::take::<bf16>(FAMILY, n)?;
            let (qv, kv, vv) = (q.view(), k.view(), v.view());
            launch!(g, FAMILY, f, cfg;
                &qv, &kv, &vv, &mut *y, &bi, &ti, &hi, &w, &scale_log2, &st_ptr, &pre, &nk, &part_ptr)?;
            combine(y.device_ptr_mut(&stream).0, 0)?;
            AnyDeviceTensor::Bf16(DeviceTensor::from_pooled(y, s)?)
        }
        _ => {
            let (q, k, v) = (q.typed::<f32>("q")?, k.typed::<f32>("k")?, v.typed::<f32>("v")?);
            let mut y = pool::take::<f32>(FAMILY, n)?;
            let (qv, kv, vv) = (q.view(), k.view(), v.view());
            if split {
                // σ in double, for the rows computed again in double where a score overflows; the
                // overflow flag after the statistics.
                let scale = a.scale(d);
                let flag = if st_ptr == 0 { 0 } else { st_ptr + 4 * flag_index(b * h * t) as u64 };
                launch!(g, FAMILY, f, cfg;
                    &qv, &kv, &vv, &mut *y, &bi, &ti, &hi, &w, &scale_log2, &st_ptr, &scale, &flag, &pre, &nk)?;
            } else {
                launch!(g, FAMILY, f, cfg;
                    &qv, &kv, &vv, &mut *y, &bi, &ti, &hi, &w, &scale_log2, &st_ptr, &pre, &nk, &part_ptr)?;
                combine(0, y.device_ptr_mut(&stream).0)?;
            }
            AnyDeviceTensor::F32(DeviceTensor::from_pooled(y, s)?)
        }
    })
}

/// Key splits of a launch of `blocks` blocks (query tiles × B·H) over up to `key_tiles` key tiles
/// each: 1 where the blocks fill the device's `sms` multiprocessors twice over; else enough splits
/// that the blocks do, each of at least four key tiles (the combine reads every split's rows once
/// more).
pub fn key_splits(blocks: usize, key_tiles: usize, sms: usize) -> usize {
    if blocks == 0 || blocks >= 2 * sms {
        return 1;
    }
    (2 * sms).div_ceil(blocks).min(key_tiles / 4).max(1)
}

/// The device tensor `name` of `x`, or the error naming what is there.
fn input_any<'a>(x: &'a DeviceTensors, name: &str) -> Result<&'a AnyDeviceTensor> {
    x.get(name).ok_or_else(|| mixer_core::Error::MissingInput {
        name: name.to_string(),
        expected: "a device tensor of that name".into(),
        given: x.keys().cloned().collect::<Vec<_>>().join(", "),
    })
}

#[cfg(test)]
mod tests {

    /// Key splits: none where the blocks fill the device twice over; else enough to, each split
    /// at least four key tiles.
    #[test]
    fn keys_split_only_where_the_blocks_leave_the_device_idle() {
        assert_eq!(key_splits(300, 1000, 132), 1);
        assert_eq!(key_splits(16, 1024, 132), 17);
        assert_eq!(key_splits(16, 8, 132), 2);
        assert_eq!(key_splits(16, 3, 132), 1);
        assert_eq!(key_splits(0, 100, 132), 1);
    }
    use super::*;
    use mixer_core::mixers::attention::AttentionConfig;

    fn attention(scale: Option<f64>) -> Attention {
        Attention::new("attention", AttentionConfig { window: None, scale }).unwrap()
    }

    /// The head dims the tensor-core kernels take: 32, 64, 96, 128 with Dk = Dv.
    #[test]
    fn tensor_cores_take_head_dims_32_to_128() {
        for d in [32, 64, 96, 128] {
            assert!(applies(d, d), "{d}");
        }
        for (dk, dv) in [(16, 16), (48, 48), (70, 70), (256, 256), (64, 32)] {
            assert!(!applies(dk, dv), "{dk} {dv}");
        }
    }

    /// Shapes: wgmma at D ∈ {64, 128, 256} in bf16 (256 only there), three warpgroups at 128;
    /// mma.sync two m-tiles per warp up to 64, one above.
    #[test]
    fn kernel_shapes_follow_the_head_dim() {
        let a = attention(None);
        let pl = |d, p, wg| plan(&a, [2, 1000, 3, d, d], p, wg).unwrap().unwrap();
        for (d, bk, warps) in [(64, 64, 8u32), (128, 128, 12), (256, 64, 8)] {
            let w = pl(d, Precision::Bf16, true);
            let bq = 16 * warps;
            assert_eq!(
                (w.kernel, w.block, w.grid),
                (Kernel::WgmmaBf16, 32 * warps, [1000u32.div_ceil(bq), 6])
            );
            assert_eq!(w.shared_mem, (bq as usize * d + 4 * bk * d) * 2 + 1024, "{d}");
            assert!(w.options.contains(&format!("-DATT_BK={bk}")), "{d}");
            assert!(
                w.options.contains(&format!("-DATT_D={d}")) && w.options.contains(&"-DATT_WGMMA=1".into())
            );
        }
        for d in [32, 96] {
            assert_eq!(pl(d, Precision::Bf16, true).kernel, Kernel::MmaBf16, "{d}");
        }
        for p in [Precision::Exact, Precision::Tf32] {
            assert!(plan(&a, [2, 1000, 3, 256, 256], p, true).unwrap().is_none(), "{p}");
        }
        assert!(plan(&a, [2, 1000, 3, 256, 256], Precision::Bf16, false).unwrap().is_none());
        assert!(plan(&a, [2, 1000, 3, 256, 128], Precision::Bf16, true).unwrap().is_none());
        assert_eq!(pl(128, Precision::Bf16, false).kernel, Kernel::MmaBf16);
        assert_eq!(pl(64, Precision::Bf16, false).kernel, Kernel::MmaBf16);
        assert_eq!(pl(64, Precision::Tf32, true).kernel, Kernel::MmaTf32);
        assert_eq!(shape(64, false, false), (2, 4));
        assert_eq!(shape(64, false, true), (1, 8));
        assert_eq!(shape(128, false, true), (1, 8));
        assert_eq!(shape(96, false, false), (1, 4));
        let p = pl(128, Precision::Tf32, false);
        assert_eq!(p.grid, [16, 6]);
        assert_eq!(p.shared_mem, (2 * 64 * 136 + 2 * 64 * 132) * 4);
        assert!(p.options.contains(&"-DATT_WM=1".to_string()));
        assert_eq!(pl(96, Precision::Bf16, false).shared_mem, (64 * 96 + 4 * 64 * 96) * 2);
    }

    /// The exact mode takes the split-tf32 kernel: eight warps of one m-tile, the tf32 kernel's
    /// K/V tiles up to D = 96, 32 keys at 128.
    #[test]
    fn the_exact_mode_splits_the_tf32_products() {
        let a = attention(None);
        for d in [32, 64, 96, 128] {
            let x = plan(&a, [2, 1000, 3, d, d], Precision::Exact, true).unwrap().unwrap();
            let t = plan(&a, [2, 1000, 3, d, d], Precision::Tf32, true).unwrap().unwrap();
            assert_eq!((x.kernel, x.function.as_str()), (Kernel::MmaTf32x3, "attn_mma_tf32x3"));
            assert_eq!((x.grid, x.block), ([8, 6], 256));
            assert!(
                x.options.contains(&"-DATT_WM=1".to_string())
                    && x.options.contains(&"-DATT_WARPS=8".to_string())
            );
            let bk = if d == 128 { 32 } else { 64 };
            assert!(x.options.contains(&format!("-DATT_BK={bk}")), "{d}");
            assert_eq!(x.shared_mem, (2 * bk * (d + 8) + 2 * bk * (d + 4)) * 4);
            assert!(d == 128 || x.shared_mem == t.shared_mem);
        }
    }

    /// No tensor-core plan for other head dims, logits beyond 1e30 per unit, or a scale whose
    /// `scale·log₂e` is not zero or a normal f32.
    #[test]
    fn no_tensor_cores_where_they_do_not_apply() {
        let a = attention(None);
        assert!(plan(&attention(Some(1e-40)), [1, 10, 1, 64, 64], Precision::Exact, true).unwrap().is_none());
        assert!(plan(&attention(Some(0.0)), [1, 10, 1, 64, 64], Precision::Exact, true).unwrap().is_some());
        assert!(plan(&a, [1, 10, 1, 70, 70], Precision::Tf32, true).unwrap().is_none());
        assert!(plan(&attention(Some(1e35)), [1, 10, 1, 64, 64], Precision::Tf32, true).unwrap().is_none());
        assert!(plan(&a, [0, 10, 1, 64, 64], Precision::Bf16, true).unwrap().is_none());
    }
}
