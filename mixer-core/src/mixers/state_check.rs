//! Test support for the tests of runs from a state (the `*_state` modules): closeness of two
//! arrays, a run split in two, and central differences of the loss `⟨ȳ, y⟩ + Σₖ ⟨S̄ₖ, Sₖ⟩` of
//! a run's output `y` and final state `S`.

use ndarray::{ArrayD, Axis};

use crate::error::Result;
use crate::grad::grad_name;
use crate::tensor::Tensors;

/// The step `h` of the central differences.
const H: f64 = 1e-6;

/// Asserts that `a` has the shape of `b` and that `|a − b| < tol·(1 + |b|)` entry by entry.
pub(crate) fn close_within(a: &ArrayD<f64>, b: &ArrayD<f64>, tol: f64, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < tol * (1.0 + y.abs()), "{what}: {x} vs {y}");
    }
}

/// [`close_within`] at the tolerance of the `f64` references, `1e-11`.
pub(crate) fn close(a: &ArrayD<f64>, b: &ArrayD<f64>, what: &str) {
    close_within(a, b, 1e-11, what);
}

/// `run` over `head` from `initial`, then over `tail` from the state it ends in: the two outputs
/// joined along the sequence axis, and the final state.
pub(crate) fn split_run(
    run: impl Fn(&Tensors<f64>, Option<&Tensors<f64>>) -> Result<(ArrayD<f64>, Tensors<f64>)>,
    head: &Tensors<f64>,
    tail: &Tensors<f64>,
    initial: Option<&Tensors<f64>>,
) -> (ArrayD<f64>, Tensors<f64>) {
    let (ya, sa) = run(head, initial).unwrap();
    let (yb, sb) = run(tail, Some(&sa)).unwrap();
    (ndarray::concatenate(Axis(1), &[ya.view(), yb.view()]).unwrap(), sb)
}

/// The cotangents of a finite-difference check, drawn from a run's output and final state:
/// `ȳ = sin(3.1 y)` and `S̄ₖ = cos(1.7 Sₖ + 0.2)` for the state's tensors `k` named.
pub(crate) struct Cotangents {
    /// `ȳ`.
    pub dy: ArrayD<f64>,
    /// `S̄`, one tensor per name.
    pub d_final: Tensors<f64>,
}

impl Cotangents {
    /// The cotangents of `y` and of the tensors `names` of the final state `fin`.
    pub(crate) fn new(y: &ArrayD<f64>, fin: &Tensors<f64>, names: &[&str]) -> Self {
        let dy = y.mapv(|a| (3.1 * a).sin());
        let d_final =
            names.iter().map(|&k| (k.to_string(), fin[k].mapv(|a| (1.7 * a + 0.2).cos()))).collect();
        Cotangents { dy, d_final }
    }

    /// The loss `⟨ȳ, y⟩ + Σₖ ⟨S̄ₖ, Sₖ⟩` of a run's output and final state.
    pub(crate) fn loss(&self, (y, fin): (ArrayD<f64>, Tensors<f64>)) -> f64 {
        (&y * &self.dy).sum() + self.d_final.iter().map(|(k, d)| (&fin[k] * d).sum()).sum::<f64>()
    }
}

/// Checks one partial derivative `got` by central differences: `(L(t + h·e) − L(t − h·e)) / 2h`
/// with `e` the unit at index `ix` of the tensor `name` of `t` and `h = 1e-6`, within
/// `1e-6·(1 + |fd|)`.
pub(crate) fn check_partial(
    what: &str,
    got: f64,
    t: &Tensors<f64>,
    name: &str,
    ix: &[usize],
    loss: impl Fn(&Tensors<f64>) -> f64,
) {
    let (mut p, mut n) = (t.clone(), t.clone());
    p.get_mut(name).unwrap()[ix] += H;
    n.get_mut(name).unwrap()[ix] -= H;
    let fd = (loss(&p) - loss(&n)) / (2.0 * H);
    assert!((fd - got).abs() < 1e-6 * (1.0 + fd.abs()), "{what}: {got} vs fd {fd}");
}

/// Checks the gradients `g` (`d_<name>`) of the inputs `names` that `x` has, at their middle
/// entries ([`middle`]), by [`check_partial`] with `loss` a function of the inputs; `what`
/// prefixes the messages.
pub(crate) fn check_inputs(
    what: &str,
    g: &Tensors<f64>,
    x: &Tensors<f64>,
    names: &[&str],
    loss: impl Fn(&Tensors<f64>) -> f64,
) {
    for &name in names.iter().filter(|&&n| x.contains_key(n)) {
        let ix = middle(&x[name]);
        check_partial(&format!("{what} {name}"), g[&grad_name(name)][ix.as_slice()], x, name, &ix, &loss);
    }
}

/// The index of the middle entry of `a` (each axis at half its length).
pub(crate) fn middle(a: &ArrayD<f64>) -> Vec<usize> {
    a.shape().iter().map(|&n| n / 2).collect()
}
