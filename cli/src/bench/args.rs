//! The `mixers bench` command line: arguments, and the command that writes the report.

use std::path::{Path, PathBuf};

use mixer_core::{DType, Error, Form, Result};

use super::model::{Report, Status};
use super::options::Options;
use super::report::{render_markdown, write_outputs, write_tables};
use super::seq::parse_seq;

/// Arguments of `mixers bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Mixers to measure: `NAME` or `NAME{JSON config}` (e.g. `glr{"pattern":"sq1"}`),
    /// several after one --mixer or repeated; default: one per family (glr pow2, attention,
    /// mamba2, loglinear-mamba2, toeplitz), those registered.
    #[arg(long, num_args = 1..)]
    mixer: Vec<String>,
    /// JSON config, when exactly one --mixer is given.
    #[arg(long)]
    config: Option<String>,
    /// Forms (materialized, parallel, fast, recurrent); default: materialized, parallel, fast
    /// where available.
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    form: Vec<String>,
    /// Backends; default: every available backend.
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    backend: Vec<String>,
    /// Sequence lengths: `A..B` doubles from A up to B (`1k..64k` = 1024, 2048, …, 65536;
    /// k = 1024), or a comma list `1000,3000`.
    #[arg(long, default_value = "1k..64k")]
    seq: String,
    /// Batch B.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Heads H.
    #[arg(long, default_value_t = 2)]
    heads: usize,
    /// Head dim Dk = Dv (channels C = heads·dim).
    #[arg(long, default_value_t = 32)]
    dim: usize,
    /// Also measure token-by-token decoding (recurrent form) and the decoder's cache size.
    #[arg(long)]
    decode: bool,
    /// Input dtype: f32, f64, or bf16 (f32 arrays with bf16 storage of the activations and
    /// of `y`, the same as `--precision bf16`).
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Precision mode: exact, tf32 (tensor cores allowed) or bf16.
    #[arg(long, default_value = "exact")]
    precision: String,
    /// Time budget of one run in seconds: a series stops growing T after a run over it.
    #[arg(long, default_value_t = 5.0)]
    max_seconds: f64,
    /// Timed runs per point, after one untimed run.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output folder for bench.md, bench.json, bench.png, bench.svg.
    #[arg(long, default_value = "out/bench")]
    out: PathBuf,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Measure the backward pass instead: backward/forward time ratio of the fast forms and
    /// both scaling exponents (default lengths 4k, 8k, 16k).
    #[arg(long)]
    backward: bool,
    /// Measure packed batches instead: for each count N (comma list, e.g. `4,16,64`), N
    /// sequences of random lengths filling one batch row of T tokens against one sequence of
    /// length T, forward and backward of the fast forms, and their ratio (default lengths 4k, 16k).
    #[arg(long, value_delimiter = ',', conflicts_with = "backward")]
    packed: Vec<usize>,
    /// With --packed: every run starts from random initial states and returns its final states,
    /// and the backwards take their cotangents.
    #[arg(long, requires = "packed")]
    states: bool,
}

impl Args {
    /// The options these arguments describe.
    pub fn options(&self) -> Result<Options> {
        if self.config.is_some() && self.mixer.len() != 1 {
            return Err(Error::Io(format!(
                "--config applies to exactly one --mixer, given {} mixers",
                self.mixer.len()
            )));
        }
        let cfg = crate::parse_config(self.config.as_deref())?;
        let forms = self.form.iter().map(|f| f.parse::<Form>()).collect::<Result<Vec<_>>>()?;
        let precision = crate::check::precision_arg(&self.precision, Some(&self.dtype))?;
        let dtype = match self.dtype.as_str() {
            "f32" | "bf16" => DType::F32,
            "f64" => DType::F64,
            d => return Err(Error::Io(format!("--dtype: expected f32, f64 or bf16, given `{d}`"))),
        };
        let mixers = self
            .mixer
            .iter()
            .map(|m| match crate::mixer_spec(m, self.config.as_deref())? {
                (name, Some(inline)) if self.config.is_none() => {
                    serde_json::from_str(inline).map(|c| (name.to_string(), c)).map_err(|e| {
                        Error::Io(format!("--mixer `{m}`: the config after the name is not valid JSON ({e})"))
                    })
                }
                (name, _) => Ok((name.to_string(), cfg.clone())),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Options {
            mixers,
            forms,
            backends: self.backend.clone(),
            seqs: parse_seq(&self.seq)?,
            batch: self.batch,
            heads: self.heads,
            dim: self.dim,
            decode: self.decode,
            dtype,
            precision,
            max_seconds: self.max_seconds,
            reps: self.reps,
            seed: self.seed,
            progress: !self.quiet,
        })
    }
}

/// Runs the bench and writes `bench.md`, `bench.json`, `bench.png`, `bench.svg` to `out`;
/// returns the paths written.
///
/// `bench.md` and `bench.json` are rewritten after every point, so the measurements made
/// survive a later point that fails, or the process being stopped.
pub fn bench_to(opts: &Options, out: &Path) -> Result<(Report, Vec<PathBuf>)> {
    let report = super::bench_with(opts, |r| write_tables(r, out).map(|_| ()))?;
    let files = write_outputs(&report, out)?;
    Ok((report, files))
}

pub(crate) fn run(a: Args) -> Result<i32> {
    let mut opts = a.options()?;
    if a.backward {
        if a.seq == "1k..64k" {
            opts.seqs = super::backward::DEFAULT_SEQS.to_vec();
        }
        return super::backward::run(&opts);
    }
    if !a.packed.is_empty() {
        if a.seq == "1k..64k" {
            opts.seqs = super::packed::DEFAULT_SEQS.to_vec();
        }
        return super::packed::run(&opts, &a.packed, a.states);
    }
    let (report, files) = bench_to(&opts, &a.out)?;
    print!("{}", render_markdown(&report));
    println!();
    for f in files {
        println!("wrote {}", f.display());
    }
    let errors = report.points.iter().filter(|p| p.status == Status::Error).count();
    Ok(if errors == 0 { 0 } else { 1 })
}
