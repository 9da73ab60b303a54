// Trains a small Mamba-2 model on the copy task, saves a checkpoint and loads it back (crate
// `mixers-train`). Run: cargo run --release --example train_copy
use mixers_train::{TaskConfig, TaskKind, TrainConfig, checkpoint, train};

fn main() -> Result<(), mixers::prelude::Error> {
    let task = TaskConfig { max_len: 4, ..TaskConfig::new(TaskKind::Copy) };
    let cfg = TrainConfig {
        task,
        mixer: "mamba2".into(),
        width: 16,
        steps: 20,
        batch: 8,
        test_size: 16,
        ..TrainConfig::default()
    };
    let (model, log) = train(&cfg, &mut |_| {})?;
    let first = log.steps[0].loss;
    let last = log.steps.last().map_or(first, |s| s.loss);
    println!("loss {first:.3} → {last:.3}, test accuracy {:.3}", log.final_test().accuracy);

    let path = std::env::temp_dir().join("readme-model.safetensors");
    checkpoint::save(&model, &path)?;
    let back = checkpoint::load(&path)?;
    assert_eq!(back.params, model.params);
    Ok(())
}
