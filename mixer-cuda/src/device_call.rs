//! One entry point per direction for a call on device tensors with the typed API's options
//! (`mixers::ops::Options`): a form, a precision mode, an initial state, the final state wanted
//! or not, a packed batch's offsets. It chooses among [`crate::run_device_with`] (plain),
//! [`crate::device_state`] (from and to a state) and [`crate::device_packed`] (a packed
//! batch), as `mixer_registry::call` does for host arrays; the Python package's zero-copy path
//! and the candle ops' CUDA path call it.
//!
//! A run from a state and a packed batch exist in the `fast` form only: asking them of another
//! form is a `FormUnavailable` error (the callers then take the host path or report it).

use mixer_core::mixer::Mixer;
use mixer_core::{Error, Form, Precision, Result};

use crate::device_packed::{backward_device_packed, run_device_packed};
use crate::device_run::{backward_device_with, run_device_saving, run_device_with};
use crate::device_state::{Cotangents, backward_device_from_state_with, run_device_from_state_with};
use crate::tensor::{AnyDeviceTensor, DeviceTensors};

/// How a call runs: the options a forward and its backward share.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// The form of the forward (the backward is always the `fast` form's).
    pub form: Form,
    /// The precision mode.
    pub precision: Precision,
    /// The initial state (one row per sequence for a packed batch); `None`: zeros.
    pub initial: Option<&'a DeviceTensors>,
    /// The offsets of a packed batch (`B = 1`), or `None` for a batch of whole sequences.
    pub cu_seqlens: Option<&'a [usize]>,
    /// Whether the device-side value checks of the inputs and of the results run (they are
    /// reported when a result is read).
    pub checks: bool,
}

/// `Ok` for the `fast` form; `what` (a run from a state, a packed batch) exists in no other.
fn fast_only(m: &dyn Mixer, form: Form, what: &str) -> Result<()> {
    if form == Form::Fast {
        return Ok(());
    }
    Err(Error::FormUnavailable {
        mixer: m.name().into(),
        form: format!("{} ({what} on device tensors)", form.name()),
        backend: "cuda".into(),
        available: "fast".into(),
    })
}

/// `y` of `m` on device tensors and, with `want_final`, the final state (one row per sequence
/// for a packed batch). Returns without waiting for the device.
pub fn forward(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    call: &Call<'_>,
    want_final: bool,
) -> Result<(AnyDeviceTensor, Option<DeviceTensors>)> {
    if let Some(cu) = call.cu_seqlens {
        fast_only(m, call.form, "a packed batch")?;
        let (y, fin) =
            run_device_packed(m, inputs, cu, call.initial, want_final, call.precision, call.checks)?;
        return Ok((y, fin.filter(|_| want_final)));
    }
    if call.initial.is_none() && !want_final {
        return Ok((run_device_with(m, call.form, inputs, call.precision, call.checks)?, None));
    }
    fast_only(m, call.form, "a run from a state")?;
    let (y, fin) = run_device_from_state_with(m, inputs, call.initial, call.precision, call.checks)?;
    Ok((y, want_final.then_some(fin)))
}

/// [`forward`] run for a backward (no final state): `y` and what the backward may read instead of
/// running the forward again ([`crate::run_device_saving`]; `None` where the family saves
/// nothing, and for a run from a state or a packed batch, whose backwards read nothing). Give
/// both to [`backward`] as `y` and `y_stats` (`mixer_core::grad::{SAVED_OUTPUT,
/// SAVED_STATISTICS}`).
pub fn forward_saving(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    call: &Call<'_>,
) -> Result<(AnyDeviceTensor, Option<AnyDeviceTensor>)> {
    if call.form == Form::Fast && call.initial.is_none() && call.cu_seqlens.is_none() {
        return run_device_saving(m, inputs, call.precision, call.checks);
    }
    Ok((forward(m, inputs, call, false)?.0, None))
}

/// The backward of [`forward`] (the `fast` form's): the gradients `d_<input>` of the inputs
/// `c.requires` asks for and, with an initial state, its gradient (keyed as the state's tensors;
/// empty without one). Without a state and a final state's cotangent the backward runs in the
/// call's mode; with either, the backward from the state (in the exact mode on the values as the
/// mode stores them). Returns without waiting for the device.
pub fn backward(
    m: &dyn Mixer,
    inputs: &DeviceTensors,
    call: &Call<'_>,
    c: Cotangents<'_>,
) -> Result<(DeviceTensors, DeviceTensors)> {
    let Call { precision, initial, checks, .. } = *call;
    if let Some(cu) = call.cu_seqlens {
        return backward_device_packed(
            m, inputs, cu, initial, c.dy, c.d_final, c.requires, precision, checks,
        );
    }
    if initial.is_none() && c.d_final.is_none() {
        let g = backward_device_with(m, inputs, c.dy, c.requires, precision, checks)?;
        return Ok((g, DeviceTensors::new()));
    }
    backward_device_from_state_with(m, inputs, initial, c, precision, checks)
}
