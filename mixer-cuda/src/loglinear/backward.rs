//! The `fast` backward of the base mixers on CUDA (docs/math.md §2.7, docs/gradients.md "GPU"):
//! the vector–Jacobian products `d_q`, `d_k`, `d_v`, `d_g`, `d_beta` for a cotangent `dy`,
//! kernels in `kernels/loglinear_backward.cu`; the scalar-decay lifts through
//! [`super::backward_lift`] (`dg` below, unchanged); the lifted gated DeltaNet through
//! [`super::backward_lift_delta`].
//!
//! **Linear attention and Mamba-2, by transposed operators.** Per (batch, head), with
//! `G_t = Σ_{r≤t} g_r` and `y_t = σ Σ_{s≤t} e^{G_t−G_s} (q_t·k_s) v_s`:
//! - `dq_t = σ Σ_{s≤t} e^{G_t−G_s} (dy_t·v_s) k_s` — the forward with `(q, k, v) ← (dy, v, k)`;
//! - `dv_s = σ Σ_{t≥s} e^{G_t−G_s} (k_s·q_t) dy_t` and `dk_s = σ Σ_{t≥s} e^{G_t−G_s} (v_s·dy_t) q_t`
//!   — anti-causal, so the forward on time-reversed sequences (`t' = T−1−t`) with the reversed
//!   log-decays `g'_0 = 0`, `g'_j = g_{T−j}`: `dv = rev(fwd(rev k, rev q, rev dy, g'))`,
//!   `dk = rev(fwd(rev v, rev dy, rev q, g'))`;
//! - `dg_r = Σ_{s<r≤t} σ e^{G_t−G_s} (q_t·k_s)(dy_t·v_s)`, the pairs that straddle `r`, from the
//!   chunk boundaries (`llb_dg_chunk`, f64 dots and sums): for `r` in a chunk ending at `b`,
//!   `dg_r = Σ_{r≤t<b} (q_t·dq_t − k_t·dk_t) + dg_b`, and at a boundary
//!   `dg_b = e^{g_b} ⟨S_{b−1}, P_b⟩` from the states the `dq` run and the reversed `dk` run enter
//!   their chunks with (`S_{b−1} = Σ_{s<b} e^{G_{b−1}−G_s} v_s k_sᵀ`,
//!   `P_b = Σ_{t≥b} e^{G_t−G_b} σ dy_t q_tᵀ`). The reversed runs are padded in front to whole
//!   chunks so that their chunks start where the forward's do. The suffix `Σ_{t≥r} (q·dq − k·dk)`
//!   over the rest of the sequence, whose two sums cancel (its total is exactly 0), would carry the
//!   rounding of `dq` and `dk` from every later token; here only a chunk's. So the tf32 kernels
//!   serve Mamba-2 too. (The lifts, whose state is a level array, keep that suffix form: `dG`
//!   token-parallel, then the suffix sums by tiles of `L` tokens ([`dg_tile`]), every sum in a
//!   fixed order, last token first; their `dq` and `dk` come from exact kernels.)
//!
//! The reversed runs take the scale `1` and `σ dy` (reversed and scaled in one kernel), so that a
//! state enters them unscaled (below); the products are the same.
//!
//! **From a state** (docs/math.md §7.1, "The CUDA backward from a state"): with the initial state
//! `S_0` and the final state's cotangent `S̄_T` (`None`: zero), `y_t` gains `σ e^{G_t} S_0 q_t` and
//! `S_T = e^{G_{T−1}} S_0 + Σ_s e^{G_{T−1}−G_s} v_s k_sᵀ` is differentiated too, which makes each
//! run above a run of the forward from a state ([`super::fast::run_from`]):
//! - `dq` is the forward from `S_0ᵀ` (adds `σ e^{G_t} S_0ᵀ dy_t`); its final state is `S_Tᵀ`;
//! - `dv` is the reversed forward from `S̄_T` (adds `e^{G_{T−1}−G_s} S̄_T k_s`), `dk` from `S̄_Tᵀ`
//!   (adds `e^{G_{T−1}−G_s} S̄_Tᵀ v_s`);
//! - `S̄_0 = σ Σ_t e^{G_t} dy_t q_tᵀ + e^{G_{T−1}} S̄_T` is `e^{g_0}` times the final state of the
//!   reversed run for `dv` (the reversed decays lack `g_0`);
//! - `dG_{T−1}` gains `⟨S̄_T, S_T⟩` (the `G_{T−1}` in `S_T`), so every `dg_i` does: the last
//!   chunk's boundary value `dg_T`; the states at the other boundaries carry `S_0`'s and `S̄_T`'s
//!   terms as the runs start from them.
//!
//! A backward from a state runs in the exact mode whatever the mode asked, on the values as the
//! mode stores them ([`run_from`]).
//!
//! The forward is this backend's `fast` form ([`super::fast::run_keeping`], which also hands back
//! the states entering the chunks), in the call's mode: exact, tf32, or in the bf16 mode on the
//! bf16 activations and `dy` as given (the reversed copies, the runs' outputs `dq`, `dk`, `dv`
//! bf16 too, their chunk states and `dg` f32; `σ dy` rounded to bf16 for the reversed runs), so
//! that the runs take the forward's bf16 kernels; with f32 activations or `dy` the bf16 mode
//! converts them to f32 and runs the tf32 kernels. The gradients come back as f32. The recipe
//! ([`transposed`]) is written once over [`Transposes`]; the tests run it on the CPU too.
//!
//! **Gated DeltaNet** runs the chunked backward through the WY/UT form
//! ([`super::backward_chunked`]), from a state by starting its two passes from `S_0ᵀ` and `S̄_Tᵀ`.

use std::marker::PhantomData;

use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::{Error, Precision, Requires, Result, grad_name};

use super::common::{Device, Elem, FAMILY, Launch, Storage, view_or_zero};
use super::{backward_chunked, backward_lift, backward_lift_delta, fast};
use crate::forms::input;
use crate::kernels;
use crate::pool;
use crate::runtime::{err, gpu, grid1, int, launch};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};
use crate::tensor::{DeviceScalar, GpuReal};
use cudarc::driver::{DeviceRepr, LaunchConfig};

/// Why the `fast` backward of `ll` does not run on CUDA, or `None`: a lift needs the Fenwick mask
/// (as its `fast` form does).
pub fn unsupported(ll: &LogLinear) -> Option<String> {
    let lift = ll.lift?;
    (!lift.mask.is_fenwick()).then(|| {
        format!("the fast backward of a lift needs the `fenwick` level mask, not `{}`", lift.mask.name)
    })
}

/// The `fast` backward on device tensors: `d_<input>` for every given input `req` asks for
/// (shapes of the inputs, `F`; f32 in the bf16 mode). See the module documentation.
pub fn run<F: GpuReal>(
    ll: &LogLinear,
    x: &DeviceTensors,
    dy: &AnyDeviceTensor,
    req: &Requires,
    p: Precision,
) -> Result<DeviceTensors> {
    run_from::<F>(ll, x, None, dy, None, req, p).map(|(g, _)| g)
}

