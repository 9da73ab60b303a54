//! `mixers train` writes its log, plot and a checkpoint that loads back to the same outputs.

use mixers_train::{Split, TrainLog, checkpoint};

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
    let m = mixers_train::Model::from_params(log.config.model(), model.params.clone()).unwrap();
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
