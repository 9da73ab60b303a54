//! The robustness suite (issue 14). Property tests draw mixers and configs (plugins
//! included), shapes with 0 and 1 in every dimension and `T` off every chunk size, values at
//! the edges (NaN, ±∞, huge, subnormal, log-decays of −1e30, β at 0 and 1), random JSON
//! configs, and random or damaged `.npz` bytes. The property: every call returns `Ok` with a
//! finite output, or an `Error` with a message — never a panic, an abort, or an allocation
//! beyond the memory budget. Determinism: every CPU form gives bitwise-equal outputs across
//! runs and across thread counts.
//!
//! Cases per property: `MIXERS_FUZZ_CASES` (default [`DEFAULT_CASES`]); the long run is
//! `MIXERS_FUZZ_CASES=100000 cargo test --test robustness`.

use std::io::Cursor;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Mutex;

use mixers::alloc::{self, CountingAlloc};
use mixers::core::memory::Budget;
use mixers::core::mixer::fit_dims;
use mixers::prelude::*;
use mixers::registry::run::{forms, run};
use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};

use mixers_plugin_fibonacci as _;

/// The CPU backend (always available).
fn cpu() -> Backend {
    Backend::by_name("cpu").expect("the CPU backend is always available")
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Cases per property when `MIXERS_FUZZ_CASES` is not set (CI has two cores).
const DEFAULT_CASES: u32 = 24;

/// The allocation counters are process-wide: the tests of this file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn cases() -> u32 {
    std::env::var("MIXERS_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_CASES)
}

fn config() -> ProptestConfig {
    ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() }
}

/// Every registered mixer with each example config, and configs at the edges.
fn mixer_configs() -> Vec<(String, Value)> {
    let mut v: Vec<(String, Value)> = Vec::new();
    for e in mixers::registry::MIXERS.iter() {
        for ex in e.examples {
            v.push((e.name.to_string(), serde_json::from_str(ex).unwrap()));
        }
        if e.examples.is_empty() {
            v.push((e.name.to_string(), json!({})));
        }
    }
    let edge = [
        ("attention", json!({"window": 1})),
        ("attention", json!({"scale": 0.0})),
        ("attention", json!({"scale": 1e308})),
        ("attention", json!({"scale": -2.5, "window": 3})),
        ("glr", json!({"pattern": "sq1", "cache_efficient": true, "on": "both"})),
        ("glr", json!({"pattern": "linear", "order": 1, "on": "a"})),
        ("glr", json!({"pattern": "pow2", "cache_efficient": true})),
        ("mamba2", json!({"chunk": 1})),
        ("gated-deltanet", json!({"chunk": 2})),
        ("loglinear-mamba2", json!({"chunk": 1, "lambda_scheme": "ones"})),
        ("loglinear-gated-deltanet", json!({"chunk": 4, "lambda_scheme": "softplus"})),
        ("toeplitz", json!({"heads": 3, "kernel_width": 2})),
        ("toeplitz", json!({"heads": 2, "decoder": "naive"})),
        ("toeplitz", json!({"kernel_width": 4})),
    ];
    v.extend(edge.into_iter().map(|(n, c)| (n.to_string(), c)));
    v.extend([
        ("glr".to_string(), json!({"pattern": "fibonacci", "cache_efficient": true})),
        ("loglinear-mamba2".to_string(), json!({"mask": "log-distance"})),
        ("loglinear-attention".to_string(), json!({"lambda_scheme": "sigmoid2", "chunk": 2})),
    ]);
    v
}

/// How the drawn valid inputs are changed.
#[derive(Clone, Debug)]
enum Edit {
    /// Kept as drawn: the math is finite, so the run must succeed.
    None,
    /// Every entry of one input set to a value.
    Fill(usize, f64),
    /// One entry of one input set to a value.
    Poke(usize, usize, f64),
    /// Every unconstrained input (q, k, v, x, w, …) multiplied by a factor.
    Scale(f64),
}

const EDGE_VALUES: [f64; 14] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::MAX,
    -f64::MAX,
    1e300,
    3e38,
    -1e30,
    5e-324,
    1e-310,
    0.0,
    1.0,
    -0.0,
    0.5,
];