/// The backward of the `fast` form from the initial state `s0` with the final state's cotangent
/// `d_final` (both `S [B, H, Dv, Dk]` as `F`; `None`: zero): `d_<input>` as [`run`] gives them and,
/// with `s0`, the initial state's gradient `S̄_0 [B, H, Dv, Dk]` (module documentation). With
/// either state it runs in the exact mode whatever `p` asks; the lifts' level states are refused
/// here ([`unsupported`], [`fast::state_unsupported`]): their backward from a state is
/// [`super::lift_state::backward_from`]'s.
pub fn run_from<F: GpuReal>(
    ll: &LogLinear,
    x: &DeviceTensors,
    s0: Option<&DeviceTensor<F>>,
    dy: &AnyDeviceTensor,
    d_final: Option<&DeviceTensor<F>>,
    req: &Requires,
    p: Precision,
) -> Result<(DeviceTensors, Option<DeviceTensor<F>>)> {
    let stateful = s0.is_some() || d_final.is_some();
    if let Some(why) = unsupported(ll).or_else(|| stateful.then(|| fast::state_unsupported(ll)).flatten()) {
        return Err(err(FAMILY, why));
    }
    let p = if stateful { Precision::Exact } else { p };
    let dy_map: DeviceTensors = [("dy".to_string(), dy.clone())].into_iter().collect();
    // The activations and `dy` as given (their sizes are checked here) and, where a path needs
    // them so, as `F` (bf16 converted: not on the bf16 mode's own path).
    let (q, k, v) = (given(x, "q")?, given(x, "k")?, given(x, "v")?);
    let as_f = || -> Result<[std::borrow::Cow<'_, DeviceTensor<F>>; 4]> {
        Ok([input::<F>(x, "q")?, input::<F>(x, "k")?, input::<F>(x, "v")?, input::<F>(&dy_map, "dy")?])
    };
    let &[b, t, h, dk] = q.shape() else {
        return Err(Error::shape("q", "[B, T, H, Dk]", format!("{:?}", q.shape())));
    };
    let dv = v.shape().get(3).copied().unwrap_or(0);
    for (name, got, want) in
        [("k", k.shape(), [b, t, h, dk]), ("v", v.shape(), [b, t, h, dv]), ("dy", dy.shape(), [b, t, h, dv])]
    {
        if got != want {
            return Err(Error::shape(name, format!("{want:?}"), format!("{got:?}")));
        }
    }
    for (name, a) in [("S", s0), ("d_final_state.S", d_final)] {
        if let Some(a) = a
            && a.shape() != [b, h, dv, dk]
        {
            return Err(Error::shape(name, format!("{:?}", [b, h, dv, dk]), format!("{:?}", a.shape())));
        }
    }
    let g = if ll.base.has_decay() { Some(input::<F>(x, "g")?) } else { None };
    let beta = if ll.base.has_beta() { Some(input::<F>(x, "beta")?) } else { None };
    for (name, a) in [("g", &g), ("beta", &beta)] {
        if let Some(a) = a
            && a.shape() != [b, t, h]
        {
            return Err(Error::shape(name, format!("{:?}", [b, t, h]), format!("{:?}", a.shape())));
        }
    }
    let wants = |n: &str| req.wants(n) && x.contains_key(n);
    let mut out = DeviceTensors::new();
    let mut put = |name: &str, a: DeviceTensor<F>| {
        if wants(name) {
            out.insert(grad_name(name), F::wrap(a));
        }
    };
    if b * t * h * dk * dv == 0 {
        // y is identically zero (or empty) and S_T = S_0 (T = 0, or a state without entries):
        // every input gradient is zero, and S̄_0 = S̄_T. (The conversion checks the dtypes.)
        as_f()?;
        put("q", DeviceTensor::zeros(q.shape())?);
        put("k", DeviceTensor::zeros(k.shape())?);
        put("v", DeviceTensor::zeros(v.shape())?);
        if ll.base.has_decay() {
            put("g", DeviceTensor::zeros(&[b, t, h])?);
        }
        if ll.base.has_beta() {
            put("beta", DeviceTensor::zeros(&[b, t, h])?);
        }
        for name in ["lambda", "lambda_param"] {
            if let Some(a) = x.get(name) {
                put(name, DeviceTensor::zeros(a.shape())?);
            }
        }
        let ds0 = match (s0, d_final) {
            (None, _) => None,
            (Some(_), Some(d)) => Some(d.clone()),
            (Some(_), None) => Some(DeviceTensor::zeros(&[b, h, dv, dk])?),
        };
        return Ok((out, ds0));
    }
    let ds0 = match ll.base {
        Base::LinearAttention | Base::Mamba2 if ll.lift.is_some() => {
            let [q, k, v, dy] = as_f()?;
            let r = backward_lift::scalar::<F>(ll, x, [&q, &k, &v, &dy], g.as_deref(), [b, t, h, dk, dv])?;
            if g.is_some() && wants("g") {
                let ops = OnDevice::<F> { ll, p: Precision::Exact, _f: PhantomData };
                put("g", ops.decay_grad([&q, &r.dq, &k, &r.dk])?);
            }
            put_lift(&mut put, r);
            None
        }
        Base::LinearAttention | Base::Mamba2 => {
            // The tf32 kernels in the tf32 mode, and the bf16 ones on bf16 activations and `dy`
            // in the bf16 mode (else the tf32 ones on f32 copies): `d_g` is formed from the chunk
            // boundaries (module documentation), so their rounding of `dq` and `dk` enters it over
            // one chunk only.
            let on_bf16 = p == Precision::Bf16
                && matches!(fast::storage::<F>(x), Storage::Bf16 { .. })
                && matches!(dy, AnyDeviceTensor::Bf16(_));
            let (fp, qkvd) = match p {
                Precision::Exact => (Precision::Exact, None),
                Precision::Bf16 if on_bf16 => (Precision::Bf16, Some([q, k, v, dy].map(|a| a.clone()))),
                _ => (Precision::Tf32, None),
            };
            let qkvd = match qkvd {
                Some(a) => a,
                None => as_f()?.map(|a| F::wrap(a.into_owned())),
            };
            let ops = OnDevice::<F> { ll, p: fp, _f: PhantomData };
            let want = Wants { q: wants("q"), k: wants("k"), v: wants("v"), g: g.is_some() && wants("g") };
            let [qa, ka, va, dya] = &qkvd;
            let ga = g.as_deref().map(|g| F::wrap(g.clone()));
            let sa = [s0, d_final].map(|s| s.map(|s| F::wrap(s.clone())));
            let states = States { s0: sa[0].as_ref(), d_final: sa[1].as_ref() };
            let r = transposed(&ops, [qa, ka, va, dya], ga.as_ref(), ll.scale, states, want)?;
            for (name, a) in [("q", r.dq), ("k", r.dk), ("v", r.dv), ("g", r.dg)] {
                if let Some(a) = a {
                    put(name, crate::forms::cotangent::<F>(&a, a.shape())?);
                }
            }
            r.ds0.as_ref().map(|s| real::<F>(s).cloned()).transpose()?
        }
        Base::GatedDeltaNet => {
            let (Some(g), Some(beta)) = (g.as_deref(), beta.as_deref()) else {
                return Err(err(FAMILY, "gated DeltaNet needs `g` and `beta`"));
            };
            let [q, k, v, dy] = as_f()?;
            if ll.lift.is_some() {
                let r =
                    backward_lift_delta::delta::<F>(ll, x, [&q, &k, &v, g, beta, &dy], [b, t, h, dk, dv], p)?;
                put_lift(&mut put, r.lift);
                put("beta", r.dbeta);
                put("g", r.dg);
                return Ok((out, None));
            }
            let ([dq, dkk, dvv, db, dg], ds0) =
                backward_chunked::delta(ll, [&q, &k, &v, g, beta, &dy], [b, t, h, dk, dv], p, s0, d_final)?;
            put("q", dq);
            put("k", dkk);
            put("v", dvv);
            put("beta", db);
            put("g", dg);
            ds0
        }
    };
    Ok((out, ds0))
}

/// The input `name` of `x` as given.
fn given<'a>(x: &'a DeviceTensors, name: &str) -> Result<&'a AnyDeviceTensor> {
    x.get(name).ok_or_else(|| Error::MissingInput {
        name: name.to_string(),
        expected: "a device tensor of that name".into(),
        given: x.keys().cloned().collect::<Vec<_>>().join(", "),
    })
}

