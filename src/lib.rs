//! # mixers
//!
//! Causal token mixers — attention, generalized linear recurrences with sparse multi-hop
//! patterns, Mamba-2, gated DeltaNet, their log-linear (Fenwick) lifts, Toeplitz/FFT mixers —
//! as one checked, pluggable library on CPU and CUDA, chosen at run time.
//!
//! Every mixer is `Y = (I − B)⁻¹ A X`; each can materialize `(A, B)`, and a dense `f64` oracle
//! checks every fast form, backend and plugin. See `MATH.md` for the math and input names.
//!
//! ```no_run
//! use mixers::prelude::*;
//! let m = mixers::registry::mixer("glr", &serde_json::json!({"pattern": "pow2"})).unwrap();
//! let backend = Backend::auto().unwrap();
//! let sizes = Sizes { seq: 100, ..Sizes::default() };
//! let inputs = m.random_inputs(&sizes.dims(), 0).unwrap();
//! let y = mixers::registry::run::run(m.as_ref(), backend.name(), Form::Fast, &AnyTensors::F64(inputs)).unwrap();
//! ```

pub mod cli;
pub mod io;
pub mod timing;

// The builtin backends register themselves at link time; referencing the crates keeps the
// linker from dropping them.
pub use mixer_core as core;
pub use mixer_cpu as cpu;
pub use mixer_cuda as cuda;
pub use mixer_registry as registry;
pub use mixer_registry::register;

/// The names most programs need.
pub mod prelude {
    pub use mixer_core::mixer::{Decoder, Mixer};
    pub use mixer_core::{AnyTensors, DType, Error, Form, Requires, Result, Tensor, Tensors, Tolerance};
    pub use mixer_registry::harness::{CheckRow, Sizes};
    pub use mixer_registry::{Backend, register};
}
