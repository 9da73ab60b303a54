//! The shared backend suite (`mixer_registry::suite`) on the CPU: every registered mixer with
//! its example configurations (builtins and the linked example plugin), and a check that the
//! suite fails a backend that is wrong in known ways.

use std::any::Any;
use std::sync::Arc;

use mixer_core::materialize::Materialization;
use mixer_core::mixer::{Decoder, Mixer, check_decoder_capacity};
use mixer_core::spec::{Dim, InputDecl, InputSpec};
use mixer_core::tensor::{contiguous, get};
use mixer_core::{Dims, DimsExt, Error, Form, Real, Requires, Result, Tensors};
use mixer_registry::harness::Sizes;
use mixer_registry::suite::{Check, assert_backend, check_mixer, registered_configs, tally};
use mixer_registry::{BackwardFn, DecoderFn, Family, FamilyEntry, FormFn, register};
use ndarray::{Array2, ArrayD, Axis, IxDyn};

use super::cpu;

#[test]
fn every_registered_mixer_passes_the_shared_suite() {
    let cases = assert_backend("cpu");
    let configs = registered_configs();
    // Every configuration gets the oracle, f32-vs-f64 and error checks.
    assert!(configs.len() >= 30, "{} configurations", configs.len());
    let t = tally(&cases);
    for (check, _, total) in &t {
        assert!(*total > 0, "no {} case ran", check.name());
    }
    let errors = t.iter().find(|(c, _, _)| *c == Check::Errors).map_or(0, |x| x.2);
    assert_eq!(errors, 4 * configs.len(), "one error case per form and configuration");
    // The log-distance plugin mask has no fast or recurrent form: they were reported
    // unavailable (the errors check), not run.
    let plugin: Vec<_> = cases.iter().filter(|c| c.config.contains("log-distance")).collect();
    assert!(
        plugin.iter().any(|c| c.form == Form::Fast && c.check == Check::Errors),
        "the plugin mixer was not checked"
    );
    assert!(!plugin.iter().any(|c| c.form == Form::Fast && c.check == Check::Oracle), "its fast form ran");
}

/// `y_t = x_t + ½ y_{t−1}` per batch row and channel (`A = I`, `B = ½` on the subdiagonal),
/// with a CPU implementation that is wrong in known ways (see [`Broken`]). Not registered as
/// a mixer, so the registry-wide suite above does not see it.
#[derive(Debug)]
struct Ema;

impl Mixer for Ema {
    fn name(&self) -> &str {
        "suite-test-ema"
    }
    fn family(&self) -> &'static str {
        "suite-test-ema"
    }
    fn config(&self) -> serde_json::Value {
        serde_json::json!({})
    }
    fn spec(&self) -> InputSpec {
        InputSpec {
            inputs: vec![InputDecl::new("x", vec![Dim::Sym("B"), Dim::Sym("T"), Dim::Sym("C")])],
            mixed: "x",
        }
    }
    fn materialize(&self, inputs: &Tensors<f64>) -> Result<Materialization> {
        let x = get(inputs, "x")?;
        let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let mut r = Array2::<f64>::zeros((t, t));
        for i in 1..t {
            r[[i, i - 1]] = 0.5;
        }
        let (a, r) = (Arc::new(Array2::<f64>::eye(t)), Arc::new(r));
        let mut m = Materialization::new(t);
        for bi in 0..b {
            m.push(bi, 0..c, a.clone(), Some(r.clone()));
        }
        Ok(m)
    }
    /// One state of `B × C` after the first token.
    fn decoder_cache(&self, dims: &Dims, _consumed: usize) -> Option<usize> {
        Some(dims.get("B")? * dims.get("C")?)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A correct `fast` form.
fn fast<F: Real>(_: &Ema, x: &Tensors<F>) -> Result<ArrayD<F>> {
    let mut y = get(x, "x")?.clone();
    for t in 1..y.shape()[1] {
        let prev = y.index_axis(Axis(1), t - 1).to_owned();
        y.index_axis_mut(Axis(1), t).zip_mut_with(&prev, |a, &p| *a += F::of(0.5) * p);
    }
    Ok(y)
}

/// A decoder that drifts from token 5 on, reports twice its cache, and never runs out.
struct Broken<F> {
    state: Vec<F>,
    shape: [usize; 2],
    pos: usize,
}

impl<F: Real> Decoder<F> for Broken<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        let x = contiguous(token, "x", &self.shape)?;
        let drift = if self.pos >= 5 { F::of(1e-3) } else { F::zero() };
        for (s, &v) in self.state.iter_mut().zip(x.iter()) {
            *s = v + F::of(0.5) * *s + drift;
        }
        self.pos += 1;
        ArrayD::from_shape_vec(IxDyn(&self.shape), self.state.clone())
            .map_err(|e| Error::Decoder(e.to_string()))
    }
    fn cache_elems(&self) -> usize {
        2 * self.state.len()
    }
    fn position(&self) -> usize {
        self.pos
    }
}

