//! What `mixers bench` measures: the options, their defaults and their checks.

use mixer_core::{DType, Error, Form, Result};

/// Largest `T` at which the materialized form (dense `f64` solve) is run.
pub const MATERIALIZED_MAX_SEQ: usize = 4096;

/// The default mixers, one per family: `(name, config)`.
pub fn default_mixers(heads: usize) -> Vec<(String, serde_json::Value)> {
    vec![
        ("glr".into(), serde_json::json!({"pattern": "pow2"})),
        ("attention".into(), serde_json::json!({})),
        ("mamba2".into(), serde_json::json!({})),
        ("loglinear-mamba2".into(), serde_json::json!({})),
        ("toeplitz".into(), serde_json::json!({"heads": heads})),
    ]
}

/// What to measure (the library form of `mixers bench`'s arguments).
#[derive(Clone, Debug)]
pub struct Options {
    /// `(mixer name, config)`; empty: [`default_mixers`] (those registered).
    pub mixers: Vec<(String, serde_json::Value)>,
    /// Forms; empty: `materialized`, `parallel`, `fast` where available (plus `recurrent`
    /// with `decode`).
    pub forms: Vec<Form>,
    /// Backend names; empty: every available backend.
    pub backends: Vec<String>,
    /// Sequence lengths.
    pub seqs: Vec<usize>,
    /// Batch `B`.
    pub batch: usize,
    /// Heads `H`.
    pub heads: usize,
    /// Head dim `Dk = Dv`; channels `C = heads·dim`.
    pub dim: usize,
    /// Also measure token-by-token decoding (the `recurrent` form) and its cache size.
    pub decode: bool,
    /// Scalar type of the inputs.
    pub dtype: DType,
    /// Precision mode (`tf32` and `bf16` take `f32` inputs).
    pub precision: mixer_core::Precision,
    /// Time budget of one run, in seconds: a series stops growing `T` after a point whose
    /// run exceeded it; also the timing budget of one point.
    pub max_seconds: f64,
    /// Timed runs per point (after one untimed run).
    pub reps: usize,
    /// Seed of the random inputs.
    pub seed: u64,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mixers: Vec::new(),
            forms: Vec::new(),
            backends: Vec::new(),
            seqs: vec![1024, 2048, 4096, 8192, 16384, 32768, 65536],
            batch: 1,
            heads: 2,
            dim: 32,
            decode: false,
            dtype: DType::F32,
            precision: mixer_core::Precision::Exact,
            max_seconds: 5.0,
            reps: 5,
            seed: 0,
            progress: true,
        }
    }
}

pub(crate) fn check_options(opts: &Options) -> Result<()> {
    let bad = |what: &str, v: String| Err(Error::Io(format!("--{what} must be ≥ 1, given {v}")));
    if opts.batch == 0 {
        return bad("batch", opts.batch.to_string());
    }
    if opts.heads == 0 {
        return bad("heads", opts.heads.to_string());
    }
    if opts.dim == 0 {
        return bad("dim", opts.dim.to_string());
    }
    if opts.seqs.is_empty() || opts.seqs.contains(&0) {
        return Err(Error::Io(format!("--seq needs lengths ≥ 1, given {:?}", opts.seqs)));
    }
    if opts.precision != mixer_core::Precision::Exact && opts.dtype != DType::F32 {
        return Err(Error::Io(format!("--precision {} takes f32 inputs, given --dtype f64", opts.precision)));
    }
    if !(opts.max_seconds.is_finite() && opts.max_seconds > 0.0) {
        return Err(Error::Io(format!("--max-seconds must be > 0, given {}", opts.max_seconds)));
    }
    Ok(())
}
