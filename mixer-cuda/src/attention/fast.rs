//! The attention forward on CUDA and its launch plan. Per query `t` and key tile `S`:
//! `m' = max(m, max_{s ∈ S} u_{ts})`, `ℓ ← ℓ w(m, m') + Σ_{s∈ S} w(u_{ts}, m')`,
//! `a ← a w(m, m') + Σ_{s ∈ S} w(u_{ts}, m') v_s`; finally `y_t = a / ℓ`, with the keys
//! `u_{ts} = sign(σ)· q_t· k_s` over unmasked `s` only and `w(x, m) = e^{|σ|(x − m)}` (the CPU's
//! overflow-free `Logits`). Where the tensor-core kernel ([`super::fused`]) applies
//! ([`super::fused::applies`]: f32 inputs in the `exact` mode, with split-tf32 products that keep
//! f32 accuracy; the `tf32` and `bf16` modes) it runs; elsewhere, f64 inputs included,
//! `kernels/attention.cu`'s FMA kernel `attn_exact_{f32,f64}` runs (FlashAttention-2 structure
//! on the FMA units: register tiles of scores and outputs, see [`exact_tile`]).
//!
//! [`plan`] decides which kernel runs, with which compile-time sizes, grid and shared memory;
//! [`run`] launches exactly that plan, and `mixers plan` prints it (no GPU needed).

use cudarc::driver::LaunchConfig;
use mixer_core::mixers::attention::Attention;
use mixer_core::{Precision, Result};

pub use super::common::{ExactTile, Kernel, Plan, Storage};
use super::common::{FAMILY, Keys, key_args};
use super::fused;
use crate::forms::{finish, input};
use crate::kernels;
use crate::pool;
use crate::runtime::{check_elems, err, gpu, int, launch, max_dynamic_smem, opt_in};
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// Threads per block of the exact kernel (`AX_THREADS`): a 16 × 16 grid of row groups × key lanes.
pub const EXACT_THREADS: usize = 256;
/// Lanes sharing a row group (`AX_LANES`): keys and output columns are dealt round-robin over them.
const LANES: usize = 16;
/// Words of output accumulators a thread may hold (`tm · ⌈Dv/16⌉ · elem/4`): at most 64 keeps the
/// scores, the accumulators and one step's operands in registers without spills.
const ACC_WORDS: usize = 64;

/// The exact kernel's shared memory (bytes) for rows per thread `tm`, keys per tile `bk`, head dims
/// `dk`, `dv` and scalar size `elem`: `AxLayout` in `attention.cu`, `Q [bq][ks] | K [bk][ks] |
/// V [bk][dvp] | P [bk][ps]`, `dkp = ⌈dk/4⌉·4`, `dvp = ⌈dv/16⌉·16`, and `ks`, `ps` the row lengths
/// `dkp` and `bq` widened by one 16-byte vector where their count of vectors is even.
fn exact_smem(tm: usize, bk: usize, dk: usize, dv: usize, elem: usize) -> usize {
    let vw = 16 / elem;
    let odd = |n: usize| if (n / vw) % 2 == 1 { n } else { n + vw };
    let (bq, dkp, dvp) = (LANES * tm, dk.div_ceil(4) * 4, dv.div_ceil(LANES) * LANES);
    let (ks, ps) = (odd(dkp), odd(bq));
    (bq * ks + bk * ks + bk * dvp + bk * ps) * elem
}

