//! Input specifications: names, symbolic shapes and value constraints of a mixer's inputs,
//! from which shapes are checked and valid random inputs are generated.

use std::collections::BTreeMap;
use std::fmt;

use ndarray::{ArrayD, Axis, Dimension, IxDyn};
use rand::{Rng, SeedableRng, rngs::StdRng};
use rand_distr::StandardNormal;
use serde::Serialize;

use crate::error::{Error, Result, fmt_shape};
use crate::real::Real;
use crate::tensor::{PARALLEL, Tensors};

/// One axis of a symbolic shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Dim {
    /// A named size shared between inputs: `B`, `T`, `C`, `H`, `Dk`, `Dv`, `K`, `L`, …
    Sym(&'static str),
    /// A size fixed by the configuration.
    Fixed(usize),
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Sym(s) => f.write_str(s),
            Dim::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// A value constraint, checked on every call (the library rejects what the math excludes).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Constraint {
    /// Finite values.
    Finite,
    /// A log-decay: finite and `≤ 0`.
    NonPositive,
    /// Finite and in `[0, 1]` (e.g. the delta rule's β).
    UnitInterval,
    /// Finite and `≥ 0` (e.g. λ).
    NonNegative,
}

impl Constraint {
    /// What the constraint requires, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Constraint::Finite => "values must be finite",
            Constraint::NonPositive => "log-decay must be ≤ 0 and finite",
            Constraint::UnitInterval => "values must lie in [0, 1]",
            Constraint::NonNegative => "values must be ≥ 0 and finite",
        }
    }
    /// An error naming `name`, the constraint and the first entry of `a` that breaks it, if one
    /// does: the fast scan ([`Constraint::all`]) first, the index looked up only on a violation.
    pub fn check<F: Real>(self, name: &str, a: &ArrayD<F>) -> Result<()> {
        if self.all(a) {
            return Ok(());
        }
        match a.indexed_iter().find(|(_, x)| !self.ok(x.f64())) {
            Some((idx, x)) => Err(Error::Value {
                name: name.to_string(),
                constraint: self.describe().to_string(),
                found: format!("{x} at {}", fmt_shape(idx.as_array_view().as_slice().unwrap_or(&[]))),
            }),
            None => Ok(()),
        }
    }

    /// Whether every entry of `a` satisfies the constraint: branch-free folds over blocks of a
    /// contiguous array (which the compiler vectorises), in parallel for large arrays, stopping
    /// at the first failing block; other layouts entry by entry.
    pub fn all<F: Real>(self, a: &ArrayD<F>) -> bool {
        use rayon::prelude::*;
        fn block<F: Real>(c: Constraint, b: &[F]) -> bool {
            let (zero, one) = (F::zero(), F::one());
            let fin = |x: F| num_traits::Float::is_finite(x);
            match c {
                Constraint::Finite => b.iter().fold(true, |acc, &x| acc & fin(x)),
                Constraint::NonPositive => b.iter().fold(true, |acc, &x| acc & fin(x) & (x <= zero)),
                Constraint::UnitInterval => b.iter().fold(true, |acc, &x| acc & (x >= zero) & (x <= one)),
                Constraint::NonNegative => b.iter().fold(true, |acc, &x| acc & fin(x) & (x >= zero)),
            }
        }
        // In parallel from 2^20 entries: below that one thread checks the array (about 20 µs at
        // 2^16 f32 entries) faster than the pool is woken for it.
        const BLOCK: usize = 4096;
        const PARALLEL: usize = 1 << 20;
        match a.as_slice_memory_order() {
            Some(s) if s.len() >= PARALLEL => s.par_chunks(BLOCK).all(|b| block(self, b)),
            Some(s) => s.chunks(BLOCK).all(|b| block(self, b)),
            None => a.iter().all(|x| self.ok(x.f64())),
        }
    }

    fn ok(self, x: f64) -> bool {
        x.is_finite()
            && match self {
                Constraint::Finite => true,
                Constraint::NonPositive => x <= 0.0,
                Constraint::UnitInterval => (0.0..=1.0).contains(&x),
                Constraint::NonNegative => x >= 0.0,
            }
    }
}

/// How random test inputs are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Gen {
    /// Standard normal times a scale.
    Normal(f64),
    /// `−scale·u`, `u ~ U(0,1)`: a log-decay.
    LogDecay(f64),
    /// `U(lo, hi)`.
    Uniform(f64, f64),
    /// Random signs and magnitudes normalised so that the sum of `|·|` along the given axis
    /// is at most 0.95 (keeps recurrences stable).
    Stable(usize),
    /// Normal, then L2-normalised along the given axis (unit keys).
    UnitNorm(usize),
}

