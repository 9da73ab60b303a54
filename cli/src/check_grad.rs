//! `mixers check --grad`: the gradient checks of every case (finite differences against the
//! materialized backward; every other backward form against it in f64 and f32).

use mixer_core::{Error, Result};
use mixer_registry::grad_check::{GradRow, check_grad};
use mixer_registry::{Backend, Sizes};

use super::table::{markdown, sci};

/// Checks the cases; a build failure is a failed row.
fn rows(
    cases: &[(String, serde_json::Value)],
    backends: &[Backend],
    sizes: &Sizes,
    seed: u64,
) -> Vec<GradRow> {
    let mut out = Vec::new();
    for (name, cfg) in cases {
        match mixer_registry::mixer(name, cfg) {
            Ok(m) => out.extend(check_grad(m.as_ref(), backends, sizes, seed)),
            Err(e) => out.push(GradRow {
                mixer: name.clone(),
                config: cfg.to_string(),
                backend: "-".into(),
                form: "-".into(),
                dtype: mixer_core::DType::F64,
                seq: sizes.seq,
                input: "-".into(),
                rel_err: f64::INFINITY,
                max_abs: f64::INFINITY,
                pass: false,
                error: Some(format!("build: {e}")),
            }),
        }
    }
    out
}

/// Renders gradient rows as a Markdown table.
fn render(rows: &[GradRow]) -> String {
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.mixer.clone(),
                r.config.clone(),
                r.backend.clone(),
                r.form.clone(),
                r.dtype.name().into(),
                r.seq.to_string(),
                format!("d_{}", r.input),
                sci(r.rel_err),
                sci(r.max_abs),
                match (&r.error, r.pass) {
                    (Some(e), _) => format!("FAIL: {e}"),
                    (None, true) => "ok".into(),
                    (None, false) => "FAIL".into(),
                },
            ]
        })
        .collect();
    markdown(
        &["mixer", "config", "backend", "form", "dtype", "T", "gradient", "rel err", "max abs", "result"],
        &body,
    )
}

/// Runs the gradient checks, prints the table, writes JSON if asked; exit code 1 on failure.
pub(crate) fn run(
    cases: &[(String, serde_json::Value)],
    backends: &[Backend],
    sizes: &Sizes,
    seed: u64,
    json: Option<&std::path::Path>,
) -> Result<i32> {
    let rows = rows(cases, backends, sizes, seed);
    print!("{}", render(&rows));
    if let Some(p) = json {
        let s = serde_json::to_string_pretty(&rows).map_err(|e| Error::Io(e.to_string()))?;
        std::fs::write(p, s).map_err(|e| Error::Io(format!("cannot write {}: {e}", p.display())))?;
    }
    let failed = rows.iter().filter(|r| !r.pass).count();
    println!(
        "\n{} gradient checks (finite differences: relative to ‖d‖·‖δ‖, bound {:e}), {} passed, {} failed",
        rows.len(),
        mixer_registry::grad_check::FD_TOLERANCE,
        rows.len() - failed,
        failed
    );
    Ok(if failed == 0 && !rows.is_empty() { 0 } else { 1 })
}
