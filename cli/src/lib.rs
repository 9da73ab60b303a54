//! The `mixers` command line: `list`, `run`, `check`, `metrics`, `bench`, `tour`, `train`.
//!
//! The crate `mixers-cli` is a library too, so that a researcher's own binary, linking extra
//! plugins, can offer the same commands: `fn main() { std::process::exit(mixers_cli::main()) }`.
//! The computations are the `mixers` library's; `train` drives the crate `mixers-train`.

pub mod bench;
mod check;
mod check_grad;
mod list;
mod metrics;
mod plan;
mod run;
pub mod table;
mod tour;
mod train;

use clap::{Parser, Subcommand};

/// Causal token mixers on CPU and CUDA: list, run, check against the oracle, measure.
#[derive(Parser, Debug)]
#[command(
    name = "mixers",
    version,
    about,
    long_about = None,
    after_help = "Memory: every form estimates its working memory from the sizes before it allocates, and \
                  refuses a call above MIXERS_MAX_MEMORY (e.g. 16G; default: the available memory)."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Everything registered (patterns, masks, λ schemes, mixers, backends) with docs.
    List(list::Args),
    /// Run one mixer on inputs from an .npz file, writing `y` to an .npz file.
    Run(run::Args),
    /// Cross-check every form on every backend against the f64 materialized oracle.
    Check(check::Args),
    /// Structural metrics of an offset pattern (shortest paths, congestion, cost, cache).
    Metrics(metrics::Args),
    /// Scaling, memory and form/backend comparisons: tables, JSON and log–log plots.
    Bench(bench::Args),
    /// The guided tour: what is registered, a check of every mixer, the structural table.
    Tour(tour::Args),
    /// Train a small model with one mixer on a synthetic task (copy, mqar, multihop).
    Train(train::Args),
    /// The launch plan of a device form at given sizes and mode, as JSON (for tuning harnesses).
    Plan(plan::Args),
}

/// Runs the CLI on the process arguments; returns the exit code (0 ok, 1 check failures,
/// 2 errors). Errors are printed as one line, never as a panic.
pub fn main() -> i32 {
    run(Cli::parse())
}

/// Runs the CLI on the given arguments (the first one is the program name), e.g.
/// `main_with(["mixers", "check", "--mixer", "glr"])`; returns the exit code like [`main`].
/// Invalid arguments print clap's usage message and return 2.
pub fn main_with<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match Cli::try_parse_from(args) {
        Ok(cli) => run(cli),
        Err(e) => {
            let _ = e.print();
            if e.use_stderr() { 2 } else { 0 }
        }
    }
}

fn run(cli: Cli) -> i32 {
    let r = match cli.command {
        Command::List(a) => list::run(a),
        Command::Run(a) => run::run(a),
        Command::Check(a) => check::run(a),
        Command::Metrics(a) => metrics::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Tour(a) => tour::run(a),
        Command::Train(a) => train::run(a),
        Command::Plan(a) => plan::run(a),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}

/// A `--mixer` value and `--config`: the mixer's name and its config text. The value may carry
/// the config after the name (`glr{"pattern":"pow2"}`, as in `mixers bench`); giving it both
/// inline and with `--config` is an error.
pub(crate) fn mixer_spec<'a>(
    spec: &'a str,
    config: Option<&'a str>,
) -> mixer_core::Result<(&'a str, Option<&'a str>)> {
    match spec.find('{') {
        Some(_) if config.is_some() => Err(mixer_core::Error::Io(format!(
            "--mixer `{spec}` has an inline config and --config is given too; use one"
        ))),
        Some(i) => Ok((spec[..i].trim(), Some(&spec[i..]))),
        None => Ok((spec.trim(), config)),
    }
}

/// Parses a JSON config given on the command line.
pub(crate) fn parse_config(s: Option<&str>) -> mixer_core::Result<serde_json::Value> {
    match s {
        None => Ok(serde_json::json!({})),
        Some(s) => serde_json::from_str(s)
            .map_err(|e| mixer_core::Error::Io(format!("--config is not valid JSON ({e}): {s}"))),
    }
}

/// Writes `value` as pretty-printed JSON to `path`.
pub(crate) fn write_json(value: &impl serde::Serialize, path: &std::path::Path) -> mixer_core::Result<()> {
    let s = serde_json::to_string_pretty(value).map_err(|e| mixer_core::Error::Io(e.to_string()))?;
    std::fs::write(path, s)
        .map_err(|e| mixer_core::Error::Io(format!("cannot write {}: {e}", path.display())))
}

/// Prints one `warning:` line to stderr per name registered more than once (lookups of those
/// names fail, naming both registering crates); returns how many there are.
pub(crate) fn warn_duplicates() -> usize {
    let dups = mixer_registry::duplicates();
    for d in &dups {
        eprintln!("warning: {d}; lookups of this name fail until it is unique");
    }
    dups.len()
}

/// `" [from crate]"` for an entry registered outside the builtin crates, else `""`.
pub(crate) fn plugin_note<E: std::any::Any>(entry: &'static E) -> String {
    match mixer_registry::origin(entry).map(|m| m.split("::").next().unwrap_or(m)) {
        Some(c) if !mixer_registry::lookup::BUILTIN_CRATES.contains(&c) => format!(" [from {c}]"),
        _ => String::new(),
    }
}
