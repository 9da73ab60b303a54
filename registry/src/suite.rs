//! The shared backend test suite: every check a backend must pass, run for every registered
//! mixer (builtins and linked plugins, each with its registered example configurations) on a
//! given backend. A backend crate runs it with one test ([`assert_backend`]); a new backend or
//! a plugin mixer gets the whole suite by registering.
//!
//! Checks, per mixer configuration (see [`Check`]):
//! - `oracle`: every form the backend can run, in `f64` and `f32`, against the `f64`
//!   materialized oracle (the [`check`] harness);
//! - `f32-vs-f64`: each form in `f32` against the same form in `f64` on the same backend;
//! - `prefix`: the decoder's outputs over the whole sequence equal, at every prefix length
//!   `1..=T`, the `fast` form (else `parallel`, else the oracle) run on that prefix
//!   ([`Mixer::prefix`]), in `f64` and `f32`;
//! - `cache`: the decoder's [`Decoder::cache_elems`](mixer_core::Decoder::cache_elems) after
//!   every token against the mixer's formula ([`Mixer::decoder_cache`]), when it has one;
//! - `errors`: a mixed input of the wrong shape is an error for every form, a per-token input
//!   of the wrong shape and a step past `T` are decoder errors, and every form the backend
//!   cannot run is [`Error::FormUnavailable`] — never a panic, never an output;
//! - `state` and `packed`: runs from a state and packed batches ([`crate::suite_state`]).

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

use mixer_core::mixer::{Mixer, complete_dims, run_decoder};
use mixer_core::tensor::{cast_tensors, token_slice};
use mixer_core::{AnyTensors, DType, Dims, Error, Form, Tolerance};
use ndarray::{ArrayD, Axis, IxDyn, Slice};
use serde::Serialize;

use crate::backend::Backend;
use crate::harness::{Sizes, check};
use crate::run::{decoder, forms, run_as};
use crate::suite_state::{packed_check, state_check};
use crate::{MIXERS, mixer};

/// What a [`Case`] checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    /// A form against the `f64` oracle.
    Oracle,
    /// A form in `f32` against the same form in `f64`.
    F32VsF64,
    /// Decoder outputs against a form run on every prefix.
    Prefix,
    /// Decoder cache size against the mixer's formula.
    Cache,
    /// Error paths: wrong shapes, steps past `T`, unavailable forms.
    Errors,
    /// Runs from a state against the reference, split sequences, gradients through the state.
    State,
    /// Packed batches against the sequences run one by one.
    Packed,
}

impl Check {
    /// Every check, in report order.
    pub const ALL: [Check; 7] = [
        Check::Oracle,
        Check::F32VsF64,
        Check::Prefix,
        Check::Cache,
        Check::Errors,
        Check::State,
        Check::Packed,
    ];
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Check::Oracle => "oracle",
            Check::F32VsF64 => "f32-vs-f64",
            Check::Prefix => "prefix",
            Check::Cache => "cache",
            Check::Errors => "errors",
            Check::State => "state",
            Check::Packed => "packed",
        }
    }
}

/// One checked case: a mixer configuration, a backend, a form, a scalar type and a check.
#[derive(Clone, Debug, Serialize)]
pub struct Case {
    /// Mixer name.
    pub mixer: String,
    /// Its configuration (JSON).
    pub config: String,
    /// Backend name.
    pub backend: String,
    /// The form checked.
    pub form: Form,
    /// The scalar type.
    pub dtype: DType,
    /// The check.
    pub check: Check,
    /// Why it failed, or `None` when it passed.
    pub failure: Option<String>,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} on {}: {} {} {}: {}",
            self.mixer,
            self.config,
            self.backend,
            self.check.name(),
            self.form,
            self.dtype.name(),
            self.failure.as_deref().unwrap_or("ok")
        )
    }
}

/// Runs `f`, turning a panic into an error message (a panic is a failure, not an abort of the
/// whole suite).
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown payload".into());
        Err(format!("panicked: {msg}"))
    })
}

/// The reference form for the prefix check: `fast`, else `parallel`, else `materialized`.
fn reference_form(have: &[Form]) -> Form {
    [Form::Fast, Form::Parallel].into_iter().find(|f| have.contains(f)).unwrap_or(Form::Materialized)
}

