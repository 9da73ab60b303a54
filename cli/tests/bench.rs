//! `mixers bench`: seq parsing, exponent fits with their interval, the counting allocator,
//! guards, and a tiny end-to-end bench through the library API on a test mixer registered
//! here (so the test does not depend on any family being present).

use std::any::Any;
use std::process::Command;
use std::sync::{Arc, Mutex};

use mixers::core::materialize::Materialization;
use mixers::core::mixer::{Decoder, Mixer};
use mixers::core::spec::{Dim, InputDecl, InputSpec};
use mixers::core::{Form, Real, Result, Tensors};
use mixers::registry::{DecoderFn, Family, FamilyEntry, FormFn, MixerEntry, register};
use mixers_cli::bench::{self, Fit, Options, Status, alloc, parse_seq};
use ndarray::{Array2, ArrayD, Axis};

#[global_allocator]
static ALLOC: bench::CountingAlloc = bench::CountingAlloc;

/// Every test of this file runs alone: the allocation counters are process-wide, so a test
/// that allocates or frees beside one that measures would shift its count.
static SERIAL: Mutex<()> = Mutex::new(());

/// `y_t = x_t + ½ y_{t−1}` per batch row and channel: `A = I`, `B = ½` on the subdiagonal.
#[derive(Debug)]
struct Ema;

impl Mixer for Ema {
    fn name(&self) -> &str {
        "bench-test-ema"
    }
    fn family(&self) -> &'static str {
        "bench-test-ema"
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
        let x = mixers::core::tensor::get(inputs, "x")?;
        let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let a = Arc::new(Array2::<f64>::eye(t));
        let mut r = Array2::<f64>::zeros((t, t));
        for i in 1..t {
            r[[i, i - 1]] = 0.5;
        }
        let r = Arc::new(r);
        let mut m = Materialization::new(t);
        for bi in 0..b {
            m.push(bi, 0..c, a.clone(), Some(r.clone()));
        }
        Ok(m)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn build(_: &str, _: &serde_json::Value) -> Result<Box<dyn Mixer>> {
    Ok(Box::new(Ema))
}

#[register]
static EMA: MixerEntry = MixerEntry {
    name: "bench-test-ema",
    family: "bench-test-ema",
    doc: "test: y_t = x_t + y_{t-1}/2",
    build,
    examples: &["{}"],
};

fn fast<F: Real>(_: &Ema, x: &Tensors<F>) -> Result<ArrayD<F>> {
    let mut y = mixers::core::tensor::get(x, "x")?.clone();
    let half = F::of(0.5);
    for t in 1..y.shape()[1] {
        let prev = y.index_axis(Axis(1), t - 1).to_owned();
        y.index_axis_mut(Axis(1), t).zip_mut_with(&prev, |a, &p| *a += half * p);
    }
    Ok(y)
}

struct EmaDecoder<F: Real> {
    state: Option<ArrayD<F>>,
    pos: usize,
}

impl<F: Real> Decoder<F> for EmaDecoder<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        let x = mixers::core::tensor::get(token, "x")?;
        let half = F::of(0.5);
        let y = match &self.state {
            Some(s) => {
                let mut y = x.clone();
                y.zip_mut_with(s, |a, &p| *a += half * p);
                y
            }
            None => x.clone(),
        };
        self.state = Some(y.clone());
        self.pos += 1;
        Ok(y)
    }
    fn cache_elems(&self) -> usize {
        self.state.as_ref().map_or(0, |s| s.len())
    }
    fn position(&self) -> usize {
        self.pos
    }
}

struct EmaCpu;

impl<F: Real> Family<F> for EmaCpu {
    type Mixer = Ema;
    fn fast(&self) -> Option<FormFn<Ema, F>> {
        Some(fast)
    }
    fn decoder(&self) -> Option<DecoderFn<Ema, F>> {
        Some(|_, _, _| Ok(Box::new(EmaDecoder::<F> { state: None, pos: 0 })))
    }
}

