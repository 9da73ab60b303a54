//! The tiled online-softmax forward. Per query `t` and key tile `S`:
//! `m' = max(m, max_{s ∈ S} z_{ts})`, `l ← l e^(m−m') + Σ_{s∈ S} e^(z_{ts}−m')`,
//! `a ← a e^(m−m') + Σ_{s ∈ S} e^(z_{ts}−m') v_s`; finally `y_t = a / l`, with
//! `z_{ts} = scale· q_t· k_s` over unmasked `s` only. The `exact` arithmetic; in the `tf32`
//! and `bf16` modes the fused tensor-core kernel ([`super::fused`]) runs instead where it
//! applies.

use cudarc::driver::LaunchConfig;
use mixer_core::mixers::attention::Attention;
use mixer_core::{Precision, Result};

use super::common::{FAMILY, window_arg};
use super::fused;
use crate::forms::{finish, input};
use crate::kernels;
use crate::pool;
use crate::runtime::{GpuReal, check_elems, err, gpu, int, launch};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// Shared memory one block may use without opting in (bytes).
const SMEM: usize = 48 * 1024;

/// Tile size (queries per block = keys per tile) for these head dims and scalar size.
pub(crate) fn tile(dk: usize, dv: usize, elem: usize) -> Result<usize> {
    let per_row = (dk + dv) * elem;
    let t = (SMEM / (2 * per_row.max(1))).min(64);
    if t == 0 {
        return Err(err(FAMILY, format!("Dk + Dv = {} is too large for the shared-memory tiles", dk + dv)));
    }
    Ok(t)
}

/// Runs the fast form on device tensors.
pub fn run<F: GpuReal>(a: &Attention, x: &DeviceTensors, p: Precision) -> Result<AnyDeviceTensor> {
    if let Some(y) = fused::run::<F>(a, x, p)? {
        return Ok(y);
    }
    let (q, k, v) = (input::<F>(x, "q")?, input::<F>(x, "k")?, input::<F>(x, "v")?);
    let (b, t, h, dk) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let dv = v.shape()[3];
    let shape = [b, t, h, dv];
    if b * t * h * dv == 0 {
        return finish(DeviceTensor::<F>::zeros(&shape)?, p);
    }
    check_elems(FAMILY, b * t * h * dk.max(dv))?;
    let bq = tile(dk, dv, std::mem::size_of::<F>())?;
    let g = gpu()?;
    let f = g.kernel(FAMILY, &kernels::ATTENTION, &[], &format!("attn_fwd_{}", F::SUFFIX))?;
    let mut y = pool::take::<F>(FAMILY, b * t * h * dv)?;
    let cfg = LaunchConfig {
        grid_dim: (int(FAMILY, "query tiles", t.div_ceil(bq))? as u32, int(FAMILY, "B·H", b * h)? as u32, 1),
        block_dim: (bq as u32, 1, 1),
        shared_mem_bytes: (2 * bq * (dk + dv) * std::mem::size_of::<F>()) as u32,
    };
    let (bi, ti, hi, dki, dvi) = (
        int(FAMILY, "B", b)?,
        int(FAMILY, "T", t)?,
        int(FAMILY, "H", h)?,
        int(FAMILY, "Dk", dk)?,
        int(FAMILY, "Dv", dv)?,
    );
    let w = window_arg(a, t);
    // Passed as a double: the kernel forms overflow-free logits from it (see attention.cu).
    let scale: f64 = a.scale(dk);
    let bk = bq as i32;
    let (qv, kv, vv) = (q.view(), k.view(), v.view());
    launch!(g, FAMILY, f, cfg; &qv, &kv, &vv, &mut *y, &bi, &ti, &hi, &dki, &dvi, &w, &scale, &bk)?;
    finish(DeviceTensor::from_pooled(y, &shape)?, p)
}
