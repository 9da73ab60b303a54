//! Scaling fits and same-run ratios from a bench's points.

use std::collections::BTreeMap;

use mixer_core::Form;

use super::model::{Fit, Point, Ratio, Status};

/// One fit per (mixer, backend, form) with at least two measured points.
pub fn fits(points: &[Point]) -> Vec<Fit> {
    let mut by: BTreeMap<(String, String, Form), Vec<(usize, f64)>> = BTreeMap::new();
    let mut order = Vec::new();
    for p in points {
        if let (Status::Ok, Some(t)) = (p.status, &p.timing) {
            let key = (p.mixer.clone(), p.backend.clone(), p.form);
            if !by.contains_key(&key) {
                order.push(key.clone());
            }
            by.entry(key).or_default().push((p.seq, t.median));
        }
    }
    order
        .into_iter()
        .filter_map(|k| {
            let pts = &by[&k];
            Fit::of(&k.0, &k.1, k.2, pts)
        })
        .collect()
}

/// Ratios of medians at equal `T`: every form against `fast` on the same backend, and every
/// other backend against `cpu` for the same form.
pub fn ratios(points: &[Point]) -> Vec<Ratio> {
    let mut t: BTreeMap<(String, String, Form, usize), f64> = BTreeMap::new();
    for p in points {
        if let (Status::Ok, Some(tm)) = (p.status, &p.timing) {
            t.insert((p.mixer.clone(), p.backend.clone(), p.form, p.seq), tm.median);
        }
    }
    let mut out = Vec::new();
    for ((mixer, backend, form, seq), &v) in &t {
        if *form != Form::Fast
            && let Some(&f) = t.get(&(mixer.clone(), backend.clone(), Form::Fast, *seq))
        {
            out.push(Ratio {
                mixer: mixer.clone(),
                comparison: format!("{form} / fast ({backend})"),
                seq: *seq,
                ratio: v / f,
            });
        }
        if backend != "cpu"
            && let Some(&c) = t.get(&(mixer.clone(), "cpu".to_string(), *form, *seq))
        {
            out.push(Ratio {
                mixer: mixer.clone(),
                comparison: format!("{backend} / cpu ({form})"),
                seq: *seq,
                ratio: v / c,
            });
        }
    }
    out
}
