//! The generic quadratic form: one thread per (batch, token, head) sweeps `s = t, t−1, …, 0`
//! carrying `u_s = Φ_{s+1..t} q_t` (docs/math.md §2.1) and accumulates
//! `y_t = Σ_{s ≤ t} σ β_s (k_s · u_s) λ_t^(ℓ(t,s)) v_s`, with `ℓ` and
//! `λ = map(raw, 1)` from the spliced device functions. `O(T² (D_k + D_v))` work.

use cudarc::driver::LaunchConfig;
use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::{Error, Result, Tensors};
use ndarray::{ArrayD, IxDyn};

use super::FAMILY;
use crate::kernels;
use crate::runtime::{GpuReal, check_elems, err, gpu, int, launch};
use mixer_core::tensor::get;

/// Shared memory one block may use without opting in (bytes).
const SMEM: usize = 48 * 1024;

/// The kernel source for this mixer: common helpers, the mask's and the λ scheme's device
/// functions (from their registry entries; [`kernels::NO_LIFT`] without a lift), then the
/// generic kernel.
pub fn kernel_source(ll: &LogLinear) -> Result<String> {
    let Some(lift) = ll.lift else {
        return Ok(kernels::LOGLINEAR.full());
    };
    let mask = mixer_registry::mask(lift.mask.name)?;
    let mask_src = mask.cuda.ok_or_else(|| {
        err(FAMILY, format!("level mask `{}` has no CUDA device function (MaskEntry::cuda)", mask.name))
    })?;
    let lam = mixer_registry::lambda_scheme(lift.lambda.name)?;
    let lam_src = lam.cuda.ok_or_else(|| {
        err(FAMILY, format!("λ scheme `{}` has no CUDA device function (LambdaEntry::cuda)", lam.name))
    })?;
    Ok(kernels::with_prelude(&format!("{mask_src}\n{lam_src}"), kernels::LOGLINEAR.body))
}

/// Runs the quadratic form on the GPU.
pub fn run<F: GpuReal>(ll: &LogLinear, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let q = get(inputs, "q")?;
    let v = get(inputs, "v")?;
    let (b, t, h, dk) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let dv = v.shape()[3];
    if b * t * h * dv == 0 {
        return Ok(ArrayD::zeros(IxDyn(&[b, t, h, dv])));
    }
    let lifted = ll.lift.is_some();
    if inputs.contains_key("lambda_param") {
        return Err(err(
            FAMILY,
            "this quadratic kernel maps λ on the device with the parameter at 1, so it does not take \
             `lambda_param` yet; use the fast or recurrent form (λ mapped on the host) or the cpu backend",
        ));
    }
    let sz = std::mem::size_of::<F>();
    let per_thread = (dk + dv) * sz;
    let nt = (SMEM / per_thread.max(1)).min(128);
    if nt == 0 {
        return Err(err(
            FAMILY,
            format!("Dk + Dv = {} is too large for the per-thread shared memory", dk + dv),
        ));
    }
    let g = gpu()?;
    let f = g.function(FAMILY, &kernel_source(ll)?, &[], &format!("ll_quadratic_{}", F::SUFFIX))?;
    let opt = |name: &str, used: bool| -> Result<_> {
        if used { g.upload(FAMILY, get(inputs, name)?) } else { g.zeros::<F>(FAMILY, 1) }
    };
    let dq = g.upload(FAMILY, q)?;
    let dkk = g.upload(FAMILY, get(inputs, "k")?)?;
    let dvv = g.upload(FAMILY, v)?;
    let dg = opt("g", ll.base.has_decay())?;
    let db = opt("beta", ll.base.has_beta())?;
    let (dl, levels) = if lifted {
        let l = get(inputs, "lambda")?;
        check_elems(FAMILY, l.len())?;
        (g.upload(FAMILY, l)?, l.shape()[3])
    } else {
        (g.zeros::<F>(FAMILY, 1)?, 1)
    };
    let n = b * t * h;
    check_elems(FAMILY, n * dk.max(dv))?;
    let mut y = g.zeros::<F>(FAMILY, n * dv)?;
    let mut flag = g.zeros::<i32>(FAMILY, 1)?;
    let base = match ll.base {
        Base::LinearAttention => 0i32,
        Base::Mamba2 => 1,
        Base::GatedDeltaNet => 2,
    };
    let cfg = LaunchConfig {
        grid_dim: (int(FAMILY, "blocks", n.div_ceil(nt))? as u32, 1, 1),
        block_dim: (nt as u32, 1, 1),
        shared_mem_bytes: (nt * per_thread) as u32,
    };
    let (bi, ti, hi, dki, dvi, li) = (
        int(FAMILY, "B", b)?,
        int(FAMILY, "T", t)?,
        int(FAMILY, "H", h)?,
        int(FAMILY, "Dk", dk)?,
        int(FAMILY, "Dv", dv)?,
        int(FAMILY, "L", levels)?,
    );
    let lifted_i = lifted as i32;
    let scale = ll.scale;
    launch!(g, FAMILY, f, cfg;
        &dq, &dkk, &dvv, &dg, &db, &dl, &mut y, &mut flag, &bi, &ti, &hi, &dki, &dvi, &li, &base, &lifted_i, &scale)?;
    g.sync(FAMILY)?;
    let code = g.stream.clone_dtoh(&flag).map_err(|e| err(FAMILY, format!("device→host copy: {e}")))?;
    g.sync(FAMILY)?;
    if let (Some(lift), Some(&c)) = (ll.lift, code.first())
        && c != 0
    {
        return Err(Error::Value {
            name: "lambda".into(),
            constraint: if c == 1 {
                format!("mask `{}` must give levels in [0, L) for s ≤ t < T", lift.mask.name)
            } else {
                format!("λ scheme `{}` must map raw values to finite weights ≥ 0", lift.lambda.name)
            },
            found: format!("L = {levels}; the kernel found a violation (code {c})"),
        });
    }
    g.download(FAMILY, &y, &[b, t, h, dv])
}
