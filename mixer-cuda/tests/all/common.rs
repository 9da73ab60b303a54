//! Shared helpers of the GPU tests: skip-or-fail on a missing device, and a cross-check of
//! every CUDA form against the f64 oracle and the CPU forms through `harness::check`.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use mixer_core::{DType, Form};
use mixer_registry::suite::check_mixer;
use mixer_registry::{Backend, Sizes, check, mixer, run::forms};

/// The CPU backend.
pub fn cpu() -> Backend {
    Backend::by_name("cpu").expect("cpu backend")
}

/// The CUDA backend (call after [`gpu`] said it is usable).
pub fn cuda() -> Backend {
    Backend::by_name("cuda").expect("cuda backend")
}

/// Device tests run side by side (each holds a read turn) except those that measure the
/// process's device allocations, which run alone (a write turn): the buffer pool is shared by
/// every thread, so a test beside them would take the buffers they expect to reuse.
static DEVICE_TURNS: RwLock<()> = RwLock::new(());

/// A device test's turn, held until the returned guard drops: `None` (after printing why) when
/// no GPU is usable (panics instead under `MIXERS_REQUIRE_CUDA=1`).
pub fn gpu() -> Option<RwLockReadGuard<'static, ()>> {
    usable().then(|| DEVICE_TURNS.read().unwrap_or_else(|e| e.into_inner()))
}

/// [`gpu`] for a test that must run with no other device test beside it.
pub fn gpu_alone() -> Option<RwLockWriteGuard<'static, ()>> {
    usable().then(|| DEVICE_TURNS.write().unwrap_or_else(|e| e.into_inner()))
}

/// `true` when a GPU is usable; prints the reason otherwise.
fn usable() -> bool {
    match mixer_cuda::device::skip_reason() {
        None => true,
        Some(why) => {
            eprintln!("skipped: no usable CUDA device: {why}");
            false
        }
    }
}

/// Runs `harness::check` for `name` with `config` on the CPU and CUDA backends at each of
/// `sizes`; asserts that the CUDA backend offers `want` forms, that every row passes its
/// tolerance (f32: rel RMS ≤ 1e-4; f64: ≤ 1e-9), and prints one `CHECK` line per row.
/// Returns the worst CUDA f32 relative RMS error.
pub fn cross_check(name: &str, config: &str, sizes: &[Sizes], want: &[Form]) -> f64 {
    let cfg: serde_json::Value = serde_json::from_str(config).expect("test config is JSON");
    let m = mixer(name, &cfg).unwrap_or_else(|e| panic!("{name} {config}: {e}"));
    let have = forms(m.as_ref(), &cuda());
    for f in want {
        assert!(have.contains(f), "{name}: cuda lacks form {f}; has {have:?}");
    }
    let backends = [cpu(), cuda()];
    let mut worst = 0.0f64;
    let mut failures = Vec::new();
    for (i, s) in sizes.iter().enumerate() {
        let rows = check(m.as_ref(), &backends, s, 1000 + i as u64);
        assert!(rows.iter().any(|r| r.backend == "cuda"), "{name}: no cuda rows");
        for r in &rows {
            println!(
                "CHECK {name} {config} backend={} form={} dtype={} T={} rel_rms={:.3e} max_abs={:.3e} pass={} {}",
                r.backend,
                r.form,
                r.dtype.name(),
                r.seq,
                r.rel_rms,
                r.max_abs,
                r.pass,
                r.error.as_deref().unwrap_or("")
            );
            if r.backend == "cuda" && r.dtype == DType::F32 && r.rel_rms.is_finite() {
                worst = worst.max(r.rel_rms);
            }
            // `check` runs only the forms the registry lists as available, so every row counts.
            if !r.pass {
                failures.push(format!(
                    "{} {} {} T={}: rel_rms {:.3e} {}",
                    r.backend,
                    r.form,
                    r.dtype.name(),
                    r.seq,
                    r.rel_rms,
                    r.error.as_deref().unwrap_or("")
                ));
            }
        }
    }
    println!("WORST {name} {config} cuda f32 rel_rms={worst:.3e}");
    assert!(failures.is_empty(), "{name} {config}: failed rows:\n{}", failures.join("\n"));
    worst
}

/// Sizes with `T` not a power of two and odd head/channel counts.
pub fn sizes(seqs: &[usize]) -> Vec<Sizes> {
    seqs.iter().map(|&t| Sizes { batch: 2, seq: t, channels: 6, heads: 2, dk: 5, dv: 3 }).collect()
}

/// Runs the shared backend suite on CUDA for each configuration, prints every case, and panics
/// with every failed one; returns the number of cases.
pub fn suite_on(configs: Vec<(&str, serde_json::Value)>, sizes: &Sizes) -> usize {
    let cuda = cuda();
    let mut cases = Vec::new();
    for (i, (name, cfg)) in configs.into_iter().enumerate() {
        let m = mixer(name, &cfg).unwrap_or_else(|e| panic!("{name} {cfg}: {e}"));
        cases.extend(check_mixer(m.as_ref(), &cuda, sizes, 40 + i as u64));
    }
    for c in &cases {
        println!("SUITE {c}");
    }
    let failed: Vec<String> = cases.iter().filter(|c| c.failure.is_some()).map(|c| c.to_string()).collect();
    assert!(failed.is_empty(), "{} of {} cases failed:\n{}", failed.len(), cases.len(), failed.join("\n"));
    cases.len()
}
