//! Run-time backend selection.
//!
//! `Backend::auto()` picks the highest-priority available backend (CUDA when a driver and a
//! device are present, else CPU). `MIXERS_BACKEND=cpu|cuda` overrides; `MIXERS_REQUIRE_CUDA=1`
//! turns a missing GPU into an error.

use mixer_core::{Error, Result};

use crate::BACKENDS;
use crate::entries::{Availability, BackendEntry, FamilyEntry};
use crate::lookup::backend_entry;

/// A backend that was found available: the value every `run::*` entry point takes, so the
/// name is looked up and probed once, when it is chosen.
#[derive(Clone, Copy, Debug)]
pub struct Backend {
    entry: &'static BackendEntry,
}

impl Backend {
    /// The backend's name.
    pub fn name(&self) -> &'static str {
        self.entry.name
    }
    /// Its registry entry.
    pub fn entry(&self) -> &'static BackendEntry {
        self.entry
    }

    /// Its implementation of a mixer family, if it registered one.
    pub fn family(&self, family: &str) -> Option<&'static FamilyEntry> {
        crate::lookup::family(family, self.entry.name)
    }

    /// A registered backend by name without probing it, for introspection (e.g. listing the
    /// forms it implements where it is not available). Running a form on it where it is not
    /// available fails with the backend's own error.
    pub fn registered(name: &str) -> Result<Backend> {
        backend_entry(name).map(|entry| Backend { entry })
    }

    /// A backend by name, if it is available here.
    pub fn by_name(name: &str) -> Result<Backend> {
        let entry = backend_entry(name)?;
        match (entry.probe)() {
            Availability::Available(_) => Ok(Backend { entry }),
            Availability::Unavailable(reason) => {
                Err(Error::BackendUnavailable { backend: name.into(), reason })
            }
        }
    }

    /// The backend to use: `MIXERS_BACKEND` if set, else the available backend of highest
    /// priority. With `MIXERS_REQUIRE_CUDA=1`, fails unless that is `cuda`.
    pub fn auto() -> Result<Backend> {
        let require_cuda = std::env::var("MIXERS_REQUIRE_CUDA").is_ok_and(|v| v == "1");
        let chosen = match std::env::var("MIXERS_BACKEND") {
            Ok(name) if !name.is_empty() => Backend::by_name(&name)?,
            _ => {
                let mut all: Vec<&'static BackendEntry> = BACKENDS.iter().collect();
                all.sort_by_key(|e| -e.priority);
                let mut found = None;
                for e in all {
                    if let Availability::Available(_) = (e.probe)() {
                        found = Some(Backend { entry: e });
                        break;
                    }
                }
                found.ok_or_else(|| Error::BackendUnavailable {
                    backend: "any".into(),
                    reason:
                        "no registered backend is available (is mixer-cpu linked? add `use mixer_cpu as _;`)"
                            .into(),
                })?
            }
        };
        if require_cuda && chosen.name() != "cuda" {
            let reason = match backend_entry("cuda").map(|e| (e.probe)()) {
                Ok(Availability::Unavailable(r)) => r,
                Ok(Availability::Available(_)) => format!("MIXERS_BACKEND selected `{}`", chosen.name()),
                Err(e) => e.to_string(),
            };
            return Err(Error::BackendUnavailable {
                backend: "cuda".into(),
                reason: format!("MIXERS_REQUIRE_CUDA=1 but {reason}"),
            });
        }
        Ok(chosen)
    }

    /// Every registered backend that is available here.
    pub fn available() -> Vec<Backend> {
        let mut v: Vec<Backend> = BACKENDS
            .iter()
            .filter(|e| matches!((e.probe)(), Availability::Available(_)))
            .map(|entry| Backend { entry })
            .collect();
        v.sort_by_key(|b| -b.entry.priority);
        v
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.entry.name)
    }
}

/// Every registered backend with its availability, by name.
pub fn backends_status() -> Vec<(&'static str, Availability)> {
    let mut v: Vec<_> = BACKENDS.iter().map(|e| (e.name, (e.probe)())).collect();
    v.sort_by_key(|(n, _)| *n);
    v
}
