//! Working-memory estimates and the memory budget: every form states, from the sizes alone
//! and before it allocates, about how many bytes it will hold at its peak, and a call whose
//! estimate exceeds the budget is refused with an error instead of aborting the process.
//!
//! The budget is `MIXERS_MAX_MEMORY` (bytes, or with a suffix `k`, `M`, `G`, `T` in powers
//! of 1024, e.g. `16G`) when set, else the memory the kernel reports as available
//! (`MemAvailable` in `/proc/meminfo`); where neither is known there is no budget.
//!
//! Estimates count what a call allocates (output, working copies, dense matrices), not the
//! inputs it is given. They are upper-bound style bookkeeping of the dominant terms — the
//! `T × T` matrices of the quadratic and materialized forms, the per-column buffers of the
//! linear ones — not measurements; `mixers bench` measures the real peak.
//! The families' formulas are [`attention`], [`glr`], [`loglinear`], [`toeplitz`], with
//! [`dense_oracle`] for the materialized form they share; a plugin mixer that does not
//! override [`Mixer::working_memory`](crate::mixer::Mixer::working_memory) gets
//! [`default_estimate`].

use crate::error::{Error, Result};
use crate::form::Form;
use crate::mixer::Mixer;
use crate::spec::{Dims, InputSpec};
use crate::tensor::DType;

/// Environment variable holding the memory budget.
pub const ENV: &str = "MIXERS_MAX_MEMORY";

/// Bytes of one scalar of the dense `f64` oracle.
const F64: f64 = 8.0;

/// A memory budget and where it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    /// Bytes.
    pub bytes: f64,
    /// `MIXERS_MAX_MEMORY=…` or `available memory (/proc/meminfo)`.
    pub source: String,
}

/// Parses a byte count: digits with an optional fraction and an optional suffix `k`, `M`,
/// `G` or `T` (powers of 1024, case-insensitive, an optional trailing `B`/`iB`).
pub fn parse_bytes(s: &str) -> Result<f64> {
    let bad = || {
        Error::Io(format!(
            "{ENV}: expected a byte count such as `12000000000`, `512M` or `16G` (k, M, G, T = powers of \
             1024), given `{s}`"
        ))
    };
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1024f64),
        Some('m' | 'M') => (&t[..t.len() - 1], 1024f64.powi(2)),
        Some('g' | 'G') => (&t[..t.len() - 1], 1024f64.powi(3)),
        Some('t' | 'T') => (&t[..t.len() - 1], 1024f64.powi(4)),
        _ => (t, 1.0),
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !(v.is_finite() && v > 0.0) {
        return Err(bad());
    }
    Ok(v * mult)
}

/// How long a reading of `/proc/meminfo` serves [`available_memory`]: reading the file costs
/// about 10 µs, which a call of a few tokens (a decoding step) would otherwise pay every time,
/// while the available memory of a machine moves on the scale of the allocations, not of
/// microseconds.
pub const MEMINFO_REFRESH: std::time::Duration = std::time::Duration::from_millis(50);

/// `MemAvailable` of `/proc/meminfo` in bytes, where the file exists, as read at most
/// [`MEMINFO_REFRESH`] ago (the process's last reading, shared by its threads).
pub fn available_memory() -> Option<f64> {
    use std::sync::Mutex;
    use std::time::Instant;
    static LAST: Mutex<Option<(Instant, Option<f64>)>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((at, bytes)) = *last
        && at.elapsed() < MEMINFO_REFRESH
    {
        return bytes;
    }
    let bytes = read_available_memory();
    *last = Some((Instant::now(), bytes));
    bytes
}

/// `MemAvailable` of `/proc/meminfo` in bytes, read now.
fn read_available_memory() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0)
}

/// The budget now: [`ENV`] when set (an error when it is not a byte count), else the
/// available memory, else `None`.
pub fn budget() -> Result<Option<Budget>> {
    if let Ok(s) = std::env::var(ENV) {
        return Ok(Some(Budget { bytes: parse_bytes(&s)?, source: format!("{ENV}={s}") }));
    }
    Ok(available_memory().map(|bytes| Budget { bytes, source: "available memory (/proc/meminfo)".into() }))
}

