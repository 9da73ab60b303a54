//! The `fast` form (docs/math.md §2.6, Fenwick mask): the dispatcher. It checks the inputs, maps
//! λ on the device ([`super::lambda`]), asks [`plan`] for the launches and runs them, step by step:
//! - linear attention and Mamba-2 (and their lifts): the chunk states and their tree or scan
//!   ([`super::ssd`]), then the outputs ([`super::output`]);
//! - gated DeltaNet (and its lift): the WY/UT pieces per chunk ([`super::wy`]), the sequential
//!   state pass ([`super::state_pass`], whose [`select`](super::state_pass::select) is the one
//!   rule for its variant), then the outputs — or, where the pass's states do not fit in shared
//!   memory, the whole form in one block per head ([`super::sequential`]).
//!
//! [`plan`] needs no GPU: it is what the form will launch for a shape, a precision mode, the
//! storage of the activations and a device, as data (serializable to JSON), so that tuning
//! harnesses read the host's launches instead of deriving them again.

use std::borrow::Cow;

use mixer_core::fenwick::bitlen;
use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::{Error, Precision, Result};
use serde::Serialize;

use super::common::{
    ChunkTable, ChunkedInputs, Device, Elem, FAMILY, Launch, Shape, Storage, bf16_qkv, check_sizes,
    output_buffer, view_or_zero,
};
use super::ssd::Bf16States;
use super::state_pass::{self, PassData, StatePass};
use super::{lambda, output, sequential, ssd, wy};
use crate::forms::{finish, input, input_opt};
use crate::pool::{self, Pooled};
use crate::runtime::err;
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors, bf16};

/// Which algorithm the plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Path {
    /// Nothing to compute (an empty output).
    Empty,
    /// The scalar-decay members: chunk states, tree or scan, outputs.
    Ssd,
    /// The same in the bf16 mode on bf16 activations as stored (no lift, `Dk ≤ 128`).
    SsdBf16,
    /// Gated DeltaNet: WY/UT, the state pass, outputs.
    Delta,
    /// The same on bf16 operands end to end ([`StatePass::Bf16Registers`]).
    DeltaBf16,
    /// Gated DeltaNet in one block per (batch, head) ([`StatePass::Sequential`]).
    Sequential,
}

/// The launch plan of the `fast` form for one call: what [`run`] launches, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The mixer's name.
    pub mixer: String,
    /// Whether it is a lift (Fenwick levels).
    pub lifted: bool,
    /// The sizes.
    pub shape: Shape,
    /// The precision mode.
    pub precision: Precision,
    /// The activations' storage.
    pub storage: Storage,
    /// The device the plan is made for.
    pub device: Device,
    /// The algorithm.
    pub path: Path,
    /// Tokens per chunk of the chunk kernels (64 in f32, 32 in f64; the sequential form takes
    /// the configured `chunk`).
    pub chunk: usize,
    /// Gated DeltaNet's state pass (none for the other members).
    pub state_pass: Option<StatePass>,
    /// The kernel launches, in order.
    pub launches: Vec<Launch>,
    /// What the rule did not take, for tuning (never launched): the launches of the other
    /// state-pass variants that fit ([`state_pass::candidates`]) and, where the WY/UT step runs on
    /// tensor cores, its FMA kernel.
    pub alternatives: Vec<Launch>,
}

/// Whether linear attention and Mamba-2 in the bf16 mode on bf16 activations take the bf16 path
/// ([`Path::SsdBf16`]): no lift, the one-state-per-chunk output kernel fitting `device`
/// ([`output::direct_fits`]: `Dk ≤ 128`), nothing empty.
fn ssd_bf16_applies(s: Shape, lifted: bool, device: Device) -> bool {
    !lifted && output::direct_fits(s.dk, 2, device) && s.b * s.t * s.h * s.dk * s.dv != 0
}

/// The launches of the `fast` form of `ll` for `shape` (`[B, T, H, Dk, Dv]`), precision mode `p`,
/// the activations' `storage` and `device`: the rule for the path and the state pass, and every
/// kernel's function, defines, grid, block and dynamic shared memory. Errors where a size exceeds
/// the kernels' limits (the errors [`run`] gives). No GPU is needed.
pub fn plan(
    ll: &LogLinear,
    shape: [usize; 5],
    p: Precision,
    storage: Storage,
    device: Device,
) -> Result<Plan> {
    plan_with(ll, shape, p, storage, device, Bf16States::Bf16)
}

/// [`plan`], the bf16 path of linear attention and Mamba-2 writing the states entering the chunks
/// as `states` says (f32 where a backward keeps them).
fn plan_with(
    ll: &LogLinear,
    shape: [usize; 5],
    p: Precision,
    storage: Storage,
    device: Device,
    states: Bf16States,
) -> Result<Plan> {
    let s = Shape::new(shape);
    let [b, t, h, _, dv] = shape;
    let lifted = ll.lift.is_some();
    let elem = storage.elem();
    let mut plan = Plan {
        mixer: ll.name.clone(),
        lifted,
        shape: s,
        precision: p,
        storage,
        device,
        path: Path::Empty,
        chunk: elem.chunk(),
        state_pass: None,
        launches: Vec::new(),
        alternatives: Vec::new(),
    };
    let bf16_mode = p == Precision::Bf16 && matches!(storage, Storage::Bf16 { .. });
    match ll.base {
        Base::LinearAttention | Base::Mamba2 => {
            if bf16_mode && ssd_bf16_applies(s, lifted, device) {
                plan.path = Path::SsdBf16;
                plan.launches = ssd::launches(s, Elem::F32, p, false, Some(states), device)?;
                plan.launches.push(output::launch_bf16(s, states));
            } else if b * t * h * dv != 0 {
                plan.path = Path::Ssd;
                plan.launches = ssd::launches(s, elem, p, lifted, None, device)?;
                plan.launches.push(output::launch(s, elem, p, lifted, device));
            }
        }
        Base::GatedDeltaNet => {
            let pass = state_pass::select(s, p, storage, lifted, device);
            match pass {
                StatePass::Bf16Registers { .. } => {
                    check_sizes(s, Elem::F32, s.chunks(64))?;
                    plan.path = Path::DeltaBf16;
                    plan.launches.push(wy::launch_bf16(s));
                    plan.launches.extend(state_pass::launches(pass, s, Elem::F32, p, false));
                    plan.launches.push(output::launch_bf16(s, Bf16States::F32));
                }
                _ if b * t * h * dv == 0 => {}
                StatePass::Sequential => {
                    plan.path = Path::Sequential;
                    plan.chunk = ll.chunk;
                    plan.launches.push(sequential::launch(ll, s, elem)?);
                }
                _ => {
                    check_sizes(s, elem, state_pass::slots(lifted, s.chunks(elem.chunk())).max(1))?;
                    plan.path = Path::Delta;
                    plan.launches.push(wy::launch(s, elem, p));
                    plan.launches.extend(state_pass::launches(pass, s, elem, p, lifted));
                    plan.launches.push(if lifted {
                        output::launch_lift(s, elem, p)
                    } else {
                        output::launch(s, elem, p, false, device)
                    });
                }
            }
            if plan.path != Path::Empty {
                plan.state_pass = Some(pass);
                let wy_fma = wy::launch(s, elem, Precision::Exact);
                if !plan.launches.contains(&wy_fma) && plan.path == Path::Delta {
                    plan.alternatives.push(wy_fma);
                }
                for other in state_pass::candidates(s, p, storage, lifted, device) {
                    if other != pass {
                        let e =
                            if matches!(other, StatePass::Bf16Registers { .. }) { Elem::F32 } else { elem };
                        plan.alternatives.extend(state_pass::launches(other, s, e, p, lifted));
                    }
                }
            }
        }
    }
    Ok(plan)
}