fn edit() -> impl Strategy<Value = Edit> {
    let value = proptest::sample::select(EDGE_VALUES.to_vec());
    prop_oneof![
        2 => Just(Edit::None),
        2 => (0usize..8, value.clone()).prop_map(|(i, v)| Edit::Fill(i, v)),
        2 => (0usize..8, any::<usize>(), value).prop_map(|(i, j, v)| Edit::Poke(i, j, v)),
        2 => proptest::sample::select(vec![1e-300, 1e-40, 1e19, 1e150, 1e300]).prop_map(Edit::Scale),
    ]
}

fn apply(x: &mut Tensors<f64>, spec: &mixers::core::InputSpec, e: &Edit) {
    let names: Vec<String> = x.keys().cloned().collect();
    if names.is_empty() {
        return;
    }
    match *e {
        Edit::None => {}
        Edit::Fill(i, v) => x.get_mut(&names[i % names.len()]).unwrap().fill(v),
        Edit::Poke(i, j, v) => {
            let a = x.get_mut(&names[i % names.len()]).unwrap();
            if let Some(s) = a.as_slice_mut()
                && !s.is_empty()
            {
                let n = s.len();
                s[j % n] = v;
            }
        }
        Edit::Scale(f) => {
            for d in &spec.inputs {
                if d.constraint == mixers::core::Constraint::Finite
                    && let Some(a) = x.get_mut(d.name)
                {
                    a.mapv_inplace(|v| v * f);
                }
            }
        }
    }
}

/// Runs `f`, turning a panic into a test failure that names the case.
fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, TestCaseError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        TestCaseError::fail(format!("{what}: panicked: {msg}"))
    })
}

fn finite(y: &Tensor) -> bool {
    match y {
        Tensor::F32(a) => a.iter().all(|v| v.is_finite()),
        Tensor::F64(a) => a.iter().all(|v| v.is_finite()),
    }
}

/// Checks one (mixer, sizes, edit): every CPU form in f64 and f32 returns `Ok` with a finite
/// output or an error with a message, never panics; with `strict`, unedited inputs must
/// succeed (the configs are the examples and edge configs, whose math is finite).
fn exercise(
    name: &str,
    cfg: &Value,
    sizes: [usize; 6],
    seed: u64,
    e: &Edit,
    strict: bool,
) -> Result<(), TestCaseError> {
    let Ok(m) = mixers::registry::mixer(name, cfg) else { return Ok(()) };
    let [b, t, h, dk, dv, c] = sizes;
    let s = Sizes { batch: b, seq: t, heads: h, dk, dv, channels: c };
    let dims = fit_dims(m.as_ref(), &s.dims());
    let what = format!("{name} {cfg} {dims:?} {e:?}");
    // Configs may ask for sizes no machine holds (e.g. 2^40 Toeplitz heads): the inputs are
    // refused by the memory budget before they are drawn, as the CLI does.
    let bytes = mixers::core::memory::inputs_bytes(&m.spec(), &dims, 8.0);
    if let Err(err) = mixers::core::memory::check("inputs", bytes) {
        prop_assert!(err.to_string().contains("working memory"));
        return Ok(());
    }
    let drawn = no_panic(&what, || m.random_inputs(&dims, seed))?;
    let mut x = match drawn {
        Ok(x) => x,
        Err(err) => {
            prop_assert!(!err.to_string().is_empty());
            return Ok(());
        }
    };
    apply(&mut x, &m.spec(), e);
    for form in forms(m.as_ref(), &cpu()) {
        for dtype in [DType::F64, DType::F32] {
            let any = match dtype {
                DType::F64 => AnyTensors::F64(x.clone()),
                DType::F32 => AnyTensors::F32(mixers::core::tensor::cast_tensors::<f32>(&x)),
            };
            let r = no_panic(&format!("{what} {form} {dtype:?}"), || run(m.as_ref(), &cpu(), form, &any))?;
            match r {
                Ok(y) => prop_assert!(finite(&y), "{what} {form} {dtype:?}: Ok with a non-finite output"),
                Err(err) => {
                    prop_assert!(!err.to_string().is_empty());
                    // Valid inputs of moderate size: the math is finite and representable.
                    prop_assert!(
                        !strict || !matches!(e, Edit::None),
                        "{what} {form} {dtype:?}: valid inputs were refused: {err}"
                    );
                }
            }
        }
    }
    Ok(())
}