/// Bytes with a binary unit (`80.0 GiB`).
pub fn human(bytes: f64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut x = bytes;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{x:.0} B") } else { format!("{x:.1} {}", UNITS[u]) }
}

/// Refuses `estimate` bytes for `what` when they exceed `budget`.
pub fn check_against(what: &str, estimate: f64, budget: Option<&Budget>) -> Result<()> {
    match budget {
        Some(b) if estimate.is_nan() || estimate > b.bytes => Err(Error::OutOfMemory {
            what: what.to_string(),
            estimate: human(estimate),
            limit: human(b.bytes),
            budget_from: b.source.clone(),
        }),
        _ => Ok(()),
    }
}

/// Refuses `estimate` bytes for `what` when they exceed the current [`budget`].
pub fn check(what: &str, estimate: f64) -> Result<()> {
    check_against(what, estimate, budget()?.as_ref())
}

/// Refuses to run `form` of `m` at these sizes when its estimate exceeds the budget. The
/// message names the mixer, the form, the sizes, the estimate and the limit.
pub fn guard(m: &dyn Mixer, form: Form, dims: &Dims, dtype: DType) -> Result<()> {
    let est = m.working_memory(form, dims, elem_bytes(dtype));
    let sizes: Vec<String> = dims.iter().map(|(k, v)| format!("{k}={v}")).collect();
    check(&format!("`{}` {form} form at {}", m.name(), sizes.join(" ")), est)
}

/// Bytes of one scalar.
pub fn elem_bytes(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 4.0,
        DType::F64 => 8.0,
    }
}

/// A size from `dims`, as `f64`; absent sizes count as 1.
pub fn size(dims: &Dims, sym: &str) -> f64 {
    dims.get(sym).map_or(1.0, |&n| n as f64)
}

/// Number of scalars of input `name` of `spec` at these sizes (0 when unknown).
pub fn input_elems(spec: &InputSpec, dims: &Dims, name: &str) -> f64 {
    let Some(d) = spec.inputs.iter().find(|d| d.name == name) else { return 0.0 };
    d.shape
        .iter()
        .map(|s| match s {
            crate::spec::Dim::Fixed(n) => *n as f64,
            crate::spec::Dim::Sym(s) => size(dims, s),
        })
        .product()
}

/// Bytes of every (required) input of `spec` at these sizes, with `elem` bytes a scalar: what
/// drawing or loading the inputs takes.
pub fn inputs_bytes(spec: &InputSpec, dims: &Dims, elem: f64) -> f64 {
    spec.inputs.iter().filter(|d| !d.optional).map(|d| input_elems(spec, dims, d.name)).sum::<f64>() * elem
}

/// Worker threads that may each hold a per-task buffer at once.
fn threads() -> f64 {
    rayon::current_num_threads().max(1) as f64
}

/// At most `tasks` of the workers run at once.
fn concurrent(tasks: f64) -> f64 {
    tasks.min(threads()).max(1.0)
}

/// The materialized form (the dense `f64` oracle): `matrices` distinct `T×T` matrices of the
/// materialization, a dense copy of `A` and of `I − B` per block being solved at once
/// (`recurrent` blocks have a `B`), and `f64` copies of the inputs, the flattened mixed input
/// and the output (`mixed` scalars each).
pub fn dense_oracle(t: f64, matrices: f64, blocks: f64, recurrent: bool, inputs: f64, mixed: f64) -> f64 {
    let per_block = if recurrent { 2.0 } else { 1.0 };
    (matrices + concurrent(blocks) * per_block) * t * t * F64 + (inputs + 3.0 * mixed) * F64
}

/// Estimate for a mixer without its own formula: the materialized form assumes one `T×T`
/// matrix per batch row and index of the mixed input's third axis (per head or per
/// channel), with a recurrence; the other forms three copies of the output, plus `T × T`
/// per concurrent block for `parallel`.
pub fn default_estimate(spec: &InputSpec, form: Form, dims: &Dims, elem: f64) -> f64 {
    let t = size(dims, "T");
    let mixed = input_elems(spec, dims, spec.mixed);
    let groups = spec.inputs.iter().find(|d| d.name == spec.mixed).and_then(|d| d.shape.get(2)).map_or(
        1.0,
        |s| match s {
            crate::spec::Dim::Fixed(n) => *n as f64,
            crate::spec::Dim::Sym(s) => size(dims, s),
        },
    );
    let blocks = size(dims, "B") * groups;
    match form {
        Form::Materialized => {
            dense_oracle(t, 2.0 * blocks, blocks, true, inputs_bytes(spec, dims, 1.0), mixed)
        }
        Form::Parallel => 3.0 * mixed * elem + concurrent(blocks) * t * t * elem,
        Form::Fast | Form::Recurrent => 3.0 * mixed * elem,
    }
}

