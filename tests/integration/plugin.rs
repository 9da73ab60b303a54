//! A plugin crate outside the builtin crates is found once linked (`use plugin as _;`).

use mixers::prelude::*;

#[test]
fn plugin_entries_are_registered() {
    let p = mixers::registry::pattern("fibonacci").expect("the plugin pattern is linked");
    assert_eq!((0..6).map(p.offset).collect::<Vec<_>>(), [1, 2, 3, 5, 8, 13]);
    mixers::registry::mask("log-distance").expect("the plugin mask is linked");
    mixers::registry::lambda_scheme("sigmoid2").expect("the plugin λ scheme is linked");
    assert!(mixers::registry::duplicates().is_empty(), "{:?}", mixers::registry::duplicates());
}

#[test]
fn plugin_pattern_meets_the_lattice_invariant_and_has_log_paths() {
    let e = mixers::registry::pattern("fibonacci").unwrap();
    let p = mixers::core::pattern::Pattern::new(e.name, e.offset, None, true).unwrap();
    p.check_lattice_invariant(5000).unwrap();
    let ti = mixers::core::pattern::Pattern::new(e.name, e.offset, None, false).unwrap();
    let m = mixers::core::metrics::pattern_metrics(&ti, 4096).unwrap();
    // Zeckendorf: every Δ < F(n) is a sum of at most ⌈n/2⌉ non-consecutive Fibonacci numbers.
    assert!(m.paths.max.unwrap() <= 9, "{:?}", m.paths);
}

#[test]
fn plugin_mixers_pass_the_cross_check() {
    let backends = vec![Backend::by_name("cpu").unwrap()];
    for name in ["fibonacci-glr", "log-distance-mamba2"] {
        let entry = mixers::registry::mixer_entry(name).unwrap();
        for ex in entry.examples {
            let cfg: serde_json::Value = serde_json::from_str(ex).unwrap();
            let m = mixers::registry::mixer(name, &cfg).unwrap();
            for seq in [1, 19, 70] {
                let rows =
                    mixers::registry::check(m.as_ref(), &backends, &Sizes { seq, ..Sizes::default() }, 3);
                assert!(rows.len() >= 2, "{name}: forms were checked");
                for r in rows {
                    assert!(r.pass, "{name} {ex} T={seq}: {r:?}");
                }
            }
        }
    }
}

/// Plugin mixers (a plugin pattern, mask and λ scheme with its registered derivative) get
/// gradients checked three ways like the builtins.
#[test]
fn plugin_mixers_pass_the_gradient_checks() {
    let backends = vec![Backend::by_name("cpu").unwrap()];
    for name in ["fibonacci-glr", "log-distance-mamba2"] {
        let entry = mixers::registry::mixer_entry(name).unwrap();
        for ex in entry.examples {
            let cfg: serde_json::Value = serde_json::from_str(ex).unwrap();
            let m = mixers::registry::mixer(name, &cfg).unwrap();
            for seq in [1, 23] {
                let rows = mixers::registry::check_grad(
                    m.as_ref(),
                    &backends,
                    &Sizes { seq, ..Sizes::default() },
                    7,
                );
                assert!(
                    rows.iter().any(|r| r.input == "x" || r.input == "v"),
                    "{name}: gradients were checked"
                );
                for r in rows {
                    assert!(r.pass, "{name} {ex} T={seq}: {r:?}");
                }
            }
        }
    }
}