fn sizes() -> impl Strategy<Value = [usize; 6]> {
    // 0 and 1 in every dimension, but mostly sizes with something to compute.
    let small = || prop_oneof![1 => Just(0usize), 1 => Just(1usize), 4 => 2usize..4];
    let seq = prop_oneof![1 => Just(0usize), 1 => Just(1usize), 1 => Just(2usize), 6 => 3usize..40];
    let channels = prop_oneof![1 => Just(0usize), 1 => Just(1usize), 4 => 2usize..7];
    (small(), seq, 1usize..4, small(), small(), channels)
        .prop_map(|(b, t, h, dk, dv, c)| [b, t, h, dk, dv, c])
}

proptest! {
    #![proptest_config(config())]

    /// Mixers × configs × shapes × edge values, every CPU form, f64 and f32.
    #[test]
    fn every_form_returns_finite_output_or_an_error(
        pick in any::<proptest::sample::Index>(),
        sizes in sizes(),
        seed in 0u64..1000,
        e in edit(),
    ) {
        let _g = serial();
        let all = mixer_configs();
        let (name, cfg) = &all[pick.index(all.len())];
        exercise(name, cfg, sizes, seed, &e, true)?;
    }

    /// Random JSON configs for every mixer: built or refused with an error; a built one runs
    /// on small valid inputs.
    #[test]
    fn json_configs_build_or_fail_cleanly(pick in any::<proptest::sample::Index>(), cfg in json_value()) {
        let _g = serial();
        let names: Vec<&str> = mixers::registry::MIXERS.iter().map(|e| e.name).collect();
        let name = names[pick.index(names.len())];
        let built = no_panic(&format!("{name} {cfg}"), || mixers::registry::mixer(name, &cfg))?;
        match built {
            // A random config may ask for a result that overflows (e.g. a scale of 1e308 on
            // a linear mixer): then a clear error is right, so not `strict`.
            Ok(_) => exercise(name, &cfg, [1, 5, 2, 3, 2, 4], 0, &Edit::None, false)?,
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    /// Random, truncated and damaged `.npz` bytes: read or refused, never a panic, and never
    /// more memory than the budget (plus the file itself).
    #[test]
    fn npz_reader_survives_damaged_files(bytes in npz_bytes()) {
        let _g = serial();
        let budget = Budget { bytes: 4.0 * 1024.0 * 1024.0, source: "test budget".into() };
        let base = alloc::reset_peak();
        let r = no_panic("read_npz_from", || {
            mixers::io::read_npz_from(Path::new("fuzz.npz"), Cursor::new(&bytes), Some(&budget))
        })?;
        let grew = alloc::peak_bytes().saturating_sub(base) as f64;
        prop_assert!(
            grew <= budget.bytes + 4.0 * bytes.len() as f64 + 1024.0 * 1024.0,
            "read_npz_from held {grew} bytes for a {}-byte file", bytes.len()
        );
        if let Err(e) = r {
            prop_assert!(e.to_string().contains("fuzz.npz"), "{e}");
        }
    }
}

/// JSON values built from the keys and values the configs use, and everything else.
fn json_value() -> impl Strategy<Value = Value> {
    let keys = proptest::sample::select(vec![
        "window",
        "scale",
        "pattern",
        "cache_efficient",
        "order",
        "on",
        "chunk",
        "mask",
        "lambda_scheme",
        "heads",
        "kernel_width",
        "decoder",
        "bogus",
    ]);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        proptest::sample::select(vec![
            json!(0),
            json!(1),
            json!(-1),
            json!(3),
            json!(16),
            json!(1e308),
            json!(-1e308),
            json!(0.5),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(1u64 << 40),
            json!(1e-320),
        ]),
        proptest::sample::select(vec![
            "pow2",
            "sq1",
            "linear",
            "fibonacci",
            "fenwick",
            "log-distance",
            "identity",
            "softplus",
            "ones",
            "sigmoid2",
            "a",
            "b",
            "both",
            "online",
            "naive",
            "",
            "NaN",
            "pow",
        ])
        .prop_map(Value::from),
    ];
    let obj = proptest::collection::btree_map(keys, leaf.clone(), 0..4)
        .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()));
    prop_oneof![
        6 => obj,
        1 => leaf.clone(),
        1 => proptest::collection::vec(leaf, 0..3).prop_map(Value::Array),
    ]
}