/// Softmax attention (`q, k [B,T,H,Dk]`, `v [B,T,H,Dv]`, window `w`): materialized `B·H`
/// dense `A`; parallel a `T×T` score matrix per concurrent head plus head-major copies of
/// `q, k, v` and two of the output; fast the same copies and `64×64` tiles; recurrent a KV
/// cache of `min(w, T)` tokens and the output.
pub fn attention(form: Form, dims: &Dims, elem: f64, window: Option<usize>) -> f64 {
    let (b, t, h, dk, dv) =
        (size(dims, "B"), size(dims, "T"), size(dims, "H"), size(dims, "Dk"), size(dims, "Dv"));
    let qkv = b * t * h * (2.0 * dk + dv);
    let out = b * t * h * dv;
    let heads = b * h;
    match form {
        Form::Materialized => dense_oracle(t, heads, heads, false, qkv, out),
        Form::Parallel => (qkv + 2.0 * out + concurrent(heads) * t * t) * elem,
        Form::Fast => (qkv + 2.0 * out + concurrent(heads) * 64.0 * (64.0 + dv)) * elem,
        Form::Recurrent => {
            let cap = window.map_or(t, |w| (w as f64).min(t));
            (cap * b * h * (dk + dv) + out + t.min(cap) * 2.0) * elem
        }
    }
}

/// Generalized linear recurrence (`x [B,T,C]`, `K` slots): materialized `B·C` dense `A` (and
/// `B` when the recurrence is on); fast the output, one `T × w` block per worker and
/// contiguous copies of the coefficients; recurrent a window of up to `T` past tokens per
/// stream (the bound for translation-invariant patterns) and the output.
pub fn glr(form: Form, dims: &Dims, elem: f64, recurrent: bool) -> f64 {
    let (b, t, c, k) = (size(dims, "B"), size(dims, "T"), size(dims, "C"), size(dims, "K"));
    let out = b * t * c;
    let coeffs = b * t * c * (2.0 * k + 2.0);
    let groups = b * c;
    match form {
        Form::Materialized => {
            let mats = if recurrent { 2.0 * groups } else { groups };
            dense_oracle(t, mats, groups, recurrent, coeffs + out, out)
        }
        Form::Parallel | Form::Fast => (coeffs + 3.0 * out) * elem,
        Form::Recurrent => (2.0 * t * b * c + 2.0 * out) * elem,
    }
}

/// Log-linear family (`q, k [B,T,H,Dk]`, `v [B,T,H,Dv]`, `λ [B,T,H,L]`, chunk `C`):
/// materialized `B·H` dense `A`; parallel `tile × T` masked scores per concurrent head (the
/// gated delta rule: four `T×T` matrices per concurrent head); fast per concurrent head a few
/// `C×C` chunk matrices and `log₂T + 1` states of `Dk×Dv`; recurrent `log₂T + 2` states per
/// head; all with the output and standard-layout copies of the inputs.
pub fn loglinear(form: Form, dims: &Dims, elem: f64, delta_rule: bool, chunk: usize) -> f64 {
    let (b, t, h, dk, dv) =
        (size(dims, "B"), size(dims, "T"), size(dims, "H"), size(dims, "Dk"), size(dims, "Dv"));
    let l = dims.get("L").map_or(1.0, |&n| n as f64);
    let ins = b * t * h * (2.0 * dk + dv + 2.0 + l);
    let out = b * t * h * dv;
    let heads = b * h;
    let levels = t.max(1.0).log2().ceil() + 2.0;
    let c = (chunk as f64).min(t);
    match form {
        Form::Materialized => dense_oracle(t, heads, heads, false, ins, out),
        Form::Parallel => {
            let per_head = if delta_rule { 4.0 * t * t } else { 3.0 * 128f64.min(t) * t };
            (ins + 2.0 * out + concurrent(heads) * (per_head + t * (dk + dv))) * elem
        }
        Form::Fast => {
            let per_head = 6.0 * c * c + 3.0 * levels * dk * dv + t * (dv + 2.0) + c * (dk + dv) * 4.0;
            (ins + 2.0 * out + concurrent(heads) * per_head) * elem
        }
        Form::Recurrent => (heads * levels * dk * dv + 2.0 * out) * elem,
    }
}

