//! `mixers run`: one mixer on inputs from an `.npz`, output `y` (and, with `--grad`, the
//! input gradients `d_<input>`) to an `.npz`.
//!
//! States and packed batches (docs/math.md §7): an input array `initial_state` (a mixer whose
//! state has several tensors: `initial_state.<name>`) starts the run from that state; an array
//! `cu_seqlens` (integral values, the inputs' dtype) or `--cu-seqlens` packs sequences into
//! one batch row. With either, or with `--final-state`, the final state is written next to `y`
//! as `final_state`; with `--grad`, `d_final_state` in the cotangent file is the final state's
//! cotangent and `d_initial_state` is written with the gradients.

use std::path::PathBuf;

use mixer_core::{AnyTensors, Error, Form, Requires, Result, Tensor, Tensors};
use mixer_registry::Backend;
use mixer_registry::call::Target;

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
    /// Packed sequences: offsets `0,n1,n2,…` into the (single) batch row, instead of an array
    /// `cu_seqlens` in the inputs.
    #[arg(long, value_delimiter = ',')]
    cu_seqlens: Option<Vec<usize>>,
    /// Write the final state (`final_state`) even without an initial state.
    #[arg(long)]
    final_state: bool,
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
    let inputs = mixers::io::read_npz(&a.inputs)?;
    let dy = a.grad.as_deref().map(mixers::io::read_npz).transpose()?;
    let gf = match &a.grad {
        Some(_) => {
            let asked = a.grad_form.as_deref().map(str::parse).transpose()?;
            Some(mixer_registry::call::grad_form(m.as_ref(), backend.name(), asked, form)?)
        }
        None => None,
    };
    let req = match &a.requires {
        Some(v) => Requires::only(v.iter().map(|s| s.trim().to_string())),
        None => Requires::All,
    };
    let job =
        Job { m: m.as_ref(), backend: &backend, form, grad_form: gf, precision, requires: &req, args: &a };
    let arrays = match (inputs, dy) {
        (AnyTensors::F64(x), dy) => job.run(x, dy.map(|d| d.to_f64()))?,
        (AnyTensors::F32(_), Some(AnyTensors::F64(_))) => {
            return Err(Error::Io(format!(
                "{}: the cotangent is f64 but the inputs are f32",
                a.inputs.display()
            )));
        }
        (AnyTensors::F32(x), Some(AnyTensors::F32(d))) => job.run(x, Some(d))?,
        (AnyTensors::F32(x), None) => job.run(x, None)?,
    };
    if let Some(gf) = gf {
        let names: Vec<&str> =
            arrays.iter().map(|(k, _)| k.as_str()).filter(|k| k.starts_with("d_")).collect();
        eprintln!("backward ({gf} form): {}", names.join(", "));
    }
    let refs: Vec<(&str, &Tensor)> = arrays.iter().map(|(k, v)| (k.as_str(), v)).collect();
    mixers::io::write_npz(&a.out, &refs)?;
    let y = &arrays[0].1;
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

/// One `mixers run` call, typed once its dtype is known.
struct Job<'a> {
    m: &'a dyn mixer_core::Mixer,
    backend: &'a Backend,
    form: Form,
    grad_form: Option<Form>,
    precision: mixer_core::Precision,
    requires: &'a Requires,
    args: &'a Args,
}

/// The `.npz` name of state tensor `name` under `prefix` (`initial_state`, `final_state`, …):
/// the prefix alone for a single-tensor state, else `prefix.name`.
fn state_key(prefix: &str, name: &str, single: bool) -> String {
    if single { prefix.to_string() } else { format!("{prefix}.{name}") }
}

/// Takes the arrays of a state out of `map` (`prefix`, or `prefix.<name>` for each name).
fn take_state<F>(map: &mut Tensors<F>, prefix: &str, names: &[String]) -> Option<Tensors<F>> {
    let single = names.len() == 1;
    let s: Tensors<F> = names
        .iter()
        .filter_map(|n| map.remove(&state_key(prefix, n, single)).map(|a| (n.clone(), a)))
        .collect();
    (!s.is_empty()).then_some(s)
}

impl Job<'_> {
    fn run<F: mixer_registry::Scalar>(
        &self,
        mut x: Tensors<F>,
        dy: Option<Tensors<F>>,
    ) -> Result<Vec<(String, Tensor)>> {
        let (m, backend) = (self.m, self.backend);
        let cu = match (self.args.cu_seqlens.clone(), x.remove("cu_seqlens")) {
            (Some(_), Some(_)) => {
                return Err(Error::Io("cu_seqlens given twice: as --cu-seqlens and in the inputs".into()));
            }
            (Some(c), None) => Some(c),
            (None, Some(a)) => Some(offsets(&a)?),
            (None, None) => None,
        };
        // The state's tensor names, when the mixer has a state (sizes of one batch row).
        let shapes = x
            .iter()
            .filter(|(k, _)| !k.starts_with("initial_state"))
            .map(|(k, v)| (k.clone(), v.shape().to_vec()))
            .collect();
        let state = m.spec().bind(&shapes).map_err(|e| e.to_string()).and_then(|d| m.state_shapes(&d));
        let names: Vec<String> =
            state.as_ref().map(|s| s.iter().map(|(n, _)| n.clone()).collect()).unwrap_or_default();
        let initial = take_state(&mut x, "initial_state", &names);
        if let (Err(why), true) = (&state, x.keys().any(|k| k.starts_with("initial_state"))) {
            return Err(mixer_core::state::no_state(m.name(), why));
        }
        let stateful = initial.is_some() || self.args.final_state || cu.is_some() && !names.is_empty();
        let at = Target::new(m, backend, self.form).packed(cu.as_deref());
        let (y, fin) = mixer_registry::call::forward(at, &x, initial.as_ref(), stateful, self.precision)?;
        let single = names.len() == 1;
        let mut out = vec![("y".to_string(), F::tag_one(y))];
        if let Some(f) = fin {
            out.extend(f.into_iter().map(|(n, a)| (state_key("final_state", &n, single), F::tag_one(a))));
        }
        let (Some(gf), Some(mut dy)) = (self.grad_form, dy) else { return Ok(out) };
        let d_final = take_state(&mut dy, "d_final_state", &names);
        let dy = match dy.remove("dy") {
            Some(d) => d,
            None if dy.len() == 1 => dy.into_values().next().unwrap_or_default(),
            None => {
                return Err(Error::Io("the cotangent file needs an array `dy` (or a single array)".into()));
            }
        };
        let (grads, d_init) = mixer_registry::call::backward(
            Target { form: gf, ..at },
            &x,
            initial.as_ref(),
            &dy,
            d_final.as_ref(),
            self.requires,
            self.precision,
        )?;
        out.extend(grads.into_iter().map(|(k, v)| (k, F::tag_one(v))));
        out.extend(
            d_init.into_iter().map(|(n, a)| (state_key("d_initial_state", &n, single), F::tag_one(a))),
        );
        Ok(out)
    }
}

/// Packed-batch offsets from an array of integral values.
fn offsets<F: mixer_core::Real>(a: &mixer_core::ndarray::ArrayD<F>) -> Result<Vec<usize>> {
    a.iter()
        .map(|&v| {
            let x: f64 = mixer_core::Real::f64(v);
            if x >= 0.0 && x.fract() == 0.0 && x < 9.0e15 {
                Ok(x as usize)
            } else {
                Err(Error::Value {
                    name: "cu_seqlens".into(),
                    constraint: "offsets must be non-negative integers".into(),
                    found: format!("{x}"),
                })
            }
        })
        .collect()
}
