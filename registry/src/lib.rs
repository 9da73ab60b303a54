//! # mixer-registry
//!
//! Link-time registries of the `mixers` library. A plugin crate registers an offset pattern,
//! a level mask, a λ scheme, a mixer, a backend or a backend's kernels with one attribute,
//! [`register`], on a `static` of the matching entry type:
//!
//! ```ignore
//! use mixer_registry::{register, PatternEntry};
//! fn fib(k: usize) -> u64 { /* 1, 2, 3, 5, 8, … */ }
//! #[register]
//! static FIB: PatternEntry = PatternEntry { name: "fibonacci", doc: "Fibonacci offsets", offset: fib, cuda: None };
//! ```
//!
//! The linker drops crates nothing references: a binary that relies on a plugin must
//! mention it, e.g. `use my_plugin as _;`.
//!
//! Also here: lookup by name with "did you mean" errors ([`lookup`]), run-time backend
//! selection ([`Backend::auto`]), running a form with validation ([`run::run`]), its gradient
//! ([`backward::backward`]) and the cross-check harness ([`harness::check`]).

pub mod backend;
pub mod backward;
mod builtins;
pub mod entries;
pub mod grad_check;
pub mod harness;
pub mod lookup;
pub mod run;

#[doc(hidden)]
pub use linkme as __linkme;
pub use mixer_core;
pub use mixer_registry_macros::register;

pub use backend::{Backend, backends_status};
pub use entries::*;
pub use grad_check::{GradRow, check_grad};
pub use harness::{CheckRow, Sizes, check};
pub use lookup::{
    backend_entry, backward_entry, duplicates, kernel, lambda_grad, lambda_scheme, mask, mixer, mixer_entry,
    pattern,
};

/// Offset patterns.
#[linkme::distributed_slice]
pub static PATTERNS: [PatternEntry];
/// Level masks.
#[linkme::distributed_slice]
pub static MASKS: [MaskEntry];
/// λ schemes.
#[linkme::distributed_slice]
pub static LAMBDAS: [LambdaEntry];
/// Mixers.
#[linkme::distributed_slice]
pub static MIXERS: [MixerEntry];
/// Backends.
#[linkme::distributed_slice]
pub static BACKENDS: [BackendEntry];
/// Backends' kernels.
#[linkme::distributed_slice]
pub static KERNELS: [KernelEntry];
/// Backends' backward passes (vector–Jacobian products).
#[linkme::distributed_slice]
pub static BACKWARDS: [BackwardEntry];
/// Derivatives of λ schemes.
#[linkme::distributed_slice]
pub static LAMBDA_GRADS: [LambdaGradEntry];

#[cfg(test)]
mod tests {
    #[test]
    fn builtins_are_registered_once() {
        assert!(super::duplicates().is_empty(), "{:?}", super::duplicates());
        for p in ["pow2", "sq1", "linear"] {
            super::pattern(p).unwrap();
        }
        super::mask("fenwick").unwrap();
        for l in ["identity", "ones", "softplus"] {
            super::lambda_scheme(l).unwrap();
        }
    }

    #[test]
    fn unknown_names_suggest_near_ones() {
        let e = super::pattern("pow").unwrap_err().to_string();
        assert!(e.contains("did you mean `pow2`"), "{e}");
    }
}