/// How `q`, `k`, `v` are stored in `x` for the form of `F`: bf16 (with whether their rows start
/// 16-byte aligned) where all three are bf16 and `F` is `f32`, else `F`.
pub(crate) fn storage<F: GpuReal>(x: &DeviceTensors) -> Storage {
    match bf16_qkv(x) {
        Some((qkv, _)) if Elem::of::<F>() == Elem::F32 => {
            Storage::Bf16 { aligned: qkv.iter().all(|a| a.identity().1 % 8 == 0) }
        }
        _ => Storage::Real(Elem::of::<F>()),
    }
}

/// Runs the `fast` form on device tensors.
pub fn run<F: GpuReal>(ll: &LogLinear, x: &DeviceTensors, p: Precision) -> Result<AnyDeviceTensor> {
    run_from::<F>(ll, x, p, None, false).map(|(y, _)| y)
}

/// Why [`run_from`] cannot run `ll` from a state, or `None`: the base mixers can (linear attention
/// and Mamba-2 through their scan, gated DeltaNet through its state pass or the sequential form),
/// in every mode; a lift's level states go through [`super::lift_state`] instead (the chunk-state
/// tree takes none).
pub fn state_unsupported(ll: &LogLinear) -> Option<String> {
    ll.lift.map(|_| {
        "the lifts' state (Fenwick level states and a position, docs/math.md §7.1) is taken by \
         `loglinear::lift_state::run_from`, not by the chunked form itself"
            .into()
    })
}

/// [`run`] of a base mixer from the state `s0` (`S [B, H, Dv, Dk]` as `F`; `None`: zero); with
/// `want_final`, also the final state after the last token (docs/math.md §7). Only where
/// [`state_unsupported`] says nothing. A run from a state takes the launches of the run without
/// one (the same [`plan`], in the mode asked): linear attention and Mamba-2 start their scan from
/// `S_0ᵀ`, which writes the final state, and their outputs read it in chunk 0; gated DeltaNet's
/// state pass (every variant, or the sequential form) starts from `S_0ᵀ` and writes the final
/// state, and the outputs read it in chunk 0. The state stays `F` (f32 in the bf16 mode).
pub fn run_from<F: GpuReal>(
    ll: &LogLinear,
    x: &DeviceTensors,
    p: Precision,
    s0: Option<&DeviceTensor<F>>,
    want_final: bool,
) -> Result<(AnyDeviceTensor, Option<DeviceTensor<F>>)> {
    run_planned_for(ll, x, p, s0, want_final, Device::current())
}

/// [`run_from`] with the launches [`plan`] chooses for `device` rather than for this process's
/// device (whose kernels run them): for reproducing another device's plan, and for tests that
/// hold a path's launches against another's (a device with one multiprocessor takes the paths
/// meant for many blocks).
pub fn run_planned_for<F: GpuReal>(
    ll: &LogLinear,
    x: &DeviceTensors,
    p: Precision,
    s0: Option<&DeviceTensor<F>>,
    want_final: bool,
    device: Device,
) -> Result<(AnyDeviceTensor, Option<DeviceTensor<F>>)> {
    run_keeping(ll, x, p, s0, want_final, device, false).map(|r| (r.y, r.fin))
}

/// The output launch of the chunked form of `ll` (no lift) at the sizes `dims` in mode `p` on
/// activations of `F`, reading the states entering its chunks stored transposed
/// (`llc_out_direct_tc_f32_ht`, `_ht_k128`), where the plan's output is `llc_out_direct_tc_f32`
/// (f32, tensor cores, `Dk ≤ 128`); else `None`. The backward's reversed run for `d_v` reads the
/// chunk states of its run for `d_k` so ([`super::backward`]).
pub(crate) fn transposed_output<F: GpuReal>(
    ll: &LogLinear,
    dims: [usize; 5],
    p: Precision,
    device: Device,
) -> Result<Option<Launch>> {
    if ll.lift.is_some() || Elem::of::<F>() != Elem::F32 {
        return Ok(None);
    }
    let plan = plan(ll, dims, p, Storage::Real(Elem::F32), device)?;
    Ok(match (plan.path, plan.launches.last()) {
        (Path::Ssd, Some(l)) if l.function.starts_with("llc_out_direct_tc_f32") => {
            let mut l = l.clone();
            l.function = l.function.replacen("llc_out_direct_tc_f32", "llc_out_direct_tc_f32_ht", 1);
            Some(l)
        }
        _ => None,
    })
}