/// A valid `.npz` (one to three small f32/f64 members), then damaged: truncated, bytes
/// overwritten, header digits replaced by huge numbers, or replaced by random bytes.
fn npz_bytes() -> impl Strategy<Value = Vec<u8>> {
    let valid = (1usize..4, any::<bool>(), any::<bool>(), 0usize..40).prop_map(|(n, f64s, deflate, len)| {
        let mut w = ndarray_npy::NpzWriter::new_compressed(Cursor::new(Vec::new()));
        if !deflate {
            w = ndarray_npy::NpzWriter::new(Cursor::new(Vec::new()));
        }
        for i in 0..n {
            let shape = IxDyn(&[len, i + 1]);
            let name = ["q", "k", "v"][i];
            if f64s {
                w.add_array(name, &ArrayD::<f64>::from_elem(shape, 0.25)).unwrap();
            } else {
                w.add_array(name, &ArrayD::<f32>::from_elem(shape, 0.25)).unwrap();
            }
        }
        w.finish().unwrap().into_inner()
    });
    let damage = prop_oneof![Just(0u8), Just(1u8), Just(2u8), Just(3u8), Just(4u8),];
    (
        valid,
        damage,
        any::<usize>(),
        proptest::collection::vec(any::<u8>(), 1..16),
        proptest::collection::vec(any::<u8>(), 0..600),
    )
        .prop_map(|(mut b, how, at, patch, random)| {
            let n = b.len();
            match how {
                0 => b,
                1 => {
                    b.truncate(at % n);
                    b
                }
                2 => {
                    let start = at % n;
                    for (i, &p) in patch.iter().enumerate() {
                        if start + i < n {
                            b[start + i] = p;
                        }
                    }
                    b
                }
                3 => {
                    // A lying shape: the first digit run after "shape" becomes 99999999999.
                    let text = b.clone();
                    if let Some(pos) = text.windows(5).position(|w| w == b"shape")
                        && let Some(d) = text[pos..].iter().position(|c| c.is_ascii_digit())
                    {
                        let s = pos + d;
                        for (i, c) in b"99999999999".iter().enumerate() {
                            if s + i < n && text[s + i].is_ascii_digit() {
                                b[s + i] = *c;
                            }
                        }
                    }
                    b
                }
                _ => random,
            }
        })
}

/// Every CPU form of every mixer config gives bitwise-equal outputs across runs and across
/// thread counts (1, 2 and 3 rayon workers), in f64 and f32, at sizes off every chunk size.
#[test]
fn cpu_forms_are_deterministic_across_runs_and_threads() {
    let _g = serial();
    let pools: Vec<rayon::ThreadPool> =
        [1, 2, 3].iter().map(|&n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap()).collect();
    for (name, cfg) in mixer_configs() {
        let m = mixers::registry::mixer(&name, &cfg).unwrap();
        let s = Sizes { batch: 2, seq: 37, heads: 3, dk: 5, dv: 3, channels: 6 };
        let dims = fit_dims(m.as_ref(), &s.dims());
        let x = m.random_inputs(&dims, 11).unwrap();
        for form in forms(m.as_ref(), &cpu()) {
            for dtype in [DType::F64, DType::F32] {
                let any = match dtype {
                    DType::F64 => AnyTensors::F64(x.clone()),
                    DType::F32 => AnyTensors::F32(mixers::core::tensor::cast_tensors::<f32>(&x)),
                };
                let bits = |y: Tensor| -> Vec<u64> {
                    match y {
                        Tensor::F32(a) => a.iter().map(|v| v.to_bits() as u64).collect(),
                        Tensor::F64(a) => a.iter().map(|v| v.to_bits()).collect(),
                    }
                };
                let first = bits(run(m.as_ref(), &cpu(), form, &any).unwrap());
                assert!(!first.is_empty());
                let again = bits(run(m.as_ref(), &cpu(), form, &any).unwrap());
                assert_eq!(first, again, "{name} {cfg} {form} {dtype:?}: two runs differ");
                for (i, p) in pools.iter().enumerate() {
                    let y = bits(p.install(|| run(m.as_ref(), &cpu(), form, &any)).unwrap());
                    assert_eq!(first, y, "{name} {cfg} {form} {dtype:?}: {} threads differ", i + 1);
                }
            }
        }
    }
}

