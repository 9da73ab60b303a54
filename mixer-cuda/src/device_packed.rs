//! Packed variable-length batches on device tensors (`cu_seqlens`, docs/math.md §7.2):
//! [`run_device_packed`] and [`backward_device_packed`] of the `fast` form: without states for
//! any mixer with a device `fast` form (attention, the GLR and the Toeplitz mixer included), with
//! states for those whose `fast` form runs from a state on device tensors (linear attention,
//! Mamba-2, gated DeltaNet; the registry decides, as for [`crate::run_device_from_state`]).
//!
//! Linear attention and Mamba-2 (f32 or bf16 activations, every mode) and gated DeltaNet (its
//! register state passes) run the whole batch in one launch sequence over a chunk table whose chunking restarts at every sequence start
//! (`crate::loglinear::packed`), bit for bit the sequences run one by one. Every other mixer and
//! mode runs sequence by sequence:
//!
//! Every sequence runs as a sequence of its own, as `mixer_core::state::segment` cuts it on the
//! host: its rows of every per-token input are zero-copy views (`B = 1`, so sequence `i`'s
//! tokens `cu_seqlens[i] .. cu_seqlens[i + 1]` are one contiguous block), inputs without a
//! sequence axis (the Toeplitz taps and bias, λ parameters) are taken whole, and an axis whose
//! size is a function of the length (the GLR's slots, `Mixer::length_axes`) is cut to the
//! sequence's own size by one copy on the device (plain runs only: a run from a state reads the
//! slots of absolute positions). The sequence is run by the device form from row `i` of the
//! initial state (zeros without one) in the mode asked, and its output is copied into the packed
//! `y` (zeros past the last offset); final states come back one row per sequence. So a packed
//! batch equals the sequences run one by one on the device, bit for bit, as the host-array path
//! (`mixer_registry::packed`) does; nothing goes through the host. The cost is one run per
//! sequence (its launches and host-side work), not one run over the whole buffer.
//!
//! The backward runs each sequence's backward (from its state, or the plain backward in the mode
//! without states) on the same inputs and writes the gradients of per-token inputs at the
//! sequence's rows (zero past the last offset, and in the slots a shorter sequence does not
//! have); the gradients of inputs taken whole are summed over the sequences in their order. An
//! empty sequence passes its initial state through unchanged, and its cotangent back.

use std::ops::Range;
use std::sync::Arc;

use mixer_core::mixer::Mixer;
use mixer_core::state::check_cu_seqlens;
use mixer_core::{Error, Form, Precision, Requires, Result};

use crate::device_state::{
    Cotangents, backward_device_from_state_with, run_device_from_state_with, run_packed,
};
use crate::kernels;
use crate::pitched::{copy_rows, slice_axis};
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu, grid1, launch};
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
        let seg = segment(m, inputs, r.clone(), stateful)?;
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
        let seg = segment(m, inputs, r.clone(), stateful)?;
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
    // Every gradient a sequence returned, assembled at its rows (summed for inputs taken whole);
    // inputs no sequence ran give what the registry's checks would: the names `requires` asks
    // for, zero everywhere.
    let per_token = m.spec().per_token();
    let names: Vec<String> = match grads.first() {
        Some((_, g)) => g.keys().cloned().collect(),
        None => inputs.keys().filter(|k| requires.wants(k)).map(|k| format!("d_{k}")).collect(),
    };
    let mut out = DeviceTensors::new();
    for name in names {
        let input = name.trim_start_matches("d_");
        let x = inputs.get(input).ok_or_else(|| missing(&name))?;
        let parts: Vec<(usize, AnyDeviceTensor)> = grads
            .iter()
            .map(|(at, g)| g.get(&name).cloned().map(|t| (*at, t)).ok_or_else(|| missing(&name)))
            .collect::<Result<_>>()?;
        let dtype = parts.first().map_or(grad_dtype(x.dtype(), precision), |(_, t)| t.dtype());
        let g = if per_token.iter().any(|p| p == input) {
            assemble(&parts, x.shape(), dtype, t_len)?
        } else {
            summed(&parts, x.shape(), dtype)?
        };
        out.insert(name, g);
    }
    let d_initial = match initial {
        Some(_) => stack(m, inputs, d_init)?,
        None => DeviceTensors::new(),
    };
    Ok((out, d_initial))
}