#[register]
static EMA_CPU: FamilyEntry =
    FamilyEntry { family: "bench-test-ema", backend: "cpu", f64: &EmaCpu, f32: &EmaCpu, device: None };

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("mixers-bench-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn ema_options(seqs: Vec<usize>) -> Options {
    Options {
        mixers: vec![("bench-test-ema".into(), serde_json::json!({}))],
        seqs,
        batch: 2,
        heads: 3,
        dim: 5,
        decode: true,
        max_seconds: 1.0,
        reps: 3,
        progress: false,
        ..Options::default()
    }
}

#[test]
fn seq_ranges_and_lists() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(parse_seq("1k..64k").unwrap(), vec![1024, 2048, 4096, 8192, 16384, 32768, 65536]);
    assert_eq!(parse_seq("1000,3000").unwrap(), vec![1000, 3000]);
    assert_eq!(parse_seq("64,128").unwrap(), vec![64, 128]);
    assert!(parse_seq("64k..1k").unwrap_err().to_string().contains("above its end"));
    assert!(parse_seq("1x").is_err());
}

#[test]
fn exponent_and_interval() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Exact T^2: exponent 2, zero error, interval present (more than two points).
    let pts: Vec<(usize, f64)> =
        [64usize, 128, 256, 512].iter().map(|&t| (t, 1e-9 * (t * t) as f64)).collect();
    let f = Fit::of("m", "cpu", Form::Fast, &pts).unwrap();
    assert!((f.exponent - 2.0).abs() < 1e-9, "{f:?}");
    assert!(f.se < 1e-9 && f.ci.unwrap() < 1e-8);
    assert_eq!((f.points, f.seq_min, f.seq_max), (4, 64, 512));
    // Noisy T^1: the ±2·se interval is 2·se wide each side and contains the truth here.
    let noise = [1.10, 0.92, 1.05, 0.97, 1.02];
    let pts: Vec<(usize, f64)> =
        [100usize, 200, 400, 800, 1600].iter().zip(noise).map(|(&t, n)| (t, t as f64 * n)).collect();
    let f = Fit::of("m", "cpu", Form::Fast, &pts).unwrap();
    let ci = f.ci.unwrap();
    assert!(f.se > 0.0 && (ci - 2.0 * f.se).abs() < 1e-15);
    assert!((f.exponent - ci..=f.exponent + ci).contains(&1.0), "{f:?}");
    assert!(f.display().contains(" ± "));
    // Two points: exponent, but no error estimate.
    let f = Fit::of("m", "cpu", Form::Fast, &[(10, 1.0), (20, 8.0)]).unwrap();
    assert!((f.exponent - 3.0).abs() < 1e-12 && f.ci.is_none());
    assert!(Fit::of("m", "cpu", Form::Fast, &[(10, 1.0)]).is_none());
}

#[test]
fn allocator_counts_peak_working_memory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let keep = vec![1u8; 1000];
    assert!(alloc::counting());
    assert!(alloc::current_bytes() >= 1000);
    let mb = 1 << 20;
    // Peak of 8 MiB, then freed, then 2 MiB: the peak is the 8 MiB, not the sum.
    let (_, peak) = alloc::measure(|| {
        let a = vec![1u8; 8 * mb];
        std::hint::black_box(&a);
        drop(a);
        let b = vec![1u8; 2 * mb];
        std::hint::black_box(&b);
    });
    let peak = peak.unwrap();
    assert!(peak >= 8 * mb && peak < 9 * mb, "peak {peak}");
    // Bytes live before the run are not counted.
    let (_, small) = alloc::measure(|| std::hint::black_box(keep.len()));
    assert!(small.unwrap() < 64 * 1024, "{small:?}");
    // Growth by realloc counts.
    let (_, grown) = alloc::measure(|| {
        let mut v: Vec<u8> = Vec::with_capacity(16);
        v.resize(3 * mb, 0);
        std::hint::black_box(&v);
    });
    assert!(grown.unwrap() >= 3 * mb);
}