/// Toeplitz mixer (`x [B,T,C]`, `heads` kernels of width `Kw`): materialized `Kw·H` shared
/// dense `A` (one solve copy per concurrent block); parallel column copies of `x` and `y`;
/// fast the same plus complex spectra of size `p ≈ 2T` per column and per kernel; recurrent
/// the full input history and the output.
pub fn toeplitz(form: Form, dims: &Dims, elem: f64, heads: usize, kernel_width: usize) -> f64 {
    let (b, t, c) = (size(dims, "B"), size(dims, "T"), size(dims, "C"));
    let (h, kw) = (heads as f64, kernel_width as f64);
    let out = b * t * c;
    let kernels = (kw + 1.0) * h * t;
    match form {
        Form::Materialized => dense_oracle(t, kw * h, b * c, false, out + kernels, out),
        Form::Parallel => 3.0 * out * elem,
        Form::Fast => 3.0 * out * elem + (concurrent(b * c) + kw * h) * 2.0 * t * 2.0 * elem,
        Form::Recurrent => (3.0 * out + 2.0 * b * c * t) * elem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_parse() {
        assert_eq!(parse_bytes("1000").unwrap(), 1000.0);
        assert_eq!(parse_bytes("16G").unwrap(), 16.0 * 1024f64.powi(3));
        assert_eq!(parse_bytes(" 1.5k ").unwrap(), 1536.0);
        assert_eq!(parse_bytes("2MiB").unwrap(), 2.0 * 1024f64.powi(2));
        assert_eq!(parse_bytes("3TB").unwrap(), 3.0 * 1024f64.powi(4));
        for bad in ["", "G", "-1", "0", "lots", "1e400", "NaN"] {
            let e = parse_bytes(bad).unwrap_err().to_string();
            assert!(e.contains(ENV) && e.contains(&format!("`{bad}`")), "{bad}: {e}");
        }
    }

    #[test]
    fn over_budget_names_estimate_limit_and_source() {
        let b = Budget { bytes: 1024.0 * 1024.0, source: "test budget".into() };
        check_against("thing", 1024.0, Some(&b)).unwrap();
        check_against("thing", 1e12, None).unwrap();
        let e = check_against("thing", 80.0 * 1024f64.powi(3), Some(&b)).unwrap_err().to_string();
        assert!(e.contains("thing") && e.contains("80.0 GiB") && e.contains("1.0 MiB"), "{e}");
        assert!(e.contains("test budget"), "{e}");
        // A non-finite estimate (sizes near the usize limit) is refused, never let through.
        assert!(check_against("thing", f64::INFINITY, Some(&b)).is_err());
        assert!(check_against("thing", f64::NAN, Some(&b)).is_err());
    }

    #[test]
    fn quadratic_forms_grow_with_t_squared() {
        let dims =
            |t: usize| -> Dims { [("B", 1), ("T", t), ("H", 2), ("Dk", 8), ("Dv", 8)].into_iter().collect() };
        // Attention materialized at T = 1e5: two 1e5 × 1e5 f64 matrices alone are 160 GB.
        let big = attention(Form::Materialized, &dims(100_000), 4.0, None);
        assert!(big >= 2.0 * 1e10 * 8.0, "{big}");
        let small = attention(Form::Fast, &dims(100_000), 4.0, None);
        assert!(small < 1e9, "{small}");
        let p1 = attention(Form::Parallel, &dims(10_000), 4.0, None);
        let p2 = attention(Form::Parallel, &dims(20_000), 4.0, None);
        assert!(p2 / p1 > 3.5, "{p1} {p2}");
    }
}
