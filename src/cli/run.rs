//! `mixers run`: one mixer on inputs from an `.npz`, output `y` to an `.npz`.

use std::path::PathBuf;

use mixer_core::{Form, Result};
use mixer_registry::Backend;

/// Arguments of `mixers run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Registered mixer name.
    #[arg(long)]
    mixer: String,
    /// JSON config (default `{}`).
    #[arg(long)]
    config: Option<String>,
    /// Input `.npz` with the names of docs/math.md (f32 or f64).
    #[arg(long)]
    inputs: PathBuf,
    /// Form: materialized, parallel, fast, recurrent.
    #[arg(long, default_value = "fast")]
    form: String,
    /// Backend (default: automatic).
    #[arg(long)]
    backend: Option<String>,
    /// Output `.npz` (holds `y`).
    #[arg(long)]
    out: PathBuf,
}

pub(crate) fn run(a: Args) -> Result<i32> {
    let cfg = super::parse_config(a.config.as_deref())?;
    let m = mixer_registry::mixer(&a.mixer, &cfg)?;
    let form: Form = a.form.parse()?;
    let backend = match &a.backend {
        Some(b) => Backend::by_name(b)?,
        None => Backend::auto()?,
    };
    let inputs = crate::io::read_npz(&a.inputs)?;
    let y = mixer_registry::run::run(m.as_ref(), &backend, form, &inputs)?;
    crate::io::write_npz(&a.out, &[("y", &y)])?;
    eprintln!(
        "{} ({} form on {}): y {:?} {} written to {}",
        a.mixer,
        form,
        backend.name(),
        y.shape(),
        y.dtype().name(),
        a.out.display()
    );
    Ok(0)
}
