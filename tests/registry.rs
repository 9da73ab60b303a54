//! Registry-wide properties: unique names, every mixer's examples build and pass the
//! cross-check on the CPU, every registered pattern meets the lattice invariant.

use mixers::prelude::*;
use mixers::registry::{MIXERS, PATTERNS};

#[test]
fn names_are_unique() {
    assert!(mixers::registry::duplicates().is_empty(), "{:?}", mixers::registry::duplicates());
}

#[test]
fn every_pattern_meets_the_lattice_invariant() {
    for e in PATTERNS.iter() {
        let p = mixers::core::pattern::Pattern::new(e.name, e.offset, None, true)
            .unwrap_or_else(|err| panic!("{}: {err}", e.name));
        p.check_lattice_invariant(3000).unwrap_or_else(|err| panic!("{err}"));
    }
}

#[test]
fn every_mixer_example_passes_on_cpu() {
    let cpu = vec![Backend::by_name("cpu").unwrap()];
    let mut checked = 0;
    for e in MIXERS.iter() {
        for ex in e.examples {
            let cfg: serde_json::Value = serde_json::from_str(ex).unwrap();
            let m = (e.build)(e.name, &cfg).unwrap_or_else(|err| panic!("{} {ex}: {err}", e.name));
            for seq in [1, 2, 29] {
                for r in mixers::registry::check(m.as_ref(), &cpu, &Sizes { seq, ..Sizes::default() }, 11) {
                    assert!(r.pass, "{} {ex} T={seq}: {r:?}", e.name);
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 0);
}

#[test]
fn auto_backend_is_cpu_without_a_gpu() {
    let cuda = mixers::registry::backend_entry("cuda").unwrap();
    if let mixers::registry::Availability::Unavailable(reason) = (cuda.probe)() {
        if std::env::var("MIXERS_BACKEND").is_err() && std::env::var("MIXERS_REQUIRE_CUDA").is_err() {
            assert_eq!(Backend::auto().unwrap().name(), "cpu", "no GPU ({reason}) → cpu");
        }
    } else {
        eprintln!(
            "a CUDA device is present; auto() → {}",
            Backend::auto().map(|b| b.name()).unwrap_or("error")
        );
    }
}

/// Found by the config fuzzer (issue 14): serde reads a JSON array as a struct's fields in
/// order, so `[1e308]` was accepted as `{"scale": 1e308}`. A config must be an object.
#[test]
fn configs_must_be_objects() {
    for cfg in [serde_json::json!([1e308]), serde_json::json!(3), serde_json::json!("pow2")] {
        for name in ["gated-deltanet", "attention", "glr", "toeplitz"] {
            let e = mixers::registry::mixer(name, &cfg).unwrap_err().to_string();
            assert!(e.contains("a config is a JSON object") && e.contains(&cfg.to_string()), "{name}: {e}");
        }
    }
    assert!(mixers::registry::mixer("attention", &serde_json::Value::Null).is_ok());
}