/// The sequences' row ranges and `T`, after checking the offsets against the mixed input.
fn layout(m: &dyn Mixer, inputs: &DeviceTensors, cu_seqlens: &[usize]) -> Result<(Vec<Range<usize>>, usize)> {
    let spec = m.spec();
    let mixed = inputs.get(spec.mixed).ok_or_else(|| missing(spec.mixed))?;
    let (b, t) = match mixed.shape() {
        [b, t, ..] => (*b, *t),
        s => return Err(Error::shape(spec.mixed, "[B, T, …]", format!("{s:?}"))),
    };
    Ok((check_cu_seqlens(cu_seqlens, b, t)?, t))
}

/// Sequence `r`'s inputs (as `mixer_core::state::segment`): zero-copy views of rows `r` of every
/// per-token `[1, T, …]` input, every other input whole, and (without states) each length axis
/// cut to its size at the sequence's length by [`leading`].
fn segment(m: &dyn Mixer, inputs: &DeviceTensors, r: Range<usize>, stateful: bool) -> Result<DeviceTensors> {
    let per_token = m.spec().per_token();
    let cuts = if stateful { Vec::new() } else { m.length_axes(r.len()) };
    inputs
        .iter()
        .map(|(k, v)| {
            let mut t = if per_token.contains(k) { rows(v, r.clone())? } else { v.clone() };
            if let Some(&(_, axis, n)) = cuts.iter().find(|c| c.0 == k.as_str())
                && t.shape().get(axis).is_some_and(|&size| size > n)
            {
                t = leading(&t, axis, n)?;
            }
            Ok((k.clone(), t))
        })
        .collect()
}