/// `y` of the chunked form of `x` (`q`, `k`, `v` and `g` as `F`) by the launch `l` of
/// [`transposed_output`], the state entering chunk `j` being `chunks[.., j]` transposed (`chunks
/// [B, H, ⌈T/64⌉, Dv, Dk]`: [`Kept::chunks`] of a run whose keys and values are this run's values
/// and keys); chunk 0 reads its state only with `read0`.
pub(crate) fn run_transposed<F: GpuReal>(
    ll: &LogLinear,
    x: &DeviceTensors,
    l: &Launch,
    chunks: &DeviceTensor<F>,
    read0: bool,
    p: Precision,
) -> Result<AnyDeviceTensor> {
    let (q, k, v) = (input::<F>(x, "q")?, input::<F>(x, "k")?, input::<F>(x, "v")?);
    let &[b, t, h, dk] = q.shape() else {
        return Err(err(FAMILY, format!("internal: q of shape {:?}", q.shape())));
    };
    let dv = v.shape().get(3).copied().unwrap_or(0);
    let want = [b, h, t.div_ceil(64), dv, dk];
    if chunks.shape() != want {
        return Err(err(
            FAMILY,
            format!("internal: chunk states {:?} where {want:?} was expected", chunks.shape()),
        ));
    }
    let g = if ll.base.has_decay() { input_opt::<F>(x, "g")? } else { None };
    let zero = pool::zeros::<F>(FAMILY, 1)?;
    let (gv, has_g) = view_or_zero(g.as_deref(), &zero);
    let mut y = output_buffer::<F>(None, b * t * h * dv, h * dv)?;
    let (qv, kv, vv, cv) = (q.view(), k.view(), v.view(), chunks.view());
    let s = Shape::new([b, t, h, dk, dv]);
    let (f, cfg) = l.function()?;
    output::run_direct(f, cfg, [&qv, &kv, &vv], (&gv, has_g), (&cv, None), s, ll.scale, read0, &mut y)?;
    finish(DeviceTensor::from_pooled(y, &[b, t, h, dv])?, p)
}

/// What [`run_keeping`] returns.
pub(crate) struct Kept<F: GpuReal> {
    /// `y [B, T, H, Dv]`.
    pub y: AnyDeviceTensor,
    /// The final state `S [B, H, Dv, Dk]` (with `want_final`).
    pub fin: Option<DeviceTensor<F>>,
    /// With `keep` on the chunked path of linear attention or Mamba-2 without a lift: the state
    /// entering every chunk of `CH = Elem::chunk()` tokens, `H_j = S_{jCH−1}ᵀ` (`H_0 = S_0ᵀ`, zero
    /// without an initial state), `[B, H, ⌈T/CH⌉, Dk, Dv]`; `None` on every other path.
    pub chunks: Option<DeviceTensor<F>>,
}

/// The shape of [`Kept::chunks`] for a run of sizes `[B, T, H, Dk, Dv]` in chunks of `F`.
fn chunk_shape<F: GpuReal>([b, t, h, dk, dv]: [usize; 5]) -> [usize; 5] {
    [b, h, t.div_ceil(Elem::of::<F>().chunk()), dk, dv]
}

/// [`run_planned_for`], keeping with `keep` the states entering the chunks ([`Kept::chunks`]).
pub(crate) fn run_keeping<F: GpuReal>(
    ll: &LogLinear,
    x: &DeviceTensors,
    p: Precision,
    s0: Option<&DeviceTensor<F>>,
    want_final: bool,
    device: Device,
    keep: bool,
) -> Result<Kept<F>> {
    let stateful = s0.is_some() || want_final;
    if stateful && let Some(why) = state_unsupported(ll) {
        return Err(err(FAMILY, why));
    }
    let check_s0 = |[b, _, h, dk, dv]: [usize; 5]| match s0 {
        Some(s) if s.shape() != [b, h, dv, dk] => Err(Error::Value {
            name: "S".into(),
            constraint: format!("the initial state is [B, H, Dv, Dk] = [{b}, {h}, {dv}, {dk}]"),
            found: format!("{:?}", s.shape()),
        }),
        _ => Ok(()),
    };
    if p == Precision::Bf16
        && let st @ Storage::Bf16 { .. } = storage::<F>(x)
        && let Some((_, dims)) = bf16_qkv(x)
    {
        let (shape, lifted) = (Shape::new(dims), ll.lift.is_some());
        let bf16_run: Option<Bf16Run> = match ll.base {
            Base::LinearAttention | Base::Mamba2 => {
                ssd_bf16_applies(shape, lifted, device).then_some(run_ssd_bf16 as Bf16Run)
            }
            Base::GatedDeltaNet => {
                matches!(state_pass::select(shape, p, st, lifted, device), StatePass::Bf16Registers { .. })
                    .then_some(run_delta_bf16 as Bf16Run)
            }
        };
        if let Some(run_bf16) = bf16_run {
            check_s0(dims)?;
            // (storage::<F> gives bf16 only where F is f32: these casts are identities.)
            let s0 = s0.map(same::<F, f32>).transpose()?;
            let (y, fin, chunks) = run_bf16(ll, x, st, device, s0.as_ref(), want_final, keep)?;
            let chunks = match chunks {
                Some(c) if keep => {
                    Some(same::<f32, F>(&DeviceTensor::from_pooled(c, &chunk_shape::<F>(dims))?)?)
                }
                _ => None,
            };
            return Ok(Kept { y, fin: fin.as_ref().map(same::<f32, F>).transpose()?, chunks });
        }
    }
    let (q, k, v) = (input::<F>(x, "q")?, input::<F>(x, "k")?, input::<F>(x, "v")?);
    let (b, t, h, dk) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let dv = v.shape()[3];
    check_s0([b, t, h, dk, dv])?;
    if b * t * h * dv == 0 {
        // Nothing to mix: the state passes through unchanged.
        let fin = match (want_final, s0) {
            (false, _) => None,
            (true, Some(s)) => Some(s.clone()),
            (true, None) => Some(DeviceTensor::<F>::zeros(&[b, h, dv, dk])?),
        };
        return Ok(Kept { y: finish(DeviceTensor::<F>::zeros(&[b, t, h, dv])?, p)?, fin, chunks: None });
    }
    let inp = chunked_inputs(ll, x, (q, k, v), [b, t, h, dk, dv])?;
    // The activations are F now (converted where they were stored otherwise).
    let plan = plan(ll, inp.dims, p, Storage::Real(Elem::of::<F>()), device)?;
    let mut chunks = None;
    let (y, fin) = match (plan.path, plan.state_pass) {
        (Path::Ssd, _) => {
            let (y, pre) = ssd::run(ll, &inp, &plan.launches, s0, want_final, None)?;
            if keep && ll.lift.is_none() {
                chunks = Some(DeviceTensor::from_pooled(pre.tree, &chunk_shape::<F>([b, t, h, dk, dv]))?);
            }
            (y, pre.fin)
        }
        (Path::Sequential, _) => {
            let l = plan.launches.first().ok_or_else(|| err(FAMILY, "internal: an empty plan"))?;
            sequential::run(ll, &inp, l, s0, want_final)?
        }
        (Path::Delta, Some(pass)) => run_delta(ll, &inp, pass, &plan.launches, s0, want_final, None)?,
        _ => return Err(err(FAMILY, format!("internal: no path for the plan {:?}", plan.path))),
    };
    let fin = fin.map(|f| DeviceTensor::from_pooled(f, &[b, h, dv, dk])).transpose()?;
    let checks = inp.lam.as_ref().map(|(l, _)| l.checks().to_vec()).unwrap_or_default();
    let y = finish(DeviceTensor::from_pooled(y, &[b, t, h, dv])?.with_checks(checks), p)?;
    Ok(Kept { y, fin, chunks })
}

