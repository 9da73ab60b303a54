//! The chunked (`fast`) form with the Fenwick mask (docs/math.md §2.6): the entry point of the
//! form, which checks the inputs, maps λ on the device and picks the kernels — the chunk-parallel
//! passes of [`super::chunk_tree`] for every member, and, when gated DeltaNet's sequential-pass
//! states do not fit in shared memory, the one-block-per-head kernel below
//! (`kernels/loglinear_fenwick.cu`).
//!
//! That kernel: chunks of size `C = 2^c` (the configured `chunk`; the last one may be partial).
//! Inside a chunk the output is the quadratic form with the Fenwick levels `0..c`
//! (`ℓ = bitlen(r ⊕ s)`) in the WY/UT form: `T⁻¹ = (I + strict(diag(β)(KKᵀ ⊙ Γ)))⁻¹` applied by
//! forward substitution to `[I | diag(β e^γ)K | diag(β)V]`, giving `T⁻¹`, `W`, `U`; intra
//! coefficients `A = P T⁻¹diag(β)` and carried queries `Q̃ = σ diag(e^γ)Q − PW`,
//! `P = σ QKᵀ ⊙ Γ`. Between chunks, chunk-level states `H^(e) ∈ ℝ^(D_k × D_v)` follow the
//! chunk-granular Fenwick recurrence (merge at `m = ctz(i)`, read `y_r += λ_r^(c+e) Q̃_r H^(e)`,
//! transition `H ← e^(γ_{n−1})H − K̂ᵀ(WH)`, insert `K̂ᵀ U` at level 0). One thread block per
//! (batch, head) walks its chunks in order; scratch per block in global memory:
//! `2n² + n(n + D_k + D_v) + n(D_k+D_v)` values with `n = min(C, T)`, plus the
//! `⌊log_2 ⌈T/C⌉⌋ + 2` chunk-level states.

use std::borrow::Cow;

use cudarc::driver::{CudaView, LaunchConfig};
use mixer_core::fenwick::bitlen;
use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::{Error, Precision, Result};

use super::{FAMILY, chunk_tree, delta, lambda};
use crate::forms::{finish, input, input_opt};
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{GpuReal, err, gpu, int, launch};
use crate::tensor::{AnyDeviceTensor, DeviceScalar, DeviceTensor, DeviceTensors};

/// Most scratch bytes the form allocates.
const MAX_SCRATCH: usize = 8 << 30;

/// The base code the kernels take.
pub(crate) fn base_code(b: Base) -> i32 {
    match b {
        Base::LinearAttention => 0,
        Base::Mamba2 => 1,
        Base::GatedDeltaNet => 2,
    }
}

/// The inputs of the chunked form, checked and on the device.
pub(crate) struct ChunkedInputs<'a, F: GpuReal> {
    pub q: Cow<'a, DeviceTensor<F>>,
    pub k: Cow<'a, DeviceTensor<F>>,
    pub v: Cow<'a, DeviceTensor<F>>,
    /// `g` (absent: linear attention) and gated DeltaNet's `beta`.
    pub g: Option<Cow<'a, DeviceTensor<F>>>,
    pub beta: Option<Cow<'a, DeviceTensor<F>>>,
    /// The mapped λ weights and their level count (lifts only).
    pub lam: Option<(DeviceTensor<F>, usize)>,
    /// `[B, T, H, Dk, Dv]`.
    pub dims: [usize; 5],
    /// One zero, passed to the kernels in place of an input the mixer does not have (never read).
    pub zero: Pooled<F>,
}

/// An optional input as the kernels take it: its view and 1, or the one-entry `zero` buffer and
/// 0 where it is absent (`has_g`).
pub(super) fn view_or_zero<'a, T: DeviceScalar>(
    t: Option<&'a DeviceTensor<T>>,
    zero: &'a Pooled<T>,
) -> (CudaView<'a, T>, i32) {
    (t.map_or_else(|| zero.slice(0..1), |d| d.view()), t.is_some() as i32)
}

impl<F: GpuReal> ChunkedInputs<'_, F> {
    /// `g`, or the zero buffer without a decay, and whether `g` is there (the kernels' `has_g`).
    pub fn g_view(&self) -> (CudaView<'_, F>, i32) {
        view_or_zero(self.g.as_deref(), &self.zero)
    }

    /// `beta`, or the zero buffer without one.
    pub fn beta_view(&self) -> CudaView<'_, F> {
        self.beta.as_ref().map_or_else(|| self.zero.slice(0..1), |d| d.view())
    }

    /// The mapped λ, or the zero buffer without a lift.
    pub fn lam_view(&self) -> CudaView<'_, F> {
        self.lam.as_ref().map_or_else(|| self.zero.slice(0..1), |(d, _)| d.view())
    }
}

