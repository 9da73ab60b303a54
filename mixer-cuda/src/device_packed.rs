//! Packed variable-length batches on device tensors (`cu_seqlens`, docs/math.md §7.2):
//! [`run_device_packed`] and [`backward_device_packed`] of the `fast` form, for mixers whose
//! inputs are all per token: without states for any such mixer with a device `fast` form
//! (attention included), with states for those whose `fast` form runs from a state on device
//! tensors (linear attention, Mamba-2, gated DeltaNet; the registry decides, as for
//! [`crate::run_device_from_state`]).
//!
//! Linear attention and Mamba-2 (f32 or bf16 activations, every mode) and gated DeltaNet (its
//! register state passes) run the whole batch in one launch sequence over a chunk table whose chunking restarts at every sequence start
//! (`crate::loglinear::packed`), bit for bit the sequences run one by one. Every other mixer and
//! mode runs sequence by sequence:
//!
//! Every sequence runs as a sequence of its own: its rows of the packed buffer are zero-copy
//! views (`B = 1`, so sequence `i`'s tokens `cu_seqlens[i] .. cu_seqlens[i + 1]` are one
//! contiguous block of every per-token input), run by the device form from row `i` of the initial
//! state (zeros without one) in the mode asked, and its output is copied into the packed `y`
//! (zeros past the last offset); final states come back one row per sequence. So a packed batch
//! equals the sequences run one by one on the device, bit for bit, as the host-array path
//! (`mixer_registry::packed`) does; nothing goes through the host. The cost is one run per
//! sequence (its launches and host-side work), not one run over the whole buffer.
//!
//! The backward runs each sequence's backward (from its state, or the plain backward in the mode
//! without states) on the same views and writes the gradients at the sequence's rows (zero past
//! the last offset). An empty sequence passes its initial state through unchanged, and its
//! cotangent back.

use std::ops::Range;
use std::sync::Arc;

use mixer_core::mixer::Mixer;
use mixer_core::state::check_cu_seqlens;
use mixer_core::{Error, Form, Precision, Requires, Result};

use crate::device_state::{
    Cotangents, backward_device_from_state_with, run_device_from_state_with, run_packed,
};
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu};
use crate::tensor::{AnyDeviceTensor, Deferred, DeviceScalar, DeviceTensor, DeviceTensors, bf16};

const WHAT: &str = "packed";

/// `y` of `m`'s `fast` form over the packed batch `cu_seqlens` (`B = 1`) on device tensors, in
/// mode `precision`, every sequence from its row of `initial` (one row per sequence; `None`:
/// zeros); with `initial` or `want_final`, also the final states (one row per sequence). Returns
/// without waiting for the device; the results carry the deferred value checks of every
/// sequence's run (none when `checks` is false).
pub fn run_device_packed(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    cu_seqlens: &[usize],
    initial: Option<&DeviceTensors>,
    want_final: bool,
    precision: Precision,
    checks: bool,
) -> Result<(AnyDeviceTensor, Option<DeviceTensors>)> {
    let (ranges, t_len) = layout(m, inputs, cu_seqlens)?;
    if let Some(s) = initial {
        rows_of("initial_state", s, ranges.len())?;
    }
    if let Some(out) = run_packed(m, inputs, cu_seqlens, initial, want_final, precision, checks)? {
        return Ok(out);
    }
    let stateful = initial.is_some() || want_final;
    let mut ys = Vec::with_capacity(ranges.len());
    let mut finals = Vec::with_capacity(ranges.len());
    for (i, r) in ranges.iter().enumerate() {
        let row = initial.map(|s| row_of(s, i)).transpose()?;
        if r.is_empty() {
            finals.push(row);
            continue;
        }
        let seg = segment(inputs, r.clone())?;
        if !stateful {
            ys.push((r.start, crate::device_run::run_device_with(m, Form::Fast, &seg, precision, checks)?));
            continue;
        }
        let (y, fin) = run_device_from_state_with(m, &seg, row.as_ref(), precision, checks)?;
        ys.push((r.start, y));
        finals.push(Some(fin));
    }
    let mixed = inputs.get(m.spec().mixed).ok_or_else(|| missing(m.spec().mixed))?;
    let y_dtype = if precision == Precision::Bf16 { "bf16" } else { mixed.dtype() };
    let mut y_shape = mixed.shape().to_vec();
    if let Some((_, y0)) = ys.first() {
        y_shape[2..].copy_from_slice(&y0.shape()[2..]);
    }
    let y = assemble(&ys, &y_shape, y_dtype, t_len)?;
    if !stateful {
        return Ok((y, None));
    }
    Ok((y, Some(stack(m, inputs, finals)?)))
}