/// Hands a lift's gradients to `put`: `d_q`, `d_k`, `d_v`, `d_lambda` and, where the λ scheme has
/// one, `d_lambda_param`.
fn put_lift<F: GpuReal>(put: &mut impl FnMut(&str, DeviceTensor<F>), r: backward_lift::LiftGrads<F>) {
    put("q", r.dq);
    put("k", r.dk);
    put("v", r.dv);
    put("lambda", r.dlambda);
    if let Some(dp) = r.dparam {
        put("lambda_param", dp);
    }
}

/// Which gradients the transposed-operator backward must produce.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Wants {
    pub q: bool,
    pub k: bool,
    pub v: bool,
    /// `d_g` (only with a decay).
    pub g: bool,
}

/// The states of a backward from a state: the initial state `S_0` and the final state's
/// cotangent `S̄_T` (`[B, H, Dv, Dk]`; `None`: zero).
pub(crate) struct States<'a, T> {
    pub s0: Option<&'a T>,
    pub d_final: Option<&'a T>,
}

impl<T> Clone for States<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for States<'_, T> {}

/// The gradients the transposed-operator backward produced (`None`: not wanted), and the initial
/// state's gradient (with an initial state).
pub(crate) struct Transposed<T> {
    pub dq: Option<T>,
    pub dk: Option<T>,
    pub dv: Option<T>,
    pub dg: Option<T>,
    pub ds0: Option<T>,
}

/// The operations [`transposed`] is written in: sequences `[B, T, H, D]`, decays `[B, T, H]`,
/// states `[B, H, R, C]`.
pub(crate) trait Transposes {
    /// A tensor.
    type T;
    /// The tokens of a sequence tensor (its axis 1).
    fn steps(&self, x: &Self::T) -> usize;
    /// The chunk `C` of the states [`Transposes::forward`] keeps.
    fn chunk(&self) -> usize;
    /// `out[b, t] = c · x[b, m−1−t]` for `t < n` (zero where `m−1−t` is not a token of `x`): `m = n
    /// = T` reverses, `m = n > T` reverses into `n` rows (the first `n − T` zero), and `m > n = T`
    /// reverses such a run back.
    fn reverse(&self, x: &Self::T, c: f64, m: usize, n: usize) -> Result<Self::T>;
    /// The reversed log-decays over `n ≥ T` rows: `g'[b, 0] = 0`, `g'[b, j] = g[b, n−j]` (j ≥ 1;
    /// zero past `T`).
    fn reverse_decay(&self, g: &Self::T, n: usize) -> Result<Self::T>;
    /// The base mixer's forward of `[q, k, v]` with scale `σ` from the state `s0` (`None`: zero),
    /// `y_t = σ S_t q_t`, `S_t = e^{g_t} S_{t−1} + v_t k_tᵀ` (no decay: `g = 0`); with
    /// `want_final` its final state `S_T`, and with `want_chunks` the states entering its chunks
    /// of [`Transposes::chunk`] tokens, `S_{jC−1}ᵀ` (`[B, H, ⌈T/C⌉, Dk, Dv]` of this run's
    /// `Dk`, `Dv`; `None` where the forward does not keep them).
    fn forward(
        &self,
        qkv: [&Self::T; 3],
        g: Option<&Self::T>,
        sigma: f64,
        s0: Option<&Self::T>,
        want_final: bool,
        want_chunks: bool,
    ) -> Result<(Self::T, Option<Self::T>, Option<Self::T>)>;
    /// Whether [`Transposes::forward_transposed`] runs the forward of `[q, k, v]` here.
    fn shares_chunks(&self, _qkv: [&Self::T; 3]) -> Result<bool> {
        Ok(false)
    }
    /// `y` of [`Transposes::forward`] of `[q, k, v]` (log-decays `g`, scale `σ`) whose states
    /// entering the chunks are `chunks` transposed: `chunks [B, H, ⌈T/C⌉, Dv, Dk]` is what
    /// `forward` keeps for the run of `[·, v, k]` (keys and values exchanged), chunk 0's the
    /// transposed initial state, read with `read0`. Where [`Transposes::shares_chunks`] says so.
    fn forward_transposed(
        &self,
        _qkv: [&Self::T; 3],
        _g: Option<&Self::T>,
        _sigma: f64,
        _chunks: &Self::T,
        _read0: bool,
    ) -> Result<Self::T> {
        Err(err(FAMILY, "internal: no forward from transposed chunk states here"))
    }
    /// Each state transposed: `out[b, h] = s[b, h]ᵀ`.
    fn transpose_state(&self, s: &Self::T) -> Result<Self::T>;
    /// Each state times its first token's decay: `out[b, h] = e^{g[b, 0, h]} s[b, h]`.
    fn decay_state(&self, s: &Self::T, g: &Self::T) -> Result<Self::T>;
    /// `dg` from the chunk boundaries (module documentation): `[q, dq, k, dk]`, the log-decays `g`,
    /// `[hq, hk]` the states entering the chunks of the `dq` run and of the reversed `dk` run
    /// (padded to whole chunks), and with `tail = (S̄_T, S_Tᵀ)` the last boundary's
    /// `dg_T = ⟨S̄_T, S_T⟩` (zero without).
    fn decay_grad_chunked(
        &self,
        q_dq_k_dk: [&Self::T; 4],
        g: &Self::T,
        hq_hk: [&Self::T; 2],
        tail: Option<(&Self::T, &Self::T)>,
    ) -> Result<Self::T>;
}

