//! The command line as a new user meets it: one-line errors, no panics, the metrics the
//! foundation promises.

use std::process::Command;

fn mixers(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mixers")).args(args).output().expect("the mixers binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_one_line_error(stderr: &str, needles: &[&str]) {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected a one-line error, got:\n{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for n in needles {
        assert!(lines[0].contains(n), "`{n}` not in: {}", lines[0]);
    }
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("mixers-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

#[test]
fn metrics_pow2_sq1_and_lattice_cache() {
    let (code, out, _) = mixers(&["metrics", "--pattern", "pow2", "--n", "4096"]);
    assert_eq!(code, 0);
    assert!(out.contains("shortest path: max 12,"), "{out}");
    let (_, out, _) = mixers(&["metrics", "--pattern", "sq1", "--n", "20000", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["max_shortest_path"].as_u64().unwrap() <= 4, "{out}");
    let (_, out, _) = mixers(&["metrics", "--pattern", "pow2", "--n", "4096", "--cache-efficient", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["cache_positions"].as_u64().unwrap() <= 13, "{out}");
}

#[test]
fn unknown_names_are_one_line_errors() {
    let (code, _, err) = mixers(&["check", "--mixer", "atention"]);
    assert_eq!(code, 2);
    assert_one_line_error(&err, &["unknown mixer `atention`", "did you mean `attention`"]);
    let (code, _, err) = mixers(&["metrics", "--pattern", "pow3", "--n", "10"]);
    assert_eq!(code, 2);
    assert_one_line_error(&err, &["unknown pattern `pow3`", "pow2"]);
}

#[test]
fn run_reports_wrong_shapes_and_missing_inputs() {
    use mixers::core::Tensor;
    use ndarray::{ArrayD, IxDyn};
    let z = |s: &[usize]| Tensor::F32(ArrayD::zeros(IxDyn(s)));
    // glr with on = b needs x [B,T,C], alpha [B,T,C], beta [B,T,K(T),C].
    let p = tmp("bad_shape.npz");
    let (x, alpha, beta) = (z(&[1, 5, 3]), z(&[1, 5, 4]), z(&[1, 5, 3, 3]));
    mixers::io::write_npz(&p, &[("x", &x), ("alpha", &alpha), ("beta", &beta)]).unwrap();
    let out = tmp("y.npz");
    let (code, _, err) =
        mixers(&["run", "--mixer", "glr", "--inputs", p.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert_one_line_error(&err, &["`alpha`", "C=3", "[1, 5, 4]"]);

    let p = tmp("missing.npz");
    let alpha = z(&[1, 5, 3]);
    mixers::io::write_npz(&p, &[("x", &x), ("alpha", &alpha)]).unwrap();
    let (code, _, err) =
        mixers(&["run", "--mixer", "glr", "--inputs", p.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert_one_line_error(&err, &["missing input `beta`"]);

    let (code, _, err) = mixers(&["run", "--mixer", "glr", "--inputs", "/nonexistent.npz", "--out", "y.npz"]);
    assert_eq!(code, 2);
    assert_one_line_error(&err, &["cannot open /nonexistent.npz"]);
}

#[test]
fn run_round_trips_through_npz_and_matches_the_oracle() {
    use mixers::prelude::*;
    let m = mixers::registry::mixer("glr", &serde_json::json!({"pattern": "sq1"})).unwrap();
    let sizes = Sizes { seq: 23, channels: 4, batch: 2, ..Sizes::default() };
    let inputs = m.random_inputs(&sizes.dims(), 5).unwrap();
    let p = tmp("ok.npz");
    mixers::io::write_tensors(&p, &inputs).unwrap();
    let out = tmp("ok_y.npz");
    let (code, _, err) = mixers(&[
        "run",
        "--mixer",
        "glr",
        "--config",
        r#"{"pattern":"sq1"}"#,
        "--inputs",
        p.to_str().unwrap(),
        "--form",
        "fast",
        "--backend",
        "cpu",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let y = match mixers::io::read_npz(&out).unwrap() {
        AnyTensors::F64(m) => m["y"].clone(),
        AnyTensors::F32(_) => panic!("f64 in, f64 out"),
    };
    let want = mixers::registry::run::oracle(m.as_ref(), &inputs).unwrap();
    assert!(Tolerance::F64.compare(y.view(), want.view()).pass);
}

#[test]
fn list_shows_every_kind_and_cuda_status() {
    let (code, out, _) = mixers(&["list"]);
    assert_eq!(code, 0);
    for needle in
        ["pow2", "sq1", "linear", "fenwick", "identity", "ones", "softplus", "glr", "attention", "toeplitz"]
    {
        assert!(out.contains(needle), "`{needle}` missing from list:\n{out}");
    }
    let cuda_line = out.lines().find(|l| l.trim_start().starts_with("cuda:")).expect("a cuda line");
    assert!(cuda_line.contains("available ("), "{cuda_line}");
}

#[test]
fn backend_environment_overrides() {
    use mixers::prelude::*;
    let m = mixers::registry::mixer("glr", &serde_json::json!({})).unwrap();
    let inputs = m.random_inputs(&Sizes { seq: 9, ..Sizes::default() }.dims(), 1).unwrap();
    let p = tmp("env.npz");
    mixers::io::write_tensors(&p, &inputs).unwrap();
    let out = tmp("env_y.npz");
    let args = ["run", "--mixer", "glr", "--inputs", p.to_str().unwrap(), "--out", out.to_str().unwrap()];
    let gpu = matches!(
        (mixers::registry::backend_entry("cuda").unwrap().probe)(),
        mixers::registry::Availability::Available(_)
    );
    let run_with = |k: &str, v: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_mixers")).args(args).env(k, v).output().unwrap();
        (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (code, err) = run_with("MIXERS_BACKEND", "cpu");
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("on cpu"), "{err}");
    let (code, err) = run_with("MIXERS_REQUIRE_CUDA", "1");
    if gpu {
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("on cuda"), "{err}");
    } else {
        assert_eq!(code, 2);
        assert_one_line_error(&err, &["backend `cuda` is not available", "MIXERS_REQUIRE_CUDA=1"]);
        let (code, err) = run_with("MIXERS_BACKEND", "cuda");
        assert_eq!(code, 2);
        assert_one_line_error(&err, &["backend `cuda` is not available"]);
    }
}

/// `run --grad` writes `y` and one `d_<input>` per input, in the inputs' dtype, equal to the
/// library's backward; `check --grad` passes for a mixer.
#[test]
fn run_grad_writes_input_gradients_and_check_grad_passes() {
    use mixers::core::{AnyTensors, Tensor};
    use mixers::prelude::*;
    let m = mixers::registry::mixer(
        "loglinear-mamba2",
        &serde_json::json!({"chunk": 8, "lambda_scheme": "softplus"}),
    )
    .unwrap();
    let x = mixers::registry::grad_check::grad_inputs(m.as_ref(), &Sizes { seq: 13, ..Sizes::default() }, 4)
        .unwrap();
    let x32: std::collections::BTreeMap<String, Tensor> =
        x.iter().map(|(k, v)| (k.clone(), Tensor::F32(v.mapv(|a| a as f32)))).collect();
    let inp = tmp("grad_in.npz");
    let refs: Vec<(&str, &Tensor)> = x32.iter().map(|(k, v)| (k.as_str(), v)).collect();
    mixers::io::write_npz(&inp, &refs).unwrap();
    let dy = Tensor::F32(x["v"].mapv(|a| (2.0 * a).cos() as f32));
    let dyp = tmp("dy.npz");
    mixers::io::write_npz(&dyp, &[("dy", &dy)]).unwrap();
    let out = tmp("grad_out.npz");
    let cfg = r#"{"chunk": 8, "lambda_scheme": "softplus"}"#;
    let args = ["run", "--mixer", "loglinear-mamba2", "--config", cfg, "--inputs", inp.to_str().unwrap()];
    let (code, _, err) =
        mixers(&[&args[..], &["--grad", dyp.to_str().unwrap(), "--out", out.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{err}");
    let AnyTensors::F32(got) = mixers::io::read_npz(&out).unwrap() else { panic!("f32 in, f32 out") };
    let names: Vec<&str> = got.keys().map(|k| k.as_str()).collect();
    assert_eq!(names, ["d_g", "d_k", "d_lambda", "d_lambda_param", "d_q", "d_v", "y"]);
    let want = mixers::registry::backward::backward_as(
        m.as_ref(),
        "cpu",
        Form::Materialized,
        &x,
        &dy.to_f64(),
        DType::F64,
        &Requires::All,
    )
    .unwrap();
    for (k, w) in &want {
        let c = Tolerance::F32.compare(got[k].mapv(|a| a as f64).view(), w.view());
        assert!(c.pass, "{k}: {c:?}");
    }
    // A cotangent of the wrong shape is a one-line error.
    let bad = Tensor::F32(ndarray::ArrayD::zeros(ndarray::IxDyn(&[1, 2, 3])));
    mixers::io::write_npz(&dyp, &[("dy", &bad)]).unwrap();
    let (code, _, err) =
        mixers(&[&args[..], &["--grad", dyp.to_str().unwrap(), "--out", out.to_str().unwrap()]].concat());
    assert_eq!(code, 2);
    assert_one_line_error(&err, &["`dy`", "[1, 2, 3]"]);
    let (code, out, err) = mixers(&["check", "--grad", "--mixer", "glr", "--seq", "11"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("finite-diff") && out.contains("| fast ") && out.contains("0 failed"), "{out}");
}
