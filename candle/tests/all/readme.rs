//! The README's candle block is `examples/quickstart.rs` verbatim (the file is run as a
//! doc-test of the crate, so the README's code runs too).

#[test]
fn the_readme_candle_block_is_the_quickstart_example() {
    let readme = include_str!("../../../README.md");
    let block = concat!("```rust,ignore\n", include_str!("../../examples/quickstart.rs"), "```");
    assert!(
        readme.contains(block),
        "README.md's candle block must be candle/examples/quickstart.rs verbatim"
    );
}
