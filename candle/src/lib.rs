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
//! ```
//! use candle_core::{DType, Device, Tensor, Var};
//! use mixers_candle::{Options, ops};
//!
//! let dev = Device::Cpu;
//! let (b, t, h, dk, dv) = (1, 10, 2, 4, 3);
//! let q = Var::from_tensor(&Tensor::randn(0f32, 1., (b, t, h, dk), &dev)?)?;
//! let k = Tensor::randn(0f32, 1., (b, t, h, dk), &dev)?;
//! let k = k.broadcast_div(&k.sqr()?.sum_keepdim(3)?.sqrt()?)?; // unit keys
//! let v = Tensor::randn(0f32, 1., (b, t, h, dv), &dev)?;
//! let g = (Tensor::rand(0f32, 1., (b, t, h), &dev)? * -0.1)?;   // log decay ≤ 0
//! let beta = Tensor::rand(0f32, 1., (b, t, h), &dev)?;          // in [0, 1]
//!
//! let y = ops::gated_deltanet(&q, &k, &v, &g, &beta, &Options::default())?;
//! let grads = y.sqr()?.sum_all()?.backward()?;
//! assert_eq!(grads.get(&q).unwrap().dims(), &[b, t, h, dk]);
//! # Ok::<(), candle_core::Error>(())
//! ```

mod call;
mod error;
mod op;
pub mod ops;
mod packing;

pub use call::{Named, run, run_state};
pub use error::Error;
pub use mixer_core::Form;
pub use mixers::ops::{Options, Precision};
pub use packing::Packing;
