//! # mixer-core
//!
//! Math and contracts of the `mixers` library, free of backend code: the error and tolerance
//! types, input specifications, the materialization `Y = (I − B)⁻¹ A X` and its dense `f64`
//! oracle, offset patterns and cache-efficient lattices (docs/math.md §1.1), Fenwick levels
//! (§2.2), structural metrics (§1.4), and the [`Mixer`]/[`Decoder`] contracts.

pub mod error;
pub mod fenwick;
pub mod form;
pub mod grad;
pub mod materialize;
pub mod memory;
pub mod metrics;
pub mod mixer;
pub mod mixers;
pub mod oracle;
pub mod parallel;
pub mod pattern;
pub mod precision;
pub mod real;
pub mod spec;
pub mod state;
pub mod tensor;
pub mod tolerance;

pub use error::{Error, Result};
pub use form::Form;
pub use grad::{Requires, grad_name};
pub use materialize::{Block, Materialization, Offset, Term};
pub use mixer::{Decoder, Mixer};
pub use precision::Precision;
pub use real::Real;
pub use spec::{Bound, Constraint, Dim, Dims, DimsExt, Gen, InputDecl, InputSpec};
pub use tensor::{AnyTensors, DType, Tensor, Tensors};
pub use tolerance::{Comparison, Tolerance};

pub use ndarray;
pub use serde_json;
