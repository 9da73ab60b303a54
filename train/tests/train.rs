//! Training: the `--quick` expressivity setting on a reduced set of structures (every family,
//! every task) must lower the training loss; the README's training example is the tested
//! example file and runs.

use mixers_train::expressivity::{Setting, rows, run};

/// `train/examples/train_copy.rs`, the README's training example, with a way to call its `main`.
mod train_copy {
    include!("../examples/train_copy.rs");

    pub fn run() -> Result<(), mixers::prelude::Error> {
        main()
    }
}

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
fn readme_training_example_is_the_tested_example() {
    let readme = include_str!("../../README.md");
    let example = include_str!("../examples/train_copy.rs");
    // `ignore` there: the README's doc-tests are the library's, which does not link this crate.
    let block = format!("```rust,ignore\n{example}```");
    assert!(
        readme.contains(&block),
        "README.md's \"Training small models\" block must be train/examples/train_copy.rs verbatim"
    );
    train_copy::run().unwrap();
}
