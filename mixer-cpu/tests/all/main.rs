//! The CPU backend's integration tests, in one test binary: the shared backend suite on every
//! registered mixer ([`suite`]), then family-specific tests (closed forms, configurations,
//! error messages) per module.

mod attention;
mod glr;
mod loglinear;
mod loglinear_packed;
mod states;
mod suite;
mod thread_count;
mod toeplitz;
mod zero_states;

use mixer_registry::harness::Sizes;
use mixer_registry::suite::check_mixer;
use mixer_registry::{Backend, mixer};

use mixer_cpu as _;
use mixers_plugin_fibonacci as _;

/// The CPU backend.
pub fn cpu() -> Backend {
    Backend::by_name("cpu").unwrap()
}

/// Runs the shared suite on the CPU for each configuration and panics with every failed case;
/// returns the number of cases.
pub fn suite_on(configs: Vec<(&str, serde_json::Value)>, sizes: &Sizes) -> usize {
    let cpu = cpu();
    let mut cases = Vec::new();
    for (i, (name, cfg)) in configs.into_iter().enumerate() {
        let m = mixer(name, &cfg).unwrap_or_else(|e| panic!("{name} {cfg}: {e}"));
        cases.extend(check_mixer(m.as_ref(), &cpu, sizes, 40 + i as u64));
    }
    println!("suite on cpu at T = {}: {} cases", sizes.seq, cases.len());
    let failed: Vec<String> = cases.iter().filter(|c| c.failure.is_some()).map(|c| c.to_string()).collect();
    assert!(failed.is_empty(), "{} of {} cases failed:\n{}", failed.len(), cases.len(), failed.join("\n"));
    cases.len()
}
