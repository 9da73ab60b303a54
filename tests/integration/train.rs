//! Training: the `--quick` expressivity setting on a reduced set of structures (every family,
//! every task) must lower the training loss; `mixers train` writes its log, plot and a
//! checkpoint that loads back to the same outputs.

use mixers::train::expressivity::{Setting, rows, run};
use mixers::train::{Split, TrainLog, checkpoint};

#[test]
fn quick_expressivity_lowers_the_loss() {
    let mut setting = Setting::quick();
    setting.run.steps = 40;
    setting.run.test_size = 16;
    let keep = ["attention", "f(k) = k²+1 + cache-eff", "Log-linear Mamba-2", "Gated DeltaNet", "Toeplitz"];
    let all: Vec<_> = rows(setting.window, setting.order)
        .into_iter()
        .filter(|r| keep.contains(&r.label.as_str()) || keep.contains(&r.mixer.as_str()))
        .collect();
    assert_eq!(all.len(), keep.len());
    let report = run(&setting, &all, 2, &|_| {}).unwrap();
    for cell in report.cells.iter().flatten() {
        assert!(cell.error.is_none(), "{} on {}: {:?}", cell.row, cell.task, cell.error);
        for &(first, last) in &cell.train_loss_first_last {
            assert!(
                last < first,
                "{} on {}: training loss went from {first:.3} to {last:.3}",
                cell.row,
                cell.task
            );
        }
    }
    let md = report.markdown();
    assert!(md.contains("| Attention |") && md.contains("Kendall"), "{md}");
}

#[test]
fn the_train_command_writes_log_plot_and_a_checkpoint() {
    let dir = std::env::temp_dir().join(format!("mixers-train-{}", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mixers"))
        .args(["train", "--task", "multihop", "--mixer", "glr", "--config", r#"{"pattern": "pow2"}"#])
        .args([
            "--task-config",
            r#"{"pairs": 4, "max_hops": 2, "vocab": 12}"#,
            "--steps",
            "4",
            "--width",
            "8",
        ])
        .args(["--batch", "4", "--test-size", "4", "--eval-every", "2", "--quiet", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("per group: 1 hop"), "{stdout}");
    let log: TrainLog =
        serde_json::from_str(&std::fs::read_to_string(dir.join("multihop-glr.json")).unwrap()).unwrap();
    assert_eq!((log.steps.len(), log.evals.len()), (4, 2));
    assert!(std::fs::read_to_string(dir.join("multihop-glr.svg")).unwrap().starts_with("<svg"));
    let model = checkpoint::load(&dir.join("multihop-glr.safetensors")).unwrap();
    let b = log.config.task.batch(1, 2, Split::Test).unwrap();
    let m = mixers::train::Model::from_params(log.config.model(), model.params.clone()).unwrap();
    assert_eq!(model.logits(&b.tokens, 2).unwrap(), m.logits(&b.tokens, 2).unwrap());
    std::fs::remove_dir_all(&dir).ok();

    // Bad input is a one-line error.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mixers"))
        .args(["train", "--task", "sorting", "--mixer", "attention"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.starts_with("error: unknown task `sorting`") && !err.contains("panicked"), "{err}");
}
