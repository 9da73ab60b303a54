//! The backward pass of the GLR's `fast` form on CUDA (`kernels/glr_backward.cu`, docs/gradients.md),
//! for `y_t = α_{t,0} x_t + Σ_{k: f(k) ≤ t} (α_{t,k+1} x_{d_k(t)} + β_{t,k} y_{d_k(t)})`: the
//! reverse sparse recurrence of the CPU's backward (`mixer-cpu/src/glr/backward.rs`).
//!
//! With `ȳ` the output's cotangent, the total cotangent of `y_t` gathers the reads of `y_t` by
//! later tokens, `g_t = ȳ_t + Σ_{t' > t, k: d_k(t') = t} β_{t',k} g_{t'}` (`g = ȳ` without
//! β-terms), and then
//! `ᾱ_{t,0} = g_t x_t`, `ᾱ_{t,k+1} = g_t x_{d_k(t)}`, `β̄_{t,k} = g_t y_{d_k(t)}` (0 for inactive
//! taps, `f(k) > t`) and `x̄_t = α_{t,0} g_t + Σ_{t' > t, k: d_k(t') = t} α_{t',k+1} g_{t'}`.
//!
//! `g` is computed one of two ways:
//! - **translation-invariant patterns** (`d_k(t) = t − f(k)`; every pattern that is not a
//!   cache-efficient lattice): in reversed time `s = T − 1 − t`, `h_s = g_t` obeys
//!   `h_s = ȳ_{T−1−s} + Σ_{k: f(k) ≤ s} β_{T−1−s+f(k), k} h_{s−f(k)}`, the GLR's own forward
//!   recurrence with the pattern on `B`, input `ȳ` reversed, `α = 1` and each tap's `β` taken at
//!   its reader. The forward's pipelined kernel compiled with `GLR_REV` ([`super::fast::tiled`])
//!   reads `ȳ` and `β` at those places, so the reverse recurrence costs one forward and no copy;
//!   `glrb_grads` reads `g` reversed and gathers `x̄`'s taps on `A` (`Σ_k α_{t+f(k),k+1}
//!   g_{t+f(k)}`, `k` ascending). Extra memory: `g`;
//! - **cache-efficient lattices**: `glrb_reverse`, one thread per (batch, channel), runs tokens
//!   from `T − 1` down to 0: when token `t` is reached its `g_t` is final, and the thread
//!   scatters `β_{t,k} g_t` into `g_{d_k(t)}` and `α_{t,k+1} g_t` into the accumulator of
//!   `x̄_{d_k(t)}` — positions before `t` of its own column, so a plain read-modify-write with no
//!   race, in a fixed order (`t` descending, `k` ascending). Scatters to the last 32 positions go
//!   to a ring in shared memory (the thread's own column), farther ones to global memory, their
//!   loads issued before the near work; `g` is kept in global scratch `[B, T, C]`. The
//!   transposed pattern is never built: positions come from the forward's host-computed (offset,
//!   stride) table ([`super::fast::device_table`]). Skipped when there is nothing to scatter
//!   (`on = a` without `d_x`). Sequential per channel, so at small `B·C` it is bound by latency.
//!
//! Then `glrb_grads`, one thread per (batch, token, channel): `ᾱ`, `β̄`, `x̄` from `g`, `x` and
//! `y`.
//!
//! `y` is the forward's output when the call carries it (`mixer_core::grad::SAVED_OUTPUT`), else
//! recomputed by the forward ([`super::fast::run`]), when `d_beta` is asked for. Work
//! `O(T · K)` per channel, as the forward; extra memory besides the above: `y`, `B·T·C`.
//! Deterministic: every sum is formed by one thread in a fixed order. The `tf32`
//! and `bf16` modes run the same `f32` kernels (bf16 activations and `dy` converted on the
//! device) and return `f32` gradients.

use std::borrow::Cow;

use mixer_core::error::fmt_shape;
use mixer_core::grad::SAVED_OUTPUT;
use mixer_core::mixers::glr::Glr;
use mixer_core::{Error, Precision, Requires, Result, grad_name};

