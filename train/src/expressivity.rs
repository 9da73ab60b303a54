//! The expressivity experiment: every structure of Table 1 of *Structured generalized linear
//! token mixing*, plus Mamba-2, gated DeltaNet, their log-linear lifts and the Toeplitz mixer,
//! trained on copy, MQAR and multi-hop recall at one small setting; the accuracy table next to
//! the papers' numbers. `train/examples/expressivity.rs` runs it (`--quick` for the smoke setting);
//! the results are in `docs/training.md`.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use mixer_core::Result;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::fit::{Metrics, TrainConfig, train};
use super::optim::AdamWConfig;
use super::tasks::{TaskConfig, TaskKind};

/// One structure (row of the table).
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Label as in the paper.
    pub label: String,
    /// Registered mixer.
    pub mixer: String,
    /// Its JSON config.
    pub config: Value,
    /// The paper's accuracy (%) on copy, associative recall and multi-hop recall, where it
    /// reports one (Table 1 of the GLR paper; MQAR of the log-linear paper).
    pub paper: [Option<f64>; 3],
    /// Which paper the numbers are from.
    pub source: &'static str,
}

impl Row {
    /// The paper's number for `task`.
    pub fn paper_for(&self, task: TaskKind) -> Option<f64> {
        self.paper[match task {
            TaskKind::Copy => 0,
            TaskKind::Mqar => 1,
            TaskKind::Multihop => 2,
        }]
    }
}

/// The rows: Table 1's structures, then Mamba-2, gated DeltaNet, their lifts and Toeplitz.
/// `window` is the local-attention window, `order` the k-th order recurrence's `k`.
pub fn rows(window: usize, order: usize) -> Vec<Row> {
    let t1 = "GLR Table 1";
    let ll = "log-linear MQAR";
    let r = |label: String, mixer: &str, config: Value, paper: [Option<f64>; 3], source| Row {
        label,
        mixer: mixer.into(),
        config,
        paper,
        source,
    };
    vec![
        r("Attention".into(), "attention", json!({}), [Some(100.0), Some(100.0), Some(39.21)], t1),
        r(
            format!("Local attention (w = {window})"),
            "local-attention",
            json!({"window": window}),
            [Some(23.75), Some(26.20), Some(23.59)],
            t1,
        ),
        r("Diagonal SSM".into(), "diagonal-ssm", json!({}), [Some(42.98), Some(32.53), Some(27.17)], t1),
        r(
            format!("k-th order recurrence (k = {order})"),
            "kth-order",
            json!({"order": order}),
            [Some(74.66), Some(41.12), Some(39.08)],
            t1,
        ),
        r(
            "Dense recurrence".into(),
            "dense-recurrence",
            json!({}),
            [Some(100.0), Some(99.99), Some(99.80)],
            t1,
        ),
        r(
            "f(k) = 2^k".into(),
            "glr",
            json!({"pattern": "pow2"}),
            [Some(92.63), Some(49.03), Some(34.85)],
            t1,
        ),
        r(
            "f(k) = 2^k + cache-eff".into(),
            "glr",
            json!({"pattern": "pow2", "cache_efficient": true}),
            [Some(75.47), Some(52.59), Some(38.63)],
            t1,
        ),
        r(
            "f(k) = k²+1".into(),
            "glr",
            json!({"pattern": "sq1"}),
            [Some(99.66), Some(53.61), Some(35.68)],
            t1,
        ),
        r(
            "f(k) = k²+1 + cache-eff".into(),
            "glr",
            json!({"pattern": "sq1", "cache_efficient": true}),
            [Some(91.59), Some(54.56), Some(38.02)],
            t1,
        ),
        r("Mamba-2".into(), "mamba2", json!({}), [None, Some(89.6), None], ll),
        r("Log-linear Mamba-2".into(), "loglinear-mamba2", json!({}), [None, Some(92.9), None], ll),
        r("Gated DeltaNet".into(), "gated-deltanet", json!({}), [None, Some(79.0), None], ll),
        r(
            "Log-linear gated DeltaNet".into(),
            "loglinear-gated-deltanet",
            json!({}),
            [None, Some(84.4), None],
            ll,
        ),
        r("Toeplitz".into(), "toeplitz", json!({}), [None, None, None], "—"),
    ]
}

