//! The tensor-core forward (`kernels/attention_fused.cu`), FlashAttention-2 style, for the
//! `tf32` and `bf16` modes: a block of 4 warps owns 128 query rows of one (batch, head); K and
//! V tiles of 64 keys stream through shared memory with `cp.async` (two stages); `mma.sync`
//! computes `QKᵀ` and `PV` (bf16 `m16n8k16` or tf32 `m16n8k8`, `f32` accumulation); the
//! online softmax runs in `f32` with `exp2` (scale·log₂e folded in); tiles wholly outside the
//! causal window are skipped, masks are applied only on tiles that cross a boundary.
//!
//! On compute capability 9.0 (H100/H200) the bf16 mode runs `attn_wgmma_bf16` instead: Hopper's
//! warpgroup MMA (`wgmma.mma_async`, compiled for `sm_90a`), two warpgroups of 64 query rows per
//! block, `Q Kᵀ` with both operands read from 128-byte-swizzled shared memory through matrix
//! descriptors, `P V` with `P` from registers and `V` from shared memory, one barrier per K/V
//! tile, the same online softmax ([`Bf16Kernel`]; 1.21–1.26× faster than the `mma.sync` kernel
//! on the H200 at T = 4k–64k, kernel alone).
//!
//! It applies when `Dk = Dv = 64` (tf32 also 32, see [`applies`]); otherwise the exact kernel
//! runs (the modes permit tensor cores, they do not require them).

use cudarc::driver::LaunchConfig;
use cudarc::driver::sys::CUfunction_attribute_enum;
use mixer_core::mixers::attention::Attention;
use mixer_core::{Precision, Result};

use super::common::{FAMILY, window_arg};
use crate::kernels;
use crate::pool;
use crate::runtime::{GpuReal, err, gpu, int, launch};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors, bf16};

/// Warps per block and 16-row m-tiles per warp (128 query rows per block).
const WARPS: usize = 4;
const WM: usize = 2;
/// Keys per K/V tile.
const BK: usize = 64;
/// Warps per block of the `wgmma` kernel (two warpgroups, 16 query rows per warp).
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

/// Whether the tensor-core kernel handles head dims `dk`, `dv` in mode `p`: `Dk = Dv = 64`,
/// and also 32 for tf32 (the sizes checked on the H200; the bf16 kernel's fragment layout is
/// written for 64).
pub fn applies(dk: usize, dv: usize, p: Precision) -> bool {
    dk == dv && (dk == 64 || (dk == 32 && p == Precision::Tf32))
}

/// Runs the tensor-core kernel when the mode and the sizes allow it; `None` otherwise.
pub fn run<F: GpuReal>(a: &Attention, x: &DeviceTensors, p: Precision) -> Result<Option<AnyDeviceTensor>> {
    if p == Precision::Exact || F::ELEM != "f32" {
        return Ok(None);
    }
    run_with(a, x, p, Bf16Kernel::for_device()?)
}

/// [`run`] with the bf16 mode's kernel chosen by the caller (`Wgmma` needs compute capability 9.0:
/// an error elsewhere); the tf32 mode ignores `kernel`.
pub fn run_with(
    a: &Attention,
    x: &DeviceTensors,
    p: Precision,
    kernel: Bf16Kernel,
) -> Result<Option<AnyDeviceTensor>> {
    if p == Precision::Exact {
        return Ok(None);
    }
    let (Some(q), Some(k), Some(v)) = (x.get("q"), x.get("k"), x.get("v")) else { return Ok(None) };
    let s = q.shape();
    let (b, t, h, d) = (s[0], s[1], s[2], s[3]);
    if !applies(d, v.shape()[3], p) || b * t * h == 0 {
        return Ok(None);
    }
    let g = gpu()?;
    let wgmma = p == Precision::Bf16 && kernel == Bf16Kernel::Wgmma;
    if wgmma && !g.has_wgmma() {
        return Err(err(
            FAMILY,
            format!("the wgmma attention kernel needs compute capability 9.0; this device has {}", g.arch()),
        ));
    }
    let (wm, warps) = if wgmma { (1, WG_WARPS) } else { (WM, WARPS) };
    let bq = 16 * wm * warps;
    let (name, smem) = match p {
        // The wgmma kernel aligns its tiles to 1024 bytes (128-byte swizzle atoms) itself.
        Precision::Bf16 if wgmma => ("attn_wgmma_bf16", (bq * d + 4 * BK * d) * 2 + 1024),
        Precision::Bf16 => ("attn_mma_bf16", (bq * d + 4 * BK * d) * 2),
        _ => ("attn_mma_tf32", (2 * BK * (d + 8) + 2 * BK * (d + 4)) * 4),
    };
    let mut opts = vec![
        format!("-DATT_D={d}"),
        format!("-DATT_BK={BK}"),
        format!("-DATT_WM={wm}"),
        format!("-DATT_WARPS={warps}"),
    ];
    if wgmma {
        opts.extend(["-DATT_WGMMA=1".to_string(), "--gpu-architecture=sm_90a".to_string()]);
    }
    let f = g.kernel(FAMILY, &kernels::ATTENTION_FUSED, &opts, name)?;
    f.set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
        .map_err(|e| err(FAMILY, format!("opting in to {smem} bytes of shared memory: {e}")))?;
    let cfg = LaunchConfig {
        grid_dim: (int(FAMILY, "query tiles", t.div_ceil(bq))? as u32, int(FAMILY, "B·H", b * h)? as u32, 1),
        block_dim: ((32 * warps) as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    int(FAMILY, "B·T·H·D", b * t * h * d)?;
    let (bi, ti, hi) = (int(FAMILY, "B", b)?, int(FAMILY, "T", t)?, int(FAMILY, "H", h)?);
    let w = window_arg(a, t);
    let scale_log2 = (a.scale(d) * std::f64::consts::LOG2_E) as f32;
    if !(scale_log2.is_finite() && scale_log2.abs() < 1e30) {
        // Logits this large need the exact kernel's overflow-free form.
        return Ok(None);
    }
    let n = b * t * h * d;
    let y = match p {
        Precision::Bf16 => {
            let (q, k, v) = (q.typed::<bf16>("q")?, k.typed::<bf16>("k")?, v.typed::<bf16>("v")?);
            let mut y = pool::take::<bf16>(FAMILY, n)?;
            let (qv, kv, vv) = (q.view(), k.view(), v.view());
            launch!(g, FAMILY, f, cfg; &qv, &kv, &vv, &mut *y, &bi, &ti, &hi, &w, &scale_log2)?;
            AnyDeviceTensor::Bf16(DeviceTensor::from_pooled(y, s)?)
        }
        _ => {
            let (q, k, v) = (q.typed::<f32>("q")?, k.typed::<f32>("k")?, v.typed::<f32>("v")?);
            let mut y = pool::take::<f32>(FAMILY, n)?;
            let (qv, kv, vv) = (q.view(), k.view(), v.view());
            launch!(g, FAMILY, f, cfg; &qv, &kv, &vv, &mut *y, &bi, &ti, &hi, &w, &scale_log2)?;
            AnyDeviceTensor::F32(DeviceTensor::from_pooled(y, s)?)
        }
    };
    Ok(Some(y))
}
