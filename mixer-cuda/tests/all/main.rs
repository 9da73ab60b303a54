//! The CUDA backend's integration tests, in one test binary. Every test that needs a GPU (or
//! NVRTC) is `#[ignore]`d, so that `cargo test` reports it as ignored rather than passed;
//! on a machine with a GPU run them with
//! `MIXERS_REQUIRE_CUDA=1 cargo test -p mixer-cuda --test all -- --include-ignored`
//! (`MIXERS_REQUIRE_CUDA=1` turns "no device, skipped" into a failure).

mod attention;
mod attention_state;
mod backward;
mod common;
mod decoder_state;
mod device;
mod device_bf16;
mod device_packed;
mod device_state;
mod errors_and_scale;
mod glr;
mod lift_state;
mod loglinear;
mod loglinear_backward;
mod loglinear_backward_lift;
mod loglinear_backward_state;
mod loglinear_state_modes;
mod loglinear_walk;
mod runtime;
mod state_grads;
mod states_extension;
mod streams;
mod suite;
mod toeplitz;

use mixer_cpu as _;
use mixers_plugin_fibonacci as _;
