//! The typed API (`mixers::ops`): every typed function agrees bit for bit with the dynamic
//! path (`registry::run::run`) for the same mixer, config, form and backend, in `f32` and
//! `f64`; the typed decoders agree with the typed fast form at every prefix; bad options and
//! bad tokens are errors; the README's dependency example is the tested example file.

use mixers::core::tensor::cast_tensors;
use mixers::ndarray::{ArrayD, ArrayView2, ArrayView3, ArrayView4, Axis, Ix2, Ix3, Ix4, Slice};
use mixers::ops::{self, GlrCoeffs, GlrPattern, GlrTokenCoeffs, Options, Scalar};
use mixers::prelude::*;

#[allow(dead_code)]
#[path = "../examples/prenorm_block.rs"]
mod prenorm_block;

fn cpu() -> Backend {
    Backend::by_name("cpu").unwrap()
}

/// Sizes that are not powers of two nor chunk multiples.
fn sizes() -> Sizes {
    Sizes { batch: 2, seq: 29, channels: 6, heads: 3, dk: 4, dv: 5 }
}

fn v2<'a, F>(x: &'a Tensors<F>, n: &str) -> ArrayView2<'a, F> {
    x[n].view().into_dimensionality::<Ix2>().unwrap()
}
fn v3<'a, F>(x: &'a Tensors<F>, n: &str) -> ArrayView3<'a, F> {
    x[n].view().into_dimensionality::<Ix3>().unwrap()
}
fn v4<'a, F>(x: &'a Tensors<F>, n: &str) -> ArrayView4<'a, F> {
    x[n].view().into_dimensionality::<Ix4>().unwrap()
}

fn tagged<F: Scalar>(x: &Tensors<f64>) -> AnyTensors {
    match F::NAME {
        "f32" => AnyTensors::F32(cast_tensors::<f32>(x)),
        _ => AnyTensors::F64(x.clone()),
    }
}

/// Runs every form of `name` with `cfg` on `backend` both ways and compares the bits.
/// Returns the number of forms compared.
fn agree<F: Scalar>(
    backend: Backend,
    name: &str,
    cfg: serde_json::Value,
    opts: Options,
    extra: impl Fn(&mut Tensors<f64>),
    typed: impl Fn(&Tensors<F>, &Options) -> Result<ArrayD<F>>,
) -> usize {
    let m = mixers::registry::mixer(name, &cfg).unwrap();
    let mut x64 = m.random_inputs(&sizes().dims(), 5).unwrap();
    extra(&mut x64);
    let x = cast_tensors::<F>(&x64);
    let forms = mixers::registry::run::forms(m.as_ref(), &backend);
    for &form in &forms {
        let want = mixers::registry::run::run(m.as_ref(), &backend, form, &tagged::<F>(&x64))
            .unwrap_or_else(|e| panic!("{name} {form}: {e}"))
            .to_f64();
        let got = typed(&x, &opts.clone().backend(backend).form(form))
            .unwrap_or_else(|e| panic!("typed {name} {form}: {e}"))
            .mapv(|v| v.f64());
        assert_eq!(got.shape(), want.shape(), "{name} {form} {}", F::NAME);
        let same = got.iter().zip(want.iter()).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{name} {cfg} {form} {}: typed and dynamic outputs differ", F::NAME);
        assert!(got.iter().any(|v| *v != 0.0), "{name} {form}: an all-zero output proves nothing");
    }
    forms.len()
}

/// `agree` in `f64` and `f32` with one typed call written once (on the CPU unless a backend
/// is given first).
macro_rules! agree_both {
    ($name:expr, $($rest:tt)*) => {
        agree_both!(@on cpu(); $name, $($rest)*)
    };
    (@on $b:expr; $name:expr, $cfg:expr, $opts:expr, $extra:expr, |$x:ident, $o:ident| $call:expr) => {{
        let a = agree::<f64>($b, $name, $cfg, $opts, $extra, |$x, $o| $call.map(|y| y.into_dyn()));
        let b = agree::<f32>($b, $name, $cfg, $opts, $extra, |$x, $o| $call.map(|y| y.into_dyn()));
        assert_eq!(a, b);
        a
    }};
}

fn none(_: &mut Tensors<f64>) {}

#[test]
fn attention_agrees_with_the_dynamic_path() {
    let n = agree_both!("attention", serde_json::json!({}), Options::default(), none, |x, o| {
        ops::attention(v4(x, "q"), v4(x, "k"), v4(x, "v"), o)
    });
    assert_eq!(n, 4);
    let cfg = serde_json::json!({"window": 9, "scale": 0.3});
    agree_both!("attention", cfg.clone(), Options::default().window(9).scale(0.3), none, |x, o| {
        ops::attention(v4(x, "q"), v4(x, "k"), v4(x, "v"), o)
    });
}

#[test]
fn loglinear_base_mixers_agree_with_the_dynamic_path() {
    let n = agree_both!(
        "linear-attention",
        serde_json::json!({"chunk": 8}),
        Options::default().chunk(8),
        none,
        |x, o| { ops::linear_attention(v4(x, "q"), v4(x, "k"), v4(x, "v"), o) }
    );
    assert_eq!(n, 4);
    agree_both!("mamba2", serde_json::json!({"chunk": 8}), Options::default().chunk(8), none, |x, o| {
        ops::mamba2(v4(x, "q"), v4(x, "k"), v4(x, "v"), v3(x, "g"), o)
    });
    let cfg = serde_json::json!({"chunk": 16, "scale": 0.7});
    agree_both!("gated-deltanet", cfg.clone(), Options::default().chunk(16).scale(0.7), none, |x, o| {
        ops::gated_deltanet(v4(x, "q"), v4(x, "k"), v4(x, "v"), v3(x, "g"), v3(x, "beta"), o)
    });
}

