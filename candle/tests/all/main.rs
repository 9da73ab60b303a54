//! The tests of `mixers-candle`: one binary (docs/design.md, conventions).

mod common;
#[cfg(feature = "cuda")]
mod cuda;
mod errors;
mod example;
mod forward;
mod grads;
mod readme;
