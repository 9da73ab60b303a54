//! The recurrent state of the Toeplitz mixer (docs/math.md §7.1) and runs from it, for every
//! form and backend through one construction: the *extension*.
//!
//! **Layout.** After a prefix of `a` tokens the decoder holds the inputs it has consumed, all of
//! them (the taps reach every lag up to `Tw − 1`), and its position. The state is
//! - `x [B, Tw, C]`: row `s < a` is the input `x_s`; rows `a … Tw − 1` hold no input yet and
//!   must be zero. `Tw` is the length of `w`, the most tokens the mixer can take, so the
//!   state's shape does not depend on `a` or `T`;
//! - `position [B]`: `a` per batch row (rows may differ: packed sequences carry their own).
//!
//! A run of `T` tokens from position `a` reads the taps at lags up to `a + T − 1` and the bias
//! at positions `a … a + T − 1`, so it needs `a + T ≤ Tw` ([`positions`] refuses it otherwise).
//!
//! **Runs from a state** ([`run`]): per group of batch rows at one position `a`, the form runs
//! on the *extended* sequence `x_ext = [x_0 … x_{a−1}, x]` of `a + T` tokens (the taps and the
//! bias as given: they are indexed by absolute position), and `y` is the extension's rows
//! `a … a + T − 1`. That is the definition of the continuation, not an approximation: the
//! convolution of the extension at `t ≥ a` is `Σ_{s<a} w[t − s] x_s + Σ_{a≤s≤t} w[t − s] x_s`.
//! The final state is `x_ext` (rows `0 … a + T − 1`) and the position `a + T`. With the
//! materialized oracle as the form this is the `f64` reference; with the FFT form it is the fast
//! form (`O((a + T) log(a + T))`, the cost of reading every input the outputs depend on).
//!
//! **Backward** ([`vjp`]): the form's backward of the extension with the cotangent zero on the
//! prefix rows and `ȳ` on the run's rows; the final state is a copy of `x_ext`, so its cotangent
//! adds to `x̄_ext`. Then the initial state's gradient is `x̄_ext` on rows `0 … a − 1` (zero on
//! the rows that must be zero, and for `position`), `x̄` is rows `a …` of it, and the taps' and
//! bias' gradients are summed over the groups.

use std::ops::AddAssign;

use ndarray::{ArrayD, Axis, IxDyn, s};

use crate::error::{Error, Result, fmt_shape};
use crate::grad::grad_name;
use crate::real::Real;
use crate::state::{POSITION, StateShapes, by_length, position_tensor, prefixed, unprefix};
use crate::tensor::{Tensors, get};

/// The name of the state's input history.
pub const HISTORY: &str = "x";

/// The state's shapes: `x [B, Tw, C]` and `position [B]`.
pub(crate) fn shapes(dims: &crate::Dims) -> std::result::Result<StateShapes, String> {
    let size = |s: &str| dims.get(s).copied().ok_or_else(|| format!("size `{s}` is unbound"));
    let b = size("B")?;
    Ok(vec![(HISTORY.into(), vec![b, size("Tw")?, size("C")?]), (POSITION.into(), vec![b])])
}

/// The positions of a state for a run of `t_len` tokens, per batch row, after checking them
/// ([`crate::state::positions`]), `a + T ≤ Tw`, and that the rows from `a` on are zero.
pub fn positions<F: Real>(state: &Tensors<F>, t_len: usize) -> Result<Vec<usize>> {
    let hist = get(state, HISTORY)?;
    let p = get(state, POSITION)?;
    if hist.ndim() != 3 || p.shape() != [hist.shape()[0]] {
        return Err(Error::shape(
            "state",
            "x [B, Tw, C] and position [B]",
            format!("x {}, position {}", fmt_shape(hist.shape()), fmt_shape(p.shape())),
        ));
    }
    let pos = check_positions(p, hist.shape()[1], t_len)?;
    for (b, &a) in pos.iter().enumerate() {
        if hist.slice(s![b, a.., ..]).iter().any(|&v| v != F::zero()) {
            return Err(Error::Value {
                name: format!("state.{HISTORY}[{b}, {a}..]"),
                constraint: format!("rows from the position {a} on hold no input yet, so they must be zero"),
                found: "non-zero entries".into(),
            });
        }
    }
    Ok(pos)
}