#[test]
fn loglinear_lifts_agree_with_the_dynamic_path() {
    let cfg = serde_json::json!({"chunk": 8, "lambda_scheme": "softplus"});
    agree_both!(
        "loglinear-attention",
        cfg.clone(),
        Options::default().chunk(8).lambda("softplus"),
        none,
        |x, o| { ops::loglinear_attention(v4(x, "q"), v4(x, "k"), v4(x, "v"), v4(x, "lambda"), o) }
    );
    agree_both!(
        "loglinear-mamba2",
        serde_json::json!({"chunk": 8}),
        Options::default().chunk(8),
        none,
        |x, o| { ops::loglinear_mamba2(v4(x, "q"), v4(x, "k"), v4(x, "v"), v3(x, "g"), v4(x, "lambda"), o) }
    );
    // The Fenwick mask by value (the registered entry itself).
    let fenwick = mixers::registry::mask("fenwick").unwrap();
    let opts = Options::default().chunk(4).mask(fenwick);
    let n = agree_both!(
        "loglinear-gated-deltanet",
        serde_json::json!({"chunk": 4}),
        opts.clone(),
        none,
        |x, o| {
            ops::loglinear_gated_deltanet(
                v4(x, "q"),
                v4(x, "k"),
                v4(x, "v"),
                v3(x, "g"),
                v3(x, "beta"),
                v4(x, "lambda"),
                o,
            )
        }
    );
    assert_eq!(n, 4);
}

#[test]
fn plugin_mask_and_lambda_scheme_by_value() {
    use mixers_plugin_fibonacci::{FIBONACCI, LOG_DISTANCE, SIGMOID2};
    let cfg = serde_json::json!({"mask": "log-distance", "lambda_scheme": "sigmoid2"});
    let opts = Options::default().mask(&LOG_DISTANCE).lambda(&SIGMOID2);
    // The log-distance mask has no chunked/recurrent form: materialized and parallel.
    let n = agree_both!("loglinear-mamba2", cfg.clone(), opts.clone(), none, |x, o| {
        ops::loglinear_mamba2(v4(x, "q"), v4(x, "k"), v4(x, "v"), v3(x, "g"), v4(x, "lambda"), o)
    });
    assert_eq!(n, 2);
    let cfg = serde_json::json!({"pattern": "fibonacci", "cache_efficient": true});
    let pattern = GlrPattern::new(&FIBONACCI).cache_efficient(true);
    agree_both!("glr", cfg.clone(), Options::default(), none, |x, o| {
        ops::glr(v3(x, "x"), GlrCoeffs::B { alpha: v3(x, "alpha"), beta: v4(x, "beta") }, &pattern, o)
    });
    // The fast form needs the Fenwick mask: a typed call says so, as the dynamic one does.
    let inputs = inputs("loglinear-mamba2", serde_json::json!({"mask": "log-distance"}));
    let e = ops::loglinear_mamba2(
        v4(&inputs, "q"),
        v4(&inputs, "k"),
        v4(&inputs, "v"),
        v3(&inputs, "g"),
        v4(&inputs, "lambda"),
        &Options::default().backend(cpu()).mask("log-distance"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("fast") && e.contains("Fenwick"), "{e}");
    let e =
        ops::LogLinearMamba2Decoder::<f64>::new(5, &Options::default().backend(cpu()).mask(&LOG_DISTANCE))
            .err()
            .expect("no recurrent form with the log-distance mask")
            .to_string();
    assert!(e.contains("recurrent") && e.contains("Fenwick"), "{e}");
    // Its state is a cache of past tokens, not the typed level state: the typed state function
    // says where to go instead.
    let e = ops::loglinear_mamba2_state(
        v4(&inputs, "q"),
        v4(&inputs, "k"),
        v4(&inputs, "v"),
        v3(&inputs, "g"),
        v4(&inputs, "lambda"),
        None,
        &Options::default().backend(cpu()).mask("log-distance").form(mixers::prelude::Form::Parallel),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("keeps a cache of its past tokens") && e.contains("call::forward"), "{e}");
}

#[test]
fn glr_agrees_with_the_dynamic_path_for_every_side() {
    for (cfg, pattern) in [
        (serde_json::json!({"pattern": "pow2"}), GlrPattern::new("pow2")),
        (serde_json::json!({"pattern": "sq1", "order": 3}), GlrPattern::new("sq1").order(3)),
    ] {
        let n = agree_both!("glr", cfg.clone(), Options::default(), none, |x, o| {
            ops::glr(v3(x, "x"), GlrCoeffs::B { alpha: v3(x, "alpha"), beta: v4(x, "beta") }, &pattern, o)
        });
        assert_eq!(n, 3);
    }
    let cfg = serde_json::json!({"pattern": "pow2", "on": "a"});
    agree_both!("glr", cfg.clone(), Options::default(), none, |x, o| {
        ops::glr(v3(x, "x"), GlrCoeffs::A { alpha: v4(x, "alpha") }, &GlrPattern::new("pow2"), o)
    });
    let cfg = serde_json::json!({"pattern": "sq1", "cache_efficient": true, "on": "both"});
    let pattern = GlrPattern::new(mixers::registry::pattern("sq1").unwrap()).cache_efficient(true);
    agree_both!("glr", cfg.clone(), Options::default(), none, |x, o| {
        ops::glr(v3(x, "x"), GlrCoeffs::Both { alpha: v4(x, "alpha"), beta: v4(x, "beta") }, &pattern, o)
    });
}

#[test]
fn toeplitz_agrees_with_the_dynamic_path() {
    // Kw = 1: the typed kernel is [1, H, Tw], the dynamic one [H, Tw]; with the bias.
    let n = agree_both!("toeplitz", serde_json::json!({"heads": 3}), Options::default(), none, |x, o| {
        let w = x["w"].view().insert_axis(Axis(0)).into_dimensionality::<Ix3>().unwrap();
        ops::toeplitz(v3(x, "x"), w, Some(v2(x, "bias")), o)
    });
    assert_eq!(n, 4);
    // Kw = 2, no bias.
    let drop_bias = |x: &mut Tensors<f64>| {
        x.remove("bias");
    };
    agree_both!(
        "toeplitz",
        serde_json::json!({"heads": 3, "kernel_width": 2}),
        Options::default(),
        drop_bias,
        |x, o| { ops::toeplitz(v3(x, "x"), v3(x, "w"), None, o) }
    );
}

/// Views with other strides (axes permuted, every other row) give the same bits as
/// row-major arrays.
#[test]
fn strided_views_give_the_same_bits() {
    let o = Options::default().backend(cpu()).chunk(8);
    let x = inputs("mamba2", serde_json::json!({}));
    // q stored as [B, H, T, Dk] and viewed as [B, T, H, Dk]; v interleaved with zeros in T.
    let q_bhtd = x["q"].view().permuted_axes(vec![0, 2, 1, 3]).as_standard_layout().into_owned();
    let q_view = q_bhtd.view().permuted_axes(vec![0, 2, 1, 3]);
    assert!(!q_view.is_standard_layout());
    let mut v_inter = ArrayD::<f64>::zeros(mixers::ndarray::IxDyn(&[2, 2 * sizes().seq, 3, 5]));
    v_inter.slice_axis_mut(Axis(1), Slice::new(0, None, 2)).assign(&x["v"]);
    let v_strided = v_inter.slice_axis(Axis(1), Slice::new(0, None, 2));
    assert!(!v_strided.is_standard_layout());
    let want = ops::mamba2(v4(&x, "q"), v4(&x, "k"), v4(&x, "v"), v3(&x, "g"), &o).unwrap();
    let got = ops::mamba2(
        q_view.into_dimensionality().unwrap(),
        v4(&x, "k"),
        v_strided.into_dimensionality().unwrap(),
        v3(&x, "g"),
        &o,
    )
    .unwrap();
    assert!(got.iter().zip(want.iter()).all(|(a, b)| a.to_bits() == b.to_bits()));

    let x = inputs("toeplitz", serde_json::json!({"heads": 3}));
    let x_t = x["x"].view().reversed_axes().as_standard_layout().into_owned(); // [C, T, B]
    let x_view = x_t.view().reversed_axes();
    assert!(!x_view.is_standard_layout());
    let w = x["w"].view().insert_axis(Axis(0)).into_dimensionality::<Ix3>().unwrap();
    let o = Options::default().backend(cpu());
    let want = ops::toeplitz(v3(&x, "x"), w, None, &o).unwrap();
    let got = ops::toeplitz(x_view.into_dimensionality().unwrap(), w, None, &o).unwrap();
    assert!(got.iter().zip(want.iter()).all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// The largest relative difference of `got` from `want` (scale: `max |want|`).
fn rel_diff(got: &ArrayD<f64>, want: &ArrayD<f64>) -> f64 {
    assert_eq!(got.shape(), want.shape());
    let scale = want.iter().fold(1e-300f64, |a, b| a.max(b.abs()));
    got.iter().zip(want.iter()).fold(0.0f64, |a, (g, w)| a.max((g - w).abs())) / scale
}

/// Compares decoder outputs `ys` (token t along axis 1 once stacked) with the typed fast form
/// on every prefix `[0, n)`.
fn check_prefixes(name: &str, ys: &[ArrayD<f64>], fast_on_prefix: impl Fn(usize) -> ArrayD<f64>) {
    let views: Vec<_> = ys.iter().map(|y| y.view().insert_axis(Axis(1))).collect();
    let all = mixers::ndarray::concatenate(Axis(1), &views).unwrap();
    for n in 1..=ys.len() {
        let fast = fast_on_prefix(n);
        let dec = all.slice_axis(Axis(1), Slice::from(0..n)).to_owned();
        let d = rel_diff(&dec, &fast);
        assert!(d < 1e-10, "{name}: decoder vs fast form at prefix {n}: relative difference {d:e}");
    }
}

fn prefix(a: &ArrayD<f64>, n: usize) -> ArrayD<f64> {
    a.slice_axis(Axis(1), Slice::from(0..n)).to_owned()
}

fn token(a: &ArrayD<f64>, t: usize) -> ArrayD<f64> {
    a.index_axis(Axis(1), t).to_owned()
}

fn d2(a: &ArrayD<f64>) -> ArrayView2<'_, f64> {
    a.view().into_dimensionality().unwrap()
}
fn d3(a: &ArrayD<f64>) -> ArrayView3<'_, f64> {
    a.view().into_dimensionality().unwrap()
}
fn d4(a: &ArrayD<f64>) -> ArrayView4<'_, f64> {
    a.view().into_dimensionality().unwrap()
}

