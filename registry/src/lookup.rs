//! Lookup by name, with "did you mean" errors that name the linked plugins, and duplicate
//! names refused at lookup (the error names every registering module).

use mixer_core::{Error, Result};

use crate::entries::*;
use crate::{BACKENDS, FAMILIES, LAMBDA_GRADS, LAMBDAS, MASKS, MIXERS, ORIGINS, PATTERNS};

/// Names within a small edit distance of `name`, closest first.
pub fn near_names<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut v: Vec<(f64, &str)> = known
        .map(|k| (strsim::normalized_damerau_levenshtein(name, k), k))
        .filter(|(s, k)| *s >= 0.5 || k.contains(name) || (name.len() >= 3 && name.contains(*k)))
        .collect();
    v.sort_by(|a, b| b.0.total_cmp(&a.0));
    v.into_iter().take(3).map(|(_, k)| k.to_string()).collect()
}

/// The crates that register the builtins; every other registering crate is a plugin.
pub const BUILTIN_CRATES: [&str; 3] = ["mixer_registry", "mixer_cpu", "mixer_cuda"];

/// The module that registered `entry` (`module_path!()` at its `#[register]`), or `None` for
/// an entry placed in a slice without the attribute.
pub fn origin<E: std::any::Any>(entry: &'static E) -> Option<&'static str> {
    ORIGINS
        .iter()
        .find(|o| std::ptr::addr_eq(o.entry as *const dyn std::any::Any, entry as *const E))
        .map(|o| o.module)
}

fn origin_or_unknown<E: std::any::Any>(entry: &'static E) -> String {
    origin(entry).unwrap_or("(registered without #[register])").to_string()
}

/// Crates other than the builtin ones ([`BUILTIN_CRATES`]) that registered anything in this
/// binary, sorted: the plugins the linker kept.
pub fn plugin_crates() -> Vec<&'static str> {
    let mut v: Vec<&str> =
        ORIGINS.iter().map(|o| o.krate()).filter(|c| !BUILTIN_CRATES.contains(c)).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The one entry of `all` named `name`: an error naming near names and the linked plugins
/// when there is none, and an error naming every registering module when there are several.
fn find<E: std::any::Any>(
    kind: &'static str,
    name: &str,
    all: &'static [E],
    key: fn(&E) -> &'static str,
) -> Result<&'static E> {
    let found: Vec<&'static E> = all.iter().filter(|e| key(e) == name).collect();
    match found.as_slice() {
        [one] => Ok(one),
        [] => {
            let mut known: Vec<&str> = all.iter().map(key).collect();
            known.sort();
            Err(Error::NotRegistered {
                kind,
                name: name.to_string(),
                suggestions: near_names(name, known.iter().copied()),
                known: known.join(", "),
                plugins: plugin_crates().into_iter().map(String::from).collect(),
            })
        }
        many => Err(Error::Duplicate {
            kind,
            name: name.to_string(),
            origins: many.iter().map(|e| origin_or_unknown(*e)).collect(),
        }),
    }
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
/// A backend's implementation of a mixer family, if it registered one.
pub fn family(family: &str, backend: &str) -> Option<&'static FamilyEntry> {
    FAMILIES.iter().find(|k| k.family == family && k.backend == backend)
}
/// The registered derivative of a λ scheme, if any.
pub fn lambda_grad(name: &str) -> Option<&'static LambdaGradEntry> {
    LAMBDA_GRADS.iter().find(|e| e.name == name)
}

/// A name registered more than once: its kind and the modules that registered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Duplicate {
    /// `pattern`, `mask`, `λ scheme`, `mixer`, `backend` or `kernel`.
    pub kind: &'static str,
    /// The name (`kernel@backend` for kernels).
    pub name: String,
    /// The registering modules, in slice order.
    pub origins: Vec<String>,
}

impl std::fmt::Display for Duplicate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = Error::Duplicate { kind: self.kind, name: self.name.clone(), origins: self.origins.clone() };
        write!(f, "{e}")
    }
}

/// Every name registered more than once, with the modules that registered it. Lookups of
/// these names fail; `mixers list`, `check` and `tour` print them as warnings.
pub fn duplicates() -> Vec<Duplicate> {
    fn dups<E: std::any::Any>(
        kind: &'static str,
        all: &'static [E],
        key: fn(&E) -> String,
        out: &mut Vec<Duplicate>,
    ) {
        let mut by: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
        for e in all {
            by.entry(key(e)).or_default().push(origin_or_unknown(e));
        }
        out.extend(by.into_iter().filter(|(_, o)| o.len() > 1).map(|(name, origins)| Duplicate {
            kind,
            name,
            origins,
        }));
    }
    let mut out = Vec::new();
    dups("pattern", &PATTERNS, |e| e.name.into(), &mut out);
    dups("mask", &MASKS, |e| e.name.into(), &mut out);
    dups("λ scheme", &LAMBDAS, |e| e.name.into(), &mut out);
    dups("mixer", &MIXERS, |e| e.name.into(), &mut out);
    dups("backend", &BACKENDS, |e| e.name.into(), &mut out);
    dups("family", &FAMILIES, |e| format!("{}@{}", e.family, e.backend), &mut out);
    dups("λ derivative", &LAMBDA_GRADS, |e| e.name.into(), &mut out);
    out
}