/// `x` with one more (trailing, length-1) axis: the same values in a shape of the wrong rank,
/// which no form may accept.
fn reranked(x: &ArrayD<f64>) -> ArrayD<f64> {
    let mut shape = x.shape().to_vec();
    shape.push(1);
    x.to_shape(IxDyn(&shape)).map(|v| v.to_owned()).unwrap_or_else(|_| ArrayD::zeros(IxDyn(&shape)))
}

/// Runs the whole suite for one configured mixer on one backend. `sizes.seq` should not be a
/// power of two or a multiple of any chunk size.
pub fn check_mixer(m: &dyn Mixer, backend: &Backend, sizes: &Sizes, seed: u64) -> Vec<Case> {
    let case = |form: Form, dtype: DType, check: Check, failure: Option<String>| Case {
        mixer: m.name().to_string(),
        config: m.config().to_string(),
        backend: backend.name().to_string(),
        form,
        dtype,
        check,
        failure,
    };
    let mut out = Vec::new();
    let have = forms(m, backend);
    let dims = complete_dims(m, &sizes.dims());
    let inputs = match m.random_inputs(&dims, seed) {
        Ok(i) => i,
        Err(e) => {
            out.push(case(
                Form::Materialized,
                DType::F64,
                Check::Oracle,
                Some(format!("random inputs: {e}")),
            ));
            return out;
        }
    };
    // The sizes as validation binds them (derived sizes such as `L` or `K` included).
    let dims = match mixer_core::mixer::validate(m, &AnyTensors::F64(inputs.clone())) {
        Ok(d) => d,
        Err(e) => {
            out.push(case(Form::Materialized, DType::F64, Check::Oracle, Some(format!("validate: {e}"))));
            return out;
        }
    };

    // oracle: every available form, both dtypes.
    for row in check(m, std::slice::from_ref(backend), sizes, seed) {
        let failure = match (&row.error, row.pass) {
            (Some(e), _) => Some(e.clone()),
            (None, true) => None,
            (None, false) => Some(format!("rel_rms {:.3e}, max_abs {:.3e}", row.rel_rms, row.max_abs)),
        };
        out.push(case(row.form, row.dtype, Check::Oracle, failure));
    }

    // f32 against f64, same form, same backend.
    for &form in have.iter().filter(|&&f| f != Form::Materialized) {
        let r = guarded(|| {
            let y64 = run_as(m, backend, form, &inputs, DType::F64).map_err(|e| format!("f64: {e}"))?;
            let y32 = run_as(m, backend, form, &inputs, DType::F32).map_err(|e| format!("f32: {e}"))?;
            let c = Tolerance::F32.compare(y32.view(), y64.view());
            if c.pass { Ok(()) } else { Err(format!("{c:?}")) }
        });
        out.push(case(form, DType::F32, Check::F32VsF64, r.err()));
    }

    if have.contains(&Form::Recurrent) {
        let reference = reference_form(&have);
        for dtype in [DType::F64, DType::F32] {
            let r = guarded(|| prefix_check(m, backend, reference, &inputs, &dims, dtype));
            out.push(case(Form::Recurrent, dtype, Check::Prefix, r.err()));
        }
        if m.decoder_cache(&dims, 1).is_some() {
            let r = guarded(|| cache_check(m, backend, &inputs, &dims));
            out.push(case(Form::Recurrent, DType::F64, Check::Cache, r.err()));
        }
    }

    for form in Form::ALL {
        let r = guarded(|| error_check(m, backend, form, have.contains(&form), &inputs, &dims));
        out.push(case(form, DType::F64, Check::Errors, r.err()));
    }

    if crate::state::shapes(m, &dims, None).is_ok() {
        // Inputs with room for a state's prefix where the inputs bound it (Mixer::state_check_dims).
        let sd = m.state_check_dims(&dims);
        let drawn = if sd == dims {
            Ok((inputs.clone(), dims.clone()))
        } else {
            m.random_inputs(&sd, seed).and_then(|x| {
                let d = mixer_core::mixer::validate(m, &AnyTensors::F64(x.clone()))?;
                Ok((x, d))
            })
        };
        for form in crate::state::forms(m, backend) {
            for dtype in [DType::F64, DType::F32] {
                let r = guarded(|| match &drawn {
                    Ok((x, d)) => state_check(m, backend, form, x, d, dtype, seed),
                    Err(e) => Err(format!("random inputs for the state check: {e}")),
                });
                out.push(case(form, dtype, Check::State, r.err()));
            }
        }
    }
    let differentiable = crate::backward::backward_forms(m, backend.name());
    for &form in &have {
        let r = guarded(|| packed_check(m, backend, form, &dims, seed, differentiable.contains(&form)));
        out.push(case(form, DType::F64, Check::Packed, r.err()));
    }
    out
}

