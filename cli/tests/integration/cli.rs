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
    // The link rule is part of the message, with the plugin crates this binary links.
    assert_one_line_error(
        &err,
        &[
            "unknown pattern `pow3`",
            "pow2",
            "plugin crates linked into this binary: mixers_plugin_fibonacci",
            "use plugin_crate as _;",
        ],
    );
}

#[test]
fn list_names_the_linked_plugin_and_its_entries() {
    let (code, out, err) = mixers(&["list"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("plugin crates linked: mixers_plugin_fibonacci\n"), "{out}");
    assert!(!out.contains("DUPLICATE") && !err.contains("warning"), "{out}\n{err}");
    let fib = out.lines().find(|l| l.trim_start().starts_with("fibonacci ")).expect("a fibonacci line");
    assert!(fib.ends_with("[from mixers_plugin_fibonacci]"), "{fib}");
    let pow2 = out.lines().find(|l| l.trim_start().starts_with("pow2 ")).expect("a pow2 line");
    assert!(!pow2.contains("[from"), "{pow2}");
}

#[test]
fn tour_ends_with_the_verdict_and_the_next_commands() {
    let (code, out, err) = mixers(&["tour", "--seq", "7", "--n", "64"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let verdict = out.find("## Verdict").expect("a verdict section");
    let structure = out.find("## Structure").expect("a structure section");
    assert!(structure < verdict, "the verdict comes last:\n{out}");
    let tail = &out[verdict..];
    assert!(tail.contains("\nPASS: ") && tail.contains("checks on backend `cpu`"), "{tail}");
    assert!(
        tail.contains("\nNext:\n")
            && tail.contains("mixers check --mixer")
            && tail.contains("mixers metrics")
    );
    for legend in ["- slots K: K(T)", "- congestion: ", "`≤ n` is an upper bound", "- deps/token: "] {
        assert!(out.contains(legend), "`{legend}` missing:\n{out}");
    }
    // The plugin's non-Fenwick mixer is explained, not silently thinner.
    assert!(out.contains("(registered as `log-distance-mamba2`) is checked in `parallel` only"), "{out}");
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

/// A `.npy` member: header for `descr` and `shape` (a Python tuple such as `(3,)`), then `data`.
fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Writes an `.npz` holding the given members, uncompressed.
fn npz(path: &std::path::Path, members: &[(&str, Vec<u8>)]) {
    use std::io::Write;
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in members {
        z.start_file(format!("{name}.npy"), opts).unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();
}

fn run_args<'a>(mixer: &'a str, inputs: &'a str, form: &'a str, out: &'a str) -> Vec<&'a str> {
    vec!["run", "--mixer", mixer, "--inputs", inputs, "--form", form, "--backend", "cpu", "--out", out]
}

/// Issue 14, defects 3 and 7: a small file whose header declares 10¹² elements is refused
/// before anything is allocated (it used to abort with exit 134), and a corrupt member is
/// reported with the dtype its header declares.
#[test]
fn npz_headers_are_checked_before_reading() {
    let p = tmp("lying.npz");
    npz(&p, &[("x", npy("<f8", "(1000000, 1000000)", &[0u8; 2048]))]);
    assert!(std::fs::metadata(&p).unwrap().len() < 4096);
    let out = tmp("lying_y.npz");
    let (code, _, err) = mixers(&run_args("glr", p.to_str().unwrap(), "fast", out.to_str().unwrap()));
    assert_eq!(code, 2, "{err}");
    assert_one_line_error(&err, &["array `x`", "[1000000, 1000000]", "8000000000000 bytes", "2048 bytes"]);
    // A truncated f64 member: the error names f64 (<f8), not f32.
    npz(&p, &[("x", npy("<f8", "(3,)", &[0u8; 20]))]);
    let (code, _, err) = mixers(&run_args("glr", p.to_str().unwrap(), "fast", out.to_str().unwrap()));
    assert_eq!(code, 2);
    assert_one_line_error(&err, &["array `x`", "<f8", "24 bytes", "20 bytes"]);
    assert!(!err.contains("f4"), "{err}");
    // Within the file's means but above the memory budget.
    npz(&p, &[("x", npy("<f4", "(1000, 1000)", &vec![0u8; 4_000_000]))]);
    let o = Command::new(env!("CARGO_BIN_EXE_mixers"))
        .args(run_args("glr", p.to_str().unwrap(), "fast", out.to_str().unwrap()))
        .env("MIXERS_MAX_MEMORY", "1M")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert_one_line_error(
        &String::from_utf8_lossy(&o.stderr),
        &["3.8 MiB", "1.0 MiB", "MIXERS_MAX_MEMORY=1M"],
    );
}

/// Issue 14, defects 1 and 2: T = 0 with H = 2 (the issue's repro) and Dv = 0 in the
/// recurrent form give an empty `y`, not a panic.
#[test]
fn empty_sequence_and_value_dims_run() {
    use mixers::core::Tensor;
    use ndarray::{ArrayD, IxDyn};
    let z = |s: &[usize]| Tensor::F32(ArrayD::zeros(IxDyn(s)));
    for (t, dv) in [(0, 3), (4, 0)] {
        let p = tmp(&format!("empty_{t}_{dv}.npz"));
        let (q, k, v, g) = (z(&[1, t, 2, 4]), z(&[1, t, 2, 4]), z(&[1, t, 2, dv]), z(&[1, t, 2]));
        mixers::io::write_npz(&p, &[("q", &q), ("k", &k), ("v", &v), ("g", &g)]).unwrap();
        for form in ["fast", "parallel", "recurrent", "materialized"] {
            let out = tmp(&format!("empty_{t}_{dv}_{form}_y.npz"));
            let (code, _, err) =
                mixers(&run_args("mamba2", p.to_str().unwrap(), form, out.to_str().unwrap()));
            assert_eq!(code, 0, "T={t} Dv={dv} {form}: {err}");
            match mixers::io::read_npz(&out).unwrap() {
                mixers::core::AnyTensors::F32(m) => assert_eq!(m["y"].shape(), &[1, t, 2, dv]),
                other => panic!("f32 in, {:?} out", other.dtype()),
            }
        }
    }
}

/// Issue 14, defect 4: forms whose working memory exceeds the budget are refused with the
/// estimate and the limit, before allocating; `check` reports it per row; `bench` records
/// the point as skipped and still writes its report.
#[test]
fn memory_estimates_are_checked_before_allocating() {
    use mixers::core::Tensor;
    use ndarray::{ArrayD, IxDyn};
    let t = 100_000;
    let f = |s: &[usize]| Tensor::F32(ArrayD::from_shape_fn(IxDyn(s), |i| ((i[1] % 7) as f32) / 7.0));
    let p = tmp("long.npz");
    mixers::io::write_npz(
        &p,
        &[("q", &f(&[1, t, 1, 2])), ("k", &f(&[1, t, 1, 2])), ("v", &f(&[1, t, 1, 2]))],
    )
    .unwrap();
    let out = tmp("long_y.npz");
    let with_budget = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_mixers"))
            .args(args)
            .env("MIXERS_MAX_MEMORY", "2G")
            .output()
            .unwrap();
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    for form in ["materialized", "parallel"] {
        let (code, _, err) =
            with_budget(&run_args("attention", p.to_str().unwrap(), form, out.to_str().unwrap()));
        assert_eq!(code, 2, "{form}: {err}");
        assert_one_line_error(
            &err,
            &[form, "T=100000", "GiB of working memory", "limit of 2.0 GiB", "MIXERS_MAX_MEMORY=2G"],
        );
    }
    // The streaming form of local attention is O(T·w) in time and O(T) in memory: it runs.
    let (code, _, err) =
        with_budget(&run_args("local-attention", p.to_str().unwrap(), "fast", out.to_str().unwrap()));
    assert_eq!(code, 0, "{err}");
    // check: the oracle of attention at T = 1e5 would be 2·2 dense 1e5² matrices.
    let (code, out_text, _) = with_budget(&["check", "--mixer", "attention", "--seq", "100000"]);
    assert_eq!(code, 1);
    assert!(out_text.contains("oracle:") && out_text.contains("working memory"), "{out_text}");
    // check at T = 1e6: the glr inputs alone (beta [2, 1e6, 20, 6] in f64) exceed 1 GiB.
    let o = Command::new(env!("CARGO_BIN_EXE_mixers"))
        .args(["check", "--mixer", "glr", "--seq", "1000000"])
        .env("MIXERS_MAX_MEMORY", "1G")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1));
    assert!(text.contains("random inputs:") && text.contains("limit of 1.0 GiB"), "{text}");
    // bench: the parallel point at T = 1e5 is skipped with the estimate; bench.md is written.
    let dir = tmp("bench_mem");
    let (code, _, err) = with_budget(&[
        "bench",
        "--mixer",
        "attention",
        "--form",
        "parallel",
        "--seq",
        "100000",
        "--heads",
        "1",
        "--dim",
        "2",
        "--reps",
        "1",
        "--max-seconds",
        "20",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let md = std::fs::read_to_string(dir.join("bench.md")).unwrap();
    let row = md
        .lines()
        .find(|l| l.contains("| parallel |") && l.contains("| 100000 |"))
        .expect("a parallel row at T = 1e5");
    assert!(row.contains("skipped:") && row.contains("working memory"), "{row}");
}

/// Issue 14, defect 5: `metrics --n` is bounded by an estimate of the search, refused at
/// once instead of a capacity-overflow panic, an abort, or minutes of work.
#[test]
fn metrics_sizes_are_bounded() {
    for n in ["9223372036854775807", "4294967296", "100000000"] {
        let t0 = std::time::Instant::now();
        let (code, _, err) = mixers(&["metrics", "--pattern", "pow2", "--n", n]);
        assert_eq!(code, 2, "{n}: {err}");
        assert_one_line_error(&err, &["pattern `pow2`", &format!("T = {n}"), "search steps", "limit"]);
        assert!(t0.elapsed().as_secs() < 10, "{n}: {:?}", t0.elapsed());
    }
    let (code, _, err) = mixers(&["metrics", "--pattern", "pow2", "--cache-efficient", "--n", "1000000"]);
    assert_eq!(code, 2);
    assert_one_line_error(&err, &["search steps"]);
}

/// Issue 14, defects 8 and 9: `check` sizes channels from a Toeplitz config (heads 4, 5, 12
/// used to fail with C = 6) and takes `--channels`; batch 0 and `tour --n 0` are refused.
#[test]
fn check_sizes_inputs_from_the_config() {
    for h in [4, 5, 12] {
        let cfg = format!(r#"{{"heads": {h}}}"#);
        let (code, out, err) =
            mixers(&["check", "--mixer", "toeplitz", "--config", &cfg, "--backend", "cpu", "--seq", "11"]);
        assert_eq!(code, 0, "heads {h}: {out}{err}");
    }
    let (code, _, _) = mixers(&[
        "check",
        "--mixer",
        "toeplitz",
        "--config",
        r#"{"heads": 3}"#,
        "--channels",
        "9",
        "--backend",
        "cpu",
    ]);
    assert_eq!(code, 0);
    // An explicit C that the config cannot use is reported, not changed.
    let (code, out, _) = mixers(&[
        "check",
        "--mixer",
        "toeplitz",
        "--config",
        r#"{"heads": 4}"#,
        "--channels",
        "6",
        "--backend",
        "cpu",
    ]);
    assert_eq!(code, 1);
    assert!(out.contains("divisible by heads = 4"), "{out}");
    let (code, _, err) = mixers(&["check", "--mixer", "glr", "--batch", "0"]);
    assert_eq!(code, 2);
    assert_one_line_error(&err, &["--batch must be ≥ 1, given 0"]);
    let (code, _, err) = mixers(&["tour", "--n", "0"]);
    assert_eq!(code, 2);
    assert_one_line_error(&err, &["--n must be ≥ 1"]);
}

/// Issue 14, defect 6: a divergent GLR (Σ|β| > 1) overflows; the run is an error that says
/// so, not NaN with exit 0.
#[test]
fn divergent_recurrences_are_reported() {
    use mixers::core::Tensor;
    use ndarray::{ArrayD, IxDyn};
    let (t, c) = (3000, 2);
    let k = 12; // K(T) of pow2 at T = 3000
    let p = tmp("diverge.npz");
    let x = Tensor::F64(ArrayD::from_elem(IxDyn(&[1, t, c]), 1.0));
    let alpha = Tensor::F64(ArrayD::from_elem(IxDyn(&[1, t, c]), 1.0));
    let beta = Tensor::F64(ArrayD::from_elem(IxDyn(&[1, t, k, c]), 0.9));
    mixers::io::write_npz(&p, &[("x", &x), ("alpha", &alpha), ("beta", &beta)]).unwrap();
    let out = tmp("diverge_y.npz");
    for form in ["fast", "recurrent"] {
        let (code, _, err) = mixers(&run_args("glr", p.to_str().unwrap(), form, out.to_str().unwrap()));
        assert_eq!(code, 2, "{form}: {err}");
        assert_one_line_error(&err, &["numerical:", "although every input is finite", "Σ_k |beta[t,k]| > 1"]);
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

fn pow3(k: usize) -> u64 {
    3u64.saturating_pow(k as u32)
}

#[mixers::registry::register]
static POW3: mixers::registry::PatternEntry =
    mixers::registry::PatternEntry { name: "cli-test-pow3", doc: "f(k) = 3^k", offset: pow3 };

/// The library entry point a researcher's own binary calls (`mixers_cli::main_with`), with a
/// pattern registered by the calling crate: the commands see it like a builtin.
#[test]
fn main_with_runs_the_commands_in_process() {
    assert_eq!(mixers_cli::main_with(["mixers", "metrics", "--pattern", "cli-test-pow3", "--n", "256"]), 0);
    assert_eq!(mixers_cli::main_with(["mixers", "metrics", "--pattern", "no-such-pattern", "--n", "256"]), 2);
    assert_eq!(mixers_cli::main_with(["mixers", "no-such-command"]), 2);
}

/// `mixers plan` prints the launch plan the CUDA log-linear family computes for those sizes
/// (no GPU needed: without one, the plan is for the backend's default limits), and refuses a
/// family that reports none.
#[test]
fn plan_prints_the_fast_forms_launch_plan_as_json() {
    use mixers::cuda::loglinear::{Device, Elem, Storage, plan};
    let args =
        ["plan", "--mixer", "loglinear-gated-deltanet", "--seq", "4099", "--heads", "3", "--dim", "70"];
    let (code, out, err) = mixers(&[&args[..], &["--precision", "tf32"]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let m = mixers::registry::mixer("loglinear-gated-deltanet", &serde_json::json!({})).unwrap();
    let ll =
        mixer_core::mixer::downcast::<mixer_core::mixers::loglinear::LogLinear>(m.as_ref(), "test").unwrap();
    let want = plan(
        ll,
        [1, 4099, 3, 70, 70],
        mixer_core::Precision::Tf32,
        Storage::Real(Elem::F32),
        Device::current(),
    )
    .unwrap();
    assert_eq!(v, serde_json::to_value(&want).unwrap());
    assert!(!v["launches"].as_array().unwrap().is_empty(), "{out}");
    assert!(v["state_pass"].is_object() || v["state_pass"].is_string(), "{out}");

    let path = tmp("plan.json");
    let (code, _, err) = mixers(&[&args[..], &["--out", path.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{err}");
    let f: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(f["precision"], serde_json::to_value(mixer_core::Precision::Exact).unwrap(), "{f}");

    let (code, _, err) = mixers(&["plan", "--mixer", "toeplitz"]);
    assert_eq!(code, 2);
    assert_one_line_error(&err, &["`toeplitz` family reports no launch plan for its fast form"]);
    // Attention: the kernel, its options and shared memory (the tf32 tensor-core kernel at D = 64).
    let (code, out, err) = mixers(&["plan", "--mixer", "attention", "--seq", "1000", "--precision", "tf32"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["kernel"], "mma_tf32", "{out}");
    assert_eq!(v["function"], "attn_mma_tf32", "{out}");
    assert_eq!(v["grid"], serde_json::json!([8, 16]), "{out}");
    // The tensor-core backward's launches under `backward` (bf16 at D = 32: its tiles fit the 48 KiB
    // of a machine without a device).
    let (code, out, err) =
        mixers(&["plan", "--mixer", "attention", "--seq", "1000", "--precision", "bf16", "--dim", "32"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["backward"]["dkdv"]["function"], "atc_dkdv_bf16", "{out}");
    assert_eq!(v["backward"]["dq"]["grid"], serde_json::json!([8, 16]), "{out}");
    assert_eq!(v["backward"]["forward"]["function"], v["function"], "{out}");
    let (code, _, err) = mixers(&["plan", "--mixer", "mamba2", "--dtype", "f64", "--precision", "tf32"]);
    assert_eq!(code, 2);
    assert_one_line_error(&err, &["--dtype", "f64 (the exact mode)"]);
}

/// `mixers run` with `initial_state`, `--final-state`, `cu_seqlens` and `d_final_state`: the
/// fast form's `y`, final state and gradients (the initial state's included) against the
/// materialized reference of the same call.
#[test]
fn run_carries_states_and_packed_batches() {
    use mixers::core::{AnyTensors, Tensor};
    let m = mixers::registry::mixer("mamba2", &serde_json::json!({"chunk": 4})).unwrap();
    let dims: mixers::core::Dims =
        [("B", 1), ("T", 11), ("H", 2), ("Dk", 3), ("Dv", 2)].into_iter().collect();
    let x = m.random_inputs(&dims, 7).unwrap();
    let s0 = ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(&[1, 2, 2, 3]), |i| {
        (i[1] + 2 * i[2] + i[3]) as f64 / 4.0 - 0.6
    });
    let mut arrays: Vec<(String, Tensor)> =
        x.iter().map(|(k, v)| (k.clone(), Tensor::F64(v.clone()))).collect();
    arrays.push(("initial_state".into(), Tensor::F64(s0)));
    let inp = tmp("state_in.npz");
    let refs: Vec<(&str, &Tensor)> = arrays.iter().map(|(k, v)| (k.as_str(), v)).collect();
    mixers::io::write_npz(&inp, &refs).unwrap();
    let dyp = tmp("state_dy.npz");
    let dy = Tensor::F64(x["v"].mapv(|a| a.sin()));
    let dfin = Tensor::F64(ndarray::ArrayD::from_elem(ndarray::IxDyn(&[1, 2, 2, 3]), 0.3));
    mixers::io::write_npz(&dyp, &[("dy", &dy), ("d_final_state", &dfin)]).unwrap();
    let run = |form: &str, extra: &[&str]| {
        let out = tmp(&format!("state_out_{form}_{}.npz", extra.len()));
        let mut args = run_args("mamba2{\"chunk\":4}", inp.to_str().unwrap(), form, out.to_str().unwrap());
        args.extend_from_slice(&["--grad", dyp.to_str().unwrap()]);
        args.extend_from_slice(extra);
        let (code, _, err) = mixers(&args);
        assert_eq!(code, 0, "{err}");
        let AnyTensors::F64(got) = mixers::io::read_npz(&out).unwrap() else { panic!("f64 in, f64 out") };
        got
    };
    let fast = run("fast", &[]);
    let reference = run("materialized", &[]);
    let names: Vec<&str> = fast.keys().map(|k| k.as_str()).collect();
    assert_eq!(names, ["d_g", "d_initial_state", "d_k", "d_q", "d_v", "final_state", "y"]);
    for (k, w) in &reference {
        let c = mixers::core::Tolerance::F64.compare(fast[k].view(), w.view());
        assert!(c.pass, "{k}: {c:?}");
    }
    // Packed: two sequences, each from its own row of the initial state (here one row for
    // each of two sequences is needed, so one row is refused with the expected shape).
    let out = tmp("state_packed.npz");
    let mut args = run_args("mamba2{\"chunk\":4}", inp.to_str().unwrap(), "fast", out.to_str().unwrap());
    args.extend_from_slice(&["--cu-seqlens", "0,5,11"]);
    let (code, _, err) = mixers(&args);
    assert_ne!(code, 0);
    assert_one_line_error(&err, &["initial_state.S", "[2, 2, 2, 3]", "[1, 2, 2, 3]"]);
}