/// Zero-width heads (Dk = Dv = 0, so C = 0) and an empty sequence, for every registered mixer
/// with its default config: every CPU form returns an output or an error, and never panics
/// (a case the random sizes above reach only now and then: the attention fast form's exact
/// fallback once panicked on empty rows).
#[test]
fn empty_dims_return_output_or_error() {
    let _g = serial();
    for e in mixers::registry::MIXERS.iter() {
        for sizes in [[1, 2, 1, 0, 0, 0], [1, 0, 2, 3, 2, 4], [2, 3, 1, 0, 2, 0]] {
            exercise(e.name, &json!({}), sizes, 0, &Edit::None, false)
                .unwrap_or_else(|err| panic!("{} at sizes {sizes:?}: {err}", e.name));
        }
    }
}

/// The specific edge inputs the issue names, on which the math is finite: each must succeed
/// with a finite output in every CPU form.
#[test]
fn finite_math_at_the_edges_succeeds() {
    let _g = serial();
    let s = Sizes { batch: 1, seq: 19, heads: 2, dk: 3, dv: 2, channels: 4 };
    type Edit2 = fn(&mut Tensors<f64>);
    let cases: Vec<(&str, Value, Edit2)> = vec![
        ("mamba2", json!({}), |x| x.get_mut("g").unwrap().fill(-1e30)),
        ("loglinear-mamba2", json!({"chunk": 4}), |x| x.get_mut("g").unwrap().fill(-1e30)),
        ("gated-deltanet", json!({}), |x| x.get_mut("beta").unwrap().fill(0.0)),
        ("gated-deltanet", json!({}), |x| x.get_mut("beta").unwrap().fill(1.0)),
        ("loglinear-gated-deltanet", json!({"chunk": 2}), |x| x.get_mut("beta").unwrap().fill(1.0)),
        ("loglinear-attention", json!({}), |x| x.get_mut("lambda").unwrap().fill(0.0)),
        ("attention", json!({"scale": 1e308}), |_| {}),
        ("attention", json!({}), |x| {
            x.get_mut("q").unwrap().mapv_inplace(|v| v * 1e19);
            x.get_mut("k").unwrap().mapv_inplace(|v| v * 1e19);
        }),
        ("glr", json!({}), |x| x.get_mut("beta").unwrap().fill(0.0)),
        ("toeplitz", json!({"heads": 2}), |x| x.get_mut("w").unwrap().fill(1e-310)),
    ];
    for (name, cfg, edit) in cases {
        let m = mixers::registry::mixer(name, &cfg).unwrap();
        let mut x = m.random_inputs(&fit_dims(m.as_ref(), &s.dims()), 2).unwrap();
        edit(&mut x);
        for form in forms(m.as_ref(), &cpu()) {
            for dtype in [DType::F64, DType::F32] {
                let any = match dtype {
                    DType::F64 => AnyTensors::F64(x.clone()),
                    DType::F32 => AnyTensors::F32(mixers::core::tensor::cast_tensors::<f32>(&x)),
                };
                let y = run(m.as_ref(), &cpu(), form, &any)
                    .unwrap_or_else(|e| panic!("{name} {cfg} {form} {dtype:?}: {e}"));
                assert!(finite(&y), "{name} {cfg} {form} {dtype:?}");
            }
        }
    }
}

/// Non-finite inputs are refused by name, in every form.
#[test]
fn non_finite_inputs_are_refused_by_name() {
    let _g = serial();
    let m = mixers::registry::mixer("attention", &json!({})).unwrap();
    let s = Sizes { batch: 1, seq: 6, heads: 1, dk: 2, dv: 2, channels: 1 };
    let mut x = m.random_inputs(&s.dims(), 0).unwrap();
    x.get_mut("k").unwrap()[[0, 3, 0, 1]] = f64::NAN;
    for form in forms(m.as_ref(), &cpu()) {
        let e = run(m.as_ref(), &cpu(), form, &AnyTensors::F64(x.clone())).unwrap_err().to_string();
        assert!(e.contains("input `k`") && e.contains("[0, 3, 0, 1]"), "{form}: {e}");
    }
}