/// Runs the chunked form on device tensors: every member by the chunk-parallel passes of
/// [`chunk_tree`], except gated DeltaNet and its lift when the sequential pass's states do not fit
/// in shared memory (in f32 `Dk` above about 140 without the lift; with it, `Dk = 64` up to
/// T = 2²⁰): those run the sequential WY/UT kernel below.
pub fn run<F: GpuReal>(ll: &LogLinear, x: &DeviceTensors, p: Precision) -> Result<AnyDeviceTensor> {
    if p == Precision::Bf16 && F::ELEM == "f32" {
        if let Some(y) = chunk_tree::run_bf16(ll, x)? {
            return Ok(y);
        }
        if let Some(y) = delta::run_bf16(ll, x)? {
            return Ok(y);
        }
    }
    let (q, k, v) = (input::<F>(x, "q")?, input::<F>(x, "k")?, input::<F>(x, "v")?);
    let (b, t, h, dk) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let dv = v.shape()[3];
    if b * t * h * dv == 0 {
        return finish(DeviceTensor::<F>::zeros(&[b, t, h, dv])?, p);
    }
    let lam = match ll.lift {
        Some(_) => {
            let raw = input::<F>(x, "lambda")?;
            let levels = raw.shape()[3];
            // The highest Fenwick level T tokens read (MATH §2.2), whatever the chunking.
            let need = bitlen(t - 1);
            if need >= levels {
                return Err(Error::Value {
                    name: "lambda".into(),
                    constraint: format!(
                        "T = {t} reads Fenwick level {need}, so λ needs more than {need} levels"
                    ),
                    found: format!("L = {levels}"),
                });
            }
            let param = input_opt::<F>(x, "lambda_param")?;
            Some((lambda::weights(ll, &raw, param.as_deref())?, levels))
        }
        None => None,
    };
    let inp = ChunkedInputs {
        g: if ll.base.has_decay() { input_opt::<F>(x, "g")? } else { None },
        beta: if ll.base.has_beta() { input_opt::<F>(x, "beta")? } else { None },
        q,
        k,
        v,
        lam,
        dims: [b, t, h, dk, dv],
        zero: pool::zeros::<F>(FAMILY, 1)?,
    };
    let y = match ll.base {
        Base::GatedDeltaNet
            if delta::delta_h_smem::<F>(dk, delta::delta_levels::<F>(ll.lift.is_some(), t))
                <= crate::runtime::max_dynamic_smem() =>
        {
            delta::run_delta(ll, &inp, p)?
        }
        Base::GatedDeltaNet => sequential(ll, &inp)?,
        Base::LinearAttention | Base::Mamba2 => chunk_tree::run(ll, &inp, p)?,
    };
    let checks = inp.lam.as_ref().map(|(l, _)| l.checks().to_vec()).unwrap_or_default();
    finish(DeviceTensor::from_pooled(y, &[b, t, h, dv])?.with_checks(checks), p)
}

/// Gated DeltaNet and its lift with states too large for shared memory: one block per (batch,
/// head) walking its chunks.
fn sequential<F: GpuReal>(ll: &LogLinear, x: &ChunkedInputs<'_, F>) -> Result<Pooled<F>> {
    let [b, t, h, dk, dv] = x.dims;
    let lifted = ll.lift.is_some();
    let chunk = ll.chunk;
    let cbits = ll.chunk_log2() as usize;
    let n_chunks = t.div_ceil(chunk);
    let nmax = chunk.min(t);
    let e_levels = if lifted { bitlen(n_chunks - 1) + 1 } else { 1 };
    let levels = x.lam.as_ref().map_or(1, |(_, l)| *l);
    let g = gpu()?;
    let bh = b * h;
    let ws_per = 2 * nmax * nmax + nmax * (nmax + dk + dv) + nmax * (dk + dv);
    let sz = std::mem::size_of::<F>();
    let scratch = bh * (ws_per * sz + nmax * 8 + e_levels * dk * dv * sz);
    if scratch > MAX_SCRATCH {
        return Err(err(
            FAMILY,
            format!(
                "the chunked form needs {scratch} bytes of scratch (chunk {chunk}, B·H = {bh}, Dk = {dk}, \
                 Dv = {dv}); at most {MAX_SCRATCH} are allocated: use a smaller `chunk`"
            ),
        ));
    }
    let f = g.kernel(FAMILY, &kernels::LOGLINEAR_FENWICK, &[], &format!("ll_chunked_{}", F::SUFFIX))?;
    let ((gv, _), bv, lv) = (x.g_view(), x.beta_view(), x.lam_view());
    let mut y = pool::take::<F>(FAMILY, b * t * h * dv)?;
    let mut ws = pool::zeros::<F>(FAMILY, bh * ws_per)?;
    let mut gws = pool::zeros::<f64>(FAMILY, bh * nmax)?;
    let mut st = pool::zeros::<F>(FAMILY, bh * e_levels * dk * dv)?;
    let cfg = LaunchConfig {
        grid_dim: (int(FAMILY, "B·H", bh)? as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    int(FAMILY, "B·T·H·max(Dk, Dv)", b * t * h * dk.max(dv))?;
    int(FAMILY, "chunk²", nmax * nmax)?;
    let (ti, hi, dki, dvi, li, ci, cbi) = (
        int(FAMILY, "T", t)?,
        int(FAMILY, "H", h)?,
        int(FAMILY, "Dk", dk)?,
        int(FAMILY, "Dv", dv)?,
        int(FAMILY, "L", levels)?,
        int(FAMILY, "chunk", chunk)?,
        cbits as i32,
    );
    let (base, lifted_i, ei, ni) =
        (base_code(ll.base), lifted as i32, e_levels as i32, int(FAMILY, "n", nmax)?);
    let scale = ll.scale;
    let (qv, kv, vv) = (x.q.view(), x.k.view(), x.v.view());
    launch!(g, FAMILY, f, cfg;
        &qv, &kv, &vv, &gv, &bv, &lv, &mut *y, &mut *ws, &mut *gws, &mut *st,
        &ti, &hi, &dki, &dvi, &li, &ci, &cbi, &base, &lifted_i, &ei, &ni, &scale)?;
    Ok(y)
}