/// One input of a mixer.
#[derive(Clone, Debug, Serialize)]
pub struct InputDecl {
    /// Name, as in docs/math.md and the npz files.
    pub name: &'static str,
    /// Symbolic shape.
    pub shape: Vec<Dim>,
    /// Value constraint.
    pub constraint: Constraint,
    /// How to draw random valid values.
    pub sample: Gen,
    /// Whether axis 1 is the sequence axis (the decoder consumes it token by token).
    pub per_token: bool,
    /// Whether the input may be omitted.
    pub optional: bool,
}

impl InputDecl {
    /// A required per-token input of a given shape, normal values.
    pub fn new(name: &'static str, shape: Vec<Dim>) -> Self {
        InputDecl {
            name,
            shape,
            constraint: Constraint::Finite,
            sample: Gen::Normal(1.0),
            per_token: true,
            optional: false,
        }
    }
    /// Sets the constraint.
    pub fn constraint(mut self, c: Constraint) -> Self {
        self.constraint = c;
        self
    }
    /// Sets the generator.
    pub fn sample(mut self, g: Gen) -> Self {
        self.sample = g;
        self
    }
    /// Marks the input as static (no sequence axis consumed by decoders).
    pub fn fixed(mut self) -> Self {
        self.per_token = false;
        self
    }
    /// Marks the input as optional.
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }
    fn shape_str(&self, dims: &Dims) -> String {
        let parts: Vec<String> = self
            .shape
            .iter()
            .map(|d| match d {
                Dim::Sym(s) => match dims.get(s) {
                    Some(v) => format!("{s}={v}"),
                    None => s.to_string(),
                },
                Dim::Fixed(n) => n.to_string(),
            })
            .collect();
        format!("[{}]", parts.join(", "))
    }
}

/// Concrete values of the symbolic sizes.
pub type Dims = BTreeMap<&'static str, usize>;

/// Required-size lookup on [`Dims`], with one error message for every caller.
pub trait DimsExt {
    /// The bound size `sym` (`"B"`, `"T"`, …), or an error naming it and the sizes given.
    fn size(&self, sym: &str) -> Result<usize>;
}

impl DimsExt for Dims {
    fn size(&self, sym: &str) -> Result<usize> {
        self.get(sym).copied().ok_or_else(|| Error::MissingSize {
            size: sym.to_string(),
            given: self.iter().map(|(k, v)| format!("{k} = {v}")).collect::<Vec<_>>().join(", "),
        })
    }
}

/// A requirement on a size derived from others (e.g. `K = K(T)`, `L ≥ L(T)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Bound {
    /// Must equal this value.
    Exact(usize),
    /// Must be at least this value (random inputs use exactly this value).
    AtLeast(usize),
}

/// All inputs of a mixer and which one is mixed (the output `y` has its shape).
#[derive(Clone, Debug, Serialize)]
pub struct InputSpec {
    /// The inputs, in a canonical order.
    pub inputs: Vec<InputDecl>,
    /// The name of the mixed input; `y` has its shape.
    pub mixed: &'static str,
}

impl InputSpec {
    /// Names of the per-token inputs.
    pub fn per_token(&self) -> Vec<String> {
        self.inputs.iter().filter(|d| d.per_token).map(|d| d.name.to_string()).collect()
    }

