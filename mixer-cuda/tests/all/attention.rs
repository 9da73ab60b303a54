//! Attention and local attention on CUDA (fast = tiled online softmax, recurrent = device KV
//! cache) against the f64 oracle and the CPU forms.

use super::common;

use mixer_core::Form;
use mixer_registry::Sizes;

const WANT: [Form; 2] = [Form::Fast, Form::Recurrent];

#[test]
#[ignore = "needs a CUDA device"]
fn attention_cuda_small_heads() {
    if !common::gpu() {
        return;
    }
    for (name, cfg) in [
        ("attention", "{}"),
        ("attention", r#"{"window": 9, "scale": 0.3}"#),
        ("local-attention", "{}"),
        ("local-attention", r#"{"window": 5}"#),
    ] {
        common::cross_check(name, cfg, &common::sizes(&[1, 37, 100]), &WANT);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_cuda_several_tiles() {
    if !common::gpu() {
        return;
    }
    // Dk = 64, Dv = 48: several query and key tiles (f64 tiles hold 27 rows), T not a multiple.
    let s = [Sizes { batch: 2, seq: 203, channels: 1, heads: 3, dk: 64, dv: 48 }];
    common::cross_check("attention", "{}", &s, &WANT);
    common::cross_check("local-attention", r#"{"window": 40}"#, &s, &WANT);
}
