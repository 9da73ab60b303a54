//! `mixers plan`: the launch plan a backend's device form would use at given sizes and mode,
//! as JSON (which kernels, with what defines, grids, blocks and shared memory). Tuning
//! harnesses (`bench/gpu/gdn_tune.py --plan`) read it instead of re-deriving the host's rules.
//! No device is needed: the plan is computed from the sizes (and, where one is present, the
//! device's limits; otherwise the backend's defaults).

use std::path::PathBuf;

use clap::Args as ClapArgs;
use mixer_core::{DType, Error, Form, Precision, Result};
use mixer_registry::harness::Sizes;
use mixer_registry::{Backend, device_plan};

/// Arguments of `mixers plan`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The mixer (a config may follow the name: `gated-deltanet{"chunk":64}`).
    #[arg(long)]
    mixer: String,
    /// Its JSON configuration.
    #[arg(long)]
    config: Option<String>,
    /// The backend whose device form is planned.
    #[arg(long, default_value = "cuda")]
    backend: String,
    /// The form.
    #[arg(long, default_value = "fast")]
    form: String,
    /// Batch size B.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Sequence length T.
    #[arg(long, default_value_t = 16384)]
    seq: usize,
    /// Heads H.
    #[arg(long, default_value_t = 16)]
    heads: usize,
    /// Key head dim Dk (and Dv unless --dim-v is given).
    #[arg(long, default_value_t = 64)]
    dim: usize,
    /// Value head dim Dv.
    #[arg(long)]
    dim_v: Option<usize>,
    /// Precision mode: exact, tf32 or bf16.
    #[arg(long, default_value = "exact")]
    precision: String,
    /// Element type of the inputs in the exact mode: f32 or f64.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Write the JSON here instead of standard output.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Prints (or writes) the plan; an error where the family reports none.
pub fn run(a: Args) -> Result<i32> {
    let (name, config) = crate::mixer_spec(&a.mixer, a.config.as_deref())?;
    let m = mixer_registry::mixer(name, &crate::parse_config(config)?)?;
    let backend = Backend::registered(&a.backend)?;
    let form: Form = a.form.parse()?;
    let precision = Precision::parse(&a.precision)?;
    let dtype = match a.dtype.as_str() {
        "f32" => DType::F32,
        "f64" if precision == Precision::Exact => DType::F64,
        d => {
            return Err(Error::Io(format!(
                "--dtype: expected f32 (any mode) or f64 (the exact mode), given `{d}` in the {precision} mode"
            )));
        }
    };
    let sizes = Sizes {
        batch: a.batch,
        seq: a.seq,
        channels: a.heads * a.dim,
        heads: a.heads,
        dk: a.dim,
        dv: a.dim_v.unwrap_or(a.dim),
    };
    let plan =
        device_plan(m.as_ref(), &backend, form, &sizes.dims(), dtype, precision)?.ok_or_else(|| {
            Error::Backend {
                backend: a.backend.clone(),
                family: Some(m.family().into()),
                message: format!("the `{}` family reports no launch plan for its {form} form", m.family()),
            }
        })?;
    match &a.out {
        Some(path) => crate::write_json(&plan, path)?,
        None => println!("{}", serde_json::to_string_pretty(&plan).map_err(|e| Error::Io(e.to_string()))?),
    }
    Ok(0)
}