/// Decoder outputs (whole sequence, one decoder) against `reference` on every prefix.
fn prefix_check(
    m: &dyn Mixer,
    backend: &Backend,
    reference: Form,
    inputs: &mixer_core::Tensors<f64>,
    dims: &Dims,
    dtype: DType,
) -> Result<(), String> {
    let spec = m.spec();
    let yd = match dtype {
        DType::F64 => {
            let mut dec = decoder::<f64>(m, backend, inputs, dims).map_err(|e| e.to_string())?;
            run_decoder(dec.as_mut(), &spec, inputs, |_, _| {}).map_err(|e| e.to_string())?
        }
        DType::F32 => {
            let x32 = cast_tensors::<f32>(inputs);
            let mut dec = decoder::<f32>(m, backend, &x32, dims).map_err(|e| e.to_string())?;
            run_decoder(dec.as_mut(), &spec, &x32, |_, _| {}).map_err(|e| e.to_string())?.mapv(f64::from)
        }
    };
    let t_len = yd.shape().get(1).copied().unwrap_or(0);
    let tol = Tolerance::for_dtype(dtype.name());
    for len in 1..=t_len {
        let p = m.prefix(inputs, len).map_err(|e| format!("prefix {len}: {e}"))?;
        let want = run_as(m, backend, reference, &p, dtype)
            .map_err(|e| format!("{reference} on prefix {len}: {e}"))?;
        let got = yd.slice_axis(Axis(1), Slice::from(0..len));
        let c = tol.compare(got, want.view());
        if !c.pass {
            return Err(format!("prefix {len} against {reference}: {c:?}"));
        }
    }
    Ok(())
}

/// `cache_elems` after every token against [`Mixer::decoder_cache`].
fn cache_check(
    m: &dyn Mixer,
    backend: &Backend,
    inputs: &mixer_core::Tensors<f64>,
    dims: &Dims,
) -> Result<(), String> {
    let mut dec = decoder::<f64>(m, backend, inputs, dims).map_err(|e| e.to_string())?;
    let mut bad = None;
    run_decoder(dec.as_mut(), &m.spec(), inputs, |t, elems| {
        let want = m.decoder_cache(dims, t + 1);
        if bad.is_none() && want != Some(elems) {
            bad = Some(format!(
                "after {} tokens the decoder holds {elems} scalars, the formula says {want:?}",
                t + 1
            ));
        }
    })
    .map_err(|e| e.to_string())?;
    bad.map_or(Ok(()), Err)
}

