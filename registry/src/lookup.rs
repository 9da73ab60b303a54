//! Lookup by name, with "did you mean" errors, and duplicate detection.

use mixer_core::{Error, Result};

use crate::entries::*;
use crate::{BACKENDS, KERNELS, LAMBDAS, MASKS, MIXERS, PATTERNS};

/// Names within a small edit distance of `name`, closest first.
pub fn near_names<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut v: Vec<(f64, &str)> = known
        .map(|k| (strsim::normalized_damerau_levenshtein(name, k), k))
        .filter(|(s, k)| *s >= 0.5 || k.contains(name) || (name.len() >= 3 && name.contains(*k)))
        .collect();
    v.sort_by(|a, b| b.0.total_cmp(&a.0));
    v.into_iter().take(3).map(|(_, k)| k.to_string()).collect()
}

fn find<'a, E>(kind: &'static str, name: &str, all: &'a [E], key: fn(&E) -> &'static str) -> Result<&'a E> {
    all.iter().find(|e| key(e) == name).ok_or_else(|| {
        let mut known: Vec<&str> = all.iter().map(key).collect();
        known.sort();
        Error::Unknown {
            kind,
            name: name.to_string(),
            suggestions: near_names(name, known.iter().copied()),
            known: known.join(", "),
        }
    })
}

/// A registered offset pattern.
pub fn pattern(name: &str) -> Result<&'static PatternEntry> {
    find("pattern", name, &PATTERNS, |e| e.name)
}
/// A registered level mask.
pub fn mask(name: &str) -> Result<&'static MaskEntry> {
    find("mask", name, &MASKS, |e| e.name)
}
/// A registered λ scheme.
pub fn lambda_scheme(name: &str) -> Result<&'static LambdaEntry> {
    find("λ scheme", name, &LAMBDAS, |e| e.name)
}
/// A registered mixer entry.
pub fn mixer_entry(name: &str) -> Result<&'static MixerEntry> {
    find("mixer", name, &MIXERS, |e| e.name)
}
/// A registered backend entry.
pub fn backend_entry(name: &str) -> Result<&'static BackendEntry> {
    find("backend", name, &BACKENDS, |e| e.name)
}
/// Builds a mixer by name from a JSON config.
pub fn mixer(name: &str, config: &serde_json::Value) -> Result<Box<dyn mixer_core::Mixer>> {
    let e = mixer_entry(name)?;
    // serde would read a JSON array as the config's fields in order (`[1e308]` as a scale).
    if !(config.is_object() || config.is_null()) {
        return Err(mixer_core::Error::config(
            name,
            format!("a config is a JSON object such as {{\"chunk\": 16}} (or null), given {config}"),
        ));
    }
    (e.build)(name, config)
}
/// The kernel entry of a mixer kernel on a backend, if any.
pub fn kernel(kernel: &str, backend: &str) -> Option<&'static KernelEntry> {
    KERNELS.iter().find(|k| k.kernel == kernel && k.backend == backend)
}

/// Every `(kind, name)` registered more than once.
pub fn duplicates() -> Vec<(&'static str, String)> {
    fn dups<E>(kind: &'static str, all: &[E], key: fn(&E) -> String, out: &mut Vec<(&'static str, String)>) {
        let mut seen = std::collections::BTreeSet::new();
        for e in all {
            let k = key(e);
            if !seen.insert(k.clone()) {
                out.push((kind, k));
            }
        }
    }
    let mut out = Vec::new();
    dups("pattern", &PATTERNS, |e| e.name.into(), &mut out);
    dups("mask", &MASKS, |e| e.name.into(), &mut out);
    dups("λ scheme", &LAMBDAS, |e| e.name.into(), &mut out);
    dups("mixer", &MIXERS, |e| e.name.into(), &mut out);
    dups("backend", &BACKENDS, |e| e.name.into(), &mut out);
    dups("kernel", &KERNELS, |e| format!("{}@{}", e.kernel, e.backend), &mut out);
    out
}
