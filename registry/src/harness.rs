//! The cross-check harness: for a mixer, a seed and sizes, draw valid inputs from its spec,
//! run every form on every available backend in `f64` and `f32`, and compare each with the
//! `f64` materialized oracle.

use std::time::Instant;

use mixer_core::mixer::{Mixer, complete_dims};
use mixer_core::tensor::cast_tensors;
use mixer_core::{AnyTensors, DType, Dims, Form, Precision, Tolerance};
use serde::Serialize;

use crate::backend::Backend;
use crate::run::{bf16_activations, forms, oracle, run_as, run_with};

/// Sizes for a check: `B`, `T`, `C`, `H`, `Dk`, `Dv` (a mixer uses those it needs).
#[derive(Clone, Debug, Serialize)]
pub struct Sizes {
    /// Batch.
    pub batch: usize,
    /// Sequence length.
    pub seq: usize,
    /// Channels.
    pub channels: usize,
    /// Heads.
    pub heads: usize,
    /// Key/query head dim.
    pub dk: usize,
    /// Value head dim.
    pub dv: usize,
}

impl Default for Sizes {
    fn default() -> Self {
        Sizes { batch: 2, seq: 37, channels: 6, heads: 2, dk: 5, dv: 3 }
    }
}

impl Sizes {
    /// As named dims.
    pub fn dims(&self) -> Dims {
        [
            ("B", self.batch),
            ("T", self.seq),
            ("C", self.channels),
            ("H", self.heads),
            ("Dk", self.dk),
            ("Dv", self.dv),
        ]
        .into_iter()
        .collect()
    }
}

/// One line of a check report.
#[derive(Clone, Debug, Serialize)]
pub struct CheckRow {
    /// Mixer name.
    pub mixer: String,
    /// Its config (JSON).
    pub config: String,
    /// Backend.
    pub backend: String,
    /// Form.
    pub form: Form,
    /// Scalar type.
    pub dtype: DType,
    /// Precision mode (`exact` unless asked).
    pub precision: Precision,
    /// Sequence length.
    pub seq: usize,
    /// Relative RMS error against the oracle.
    pub rel_rms: f64,
    /// Max-abs error against the oracle.
    pub max_abs: f64,
    /// Whether it passed its dtype's (or precision mode's) tolerance.
    pub pass: bool,
    /// The error message, if the form failed to run.
    pub error: Option<String>,
    /// Wall time of the run, in milliseconds.
    pub millis: f64,
}

/// Checks one configured mixer on the given backends. Returns one row per backend × form ×
/// dtype; a failure to run is a failed row, not an error.
pub fn check(m: &dyn Mixer, backends: &[Backend], sizes: &Sizes, seed: u64) -> Vec<CheckRow> {
    check_with(m, backends, sizes, seed, Precision::Exact)
}

/// [`check`] in a precision mode. `exact` checks `f64` and `f32`; `tf32` and `bf16` check
/// `f32` inputs against the mode's tolerance ([`Precision::tolerance`]). For `bf16` the
/// oracle is evaluated on the bf16-rounded activations, the inputs the call stores.
pub fn check_with(
    m: &dyn Mixer,
    backends: &[Backend],
    sizes: &Sizes,
    seed: u64,
    precision: Precision,
) -> Vec<CheckRow> {
    let dims = complete_dims(m, &sizes.dims());
    let cfg = m.config().to_string();
    let base = |backend: &str, form: Form, dtype: DType| CheckRow {
        mixer: m.name().to_string(),
        config: cfg.clone(),
        backend: backend.to_string(),
        form,
        dtype,
        precision,
        seq: sizes.seq,
        rel_rms: f64::INFINITY,
        max_abs: f64::INFINITY,
        pass: false,
        error: None,
        millis: 0.0,
    };
    let inputs = match m.random_inputs(&dims, seed) {
        // Rounded through f32 first, so that the oracle sees exactly the stored bf16 values.
        Ok(i) if precision == Precision::Bf16 => bf16_activations(&cast_tensors::<f32>(&i))
            .iter()
            .map(|(k, v)| (k.clone(), v.mapv(f64::from)))
            .collect(),
        Ok(i) => i,
        Err(e) => {
            return vec![CheckRow {
                error: Some(format!("random inputs: {e}")),
                ..base("-", Form::Materialized, DType::F64)
            }];
        }
    };
    let want = match oracle(m, &inputs) {
        Ok(y) => y,
        Err(e) => {
            return vec![CheckRow {
                error: Some(format!("oracle: {e}")),
                ..base("-", Form::Materialized, DType::F64)
            }];
        }
    };
    let mut rows = Vec::new();
    for b in backends {
        for (form, dtype, tol) in cases(forms(m, b), precision) {
            let t0 = Instant::now();
            let got = if precision == Precision::Exact {
                run_as(m, b, form, &inputs, dtype)
            } else {
                run_with(m, b, form, &AnyTensors::F32(cast_tensors::<f32>(&inputs)), precision)
                    .map(|t| t.to_f64())
            };
            let millis = t0.elapsed().as_secs_f64() * 1e3;
            let mut row = base(b.name(), form, dtype);
            row.millis = millis;
            match got {
                Ok(y) => {
                    let c = tol.compare(y.view(), want.view());
                    row.rel_rms = c.rel_rms;
                    row.max_abs = c.max_abs;
                    row.pass = c.pass;
                }
                Err(e) => row.error = Some(e.to_string()),
            }
            rows.push(row);
        }
    }
    rows
}

/// The cases a check compares against the `f64` reference in a precision mode: every form but
/// the materialized one (the reference itself), in `f64` and `f32` for the exact mode and in
/// `f32` for `tf32`/`bf16`, each with the mode's tolerance for that dtype.
pub(crate) fn cases(
    forms: Vec<Form>,
    precision: Precision,
) -> impl Iterator<Item = (Form, DType, Tolerance)> {
    let dtypes: &'static [DType] =
        if precision == Precision::Exact { &[DType::F64, DType::F32] } else { &[DType::F32] };
    forms.into_iter().filter(|&f| f != Form::Materialized).flat_map(move |form| {
        dtypes.iter().map(move |&dtype| (form, dtype, precision.tolerance(dtype.name())))
    })
}

/// One configuration per family and state layout whose state is a prefix of the inputs or a
/// cache (attention's KV cache, the Toeplitz mixer's input history, the GLR's kept streams): the
/// configurations the backends' tests of runs and decoders from a state go through.
pub fn cache_state_configs() -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::json;
    vec![
        ("attention", json!({})),
        ("attention", json!({"window": 5})),
        ("local-attention", json!({"window": 2})),
        ("toeplitz", json!({"heads": 2})),
        ("toeplitz", json!({"heads": 1, "kernel_width": 3, "decoder": "naive"})),
        ("glr", json!({"pattern": "pow2"})),
        ("glr", json!({"pattern": "sq1", "cache_efficient": true})),
        ("glr", json!({"pattern": "pow2", "cache_efficient": true, "on": "a"})),
        ("glr", json!({"pattern": "fibonacci", "cache_efficient": true})),
        ("glr", json!({"pattern": "pow2", "on": "both"})),
        ("glr", json!({"pattern": "sq1", "cache_efficient": true, "on": "both"})),
        ("kth-order", json!({"order": 3})),
        ("diagonal-ssm", json!({})),
        ("diagonal-ssm", json!({"on": "both"})),
        ("dense-recurrence", json!({"on": "a"})),
    ]
}
