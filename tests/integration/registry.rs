//! Registry-wide properties (builtins and the linked example plugin): unique names, every
//! mixer's examples build and pass the cross-check on the CPU, every registered pattern meets
//! the lattice invariant.

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