/// The backward of [`run_device_packed`]: the gradients `d_<input>` of the inputs `requires`
/// asks for (shapes of the inputs, zero past the last offset) and, with `initial`, its gradient
/// (one row per sequence), from `dy` (the shape of `y`) and `d_final` (one row per sequence;
/// `None`: zero). Without `initial` and `d_final` every sequence runs the plain backward in
/// `precision`; with either, the backward from its state (computed in the exact mode). Returns
/// without waiting for the device.
#[allow(clippy::too_many_arguments)]
pub fn backward_device_packed(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    cu_seqlens: &[usize],
    initial: Option<&DeviceTensors>,
    dy: &AnyDeviceTensor,
    d_final: Option<&DeviceTensors>,
    requires: &Requires,
    precision: Precision,
    checks: bool,
) -> Result<(DeviceTensors, DeviceTensors)> {
    let (ranges, t_len) = layout(m, inputs, cu_seqlens)?;
    let mixed = inputs.get(m.spec().mixed).ok_or_else(|| missing(m.spec().mixed))?;
    if dy.shape().len() != mixed.shape().len() || dy.shape()[..2] != mixed.shape()[..2] {
        return Err(Error::shape(
            "dy",
            format!("[1, {t_len}, …] (the shape of y)"),
            format!("{:?}", dy.shape()),
        ));
    }
    for (what, s) in [("initial_state", initial), ("d_final_state", d_final)] {
        if let Some(s) = s {
            rows_of(what, s, ranges.len())?;
        }
    }
    let stateful = initial.is_some() || d_final.is_some();
    let mut grads: Vec<(usize, DeviceTensors)> = Vec::new();
    let mut d_init = Vec::with_capacity(ranges.len());
    for (i, r) in ranges.iter().enumerate() {
        let s0 = initial.map(|s| row_of(s, i)).transpose()?;
        let df = d_final.map(|s| row_of(s, i)).transpose()?;
        if r.is_empty() {
            d_init.push(df);
            continue;
        }
        let seg = segment(inputs, r.clone())?;
        let dyi = rows(dy, r.clone())?;
        if stateful {
            let c = Cotangents { dy: &dyi, d_final: df.as_ref(), requires };
            let (g, ds) = backward_device_from_state_with(m, &seg, s0.as_ref(), c, precision, checks)?;
            grads.push((r.start, g));
            d_init.push(Some(ds));
        } else {
            grads.push((
                r.start,
                crate::device_run::backward_device_with(m, &seg, &dyi, requires, precision, checks)?,
            ));
        }
    }
    // Every gradient a sequence returned, assembled at its rows; inputs no sequence ran give
    // what the registry's checks would: the names `requires` asks for, zero everywhere.
    let names: Vec<String> = match grads.first() {
        Some((_, g)) => g.keys().cloned().collect(),
        None => inputs.keys().filter(|k| requires.wants(k)).map(|k| format!("d_{k}")).collect(),
    };
    let mut out = DeviceTensors::new();
    for name in names {
        let x = inputs.get(name.trim_start_matches("d_")).ok_or_else(|| missing(&name))?;
        let parts: Vec<(usize, AnyDeviceTensor)> = grads
            .iter()
            .map(|(at, g)| g.get(&name).cloned().map(|t| (*at, t)).ok_or_else(|| missing(&name)))
            .collect::<Result<_>>()?;
        let dtype = parts.first().map_or(grad_dtype(x.dtype(), precision), |(_, t)| t.dtype());
        out.insert(name, assemble(&parts, x.shape(), dtype, t_len)?);
    }
    let d_initial = match initial {
        Some(_) => stack(m, inputs, d_init)?,
        None => DeviceTensors::new(),
    };
    Ok((out, d_initial))
}