    /// A one-line description, e.g. `x [B,T,C], alpha [B,T,C]`.
    pub fn describe(&self) -> String {
        self.inputs
            .iter()
            .map(|d| {
                let s: Vec<String> = d.shape.iter().map(|x| x.to_string()).collect();
                format!("{}{} [{}]", d.name, if d.optional { "?" } else { "" }, s.join(","))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Binds every symbolic size from the given shapes, checking consistency, presence and
    /// rank. Returns the sizes.
    pub fn bind(&self, shapes: &BTreeMap<String, Vec<usize>>) -> Result<Dims> {
        let names: Vec<&str> = self.inputs.iter().map(|d| d.name).collect();
        for k in shapes.keys() {
            if !names.contains(&k.as_str()) {
                return Err(Error::UnexpectedInput { name: k.clone(), expected: self.describe() });
            }
        }
        let mut dims = Dims::new();
        let mut origin: BTreeMap<&'static str, &'static str> = BTreeMap::new();
        for d in &self.inputs {
            let Some(shape) = shapes.get(d.name) else {
                if d.optional {
                    continue;
                }
                return Err(Error::MissingInput {
                    name: d.name.to_string(),
                    expected: d.shape_str(&dims),
                    given: if shapes.is_empty() {
                        "nothing".into()
                    } else {
                        shapes.keys().cloned().collect::<Vec<_>>().join(", ")
                    },
                });
            };
            if shape.len() != d.shape.len() {
                return Err(Error::shape(
                    d.name,
                    format!("rank {} {}", d.shape.len(), d.shape_str(&dims)),
                    fmt_shape(shape),
                ));
            }
            for (ax, (sym, &n)) in d.shape.iter().zip(shape).enumerate() {
                match sym {
                    Dim::Fixed(m) if *m != n => {
                        return Err(Error::shape(
                            d.name,
                            d.shape_str(&dims),
                            format!("{} (axis {ax})", fmt_shape(shape)),
                        ));
                    }
                    Dim::Fixed(_) => {}
                    Dim::Sym(s) => match dims.get(s) {
                        Some(&m) if m != n => {
                            let from = origin.get(s).copied().unwrap_or("?");
                            return Err(Error::shape(
                                d.name,
                                format!("{} ({s} from `{from}`)", d.shape_str(&dims)),
                                fmt_shape(shape),
                            ));
                        }
                        Some(_) => {}
                        None => {
                            dims.insert(s, n);
                            origin.insert(s, d.name);
                        }
                    },
                }
            }
        }
        Ok(dims)
    }

    /// Checks derived sizes against their bounds.
    pub fn check_bounds(&self, dims: &Dims, bounds: &[(&'static str, Bound, &'static str)]) -> Result<()> {
        for &(sym, bound, why) in bounds {
            let Some(&have) = dims.get(sym) else { continue };
            let bad = match bound {
                Bound::Exact(n) => have != n,
                Bound::AtLeast(n) => have < n,
            };
            if bad {
                let holder = self
                    .inputs
                    .iter()
                    .find(|d| d.shape.contains(&Dim::Sym(sym)))
                    .map(|d| d.name)
                    .unwrap_or("?");
                let want = match bound {
                    Bound::Exact(n) => format!("{sym} = {n}"),
                    Bound::AtLeast(n) => format!("{sym} ≥ {n}"),
                };
                return Err(Error::shape(holder, format!("{want} ({why})"), format!("{sym} = {have}")));
            }
        }
        Ok(())
    }

    /// Checks every value constraint.
    pub fn check_values<F: Real>(&self, inputs: &Tensors<F>) -> Result<()> {
        for d in &self.inputs {
            if let Some(a) = inputs.get(d.name) {
                d.constraint.check(d.name, a)?;
            }
        }
        Ok(())
    }

    /// Draws valid random inputs of the given sizes (every symbol of every required input
    /// must be in `dims`; optional inputs are drawn only when `with_optional`).
    pub fn random(&self, dims: &Dims, seed: u64, with_optional: bool) -> Result<Tensors<f64>> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut out = Tensors::new();
        for d in &self.inputs {
            if d.optional && !with_optional {
                continue;
            }
            let shape: Vec<usize> = d
                .shape
                .iter()
                .map(|s| match s {
                    Dim::Fixed(n) => Ok(*n),
                    Dim::Sym(s) => dims.get(s).copied().ok_or_else(|| Error::Config {
                        mixer: "random inputs".into(),
                        message: format!("size `{s}` of input `{}` was not given", d.name),
                    }),
                })
                .collect::<Result<_>>()?;
            out.insert(d.name.to_string(), draw(d.sample, &shape, &mut rng));
        }
        Ok(out)
    }
}

/// Elements per independently seeded chunk of a parallel draw.
const DRAW_CHUNK: usize = 1 << 16;

/// Draws one tensor from a generator. Up to [`PARALLEL`] elements the values come one
/// after the other from `rng`; a larger tensor takes one `u64` from `rng` and fills chunks of
/// [`DRAW_CHUNK`] elements in parallel, chunk `i` from its own generator seeded with that value
/// and `i` — the same values whatever the number of threads (benchmarks at T = 2²⁰ draw
/// gigabytes of inputs).
pub fn draw(g: Gen, shape: &[usize], rng: &mut StdRng) -> ArrayD<f64> {
    let len: usize = shape.iter().product();
    let mut a = if len > PARALLEL {
        use rayon::prelude::*;
        let base: u64 = rng.random();
        let mut a = ArrayD::<f64>::zeros(IxDyn(shape));
        if let Some(flat) = a.as_slice_mut() {
            flat.par_chunks_mut(DRAW_CHUNK).enumerate().for_each(|(i, chunk)| {
                let mut r = StdRng::seed_from_u64(base ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                chunk.iter_mut().for_each(|x| *x = element(g, &mut r));
            });
        }
        a
    } else {
        ArrayD::from_shape_simple_fn(IxDyn(shape), || element(g, rng))
    };
    match g {
        Gen::Stable(axis) if axis < shape.len() => {
            let sums = a.map_axis(Axis(axis), |l| l.iter().map(|x| x.abs()).sum::<f64>());
            let scale = sums.mapv(|s| if s > 0.0 { 0.95 / s } else { 0.0 }).insert_axis(Axis(axis));
            a *= &scale;
        }
        Gen::UnitNorm(axis) if axis < shape.len() => {
            let norms = a.map_axis(Axis(axis), |l| l.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12));
            a /= &norms.insert_axis(Axis(axis));
        }
        _ => {}
    }
    a
}

/// One value of `g` before any normalisation along an axis.
fn element(g: Gen, rng: &mut StdRng) -> f64 {
    match g {
        Gen::Normal(s) => s * rng.sample::<f64, _>(StandardNormal),
        Gen::LogDecay(s) => -s * rng.random::<f64>(),
        Gen::Uniform(lo, hi) => lo + (hi - lo) * rng.random::<f64>(),
        Gen::Stable(_) => {
            let m: f64 = rng.random::<f64>();
            if rng.random::<bool>() { m } else { -m }
        }
        Gen::UnitNorm(_) => rng.sample::<f64, _>(StandardNormal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tensor above the parallel threshold: the same values on 1 and 3 threads, the
    /// distribution's first two moments, and f32 casts of it equal to elementwise casts.
    #[test]
    fn parallel_draw_is_deterministic_and_normal() {
        let shape = [3, PARALLEL / 3 + 4099];
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| draw(Gen::Normal(2.0), &shape, &mut StdRng::seed_from_u64(11)))
        };
        let (a, b) = (on(1), on(3));
        assert_eq!(a.shape(), &shape);
        assert_eq!(a, b);
        let n = a.len() as f64;
        let mean = a.sum() / n;
        let var = a.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var / 4.0 - 1.0).abs() < 0.01, "variance {var}");
        // Chunks are not copies of each other.
        assert_ne!(a.as_slice().unwrap()[..64], a.as_slice().unwrap()[DRAW_CHUNK..DRAW_CHUNK + 64]);
        let mut m = crate::tensor::Tensors::new();
        m.insert("x".to_string(), a.clone());
        let c = crate::tensor::cast_tensors::<f32>(&m);
        assert_eq!(c["x"], a.mapv(|x| x as f32));
    }