/// The inputs of the chunked form from `q`, `k`, `v` (as `F`, of sizes `dims`) and the rest of
/// `x`: `g` and `beta` where the base mixer has them, a lift's mapped λ.
pub(crate) fn chunked_inputs<'a, F: GpuReal>(
    ll: &LogLinear,
    x: &'a DeviceTensors,
    (q, k, v): (Cow<'a, DeviceTensor<F>>, Cow<'a, DeviceTensor<F>>, Cow<'a, DeviceTensor<F>>),
    dims: [usize; 5],
) -> Result<ChunkedInputs<'a, F>> {
    Ok(ChunkedInputs {
        g: if ll.base.has_decay() { input_opt::<F>(x, "g")? } else { None },
        beta: if ll.base.has_beta() { input_opt::<F>(x, "beta")? } else { None },
        lam: if ll.lift.is_some() { Some(mapped_lambda::<F>(ll, x, dims[1])?) } else { None },
        q,
        k,
        v,
        dims,
        zero: pool::zeros::<F>(FAMILY, 1)?,
    })
}

/// `a` as a tensor of `G`, where `F` and `G` are one type (an internal error otherwise).
fn same<F: GpuReal, G: GpuReal>(a: &DeviceTensor<F>) -> Result<DeviceTensor<G>> {
    G::unwrap(&F::wrap(a.clone()))
        .cloned()
        .ok_or_else(|| err(FAMILY, format!("internal: a {} state where {} was expected", F::ELEM, G::ELEM)))
}

/// A lift's λ weights on the device ([`lambda::weights`] of the inputs `lambda` and
/// `lambda_param`) and their level count, after checking that `t` tokens' Fenwick levels are
/// there.
pub(crate) fn mapped_lambda<F: GpuReal>(
    ll: &LogLinear,
    x: &DeviceTensors,
    t: usize,
) -> Result<(DeviceTensor<F>, usize)> {
    let raw = input::<F>(x, "lambda")?;
    let param = input_opt::<F>(x, "lambda_param")?;
    map_lambda(ll, &raw, param.as_deref(), t)
}

/// [`mapped_lambda`] of the raw `lambda` and `lambda_param` as given.
pub(crate) fn map_lambda<F: GpuReal>(
    ll: &LogLinear,
    raw: &DeviceTensor<F>,
    param: Option<&DeviceTensor<F>>,
    t: usize,
) -> Result<(DeviceTensor<F>, usize)> {
    let levels = raw.shape().get(3).copied().unwrap_or(0);
    // The highest Fenwick level T tokens read (MATH §2.2), whatever the chunking.
    let need = bitlen(t.saturating_sub(1));
    if need >= levels {
        return Err(Error::Value {
            name: "lambda".into(),
            constraint: format!("T = {t} reads Fenwick level {need}, so λ needs more than {need} levels"),
            found: format!("L = {levels}"),
        });
    }
    Ok((lambda::weights(ll, raw, param)?, levels))
}

/// A bf16 path ([`run_ssd_bf16`], [`run_delta_bf16`]): `y` (bf16), where `want_final` the f32
/// final state, and where the path has them and `keep` asks for them the f32 states entering the
/// chunks (those of [`Kept::chunks`], pooled), from the activations' storage, the device and the
/// f32 state `s0`.
type Bf16Run = fn(
    &LogLinear,
    &DeviceTensors,
    Storage,
    Device,
    Option<&DeviceTensor<f32>>,
    bool,
    bool,
) -> Result<(AnyDeviceTensor, Option<DeviceTensor<f32>>, Option<Pooled<f32>>)>;

/// Linear attention and Mamba-2 without a lift in the bf16 mode, on the bf16 activations as
/// stored ([`Path::SsdBf16`]), from the f32 state `s0` (`None`: zero), with the final state where
/// `want_final`; the states entering the chunks stay f32 and come back where `keep` (else they are
/// written in bf16 for the outputs alone: [`Bf16States`]).
fn run_ssd_bf16(
    ll: &LogLinear,
    x: &DeviceTensors,
    st: Storage,
    device: Device,
    s0: Option<&DeviceTensor<f32>>,
    want_final: bool,
    keep: bool,
) -> Result<(AnyDeviceTensor, Option<DeviceTensor<f32>>, Option<Pooled<f32>>)> {
    let Some((_, dims)) = bf16_qkv(x) else {
        return Err(err(FAMILY, "internal: the bf16 path needs bf16 q, k, v"));
    };
    let g = if ll.base.has_decay() { input_opt::<f32>(x, "g")? } else { None };
    let states = if keep { Bf16States::F32 } else { Bf16States::Bf16 };
    let plan = plan_with(ll, dims, Precision::Bf16, st, device, states)?;
    ssd::run_bf16(ll, x, g.as_deref(), (&plan.launches, states), s0, want_final, None)
}