fn inputs(name: &str, cfg: serde_json::Value) -> Tensors<f64> {
    mixers::registry::mixer(name, &cfg).unwrap().random_inputs(&sizes().dims(), 9).unwrap()
}

#[test]
fn attention_decoder_equals_the_fast_form_at_every_prefix() {
    let o = Options::default().backend(cpu()).window(7);
    let x = inputs("attention", serde_json::json!({"window": 7}));
    let t_len = sizes().seq;
    let mut dec = ops::AttentionDecoder::new(t_len, &o).unwrap();
    let ys: Vec<ArrayD<f64>> = (0..t_len)
        .map(|t| {
            let (q, k, v) = (token(&x["q"], t), token(&x["k"], t), token(&x["v"], t));
            dec.step(d3(&q), d3(&k), d3(&v)).unwrap().into_dyn()
        })
        .collect();
    assert_eq!(dec.position(), t_len);
    check_prefixes("attention", &ys, |n| {
        let p = |s: &str| prefix(&x[s], n);
        let (q, k, v) = (p("q"), p("k"), p("v"));
        ops::attention(d4(&q), d4(&k), d4(&v), &o).unwrap().into_dyn()
    });
}

#[test]
fn loglinear_decoders_equal_the_fast_form_at_every_prefix() {
    let o = Options::default().backend(cpu()).chunk(4).lambda("softplus");
    let x = inputs("loglinear-gated-deltanet", serde_json::json!({"lambda_scheme": "softplus"}));
    let t_len = sizes().seq;
    let mut dec = ops::LogLinearGatedDeltaNetDecoder::new(t_len, &o).unwrap();
    let ys: Vec<ArrayD<f64>> = (0..t_len)
        .map(|t| {
            let tok = |s: &str| token(&x[s], t);
            let (q, k, v, g, b, l) = (tok("q"), tok("k"), tok("v"), tok("g"), tok("beta"), tok("lambda"));
            dec.step(d3(&q), d3(&k), d3(&v), d2(&g), d2(&b), d3(&l)).unwrap().into_dyn()
        })
        .collect();
    assert!(dec.cache_elems() > 0);
    check_prefixes("loglinear-gated-deltanet", &ys, |n| {
        let p = |s: &str| prefix(&x[s], n);
        let (q, k, v, g, b, l) = (p("q"), p("k"), p("v"), p("g"), p("beta"), p("lambda"));
        ops::loglinear_gated_deltanet(d4(&q), d4(&k), d4(&v), d3(&g), d3(&b), d4(&l), &o).unwrap().into_dyn()
    });

    let o = Options::default().backend(cpu()).chunk(8);
    let x = inputs("mamba2", serde_json::json!({}));
    let mut dec = ops::Mamba2Decoder::new(t_len, &o).unwrap();
    let ys: Vec<ArrayD<f64>> = (0..t_len)
        .map(|t| {
            let tok = |s: &str| token(&x[s], t);
            let (q, k, v, g) = (tok("q"), tok("k"), tok("v"), tok("g"));
            dec.step(d3(&q), d3(&k), d3(&v), d2(&g)).unwrap().into_dyn()
        })
        .collect();
    check_prefixes("mamba2", &ys, |n| {
        let p = |s: &str| prefix(&x[s], n);
        let (q, k, v, g) = (p("q"), p("k"), p("v"), p("g"));
        ops::mamba2(d4(&q), d4(&k), d4(&v), d3(&g), &o).unwrap().into_dyn()
    });
}