/// The rule for the exact kernel's tile at head dims `dk`, `dv`, scalar size `elem` (4 or 8 bytes)
/// and `limit` bytes of dynamic shared memory per block:
/// 1. rows per thread `tm`: the largest of 8, 4, 2 whose output accumulators
///    (`tm · ⌈dv/16⌉` scalars) fit [`ACC_WORDS`] registers, that is a whole number of 16-byte
///    vectors (P is stored and read as such) and with which some key tile fits `limit`;
/// 2. keys per tile `bk`: the largest of 64, 32, 16 whose shared memory fits `limit`;
/// 3. two blocks per multiprocessor where two tiles fit `limit` together, else one.
///
/// An error names the head dims where no tile fits.
pub fn exact_tile(dk: usize, dv: usize, elem: usize, limit: usize) -> Result<ExactTile> {
    let nv = dv.div_ceil(LANES).max(1);
    let too_large = || {
        err(
            FAMILY,
            format!(
                "the exact kernel's tiles need Dv ≤ {} and Dk small enough for {limit} bytes of shared memory at \
                 {elem}-byte scalars; got Dk = {dk}, Dv = {dv}",
                ACC_WORDS * 4 / (2 * elem) * LANES
            ),
        )
    };
    let (tm, bk, smem) = [8, 4, 2]
        .into_iter()
        .filter(|&tm| tm * nv * elem <= ACC_WORDS * 4 && tm * elem >= 16)
        .flat_map(|tm| [64, 32, 16].map(|bk| (tm, bk, exact_smem(tm, bk, dk, dv, elem))))
        .find(|&(_, _, s)| s <= limit)
        .ok_or_else(too_large)?;
    Ok(ExactTile { tm, bq: LANES * tm, bk, smem, min_blocks: if 2 * smem <= limit { 2 } else { 1 } })
}

/// The exact kernel's plan for `[B, T, H, Dk, Dv]`, scale `scale` and scalar size `elem`.
fn exact_plan(shape: [usize; 5], scale: f64, elem: usize, limit: usize) -> Result<Plan> {
    let [b, t, h, dk, dv] = shape;
    let tile = exact_tile(dk, dv, elem, limit)?;
    let al2 = scale.abs() * std::f64::consts::LOG2_E;
    let normal = if elem == 4 { (al2 as f32).is_normal() } else { al2.is_normal() };
    let mut options = vec![
        format!("-DAX_DK={dk}"),
        format!("-DAX_DV={dv}"),
        format!("-DAX_TM={}", tile.tm),
        format!("-DAX_BK={}", tile.bk),
        format!("-DAX_MINB={}", tile.min_blocks),
    ];
    if elem == 8 {
        options.push("-DAX_ELEM_F64=1".into());
    }
    Ok(Plan {
        kernel: Kernel::Exact,
        function: format!("attn_exact_{}", if elem == 8 { "f64" } else { "f32" }),
        options,
        grid: [int(FAMILY, "query tiles", t.div_ceil(tile.bq))? as u32, int(FAMILY, "B·H", b * h)? as u32],
        block: EXACT_THREADS as u32,
        shared_mem: tile.smem,
        tile: Some(tile),
        force_exact: !(al2 == 0.0 || normal),
    })
}

/// The forward's launch for `shape = [B, T, H, Dk, Dv]` (none when the output is empty), in mode
/// `p`, on activations stored as `storage`, with `limit` bytes of dynamic shared memory per block
/// and `wgmma` where the device has Hopper's warpgroup MMA: the tensor-core kernel where
/// [`fused::plan`] takes the sizes and the storage is the mode's (f32 for exact and tf32, bf16 for
/// bf16), the FMA kernel otherwise (inputs stored as bf16 are read as f32 there).
pub fn plan(
    a: &Attention,
    shape: [usize; 5],
    p: Precision,
    storage: Storage,
    limit: usize,
    wgmma: bool,
) -> Result<Option<Plan>> {
    let [b, t, h, dk, dv] = shape;
    if b * t * h * dv == 0 {
        return Ok(None);
    }
    let tensor_cores = matches!(
        (p, storage),
        (Precision::Exact | Precision::Tf32, Storage::F32) | (Precision::Bf16, Storage::Bf16)
    );
    if tensor_cores && let Some(f) = fused::plan(a, shape, p, wgmma)? {
        return Ok(Some(f));
    }
    let elem = if storage == Storage::F64 { 8 } else { 4 };
    exact_plan(shape, a.scale(dk), elem, limit).map(Some)
}

/// Runs the fast form on device tensors: the launch [`plan`] gives.
pub fn run<F: GpuReal>(a: &Attention, x: &DeviceTensors, p: Precision) -> Result<AnyDeviceTensor> {
    run_keys::<F>(a, x, p, None)
}