/// The sequences' row ranges and `T`, after checking the offsets and that every input is a
/// per-token `[1, T, …]` tensor with no other axis tied to `T`.
fn layout(m: &dyn Mixer, inputs: &DeviceTensors, cu_seqlens: &[usize]) -> Result<(Vec<Range<usize>>, usize)> {
    let spec = m.spec();
    let mixed = inputs.get(spec.mixed).ok_or_else(|| missing(spec.mixed))?;
    let (b, t) = match mixed.shape() {
        [b, t, ..] => (*b, *t),
        s => return Err(Error::shape(spec.mixed, "[B, T, …]", format!("{s:?}"))),
    };
    let ranges = check_cu_seqlens(cu_seqlens, b, t)?;
    let per_token = spec.per_token();
    let host_only = |why: String| Error::FormUnavailable {
        mixer: m.name().into(),
        form: format!("fast over a packed batch on device tensors ({why})"),
        backend: "cuda".into(),
        available: "the same call on host arrays only".into(),
    };
    if let Some(k) = inputs.keys().find(|k| !per_token.contains(k)) {
        return Err(host_only(format!("input `{k}` is taken whole, not per token")));
    }
    if !m.length_axes(t).is_empty() {
        return Err(host_only("it has axes tied to T".into()));
    }
    Ok((ranges, t))
}

/// Sequence `r`'s inputs: zero-copy views of rows `r` of every `[1, T, …]` input.
fn segment(inputs: &DeviceTensors, r: Range<usize>) -> Result<DeviceTensors> {
    inputs.iter().map(|(k, v)| Ok((k.clone(), rows(v, r.clone())?))).collect()
}

/// Rows `r` (axis 1) of a `[1, T, …]` tensor, as a `[1, len, …]` view: the batch view of the
/// `[T, …]` reshape.
fn rows(t: &AnyDeviceTensor, r: Range<usize>) -> Result<AnyDeviceTensor> {
    let s = t.shape();
    if s.len() < 2 || s[0] != 1 {
        return Err(Error::shape("packed input", "[1, T, …]", format!("{s:?}")));
    }
    let mut shape = s.to_vec();
    shape[1] = r.end - r.start;
    t.reshape(&s[1..])?.batch(r)?.reshape(&shape)
}

/// Checks that every tensor of a per-sequence state has `n` rows (axis 0).
fn rows_of(what: &str, s: &DeviceTensors, n: usize) -> Result<()> {
    match s.iter().find(|(_, t)| t.shape().first() != Some(&n)) {
        Some((k, t)) => Err(Error::shape(
            format!("{what}.{k}"),
            format!("one row per sequence ({n} rows on axis 0)"),
            format!("{:?}", t.shape()),
        )),
        None => Ok(()),
    }
}

/// Row `i` of a per-sequence state, as a state of one row (zero-copy).
fn row_of(s: &DeviceTensors, i: usize) -> Result<DeviceTensors> {
    s.iter().map(|(k, v)| Ok((k.clone(), v.batch(i..i + 1)?))).collect()
}