/// The other four log-linear decoders (the two above are tested at every prefix): each
/// against its typed fast form on the whole sequence.
#[test]
fn every_loglinear_decoder_equals_its_fast_form() {
    let o = Options::default().backend(cpu()).chunk(4);
    let t_len = sizes().seq;
    let x = inputs("loglinear-gated-deltanet", serde_json::json!({}));
    let tok = |s: &str, t: usize| token(&x[s], t);
    let stack = |ys: Vec<ArrayD<f64>>| {
        let views: Vec<_> = ys.iter().map(|y| y.view().insert_axis(Axis(1))).collect();
        mixers::ndarray::concatenate(Axis(1), &views).unwrap()
    };
    let (q, k, v, g, b, l) =
        (v4(&x, "q"), v4(&x, "k"), v4(&x, "v"), v3(&x, "g"), v3(&x, "beta"), v4(&x, "lambda"));

    let mut dec = ops::LinearAttentionDecoder::new(t_len, &o).unwrap();
    let ys = (0..t_len)
        .map(|t| dec.step(d3(&tok("q", t)), d3(&tok("k", t)), d3(&tok("v", t))).unwrap().into_dyn())
        .collect();
    let d = rel_diff(&stack(ys), &ops::linear_attention(q, k, v, &o).unwrap().into_dyn());
    assert!(d < 1e-10, "linear-attention: {d:e}");

    let mut dec = ops::GatedDeltaNetDecoder::new(t_len, &o).unwrap();
    let ys = (0..t_len)
        .map(|t| {
            let (qt, kt, vt, gt, bt) = (tok("q", t), tok("k", t), tok("v", t), tok("g", t), tok("beta", t));
            dec.step(d3(&qt), d3(&kt), d3(&vt), d2(&gt), d2(&bt)).unwrap().into_dyn()
        })
        .collect();
    let d = rel_diff(&stack(ys), &ops::gated_deltanet(q, k, v, g, b, &o).unwrap().into_dyn());
    assert!(d < 1e-10, "gated-deltanet: {d:e}");

    let mut dec = ops::LogLinearAttentionDecoder::new(t_len, &o).unwrap();
    let ys = (0..t_len)
        .map(|t| {
            let (qt, kt, vt, lt) = (tok("q", t), tok("k", t), tok("v", t), tok("lambda", t));
            dec.step(d3(&qt), d3(&kt), d3(&vt), d3(&lt)).unwrap().into_dyn()
        })
        .collect();
    let d = rel_diff(&stack(ys), &ops::loglinear_attention(q, k, v, l, &o).unwrap().into_dyn());
    assert!(d < 1e-10, "loglinear-attention: {d:e}");

    let mut dec = ops::LogLinearMamba2Decoder::new(t_len, &o).unwrap();
    let ys = (0..t_len)
        .map(|t| {
            let (qt, kt, vt, gt, lt) = (tok("q", t), tok("k", t), tok("v", t), tok("g", t), tok("lambda", t));
            dec.step(d3(&qt), d3(&kt), d3(&vt), d2(&gt), d3(&lt)).unwrap().into_dyn()
        })
        .collect();
    let d = rel_diff(&stack(ys), &ops::loglinear_mamba2(q, k, v, g, l, &o).unwrap().into_dyn());
    assert!(d < 1e-10, "loglinear-mamba2: {d:e}");
}

/// The number of GLR slots `K(T)` of a pattern (offsets `f(k) ≤ T − 1`).
fn slots(pattern: &str, order: Option<usize>, t_len: usize) -> usize {
    let p = mixers::core::pattern::Pattern::new(
        pattern,
        mixers::registry::pattern(pattern).unwrap().offset,
        order,
        false,
    )
    .unwrap();
    p.offsets(t_len).len()
}

#[test]
fn glr_decoder_equals_the_fast_form_at_every_prefix() {
    let o = Options::default().backend(cpu());
    let x = inputs("glr", serde_json::json!({"pattern": "sq1", "cache_efficient": true, "on": "both"}));
    let pattern = GlrPattern::new("sq1").cache_efficient(true);
    let t_len = sizes().seq;
    let mut dec = ops::GlrDecoder::new(pattern.clone(), t_len, &o).unwrap();
    let ys: Vec<ArrayD<f64>> = (0..t_len)
        .map(|t| {
            let (xt, a, b) = (token(&x["x"], t), token(&x["alpha"], t), token(&x["beta"], t));
            dec.step(d2(&xt), GlrTokenCoeffs::Both { alpha: d3(&a), beta: d3(&b) }).unwrap().into_dyn()
        })
        .collect();
    // O(√T) cached positions on the sq1 lattice, each B·C values of y and of x.
    let per_position = 2 * sizes().batch * sizes().channels;
    assert!(dec.cache_elems() <= per_position * 8, "cache {} elements", dec.cache_elems());
    check_prefixes("glr", &ys, |n| {
        // K(n) ≤ K(T) slots: the prefix keeps the first ones (the others never apply).
        let k = slots("sq1", None, n);
        let xs = prefix(&x["x"], n);
        let a = prefix(&x["alpha"], n).slice_axis(Axis(2), Slice::from(0..k + 1)).to_owned();
        let b = prefix(&x["beta"], n).slice_axis(Axis(2), Slice::from(0..k)).to_owned();
        ops::glr(d3(&xs), GlrCoeffs::Both { alpha: d4(&a), beta: d4(&b) }, &pattern, &o).unwrap().into_dyn()
    });
}

