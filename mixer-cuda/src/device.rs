//! Probing for a usable CUDA device without panicking.

use mixer_registry::Availability;

/// Whether the CUDA driver library can be loaded and a device exists. The first call creates
/// the backend's context on its device (see [`crate::runtime::gpu`]); later calls reuse it.
pub fn probe() -> Availability {
    match crate::runtime::gpu() {
        Ok(g) => {
            Availability::Available(format!("{} (sm_{}{}, {} device(s))", g.name, g.cc.0, g.cc.1, g.count))
        }
        Err(mixer_core::Error::BackendUnavailable { reason, .. }) => Availability::Unavailable(reason),
        Err(e) => Availability::Unavailable(e.to_string()),
    }
}

/// For tests: `Some(reason)` when CUDA is unusable here and the test should skip (after
/// printing the reason); panics instead when `MIXERS_REQUIRE_CUDA=1` is set.
pub fn skip_reason() -> Option<String> {
    match probe() {
        Availability::Available(_) => None,
        Availability::Unavailable(why) => {
            if std::env::var("MIXERS_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("MIXERS_REQUIRE_CUDA=1 but CUDA is unavailable: {why}");
            }
            Some(why)
        }
    }
}