/// The VJP of linear attention (`g = None`) or Mamba-2 of scale `sigma` by transposed operators
/// (module documentation), from `states`: one forward for `dq` (from `S_0ᵀ`), one reversed
/// forward each for `dk` (from `S̄_Tᵀ`) and `dv` (from `S̄_T`; also run for `S̄_0` with an initial
/// state), then `dg`. The reversed runs exchange keys and values, so their chunk states are each
/// other's transposes: where [`Transposes::shares_chunks`], the run for `dv` reads those the run
/// for `dk` kept ([`Transposes::forward_transposed`]) instead of computing its own.
pub(crate) fn transposed<O: Transposes>(
    o: &O,
    [q, k, v, dy]: [&O::T; 4],
    g: Option<&O::T>,
    sigma: f64,
    states: States<'_, O::T>,
    want: Wants,
) -> Result<Transposed<O::T>> {
    let States { s0, d_final } = states;
    let need_q = want.q || want.g;
    let need_k = want.k || want.g;
    let want_dg = want.g && g.is_some();
    // S_T (as S_Tᵀ, the dq run's final state) for dG_{T−1}'s ⟨S̄_T, S_T⟩.
    let need_st = want_dg && d_final.is_some();
    // With dg the reversed runs are padded in front to whole chunks (tp rows), so that their
    // chunk boundaries are the forward's.
    let tn = o.steps(q);
    let tp = if want_dg { tn.div_ceil(o.chunk()) * o.chunk() } else { tn };
    let (dq, st, hq) = if need_q {
        let s0t = s0.map(|s| o.transpose_state(s)).transpose()?;
        let (dq, st, hq) = o.forward([dy, v, k], g, sigma, s0t.as_ref(), need_st, want_dg)?;
        (Some(dq), st, hq)
    } else {
        (None, None, None)
    };
    let (mut dk, mut dv, mut ds0, mut hk) = (None, None, None, None);
    if need_k || want.v || s0.is_some() {
        let gr = g.map(|g| o.reverse_decay(g, tp)).transpose()?;
        let (rq, rdy) = (o.reverse(q, 1.0, tp, tp)?, o.reverse(dy, sigma, tp, tp)?);
        let rk = if want.v || s0.is_some() { Some(o.reverse(k, 1.0, tp, tp)?) } else { None };
        // The reversed runs for d_k and d_v exchange keys and values, so their chunk states are
        // each other's transposes: where the backend reads states transposed, the run for d_v
        // reads the run for d_k's instead of making its own.
        let share = match &rk {
            Some(rk) if need_k && want.v => o.shares_chunks([rk, &rq, &rdy])?,
            _ => false,
        };
        // S̄_0 from the final state of the run for d_v ([Dv, Dk] of the forward's), or from the
        // run for d_k's transposed.
        let initial_grad = |fin: Option<O::T>, transposed: bool| -> Result<Option<O::T>> {
            let fin = match fin {
                Some(f) if transposed => Some(o.transpose_state(&f)?),
                f => f,
            };
            Ok(match (fin, g) {
                (Some(f), Some(g)) => Some(o.decay_state(&f, g)?),
                (f, None) => f,
                (None, _) => None,
            })
        };
        let mut shared = false;
        if need_k {
            let rv = o.reverse(v, 1.0, tp, tp)?;
            let dft = d_final.map(|d| o.transpose_state(d)).transpose()?;
            let fin_k = share && s0.is_some();
            let (r, fin, h) =
                o.forward([&rv, &rdy, &rq], gr.as_ref(), 1.0, dft.as_ref(), fin_k, want_dg || share)?;
            dk = Some(o.reverse(&r, 1.0, tp, tn)?);
            if let (Some(rk), Some(h), true) = (&rk, &h, share) {
                let r = o.forward_transposed([rk, &rq, &rdy], gr.as_ref(), 1.0, h, d_final.is_some())?;
                dv = Some(o.reverse(&r, 1.0, tp, tn)?);
                ds0 = initial_grad(fin, true)?;
                shared = true;
            }
            hk = if want_dg { h } else { None };
        }
        if let (Some(rk), false) = (&rk, shared) {
            let (r, fin, _) = o.forward([rk, &rq, &rdy], gr.as_ref(), 1.0, d_final, s0.is_some(), false)?;
            if want.v {
                dv = Some(o.reverse(&r, 1.0, tp, tn)?);
            }
            ds0 = initial_grad(fin, false)?;
        }
    }
    let dg = match (want_dg, &dq, &dk, g) {
        (true, Some(dq), Some(dk), Some(g)) => {
            let tail = d_final.zip(st.as_ref());
            let (Some(hq), Some(hk)) = (&hq, &hk) else {
                return Err(err(FAMILY, "internal: a forward that kept no chunk states for d_g"));
            };
            Some(o.decay_grad_chunked([q, dq, k, dk], g, [hq, hk], tail)?)
        }
        _ => None,
    };
    Ok(Transposed { dq: if want.q { dq } else { None }, dk: if want.k { dk } else { None }, dv, dg, ds0 })
}

/// [`Transposes`] on device tensors: the `kernels/loglinear_backward.cu` reversals and the decay
/// gradient's `llb_dg_*` passes, and this backend's `fast` forward in mode `p`.
struct OnDevice<'a, F> {
    ll: &'a LogLinear,
    p: Precision,
    _f: PhantomData<F>,
}

impl<F: GpuReal> OnDevice<'_, F> {
    /// [`fast::transposed_output`] for a run of `q`, `v` (as `F`; bf16 tensors: `None`).
    fn transposed_launch(&self, q: &AnyDeviceTensor, v: &AnyDeviceTensor) -> Result<Option<Launch>> {
        let (Some(q), Some(v)) = (F::unwrap(q), F::unwrap(v)) else { return Ok(None) };
        let (&[b, t, h, dk], Some(&dv)) = (q.shape(), v.shape().get(3)) else { return Ok(None) };
        fast::transposed_output::<F>(self.ll, [b, t, h, dk, dv], self.p, Device::current())
    }
}

/// `[B, T, H, D]` of a sequence tensor (`D = 1` for `[B, T, H]`).
fn bthd(s: &[usize]) -> Result<[i32; 4]> {
    let d = s.get(3).copied().unwrap_or(1);
    match s {
        [b, t, h, ..] => {
            Ok([int(FAMILY, "B", *b)?, int(FAMILY, "T", *t)?, int(FAMILY, "H", *h)?, int(FAMILY, "D", d)?])
        }
        _ => Err(err(FAMILY, format!("internal: a sequence tensor of shape {s:?}"))),
    }
}

/// A tensor of the recipe as `F` (every tensor but the bf16 mode's activations and their
/// reversed runs' outputs).
fn real<F: GpuReal>(x: &AnyDeviceTensor) -> Result<&DeviceTensor<F>> {
    F::unwrap(x).ok_or_else(|| {
        err(FAMILY, format!("internal: a {} tensor where {} was expected", x.dtype(), F::ELEM))
    })
}

