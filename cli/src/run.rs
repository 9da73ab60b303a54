//! `mixers run`: one mixer on inputs from an `.npz`, output `y` (and, with `--grad`, the
//! input gradients `d_<input>`) to an `.npz`.

use std::path::PathBuf;

use mixer_core::{AnyTensors, Error, Form, Requires, Result, Tensor};
use mixer_registry::Backend;

/// Arguments of `mixers run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Registered mixer name; a JSON config may follow it (`glr{"pattern":"sq1"}`) instead of
    /// `--config`.
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
    /// Precision mode: exact (default), tf32 or bf16 (f32 inputs; bf16 stores the
    /// activations and `y` in bfloat16, written back as f32 values).
    #[arg(long, default_value = "exact")]
    precision: String,
    /// Output `.npz` (holds `y`, and `d_<input>` with `--grad`).
    #[arg(long)]
    out: PathBuf,
    /// Also run the backward pass: an `.npz` holding the cotangent `dy` (shape and dtype of
    /// `y`; a file with a single array may name it anything). Writes one gradient
    /// `d_<input>` per input (`d_x`, `d_q`, `d_g`, `d_lambda`, `d_w`, …) next to `y`.
    #[arg(long, value_name = "DY.npz")]
    grad: Option<PathBuf>,
    /// Backward form (default: `--form` when it has a backward, else `fast`, else
    /// `materialized`).
    #[arg(long)]
    grad_form: Option<String>,
    /// Only these input gradients, comma-separated (default: every input given).
    #[arg(long, value_delimiter = ',')]
    requires: Option<Vec<String>>,
}

/// Reads the cotangent from an `.npz`: the array `dy`, or the only array.
fn read_dy(path: &std::path::Path) -> Result<Tensor> {
    let all = mixers::io::read_npz(path)?;
    let names: Vec<String> = all.shapes().into_keys().collect();
    let pick = if names.iter().any(|n| n == "dy") {
        "dy".to_string()
    } else if names.len() == 1 {
        names[0].clone()
    } else {
        return Err(Error::Io(format!(
            "{}: expected an array named `dy` (or a single array), found {}",
            path.display(),
            if names.is_empty() { "none".into() } else { names.join(", ") }
        )));
    };
    let missing = || Error::Io(format!("{}: no array `{pick}`", path.display()));
    Ok(match all {
        AnyTensors::F64(mut m) => Tensor::F64(m.remove(&pick).ok_or_else(missing)?),
        AnyTensors::F32(mut m) => Tensor::F32(m.remove(&pick).ok_or_else(missing)?),
    })
}

/// The backward form: the requested one, else the forward form when it has a backward, else
/// the best available (`fast`, then `materialized`).
fn grad_form(m: &dyn mixer_core::Mixer, backend: &str, asked: Option<&str>, forward: Form) -> Result<Form> {
    let avail = mixer_registry::backward::backward_forms(m, backend);
    if let Some(f) = asked {
        return f.parse();
    }
    if avail.contains(&forward) {
        return Ok(forward);
    }
    [Form::Fast, Form::Materialized].into_iter().find(|f| avail.contains(f)).ok_or_else(|| {
        Error::FormUnavailable {
            mixer: m.name().into(),
            form: "any (backward)".into(),
            backend: backend.into(),
            available: "no backward form".into(),
        }
    })
}

pub(crate) fn run(a: Args) -> Result<i32> {
    let (name, config) = super::mixer_spec(&a.mixer, a.config.as_deref())?;
    let cfg = super::parse_config(config)?;
    let m = mixer_registry::mixer(name, &cfg)?;
    let form: Form = a.form.parse()?;
    let backend = match &a.backend {
        Some(b) => Backend::by_name(b)?,
        None => Backend::auto()?,
    };
    let precision = mixer_core::Precision::parse(&a.precision)?;
    if a.grad.is_some() && precision != mixer_core::Precision::Exact {
        return Err(mixer_core::Error::Io("--grad runs the exact arithmetic only; drop --precision".into()));
    }
    let inputs = mixers::io::read_npz(&a.inputs)?;
    let y = mixer_registry::run::run_with(m.as_ref(), &backend, form, &inputs, precision)?;
    let mut grads = std::collections::BTreeMap::new();
    if let Some(p) = &a.grad {
        let dy = read_dy(p)?;
        let gf = grad_form(m.as_ref(), backend.name(), a.grad_form.as_deref(), form)?;
        let req = match &a.requires {
            Some(v) => Requires::only(v.iter().map(|s| s.trim().to_string())),
            None => Requires::All,
        };
        grads = mixer_registry::backward::backward(m.as_ref(), backend.name(), gf, &inputs, &dy, &req)?;
        eprintln!("backward ({gf} form): {}", grads.keys().cloned().collect::<Vec<_>>().join(", "));
    }
    let mut arrays: Vec<(&str, &Tensor)> = vec![("y", &y)];
    arrays.extend(grads.iter().map(|(k, v)| (k.as_str(), v)));
    mixers::io::write_npz(&a.out, &arrays)?;
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
