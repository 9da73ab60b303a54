//! # mixers-candle
//!
//! The mixers of the `mixers` library as [candle](https://docs.rs/candle-core) ops with
//! autograd (docs/candle.md).
//!
//! Every mixer computes `y = (I − B)⁻¹ A x` for its structured `(A, B)` (docs/math.md); here
//! each call is one candle custom op ([`candle_core::CustomOp1`]) whose forward is the
//! library's CPU forward and whose backward is the library's CPU backward (the vector–Jacobian
//! product `x̄ = Aᵀ (I − B)⁻ᵀ ȳ` and the gradients of the inputs that build `A` and `B`).
//!
//! candle's custom ops take at most three tensors and return one, and a mixer has up to six
//! inputs plus an initial state, and a final state besides `y`. So each op works on packed
//! buffers ([`Packing`]): the inputs (then the initial state) are flattened and concatenated
//! with candle's `cat`, the op returns `y` (then the final state) flattened end to end, and
//! `narrow` + `reshape` cut the result apart. candle differentiates `cat`, `narrow` and
//! `reshape` itself, so the op's backward sees the packed cotangent `[ȳ | S̄_T]` and returns
//! `[x̄_1 … x̄_n | S̄_0]`. A run that returns a final state is its own op (`mixers::NAME+state`),
//! whose backward takes the state's cotangent.
//!
//! - [`ops`]: typed functions (`attention`, `linear_attention`, `mamba2`, `gated_deltanet`,
//!   the `loglinear_*` lifts, and `*_state` runs from and to a state);
//! - [`run`] and [`run_state`]: any registered mixer by name and JSON config (the GLR, the
//!   Toeplitz mixer, plugins).
//!
//! The README's example is `examples/quickstart.rs`, run as a doc-test of this crate (a test
//! keeps the README's block equal to it); `examples/gated_deltanet_layer.rs` is an fla-style
//! gated DeltaNet layer that trains.

mod call;
#[cfg(feature = "cuda")]
mod cuda;
mod error;
mod op;
pub mod ops;
mod packing;

pub use call::{Named, run, run_state};
pub use error::Error;
pub use mixer_core::Form;
pub use mixers::ops::{Options, Precision};
pub use packing::Packing;

/// The README's candle block, which is `examples/quickstart.rs` verbatim, run as a doc-test.
#[cfg(doctest)]
#[doc = concat!("```rust\n", include_str!("../examples/quickstart.rs"), "```")]
pub struct ReadmeExample;