#[test]
fn end_to_end_writes_tables_json_and_plots() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmp("e2e");
    let opts = ema_options(vec![64, 128]);
    let (report, files) = bench::bench_to(&opts, &dir).unwrap();
    for name in ["bench.md", "bench.json", "bench.png", "bench.svg"] {
        let p = dir.join(name);
        assert!(files.contains(&p), "{files:?}");
        assert!(std::fs::metadata(&p).unwrap().len() > 100, "{name} is too small");
    }
    let png = std::fs::read(dir.join("bench.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let svg = std::fs::read_to_string(dir.join("bench.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("bench-test-ema"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("bench.json")).unwrap()).unwrap();
    let points = json["points"].as_array().unwrap();
    // materialized, fast, recurrent × 2 lengths, all measured.
    assert_eq!(points.len(), 6, "{points:?}");
    assert!(points.iter().all(|p| p["status"] == "ok"), "{points:?}");
    assert_eq!(json["meta"]["channels"], 15);
    for p in &report.points {
        let t = p.timing.unwrap();
        assert!(t.reps >= 1 && t.min <= t.median && t.median <= t.max);
        let tps = p.tokens_per_s.unwrap();
        assert!((tps - (2 * p.seq) as f64 / t.median).abs() <= 1e-6 * tps);
        // The output alone is B·T·C f32 values.
        assert!(p.peak_bytes.unwrap() >= 2 * p.seq * 15 * 4, "{p:?}");
        match p.form {
            Form::Recurrent => assert_eq!(p.cache_elems, Some(2 * 15)),
            _ => assert_eq!(p.cache_elems, None),
        }
    }
    assert_eq!(report.fits.len(), 3);
    assert!(report.fits.iter().all(|f| f.points == 2 && f.ci.is_none()));
    let comps: Vec<&str> = report.ratios.iter().map(|r| r.comparison.as_str()).collect();
    assert!(comps.contains(&"materialized / fast (cpu)") && comps.contains(&"recurrent / fast (cpu)"));
    assert_eq!(report.ratios.len(), 4);
    let md = std::fs::read_to_string(dir.join("bench.md")).unwrap();
    for needle in ["## Scaling exponents", "## Ratios", "## Measurements", "T=128", "peak work mem"] {
        assert!(md.contains(needle), "{needle} missing from\n{md}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn guards_skip_and_never_extrapolate() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Materialized is not run above T = 4096 (the skipped point costs nothing).
    let mut opts = ema_options(vec![40, 5000]);
    opts.forms = vec![Form::Materialized];
    opts.decode = false;
    let r = bench::bench(&opts).unwrap();
    assert_eq!(r.points.len(), 2);
    assert_eq!(r.points[0].status, Status::Ok);
    assert_eq!(r.points[1].status, Status::Skipped);
    assert!(r.points[1].reason.as_deref().unwrap().contains("4096"));
    assert!(r.points[1].timing.is_none());
    // A budget every run exceeds: the first T is measured, the rest are listed as skipped.
    let mut opts = ema_options(vec![30, 60, 120]);
    opts.forms = vec![Form::Fast];
    opts.decode = false;
    opts.max_seconds = 1e-12;
    let r = bench::bench(&opts).unwrap();
    let st: Vec<Status> = r.points.iter().map(|p| p.status).collect();
    assert_eq!(st, vec![Status::Ok, Status::Skipped, Status::Skipped]);
    assert!(r.points[2].reason.as_deref().unwrap().contains("T = 30 took"), "{:?}", r.points[2]);
    assert!(r.points[1].timing.is_none() && r.points[2].tokens_per_s.is_none());
    assert!(r.fits.is_empty());
}

#[test]
fn bad_options_are_errors() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut o = ema_options(vec![10]);
    o.mixers = vec![("no-such-mixer".into(), serde_json::json!({}))];
    assert!(bench::bench(&o).unwrap_err().to_string().contains("no-such-mixer"));
    let mut o = ema_options(vec![10]);
    o.heads = 0;
    assert!(bench::bench(&o).unwrap_err().to_string().contains("--heads"));
    let mut o = ema_options(vec![10]);
    o.backends = vec!["nope".into()];
    assert!(bench::bench(&o).is_err());
}

/// The standard output of a `mixers` run that must succeed.
fn mixers_stdout(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_mixers")).args(args).output().expect("the mixers binary runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    text
}

fn mixers_cli(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mixers")).args(args).output().expect("the mixers binary runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn cli_errors_are_one_line() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (args, needle) in [
        (vec!["bench", "--seq", "4k..1k"], "--seq"),
        (vec!["bench", "--mixer", "a", "--mixer", "b", "--config", "{}"], "exactly one"),
        (vec!["bench", "--mixer", "no-such-mixer", "--seq", "16"], "no-such-mixer"),
        (vec!["bench", "--form", "fastest", "--seq", "16"], "fastest"),
        (vec!["bench", "--packed", "4", "--batch", "2", "--seq", "16"], "B = 1"),
        (vec!["bench", "--packed", "40", "--mixer", "mamba2", "--seq", "16"], "1..=T = 16, given 40"),
        (vec!["bench", "--packed", "4", "--backward", "--seq", "16"], "--backward"),
        (vec!["bench", "--states", "--seq", "16"], "--packed"),
    ] {
        let (code, err) = mixers_cli(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.starts_with("error: ") && err.contains(needle) && !err.contains("panicked"), "{err}");
    }
}

#[test]
fn inline_mixer_configs_parse() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (code, err) = mixers_cli(&["bench", "--mixer", "glr{\"pattern\":", "--seq", "16"]);
    assert_eq!(code, 2);
    assert!(err.contains("is not valid JSON"), "{err}");
    let (code, err) = mixers_cli(&["bench", "--mixer", "glr{}", "--config", "{}", "--seq", "16"]);
    assert_eq!(code, 2);
    assert!(err.contains("inline config"), "{err}");
}

