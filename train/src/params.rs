//! Named parameter tensors (and gradients of the same shapes), with their initialisation.

use std::collections::BTreeMap;

use mixer_core::{Error, Result};
use ndarray::{Array1, Array2, ArrayD, ArrayView1, ArrayView2, Ix1, Ix2, IxDyn};
use rand::Rng;
use rand::rngs::StdRng;

/// Parameters (or their gradients) by name, e.g. `blocks.0.mix.wq`.
pub type Params = BTreeMap<String, ArrayD<f64>>;

/// How a parameter starts.
#[derive(Clone, Debug)]
pub enum Init {
    /// Independent normal entries of this standard deviation.
    Normal(f64),
    /// Every entry this value.
    Const(f64),
    /// These values (row-major).
    Values(Vec<f64>),
}

/// A parameter's name, shape, initialisation, and whether AdamW decays it.
#[derive(Clone, Debug)]
pub struct ParamSpec {
    /// Full name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Initial values.
    pub init: Init,
    /// Weight decay applies (matrices of projections).
    pub decay: bool,
}

impl ParamSpec {
    /// A `[rows, cols]` projection with entries of standard deviation `gain/√rows`, decayed.
    pub fn matrix(name: String, rows: usize, cols: usize, gain: f64) -> Self {
        ParamSpec {
            name,
            shape: vec![rows, cols],
            init: Init::Normal(gain / (rows as f64).sqrt()),
            decay: true,
        }
    }
    /// A vector of constant value, not decayed.
    pub fn vector(name: String, len: usize, value: f64) -> Self {
        ParamSpec { name, shape: vec![len], init: Init::Const(value), decay: false }
    }
}

/// A standard normal draw (Box–Muller; the same for a seed on every platform).
pub fn normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Draws every parameter of `specs`, in order, from `rng`.
pub fn init(specs: &[ParamSpec], rng: &mut StdRng) -> Params {
    specs
        .iter()
        .map(|s| {
            let n: usize = s.shape.iter().product();
            let data: Vec<f64> = match &s.init {
                Init::Normal(std) => (0..n).map(|_| std * normal(rng)).collect(),
                Init::Const(v) => vec![*v; n],
                Init::Values(v) => v.clone(),
            };
            let a = ArrayD::from_shape_vec(IxDyn(&s.shape), data)
                .unwrap_or_else(|_| ArrayD::zeros(IxDyn(&s.shape)));
            (s.name.clone(), a)
        })
        .collect()
}

/// Checks that `p` holds exactly the parameters of `specs` with their shapes, finite.
pub fn check(specs: &[ParamSpec], p: &Params) -> Result<()> {
    for s in specs {
        let a = p.get(&s.name).ok_or_else(|| Error::Io(format!("missing parameter `{}`", s.name)))?;
        if a.shape() != s.shape.as_slice() {
            return Err(Error::shape(&s.name, format!("{:?}", s.shape), format!("{:?}", a.shape())));
        }
        if a.iter().any(|v| !v.is_finite()) {
            return Err(Error::Io(format!("parameter `{}` has a value that is not finite", s.name)));
        }
    }
    if let Some(extra) = p.keys().find(|k| !specs.iter().any(|s| &s.name == *k)) {
        return Err(Error::Io(format!("unexpected parameter `{extra}` for this model configuration")));
    }
    Ok(())
}

fn missing(name: &str) -> Error {
    Error::Io(format!("internal: parameter `{name}` is missing"))
}

/// A 2-D view of parameter `name`.
pub fn mat<'a>(p: &'a Params, name: &str) -> Result<ArrayView2<'a, f64>> {
    p.get(name)
        .ok_or_else(|| missing(name))?
        .view()
        .into_dimensionality::<Ix2>()
        .map_err(|_| Error::Io(format!("internal: parameter `{name}` is not a matrix")))
}

/// A 1-D copy of parameter `name`.
pub fn vec1(p: &Params, name: &str) -> Result<Array1<f64>> {
    let v: ArrayView1<f64> = p
        .get(name)
        .ok_or_else(|| missing(name))?
        .view()
        .into_dimensionality::<Ix1>()
        .map_err(|_| Error::Io(format!("internal: parameter `{name}` is not a vector")))?;
    Ok(v.to_owned())
}

/// Adds `g` to the gradient `name` (creating it).
pub fn acc(grads: &mut Params, name: &str, g: ArrayD<f64>) {
    match grads.get_mut(name) {
        Some(a) => *a += &g,
        None => {
            grads.insert(name.to_string(), g);
        }
    }
}

/// [`acc`] for a matrix.
pub fn acc2(grads: &mut Params, name: &str, g: Array2<f64>) {
    acc(grads, name, g.into_dyn());
}

/// [`acc`] for a vector.
pub fn acc1(grads: &mut Params, name: &str, g: Array1<f64>) {
    acc(grads, name, g.into_dyn());
}

/// Number of scalars.
pub fn count(p: &Params) -> usize {
    p.values().map(|a| a.len()).sum()
}
