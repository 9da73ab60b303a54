//! Which (mixer, backend, forms) a bench runs, from its options.

use mixer_core::mixer::Mixer;
use mixer_core::{Error, Form, Result};
use mixer_registry::Backend;
use mixer_registry::run::forms as available_forms;

use super::model::label;
use super::options::{Options, default_mixers};

pub(crate) struct Case {
    pub(crate) label: String,
    pub(crate) name: String,
    pub(crate) config: serde_json::Value,
    pub(crate) mixer: Box<dyn Mixer>,
    /// (backend, forms to run there)
    pub(crate) plan: Vec<(String, Vec<Form>)>,
}

pub(crate) fn plan(opts: &Options, notes: &mut Vec<String>) -> Result<(Vec<Case>, Vec<String>)> {
    let backends: Vec<String> = if opts.backends.is_empty() {
        Backend::available().iter().map(|b| b.name().to_string()).collect()
    } else {
        opts.backends
            .iter()
            .map(|b| Backend::by_name(b).map(|b| b.name().to_string()))
            .collect::<Result<_>>()?
    };
    if backends.is_empty() {
        return Err(Error::Io("no backend available to bench".into()));
    }
    let defaults = opts.mixers.is_empty();
    let list = if defaults { default_mixers(opts.heads) } else { opts.mixers.clone() };
    let mut wanted: Vec<Form> = if opts.forms.is_empty() {
        vec![Form::Materialized, Form::Parallel, Form::Fast]
    } else {
        opts.forms.clone()
    };
    if opts.decode && !wanted.contains(&Form::Recurrent) {
        wanted.push(Form::Recurrent);
    }
    wanted.sort();
    wanted.dedup();
    let mut cases = Vec::new();
    for (name, config) in list {
        let built = mixer_registry::mixer(&name, &config);
        let mixer = match built {
            Ok(m) => m,
            Err(e) if defaults => {
                notes.push(format!("default mixer `{name}` left out: {e}"));
                continue;
            }
            Err(e) => return Err(e),
        };
        let label = label(&name, &config);
        let mut plan = Vec::new();
        for b in &backends {
            let have = available_forms(mixer.as_ref(), &Backend::by_name(b)?);
            let mut forms = Vec::new();
            for f in &wanted {
                if have.contains(f) {
                    forms.push(*f);
                } else if !opts.forms.is_empty() || *f == Form::Recurrent {
                    notes.push(format!(
                        "{label}: form `{f}` is not available on `{b}` (available: {})",
                        have.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
                    ));
                }
            }
            plan.push((b.clone(), forms));
        }
        cases.push(Case { label, name, config, mixer, plan });
    }
    if cases.is_empty() {
        return Err(Error::Io(format!("nothing to bench: {}", notes.join("; "))));
    }
    Ok((cases, backends))
}