/// [`Transposes`] on device tensors of `F`, and in the bf16 mode on bf16 activations: `q`, `k`,
/// `v`, `dy`, their reversed copies and the runs' outputs stay bf16 (the runs take the bf16 path
/// of [`fast::run_keeping`]); log-decays, states and `dg` are `F`.
impl<F: GpuReal> Transposes for OnDevice<'_, F> {
    type T = AnyDeviceTensor;

    fn steps(&self, x: &AnyDeviceTensor) -> usize {
        x.shape().get(1).copied().unwrap_or(0)
    }

    fn chunk(&self) -> usize {
        Elem::of::<F>().chunk()
    }

    fn reverse(&self, x: &AnyDeviceTensor, c: f64, m: usize, n: usize) -> Result<AnyDeviceTensor> {
        match x {
            AnyDeviceTensor::Bf16(a) => Ok(AnyDeviceTensor::Bf16(reverse_rows(a, "bf16", c as f32, m, n)?)),
            _ => Ok(F::wrap(reverse_rows(real::<F>(x)?, F::SUFFIX, F::of(c), m, n)?)),
        }
    }

    fn reverse_decay(&self, gt: &AnyDeviceTensor, n: usize) -> Result<AnyDeviceTensor> {
        let gt = real::<F>(gt)?;
        let [b, t, h, _] = bthd(gt.shape())?;
        let shape = [gt.shape()[0], n, gt.shape()[2]];
        let ni = int(FAMILY, "T", n)?;
        let len = shape.iter().product::<usize>();
        let mut out = pool::take::<F>(FAMILY, len)?;
        let g = gpu()?;
        let f =
            g.kernel(FAMILY, &kernels::LOGLINEAR_BACKWARD, &[], &format!("llb_reverse_g_{}", F::SUFFIX))?;
        let gv = gt.view();
        launch!(g, FAMILY, f, grid1(len.min(1 << 20), 256); &gv, &mut *out, &b, &t, &h, &ni)?;
        Ok(F::wrap(DeviceTensor::from_pooled(out, &shape)?))
    }

    fn forward(
        &self,
        [q, k, v]: [&AnyDeviceTensor; 3],
        g: Option<&AnyDeviceTensor>,
        sigma: f64,
        s0: Option<&AnyDeviceTensor>,
        want_final: bool,
        want_chunks: bool,
    ) -> Result<(AnyDeviceTensor, Option<AnyDeviceTensor>, Option<AnyDeviceTensor>)> {
        let mut x: DeviceTensors =
            [("q", q), ("k", k), ("v", v)].into_iter().map(|(n, a)| (n.to_string(), a.clone())).collect();
        if let Some(g) = g {
            x.insert("g".into(), g.clone());
        }
        let ll = if sigma == self.ll.scale {
            std::borrow::Cow::Borrowed(self.ll)
        } else {
            std::borrow::Cow::Owned(LogLinear { scale: sigma, ..self.ll.clone() })
        };
        let s0 = s0.map(real::<F>).transpose()?;
        let r = fast::run_keeping::<F>(&ll, &x, self.p, s0, want_final, Device::current(), want_chunks)?;
        Ok((r.y, r.fin.map(F::wrap), r.chunks.map(F::wrap)))
    }

    /// Where `[q, k, v]` are `F` = f32 and the tf32 plan's output is `llc_out_direct_tc_f32`
    /// ([`fast::transposed_output`]).
    fn shares_chunks(&self, [q, _, v]: [&AnyDeviceTensor; 3]) -> Result<bool> {
        Ok(self.transposed_launch(q, v)?.is_some())
    }

    fn forward_transposed(
        &self,
        [q, k, v]: [&AnyDeviceTensor; 3],
        g: Option<&AnyDeviceTensor>,
        sigma: f64,
        chunks: &AnyDeviceTensor,
        read0: bool,
    ) -> Result<AnyDeviceTensor> {
        let Some(l) = self.transposed_launch(q, v)? else {
            return Err(err(FAMILY, "internal: no output launch that reads transposed chunk states"));
        };
        let mut x: DeviceTensors =
            [("q", q), ("k", k), ("v", v)].into_iter().map(|(n, a)| (n.to_string(), a.clone())).collect();
        if let Some(g) = g {
            x.insert("g".into(), g.clone());
        }
        let ll = LogLinear { scale: sigma, ..self.ll.clone() };
        fast::run_transposed::<F>(&ll, &x, &l, real::<F>(chunks)?, read0, self.p)
    }

    fn transpose_state(&self, s: &AnyDeviceTensor) -> Result<AnyDeviceTensor> {
        let s = real::<F>(s)?;
        let &[b, h, r, c] = s.shape() else {
            return Err(err(FAMILY, format!("internal: a state of shape {:?}", s.shape())));
        };
        let (bhi, ri, ci) = (int(FAMILY, "B·H", b * h)?, int(FAMILY, "rows", r)?, int(FAMILY, "columns", c)?);
        let mut out = pool::take::<F>(FAMILY, s.len())?;
        let g = gpu()?;
        let f = g.kernel(FAMILY, &kernels::LOGLINEAR_BACKWARD, &[], &format!("llb_state_t_{}", F::SUFFIX))?;
        let sv = s.view();
        launch!(g, FAMILY, f, grid1(s.len().min(1 << 20), 256); &sv, &mut *out, &bhi, &ri, &ci)?;
        Ok(F::wrap(DeviceTensor::from_pooled(out, &[b, h, c, r])?))
    }

    fn decay_state(&self, s: &AnyDeviceTensor, gt: &AnyDeviceTensor) -> Result<AnyDeviceTensor> {
        let (s, gt) = (real::<F>(s)?, real::<F>(gt)?);
        let [b, t, h, _] = bthd(gt.shape())?;
        let (bh, n) = (gt.shape()[0] * gt.shape()[2], s.shape()[2..].iter().product::<usize>());
        if s.shape()[..2] != [gt.shape()[0], gt.shape()[2]] {
            return Err(err(
                FAMILY,
                format!("internal: a state {:?} for decays {:?}", s.shape(), gt.shape()),
            ));
        }
        let ni = int(FAMILY, "state size", n)?;
        let mut out = pool::take::<F>(FAMILY, s.len())?;
        let g = gpu()?;
        let f =
            g.kernel(FAMILY, &kernels::LOGLINEAR_BACKWARD, &[], &format!("llb_state_decay_{}", F::SUFFIX))?;
        let (sv, gv) = (s.view(), gt.view());
        launch!(g, FAMILY, f, grid1((bh * n).min(1 << 20), 256); &sv, &gv, &mut *out, &b, &t, &h, &ni)?;
        Ok(F::wrap(DeviceTensor::from_pooled(out, s.shape())?))
    }

    /// `llb_dg_chunk`, a block per (chunk, batch·head).
    fn decay_grad_chunked(
        &self,
        qdk: [&AnyDeviceTensor; 4],
        g: &AnyDeviceTensor,
        [hq, hk]: [&AnyDeviceTensor; 2],
        tail: Option<(&AnyDeviceTensor, &AnyDeviceTensor)>,
    ) -> Result<AnyDeviceTensor> {
        let tail = match tail {
            Some((d, f)) => Some((real::<F>(d)?, real::<F>(f)?)),
            None => None,
        };
        let states = [real::<F>(hq)?, real::<F>(hk)?];
        let dg = match qdk {
            [
                AnyDeviceTensor::Bf16(q),
                AnyDeviceTensor::Bf16(dq),
                AnyDeviceTensor::Bf16(k),
                AnyDeviceTensor::Bf16(dk),
            ] => self.dg_chunked([q, dq, k, dk], "bf16", real::<F>(g)?, states, tail)?,
            [q, dq, k, dk] => {
                let a = [real::<F>(q)?, real::<F>(dq)?, real::<F>(k)?, real::<F>(dk)?];
                self.dg_chunked(a, F::SUFFIX, real::<F>(g)?, states, tail)?
            }
        };
        Ok(F::wrap(dg))
    }
}