/// `glr_state` with the pattern on both sides (`on = "both"`): the state keeps the outputs in
/// `rows` and the inputs in `inputs`; prefill in two parts equals one prefill at every split,
/// a decoder started from the first part's state continues it and ends in the same state, and a
/// state without `inputs` (or with them for one side) is refused.
#[test]
fn glr_on_both_sides_prefills_from_a_two_stream_state_and_decodes_on() {
    let o = Options::default().backend(cpu());
    let x = inputs("glr", serde_json::json!({"pattern": "pow2", "cache_efficient": true, "on": "both"}));
    let pattern = GlrPattern::new("pow2").cache_efficient(true);
    let t_len = sizes().seq;
    let cut3 = |n: &str, r: std::ops::Range<usize>| cut(&x, n, r).into_dimensionality::<Ix3>().unwrap();
    let cut4 = |n: &str, r: std::ops::Range<usize>| cut(&x, n, r).into_dimensionality::<Ix4>().unwrap();
    let run = |r: std::ops::Range<usize>, s: Option<&ops::RowState<f64>>| {
        let (xs, a, b) = (cut3("x", r.clone()), cut4("alpha", r.clone()), cut4("beta", r));
        ops::glr_state(xs.view(), GlrCoeffs::Both { alpha: a.view(), beta: b.view() }, &pattern, s, &o)
    };
    let (y, s_t) = run(0..t_len, None).unwrap();
    let plain =
        ops::glr(v3(&x, "x"), GlrCoeffs::Both { alpha: v4(&x, "alpha"), beta: v4(&x, "beta") }, &pattern, &o)
            .unwrap();
    assert_eq!(y, plain, "from no state, the plain run's bits");
    assert!(s_t.inputs.is_some() && s_t.position == vec![t_len; sizes().batch]);
    for a in [1, 2, 3, 8, t_len - 1] {
        let (ya, sa) = run(0..a, None).unwrap();
        let (yb, sb) = run(a..t_len, Some(&sa)).unwrap();
        let joined = mixers::ndarray::concatenate(Axis(1), &[ya.view(), yb.view()]).unwrap();
        assert!(rel_diff(&joined.into_dyn(), &y.clone().into_dyn()) < 1e-12, "y split at {a}");
        assert!(rel_diff(&sb.rows.clone().into_dyn(), &s_t.rows.clone().into_dyn()) < 1e-12, "kept y at {a}");
        let (xb, xt) = (sb.inputs.clone().unwrap().into_dyn(), s_t.inputs.clone().unwrap().into_dyn());
        assert!(rel_diff(&xb, &xt) < 1e-12, "kept x at {a}");
        let mut dec = ops::GlrDecoder::from_state(pattern.clone(), t_len - a, &sa, &o).unwrap();
        for t in a..t_len {
            let (xt, at, bt) = (token(&x["x"], t), token(&x["alpha"], t), token(&x["beta"], t));
            let yt = dec.step(d2(&xt), GlrTokenCoeffs::Both { alpha: d3(&at), beta: d3(&bt) }).unwrap();
            let want = y.index_axis(Axis(1), t).to_owned().into_dyn();
            assert!(rel_diff(&yt.into_dyn(), &want) < 1e-12, "decode {t} after {a}");
        }
        let ds = dec.state().unwrap();
        assert_eq!(ds.position, s_t.position, "decoder position after {a}");
        assert!(rel_diff(&ds.rows.into_dyn(), &s_t.rows.clone().into_dyn()) < 1e-12, "decoder y after {a}");
    }
    let (_, s3) = run(0..3, None).unwrap();
    let one = ops::RowState::new(s3.rows.clone(), s3.position.clone());
    let e = run(3..t_len, Some(&one)).unwrap_err().to_string();
    assert!(e.contains("two streams") && e.contains("`inputs` is None"), "{e}");
    let (xs, a) = (cut3("x", 3..t_len), cut4("alpha", 3..t_len));
    let e = ops::glr_state(xs.view(), GlrCoeffs::A { alpha: a.view() }, &pattern, Some(&s3), &o)
        .unwrap_err()
        .to_string();
    assert!(e.contains("one stream") && e.contains("`inputs` is given"), "{e}");
}

#[test]
fn toeplitz_decoder_equals_the_fast_form_at_every_prefix() {
    let o = Options::default().backend(cpu());
    let x = inputs("toeplitz", serde_json::json!({"heads": 3, "kernel_width": 2}));
    let t_len = sizes().seq;
    let (w, bias) = (d3(&x["w"]), d2(&x["bias"]));
    let mut dec = ops::ToeplitzDecoder::new(w, Some(bias), t_len, &o).unwrap();
    let ys: Vec<ArrayD<f64>> =
        (0..t_len).map(|t| dec.step(d2(&token(&x["x"], t))).unwrap().into_dyn()).collect();
    check_prefixes("toeplitz", &ys, |n| {
        let xs = prefix(&x["x"], n);
        ops::toeplitz(d3(&xs), w, Some(bias), &o).unwrap().into_dyn()
    });
}

