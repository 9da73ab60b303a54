//! What the attention forms on CUDA share: the family's name in errors, the window as the
//! kernels take it, and the forward's launch plan types ([`Plan`], filled by
//! [`super::fast::plan`] for the FMA kernel and [`super::fused::plan`] for the tensor cores).

use mixer_core::mixers::attention::Attention;
use serde::Serialize;

/// Family name in errors.
pub(crate) const FAMILY: &str = "attention";

/// The window as the kernels take it: `0` for none (or one at least as long as the `t_len` keys).
pub(crate) fn window_arg(a: &Attention, t_len: usize) -> i32 {
    match a.window() {
        Some(w) if w < t_len => w as i32,
        _ => 0,
    }
}

/// The keys of a forward launch that continues KV caches (docs/math.md §7.1): batch row `b`'s
/// first query sits at position `prefix[b]` among its keys, `k` and `v` hold `rows ≥ prefix[b] + T`
/// token rows per batch row (`[B, rows, H, D]`), the cached keys first; `longest` is the largest
/// prefix. A plain run has none (`prefix` null, `rows = T`).
pub(crate) struct Keys<'a> {
    /// `P_b`, one per batch row, on the device.
    pub prefix: &'a cudarc::driver::CudaSlice<i32>,
    /// Token rows of `k` and `v` per batch row.
    pub rows: usize,
    /// `max_b P_b`.
    pub longest: usize,
}

/// The kernels' last two arguments for `keys` (`None`: a plain run of `t_len` tokens): the
/// prefixes' device address (0: none), the key rows per batch row, and the guard that orders the
/// launch after the prefixes' upload; with the window argument for the longest row of keys.
pub(crate) fn key_args<'a>(
    a: &Attention,
    keys: Option<&Keys<'a>>,
    t_len: usize,
    stream: &'a cudarc::driver::CudaStream,
) -> mixer_core::Result<(u64, i32, i32, Option<cudarc::driver::SyncOnDrop<'a>>)> {
    use cudarc::driver::DevicePtr;
    match keys {
        None => Ok((0, crate::runtime::int(FAMILY, "T", t_len)?, window_arg(a, t_len), None)),
        Some(k) => {
            if k.rows < k.longest + t_len {
                return Err(crate::runtime::err(
                    FAMILY,
                    format!("internal: {} key rows for {} cached and {t_len} new tokens", k.rows, k.longest),
                ));
            }
            let (p, guard) = k.prefix.device_ptr(stream);
            let rows = crate::runtime::int(FAMILY, "key rows", k.rows)?;
            Ok((p, rows, window_arg(a, k.longest + t_len), Some(guard)))
        }
    }
}

/// The exact kernel's tile: each thread holds `tm` query rows (the block's `bq = 16·tm`), key tiles
/// of `bk` keys, `smem` bytes of dynamic shared memory, `min_blocks` blocks per multiprocessor asked
/// of the compiler (`__launch_bounds__`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ExactTile {
    /// Query rows per thread (`AX_TM`).
    pub tm: usize,
    /// Query rows per block.
    pub bq: usize,
    /// Keys per tile (`AX_BK`).
    pub bk: usize,
    /// Dynamic shared memory (bytes).
    pub smem: usize,
    /// Blocks per multiprocessor the registers are budgeted for (`AX_MINB`).
    pub min_blocks: usize,
}

/// Which kernel a plan launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kernel {
    /// `attn_exact_{f32,f64}` (`kernels/attention.cu`).
    Exact,
    /// `attn_mma_tf32` (`kernels/attention_fused.cu`).
    MmaTf32,
    /// `attn_mma_tf32x3`: the exact mode's split-tf32 products (`kernels/attention_fused.cu`).
    MmaTf32x3,
    /// `attn_mma_bf16`.
    MmaBf16,
    /// `attn_wgmma_bf16` (compute capability 9.0).
    WgmmaBf16,
}

/// The storage of the activations a plan reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Storage {
    /// `f32` tensors.
    F32,
    /// `f64` tensors.
    F64,
    /// bf16 tensors (the bf16 mode's device inputs).
    Bf16,
}

/// One launch of the attention forward: the kernel, its NVRTC options, grid, block and dynamic
/// shared memory, and the exact kernel's tile where that runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// The kernel.
    pub kernel: Kernel,
    /// The `extern "C"` function.
    pub function: String,
    /// NVRTC options (`-D…`, and the architecture for `wgmma`).
    pub options: Vec<String>,
    /// Grid: query tiles × (B·H).
    pub grid: [u32; 2],
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory (bytes).
    pub shared_mem: usize,
    /// The exact kernel's tile ([`exact_tile`]).
    pub tile: Option<ExactTile>,
    /// |σ|·log₂e is not a normal number of the kernel's scalar type: every block takes the exact
    /// kernel's double-precision rows (`force_exact`).
    pub force_exact: bool,
}
