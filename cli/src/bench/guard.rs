//! What a bench does not run, decided before running it: a point whose time, predicted from
//! the series' measured points, exceeds the budget; inputs that do not fit in memory. (Each
//! form's own working memory is refused by `mixer_registry::run` before it allocates; the
//! bench records that as a skipped point.)

use mixer_core::memory::{check, inputs_bytes};
use mixer_core::mixer::{Mixer, complete_dims};
use mixer_core::{DType, Error, Result};

use super::measure::sizes;
use super::options::Options;
use mixers::timing::fit_exponent;

/// Exponent assumed for a series with a single measured point: quadratic, the cost of the
/// parallel forms (the materialized form is cubic at worst, but is capped by `T` anyway).
pub const NOMINAL_EXPONENT: f64 = 2.0;

/// Predicted seconds of one run at `seq`, and the exponent used, from a series' measured
/// `(T, median seconds)`: `t_{last} (T / T_{last})^b` with `b` fitted over the series (at least
/// 1) when it has two or more points, else [`NOMINAL_EXPONENT`]. `None` before any point.
pub fn predict(measured: &[(usize, f64)], seq: usize) -> Option<(f64, f64)> {
    let &(t_last, s_last) = measured.iter().max_by_key(|p| p.0)?;
    let b = if measured.len() >= 2 {
        let xs: Vec<f64> = measured.iter().map(|p| p.0 as f64).collect();
        let ys: Vec<f64> = measured.iter().map(|p| p.1.max(1e-9)).collect();
        fit_exponent(&xs, &ys).map_or(NOMINAL_EXPONENT, |(b, _)| b.max(1.0))
    } else {
        NOMINAL_EXPONENT
    };
    Some((s_last * (seq as f64 / t_last as f64).powf(b), b))
}

/// Why a point at `seq` is not run because of its predicted time, or `None`.
pub fn too_slow(measured: &[(usize, f64)], seq: usize, max_seconds: f64) -> Option<String> {
    let (secs, b) = predict(measured, seq)?;
    let &(t_last, s_last) = measured.iter().max_by_key(|p| p.0)?;
    (secs > max_seconds).then(|| {
        format!(
            "predicted {secs:.1} s > budget {max_seconds} s (T = {t_last} took {s_last:.2} s, time ∝ T^{b:.2})"
        )
    })
}

/// Refuses drawing the inputs of `m` at `seq` when they do not fit in memory: the `f64` draw,
/// plus its cast copy for `f32`.
pub fn inputs_fit(m: &dyn Mixer, opts: &Options, seq: usize) -> Result<()> {
    let dims = complete_dims(m, &sizes(opts, seq).dims());
    let spec = m.spec();
    let cast = if opts.dtype == DType::F32 { inputs_bytes(&spec, &dims, 4.0) } else { 0.0 };
    check(&format!("the inputs of `{}` at T = {seq}", m.name()), inputs_bytes(&spec, &dims, 8.0) + cast)
}

/// Whether an error is a refusal for memory (recorded as skipped, not failed).
pub fn is_memory(e: &Error) -> bool {
    matches!(e, Error::OutOfMemory { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predictions_follow_the_fitted_exponent() {
        // One point: quadratic.
        let (s, b) = predict(&[(1000, 0.5)], 4000).unwrap();
        assert_eq!(b, NOMINAL_EXPONENT);
        assert!((s - 8.0).abs() < 1e-12);
        // Linear series: the fit (exponent 1) is used.
        let lin = [(1000, 0.1), (2000, 0.2), (4000, 0.4)];
        let (s, b) = predict(&lin, 16000).unwrap();
        assert!((b - 1.0).abs() < 1e-9 && (s - 1.6).abs() < 1e-9, "{s} {b}");
        // Cubic series.
        let cub = [(100, 0.001), (200, 0.008)];
        let (s, b) = predict(&cub, 800).unwrap();
        assert!((b - 3.0).abs() < 1e-9 && (s - 0.512).abs() < 1e-9);
        assert!(predict(&[], 10).is_none());
    }

    #[test]
    fn a_quadratic_point_at_one_million_is_skipped_before_it_runs() {
        // T = 65536 took 3 s: T = 2^20 would take 3·16² = 768 s.
        let why = too_slow(&[(65536, 3.0)], 1 << 20, 5.0).unwrap();
        assert!(why.contains("predicted 768.0 s") && why.contains("T = 65536"), "{why}");
        assert!(too_slow(&[(1000, 0.001)], 2000, 5.0).is_none());
    }
}