use super::common::{FAMILY, dims};
use super::fast::device_table;
use crate::forms::{cotangent, input, input_opt};
use crate::kernels;
use crate::pool;
use crate::runtime::{err, gpu, grid1, int, launch};
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// Threads per block of both launches (`GLRB_NT`, the width of the reverse sweep's shared-memory
/// rings). The reverse sweep has only `B·C` threads, each with a long sequential loop: small
/// blocks spread them over every multiprocessor.
const THREADS: u32 = 64;

/// Checks that input `name` has shape `want`.
fn expect_shape(name: &str, got: &[usize], want: &[usize]) -> Result<()> {
    if got == want { Ok(()) } else { Err(Error::shape(name, fmt_shape(want), fmt_shape(got))) }
}

/// The `fast` backward on device tensors: `d_x`, `d_alpha` and (with β-terms) `d_beta`, those
/// `req` asks for, each of its input's shape, `F` storage, nothing waited for.
pub fn run<F: GpuReal>(
    glr: &Glr,
    x: &DeviceTensors,
    dy: &AnyDeviceTensor,
    req: &Requires,
    _p: Precision,
) -> Result<DeviceTensors> {
    let xs = input::<F>(x, "x")?;
    let &[b, t, c] = xs.shape() else {
        return Err(Error::shape("x", "[B, T, C]", fmt_shape(xs.shape())));
    };
    let on = glr.on();
    let (has_a, has_b) = (on.has_a(), on.has_b());
    let k = glr.slots(t).len();
    let na = if has_a { k + 1 } else { 1 };
    let alpha = input::<F>(x, "alpha")?;
    let a_shape = if has_a { vec![b, t, na, c] } else { vec![b, t, c] };
    expect_shape("alpha", alpha.shape(), &a_shape)?;
    let beta = if has_b { input_opt::<F>(x, "beta")? } else { None };
    let b_shape = [b, t, k, c];
    match (&beta, has_b) {
        (Some(v), _) => expect_shape("beta", v.shape(), &b_shape)?,
        (None, true) => {
            return Err(Error::MissingInput {
                name: "beta".into(),
                expected: format!("a device tensor of shape {}", fmt_shape(&b_shape)),
                given: x.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        }
        (None, false) => {}
    }
    let gy = cotangent::<F>(dy, &[b, t, c])?;
    let want_x = req.wants("x");
    let want_a = req.wants("alpha");
    let want_b = has_b && req.wants("beta");
    let n = b * t * c;
    let mut out = DeviceTensors::new();
    if n == 0 || !(want_x || want_a || want_b) {
        // No output (or nothing asked): every asked gradient is zero.
        for (name, shape, w) in
            [("x", vec![b, t, c], want_x), ("alpha", a_shape, want_a), ("beta", b_shape.to_vec(), want_b)]
        {
            if w {
                out.insert(grad_name(name), F::wrap(DeviceTensor::<F>::zeros(&shape)?));
            }
        }
        return Ok(out);
    }
    // Both launches are 1-D grids of THREADS-thread blocks (indices are 64-bit in the kernels).
    int(FAMILY, "blocks", n.div_ceil(THREADS as usize))?;
    let tab = device_table(glr, t)?;
    if tab.k != k {
        return Err(err(FAMILY, format!("internal: the pattern table has {} taps, K(T) = {k}", tab.k)));
    }
    // y, read at the taps' positions by d_beta: the forward's output when the call carries it
    // (SAVED_OUTPUT), else the forward's own kernel again (exact arithmetic).
    let y: Option<Cow<'_, DeviceTensor<F>>> = match (want_b, input_opt::<F>(x, SAVED_OUTPUT)?) {
        (false, _) => None,
        (true, Some(y)) => {
            expect_shape(SAVED_OUTPUT, y.shape(), &[b, t, c])?;
            Some(y)
        }
        (true, None) => {
            let y = super::fast::run::<F>(glr, x, Precision::Exact)?;
            Some(Cow::Owned(
                F::unwrap(&y)
                    .cloned()
                    .ok_or_else(|| err(FAMILY, "internal: the forward returned another dtype"))?,
            ))
        }
    };
    let g = gpu()?;
    let opts = [format!("-DGLRB_NT={THREADS}")];
    let f = |name: &str| g.kernel(FAMILY, &kernels::GLR_BACKWARD, &opts, &format!("{name}_{}", F::SUFFIX));
    let [bi, ti, ci, ki, nai] = dims(b, t, c, k, na)?;
    let ce = glr.pattern().cache_efficient();
    let cei = i32::from(ce);
    // Translation-invariant patterns (`d_k(t) = t − f(k)`) run the reverse recurrence as a forward
    // recurrence in reversed time through the forward's own kernel, and gather x̄'s taps on A;
    // cache-efficient lattices take the reverse sweep.
    let by_forward = !ce;
    let scatter_x = has_a && want_x && !by_forward;
    let (hai, hbi, sxi) = (i32::from(has_a), i32::from(has_b), i32::from(scatter_x));
    let (wxi, wai, wbi) = (i32::from(want_x), i32::from(want_a), i32::from(want_b));
    // Outputs not asked for are one-element buffers the kernels never touch.
    let len = |w: bool, m: usize| if w { m } else { 0 };
    let mut dx = pool::take::<F>(FAMILY, len(want_x, n))?;
    let mut da = pool::take::<F>(FAMILY, len(want_a, b * t * na * c))?;
    let mut db = pool::take::<F>(FAMILY, len(want_b, b * t * k * c))?;
    let zero = pool::zeros::<F>(FAMILY, 1)?;
    let (xv, av, gyv) = (xs.view(), alpha.view(), gy.view());
    let bv = beta.as_ref().map_or_else(|| zero.slice(0..1), |v| v.view());
    // g, the total cotangents of y (ȳ itself without taps on B): reversed in time when the forward
    // computes them.
    let gs = if has_b && by_forward {
        // The forward's kernel compiled for the reverse recurrence: ȳ read reversed, each tap's β
        // at its reader, α = 1 (not read).
        let views = [&gyv, &zero.slice(0..1), &bv];
        Some(super::fast::tiled::<F>(&tab, false, views, [b, t, c], [false, true], true)?)
    } else if !by_forward && (has_b || scatter_x) {
        let mut gs = pool::take::<F>(FAMILY, len(has_b, n))?;
        launch!(g, FAMILY, f("glrb_reverse")?, grid1(b * c, THREADS);
            &gyv, &av, &bv, &*tab.off, &*tab.strides, &mut *gs, &mut *dx,
            &bi, &ti, &ci, &ki, &nai, &hbi, &sxi, &cei)?;
        has_b.then_some(gs)
    } else {
        None
    };
    let (revi, gatheri) = (i32::from(has_b && by_forward), i32::from(by_forward));
    let gv = gs.as_ref().map_or_else(|| gy.view(), |v| v.slice(0..n));
    let yv = y.as_ref().map_or_else(|| zero.slice(0..1), |v| v.view());
    launch!(g, FAMILY, f("glrb_grads")?, grid1(n, THREADS);
        &xv, &av, &yv, &gv, &*tab.off, &*tab.strides, &mut *dx, &mut *da, &mut *db,
        &bi, &ti, &ci, &ki, &nai, &hai, &hbi, &wxi, &wai, &wbi, &cei, &revi, &gatheri)?;
    if want_x {
        out.insert(grad_name("x"), F::wrap(DeviceTensor::from_pooled(dx, &[b, t, c])?));
    }
    if want_a {
        out.insert(grad_name("alpha"), F::wrap(DeviceTensor::from_pooled(da, &a_shape)?));
    }
    if want_b {
        out.insert(grad_name("beta"), F::wrap(DeviceTensor::from_pooled(db, &b_shape)?));
    }
    Ok(out)
}
