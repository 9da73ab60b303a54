//! # mixer-cpu
//!
//! The CPU backend: every builtin family's forms, with ndarray, faer (matmul, triangular
//! solve), realfft/rustfft (FFT) and rayon (parallel over batch × heads/channels). One folder
//! per family; each implements [`Family`](mixer_registry::Family) and registers a
//! [`FamilyEntry`](mixer_registry::FamilyEntry) for backend `cpu`.

pub mod attention;
pub mod glr;
pub mod loglinear;
pub mod toeplitz;
pub mod vmath;

use mixer_core::mixer::Mixer;
use mixer_core::{Error, Form, Result};
use mixer_registry::{Availability, BackendEntry, register};

/// The refusal shared by the backward passes that exist in the `fast` form only (the registry
/// already dispatches only the forms an entry lists; this guards direct calls).
pub(crate) fn fast_backward_only(m: &dyn Mixer, form: Form) -> Result<()> {
    if form == Form::Fast {
        return Ok(());
    }
    Err(Error::FormUnavailable {
        mixer: m.name().into(),
        form: format!("{form} (backward)"),
        backend: "cpu".into(),
        available: "materialized, fast".into(),
    })
}

fn probe() -> Availability {
    let threads = rayon::current_num_threads();
    Availability::Available(format!("{threads} threads"))
}

#[register]
static CPU: BackendEntry = BackendEntry {
    name: "cpu",
    doc: "CPU: ndarray + faer + realfft, parallel with rayon",
    priority: 0,
    probe,
};