/// Error paths of one form.
fn error_check(
    m: &dyn Mixer,
    backend: &Backend,
    form: Form,
    available: bool,
    inputs: &mixer_core::Tensors<f64>,
    dims: &Dims,
) -> Result<(), String> {
    let mixed = m.spec().mixed;
    if !available {
        return match run_as(m, backend, form, inputs, DType::F64) {
            Err(Error::FormUnavailable { .. }) => Ok(()),
            Err(e) => Err(format!("an unavailable form gave another error: {e}")),
            Ok(_) => Err("a form not listed as available ran".into()),
        };
    }
    let mut bad = inputs.clone();
    let x = bad.get(mixed).ok_or_else(|| format!("no mixed input `{mixed}`"))?;
    let wide = reranked(x);
    bad.insert(mixed.to_string(), wide);
    match run_as(m, backend, form, &bad, DType::F64) {
        Err(Error::Shape { .. } | Error::MissingSize { .. }) => {}
        Err(e) => return Err(format!("a wrong `{mixed}` shape gave a non-shape error: {e}")),
        Ok(_) => return Err(format!("a wrong `{mixed}` shape produced an output")),
    }
    if form != Form::Recurrent {
        return Ok(());
    }
    // The decoder itself (no validation in front of it): a wrong per-token shape, then a
    // step past T.
    let per_token = m.spec().per_token();
    let t_len = dims.get("T").copied().unwrap_or(0);
    let mut dec = decoder::<f64>(m, backend, inputs, dims).map_err(|e| e.to_string())?;
    let mut tok = token_slice(inputs, &per_token, 0);
    if let Some(x) = tok.get(mixed) {
        let wide = reranked(x);
        tok.insert(mixed.to_string(), wide);
    }
    if dec.step(&tok).is_ok() {
        return Err(format!("a per-token `{mixed}` of the wrong shape was accepted by the decoder"));
    }
    let mut dec = decoder::<f64>(m, backend, inputs, dims).map_err(|e| e.to_string())?;
    for t in 0..t_len {
        dec.step(&token_slice(inputs, &per_token, t)).map_err(|e| format!("step {t}: {e}"))?;
    }
    let past = token_slice(inputs, &per_token, t_len.saturating_sub(1));
    match dec.step(&past) {
        Err(Error::Decoder(_)) => Ok(()),
        Err(e) => Err(format!("a step past T gave a non-decoder error: {e}")),
        Ok(_) => Err(format!("the decoder built for T = {t_len} accepted step {}", t_len + 1)),
    }
}

/// Every registered mixer with each of its example configurations, sorted by name.
pub fn registered_configs() -> Vec<(&'static str, serde_json::Value)> {
    let mut entries: Vec<_> = MIXERS.iter().collect();
    entries.sort_by_key(|e| e.name);
    let mut v = Vec::new();
    for e in entries {
        let examples: &[&str] = if e.examples.is_empty() { &["{}"] } else { e.examples };
        for ex in examples {
            let cfg = serde_json::from_str(ex).unwrap_or(serde_json::Value::Null);
            v.push((e.name, cfg));
        }
    }
    v
}

/// Runs the suite for every registered mixer configuration on `backend`.
pub fn check_registered(backend: &Backend, sizes: &Sizes, seed: u64) -> Vec<Case> {
    let mut out = Vec::new();
    for (i, (name, cfg)) in registered_configs().into_iter().enumerate() {
        match mixer(name, &cfg) {
            Ok(m) => out.extend(check_mixer(m.as_ref(), backend, sizes, seed + i as u64)),
            Err(e) => out.push(Case {
                mixer: name.to_string(),
                config: cfg.to_string(),
                backend: backend.name().to_string(),
                form: Form::Materialized,
                dtype: DType::F64,
                check: Check::Oracle,
                failure: Some(format!("registered example does not build: {e}")),
            }),
        }
    }
    out
}

/// Counts of cases per check, as `(check, passed, total)`.
pub fn tally(cases: &[Case]) -> Vec<(Check, usize, usize)> {
    Check::ALL
        .into_iter()
        .map(|c| {
            let of: Vec<&Case> = cases.iter().filter(|x| x.check == c).collect();
            (c, of.iter().filter(|x| x.failure.is_none()).count(), of.len())
        })
        .collect()
}

/// The suite's test entry point for a backend crate: runs [`check_registered`] on the backend
/// named `name` with the default [`Sizes`] (`T = 37`), prints the tally, and panics with every
/// failed case listed when one fails. Returns the cases.
pub fn assert_backend(name: &str) -> Vec<Case> {
    let backend = match Backend::by_name(name) {
        Ok(b) => b,
        Err(e) => panic!("backend `{name}` is not available: {e}"),
    };
    let cases = check_registered(&backend, &Sizes::default(), 1);
    let configs = registered_configs().len();
    println!("backend suite on `{name}`: {configs} mixer configurations, {} cases", cases.len());
    for (c, pass, total) in tally(&cases) {
        println!("  {:<11} {pass}/{total}", c.name());
    }
    let failed: Vec<String> = cases.iter().filter(|c| c.failure.is_some()).map(|c| c.to_string()).collect();
    assert!(failed.is_empty(), "{} of {} cases failed:\n{}", failed.len(), cases.len(), failed.join("\n"));
    cases
}
