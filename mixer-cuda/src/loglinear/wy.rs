//! Gated DeltaNet's WY/UT step (`kernels/loglinear_wy.cu`), parallel over chunks: per chunk,
//! with the chunk-local prefix sums `γ` of the log-decays, `Γ_{r,s} = e^(γ_r − γ_s)` (`s < r`) and
//! the gates `β`, the unit-lower `T = I + strict(diag(β)(KKᵀ ⊙ Γ))`, its inverse, and
//! `W = T⁻¹ diag(β e^γ) K`, `U = T⁻¹ diag(β) V` (the WY representation of the chunk's product of
//! delta-rule transitions, and the UT transform of its values; docs/math.md §2.6). The lift's
//! outputs also need `T⁻¹`.
//!
//! `llc_wy` runs in FMA (the exact mode), `llc_wy_tc` on tensor cores (the tf32 and bf16 modes
//! with f32 data: `KKᵀ`, `W` and `U` as tf32 `mma.sync`, the inverse by 16 × 16 blocks with the
//! products below the diagonal in three tf32 terms), and `llc_wy_tc_bf16` reads the bf16 mode's
//! `k`, `v` as stored and writes `W`, `U` rounded to bf16 (compiled apart, `-DDH_BF16=1`).

use cudarc::driver::CudaView;
use mixer_core::{Precision, Result};

use super::common::{
    ChunkTable, Elem, FAMILY, Launch, Shape, Step, fixed_dims, kernel_ints, table_args, tensor_cores,
};
use crate::kernels;
use crate::pool::Pooled;
use crate::runtime::{gpu, launch};
use crate::tensor::DeviceScalar;

/// Dynamic shared memory of `llc_wy_tc` (`X`, `Lm`, `Tt`): three `[64][68]` f32 tiles.
const WY_TC_SMEM: usize = 3 * 64 * 68 * 4;

/// `llc_wy` or, on tensor cores, `llc_wy_tc`: grid (chunks, B·H), 256 threads.
pub(crate) fn launch(s: Shape, elem: Elem, p: Precision) -> Launch {
    let tc = tensor_cores(p, elem);
    let name = format!("{}_{}", if tc { "llc_wy_tc" } else { "llc_wy" }, elem.suffix());
    Launch::new(Step::Wy, &kernels::LOGLINEAR_WY, name, fixed_dims(s))
        .on([s.chunks(elem.chunk()), s.bh(), 1], 256, if tc { WY_TC_SMEM } else { 0 })
        .opted_in(tc)
}

/// `llc_wy_tc_bf16`, the bf16 mode's: compiled with the bf16 kernels (`DH_BF16`).
pub(crate) fn launch_bf16(s: Shape) -> Launch {
    let mut defines = fixed_dims(s);
    defines.push("DH_BF16=1".to_string());
    Launch::new(Step::Wy, &kernels::LOGLINEAR_WY, "llc_wy_tc_bf16".to_string(), defines)
        .on([s.chunks(64), s.bh(), 1], 256, WY_TC_SMEM)
        .opted_in(true)
}

/// Runs `l` (from [`launch`] or [`launch_bf16`]): `W`, `U` (activations of type `T`) and, when
/// `tinv` holds one `CH × CH` matrix per chunk and batch·head (the lift), `T⁻¹`; `k`, `v` of type
/// `T`, `g` and `beta` of type `G`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<T: DeviceScalar, G: DeviceScalar>(
    l: &Launch,
    [k, v]: [&CudaView<'_, T>; 2],
    (g, has_g): (&CudaView<'_, G>, i32),
    beta: &CudaView<'_, G>,
    [w, u]: [&mut Pooled<T>; 2],
    (tinv, want_ti): (&mut Pooled<G>, bool),
    s: Shape,
    table: Option<&ChunkTable>,
) -> Result<()> {
    let nc = table.map_or(0, |c| c.chunks);
    let [ti, hi, dki, dvi, nci, _] = kernel_ints([s.t, s.h, s.dk, s.dv, nc, 0])?;
    let want_ti = want_ti as i32;
    let (f, cfg) = l.function()?;
    let none = crate::pool::take::<i32>(FAMILY, 1)?;
    let (tab, has_tab) = table_args(table, &none);
    launch!(gpu()?, FAMILY, f, cfg;
        k, v, g, &has_g, beta, &mut **w, &mut **u, &mut **tinv, &want_ti, &ti, &hi, &dki, &dvi, &nci, &tab, &has_tab)
}