/// The positions `position [B]` checked for a run of `t_len` tokens with taps of length `tw`
/// ([`crate::state::positions`], and `a + T ≤ Tw`): [`positions`]' checks without the history's
/// rows, for a state whose history is not on the host.
pub fn check_positions<F: Real>(position: &ArrayD<F>, tw: usize, t_len: usize) -> Result<Vec<usize>> {
    let pos = crate::state::positions(position, t_len)?;
    for (b, &a) in pos.iter().enumerate() {
        if a + t_len > tw {
            return Err(Error::Value {
                name: format!("state.{POSITION}[{b}]"),
                constraint: format!(
                    "a run of {t_len} tokens from position {a} reads the taps up to lag {}, so it \
                     needs position + T ≤ Tw = {tw} (the length of w)",
                    a + t_len - 1
                ),
                found: format!("position {a}, T = {t_len}"),
            });
        }
    }
    Ok(pos)
}

/// The inputs of the extension of the batch `rows` at position `a`: `x_ext [rows, a + T, C]`
/// (the state's rows `0 … a − 1`, then `x`), the static inputs as given.
fn extension<F: Real>(x: &Tensors<F>, hist: &ArrayD<F>, rows: &[usize], a: usize) -> Result<Tensors<F>> {
    let mut out = x.clone();
    out.insert("x".into(), prefixed(get(x, "x")?, Some(hist), rows, a));
    Ok(out)
}

/// `y` and the final state of a run from `initial` (`None`: zeros at position 0) by `form` on
/// the extension (module documentation).
pub fn run<F: Real>(
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    form: impl Fn(&Tensors<F>) -> Result<ArrayD<F>>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    let xs = get(x, "x")?;
    let (nb, t_len, c) = (xs.shape()[0], xs.shape()[1], xs.shape()[2]);
    let tw = get(x, "w")?.shape().last().copied().unwrap_or(0);
    let zeros = ArrayD::<F>::zeros(IxDyn(&[nb, tw, c]));
    let (hist, pos) = match initial {
        Some(s) => (get(s, HISTORY)?, positions(s, t_len)?),
        None => (&zeros, vec![0; nb]),
    };
    let mut y = ArrayD::<F>::zeros(xs.raw_dim());
    let mut fin = ArrayD::<F>::zeros(IxDyn(&[nb, tw, c]));
    for (a, rows) in by_length(&pos) {
        if a + t_len > tw {
            return Err(Error::shape(
                "w",
                format!("Tw ≥ position + T = {}", a + t_len),
                format!("Tw = {tw}"),
            ));
        }
        let ext = extension(x, hist, &rows, a)?;
        let ye = form(&ext)?;
        for (i, &b) in rows.iter().enumerate() {
            y.index_axis_mut(Axis(0), b).assign(&ye.slice(s![i, a.., ..]));
            fin.slice_mut(s![b, ..a + t_len, ..]).assign(&ext["x"].index_axis(Axis(0), i));
        }
    }
    let fin_pos: Vec<usize> = pos.iter().map(|&a| a + t_len).collect();
    Ok((
        y,
        [(HISTORY.to_string(), fin), (POSITION.to_string(), position_tensor(&fin_pos))].into_iter().collect(),
    ))
}

