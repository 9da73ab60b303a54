//! # mixer-cpu
//!
//! The CPU backend: every builtin family's forms, with ndarray, faer (matmul, triangular
//! solve), realfft/rustfft (FFT) and rayon (parallel over batch × heads/channels). One folder
//! per family; each implements [`Family`](mixer_registry::Family) (forward forms, decoder and
//! the `fast` backward) and registers a [`FamilyEntry`](mixer_registry::FamilyEntry) for
//! backend `cpu`.

pub mod attention;
pub mod flush;
pub mod glr;
pub mod loglinear;
pub mod toeplitz;
pub mod vmath;

use mixer_registry::{Availability, BackendEntry, register};

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
    timer: None,
    concurrent: true,
};