/// `check` and `run` take the same `--mixer name{json}` form as `bench`: the inline config means
/// what `--config` means (the same rows, the same output), and both at once is an error.
#[test]
fn check_and_run_take_inline_mixer_configs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let check = |mixer: &str, config: Option<&str>| {
        let mut args = vec!["check", "--backend", "cpu", "--mixer", mixer, "--seq", "20"];
        if let Some(c) = config {
            args.extend(["--config", c]);
        }
        let out =
            Command::new(env!("CARGO_BIN_EXE_mixers")).args(&args).output().expect("the mixers binary runs");
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (code, inline) = check(r#"attention{"window":3}"#, None);
    assert_eq!(code, Some(0), "{inline}");
    let (code, separate) = check("attention", Some(r#"{"window":3}"#));
    assert_eq!(code, Some(0), "{separate}");
    assert!(inline.contains(r#""window":3"#), "{inline}");
    // The rows agree (config, backend, form, dtype, mode, T and both errors) up to the timing.
    let rows = |t: &str| -> Vec<String> {
        t.lines().filter(|l| l.starts_with("| attention")).map(|l| l.split('|').take(10).collect()).collect()
    };
    assert_eq!(rows(&inline).len(), 6, "{inline}");
    assert_eq!(rows(&inline), rows(&separate));
    let (code, err) = mixers_cli(&["check", "--mixer", "attention{}", "--config", "{}"]);
    assert_eq!(code, 2);
    assert!(err.contains("inline config"), "{err}");
    let (code, err) =
        mixers_cli(&["run", "--mixer", "glr{\"pattern\":", "--inputs", "none.npz", "--out", "x.npz"]);
    assert_eq!(code, 2);
    assert!(err.contains("not valid JSON"), "{err}");
}

#[test]
fn ratios_compare_forms_and_backends_at_equal_t() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    use mixers::timing::Timing;
    let pt = |backend: &str, form: Form, seq: usize, secs: f64| bench::Point {
        mixer: "m".into(),
        name: "m".into(),
        config: serde_json::json!({}),
        backend: backend.into(),
        form,
        seq,
        status: Status::Ok,
        reason: None,
        timing: Some(Timing { median: secs, min: secs, max: secs, reps: 1 }),
        tokens_per_s: None,
        peak_bytes: None,
        cache_elems: None,
        upload_s: None,
        download_s: None,
        plan: None,
    };
    let mut points = vec![
        pt("cpu", Form::Fast, 100, 2.0),
        pt("cpu", Form::Parallel, 100, 6.0),
        pt("cuda", Form::Fast, 100, 0.5),
        pt("cuda", Form::Fast, 200, 0.9),
        pt("cpu", Form::Fast, 300, 1.0),
    ];
    // A skipped point takes part in nothing.
    let mut skipped = pt("cpu", Form::Parallel, 300, 9.0);
    skipped.status = Status::Skipped;
    points.push(skipped);
    let r = bench::ratios(&points);
    let got: Vec<(String, usize, f64)> = r.iter().map(|x| (x.comparison.clone(), x.seq, x.ratio)).collect();
    assert_eq!(
        got,
        vec![("parallel / fast (cpu)".to_string(), 100, 3.0), ("cuda / cpu (fast)".to_string(), 100, 0.25)]
    );
    let f = bench::fits(&points);
    assert_eq!(f.len(), 2, "{f:?}"); // cpu fast (100, 300) and cuda fast (100, 200)
    assert!(f.iter().any(|x| x.backend == "cuda" && (x.exponent - (0.9f64 / 0.5).log2()).abs() < 1e-12));
}

/// `bench --packed`: one row per (mixer, backend, T, N) with both times and their ratio, forward
/// and backward.
#[test]
fn packed_batches_are_timed_against_one_sequence() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let text = mixers_stdout(&[
        "bench",
        "--packed",
        "1,5",
        "--mixer",
        "mamba2",
        "glr",
        "--backend",
        "cpu",
        "--seq",
        "37",
        "--reps",
        "1",
    ]);
    for mixer in ["mamba2", "glr"] {
        for n in ["1", "5"] {
            let row = text
                .lines()
                .find(|l| {
                    let c: Vec<&str> = l.split('|').map(str::trim).collect();
                    c.len() > 10 && c[1] == mixer && c[3] == "37" && c[4] == n
                })
                .unwrap_or_else(|| panic!("no row for {mixer} N = {n} in\n{text}"));
            let cells: Vec<f64> =
                row.split('|').map(str::trim).skip(5).filter_map(|c| c.parse().ok()).collect();
            assert_eq!(cells.len(), 6, "{row}");
            assert!(cells.iter().all(|&v| v > 0.0 && v.is_finite()), "{row}");
            // The ratio columns are the packed time over the one-sequence time (the times printed
            // to 0.001 ms, the ratio to 0.01).
            for (one, packed, ratio) in [(cells[0], cells[1], cells[2]), (cells[3], cells[4], cells[5])] {
                let slack = 0.0005 * (1.0 / one + packed / (one * one)) + 0.005;
                assert!((packed / one - ratio).abs() <= slack * 1.01, "{row}");
            }
        }
    }
}

/// `bench --packed --states`: the runs start from states (a line says so) and every mixer with a
/// state gets its rows.
#[test]
fn packed_batches_from_states_are_timed() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let text = mixers_stdout(&[
        "bench",
        "--packed",
        "3",
        "--states",
        "--mixer",
        "mamba2",
        "loglinear-mamba2",
        "--backend",
        "cpu",
        "--seq",
        "70",
        "--reps",
        "1",
    ]);
    assert!(text.contains("from random initial states"), "{text}");
    for mixer in ["mamba2", "loglinear-mamba2"] {
        let row = text.lines().find(|l| l.split('|').nth(1).map(str::trim) == Some(mixer));
        let row = row.unwrap_or_else(|| panic!("no row for {mixer} in\n{text}"));
        assert!(!row.contains("FAIL") && row.matches('|').count() == 11, "{row}");
    }
}