    fn spec() -> InputSpec {
        InputSpec {
            inputs: vec![
                InputDecl::new("x", vec![Dim::Sym("B"), Dim::Sym("T"), Dim::Sym("C")]),
                InputDecl::new("g", vec![Dim::Sym("B"), Dim::Sym("T"), Dim::Sym("C")])
                    .constraint(Constraint::NonPositive)
                    .sample(Gen::LogDecay(1.0)),
                InputDecl::new("beta", vec![Dim::Sym("B"), Dim::Sym("T"), Dim::Sym("K"), Dim::Sym("C")])
                    .sample(Gen::Stable(2)),
            ],
            mixed: "x",
        }
    }

    #[test]
    fn binds_and_reports_mismatch() {
        let s = spec();
        let mut sh = BTreeMap::new();
        sh.insert("x".to_string(), vec![2, 7, 3]);
        sh.insert("g".to_string(), vec![2, 7, 3]);
        sh.insert("beta".to_string(), vec![2, 7, 4, 3]);
        let d = s.bind(&sh).unwrap();
        assert_eq!(d["K"], 4);
        s.check_bounds(&d, &[("K", Bound::Exact(3), "K(T) for T = 7")]).unwrap_err();
        sh.insert("g".to_string(), vec![2, 7, 4]);
        let e = s.bind(&sh).unwrap_err().to_string();
        assert!(e.contains("`g`") && e.contains("C=3") && e.contains("[2, 7, 4]"), "{e}");
        sh.remove("g");
        let e = s.bind(&sh).unwrap_err().to_string();
        assert!(e.contains("missing input `g`"), "{e}");
    }

    #[test]
    fn random_inputs_satisfy_constraints() {
        let s = spec();
        let dims: Dims = [("B", 2), ("T", 5), ("C", 3), ("K", 4)].into_iter().collect();
        let r = s.random(&dims, 7, false).unwrap();
        s.check_values(&r).unwrap();
        let beta = &r["beta"];
        for b in 0..2 {
            for t in 0..5 {
                for c in 0..3 {
                    let sum: f64 = (0..4).map(|k| beta[[b, t, k, c]].abs()).sum();
                    assert!(sum <= 0.95 + 1e-12);
                }
            }
        }
        let mut bad = r.clone();
        bad.get_mut("g").unwrap()[[0, 1, 2]] = 0.5;
        let e = s.check_values(&bad).unwrap_err().to_string();
        assert!(e.contains("≤ 0") && e.contains("[0, 1, 2]"), "{e}");
    }
}
