//! The Toeplitz mixer (docs/math.md §3): per-head causal convolution over the sequence, optional
//! channel-shift kernel width and position bias.

use mixer_core::Result;
use mixer_core::mixer::Mixer;
use mixer_core::mixers::toeplitz::Toeplitz;

fn build(name: &str, config: &serde_json::Value) -> Result<Box<dyn Mixer>> {
    Ok(Box::new(Toeplitz::from_json(name, config)?))
}

super::mixer_entries! {
    family: "toeplitz", build: build;
    TOEPLITZ = "toeplitz",
        "Toeplitz MLP mixer: y[t,c] = Σ_{s≤t} w[h(c), t−s]·x[s,c] (+ bias[h,t]); FFT prefill, \
         online O(log² t) decoding",
        [
            r#"{}"#,
            r#"{"heads": 2}"#,
            r#"{"heads": 3, "kernel_width": 2}"#,
            r#"{"heads": 1, "kernel_width": 4, "decoder": "naive"}"#,
        ];
}