/// A correct decoder, for the control run.
struct Right<F> {
    state: Vec<F>,
    shape: [usize; 2],
    t_len: usize,
    pos: usize,
}

impl<F: Real> Decoder<F> for Right<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        check_decoder_capacity(self.pos, self.t_len)?;
        let x = contiguous(token, "x", &self.shape)?;
        for (s, &v) in self.state.iter_mut().zip(x.iter()) {
            *s = v + F::of(0.5) * *s;
        }
        self.pos += 1;
        ArrayD::from_shape_vec(IxDyn(&self.shape), self.state.clone())
            .map_err(|e| Error::Decoder(e.to_string()))
    }
    fn cache_elems(&self) -> usize {
        self.state.len()
    }
    fn position(&self) -> usize {
        self.pos
    }
}

/// The EMA on CPU with the broken decoder.
struct BrokenCpu;

impl<F: Real> Family<F> for BrokenCpu {
    type Mixer = Ema;
    fn fast(&self) -> Option<FormFn<Ema, F>> {
        Some(fast)
    }
    fn decoder(&self) -> Option<DecoderFn<Ema, F>> {
        Some(|_, _, dims| {
            let shape = [dims.size("B")?, dims.size("C")?];
            Ok(Box::new(Broken::<F> { state: vec![F::zero(); shape[0] * shape[1]], shape, pos: 0 }))
        })
    }
}

#[register]
static BROKEN_CPU: FamilyEntry =
    FamilyEntry { family: "suite-test-ema", backend: "cpu", f64: &BrokenCpu, f32: &BrokenCpu, device: None };

/// The same mixer under another family key, with the correct decoder.
#[derive(Debug)]
struct EmaRight;

