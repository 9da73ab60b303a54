//! The crate's example (an fla-style gated DeltaNet layer) trains: its loss goes down.

#[allow(dead_code)]
#[path = "../../examples/gated_deltanet_layer.rs"]
pub mod layer;

#[test]
fn the_gated_deltanet_layer_example_learns_the_previous_token_task() {
    assert_learns(&candle_core::Device::Cpu);
}

/// Trains the example layer on `device` for 40 steps, without and with the short convolution,
/// and asserts finite losses whose last three average below half the first three's.
pub fn assert_learns(device: &candle_core::Device) {
    for short_conv in [false, true] {
        let c = layer::Config { short_conv, device: device.clone(), ..Default::default() };
        let losses = layer::train(&c, 40, 2e-2, 1, false).unwrap();
        let first: f32 = losses[..3].iter().sum::<f32>() / 3.0;
        let last: f32 = losses[losses.len() - 3..].iter().sum::<f32>() / 3.0;
        assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
        assert!(
            last < 0.5 * first,
            "short_conv = {short_conv}: the loss went from {first} to {last}: {losses:?}"
        );
    }
}
