//! Softmax attention (docs/math.md §1.3): `attention` and `local-attention`.

use mixer_core::Result;
use mixer_core::mixer::Mixer;
use mixer_core::mixers::attention::Attention;

fn build(name: &str, cfg: &serde_json::Value) -> Result<Box<dyn Mixer>> {
    Ok(Box::new(Attention::from_json(name, cfg)?))
}

super::mixer_entries! {
    family: "attention", build: build;
    ATTENTION = "attention",
        "causal softmax attention, optional window: A = softmax(σ q·k) on s ≤ t, t − s < w",
        ["{}", r#"{"window": 9, "scale": 0.3}"#];
    LOCAL_ATTENTION = "local-attention",
        "sliding-window softmax attention (window w, default 64): O(T·w) and a cache of w tokens",
        ["{}", r#"{"window": 5}"#];
}