/// The setting shared by every run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Setting {
    /// Name (`default` or `quick`).
    pub name: String,
    /// The three tasks with their lengths.
    pub tasks: Vec<TaskConfig>,
    /// Model and optimiser (its `task`, `mixer` and `mixer_config` are replaced per run).
    pub run: TrainConfig,
    /// Seeds; a cell is the mean over them.
    pub seeds: Vec<u64>,
    /// Local-attention window.
    pub window: usize,
    /// Order of the k-th order recurrence.
    pub order: usize,
}

impl Setting {
    /// The default setting (docs/training.md).
    pub fn default_setting() -> Self {
        Setting {
            name: "default".into(),
            tasks: vec![
                TaskConfig { alphabet: 8, min_len: 4, max_len: 10, ..TaskConfig::new(TaskKind::Copy) },
                TaskConfig { vocab: 32, pairs: 6, seq_len: 32, ..TaskConfig::new(TaskKind::Mqar) },
                TaskConfig {
                    vocab: 24,
                    pairs: 6,
                    max_hops: 3,
                    queries: 2,
                    ..TaskConfig::new(TaskKind::Multihop)
                },
            ],
            // The default run (D = 32, 2 blocks of 2 heads, MLP ×2, learned positions, a short
            // convolution of kernel 3 before each mixer as in the Python experiments; 1000 steps
            // of 32 sequences, a test set of 256) at learning rate 3·10⁻³, evaluated once at the
            // end.
            run: TrainConfig {
                conv: 3,
                optim: AdamWConfig { lr: 3e-3, ..AdamWConfig::default() },
                eval_every: 0,
                test_size: 256,
                ..TrainConfig::default()
            },
            seeds: vec![0],
            window: 4,
            order: 2,
        }
    }

    /// The `--quick` setting: shorter sequences, fewer steps, a smaller test set.
    pub fn quick() -> Self {
        let d = Setting::default_setting();
        Setting {
            name: "quick".into(),
            tasks: vec![
                TaskConfig { alphabet: 6, min_len: 2, max_len: 6, ..TaskConfig::new(TaskKind::Copy) },
                TaskConfig { vocab: 16, pairs: 4, seq_len: 24, ..TaskConfig::new(TaskKind::Mqar) },
                TaskConfig {
                    vocab: 16,
                    pairs: 5,
                    max_hops: 2,
                    queries: 2,
                    ..TaskConfig::new(TaskKind::Multihop)
                },
            ],
            run: TrainConfig { width: 16, steps: 200, batch: 16, test_size: 64, ..d.run },
            ..d
        }
    }
}

/// The result of one (row, task).
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    /// Row label.
    pub row: String,
    /// Task.
    pub task: String,
    /// Test metrics, one per seed.
    pub per_seed: Vec<Metrics>,
    /// Mean test accuracy over seeds (labelled positions), in %.
    pub accuracy: f64,
    /// Mean test sequence accuracy over seeds (copy: whole strings), in %.
    pub sequence_accuracy: f64,
    /// Mean training loss of the first and the last 10 % of steps, per seed.
    pub train_loss_first_last: Vec<(f64, f64)>,
    /// Wall time of the runs, seconds.
    pub wall_s: f64,
    /// The error, if a run failed.
    pub error: Option<String>,
}

/// Every result of [`run`].
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The setting.
    pub setting: Setting,
    /// The rows.
    pub rows: Vec<Row>,
    /// `cells[row][task]`.
    pub cells: Vec<Vec<Cell>>,
    /// Wall time of the whole experiment, seconds.
    pub wall_s: f64,
    /// Worker threads.
    pub jobs: usize,
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 }
}