/// [`run`] with the keys of a KV cache before the queries where `keys` says so ([`Keys`]): `k` and
/// `v` are `[B, keys.rows, H, D]`, `q` and `y` `[B, T, H, D]`. The plan is the plain run's at
/// the queries' shape.
pub(crate) fn run_keys<F: GpuReal>(
    a: &Attention,
    x: &DeviceTensors,
    p: Precision,
    keys: Option<&Keys<'_>>,
) -> Result<AnyDeviceTensor> {
    let (Some(q0), Some(v0)) = (x.get("q"), x.get("v")) else {
        // `input` below names what is missing.
        input::<F>(x, "q")?;
        input::<F>(x, "v")?;
        return Err(err(FAMILY, "internal: q and v present"));
    };
    let (s, dv) = (q0.shape().to_vec(), v0.shape()[3]);
    let shape = [s[0], s[1], s[2], s[3], dv];
    let storage = match q0 {
        AnyDeviceTensor::Bf16(_) => Storage::Bf16,
        _ if F::SUFFIX == "f64" => Storage::F64,
        _ => Storage::F32,
    };
    let g = gpu()?;
    let Some(pl) = plan(a, shape, p, storage, max_dynamic_smem(), g.has_wgmma())? else {
        return finish(DeviceTensor::<F>::zeros(&[s[0], s[1], s[2], dv])?, p);
    };
    if pl.kernel != Kernel::Exact {
        return fused::launch_with_stats(a, x, &pl, shape, None, keys);
    }
    let (q, k, v) = (input::<F>(x, "q")?, input::<F>(x, "k")?, input::<F>(x, "v")?);
    let [b, t, h, dk, dv] = shape;
    check_elems(FAMILY, b * t * h * dk.max(dv))?;
    let f = g.kernel(FAMILY, &kernels::ATTENTION, &pl.options, &pl.function)?;
    if pl.shared_mem > 48 << 10 {
        opt_in(FAMILY, &f)?;
    }
    let mut y = pool::take::<F>(FAMILY, b * t * h * dv)?;
    let cfg = LaunchConfig {
        grid_dim: (pl.grid[0], pl.grid[1], 1),
        block_dim: (pl.block, 1, 1),
        shared_mem_bytes: pl.shared_mem as u32,
    };
    let (ti, hi) = (int(FAMILY, "T", t)?, int(FAMILY, "H", h)?);
    let stream = g.stream();
    let (pre, nk, w, _guard) = key_args(a, keys, t, &stream)?;
    // Passed as a double: the kernel's exact rows form overflow-free logits from it.
    let scale: f64 = a.scale(dk);
    let force = i32::from(pl.force_exact);
    let (qv, kv, vv) = (q.view(), k.view(), v.view());
    launch!(g, FAMILY, f, cfg; &qv, &kv, &vv, &mut *y, &ti, &hi, &w, &scale, &force, &pre, &nk)?;
    finish(DeviceTensor::from_pooled(y, &[b, t, h, dv])?, p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mixer_core::mixers::attention::AttentionConfig;

    /// The opt-in dynamic shared memory of the H200 less the static reserve (219 KiB).
    const H200: usize = 219 << 10;

    /// Rule 1: eight rows per thread up to Dv = 128 in f32 (64 in f64), then four, then two.
    #[test]
    fn rows_per_thread_keep_the_accumulators_in_64_registers() {
        assert_eq!(exact_tile(64, 64, 4, H200).unwrap().tm, 8);
        assert_eq!(exact_tile(70, 128, 4, H200).unwrap().tm, 8);
        assert_eq!(exact_tile(64, 129, 4, H200).unwrap().tm, 4);
        assert_eq!(exact_tile(256, 256, 4, H200).unwrap().tm, 4);
        assert_eq!(exact_tile(64, 64, 8, H200).unwrap().tm, 8);
        assert_eq!(exact_tile(96, 96, 8, H200).unwrap().tm, 4);
        assert_eq!(exact_tile(256, 256, 8, H200).unwrap().tm, 2);
        // f32 rows are whole float4 vectors: never two rows per thread in f32.
        assert!(exact_tile(16, 520, 4, H200).is_err());
    }

    /// Rule 2: the widest key tile whose shared memory fits, the layout's bytes counted exactly.
    #[test]
    fn key_tiles_are_the_widest_that_fit() {
        // D = 64 f32: Q 128×68, K 64×68, V 64×64, P 64×132 floats.
        let t = exact_tile(64, 64, 4, H200).unwrap();
        assert_eq!((t.bq, t.bk, t.smem), (128, 64, (128 * 68 + 64 * 68 + 64 * 64 + 64 * 132) * 4));
        // D = 256 f64: two rows per thread, 32 keys per tile (64 would need 338 KiB).
        let t = exact_tile(256, 256, 8, H200).unwrap();
        assert_eq!((t.bq, t.bk, t.smem), (32, 32, (32 * 258 + 32 * 258 + 32 * 256 + 32 * 34) * 8));
        assert!(exact_smem(2, 64, 256, 256, 8) > H200);
        // D = 256 f32: four rows per thread, 64 keys in 211 KiB.
        let t = exact_tile(256, 256, 4, H200).unwrap();
        assert_eq!((t.bq, t.bk, t.smem), (64, 64, (64 * 260 * 2 + 64 * 256 + 64 * 68) * 4));
        // Without opting in (48 KiB): D = 16 takes 32-key tiles (64 would need 52 KiB).
        assert_eq!(exact_tile(16, 16, 4, 48 << 10).unwrap().bk, 32);
        assert!(exact_tile(64, 64, 4, 16 << 10).is_err());
        // Dk = 512, Dv = 16 in f32: eight rows' Q alone is 258 KiB; four rows fit.
        let t = exact_tile(512, 16, 4, H200).unwrap();
        assert_eq!((t.tm, t.bk), (4, 32));
        // Odd head dims are padded: Dk = 70 → 72 (a multiple of 4, 18 vectors: widened to 76).
        assert_eq!(exact_smem(8, 64, 70, 70, 4), (128 * 76 + 64 * 76 + 64 * 80 + 64 * 132) * 4);
    }

    /// Rule 3: two blocks per multiprocessor where two tiles fit, as at D = 64 in f32; one at 128.
    #[test]
    fn two_blocks_where_two_tiles_fit() {
        assert_eq!(exact_tile(64, 64, 4, H200).unwrap().min_blocks, 2);
        assert_eq!(exact_tile(128, 128, 4, H200).unwrap().min_blocks, 1);
        assert_eq!(exact_tile(32, 32, 4, H200).unwrap().min_blocks, 2);
    }

    /// The plan: the exact kernel for f64 and the exact mode, its options carry the tile; a scale
    /// whose |σ|·log₂e is not a normal f32 forces the double-precision rows; empty outputs launch
    /// nothing.
    #[test]
    fn plans_pick_the_kernel_and_flag_huge_scales() {
        let at = |scale| Attention::new("attention", AttentionConfig { window: None, scale }).unwrap();
        let a = at(None);
        let p = plan(&a, [2, 1000, 3, 64, 64], Precision::Exact, Storage::F32, H200, true).unwrap().unwrap();
        assert_eq!(p.kernel, Kernel::MmaTf32x3);
        let p = plan(&a, [2, 1000, 3, 64, 70], Precision::Exact, Storage::F32, H200, true).unwrap().unwrap();
        assert_eq!(p.kernel, Kernel::Exact);
        assert_eq!(p.grid, [8, 6]);
        assert!(p.options.contains(&"-DAX_TM=8".to_string()) && !p.force_exact);
        let p = plan(&a, [1, 10, 1, 64, 64], Precision::Tf32, Storage::F64, H200, true).unwrap().unwrap();
        assert_eq!((p.kernel, p.function.as_str()), (Kernel::Exact, "attn_exact_f64"));
        let huge = at(Some(1e308));
        let p = plan(&huge, [1, 10, 1, 3, 2], Precision::Exact, Storage::F32, H200, true).unwrap().unwrap();
        assert!(p.force_exact);
        // 1e308·log₂e is a normal f64; 1.5e308·log₂e overflows.
        let p = plan(&huge, [1, 10, 1, 3, 2], Precision::Exact, Storage::F64, H200, true).unwrap().unwrap();
        assert!(!p.force_exact);
        let p = plan(&at(Some(-1.5e308)), [1, 10, 1, 3, 2], Precision::Exact, Storage::F64, H200, true);
        assert!(p.unwrap().unwrap().force_exact);
        let zero = at(Some(0.0));
        assert!(
            !plan(&zero, [1, 10, 1, 3, 2], Precision::Exact, Storage::F32, H200, true)
                .unwrap()
                .unwrap()
                .force_exact
        );
        assert!(plan(&a, [1, 0, 1, 64, 64], Precision::Exact, Storage::F32, H200, true).unwrap().is_none());
    }
}
