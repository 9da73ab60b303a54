//! Gated DeltaNet and its lift where the state pass's states do not fit in shared memory
//! ([`super::state_pass::StatePass::Sequential`]): the chunked form (docs/math.md §2.6) in one
//! kernel (`ll_chunked`, `kernels/loglinear_sequential.cu`), one thread block per (batch, head)
//! walking its chunks in order.
//!
//! Chunks of size `C = 2^c` (the configured `chunk`; the last one may be partial). Inside a chunk
//! the output is the quadratic form with the Fenwick levels `0..c` (`ℓ = bitlen(r ⊕ s)`) in the
//! WY/UT form: `T⁻¹ = (I + strict(diag(β)(KKᵀ ⊙ Γ)))⁻¹` applied by forward substitution to
//! `[I | diag(β e^γ)K | diag(β)V]`, giving `T⁻¹`, `W`, `U`; intra coefficients `A = P T⁻¹diag(β)`
//! and carried queries `Q̃ = σ diag(e^γ)Q − PW`, `P = σ QKᵀ ⊙ Γ`. Between chunks, chunk-level
//! states `H^(e) ∈ ℝ^(D_k × D_v)` follow the chunk-granular Fenwick recurrence (merge at
//! `m = ctz(i)`, read `y_r += λ_r^(c+e) Q̃_r H^(e)`, transition `H ← e^(γ_{n−1})H − K̂ᵀ(WH)`, insert
//! `K̂ᵀ U` at level 0). Scratch per block in global memory: `2n² + n(n + D_k + D_v) + n(D_k+D_v)`
//! values with `n = min(C, T)`, plus the `⌊log_2 ⌈T/C⌉⌋ + 2` chunk-level states.
//!
//! Without a lift the form runs from a state (docs/math.md §7): its one state starts as
//! `H_0 = S_0ᵀ` instead of zero, and the state after the last chunk is `S_T = H_Tᵀ`
//! (`S [B, H, Dv, Dk]`).

use mixer_core::Result;
use mixer_core::fenwick::bitlen;
use mixer_core::mixers::loglinear::LogLinear;

use super::common::{ChunkedInputs, Elem, FAMILY, Launch, Shape, Step, base_code, view_or_zero};
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu, int, launch};
use crate::tensor::{DeviceTensor, GpuReal};

/// Most scratch bytes the form allocates.
const MAX_SCRATCH: usize = 8 << 30;

/// Its sizes for chunks of `chunk` tokens: `(n, chunk-level states, scratch values per block)`.
fn sizes(s: Shape, chunk: usize, lifted: bool) -> (usize, usize, usize) {
    let nmax = chunk.min(s.t);
    let e_levels = if lifted { bitlen(s.t.div_ceil(chunk) - 1) + 1 } else { 1 };
    let ws_per = 2 * nmax * nmax + nmax * (nmax + s.dk + s.dv) + nmax * (s.dk + s.dv);
    (nmax, e_levels, ws_per)
}

/// `ll_chunked`: grid (B·H), 256 threads. Checks its scratch and index limits.
pub(crate) fn launch(ll: &LogLinear, s: Shape, elem: Elem) -> Result<Launch> {
    let chunk = ll.chunk;
    let (nmax, e_levels, ws_per) = sizes(s, chunk, ll.lift.is_some());
    let bh = s.bh();
    let sz = elem.bytes();
    let scratch = bh * (ws_per * sz + nmax * 8 + e_levels * s.dk * s.dv * sz);
    if scratch > MAX_SCRATCH {
        return Err(err(
            FAMILY,
            format!(
                "the chunked form needs {scratch} bytes of scratch (chunk {chunk}, B·H = {bh}, Dk = {}, \
                 Dv = {}); at most {MAX_SCRATCH} are allocated: use a smaller `chunk`",
                s.dk, s.dv
            ),
        ));
    }
    let name = format!("ll_chunked_{}", elem.suffix());
    Ok(Launch::new(Step::Sequential, &kernels::LOGLINEAR_SEQUENTIAL, name, Vec::new()).on([bh, 1, 1], 256, 0))
}

/// Runs `l` (from [`launch`]): `y`, from the initial state `s0` (`S_0 [B, H, Dv, Dk]`; `None`:
/// zero) and with `want_final` also the final state `S_T [B·H, Dv, Dk]` — a base mixer's only.
pub(crate) fn run<F: GpuReal>(
    ll: &LogLinear,
    x: &ChunkedInputs<'_, F>,
    l: &Launch,
    s0: Option<&DeviceTensor<F>>,
    want_final: bool,
) -> Result<(Pooled<F>, Option<Pooled<F>>)> {
    let s = x.shape();
    let [b, t, h, dk, dv] = s.dims();
    let lifted = ll.lift.is_some();
    if lifted && (s0.is_some() || want_final) {
        return Err(err(FAMILY, "internal: the lifts' state does not go through the sequential form"));
    }
    let chunk = ll.chunk;
    let cbits = ll.chunk_log2() as usize;
    let (nmax, e_levels, ws_per) = sizes(s, chunk, lifted);
    let levels = x.lam.as_ref().map_or(1, |(_, l)| *l);
    let g = gpu()?;
    let bh = s.bh();
    int(FAMILY, "B·H", bh)?;
    let (f, cfg) = l.function()?;
    let ((gv, _), bv, lv) = (x.g_view(), x.beta_view(), x.lam_view());
    let mut y = pool::take::<F>(FAMILY, b * t * h * dv)?;
    let mut ws = pool::zeros::<F>(FAMILY, bh * ws_per)?;
    let mut gws = pool::zeros::<f64>(FAMILY, bh * nmax)?;
    let mut st = pool::zeros::<F>(FAMILY, bh * e_levels * dk * dv)?;
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
    let (s0v, has_s0) = view_or_zero(s0, &x.zero);
    let mut fin = if want_final { Some(pool::take::<F>(FAMILY, bh * dk * dv)?) } else { None };
    let has_st = fin.is_some() as i32;
    // Without a final state the kernel is given s0's buffer for it (never written: has_st = 0).
    match fin.as_mut() {
        Some(fs) => launch!(g, FAMILY, f, cfg;
            &qv, &kv, &vv, &gv, &bv, &lv, &mut *y, &mut *ws, &mut *gws, &mut *st,
            &ti, &hi, &dki, &dvi, &li, &ci, &cbi, &base, &lifted_i, &ei, &ni, &scale,
            &s0v, &has_s0, &mut **fs, &has_st)?,
        None => launch!(g, FAMILY, f, cfg;
            &qv, &kv, &vv, &gv, &bv, &lv, &mut *y, &mut *ws, &mut *gws, &mut *st,
            &ti, &hi, &dki, &dvi, &li, &ci, &cbi, &base, &lifted_i, &ei, &ni, &scale,
            &s0v, &has_s0, &s0v, &has_st)?,
    }
    Ok((y, fin))
}