/// One (row, task): every seed.
fn run_cell(setting: &Setting, row: &Row, task: &TaskConfig) -> Cell {
    let start = Instant::now();
    let mut per_seed = Vec::new();
    let mut first_last = Vec::new();
    let mut error = None;
    for &seed in &setting.seeds {
        let cfg = TrainConfig {
            task: task.clone(),
            mixer: row.mixer.clone(),
            mixer_config: row.config.clone(),
            seed,
            ..setting.run.clone()
        };
        match train(&cfg, &mut |_| {}) {
            Ok((_, log)) => {
                let k = (log.steps.len() / 10).max(1);
                let l: Vec<f64> = log.steps.iter().map(|s| s.loss).collect();
                first_last.push((mean(&l[..k]), mean(&l[l.len() - k..])));
                per_seed.push(log.final_test());
            }
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    let acc: Vec<f64> = per_seed.iter().map(|m| 100.0 * m.accuracy).collect();
    let seq: Vec<f64> = per_seed.iter().map(|m| 100.0 * m.sequence_accuracy).collect();
    Cell {
        row: row.label.clone(),
        task: task.task.name().into(),
        accuracy: mean(&acc),
        sequence_accuracy: mean(&seq),
        per_seed,
        train_loss_first_last: first_last,
        wall_s: start.elapsed().as_secs_f64(),
        error,
    }
}

/// Trains every (row, task) of `rows` on `jobs` threads; `done` is called after each cell.
pub fn run(setting: &Setting, rows: &[Row], jobs: usize, done: &(dyn Fn(&Cell) + Sync)) -> Result<Report> {
    let start = Instant::now();
    let work: Vec<(usize, usize)> =
        (0..rows.len()).flat_map(|r| (0..setting.tasks.len()).map(move |t| (r, t))).collect();
    // The slowest first, so that the threads finish together.
    let mut order = work.clone();
    order.sort_by_key(|&(r, _)| {
        std::cmp::Reverse(
            usize::from(rows[r].mixer.contains("deltanet")) * 2
                + usize::from(rows[r].mixer.contains("dense")),
        )
    });
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Cell>>> = Mutex::new(vec![None; work.len()]);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(&(r, t)) = order.get(i) else { break };
                    let cell = run_cell(setting, &rows[r], &setting.tasks[t]);
                    done(&cell);
                    if let Ok(mut res) = results.lock() {
                        res[r * setting.tasks.len() + t] = Some(cell);
                    }
                }
            });
        }
    });
    let flat = results.into_inner().unwrap_or_default();
    let mut cells = Vec::new();
    let mut it = flat.into_iter();
    for row in rows {
        let mut v = Vec::new();
        for task in &setting.tasks {
            v.push(it.next().flatten().unwrap_or_else(|| Cell {
                row: row.label.clone(),
                task: task.task.name().into(),
                per_seed: vec![],
                accuracy: 0.0,
                sequence_accuracy: 0.0,
                train_loss_first_last: vec![],
                wall_s: 0.0,
                error: Some("not run".into()),
            }));
        }
        cells.push(v);
    }
    Ok(Report {
        setting: setting.clone(),
        rows: rows.to_vec(),
        cells,
        wall_s: start.elapsed().as_secs_f64(),
        jobs,
    })
}

/// Kendall's τ-b between two score lists (ties allowed); `None` with fewer than 2 pairs.
pub fn kendall_tau(a: &[f64], b: &[f64]) -> Option<f64> {
    let n = a.len().min(b.len());
    let (mut c, mut d, mut ta, mut tb) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for i in 0..n {
        for j in i + 1..n {
            let (x, y) = ((a[i] - a[j]).signum(), (b[i] - b[j]).signum());
            let (x, y) = (if a[i] == a[j] { 0.0 } else { x }, if b[i] == b[j] { 0.0 } else { y });
            if x == 0.0 && y == 0.0 {
                continue;
            } else if x == 0.0 {
                ta += 1.0;
            } else if y == 0.0 {
                tb += 1.0;
            } else if x == y {
                c += 1.0;
            } else {
                d += 1.0;
            }
        }
    }
    let den = ((c + d + ta) * (c + d + tb)).sqrt();
    (den > 0.0).then(|| (c - d) / den)
}

fn fmt_opt(x: Option<f64>) -> String {
    x.map_or("—".into(), |v| format!("{v:.2}"))
}