/// The per-sequence states stacked (one row each); an empty sequence without a given row gets
/// the zero state of one row (the shapes of `m`'s state for these inputs).
fn stack(m: &dyn Mixer, inputs: &DeviceTensors, rows: Vec<Option<DeviceTensors>>) -> Result<DeviceTensors> {
    let shapes: mixer_core::state::StateShapes = {
        let sizes = inputs.iter().map(|(k, v)| (k.clone(), v.shape().to_vec())).collect();
        let dims = m.spec().bind(&sizes)?;
        mixer_registry::state::shapes(m, &dims, None)?
    };
    let mixed = inputs.get(m.spec().mixed).ok_or_else(|| missing(m.spec().mixed))?;
    let dtype = if mixed.dtype() == "f64" { "f64" } else { "f32" };
    let n = rows.len();
    let mut out = DeviceTensors::new();
    for (name, one) in shapes {
        let per: usize = one[1..].iter().product();
        let parts: Vec<(usize, AnyDeviceTensor)> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().map(|r| (i, r)))
            .map(|(i, r)| r.get(&name).cloned().map(|t| (i, t)).ok_or_else(|| missing(&name)))
            .collect::<Result<_>>()?;
        let mut shape = one.clone();
        shape[0] = n;
        // Rows of `per` entries: place them as the "tokens" of a [1, n, per] buffer.
        let flat: Vec<(usize, AnyDeviceTensor)> =
            parts.into_iter().map(|(i, t)| Ok((i, t.reshape(&[1, 1, per])?))).collect::<Result<_>>()?;
        out.insert(name, assemble(&flat, &[1, n, per], dtype, n)?.reshape(&shape)?);
    }
    Ok(out)
}

/// A gradient's dtype where no sequence gave one: f32 in the tf32 and bf16 modes, else the
/// input's.
fn grad_dtype(input: &'static str, p: Precision) -> &'static str {
    if p == Precision::Exact && input == "f64" { "f64" } else { "f32" }
}

/// A `[1, T, …]` tensor of `dtype` (`shape`, `T = t_len`) that is zero except where `parts`
/// (`(first row, [1, len, …] tensor)`) put their rows, carrying every part's deferred checks.
fn assemble(
    parts: &[(usize, AnyDeviceTensor)],
    shape: &[usize],
    dtype: &str,
    t_len: usize,
) -> Result<AnyDeviceTensor> {
    let per_row: usize = shape[2..].iter().product();
    debug_assert_eq!(shape.get(1), Some(&t_len));
    let checks: Vec<Arc<Deferred>> = parts.iter().flat_map(|(_, t)| t.checks().to_vec()).collect();
    let out = match dtype {
        "f32" => place::<f32>(parts, shape, per_row)?,
        "f64" => place::<f64>(parts, shape, per_row)?,
        "bf16" => place::<bf16>(parts, shape, per_row)?,
        other => return Err(err(WHAT, format!("internal: no packed buffer of {other}"))),
    };
    Ok(out.with_checks(checks))
}

/// [`assemble`] for element type `T` (every part must be `T`).
fn place<T: DeviceScalar>(
    parts: &[(usize, AnyDeviceTensor)],
    shape: &[usize],
    per_row: usize,
) -> Result<AnyDeviceTensor> {
    let n: usize = shape.iter().product();
    let mut buf: Pooled<T> = pool::zeros::<T>(WHAT, n)?;
    let g = gpu()?;
    for (at, t) in parts {
        let x = T::unwrap(t)
            .ok_or_else(|| err(WHAT, format!("internal: a part of {} among others", t.dtype())))?;
        let start = at * per_row;
        if x.is_empty() {
            continue;
        }
        if start + x.len() > n {
            return Err(err(WHAT, "internal: a sequence's rows past the packed buffer"));
        }
        g.stream()
            .memcpy_dtod(&x.view(), &mut buf.slice_mut(start..start + x.len()))
            .map_err(|e| err(WHAT, format!("copy into the packed buffer: {e}")))?;
    }
    Ok(T::wrap(DeviceTensor::from_pooled(buf, shape)?))
}

fn missing(name: &str) -> Error {
    err(WHAT, format!("internal: `{name}` missing"))
}
