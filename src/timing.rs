//! Timing and scaling fits shared by the benchmarks and `mixers bench`.

use std::time::Instant;

/// Summary of repeated timings, in seconds.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Timing {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Number of timed runs.
    pub reps: usize,
}

/// Runs `f` `warmup` times untimed, then times it until `reps` runs or `budget_s` seconds
/// have passed (at least one timed run).
pub fn time<T>(warmup: usize, reps: usize, budget_s: f64, mut f: impl FnMut() -> T) -> Timing {
    for _ in 0..warmup {
        std::hint::black_box(f());
    }
    let start = Instant::now();
    let mut v = Vec::with_capacity(reps);
    while v.is_empty() || (v.len() < reps && start.elapsed().as_secs_f64() < budget_s) {
        let t0 = Instant::now();
        std::hint::black_box(f());
        v.push(t0.elapsed().as_secs_f64());
    }
    v.sort_by(f64::total_cmp);
    Timing { median: v[v.len() / 2], min: v[0], max: v[v.len() - 1], reps: v.len() }
}

/// Least-squares fit of `log y = a + b log x`: returns `(b, standard error of b)`.
/// Needs at least two points; with two the error is 0.
pub fn fit_exponent(xs: &[f64], ys: &[f64]) -> Option<(f64, f64)> {
    let n = xs.len().min(ys.len());
    if n < 2 {
        return None;
    }
    let lx: Vec<f64> = xs[..n].iter().map(|x| x.ln()).collect();
    let ly: Vec<f64> = ys[..n].iter().map(|y| y.ln()).collect();
    let mx = lx.iter().sum::<f64>() / n as f64;
    let my = ly.iter().sum::<f64>() / n as f64;
    let sxx: f64 = lx.iter().map(|x| (x - mx).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = lx.iter().zip(&ly).map(|(x, y)| (x - mx) * (y - my)).sum();
    let b = sxy / sxx;
    let a = my - b * mx;
    let se = if n > 2 {
        let rss: f64 = lx.iter().zip(&ly).map(|(x, y)| (y - a - b * x).powi(2)).sum();
        (rss / (n as f64 - 2.0) / sxx).sqrt()
    } else {
        0.0
    };
    Some((b, se))
}

#[cfg(test)]
mod tests {
    #[test]
    fn recovers_a_power_law() {
        let xs = [1e3, 2e3, 4e3, 8e3];
        let ys: Vec<f64> = xs.iter().map(|x: &f64| 3.0 * x.powf(1.5)).collect();
        let (b, se) = super::fit_exponent(&xs, &ys).unwrap();
        assert!((b - 1.5).abs() < 1e-12 && se < 1e-9);
    }
}