impl Mixer for EmaRight {
    fn name(&self) -> &str {
        "suite-test-ema-right"
    }
    fn family(&self) -> &'static str {
        "suite-test-ema-right"
    }
    fn config(&self) -> serde_json::Value {
        Ema.config()
    }
    fn spec(&self) -> InputSpec {
        Ema.spec()
    }
    fn materialize(&self, inputs: &Tensors<f64>) -> Result<Materialization> {
        Ema.materialize(inputs)
    }
    fn decoder_cache(&self, dims: &Dims, consumed: usize) -> Option<usize> {
        Ema.decoder_cache(dims, consumed)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct RightCpu;

/// The EMA's backward: `x̄_t = ȳ_t + ½ x̄_{t+1}` (the recurrence run backwards).
fn ema_backward<F: Real>(_: &EmaRight, _x: &Tensors<F>, dy: &ArrayD<F>, _: &Requires) -> Result<Tensors<F>> {
    let mut dx = dy.clone();
    for t in (0..dy.shape()[1].saturating_sub(1)).rev() {
        let next = dx.index_axis(Axis(1), t + 1).to_owned();
        dx.index_axis_mut(Axis(1), t).zip_mut_with(&next, |a, &n| *a += F::of(0.5) * n);
    }
    Ok([("d_x".to_string(), dx)].into_iter().collect())
}

impl<F: Real> Family<F> for RightCpu {
    type Mixer = EmaRight;
    fn fast(&self) -> Option<FormFn<EmaRight, F>> {
        Some(|_, x| fast(&Ema, x))
    }
    /// The same backward for `fast` and `parallel`; `parallel` is then refused per
    /// configuration, to check that the registry honours `backward_unsupported`.
    fn backward(&self, form: Form) -> Option<BackwardFn<EmaRight, F>> {
        matches!(form, Form::Fast | Form::Parallel).then_some(ema_backward)
    }
    fn backward_unsupported(&self, _: &EmaRight, form: Form) -> Option<String> {
        (form == Form::Parallel).then(|| "suite-test: no parallel backward for this configuration".into())
    }
    fn decoder(&self) -> Option<DecoderFn<EmaRight, F>> {
        Some(|_, _, dims| {
            let shape = [dims.size("B")?, dims.size("C")?];
            let t_len = dims.size("T")?;
            Ok(Box::new(Right::<F> { state: vec![F::zero(); shape[0] * shape[1]], shape, t_len, pos: 0 }))
        })
    }
}

#[register]
static RIGHT_CPU: FamilyEntry = FamilyEntry {
    family: "suite-test-ema-right",
    backend: "cpu",
    f64: &RightCpu,
    f32: &RightCpu,
    device: None,
};

/// The suite fails exactly the checks a wrong decoder breaks, and passes the same mixer with
/// a correct decoder: its checks can fail.
#[test]
fn the_suite_fails_a_wrong_decoder_and_passes_a_right_one() {
    let sizes = Sizes { batch: 2, seq: 11, channels: 3, ..Sizes::default() };
    let failed = |m: &dyn Mixer| -> Vec<(Check, Form)> {
        check_mixer(m, &cpu(), &sizes, 3)
            .into_iter()
            .filter(|c| c.failure.is_some())
            .map(|c| (c.check, c.form))
            .collect()
    };
    assert_eq!(failed(&EmaRight), vec![], "the correct implementation passes");
    let mut bad = failed(&Ema);
    bad.sort();
    bad.dedup();
    assert_eq!(
        bad,
        vec![
            (Check::Oracle, Form::Recurrent),
            (Check::Prefix, Form::Recurrent),
            (Check::Cache, Form::Recurrent),
            (Check::Errors, Form::Recurrent),
            (Check::Packed, Form::Recurrent),
        ],
        "drift (oracle, prefix), the cache count, and no capacity check"
    );
}

/// A backend adds a backward form through its `Family` implementation: the registry lists it,
/// runs it (validating `dy`), and refuses what `backward_unsupported` and unimplemented forms
/// rule out, naming the reason.
#[test]
fn a_family_backward_is_listed_run_and_refused_through_the_registry() {
    use mixer_core::{AnyTensors, Tensor};
    use mixer_registry::backward::{backward, backward_forms};
    assert_eq!(backward_forms(&EmaRight, "cpu"), vec![Form::Fast]);
    assert_eq!(backward_forms(&EmaRight, "no-such-backend"), vec![]);
    let (b, t, c) = (2, 9, 3);
    let x = ArrayD::from_shape_fn(IxDyn(&[b, t, c]), |i| (i[0] + 2 * i[1] + 3 * i[2]) as f64 * 0.1);
    let dy = ArrayD::from_shape_fn(IxDyn(&[b, t, c]), |i| ((i[0] * 7 + i[1] * 3 + i[2]) % 5) as f64 - 2.0);
    let inputs = AnyTensors::F64([("x".to_string(), x)].into_iter().collect());
    let g =
        backward(&EmaRight, "cpu", Form::Fast, &inputs, &Tensor::F64(dy.clone()), &Requires::All).unwrap();
    let Tensor::F64(dx) = &g["d_x"] else { panic!("f64 in, f64 out") };
    // x̄_t = Σ_{s ≥ t} 2^{−(s−t)} ȳ_s, summed directly.
    for (bi, ti, ci) in (0..b).flat_map(|bi| (0..t).flat_map(move |ti| (0..c).map(move |ci| (bi, ti, ci)))) {
        let want: f64 = (ti..t).map(|s| 0.5f64.powi((s - ti) as i32) * dy[[bi, s, ci]]).sum();
        assert!((dx[[bi, ti, ci]] - want).abs() < 1e-12, "({bi}, {ti}, {ci})");
    }
    let e = backward(&EmaRight, "cpu", Form::Parallel, &inputs, &Tensor::F64(dy.clone()), &Requires::All)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no parallel backward for this configuration") && e.contains("fast"), "{e}");
    let e = backward(&EmaRight, "cpu", Form::Recurrent, &inputs, &Tensor::F64(dy.clone()), &Requires::All)
        .unwrap_err()
        .to_string();
    assert!(e.contains("recurrent (backward)"), "{e}");
    let short = Tensor::F64(dy.slice(ndarray::s![.., ..4, ..]).to_owned().into_dyn());
    assert!(backward(&EmaRight, "cpu", Form::Fast, &inputs, &short, &Requires::All).is_err());
}
