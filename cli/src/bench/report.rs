//! Rendering a bench [`Report`]: Markdown tables, JSON, and the plot files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use mixer_core::{Error, Result};

use super::alloc::human;
use super::format::{si, sig3};
use super::model::{Report, Status};
use crate::table::markdown;

/// The fits table.
pub fn fits_table(r: &Report) -> String {
    let rows: Vec<Vec<String>> = r
        .fits
        .iter()
        .map(|f| {
            vec![
                f.mixer.clone(),
                f.form.name().into(),
                f.backend.clone(),
                f.display(),
                f.points.to_string(),
                format!("{}–{}", f.seq_min, f.seq_max),
            ]
        })
        .collect();
    markdown(&["mixer", "form", "backend", "exponent b ± 2·se", "points", "T range"], &rows)
}

/// The ratios table: one row per (mixer, comparison), one column per `T`.
pub fn ratios_table(r: &Report) -> String {
    let seqs: BTreeSet<usize> = r.ratios.iter().map(|x| x.seq).collect();
    let mut rows: BTreeMap<(String, String), BTreeMap<usize, f64>> = BTreeMap::new();
    let mut order = Vec::new();
    for x in &r.ratios {
        let k = (x.mixer.clone(), x.comparison.clone());
        if !rows.contains_key(&k) {
            order.push(k.clone());
        }
        rows.entry(k).or_default().insert(x.seq, x.ratio);
    }
    let mut headers: Vec<String> = vec!["mixer".into(), "time ratio".into()];
    headers.extend(seqs.iter().map(|s| format!("T={s}")));
    let body: Vec<Vec<String>> = order
        .into_iter()
        .map(|k| {
            let vals = &rows[&k];
            let mut row = vec![k.0.clone(), k.1.clone()];
            row.extend(
                seqs.iter().map(|s| vals.get(s).map(|v| format!("{}×", sig3(*v))).unwrap_or("–".into())),
            );
            row
        })
        .collect();
    let h: Vec<&str> = headers.iter().map(String::as_str).collect();
    markdown(&h, &body)
}

/// The per-point table (skipped and failed points included, with the reason).
pub fn points_table(r: &Report) -> String {
    let rows: Vec<Vec<String>> = r
        .points
        .iter()
        .map(|p| {
            let t = p.timing.as_ref();
            let ms = |x: f64| sig3(x * 1e3);
            vec![
                p.mixer.clone(),
                p.form.name().into(),
                p.backend.clone(),
                p.seq.to_string(),
                t.map(|t| ms(t.median)).unwrap_or("–".into()),
                t.map(|t| format!("{}–{}", ms(t.min), ms(t.max))).unwrap_or("–".into()),
                t.map(|t| t.reps.to_string()).unwrap_or("–".into()),
                p.tokens_per_s.map(si).unwrap_or("–".into()),
                match (p.status, p.peak_bytes) {
                    (Status::Ok, Some(b)) => human(b),
                    (Status::Ok, None) => "n/a".into(),
                    _ => "–".into(),
                },
                p.cache_elems.map(|c| c.to_string()).unwrap_or("–".into()),
                match (p.upload_s, p.download_s) {
                    (Some(u), Some(d)) => format!("{} / {}", ms(u), ms(d)),
                    _ => "–".into(),
                },
                p.kernel().unwrap_or("–").to_string(),
                match (p.status, &p.reason) {
                    (Status::Ok, _) => "ok".into(),
                    (Status::Skipped, Some(r)) => format!("skipped: {r}"),
                    (Status::Skipped, None) => "skipped".into(),
                    (Status::Error, Some(r)) => format!("error: {r}"),
                    (Status::Error, None) => "error".into(),
                },
            ]
        })
        .collect();
    markdown(
        &[
            "mixer",
            "form",
            "backend",
            "T",
            "median ms",
            "min–max ms",
            "runs",
            "tokens/s",
            "peak work mem",
            "cache elems",
            "upload / download ms",
            "kernel",
            "status",
        ],
        &rows,
    )
}

/// How the numbers were obtained, as a bullet list.
pub fn method(r: &Report) -> String {
    let m = &r.meta;
    let seqs: Vec<String> = m.seqs.iter().map(|s| s.to_string()).collect();
    format!(
        "- sizes: B = {}, H = {}, Dk = Dv = {}, C = H·Dk = {}, dtype {}, precision {}; T ∈ {{{}}}\n\
         - backends: {}; {} logical CPUs, {} rayon threads; mixers {}{}\n\
         - timing: {}; median and min–max over up to {} timed runs or {} s per point\n\
         - memory: {}\n\
         - kernel: the device form's launch plan at the point's sizes and mode (`mixers plan`; the whole \
         plan is `plan` in bench.json), – where the backend reports none\n\
         - guards: materialized only up to T = {}; a series stops growing T after a point over {} s, or \
         before a point whose time, predicted from the series' measured points, is over it; points whose \
         estimated memory exceeds the budget (MIXERS_MAX_MEMORY, else available memory) are skipped with \
         the estimate (nothing is extrapolated into the results)\n\
         - whole bench: {:.0} s\n",
        m.batch,
        m.heads,
        m.dim,
        m.channels,
        m.dtype,
        m.precision,
        seqs.join(", "),
        m.backends.join(", "),
        m.cpus,
        m.threads,
        m.version,
        match (&m.device, &m.driver) {
            (Some(d), Some(v)) => format!("; GPU {d}, driver {v}"),
            (Some(d), None) => format!("; GPU {d}"),
            _ => String::new(),
        },
        m.timing,
        m.reps,
        m.max_seconds,
        m.memory,
        m.materialized_max_seq,
        m.max_seconds,
        m.elapsed_s,
    )
}

/// The whole report as Markdown.
pub fn render_markdown(r: &Report) -> String {
    let mut s = String::from("# mixers bench\n\n");
    s += &method(r);
    s += "\n## Scaling exponents\n\nTime ∝ T^b: least squares of log time on log T over the measured points \
          of each series; the interval is ± 2 standard errors of b.\n\n";
    s += &fits_table(r);
    s += "\n## Ratios\n\nMedian time of the first over the second at equal T, measured in the same run \
          (> 1: the second is faster).\n\n";
    s += &ratios_table(r);
    s += "\n## Measurements\n\n";
    s += &points_table(r);
    if !r.notes.is_empty() {
        s += "\n## Notes\n\n";
        for n in &r.notes {
            s += &format!("- {n}\n");
        }
    }
    s
}

fn io(p: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io(format!("cannot write {}: {e}", p.display()))
}

/// Writes `bench.md` and `bench.json` into `dir` (created if needed); returns their paths.
pub fn write_tables(r: &Report, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let md = dir.join("bench.md");
    std::fs::write(&md, render_markdown(r)).map_err(|e| io(&md, e))?;
    let json = dir.join("bench.json");
    let text = serde_json::to_string_pretty(r).map_err(|e| io(&json, e))?;
    std::fs::write(&json, text).map_err(|e| io(&json, e))?;
    Ok(vec![md, json])
}

/// Writes `bench.md`, `bench.json`, `bench.png` and `bench.svg` into `dir` (created if
/// needed); returns their paths.
pub fn write_outputs(r: &Report, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = write_tables(r, dir)?;
    let png = dir.join("bench.png");
    let svg = dir.join("bench.svg");
    super::plot::plot(r, &png, &svg)?;
    files.extend([png, svg]);
    Ok(files)
}
