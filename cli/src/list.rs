//! `mixers list`.

use super::plugin_note;
use mixer_core::Result;
use mixer_registry::{Availability, Backend, LAMBDAS, MASKS, MIXERS, PATTERNS, backends_status, run::forms};

/// Arguments of `mixers list`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// The listing, as text.
pub fn listing() -> String {
    let mut s = String::new();
    let plugins = mixer_registry::plugin_crates();
    s += &format!(
        "plugin crates linked: {}\n",
        if plugins.is_empty() { "none".to_string() } else { plugins.join(", ") }
    );
    for d in mixer_registry::duplicates() {
        s += &format!("DUPLICATE: {d}\n");
    }
    let mut section = |title: &str, mut items: Vec<(String, String)>| {
        items.sort();
        s += &format!("{title}:\n");
        for (n, d) in items {
            s += &format!("  {n:<26} {d}\n");
        }
    };
    section(
        "patterns",
        PATTERNS.iter().map(|e| (e.name.to_string(), format!("{}{}", e.doc, plugin_note(e)))).collect(),
    );
    section(
        "masks",
        MASKS.iter().map(|e| (e.name.to_string(), format!("{}{}", e.doc, plugin_note(e)))).collect(),
    );
    section(
        "λ schemes",
        LAMBDAS.iter().map(|e| (e.name.to_string(), format!("{}{}", e.doc, plugin_note(e)))).collect(),
    );
    let status = backends_status();
    section(
        "backends",
        status
            .iter()
            .map(|(n, a)| {
                let d = match a {
                    Availability::Available(d) => format!("available ({d})"),
                    Availability::Unavailable(r) => format!("not available ({r})"),
                };
                (format!("{n}:"), d)
            })
            .collect(),
    );
    let mut mixers: Vec<_> = MIXERS.iter().collect();
    mixers.sort_by_key(|e| (e.family, e.name));
    s += "mixers:\n";
    for e in mixers {
        s += &format!("  {:<26} [{}] {}{}\n", e.name, e.family, e.doc, plugin_note(e));
        match (e.build)(e.name, &serde_json::json!({})) {
            Ok(m) => {
                s += &format!("  {:<26} inputs: {}\n", "", m.spec().describe());
                for (b, av) in &status {
                    let f: Vec<&str> = match Backend::registered(b) {
                        Ok(b) => forms(m.as_ref(), &b).iter().map(|f| f.name()).collect(),
                        Err(_) => Vec::new(),
                    };
                    let note = if matches!(av, Availability::Available(_)) {
                        ""
                    } else {
                        " (backend not available here)"
                    };
                    s += &format!("  {:<26} {b}: {}{note}\n", "", f.join(", "));
                }
            }
            Err(err) => s += &format!("  {:<26} (needs a config: {err})\n", ""),
        }
    }
    s
}

pub(crate) fn run(_a: Args) -> Result<i32> {
    super::warn_duplicates();
    print!("{}", listing());
    Ok(0)
}