/// The first `n` entries of axis `axis ≥ 2` of a `[1, len, …]` tensor `t`, as a new contiguous
/// tensor (one copy on the device: [`slice_axis`]), keeping `t`'s deferred checks.
fn leading(t: &AnyDeviceTensor, axis: usize, n: usize) -> Result<AnyDeviceTensor> {
    fn of<T: DeviceScalar>(t: &AnyDeviceTensor, axis: usize, n: usize) -> Result<AnyDeviceTensor> {
        let x = T::unwrap(t).ok_or_else(|| err(WHAT, "internal: a tensor of another type"))?;
        if x.shape().get(axis) == Some(&n) {
            return Ok(t.clone());
        }
        Ok(T::wrap(slice_axis(x, axis, 0..n)?.with_checks(x.checks().iter().cloned())))
    }
    match t.dtype() {
        "f32" => of::<f32>(t, axis, n),
        "f64" => of::<f64>(t, axis, n),
        _ => of::<bf16>(t, axis, n),
    }
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
        if let Some((rows, width, pitch)) = narrower(x.shape(), shape)? {
            copy_rows(&x.view(), width, &mut buf.slice_mut(start.min(n)..), pitch, width, rows)?;
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

/// Where a part `[1, len, …]` is narrower than the buffer `[1, T, …]` on one axis `a ≥ 2` (a
/// sequence's slots): `(rows, width, pitch)` of its placement as runs, `rows = len · Π
/// shape[2..a]` runs of `width = part[a] · Π shape[a+1..]` elements, `pitch = shape[a] · Π
/// shape[a+1..]` apart in the buffer; `None` where it is as wide on every axis.
fn narrower(part: &[usize], shape: &[usize]) -> Result<Option<(usize, usize, usize)>> {
    let bad = || err(WHAT, format!("internal: a part {part:?} of a packed buffer {shape:?}"));
    if part.len() != shape.len() || part.len() < 2 || part[0] != 1 || shape[0] != 1 {
        return Err(bad());
    }
    let wider: Vec<usize> = (2..part.len()).filter(|&a| part[a] != shape[a]).collect();
    match wider[..] {
        [] => Ok(None),
        [a] if part[a] < shape[a] => {
            let inner: usize = shape[a + 1..].iter().product();
            let rows = part[1] * shape[2..a].iter().product::<usize>();
            Ok(Some((rows, part[a] * inner, shape[a] * inner)))
        }
        _ => Err(bad()),
    }
}

/// The sum of `parts` (each of `shape`, in order) as one tensor of `dtype` (`f32` or `f64`;
/// zeros without parts), carrying their deferred checks: the gradient of an input taken whole.
fn summed(parts: &[(usize, AnyDeviceTensor)], shape: &[usize], dtype: &str) -> Result<AnyDeviceTensor> {
    fn of<T: DeviceScalar>(parts: &[(usize, AnyDeviceTensor)], shape: &[usize]) -> Result<AnyDeviceTensor> {
        let n: usize = shape.iter().product();
        let mut buf: Pooled<T> = pool::zeros::<T>(WHAT, n)?;
        let g = gpu()?;
        let f = g.kernel(WHAT, &kernels::TENSOR, &[], &format!("add_into_{}", T::ELEM))?;
        for (_, t) in parts {
            let x = T::unwrap(t).ok_or_else(|| err(WHAT, "internal: a gradient of another type"))?;
            if x.shape() != shape {
                return Err(err(WHAT, format!("internal: a gradient {:?} for {shape:?}", x.shape())));
            }
            let (xv, ni) = (x.view(), n as i64);
            if n > 0 {
                launch!(g, WHAT, f.clone(), grid1(n.min(1 << 20), 256); &xv, &mut *buf, &ni)?;
            }
        }
        Ok(T::wrap(DeviceTensor::from_pooled(buf, shape)?))
    }
    let checks: Vec<Arc<Deferred>> = parts.iter().flat_map(|(_, t)| t.checks().to_vec()).collect();
    let out = match dtype {
        "f32" => of::<f32>(parts, shape)?,
        "f64" => of::<f64>(parts, shape)?,
        other => return Err(err(WHAT, format!("internal: no summed gradient of {other}"))),
    };
    Ok(out.with_checks(checks))
}

fn missing(name: &str) -> Error {
    err(WHAT, format!("internal: `{name}` missing"))
}

#[cfg(test)]
mod tests {
    use ndarray::{ArrayD, IxDyn, s};

    use super::narrower;

    /// What `copy_rows` does on the device, on host slices.
    fn copy_rows(src: &[f64], sp: usize, dst: &mut [f64], dp: usize, width: usize, rows: usize) {
        for r in 0..rows {
            dst[r * dp..r * dp + width].copy_from_slice(&src[r * sp..r * sp + width]);
        }
    }

    /// The runs [`narrower`] gives place a sequence's slots `[1, len, k, c]` at its rows of a
    /// `[1, T, K, c]` buffer exactly where ndarray's slicing puts them, zeros elsewhere; parts
    /// as wide as the buffer take the plain copy; a part wider than the buffer, or narrower on
    /// two axes, is refused.
    #[test]
    fn the_slot_runs_place_a_sequence_where_slicing_does() {
        let (t, kk, c) = (11, 5, 3);
        for (at, len, k) in [(0, 4, 2), (4, 7, 5), (3, 1, 0), (2, 6, 3)] {
            let part =
                ArrayD::from_shape_fn(IxDyn(&[1, len, k, c]), |i| (1 + i[1] * 100 + i[2] * 10 + i[3]) as f64);
            let mut want = ArrayD::<f64>::zeros(IxDyn(&[1, t, kk, c]));
            want.slice_mut(s![.., at..at + len, ..k, ..]).assign(&part);
            let mut got = vec![0.0; t * kk * c];
            match narrower(part.shape(), &[1, t, kk, c]).unwrap() {
                Some((rows, width, pitch)) => {
                    assert_eq!((rows, width, pitch), (len, k * c, kk * c));
                    let start = at * kk * c;
                    copy_rows(part.as_slice().unwrap(), width, &mut got[start..], pitch, width, rows);
                }
                None => {
                    assert_eq!(k, kk);
                    let start = at * kk * c;
                    got[start..start + part.len()].copy_from_slice(part.as_slice().unwrap());
                }
            }
            assert_eq!(got, want.into_raw_vec_and_offset().0, "at {at}, len {len}, k {k}");
        }
        // An axis past the slots (`[1, T, 4, K, 2]`, the slots at axis 3).
        assert_eq!(narrower(&[1, 3, 4, 2, 2], &[1, 9, 4, 5, 2]).unwrap(), Some((12, 4, 10)));
        assert!(narrower(&[1, 3, 6, 2], &[1, 9, 5, 2]).is_err(), "wider than the buffer");
        assert!(narrower(&[1, 3, 4, 1], &[1, 9, 5, 2]).is_err(), "narrower on two axes");
        assert!(narrower(&[1, 3, 4], &[1, 9, 5, 2]).is_err(), "another rank");
        assert!(narrower(&[2, 3, 4, 2], &[2, 9, 5, 2]).is_err(), "more than one batch row");
    }
}
