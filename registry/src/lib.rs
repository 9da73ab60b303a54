//! # mixer-registry
//!
//! Link-time registries of the `mixers` library. A plugin crate registers an offset pattern,
//! a level mask, a λ scheme, a mixer, a backend or a backend's implementation of a mixer family
//! ([`FamilyEntry`], the backend contract of [`family`]) with one attribute, [`register`], on a
//! `static` of the matching entry type:
//!
//! ```ignore
//! use mixer_registry::{register, PatternEntry};
//! fn fib(k: usize) -> u64 { /* 1, 2, 3, 5, 8, … */ }
//! #[register]
//! static FIB: PatternEntry = PatternEntry { name: "fibonacci", doc: "Fibonacci offsets", offset: fib };
//! ```
//!
//! The linker drops crates nothing references: a binary that relies on a plugin must
//! mention it, e.g. `use my_plugin as _;`.
//!
//! Also here: lookup by name with "did you mean" errors ([`lookup`]), run-time backend
//! selection ([`Backend::auto`]), running a form with validation ([`run::run`]), its gradient
//! ([`backward::backward`]), one call with a state or a packed batch ([`call`]), the
//! cross-check harness ([`harness::check`]) and the backend test suite every registered
//! backend and mixer gets ([`suite`]).

pub mod backend;
pub mod backward;
mod builtins;
pub mod call;
pub mod device;
pub mod entries;
pub mod family;
pub mod grad_check;
pub mod harness;
pub mod lookup;
pub mod packed;
pub mod run;
pub mod state;
pub mod suite;
mod suite_state;

#[doc(hidden)]
pub use linkme as __linkme;
pub use mixer_core;
pub use mixer_registry_macros::register;

pub use backend::{Backend, backends_status};
pub use device::{
    DeviceForms, DeviceTimer, DeviceTiming, backward_device, backward_device_from_state, decoder_device,
    device_available, device_forms, device_plan, device_saves, run_device, run_device_from_state,
    run_device_saving,
};
pub use entries::*;
pub use family::{
    BackwardFn, DecoderFn, DynFamily, Family, FormFn, PackedBackwardFn, PackedFn, PreciseBackwardFn,
    PreciseFn, PreciseStateFn, Scalar, StateBackwardFn, StateDecoderFn, StateFn,
};
pub use grad_check::{GradRow, check_grad, check_grad_with};
pub use harness::{CheckRow, Sizes, check, check_with};
pub use lookup::{
    Duplicate, backend_entry, duplicates, family, lambda_grad, lambda_scheme, mask, mixer, mixer_entry,
    origin, pattern, plugin_crates,
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
/// Backends' implementations of mixer families.
#[linkme::distributed_slice]
pub static FAMILIES: [FamilyEntry];
/// Where each entry above was registered (one [`Origin`] per `#[register]`).
#[linkme::distributed_slice]
pub static ORIGINS: [Origin];
/// Derivatives of λ schemes.
#[linkme::distributed_slice]
pub static LAMBDA_GRADS: [LambdaGradEntry];

#[cfg(test)]
mod tests {
    use crate::{LambdaEntry, register};

    fn half(raw: f64, _: f64) -> f64 {
        raw / 2.0
    }

    // The same λ-scheme name registered from two modules: lookups must refuse it.
    mod first {
        #[super::register]
        static TWICE: super::LambdaEntry =
            super::LambdaEntry { name: "test-twice", doc: "first", map: super::half, cuda: None };
    }
    mod second {
        #[super::register]
        static TWICE: super::LambdaEntry =
            super::LambdaEntry { name: "test-twice", doc: "second", map: super::half, cuda: None };
    }

    #[test]
    fn duplicate_names_are_refused_naming_both_modules() {
        let e = super::lambda_scheme("test-twice").unwrap_err();
        assert!(matches!(e, mixer_core::Error::Duplicate { .. }), "{e:?}");
        let msg = e.to_string();
        for needle in [
            "λ scheme `test-twice` is registered 2 times",
            "`mixer_registry::tests::first`",
            "`mixer_registry::tests::second`",
        ] {
            assert!(msg.contains(needle), "`{needle}` not in: {msg}");
        }
        let d = super::duplicates();
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!((d[0].kind, d[0].name.as_str(), d[0].origins.len()), ("λ scheme", "test-twice", 2));
        assert_eq!(d[0].to_string(), msg);
    }

    #[test]
    fn every_entry_knows_its_origin() {
        assert_eq!(
            super::origin(super::pattern("pow2").unwrap()),
            Some("mixer_registry::builtins::patterns")
        );
        assert_eq!(super::origin(super::mask("fenwick").unwrap()), Some("mixer_registry::builtins::masks"));
        assert_eq!(
            super::ORIGINS.len(),
            super::PATTERNS.len()
                + super::MASKS.len()
                + super::LAMBDAS.len()
                + super::MIXERS.len()
                + super::BACKENDS.len()
                + super::FAMILIES.len()
                + super::LAMBDA_GRADS.len()
        );
        // Only the registry itself registers here (its tests count as its own crate).
        assert!(super::plugin_crates().is_empty(), "{:?}", super::plugin_crates());
    }

    #[test]
    fn builtins_are_registered_once() {
        let d = super::duplicates();
        assert!(d.iter().all(|d| d.name == "test-twice"), "{d:?}");
        for p in ["pow2", "sq1", "linear"] {
            super::pattern(p).unwrap();
        }
        super::mask("fenwick").unwrap();
        for l in ["identity", "ones", "softplus"] {
            super::lambda_scheme(l).unwrap();
        }
    }

    #[test]
    fn unknown_names_suggest_near_ones_and_the_link_rule() {
        let e = super::pattern("pow").unwrap_err().to_string();
        assert!(e.contains("unknown pattern `pow` (did you mean `pow2`?)"), "{e}");
        assert!(e.contains("no plugin crates are linked") && e.contains("use plugin_crate as _;"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