#[test]
fn decoders_refuse_bad_tokens_and_overruns() {
    let o = Options::default().backend(cpu());
    let (q, v) =
        (mixers::ndarray::Array3::<f64>::ones((1, 2, 3)), mixers::ndarray::Array3::<f64>::ones((1, 2, 4)));
    let g = mixers::ndarray::Array2::<f64>::zeros((1, 2));
    let mut dec = ops::Mamba2Decoder::new(2, &o).unwrap();
    let bad_g = mixers::ndarray::Array2::<f64>::from_elem((1, 2), 0.5);
    let e = dec.step(q.view(), q.view(), v.view(), bad_g.view()).unwrap_err().to_string();
    assert!(e.contains("`g`") && e.contains("≤ 0") && e.contains("0.5"), "{e}");
    assert_eq!(dec.position(), 0);
    let k_wrong = mixers::ndarray::Array3::<f64>::ones((1, 2, 5));
    let e = dec.step(q.view(), k_wrong.view(), v.view(), g.view()).unwrap_err().to_string();
    assert!(e.contains("`k`") && e.contains("Dk") && e.contains("first token"), "{e}");
    dec.step(q.view(), q.view(), v.view(), g.view()).unwrap();
    dec.step(q.view(), q.view(), v.view(), g.view()).unwrap();
    let e = dec.step(q.view(), q.view(), v.view(), g.view()).unwrap_err().to_string();
    assert!(e.contains("T = 2") && e.contains("step 3"), "{e}");

    // λ needs L ≥ L(max_len) levels: L(29) = 6.
    let mut dec = ops::LogLinearAttentionDecoder::new(29, &o).unwrap();
    let lam = mixers::ndarray::Array3::<f64>::ones((1, 2, 5));
    let e = dec.step(q.view(), q.view(), v.view(), lam.view()).unwrap_err().to_string();
    assert!(e.contains("L ≥ 6") && e.contains("L = 5"), "{e}");

    // The GLR side is fixed by the first token.
    let mut dec = ops::GlrDecoder::new(GlrPattern::new("pow2"), 6, &o).unwrap();
    let x = mixers::ndarray::Array2::<f64>::ones((1, 2));
    let a = mixers::ndarray::Array3::<f64>::ones((1, 4, 2)); // K(6) = 3: [B, K+1, C]
    dec.step(x.view(), GlrTokenCoeffs::A { alpha: a.view() }).unwrap();
    let beta = mixers::ndarray::Array3::<f64>::zeros((1, 3, 2));
    let e =
        dec.step(x.view(), GlrTokenCoeffs::B { alpha: x.view(), beta: beta.view() }).unwrap_err().to_string();
    assert!(e.contains("on = \"b\"") && e.contains("on = \"a\""), "{e}");
}

#[test]
fn options_that_do_not_apply_are_errors() {
    let x = inputs("attention", serde_json::json!({}));
    let (q, k, v) = (v4(&x, "q"), v4(&x, "k"), v4(&x, "v"));
    let o = Options::default().backend(cpu());
    let e = ops::attention(q, k, v, &o.clone().chunk(8)).unwrap_err().to_string();
    assert!(e.contains("`chunk`") && e.contains("scale, window"), "{e}");
    let e = ops::linear_attention(q, k, v, &o.clone().mask("fenwick")).unwrap_err().to_string();
    assert!(e.contains("`mask`"), "{e}");
    let e = ops::linear_attention(q, k, v, &o.clone().scale(f64::NAN)).unwrap_err().to_string();
    assert!(e.contains("finite") && e.contains("NaN"), "{e}");
    let e = ops::linear_attention(q, k, v, &o.clone().chunk(48)).unwrap_err().to_string();
    assert!(e.contains("power of two") && e.contains("48"), "{e}");
    // (q stands in for λ: the mask name fails first.)
    let e = ops::loglinear_attention(q, k, v, q, &o.clone().mask("fenwik")).unwrap_err().to_string();
    assert!(e.contains("did you mean `fenwick`"), "{e}");
    // Shapes are checked like the dynamic path's: v with another T.
    let v_short = x["v"].slice_axis(Axis(1), Slice::from(0..5)).to_owned();
    let e = ops::attention(q, k, d4(&v_short), &o).unwrap_err().to_string();
    assert!(e.contains("`v`") && e.contains("T"), "{e}");
}

#[test]
fn entries_given_by_value_must_be_the_registered_ones() {
    fn level(t: usize, s: usize) -> usize {
        usize::from(t != s)
    }
    fn levels(_: usize) -> usize {
        2
    }
    // Not registered under its name: the backends would find the real `fenwick` instead.
    static IMPOSTOR: mixers::registry::MaskEntry =
        mixers::registry::MaskEntry { name: "fenwick", doc: "not the real one", level, levels, cuda: None };
    static UNREGISTERED: mixers::registry::MaskEntry = mixers::registry::MaskEntry {
        name: "two-levels",
        doc: "never registered",
        level,
        levels,
        cuda: None,
    };
    let x = inputs("loglinear-attention", serde_json::json!({}));
    let call = |o: &Options| {
        ops::loglinear_attention(v4(&x, "q"), v4(&x, "k"), v4(&x, "v"), v4(&x, "lambda"), o).map(|_| ())
    };
    let o = Options::default().backend(cpu());
    let e = call(&o.clone().mask(&IMPOSTOR)).unwrap_err().to_string();
    assert!(e.contains("not the registered `fenwick`"), "{e}");
    let e = call(&o.clone().mask(&UNREGISTERED)).unwrap_err().to_string();
    assert!(e.contains("`two-levels`") && e.contains("not registered"), "{e}");
    call(&o.mask(mixers::registry::mask("fenwick").unwrap())).unwrap();
}

/// On the GPU machine (`MIXERS_REQUIRE_CUDA=1` turns a missing GPU into a failure): one
/// mixer per family agrees bit for bit with the dynamic path on CUDA, and the README's
/// example runs there.
#[test]
fn typed_calls_agree_with_the_dynamic_path_on_cuda() {
    if let Some(why) = mixers::cuda::device::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let cuda = Backend::by_name("cuda").unwrap();
    agree_both!(@on cuda; "attention", serde_json::json!({"window": 9}), Options::default().window(9), none, |x, o| {
        ops::attention(v4(x, "q"), v4(x, "k"), v4(x, "v"), o)
    });
    agree_both!(@on cuda; "loglinear-gated-deltanet", serde_json::json!({"chunk": 8}), Options::default().chunk(8), none, |x, o| {
        ops::loglinear_gated_deltanet(v4(x, "q"), v4(x, "k"), v4(x, "v"), v3(x, "g"), v3(x, "beta"), v4(x, "lambda"), o)
    });
    let cfg = serde_json::json!({"pattern": "sq1", "cache_efficient": true, "on": "both"});
    let pattern = GlrPattern::new("sq1").cache_efficient(true);
    agree_both!(@on cuda; "glr", cfg.clone(), Options::default(), none, |x, o| {
        ops::glr(v3(x, "x"), GlrCoeffs::Both { alpha: v4(x, "alpha"), beta: v4(x, "beta") }, &pattern, o)
    });
    agree_both!(@on cuda; "toeplitz", serde_json::json!({"heads": 3, "kernel_width": 2}), Options::default(), none, |x, o| {
        ops::toeplitz(v3(x, "x"), v3(x, "w"), Some(v2(x, "bias")), o)
    });
    prenorm_block::run(cuda).unwrap();
}

