//! Softmax attention (docs/math.md §1.3): `attention` and `local-attention`.

use mixer_core::Result;
use mixer_core::mixer::Mixer;
use mixer_core::mixers::attention::Attention;

use crate::entries::MixerEntry;
use crate::register;

fn build(name: &str, cfg: &serde_json::Value) -> Result<Box<dyn Mixer>> {
    Ok(Box::new(Attention::from_json(name, cfg)?))
}

#[register]
static ATTENTION: MixerEntry = MixerEntry {
    name: "attention",
    family: "attention",
    doc: "causal softmax attention, optional window: A = softmax(σ q·k) on s ≤ t, t − s < w",
    build,
    examples: &["{}", r#"{"window": 9, "scale": 0.3}"#],
};

#[register]
static LOCAL_ATTENTION: MixerEntry = MixerEntry {
    name: "local-attention",
    family: "attention",
    doc: "sliding-window softmax attention (window w, default 64): O(T·w) and a cache of w tokens",
    build,
    examples: &["{}", r#"{"window": 5}"#],
};