/// Gated DeltaNet, parallel over chunks except the state pass `pass`: the launches of the
/// [`Path::Delta`] plan; without a lift from the initial state `s0` (`S_0 [B, H, Dv, Dk]`;
/// `None`: zero: the pass starts from `H_0 = S_0ᵀ` and the outputs read it in chunk 0) and with
/// `want_final` also returning the final state `S_T [B·H, Dv, Dk]`. With a chunk `table` (a packed
/// batch, no lift, a register pass; the launches on the table's grids) `s0` and the final state
/// have a row per sequence and `y` is zero past the last offset.
pub(crate) fn run_delta<F: GpuReal>(
    ll: &LogLinear,
    x: &ChunkedInputs<'_, F>,
    pass: StatePass,
    launches: &[Launch],
    s0: Option<&DeviceTensor<F>>,
    want_final: bool,
    table: Option<&ChunkTable>,
) -> Result<(pool::Pooled<F>, Option<pool::Pooled<F>>)> {
    let s = x.shape();
    let [b, t, h, dk, dv] = s.dims();
    let elem = Elem::of::<F>();
    let (ch, bh) = (elem.chunk(), s.bh());
    let (nc, rows) = table.map_or((s.chunks(ch), b), |c| (c.chunks, c.seqs));
    let lifted = ll.lift.is_some();
    let slots = state_pass::slots(lifted, nc);
    let (g, has_g) = x.g_view();
    let beta = x.beta.as_ref().ok_or_else(|| err(FAMILY, "gated DeltaNet needs `beta`"))?;
    let (first, rest) = launches.split_first().ok_or_else(|| err(FAMILY, "internal: an empty plan"))?;
    let (last, pass_launches) =
        rest.split_last().ok_or_else(|| err(FAMILY, "internal: a plan without outputs"))?;
    let mut w = pool::take::<F>(FAMILY, b * t * h * dk)?;
    let mut u = pool::take::<F>(FAMILY, b * t * h * dv)?;
    let mut tinv = pool::take::<F>(FAMILY, if lifted { bh * nc * ch * ch } else { 1 })?;
    let (kv, vv, bv) = (x.k.view(), x.v.view(), beta.view());
    wy::run(first, [&kv, &vv], (&g, has_g), &bv, [&mut w, &mut u], (&mut tinv, lifted), s, table)?;
    let mut vn = pool::take::<F>(FAMILY, if lifted { 1 } else { b * t * h * dv })?;
    let mut hs = pool::take::<F>(FAMILY, bh * slots.max(1) * dk * dv)?;
    let ((s0v, has_s0), mut fin) = state_pass::state_io(s0, &x.zero, want_final, rows * h * dk * dv)?;
    let data = PassData {
        k: &kv,
        g: (&g, has_g),
        w: &w,
        u: &u,
        vn: &mut vn,
        hs: &mut hs,
        s0: (&s0v, has_s0),
        fin: fin.as_mut(),
    };
    state_pass::run(pass, pass_launches, data, s, elem, lifted, table)?;
    drop(u);
    let mut y = output_buffer::<F>(table, b * t * h * dv, h * dv)?;
    let qv = x.q.view();
    let fc = last.function()?;
    if !lifted {
        drop((w, tinv));
        let decays = pool::zeros::<f64>(FAMILY, 1)?;
        let vnv = vn.slice(0..vn.len());
        output::run(
            last,
            fc,
            [&qv, &kv, &vnv],
            (&g, has_g),
            &x.lam_view(),
            &hs,
            &decays,
            1,
            (false, s0.is_some()),
            s,
            ll.scale,
            &mut y,
            table,
        )?;
        return Ok((y, fin));
    }
    let (lam, n_levels) = x.lam.as_ref().ok_or_else(|| err(FAMILY, "the lift needs `lambda`"))?;
    let lv = lam.view();
    output::run_lift(
        fc,
        [&qv, &kv, &vv],
        (&g, has_g),
        &bv,
        (&lv, *n_levels),
        [&w, &tinv, &hs],
        slots,
        s,
        ll.scale,
        &mut y,
    )?;
    Ok((y, fin))
}

/// Gated DeltaNet without a lift in the bf16 mode on bf16 operands end to end
/// ([`Path::DeltaBf16`]), as flash-linear-attention's bf16 kernels do: `llc_wy_tc_bf16` reads `k`,
/// `v` as stored and writes `W`, `U` rounded to bf16; `llc_delta_h_rb_bf16` (the state in
/// registers, f32 accumulation, bf16 `m16n8k16` mma) writes the entering states (f32) and the new
/// values (bf16); `llc_out_direct_tc_bf16` writes a bf16 `y`. The state and the new values are
/// rounded to bf16 where they enter a product, so this mode is less exact than tf32 (about 10⁻³
/// relative against the f64 oracle). From the f32 state `s0` (`None`: zero), with the final state
/// where `want_final` (f32: the pass keeps the state in f32).
fn run_delta_bf16(
    ll: &LogLinear,
    x: &DeviceTensors,
    st: Storage,
    device: Device,
    s0: Option<&DeviceTensor<f32>>,
    want_final: bool,
    _keep: bool,
) -> Result<(AnyDeviceTensor, Option<DeviceTensor<f32>>, Option<Pooled<f32>>)> {
    let Some((_, dims)) = bf16_qkv(x) else {
        return Err(err(FAMILY, "internal: the bf16 path needs bf16 q, k, v"));
    };
    let plan = plan(ll, dims, Precision::Bf16, st, device)?;
    let pass =
        plan.state_pass.ok_or_else(|| err(FAMILY, "internal: a gated DeltaNet plan without a pass"))?;
    let (y, fin) = delta_bf16(ll, x, pass, &plan.launches, s0, want_final, None)?;
    Ok((y, fin, None))
}