#[test]
fn readme_dependency_example_is_the_tested_example() {
    let readme = include_str!("../README.md");
    let example = include_str!("../examples/prenorm_block.rs");
    let block = format!("```rust\n{example}```");
    assert!(
        readme.contains(&block),
        "README.md's \"Using it as a dependency\" block must be examples/prenorm_block.rs verbatim"
    );
    prenorm_block::run(cpu()).unwrap();
}

/// Gated DeltaNet inputs `[1, T, 2, 3]`/`[1, T, 2, 4]` with unit keys, from the mixer's own draw.
fn gdn_inputs(t: usize, seed: u64) -> Tensors<f64> {
    let m = mixers::registry::mixer("gated-deltanet", &serde_json::json!({})).unwrap();
    let dims: mixers::core::Dims = [("B", 1), ("T", t), ("H", 2), ("Dk", 3), ("Dv", 4)].into_iter().collect();
    m.random_inputs(&dims, seed).unwrap()
}

fn cut<F: Clone>(x: &Tensors<F>, n: &str, r: std::ops::Range<usize>) -> ArrayD<F> {
    x[n].slice_axis(Axis(1), Slice::from(r)).to_owned()
}

fn close(a: impl IntoIterator<Item = f64>, b: impl IntoIterator<Item = f64>, tol: f64) -> bool {
    a.into_iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

/// Prefill in two parts (the second from the first's final state) equals one prefill, at
/// splits inside a chunk and on chunk boundaries; a decoder started from a prefill's final
/// state continues it token by token and ends in the same state.
#[test]
fn prefill_from_a_state_and_decoding_continue_the_sequence() {
    let t = 23;
    let x = gdn_inputs(t, 4);
    let opts = Options::default().chunk(8);
    let run = |r: std::ops::Range<usize>, s: Option<ArrayView4<f64>>| {
        let (q, k, v, g, b) = (
            cut(&x, "q", r.clone()),
            cut(&x, "k", r.clone()),
            cut(&x, "v", r.clone()),
            cut(&x, "g", r.clone()),
            cut(&x, "beta", r),
        );
        let f4 = |a: &ArrayD<f64>| a.view().into_dimensionality::<Ix4>().unwrap().to_owned();
        let f3 = |a: &ArrayD<f64>| a.view().into_dimensionality::<Ix3>().unwrap().to_owned();
        ops::gated_deltanet_state(
            f4(&q).view(),
            f4(&k).view(),
            f4(&v).view(),
            f3(&g).view(),
            f3(&b).view(),
            s,
            &opts,
        )
        .unwrap()
    };
    let (y, s_t) = run(0..t, None);
    let plain =
        ops::gated_deltanet(v4(&x, "q"), v4(&x, "k"), v4(&x, "v"), v3(&x, "g"), v3(&x, "beta"), &opts)
            .unwrap();
    assert_eq!(y, plain, "from no state, the plain form's bits");
    for a in [1, 7, 8, 9, 16, 22] {
        let (ya, sa) = run(0..a, None);
        let (yb, sb) = run(a..t, Some(sa.view()));
        let joined = mixers::ndarray::concatenate(Axis(1), &[ya.view(), yb.view()]).unwrap();
        assert!(close(joined.iter().copied(), y.iter().copied(), 1e-12), "y split at {a}");
        assert!(close(sb.iter().copied(), s_t.iter().copied(), 1e-12), "final state split at {a}");
        // Decode the rest from the prefill's state.
        let mut dec = ops::GatedDeltaNetDecoder::<f64>::from_state(t - a, sa.view(), &opts).unwrap();
        for s in a..t {
            let tok = |n: &str| x[n].index_axis(Axis(1), s).to_owned();
            let (q, k, v, g, b) = (tok("q"), tok("k"), tok("v"), tok("g"), tok("beta"));
            let ys = dec
                .step(
                    q.view().into_dimensionality().unwrap(),
                    k.view().into_dimensionality().unwrap(),
                    v.view().into_dimensionality().unwrap(),
                    g.view().into_dimensionality().unwrap(),
                    b.view().into_dimensionality().unwrap(),
                )
                .unwrap();
            assert!(
                close(ys.iter().copied(), y.index_axis(Axis(1), s).iter().copied(), 1e-12),
                "decode {s} after {a}"
            );
        }
        assert!(
            close(dec.state().unwrap().iter().copied(), s_t.iter().copied(), 1e-12),
            "decoder state after {a}"
        );
    }
    // A state of the wrong shape is refused with what was expected and given.
    let bad = mixers::ndarray::Array4::<f64>::zeros((1, 2, 3, 4));
    let e = ops::gated_deltanet_state(
        v4(&x, "q"),
        v4(&x, "k"),
        v4(&x, "v"),
        v3(&x, "g"),
        v3(&x, "beta"),
        Some(bad.view()),
        &opts,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("initial_state.S") && e.contains("[1, 2, 4, 3]") && e.contains("[1, 2, 3, 4]"), "{e}");
}

/// `Options::cu_seqlens`: a packed batch equals the sequences run one by one, bit for bit,
/// with zeros past the last offset; states come back one row per sequence; `B > 1` is refused.
#[test]
fn packed_batches_equal_the_sequences_one_by_one() {
    let t = 40;
    let x = gdn_inputs(t, 6);
    let cu = [0, 1, 1, 14, 37];
    let opts = Options::default().chunk(8).cu_seqlens(&cu);
    let (y, s) = ops::gated_deltanet_state(
        v4(&x, "q"),
        v4(&x, "k"),
        v4(&x, "v"),
        v3(&x, "g"),
        v3(&x, "beta"),
        None,
        &opts,
    )
    .unwrap();
    let y_plain =
        ops::gated_deltanet(v4(&x, "q"), v4(&x, "k"), v4(&x, "v"), v3(&x, "g"), v3(&x, "beta"), &opts)
            .unwrap();
    assert_eq!(y, y_plain);
    assert_eq!(s.shape(), [4, 2, 4, 3]);
    let one = Options::default().chunk(8);
    for (i, w) in cu.windows(2).enumerate() {
        let r = w[0]..w[1];
        let c4 = |n: &str| cut(&x, n, r.clone()).into_dimensionality::<Ix4>().unwrap();
        let c3 = |n: &str| cut(&x, n, r.clone()).into_dimensionality::<Ix3>().unwrap();
        let part = y.slice_axis(Axis(1), Slice::from(r.clone()));
        if r.is_empty() {
            assert!(
                s.index_axis(Axis(0), i).iter().all(|&v| v == 0.0),
                "an empty sequence keeps the zero state"
            );
            continue;
        }
        let (yi, si) = ops::gated_deltanet_state(
            c4("q").view(),
            c4("k").view(),
            c4("v").view(),
            c3("g").view(),
            c3("beta").view(),
            None,
            &one,
        )
        .unwrap();
        assert_eq!(part, yi.view(), "sequence {i}");
        assert_eq!(s.slice_axis(Axis(0), Slice::from(i..i + 1)), si.view(), "final state of sequence {i}");
    }
    assert!(y.slice_axis(Axis(1), Slice::from(37..)).iter().all(|&v| v == 0.0), "rows past the last offset");
    // Attention restarts at every sequence start too.
    let a =
        ops::attention(v4(&x, "q"), v4(&x, "k"), v4(&x, "v"), &Options::default().cu_seqlens(&[0, 14, 40]))
            .unwrap();
    let a2 = ops::attention(
        cut(&x, "q", 14..40).into_dimensionality::<Ix4>().unwrap().view(),
        cut(&x, "k", 14..40).into_dimensionality::<Ix4>().unwrap().view(),
        cut(&x, "v", 14..40).into_dimensionality::<Ix4>().unwrap().view(),
        &Options::default(),
    )
    .unwrap();
    assert_eq!(a.slice_axis(Axis(1), Slice::from(14..40)), a2.view());
    // B > 1 with offsets is refused, as fla does.
    let q2 = mixers::ndarray::concatenate(Axis(0), &[v4(&x, "q"), v4(&x, "q")]).unwrap();
    let e = ops::linear_attention(q2.view(), q2.view(), q2.view(), &Options::default().cu_seqlens(&[0, 5]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cu_seqlens") && e.contains("B = 2"), "{e}");
}

/// The lifts' `*_state` functions and decoders (docs/math.md §7.1): prefill in two parts equals
/// one prefill at splits inside chunks, on chunk boundaries and on Fenwick level boundaries; a
/// decoder started from a prefill's `LevelState` continues it and ends in the same state; a
/// state at a position that needs more levels than `lambda` has is refused.
#[test]
fn lifts_prefill_from_a_level_state_and_decode_on() {
    let t = 23;
    let x = gdn_inputs(t, 5);
    let (nb, nh) = (x["q"].shape()[0], x["q"].shape()[2]);
    let lam = mixers::ndarray::Array4::<f64>::from_shape_fn((nb, t, nh, 6), |(b, s, h, l)| {
        0.2 + ((b * 5 + s * 3 + h * 7 + l * 11) % 13) as f64 / 10.0
    });
    let opts = Options::default().chunk(4);
    let f4 = |a: &ArrayD<f64>| a.view().into_dimensionality::<Ix4>().unwrap().to_owned();
    let f3 = |a: &ArrayD<f64>| a.view().into_dimensionality::<Ix3>().unwrap().to_owned();
    let run = |r: std::ops::Range<usize>, s: Option<&ops::LevelState<f64>>| {
        let l = lam.slice_axis(Axis(1), Slice::from(r.clone())).to_owned();
        ops::loglinear_gated_deltanet_state(
            f4(&cut(&x, "q", r.clone())).view(),
            f4(&cut(&x, "k", r.clone())).view(),
            f4(&cut(&x, "v", r.clone())).view(),
            f3(&cut(&x, "g", r.clone())).view(),
            f3(&cut(&x, "beta", r)).view(),
            l.view(),
            s,
            &opts,
        )
        .unwrap()
    };
    let (y, s_t) = run(0..t, None);
    assert_eq!(s_t.position, vec![t; nb]);
    let plain = ops::loglinear_gated_deltanet(
        v4(&x, "q"),
        v4(&x, "k"),
        v4(&x, "v"),
        v3(&x, "g"),
        v3(&x, "beta"),
        lam.view(),
        &opts,
    )
    .unwrap();
    assert!(close(y.iter().copied(), plain.iter().copied(), 1e-12), "from no state, the plain form");
    for a in [1, 3, 4, 8, 9, 16, 17, 22] {
        let (ya, sa) = run(0..a, None);
        let (yb, sb) = run(a..t, Some(&sa));
        let joined = mixers::ndarray::concatenate(Axis(1), &[ya.view(), yb.view()]).unwrap();
        assert!(close(joined.iter().copied(), y.iter().copied(), 1e-12), "y split at {a}");
        assert!(close(sb.s.iter().copied(), s_t.s.iter().copied(), 1e-12), "final state split at {a}");
        let mut dec = ops::LogLinearGatedDeltaNetDecoder::<f64>::from_state(t - a, &sa, &opts).unwrap();
        for s in a..t {
            let tok = |n: &str| x[n].index_axis(Axis(1), s).to_owned();
            let (q, k, v, g, b) = (tok("q"), tok("k"), tok("v"), tok("g"), tok("beta"));
            let l = lam.index_axis(Axis(1), s).to_owned();
            let ys = dec
                .step(
                    q.view().into_dimensionality().unwrap(),
                    k.view().into_dimensionality().unwrap(),
                    v.view().into_dimensionality().unwrap(),
                    g.view().into_dimensionality().unwrap(),
                    b.view().into_dimensionality().unwrap(),
                    l.view(),
                )
                .unwrap();
            assert!(
                close(ys.iter().copied(), y.index_axis(Axis(1), s).iter().copied(), 1e-12),
                "decode {s} after {a}"
            );
        }
        let ds = dec.state().unwrap();
        assert_eq!(ds.position, s_t.position);
        assert!(close(ds.s.iter().copied(), s_t.s.iter().copied(), 1e-12), "decoder state after {a}");
    }
    // From position 30, 23 more tokens need L(53) = 7 levels; lambda has 6.
    let mut far = s_t.clone();
    far.position = vec![30; nb];
    far.s.fill(0.0);
    let e = ops::loglinear_gated_deltanet_state(
        v4(&x, "q"),
        v4(&x, "k"),
        v4(&x, "v"),
        v3(&x, "g"),
        v3(&x, "beta"),
        lam.view(),
        Some(&far),
        &opts,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("L(53) = 7") && e.contains("L = 6"), "{e}");
}