/// `llb_reverse_<suffix>` of `x` (`[B, T, H, D]`) into `n` rows: `out[b, t] = c · x[b, m−1−t]`
/// ([`Transposes::reverse`]); a block per output token row, a thread per 16 bytes of it.
fn reverse_rows<A: DeviceScalar, S: DeviceRepr>(
    x: &DeviceTensor<A>,
    suffix: &str,
    c: S,
    m: usize,
    n: usize,
) -> Result<DeviceTensor<A>> {
    let [b, t, h, d] = bthd(x.shape())?;
    let mut shape = x.shape().to_vec();
    shape[1] = n;
    let len = shape.iter().product::<usize>();
    let (mi, ni) = (int(FAMILY, "T", m)?, int(FAMILY, "T", n)?);
    let mut out = pool::take::<A>(FAMILY, len)?;
    let g = gpu()?;
    let f = g.kernel(FAMILY, &kernels::LOGLINEAR_BACKWARD, &[], &format!("llb_reverse_{suffix}"))?;
    let xv = x.view();
    let rows = (shape[0] * n).clamp(1, 1 << 20) as u32;
    // A thread per 16-byte vector of a row (the kernel's unit where rows are whole vectors), a warp
    // at least and 256 at most.
    let vectors = (h as usize * d as usize * std::mem::size_of::<A>()).div_ceil(16);
    let threads = vectors.div_ceil(32).clamp(1, 8) as u32 * 32;
    let cfg = LaunchConfig { grid_dim: (rows, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
    launch!(g, FAMILY, f, cfg; &xv, &mut *out, &b, &t, &h, &d, &mi, &ni, &c)?;
    DeviceTensor::from_pooled(out, &shape)
}

impl<F: GpuReal> OnDevice<'_, F> {
    /// The lifts' `dg_i = Σ_{t≥i} dG_t`, `dG_t = q_t·dq_t − k_t·dk_t` from `[q, dq, k, dk]`:
    /// `llb_dg_dot`, then the tiled suffix scan (`llb_dg_tile`, `llb_dg_scan`, `llb_dg_out`).
    fn decay_grad(&self, [q, dq, k, dk]: [&DeviceTensor<F>; 4]) -> Result<DeviceTensor<F>> {
        let [b, t, h, d] = bthd(q.shape())?;
        let (bh, tn) = (q.shape()[0] * q.shape()[2], q.shape()[1]);
        let l = dg_tile(tn);
        let nt = tn.div_ceil(l);
        let (bhi, li, nti) = (int(FAMILY, "B·H", bh)?, int(FAMILY, "tile", l)?, int(FAMILY, "tiles", nt)?);
        let mut a = pool::take::<f64>(FAMILY, bh * tn)?;
        let mut s = pool::take::<f64>(FAMILY, bh * nt)?;
        let mut out = pool::take::<F>(FAMILY, bh * tn)?;
        let g = gpu()?;
        let kernel = |name: &str| g.kernel(FAMILY, &kernels::LOGLINEAR_BACKWARD, &[], name);
        let (qv, dqv, kv, dkv) = (q.view(), dq.view(), k.view(), dk.view());
        let f = kernel(&format!("llb_dg_dot_{}", F::SUFFIX))?;
        launch!(g, FAMILY, f, grid1((bh * tn * 32).min(1 << 22), 256);
            &qv, &dqv, &kv, &dkv, &mut *a, &b, &t, &h, &d)?;
        let f = kernel("llb_dg_tile")?;
        launch!(g, FAMILY, f, grid1((bh * nt).min(1 << 20), 128); &*a, &mut *s, &bhi, &t, &li, &nti)?;
        let f = kernel("llb_dg_scan")?;
        launch!(g, FAMILY, f, grid1(bh.min(1 << 20), 128); &mut *s, &bhi, &nti)?;
        let f = kernel(&format!("llb_dg_out_{}", F::SUFFIX))?;
        launch!(g, FAMILY, f, grid1((bh * nt).min(1 << 20), 128);
            &*a, &*s, &mut *out, &bhi, &t, &h, &li, &nti)?;
        DeviceTensor::from_pooled(out, &q.shape()[..3])
    }

    /// [`Transposes::decay_grad_chunked`]: `llb_dg_chunk_<suffix>`, a block per (chunk,
    /// batch·head), with activations of `A` (`F`, or bf16 in the bf16 mode).
    fn dg_chunked<A: DeviceScalar>(
        &self,
        [q, dq, k, dk]: [&DeviceTensor<A>; 4],
        suffix: &str,
        gt: &DeviceTensor<F>,
        [hq, hk]: [&DeviceTensor<F>; 2],
        tail: Option<(&DeviceTensor<F>, &DeviceTensor<F>)>,
    ) -> Result<DeviceTensor<F>> {
        let [_, t, h, d] = bthd(q.shape())?;
        let (bh, tn, c) = (q.shape()[0] * q.shape()[2], q.shape()[1], self.chunk());
        let nc = tn.div_ceil(c);
        let dv = hq.shape().get(3).copied().unwrap_or(0);
        let want = [q.shape()[0], q.shape()[2], nc, dv, q.shape()[3]];
        if hq.shape() != want || hk.shape() != want {
            return Err(err(
                FAMILY,
                format!(
                    "internal: chunk states {:?} and {:?} where {want:?} was expected",
                    hq.shape(),
                    hk.shape()
                ),
            ));
        }
        let zero = pool::zeros::<F>(FAMILY, 1)?;
        let (dfv, has_tail) = view_or_zero(tail.map(|(d, _)| d), &zero);
        let (ftv, _) = view_or_zero(tail.map(|(_, f)| f), &zero);
        let (dvi, ci, nci) = (int(FAMILY, "Dv", dv)?, int(FAMILY, "chunk", c)?, int(FAMILY, "chunks", nc)?);
        // The forward's chunk kernels launch the same grid (chunks, B·H), so the sizes fit.
        let mut out = pool::take::<F>(FAMILY, bh * tn)?;
        let g = gpu()?;
        let f = g.kernel(FAMILY, &kernels::LOGLINEAR_BACKWARD, &[], &format!("llb_dg_chunk_{suffix}"))?;
        let cfg =
            LaunchConfig { grid_dim: (nc as u32, bh as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (qv, dqv, kv, dkv, gv, hqv, hkv) =
            (q.view(), dq.view(), k.view(), dk.view(), gt.view(), hq.view(), hk.view());
        launch!(g, FAMILY, f, cfg;
            &qv, &dqv, &kv, &dkv, &gv, &hqv, &hkv, &dfv, &ftv, &has_tail, &mut *out, &t, &h, &d, &dvi, &ci, &nci)?;
        DeviceTensor::from_pooled(out, &q.shape()[..3])
    }
}

/// The tile length `L` of the decay gradient's suffix scan over `T` tokens: `max(64, ⌈√T⌉)`, so
/// that a tile's walk and the scan over the `⌈T/L⌉` tile sums are both `O(√T)` long.
pub(crate) fn dg_tile(t: usize) -> usize {
    let mut r = t.isqrt();
    if r * r < t {
        r += 1;
    }
    r.max(64)
}

/// The CPU `fast` backward of `m` in f64, every gradient: the reference of this module's and
/// [`super::backward_chunked`]'s host tests.
#[cfg(test)]
pub(crate) fn cpu_backward(
    m: &dyn mixer_core::mixer::Mixer,
    x: &mixer_core::Tensors<f64>,
    dy: &ndarray::ArrayD<f64>,
) -> mixer_core::Tensors<f64> {
    use mixer_core::{AnyTensors, Form, Tensor};
    mixer_registry::backward::backward(
        m,
        "cpu",
        Form::Fast,
        &AnyTensors::F64(x.clone()),
        &Tensor::F64(dy.clone()),
        &Requires::All,
    )
    .unwrap()
    .into_iter()
    .map(|(k, v)| (k, v.to_f64()))
    .collect()
}

#[cfg(test)]
mod tests {
    //! The transposed-operator recipe ([`transposed`]) run on the CPU — reversals on host arrays,
    //! the CPU's `fast` forward — against the CPU backward: fails if the reversal identities or
    //! the decay gradient are wrong.
    use super::*;
    use mixer_core::Precision;
    use mixer_core::mixer::Mixer;
    use mixer_core::mixer::downcast;
    use mixer_core::mixers::loglinear::state::STATE;
    use mixer_core::{Dims, Form, Tensors};
    use mixer_cpu as _;
    use mixer_registry::Backend;
    use mixer_registry::state::{backward_state, run_state};
    use ndarray::{ArrayD, Axis, IxDyn, s};

    struct OnHost<'a> {
        m: &'a LogLinear,
        /// Whether the run for `d_v` reads the run for `d_k`'s chunk states
        /// ([`Transposes::forward_transposed`]).
        share: bool,
    }

    /// The chunk of [`OnHost`]'s chunk states: small, so that the recipe's cases (T up to 70)
    /// cross many chunk boundaries.
    const HOST_CHUNK: usize = 8;

    impl Transposes for OnHost<'_> {
        type T = ArrayD<f64>;
        fn steps(&self, x: &ArrayD<f64>) -> usize {
            x.shape()[1]
        }
        fn chunk(&self) -> usize {
            HOST_CHUNK
        }
        fn reverse(&self, x: &ArrayD<f64>, c: f64, m: usize, n: usize) -> Result<ArrayD<f64>> {
            let mut shape = x.shape().to_vec();
            shape[1] = n;
            let mut out = ArrayD::zeros(IxDyn(&shape));
            for t in 0..n {
                if let Some(src) = (m - 1).checked_sub(t).filter(|&s| s < x.shape()[1]) {
                    out.index_axis_mut(Axis(1), t).assign(&x.index_axis(Axis(1), src).mapv(|e| c * e));
                }
            }
            Ok(out)
        }
        fn reverse_decay(&self, g: &ArrayD<f64>, n: usize) -> Result<ArrayD<f64>> {
            let t = g.shape()[1];
            let mut out = ArrayD::zeros(IxDyn(&[g.shape()[0], n, g.shape()[2]]));
            for j in 1..n {
                if n - j < t {
                    out.index_axis_mut(Axis(1), j).assign(&g.index_axis(Axis(1), n - j));
                }
            }
            Ok(out)
        }
        fn forward(
            &self,
            [q, k, v]: [&ArrayD<f64>; 3],
            g: Option<&ArrayD<f64>>,
            sigma: f64,
            s0: Option<&ArrayD<f64>>,
            want_final: bool,
            want_chunks: bool,
        ) -> Result<(ArrayD<f64>, Option<ArrayD<f64>>, Option<ArrayD<f64>>)> {
            let cpu = Backend::by_name("cpu")?;
            let m = LogLinear { scale: sigma, ..self.m.clone() };
            let s0: Option<Tensors<f64>> = s0.map(|s| [(STATE.to_string(), s.clone())].into_iter().collect());
            // The run over the first `n` tokens.
            let run = |n: usize| {
                let mut x: Tensors<f64> = [("q", q), ("k", k), ("v", v)]
                    .into_iter()
                    .map(|(name, a)| (name.to_string(), a.slice_axis(Axis(1), (0..n).into()).to_owned()))
                    .collect();
                if let Some(g) = g {
                    x.insert("g".into(), g.slice_axis(Axis(1), (0..n).into()).to_owned());
                }
                run_state(&m, &cpu, Form::Fast, &x, s0.as_ref(), Precision::Exact)
            };
            let (y, fin) = run(q.shape()[1])?;
            // H_j = S_{jC−1}ᵀ: the final state of the run over the first j·C tokens, transposed.
            let chunks = if want_chunks {
                let nc = q.shape()[1].div_ceil(HOST_CHUNK);
                let h: Vec<ArrayD<f64>> = (0..nc)
                    .map(|j| Ok(self.transpose_state(&run(j * HOST_CHUNK)?.1[STATE])?.insert_axis(Axis(2))))
                    .collect::<Result<_>>()?;
                let views: Vec<_> = h.iter().map(|a| a.view()).collect();
                Some(ndarray::concatenate(Axis(2), &views).unwrap())
            } else {
                None
            };
            Ok((y, want_final.then(|| fin[STATE].clone()), chunks))
        }
        fn shares_chunks(&self, _: [&ArrayD<f64>; 3]) -> Result<bool> {
            Ok(self.share)
        }
        /// The recurrence `S_t = e^{g_t} S_{t−1} + v_t k_tᵀ`, `y_t = σ S_t q_t`, with `S` set to
        /// chunk `j`'s given state before the chunk's first token (chunk 0: zero unless `read0`).
        fn forward_transposed(
            &self,
            [q, k, v]: [&ArrayD<f64>; 3],
            g: Option<&ArrayD<f64>>,
            sigma: f64,
            chunks: &ArrayD<f64>,
            read0: bool,
        ) -> Result<ArrayD<f64>> {
            let (nb, tn, nh, dv) = (q.shape()[0], q.shape()[1], q.shape()[2], v.shape()[3]);
            let mut y = ArrayD::zeros(IxDyn(&[nb, tn, nh, dv]));
            for b in 0..nb {
                for h in 0..nh {
                    let mut st = ndarray::Array2::<f64>::zeros((dv, k.shape()[3]));
                    for t in 0..tn {
                        if t % HOST_CHUNK == 0 && (t > 0 || read0) {
                            st.assign(&chunks.slice(s![b, h, t / HOST_CHUNK, .., ..]));
                        }
                        let decay = g.map_or(1.0, |g| g[[b, t, h]].exp());
                        let (kt, vt) = (k.slice(s![b, t, h, ..]), v.slice(s![b, t, h, ..]));
                        st.mapv_inplace(|e| decay * e);
                        for (i, &vi) in vt.iter().enumerate() {
                            st.row_mut(i).scaled_add(vi, &kt);
                        }
                        y.slice_mut(s![b, t, h, ..]).assign(&(st.dot(&q.slice(s![b, t, h, ..])) * sigma));
                    }
                }
            }
            Ok(y)
        }
        fn transpose_state(&self, s: &ArrayD<f64>) -> Result<ArrayD<f64>> {
            Ok(s.view().permuted_axes(IxDyn(&[0, 1, 3, 2])).as_standard_layout().into_owned())
        }
        fn decay_state(&self, st: &ArrayD<f64>, g: &ArrayD<f64>) -> Result<ArrayD<f64>> {
            let mut out = st.clone();
            for b in 0..st.shape()[0] {
                for h in 0..st.shape()[1] {
                    let f = g[[b, 0, h]].exp();
                    out.slice_mut(s![b, h, .., ..]).mapv_inplace(|x| f * x);
                }
            }
            Ok(out)
        }
        /// The loops of `llb_dg_chunk`.
        fn decay_grad_chunked(
            &self,
            [q, dq, k, dk]: [&ArrayD<f64>; 4],
            g: &ArrayD<f64>,
            [hq, hk]: [&ArrayD<f64>; 2],
            tail: Option<(&ArrayD<f64>, &ArrayD<f64>)>,
        ) -> Result<ArrayD<f64>> {
            let (tn, c) = (q.shape()[1], HOST_CHUNK);
            let nc = tn.div_ceil(c);
            let dgt = (q * dq - k * dk).sum_axis(Axis(3));
            // (S̄_T, S_T) for the last chunk's boundary value ⟨S̄_T, S_T⟩.
            let tail = tail.map(|(df, ft)| Ok::<_, Error>((df, self.transpose_state(ft)?))).transpose()?;
            let mut out = ArrayD::zeros(dgt.raw_dim());
            for b in 0..q.shape()[0] {
                for h in 0..q.shape()[2] {
                    for m in 0..nc {
                        let (t0, t1) = (m * c, tn.min(m * c + c));
                        let mut acc = if m + 1 < nc {
                            let a = hq.slice(s![b, h, m + 1, .., ..]);
                            let z = hk.slice(s![b, h, nc - 1 - m, .., ..]);
                            (&a * &z).sum() * g[[b, t1, h]].exp()
                        } else if let Some((df, st)) = &tail {
                            (&df.slice(s![b, h, .., ..]) * &st.slice(s![b, h, .., ..])).sum()
                        } else {
                            0.0
                        };
                        for t in (t0..t1).rev() {
                            acc += dgt[[b, t, h]];
                            out[[b, t, h]] = acc;
                        }
                    }
                }
            }
            Ok(out)
        }
    }

    /// The loops of `llb_dg_tile`, `llb_dg_scan` and `llb_dg_out` on one (batch, head)'s `dG`, in
    /// the kernels' order: `dg_i = Σ_{t≥i} dG_t`.
    fn suffix_by_tiles(a: &[f64]) -> Vec<f64> {
        let (tn, l) = (a.len(), dg_tile(a.len()));
        let nt = tn.div_ceil(l);
        let tile = |c: usize| c * l..tn.min(c * l + l);
        let mut s: Vec<f64> = (0..nt).map(|c| tile(c).rev().fold(0.0, |x, t| x + a[t])).collect();
        let mut acc = 0.0;
        for c in (0..nt).rev() {
            let x = s[c];
            s[c] = acc;
            acc += x;
        }
        let mut out = vec![f64::NAN; tn];
        for (c, &sc) in s.iter().enumerate() {
            let mut acc = sc;
            for t in tile(c).rev() {
                acc += a[t];
                out[t] = acc;
            }
        }
        out
    }

    #[test]
    fn the_tiled_suffix_scan_is_the_suffix_sum() {
        assert_eq!([0, 1, 64, 4096, 4097, 16384].map(dg_tile), [64, 64, 64, 64, 65, 128]);
        for tn in [1, 2, 63, 64, 65, 128, 129, 4095, 4097, 10000] {
            // Integers: every order of summation is exact, so the scan must match bit for bit.
            let a: Vec<f64> = (0..tn).map(|t| ((t * 7919 + 13) % 201) as f64 - 100.0).collect();
            let mut want = vec![0.0; tn];
            let mut acc = 0.0;
            for t in (0..tn).rev() {
                acc += a[t];
                want[t] = acc;
            }
            assert_eq!(suffix_by_tiles(&a), want, "T = {tn}");
            // Reals: within rounding of the sequential sum.
            let a: Vec<f64> = (0..tn).map(|t| (t as f64 * 0.37).sin()).collect();
            let got = suffix_by_tiles(&a);
            let mut acc = 0.0;
            for t in (0..tn).rev() {
                acc += a[t];
                assert!((got[t] - acc).abs() <= 1e-12 * (1.0 + acc.abs()), "T = {tn}, t = {t}");
            }
        }
    }

    /// The recipe tests' cases: linear attention and Mamba-2 (σ = 0.8) at four shapes `(B, T, H,
    /// Dk, Dv)` — `T` one token, past whole chunks of [`HOST_CHUNK`] (the reversed runs padded) and
    /// a whole number of them — random inputs and a cotangent `dy`, handed to `f`.
    fn for_each_recipe_case(
        mut f: impl FnMut(&str, &dyn Mixer, &LogLinear, [usize; 5], &Dims, &Tensors<f64>, &ArrayD<f64>),
    ) {
        for name in ["linear-attention", "mamba2"] {
            let boxed = mixer_registry::mixer(name, &serde_json::json!({"scale": 0.8})).unwrap();
            let ll: &LogLinear = downcast(boxed.as_ref(), "test").unwrap();
            for (b, t, h, dk, dv) in [(2, 37, 2, 5, 3), (1, 1, 1, 4, 6), (1, 70, 1, 3, 8), (1, 16, 1, 3, 2)] {
                let dims = [("B", b), ("T", t), ("H", h), ("Dk", dk), ("Dv", dv)].into_iter().collect();
                let x = boxed.random_inputs(&dims, 7).unwrap();
                let dy = x["v"].mapv(|e| (3.0 * e + 0.2).sin());
                f(name, boxed.as_ref(), ll, [b, t, h, dk, dv], &dims, &x, &dy);
            }
        }
    }

    /// ‖a − w‖ relative to ‖w‖, absolute where ‖w‖ < 1 (a gradient that is 0, as d_g at T = 1).
    fn error(a: &ArrayD<f64>, w: &ArrayD<f64>) -> f64 {
        (a - w).mapv(|e| e * e).sum().sqrt() / w.mapv(|e| e * e).sum().sqrt().max(1.0)
    }

    #[test]
    fn the_transposed_recipe_on_the_cpu_is_the_cpu_backward() {
        for_each_recipe_case(|name, m, ll, shape, _, x, dy| {
            let want = cpu_backward(m, x, dy);
            let g = x.get("g");
            let want_g = Wants { q: true, k: true, v: true, g: g.is_some() };
            let none = States { s0: None, d_final: None };
            let xs = [&x["q"], &x["k"], &x["v"], dy];
            for share in [false, true] {
                let got = transposed(&OnHost { m: ll, share }, xs, g, ll.scale, none, want_g).unwrap();
                assert!(got.ds0.is_none(), "{name}: no initial state, no gradient of one");
                let got = [("d_q", got.dq), ("d_k", got.dk), ("d_v", got.dv), ("d_g", got.dg)];
                for (k, a) in got {
                    let Some(w) = want.get(k) else {
                        assert!(a.is_none(), "{name}: {k} without a decay");
                        continue;
                    };
                    let err = error(&a.unwrap(), w);
                    assert!(err < 1e-12, "{name} {shape:?} shared chunks {share} {k}: error {err:.3e}");
                }
            }
        });
    }

    #[test]
    fn only_the_wanted_gradients_are_computed() {
        let boxed = mixer_registry::mixer("mamba2", &serde_json::json!({})).unwrap();
        let ll: &LogLinear = downcast(boxed.as_ref(), "test").unwrap();
        let dims = [("B", 1), ("T", 9), ("H", 1), ("Dk", 2), ("Dv", 3)].into_iter().collect();
        let x = boxed.random_inputs(&dims, 3).unwrap();
        let dy = x["v"].clone();
        let (xs, g, none) =
            ([&x["q"], &x["k"], &x["v"], &dy], x.get("g"), States { s0: None, d_final: None });
        let want = Wants { q: false, k: false, v: true, g: false };
        let r = transposed(&OnHost { m: ll, share: true }, xs, g, 1.0, none, want).unwrap();
        assert!(r.dv.is_some() && r.dq.is_none() && r.dk.is_none() && r.dg.is_none());
        let want = Wants { q: false, k: false, v: false, g: true };
        let r = transposed(&OnHost { m: ll, share: true }, xs, g, 1.0, none, want).unwrap();
        assert!(r.dg.is_some() && r.dq.is_none() && r.dk.is_none() && r.dv.is_none());
        // With an initial state its gradient comes back whatever else is wanted.
        let s0 = boxed.random_state(&dims, 4).unwrap();
        let want = Wants { q: false, k: true, v: false, g: false };
        let r = transposed(
            &OnHost { m: ll, share: true },
            xs,
            g,
            1.0,
            States { s0: Some(&s0[STATE]), d_final: None },
            want,
        )
        .unwrap();
        assert!(r.ds0.is_some() && r.dk.is_some() && r.dq.is_none() && r.dv.is_none() && r.dg.is_none());
    }

    /// The recipe from a state on the CPU against the CPU's backward from a state (every input
    /// gradient and `S̄_0`), with and without an initial state and a final state's cotangent:
    /// fails if a state term of docs/math.md §7.1 ("The CUDA backward from a state") is wrong.
    #[test]
    fn the_transposed_recipe_from_a_state_on_the_cpu_is_the_cpu_backward_from_a_state() {
        let cpu = Backend::by_name("cpu").unwrap();
        for_each_recipe_case(|name, m, ll, shape, dims, x, dy| {
            let s0 = m.random_state(dims, 8).unwrap();
            let df: Tensors<f64> = s0.iter().map(|(k, v)| (k.clone(), v.mapv(|e| (1.7 * e).cos()))).collect();
            for (with_s0, with_df) in [(true, true), (true, false), (false, true)] {
                let (s0, df) = (with_s0.then_some(&s0), with_df.then_some(&df));
                let (want, want_ds) =
                    backward_state(m, &cpu, Form::Fast, x, s0, dy, df, &Requires::All).unwrap();
                let g = x.get("g");
                let wants = Wants { q: true, k: true, v: true, g: g.is_some() };
                let states = States { s0: s0.map(|s| &s[STATE]), d_final: df.map(|s| &s[STATE]) };
                let xs = [&x["q"], &x["k"], &x["v"], dy];
                for share in [false, true] {
                    let got = transposed(&OnHost { m: ll, share }, xs, g, ll.scale, states, wants).unwrap();
                    let label =
                        format!("{name} {shape:?} S_0: {with_s0}, S̄_T: {with_df}, shared chunks {share}");
                    assert_eq!(got.ds0.is_some(), with_s0, "{label}: S̄_0 iff an initial state");
                    let got =
                        [("d_q", got.dq), ("d_k", got.dk), ("d_v", got.dv), ("d_g", got.dg), ("S", got.ds0)];
                    for (k, a) in got {
                        let w = if k == "S" { want_ds.get(k) } else { want.get(k) };
                        let Some(w) = w else {
                            assert!(a.is_none(), "{label}: {k} should not be there");
                            continue;
                        };
                        let err = error(&a.unwrap(), w);
                        assert!(err < 1e-12, "{label} {k}: error {err:.3e}");
                    }
                }
            }
        });
    }
}