impl Report {
    /// The table in Markdown: ours (accuracy on labelled positions, %) next to the papers'.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let names: Vec<&str> = self.setting.tasks.iter().map(|t| t.task.name()).collect();
        let _ = write!(s, "| structure | mixer |");
        for n in &names {
            let _ = write!(s, " {n} (ours) | {n} (paper) |");
        }
        let _ = writeln!(s, " wall s |");
        let _ = writeln!(s, "|---|---|{}---:|", "---:|---:|".repeat(names.len()));
        for (row, cells) in self.rows.iter().zip(&self.cells) {
            let cfg = if row.config.as_object().is_some_and(|o| o.is_empty()) {
                String::new()
            } else {
                format!(" `{}`", row.config)
            };
            let _ = write!(s, "| {} | `{}`{} |", row.label, row.mixer, cfg);
            for (i, c) in cells.iter().enumerate() {
                let ours = match &c.error {
                    Some(e) => format!("error: {e}"),
                    None if c.task == "copy" => format!("{:.1} ({:.1})", c.accuracy, c.sequence_accuracy),
                    None => format!("{:.1}", c.accuracy),
                };
                let _ = write!(s, " {ours} | {} |", fmt_opt(row.paper_for(self.setting.tasks[i].task)));
            }
            let wall: f64 = cells.iter().map(|c| c.wall_s).sum();
            let _ = writeln!(s, " {wall:.0} |");
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "Ours: test accuracy (%) on labelled positions (copy: characters, whole strings in parentheses), mean over seeds {:?}.",
            self.setting.seeds
        );
        let _ = writeln!(
            s,
            "Paper: Table 1 of the GLR paper (copy, associative recall, multi-hop); MQAR of the log-linear paper for Mamba-2 / gated DeltaNet and their lifts (in the associative-recall column)."
        );
        let _ = writeln!(s);
        for (line, _) in self.ordering() {
            let _ = writeln!(s, "- {line}");
        }
        let _ = writeln!(
            s,
            "\nTotal wall time {:.0} s on {} worker thread{} (setting `{}`).",
            self.wall_s,
            self.jobs,
            if self.jobs == 1 { "" } else { "s" },
            self.setting.name
        );
        s
    }

    /// Lines comparing the ordering with the papers', each with its Kendall τ (or the lift's
    /// gain) as a number.
    pub fn ordering(&self) -> Vec<(String, Option<f64>)> {
        let mut out = Vec::new();
        for (ti, task) in self.setting.tasks.iter().enumerate() {
            let pairs: Vec<(f64, f64)> = self
                .rows
                .iter()
                .zip(&self.cells)
                .filter(|(r, c)| r.source.starts_with("GLR") && c[ti].error.is_none())
                .filter_map(|(r, c)| r.paper_for(task.task).map(|p| (c[ti].accuracy, p)))
                .collect();
            let (a, b): (Vec<f64>, Vec<f64>) = pairs.iter().copied().unzip();
            let tau = kendall_tau(&a, &b);
            out.push((
                format!(
                    "{}: Kendall τ between our accuracies and Table 1's over its {} structures: {}",
                    task.task.name(),
                    pairs.len(),
                    tau.map_or("—".into(), |t| format!("{t:.2}"))
                ),
                tau,
            ));
        }
        // The lifts on MQAR.
        if let Some(ti) = self.setting.tasks.iter().position(|t| t.task == TaskKind::Mqar) {
            for (base, lift) in
                [("mamba2", "loglinear-mamba2"), ("gated-deltanet", "loglinear-gated-deltanet")]
            {
                let find = |m: &str| self.rows.iter().position(|r| r.mixer == m).map(|i| &self.cells[i][ti]);
                if let (Some(b), Some(l)) = (find(base), find(lift)) {
                    let gain = l.accuracy - b.accuracy;
                    out.push((
                        format!(
                            "mqar: {lift} − {base} = {gain:+.1} points (paper: {})",
                            if base == "mamba2" { "+3.3" } else { "+5.4" }
                        ),
                        Some(gain),
                    ));
                }
            }
        }
        out
    }

    /// The report as JSON (setting, rows with the papers' numbers, every cell's metrics).
    pub fn json(&self) -> Value {
        json!({
            "setting": self.setting,
            "rows": self.rows,
            "cells": self.cells,
            "ordering": self.ordering().into_iter().map(|(l, v)| json!({"line": l, "value": v})).collect::<Vec<_>>(),
            "wall_s": self.wall_s,
            "jobs": self.jobs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kendall_tau_orders() {
        assert_eq!(kendall_tau(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]), Some(1.0));
        assert_eq!(kendall_tau(&[1.0, 2.0, 3.0], &[30.0, 20.0, 10.0]), Some(-1.0));
        assert_eq!(kendall_tau(&[1.0], &[1.0]), None);
    }
}
