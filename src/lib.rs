//! # mixers
//!
//! Causal token mixers — attention, generalized linear recurrences with sparse multi-hop
//! patterns, Mamba-2, gated DeltaNet, their log-linear (Fenwick) lifts, Toeplitz/FFT mixers —
//! as one checked, pluggable library on CPU and CUDA, chosen at run time.
//!
//! Every mixer is `Y = (I − B)⁻¹ A X`; each can materialize `(A, B)`, and a dense `f64` oracle
//! checks every fast form, backend and plugin. The math, every input's name and shape and every
//! config field: `docs/math.md` in the repository.
//!
//! In model code, call a mixer through [`ops`]: one typed function per builtin mixer
//! (`ops::mamba2(q, k, v, g, &opts)`, …) and a typed decoder for token-by-token use. The
//! dynamic API below (a mixer by name with a JSON config) serves the command line and plugins.
//!
//! This crate is the library only. The `mixers` command line is the crate `mixers-cli`
//! (folder `cli/`) and training small models the crate `mixers-train` (folder `train/`); both
//! depend on this one, never the other way round.
//!
//! ```no_run
//! use mixers::prelude::*;
//! let m = mixers::registry::mixer("glr", &serde_json::json!({"pattern": "pow2"})).unwrap();
//! let backend = Backend::auto().unwrap();
//! let sizes = Sizes { seq: 100, ..Sizes::default() };
//! let inputs = m.random_inputs(&sizes.dims(), 0).unwrap();
//! let y = mixers::registry::run::run(m.as_ref(), &backend, Form::Fast, &AnyTensors::F64(inputs)).unwrap();
//! ```

/// The README's code blocks, compiled and run by `cargo test --doc` (not shown in the docs).
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod alloc;
pub mod context_parallel;
pub mod io;
pub mod ops;
pub mod timing;

// The builtin backends register themselves at link time; referencing the crates keeps the
// linker from dropping them.
/// Math and contracts: errors, input specs, materialization and the `f64` oracle, offset
/// patterns, Fenwick levels, structural metrics, the builtin mixer definitions (crate
/// `mixer-core`).
#[doc(inline)]
pub use mixer_core as core;
/// The CPU backend: every family's forms (crate `mixer-cpu`).
#[doc(inline)]
pub use mixer_cpu as cpu;
/// The CUDA backend, chosen at run time (crate `mixer-cuda`).
#[doc(inline)]
pub use mixer_cuda as cuda;
/// Link-time registries, `#[register]`, lookup, backend selection, running forms and the
/// cross-check harness (crate `mixer-registry`).
#[doc(inline)]
pub use mixer_registry as registry;
#[doc(inline)]
pub use mixer_registry::register;
/// The `ndarray` version the library's arrays come from (use it to avoid a version mismatch).
pub use ndarray;

/// The names most programs need.
pub mod prelude {
    pub use mixer_core::mixer::{Decoder, Mixer};
    pub use mixer_core::{AnyTensors, DType, Error, Form, Requires, Result, Tensor, Tensors, Tolerance};
    pub use mixer_registry::harness::{CheckRow, Sizes};
    pub use mixer_registry::{Backend, register};
}