/// [`run_delta_bf16`] with the launches of its plan (`pass` its state pass); a chunk `table` as in
/// [`run_delta`].
pub(crate) fn delta_bf16(
    ll: &LogLinear,
    x: &DeviceTensors,
    pass: StatePass,
    launches: &[Launch],
    s0: Option<&DeviceTensor<f32>>,
    want_final: bool,
    table: Option<&ChunkTable>,
) -> Result<(AnyDeviceTensor, Option<DeviceTensor<f32>>)> {
    let Some(([q, k, v], dims)) = bf16_qkv(x) else {
        return Err(err(FAMILY, "internal: the bf16 path needs bf16 q, k, v"));
    };
    let s = Shape::new(dims);
    let [b, t, h, dk, dv] = dims;
    let gt = input_opt::<f32>(x, "g")?;
    let beta = input::<f32>(x, "beta")?;
    let zero = pool::zeros::<f32>(FAMILY, 1)?;
    let (gv, has_g) = view_or_zero(gt.as_deref(), &zero);
    let [wyl, pass_launch, out] = launches else {
        return Err(err(FAMILY, "internal: the bf16 plan of gated DeltaNet has three launches"));
    };
    let bh = s.bh();
    let (nc, rows) = table.map_or((s.chunks(64), b), |c| (c.chunks, c.seqs));
    let (qv, kv, vv, bv) = (q.view(), k.view(), v.view(), beta.view());
    let mut w = pool::take::<bf16>(FAMILY, b * t * h * dk)?;
    let mut u = pool::take::<bf16>(FAMILY, b * t * h * dv)?;
    let mut tinv = pool::take::<f32>(FAMILY, 1)?;
    wy::run(wyl, [&kv, &vv], (&gv, has_g), &bv, [&mut w, &mut u], (&mut tinv, false), s, table)?;
    let mut vn = pool::take::<bf16>(FAMILY, b * t * h * dv)?;
    let mut hs = pool::take::<f32>(FAMILY, bh * nc * dk * dv)?;
    let ((s0v, has_s0), mut fin) = state_pass::state_io(s0, &zero, want_final, rows * h * dk * dv)?;
    let data = PassData {
        k: &kv,
        g: (&gv, has_g),
        w: &w,
        u: &u,
        vn: &mut vn,
        hs: &mut hs,
        s0: (&s0v, has_s0),
        fin: fin.as_mut(),
    };
    state_pass::run(pass, std::slice::from_ref(pass_launch), data, s, Elem::F32, false, table)?;
    drop((w, u, tinv));
    let mut y = output_buffer::<bf16>(table, b * t * h * dv, h * dv)?;
    let (f, cfg) = out.function()?;
    let vnv = vn.slice(0..vn.len());
    output::run_direct(
        f,
        cfg,
        [&qv, &kv, &vnv],
        (&gv, has_g),
        (&hs.slice(0..hs.len()), table),
        s,
        ll.scale,
        s0.is_some(),
        &mut y,
    )?;
    let fin = fin.map(|f| DeviceTensor::from_pooled(f, &[rows, h, dv, dk])).transpose()?;
    Ok((AnyDeviceTensor::Bf16(DeviceTensor::from_pooled(y, &[b, t, h, dv])?), fin))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loglinear::common::Step;
    use Precision::{Bf16, Exact, Tf32};
    use mixer_core::mixers::loglinear::{LambdaScheme, LevelMask, Lift};

    const H200: Device = Device::H200;
    const F32: Storage = Storage::Real(Elem::F32);
    const BF16: Storage = Storage::Bf16 { aligned: true };

    fn mixer(base: Base, lifted: bool) -> LogLinear {
        let lift = lifted.then(|| Lift { mask: LevelMask::fenwick(), lambda: LambdaScheme::identity() });
        LogLinear::new("m", base, lift, 0.125, 64).unwrap()
    }

    fn plan_of(base: Base, lifted: bool, shape: [usize; 5], p: Precision, st: Storage) -> Plan {
        plan(&mixer(base, lifted), shape, p, st, H200).unwrap()
    }

    fn functions(p: &Plan) -> Vec<&str> {
        p.launches.iter().map(|l| l.function.as_str()).collect()
    }

    const T16K: [usize; 5] = [1, 16384, 16, 64, 64];

    #[test]
    fn the_output_from_transposed_states_is_the_direct_kernels_ht_form() {
        let ht = |base, lifted, shape, p| {
            transposed_output::<f32>(&mixer(base, lifted), shape, p, H200).unwrap().map(|l| l.function)
        };
        assert_eq!(ht(Base::Mamba2, false, T16K, Tf32).as_deref(), Some("llc_out_direct_tc_f32_ht"));
        let p = plan_of(Base::Mamba2, false, [8, 4096, 16, 128, 70], Tf32, F32);
        let l = transposed_output::<f32>(&mixer(Base::Mamba2, false), [8, 4096, 16, 128, 70], Tf32, H200)
            .unwrap();
        let l = l.expect("a tf32 run with Dk = 128 reads transposed states");
        assert_eq!(l.function, "llc_out_direct_tc_f32_ht_k128");
        // The same grid, block and shared memory as the plan's own output launch.
        let own = p.launches.last().unwrap();
        assert_eq!(
            (l.grid, l.block, l.shared_mem, &l.defines),
            (own.grid, own.block, own.shared_mem, &own.defines)
        );
        assert_eq!(ht(Base::LinearAttention, false, T16K, Tf32).as_deref(), Some("llc_out_direct_tc_f32_ht"));
        // The exact mode's FMA kernel, a lift, a head dim past 128, and f64 have none.
        assert_eq!(ht(Base::Mamba2, false, T16K, Exact), None);
        assert_eq!(ht(Base::Mamba2, true, T16K, Tf32), None);
        assert_eq!(ht(Base::Mamba2, false, [1, 4096, 2, 129, 64], Tf32), None);
        let f64_run = transposed_output::<f64>(&mixer(Base::Mamba2, false), T16K, Tf32, H200).unwrap();
        assert!(f64_run.is_none());
    }

    #[test]
    fn an_empty_output_launches_nothing() {
        for base in [Base::Mamba2, Base::GatedDeltaNet] {
            let p = plan_of(base, false, [2, 0, 3, 64, 64], Tf32, F32);
            assert_eq!((p.path, p.launches.len()), (Path::Empty, 0));
        }
    }

    #[test]
    fn scalar_decay_takes_states_then_the_scan_or_the_tree_then_the_outputs() {
        let p = plan_of(Base::Mamba2, false, T16K, Tf32, F32);
        assert_eq!(p.path, Path::Ssd);
        assert_eq!(functions(&p), ["llc_states_tc_f32", "llc_scan_f32", "llc_out_direct_tc_f32"]);
        assert_eq!(p.launches[0].grid, [256, 16, 1]);
        assert_eq!(p.launches[2].shared_mem, 3 * 64 * 64 * 4 + 64 * 64 * 4);
        assert_eq!(
            functions(&plan_of(Base::LinearAttention, false, T16K, Exact, F32)),
            ["llc_states_f32", "llc_scan_f32", "llc_out_f32"]
        );
        // 64 < Dk ≤ 128: tiles of 128 key columns; above 128, or where those tiles do not fit
        // the device's shared memory, the general tensor-core output kernel.
        let p = plan_of(Base::Mamba2, false, [1, 16384, 16, 128, 64], Tf32, F32);
        assert_eq!(functions(&p)[2], "llc_out_direct_tc_f32_k128");
        assert_eq!(p.launches[2].shared_mem, (2 * 128 + 64) * 64 * 4 + 128 * 64 * 4);
        let p = plan_of(Base::Mamba2, false, [1, 1000, 3, 72, 40], Tf32, F32);
        assert_eq!(functions(&p)[2], "llc_out_direct_tc_f32_k128");
        let p = plan_of(Base::Mamba2, false, [1, 16384, 16, 129, 64], Tf32, F32);
        assert_eq!(functions(&p)[2], "llc_out_tc_f32");
        let small = Device { sms: 132, smem: 100 << 10 };
        let p = plan(&mixer(Base::Mamba2, false), [1, 16384, 16, 128, 64], Tf32, F32, small).unwrap();
        assert_eq!(functions(&p)[2], "llc_out_tc_f32");
        let p = plan(&mixer(Base::Mamba2, false), T16K, Tf32, F32, small).unwrap();
        assert_eq!(functions(&p)[2], "llc_out_direct_tc_f32");
        // The lift: a tree launch per level of 256 chunks (levels 1 to 8), then the outputs.
        let p = plan_of(Base::Mamba2, true, T16K, Tf32, F32);
        let f = functions(&p);
        assert_eq!((f[0], f.len(), f[9]), ("llc_states_tc_f32", 10, "llc_out_tc_f32"));
        assert!(f[1..9].iter().all(|&n| n == "llc_tree_f32"));
        assert_eq!(p.launches[8].step, Step::Tree { level: 8 });
        assert_eq!(p.launches[8].grid, [1, 16, 1]);
        // f64: chunks of 32.
        let p = plan_of(Base::Mamba2, false, T16K, Exact, Storage::Real(Elem::F64));
        assert_eq!((p.chunk, p.launches[0].grid[0]), (32, 512));
        assert_eq!(functions(&p), ["llc_states_f64", "llc_scan_f64", "llc_out_f64"]);
    }

    #[test]
    fn scalar_decay_walks_the_chunks_where_there_are_enough_blocks_for_the_device() {
        // (8, 4096, 16, 128): 4 key × value tiles of 64 × 128 heads = 512 blocks ≥ 1.5 · 132.
        let p = plan_of(Base::Mamba2, false, [8, 4096, 16, 128, 128], Tf32, F32);
        assert_eq!(functions(&p), ["llc_walk_tc_f32", "llc_out_direct_tc_f32_k128"]);
        assert_eq!(p.launches[0].step, Step::Walk);
        assert_eq!((p.launches[0].grid, p.launches[0].block), ([4, 128, 1], 128));
        assert!(p.launches[0].defines.contains(&"LLW_VT=64".to_string()));
        assert_eq!(p.launches[0].shared_mem, 2 * 64 * (72 + 72) * 4);
        let p = plan_of(Base::Mamba2, false, [8, 4096, 16, 128, 128], Bf16, BF16);
        assert_eq!(functions(&p), ["llc_walk_tc_hb", "llc_out_direct_tc_hb_k128"]);
        assert_eq!(p.launches[0].shared_mem, 3 * 64 * (72 + 72) * 2);
        // A backward keeps the f32 states: the same launches writing and reading f32.
        let st = BF16;
        let p =
            plan_with(&mixer(Base::Mamba2, false), [8, 4096, 16, 128, 128], Bf16, st, H200, Bf16States::F32);
        assert_eq!(functions(&p.unwrap()), ["llc_walk_tc_bf16", "llc_out_direct_tc_bf16_k128"]);
        // (8, 4096, 16, 64): 128 blocks of 64 value columns are too few, 256 of 32 are enough.
        let p = plan_of(Base::LinearAttention, false, [8, 4096, 16, 64, 64], Tf32, F32);
        assert_eq!(p.launches[0].grid, [2, 128, 1]);
        assert!(p.launches[0].defines.contains(&"LLW_VT=32".to_string()));
        // B = 1: too few blocks either way; the exact mode and the lifts never walk.
        for shape in [T16K, [1, 16384, 16, 128, 128]] {
            assert_eq!(functions(&plan_of(Base::Mamba2, false, shape, Tf32, F32))[0], "llc_states_tc_f32");
        }
        assert_eq!(
            functions(&plan_of(Base::Mamba2, false, [8, 4096, 16, 128, 128], Exact, F32))[0],
            "llc_states_f32"
        );
        assert_eq!(
            functions(&plan_of(Base::Mamba2, true, [8, 4096, 16, 128, 128], Tf32, F32))[0],
            "llc_states_tc_f32"
        );
    }

    #[test]
    fn scalar_decay_in_the_bf16_mode_reads_bf16_activations_without_a_lift_up_to_dk_128() {
        let p = plan_of(Base::LinearAttention, false, T16K, Bf16, Storage::Bf16 { aligned: false });
        assert_eq!(p.path, Path::SsdBf16);
        assert_eq!(functions(&p), ["llc_states_tc_bf16", "llc_scan_hb", "llc_out_direct_tc_hb"]);
        let keep = Bf16States::F32;
        let pk = plan_with(&mixer(Base::LinearAttention, false), T16K, Bf16, BF16, H200, keep).unwrap();
        assert_eq!(functions(&pk), ["llc_states_tc_bf16", "llc_scan_f32", "llc_out_direct_tc_bf16"]);
        // Q, K, V and the state (bf16 in shared memory), 64 × 64 bf16 tiles each.
        assert_eq!(p.launches[2].shared_mem, 4 * 64 * 64 * 2);
        let p = plan_of(Base::Mamba2, false, [1, 64, 2, 80, 64], Bf16, BF16);
        assert_eq!(p.path, Path::SsdBf16);
        assert_eq!(functions(&p)[2], "llc_out_direct_tc_hb_k128");
        assert_eq!(p.launches[2].shared_mem, (3 * 128 + 64) * 64 * 2);
        // With the lift, Dk above 128, f32 activations or another mode: the f32 path.
        assert_eq!(plan_of(Base::Mamba2, true, T16K, Bf16, BF16).path, Path::Ssd);
        assert_eq!(plan_of(Base::Mamba2, false, [1, 64, 2, 136, 64], Bf16, BF16).path, Path::Ssd);
        assert_eq!(plan_of(Base::Mamba2, false, T16K, Bf16, F32).path, Path::Ssd);
        assert_eq!(plan_of(Base::Mamba2, false, T16K, Tf32, BF16).path, Path::Ssd);
    }

    #[test]
    fn gated_deltanet_takes_wy_then_the_selected_pass_then_the_outputs() {
        let p = plan_of(Base::GatedDeltaNet, false, T16K, Tf32, F32);
        assert_eq!((p.path, p.state_pass), (Path::Delta, Some(StatePass::Shared { stages: 3, group: 1 })));
        assert_eq!(functions(&p), ["llc_wy_tc_f32", "llc_delta_h_tc_f32", "llc_out_direct_tc_f32"]);
        assert_eq!(p.launches[1].stages, Some(3));
        // The FMA pass and WY kernel, and the register pass, are the alternatives.
        let alt: Vec<&str> = p.alternatives.iter().map(|l| l.function.as_str()).collect();
        assert_eq!(alt, ["llc_wy_f32", "llc_delta_h_f32", "llc_delta_h_rg_f32"]);
        let p = plan_of(Base::GatedDeltaNet, true, T16K, Tf32, F32);
        assert_eq!(p.state_pass, Some(StatePass::Transition { stages: 3 }));
        assert_eq!(
            functions(&p),
            ["llc_wy_tc_f32", "llc_lift_ab_tc_f32", "llc_lift_h_tc_f32", "llc_out_dl_tc_f32"]
        );
        let p = plan_of(Base::GatedDeltaNet, false, T16K, Exact, F32);
        assert_eq!(functions(&p), ["llc_wy_f32", "llc_delta_h_f32", "llc_out_f32"]);
        assert!(p.alternatives.is_empty());
        let p = plan_of(Base::GatedDeltaNet, true, T16K, Exact, Storage::Real(Elem::F64));
        assert_eq!(functions(&p), ["llc_wy_f64", "llc_delta_h_f64", "llc_out_dl_f64"]);
    }

    #[test]
    fn gated_deltanet_in_the_bf16_mode_runs_on_bf16_operands_where_the_rule_allows() {
        let p = plan_of(Base::GatedDeltaNet, false, T16K, Bf16, BF16);
        assert_eq!(
            (p.path, p.state_pass),
            (Path::DeltaBf16, Some(StatePass::Bf16Registers { warps: 2, stages: 3 }))
        );
        assert_eq!(functions(&p), ["llc_wy_tc_bf16", "llc_delta_h_rb_bf16", "llc_out_direct_tc_bf16"]);
        assert_eq!(p.launches[0].defines, ["LLC_DK=64", "LLC_DV=64", "DH_BF16=1"]);
        // Unaligned rows: the f32 path, k's bf16 bits taken as they are.
        let p = plan_of(Base::GatedDeltaNet, false, T16K, Bf16, Storage::Bf16 { aligned: false });
        assert_eq!(p.path, Path::Delta);
        assert_eq!(p.launches[1].defines, ["LLC_DK=64", "LLC_DV=64", "DH_K_TF32=1"]);
    }

    #[test]
    fn the_chunked_form_refuses_level_states_before_anything_runs() {
        // A run from a state takes the plan of the run without one (every pass without a lift
        // takes the state); a lift's level states are refused with the reason (lift_state takes
        // them), before touching a device.
        for base in [Base::GatedDeltaNet, Base::Mamba2, Base::LinearAttention] {
            assert!(state_unsupported(&mixer(base, false)).is_none());
            let why = state_unsupported(&mixer(base, true)).unwrap();
            let e = run_from::<f32>(&mixer(base, true), &DeviceTensors::new(), Exact, None, true)
                .unwrap_err()
                .to_string();
            assert!(e.contains(&why), "{e}");
        }
    }

    #[test]
    fn wide_heads_take_the_sequential_form_with_the_configured_chunk() {
        let p = plan_of(Base::GatedDeltaNet, false, [2, 1000, 3, 256, 64], Tf32, F32);
        assert_eq!((p.path, p.chunk, p.state_pass), (Path::Sequential, 64, Some(StatePass::Sequential)));
        assert_eq!(functions(&p), ["ll_chunked_f32"]);
        assert_eq!((p.launches[0].grid, p.launches[0].block), ([6, 1, 1], 256));
    }

    #[test]
    fn sizes_beyond_the_kernels_limits_are_errors() {
        let m = mixer(Base::Mamba2, false);
        let e = plan(&m, [65536, 64, 1, 16, 16], Tf32, F32, H200).unwrap_err();
        assert!(e.to_string().contains("B·H ≤ 65535"), "{e}");
        let g = mixer(Base::GatedDeltaNet, false);
        let e = plan(&g, [16384, 64, 1, 256, 256], Tf32, F32, H200).unwrap_err();
        assert!(e.to_string().contains("bytes of scratch"), "{e}");
    }

    #[test]
    fn the_plan_serializes_to_json() {
        let p = plan_of(Base::GatedDeltaNet, true, T16K, Tf32, F32);
        let j = serde_json::to_value(&p).unwrap();
        assert_eq!(j["path"], "delta");
        assert_eq!(j["lifted"], true);
        assert_eq!(j["storage"], serde_json::json!({"real": "f32"}));
        assert_eq!(j["state_pass"], serde_json::json!({"transition": {"stages": 3}}));
        assert_eq!(j["launches"][2]["function"], "llc_lift_h_tc_f32");
        assert_eq!(j["launches"][2]["source"], "loglinear_state_pass");
        assert_eq!(j["launches"][2]["defines"], serde_json::json!(["LLC_DK=64", "LLC_DV=64"]));
        assert_eq!(j["launches"][2]["stages"], 3);
        assert_eq!(j["launches"][1]["step"], "lift_maps");
        assert_eq!(j["shape"]["t"], 16384);
        let m = plan_of(Base::Mamba2, true, T16K, Tf32, F32);
        assert_eq!(
            serde_json::to_value(&m).unwrap()["launches"][1]["step"],
            serde_json::json!({"tree": {"level": 1}})
        );
    }
}