/// The backward of [`run`] by `backward` (the form's backward on the extension: gradients
/// `d_<input>` from the inputs and the cotangent) (module documentation): the gradients of
/// the inputs in `requires` and, with an initial state, the state's gradient.
pub fn vjp<F: Real>(
    args: crate::state::StateVjp<'_, F>,
    backward: impl Fn(&Tensors<F>, &ArrayD<F>) -> Result<Tensors<F>>,
) -> Result<(Tensors<F>, Tensors<F>)> {
    let crate::state::StateVjp { x, initial, dy, d_final, requires } = args;
    let xs = get(x, "x")?;
    let (nb, t_len, c) = (xs.shape()[0], xs.shape()[1], xs.shape()[2]);
    if dy.shape() != xs.shape() {
        return Err(Error::shape("dy", fmt_shape(xs.shape()), fmt_shape(dy.shape())));
    }
    let tw = get(x, "w")?.shape().last().copied().unwrap_or(0);
    let zeros = ArrayD::<F>::zeros(IxDyn(&[nb, tw, c]));
    let (hist, pos) = match initial {
        Some(s) => (get(s, HISTORY)?, positions(s, t_len)?),
        None => (&zeros, vec![0; nb]),
    };
    let d_hist = d_final.map(|d| get(d, HISTORY)).transpose()?;
    let mut grads: Tensors<F> = Tensors::new();
    let mut d_state = ArrayD::<F>::zeros(IxDyn(&[nb, tw, c]));
    let mut dx = ArrayD::<F>::zeros(xs.raw_dim());
    for (a, rows) in by_length(&pos) {
        let ext = extension(x, hist, &rows, a)?;
        let mut dye = ArrayD::<F>::zeros(ext["x"].raw_dim());
        for (i, &b) in rows.iter().enumerate() {
            dye.slice_mut(s![i, a.., ..]).assign(&dy.index_axis(Axis(0), b));
        }
        let mut g = backward(&ext, &dye)?;
        let mut dxe = g.remove(&grad_name("x")).ok_or_else(|| {
            Error::Numerical("toeplitz backward from a state: the backward returned no `d_x`".into())
        })?;
        if let Some(dh) = d_hist {
            for (i, &b) in rows.iter().enumerate() {
                dxe.index_axis_mut(Axis(0), i).add_assign(&dh.slice(s![b, ..a + t_len, ..]));
            }
        }
        unprefix(&dxe, &rows, a, &mut d_state, &mut dx);
        for (k, v) in g {
            match grads.get_mut(&k) {
                Some(acc) => *acc += &v,
                None => {
                    grads.insert(k, v);
                }
            }
        }
    }
    grads.insert(grad_name("x"), dx);
    grads.retain(|k, _| k.strip_prefix("d_").is_some_and(|n| requires.wants(n)));
    let mut ds = Tensors::new();
    if initial.is_some() {
        ds.insert(HISTORY.to_string(), d_state);
        ds.insert(POSITION.to_string(), ArrayD::zeros(IxDyn(&[nb])));
    }
    Ok((grads, ds))
}

/// A random valid state for `dims` (entries of `x` from `fill`): row `b` at a position in
/// `0 … Tw − T` (different rows at different positions, the last row at `Tw − T`), its rows
/// from the position on zeroed.
pub(crate) fn random_state(dims: &crate::Dims, mut s: Tensors<f64>) -> Result<Tensors<f64>> {
    let t_len = dims.get("T").copied().unwrap_or(1);
    let hist = s.get_mut(HISTORY).ok_or_else(|| Error::Numerical("no state tensor".into()))?;
    let (nb, tw) = (hist.shape()[0], hist.shape()[1]);
    let span = tw.saturating_sub(t_len);
    let pos: Vec<usize> = (0..nb).map(|b| span - (b * 5) % (span + 1)).collect();
    for (b, &a) in pos.iter().enumerate() {
        hist.slice_mut(s![b, a.., ..]).fill(0.0);
    }
    s.insert(POSITION.into(), position_tensor(&pos));
    Ok(s)
}

