//! `mixers check --grad`: the gradient checks of every case (finite differences against the
//! materialized backward; every other backward form against it in f64 and f32, or in f32 in a
//! `--precision` mode against that mode's tolerance).

use mixer_core::Precision;
use mixer_core::Result;
use mixer_registry::grad_check::{GradRow, check_grad_with};
use mixer_registry::{Backend, Sizes};

use super::table::{check_row, check_table, sci};

/// Checks the cases; a build failure is a failed row.
fn rows(
    cases: &[(String, serde_json::Value)],
    backends: &[Backend],
    sizes: &Sizes,
    seed: u64,
    precision: Precision,
) -> Vec<GradRow> {
    let mut out = Vec::new();
    for (name, cfg) in cases {
        match mixer_registry::mixer(name, cfg) {
            Ok(m) => out.extend(check_grad_with(m.as_ref(), backends, sizes, seed, precision)),
            Err(e) => out.push(GradRow {
                mixer: name.clone(),
                config: cfg.to_string(),
                backend: "-".into(),
                form: "-".into(),
                dtype: mixer_core::DType::F64,
                precision,
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
            let case = [&*r.mixer, &r.config, &r.backend, &r.form, r.dtype.name()];
            let cells = [
                r.precision.name().to_string(),
                r.seq.to_string(),
                format!("d_{}", r.input),
                sci(r.rel_err),
                sci(r.max_abs),
            ];
            check_row(case, cells, r.error.as_deref(), r.pass)
        })
        .collect();
    check_table(&["gradient", "rel err", "max abs"], &body)
}

/// Runs the gradient checks, prints the table, writes JSON if asked; exit code 1 on failure.
pub(crate) fn run(
    cases: &[(String, serde_json::Value)],
    backends: &[Backend],
    sizes: &Sizes,
    seed: u64,
    precision: Precision,
    json: Option<&std::path::Path>,
) -> Result<i32> {
    let rows = rows(cases, backends, sizes, seed, precision);
    print!("{}", render(&rows));
    if let Some(p) = json {
        super::write_json(&rows, p)?;
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
