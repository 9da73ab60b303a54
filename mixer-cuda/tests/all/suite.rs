//! The shared backend suite (`mixer_registry::suite`) on CUDA, and what the registry reports
//! about the CUDA backend without a device.

use mixer_core::Form;
use mixer_registry::suite::{assert_backend, registered_configs};
use mixer_registry::{Backend, mixer, run::forms};

use super::common;

/// Every registered mixer with its example configurations (builtins and the example plugin)
/// through every check of the shared suite on the GPU.
#[test]
#[ignore = "needs a CUDA device"]
fn every_registered_mixer_passes_the_shared_suite_on_cuda() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let cases = assert_backend("cuda");
    for c in &cases {
        println!("SUITE {c}");
    }
    assert!(cases.len() >= 4 * registered_configs().len());
}

/// The forms the CUDA backend offers, from its family implementations alone (no device
/// needed): both Toeplitz decoders run on the device; a plugin mixer with no CUDA fast form
/// lists what it has, and asking for more is a `FormUnavailable` error that says what is there.
#[test]
fn cuda_forms_are_listed_without_a_device() {
    let cuda = Backend::registered("cuda").unwrap();
    let online = mixer("toeplitz", &serde_json::json!({})).unwrap();
    let naive = mixer("toeplitz", &serde_json::json!({"decoder": "naive"})).unwrap();
    assert_eq!(forms(online.as_ref(), &cuda), Form::ALL);
    assert_eq!(forms(naive.as_ref(), &cuda), Form::ALL);
    let glr = mixer("glr", &serde_json::json!({"pattern": "sq1", "cache_efficient": true})).unwrap();
    assert_eq!(forms(glr.as_ref(), &cuda), [Form::Materialized, Form::Fast, Form::Recurrent]);
    let plugin = mixer("log-distance-mamba2", &serde_json::json!({})).unwrap();
    assert_eq!(forms(plugin.as_ref(), &cuda), [Form::Materialized, Form::Parallel]);
    let e = mixer_registry::run::available(plugin.as_ref(), &cuda, Form::Fast).unwrap_err().to_string();
    assert!(e.contains("available there: materialized, parallel"), "{e}");
    for name in ["attention", "mamba2", "loglinear-gated-deltanet"] {
        let m = mixer(name, &serde_json::json!({})).unwrap();
        assert!(forms(m.as_ref(), &cuda).contains(&Form::Recurrent), "{name}");
    }
}