/// Rows `r` of the sequence axis of `a`.
#[cfg(test)]
fn rows_of(a: &ArrayD<f64>, r: std::ops::Range<usize>) -> ArrayD<f64> {
    a.slice_axis(Axis(1), ndarray::Slice::from(r)).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad::Requires;
    use crate::mixer::{Mixer, complete_dims};
    use crate::mixers::state_check::{Cotangents, check_inputs, check_partial, close};
    use crate::mixers::toeplitz::Toeplitz;
    use crate::state::segment;

    fn mixers() -> Vec<Toeplitz> {
        [
            serde_json::json!({"heads": 2}),
            serde_json::json!({"heads": 1, "kernel_width": 3, "decoder": "naive"}),
        ]
        .iter()
        .map(|c| Toeplitz::from_json("toeplitz", c).unwrap())
        .collect()
    }

    fn inputs(m: &Toeplitz, t: usize, tw: usize, seed: u64) -> Tensors<f64> {
        let d: crate::Dims = [("B", 2), ("T", t), ("C", 4), ("Tw", tw)].into_iter().collect();
        m.random_inputs(&complete_dims(m, &d), seed).unwrap()
    }

    /// The reference from a state at position `a` is the plain oracle's rows `a..` of the whole
    /// sequence, written out by hand: `y_t = Σ_{s ≤ t} w[t − s] x_s + bias[t]` per channel.
    #[test]
    fn a_split_anywhere_is_the_whole_run() {
        for m in mixers() {
            let t_len = 13;
            let x = inputs(&m, t_len, 20, 3);
            let whole = crate::oracle::dense(&m, &x).unwrap();
            let (y0, f0) = m.state_oracle(&x, None).unwrap();
            close(&y0, &whole, "from zeros");
            for a in [0, 1, 6, 12, 13] {
                let (ya, sa) = m.state_oracle(&segment(&m, &x, 0..a).unwrap(), None).unwrap();
                let (yb, sb) = m.state_oracle(&segment(&m, &x, a..t_len).unwrap(), Some(&sa)).unwrap();
                close(&ya, &rows_of(&whole, 0..a), &format!("head at {a}"));
                close(&yb, &rows_of(&whole, a..t_len), &format!("tail at {a}"));
                close(&sb[HISTORY], &f0[HISTORY], &format!("final state at {a}"));
                assert_eq!(sb[POSITION], f0[POSITION]);
            }
        }
    }

    #[test]
    fn the_state_backward_matches_finite_differences() {
        for m in mixers() {
            let x = inputs(&m, 5, 9, 4);
            let d: crate::Dims = [("B", 2), ("T", 5), ("C", 4), ("Tw", 9)].into_iter().collect();
            let s0 = m.random_state(&d, 7).unwrap();
            assert!(s0[POSITION].iter().any(|&p| p > 0.0));
            let (y, fin) = m.state_oracle(&x, Some(&s0)).unwrap();
            let c = Cotangents::new(&y, &fin, &[HISTORY]);
            let (g, gs) = m.state_oracle_vjp(&x, Some(&s0), &c.dy, Some(&c.d_final), &Requires::All).unwrap();
            let loss = |x: &Tensors<f64>, s: &Tensors<f64>| c.loss(m.state_oracle(x, Some(s)).unwrap());
            let a0 = s0[POSITION][0] as usize;
            for ix in [[0, 0, 1], [0, a0 - 1, 3], [1, 0, 2]] {
                check_partial("d_state", gs[HISTORY][ix], &s0, HISTORY, &ix, |s| loss(&x, s));
            }
            check_inputs(m.name(), &g, &x, &["x", "w", "bias"], |x| loss(x, &s0));
        }
    }

    #[test]
    fn bad_states_are_refused_with_what_was_given() {
        let m = &mixers()[0];
        let x = inputs(m, 5, 9, 4);
        let d: crate::Dims = [("B", 2), ("T", 5), ("C", 4), ("Tw", 9)].into_iter().collect();
        let s0 = m.random_state(&d, 7).unwrap();
        let mut far = s0.clone();
        far.get_mut(POSITION).unwrap()[0] = 5.0;
        let e = m.state_oracle(&x, Some(&far)).unwrap_err().to_string();
        assert!(e.contains("position + T ≤ Tw = 9") && e.contains("position 5, T = 5"), "{e}");
        let mut dirty = s0.clone();
        let a = s0[POSITION][1] as usize;
        dirty.get_mut(HISTORY).unwrap()[[1, a, 0]] = 1.0;
        let e = m.state_oracle(&x, Some(&dirty)).unwrap_err().to_string();
        assert!(e.contains(&format!("state.x[1, {a}..]")) && e.contains("must be zero"), "{e}");
        let mut half = s0.clone();
        half.get_mut(POSITION).unwrap()[0] = 1.5;
        let e = m.state_oracle(&x, Some(&half)).unwrap_err().to_string();
        assert!(e.contains("whole number") && e.contains("1.5"), "{e}");
    }
}
