//! Regression benches (divan) of each family's hot path on the CPU: one fast form per family
//! at a moderate, non-power-of-two `T`, one decode step after a prefix, a packed batch of
//! sequences of random lengths, and the `fast` backward of one sequence and of the packed batch.
//!
//! `cargo bench --bench regression` (a few minutes on 2 cores); filter with a substring,
//! e.g. `cargo bench --bench regression -- decode`. A mixer that is not registered in this
//! build is reported on stderr and left out.

use divan::Bencher;
use mixers::core::mixer::{Decoder, Mixer, validate};
use mixers::core::state::StateVjp;
use mixers::core::tensor::{cast_tensors, token_slice};
use mixers::prelude::*;
use mixers::registry::run::{decoder, run};

fn main() {
    divan::main();
}

/// Sequence length of the fast-form benches.
const T: usize = 1500;
/// Tokens fed before the timed decode step.
const PREFIX: usize = 700;

/// One mixer per family (and the delta-rule variant, whose chunk form is the costliest).
const MIXERS: &[&str] =
    &["glr pow2", "attention", "mamba2", "gated-deltanet", "loglinear-mamba2", "toeplitz"];

fn config(label: &str) -> (&str, serde_json::Value) {
    match label {
        "glr pow2" => ("glr", serde_json::json!({"pattern": "pow2"})),
        "toeplitz" => ("toeplitz", serde_json::json!({"heads": 2})),
        other => (other, serde_json::json!({})),
    }
}

/// The mixer and `f32` inputs with `B = 1, H = 2, Dk = Dv = 32, C = 64`, or `None` (with a
/// note on stderr) where the mixer is not available here.
fn setup(label: &str, seq: usize) -> Option<(Box<dyn Mixer>, Tensors<f32>)> {
    let (name, cfg) = config(label);
    let sizes = Sizes { batch: 1, seq, channels: 64, heads: 2, dk: 32, dv: 32 };
    match mixers::registry::mixer(name, &cfg).and_then(|m| m.random_inputs(&sizes.dims(), 0).map(|x| (m, x)))
    {
        Ok((m, x)) => Some((m, cast_tensors::<f32>(&x))),
        Err(e) => {
            eprintln!("regression: {label} left out: {e}");
            None
        }
    }
}

#[divan::bench(args = MIXERS, sample_count = 20)]
fn fast(bencher: Bencher, label: &str) {
    let Some((m, x)) = setup(label, T) else { return };
    let x = AnyTensors::F32(x);
    let cpu = Backend::by_name("cpu").expect("the cpu backend is linked");
    if let Err(e) = run(m.as_ref(), &cpu, Form::Fast, &x) {
        eprintln!("regression: {label} fast left out: {e}");
        return;
    }
    bencher.bench_local(|| run(m.as_ref(), &cpu, Form::Fast, &x));
}

#[divan::bench(args = MIXERS, sample_count = 30, sample_size = 2)]
fn decode_step(bencher: Bencher, label: &str) {
    let Some((m, x)) = setup(label, PREFIX + 1) else { return };
    let dims = match validate(m.as_ref(), &AnyTensors::F32(x.clone())) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("regression: {label} inputs rejected: {e}");
            return;
        }
    };
    let per_token = m.spec().per_token();
    let cpu = Backend::by_name("cpu").expect("the cpu backend is linked");
    let primed = || -> Result<Box<dyn Decoder<f32>>> {
        let mut d = decoder::<f32>(m.as_ref(), &cpu, &x, &dims)?;
        for t in 0..PREFIX {
            d.step(&token_slice(&x, &per_token, t))?;
        }
        Ok(d)
    };
    if let Err(e) = primed() {
        eprintln!("regression: {label} decoder left out: {e}");
        return;
    }
    let last = token_slice(&x, &per_token, PREFIX);
    bencher
        .with_inputs(|| primed().expect("priming succeeded once with the same inputs"))
        .bench_local_values(|mut d| d.step(&last));
}

/// The packed-batch offsets of the `packed` benches: 12 sequences of pseudo-random lengths
/// (between 1 and 2T/12) filling the first `T` rows.
fn offsets(t: usize) -> Vec<usize> {
    let n = 12;
    let w: Vec<usize> = (0..n).map(|i| 1 + (i * 7919 + 13) % (2 * t / n)).collect();
    let total: usize = w.iter().sum();
    let mut cu = vec![0];
    for (i, x) in w.iter().enumerate() {
        let next = if i + 1 == n { t } else { (cu[i] + x * t / total).min(t) };
        cu.push(next);
    }
    cu
}

/// A packed batch of 12 sequences of random lengths with `T` rows in all, by the fast form:
/// compare with `fast` (one sequence of length `T`) for the cost of packing (docs/math.md §7.2).
#[divan::bench(args = ["attention", "mamba2", "gated-deltanet"], sample_count = 20)]
fn packed(bencher: Bencher, label: &str) {
    let Some((m, x)) = setup(label, T) else { return };
    let cpu = Backend::by_name("cpu").expect("the cpu backend is linked");
    let cu = offsets(T);
    let go = || {
        mixers::registry::packed::run_packed(
            m.as_ref(),
            &cpu,
            Form::Fast,
            &x,
            &cu,
            None,
            false,
            mixers::core::Precision::Exact,
        )
    };
    timed(bencher, label, "packed", go);
}

/// Times `go` when a first call succeeds; otherwise notes on stderr that `label`'s `what` is
/// left out.
fn timed<T, E: std::fmt::Display>(
    bencher: Bencher,
    label: &str,
    what: &str,
    go: impl Fn() -> std::result::Result<T, E>,
) {
    if let Err(e) = go() {
        eprintln!("regression: {label} {what} left out: {e}");
        return;
    }
    bencher.bench_local(go);
}

/// The mixers whose `fast` backward the `backward` and `packed_backward` benches time.
const BACKWARD: &[&str] = &["mamba2", "gated-deltanet"];

/// The `fast` backward of one sequence of length `T` (`dy` all ones).
#[divan::bench(args = BACKWARD, sample_count = 20)]
fn backward(bencher: Bencher, label: &str) {
    let Some((m, x)) = setup(label, T) else { return };
    let dy = ndarray::ArrayD::<f32>::ones(x[m.spec().mixed].raw_dim());
    let (x, dy) = (AnyTensors::F32(x), Tensor::F32(dy));
    timed(bencher, label, "backward", || {
        mixers::registry::backward::backward(m.as_ref(), "cpu", Form::Fast, &x, &dy, &Requires::All)
    });
}

/// The `fast` backward of the `packed` benches' batch: compare with `backward` (docs/math.md
/// §7.2).
#[divan::bench(args = BACKWARD, sample_count = 20)]
fn packed_backward(bencher: Bencher, label: &str) {
    let Some((m, x)) = setup(label, T) else { return };
    let cpu = Backend::by_name("cpu").expect("the cpu backend is linked");
    let cu = offsets(T);
    let dy = ndarray::ArrayD::<f32>::ones(x[m.spec().mixed].raw_dim());
    let go = || {
        let args = StateVjp { x: &x, initial: None, dy: &dy, d_final: None, requires: &Requires::All };
        mixers::registry::packed::backward_packed(m.as_ref(), &cpu, Form::Fast, &cu, args)
    };
    timed(bencher, label, "packed backward", go);
}
