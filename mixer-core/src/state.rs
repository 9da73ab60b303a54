//! Recurrent states in and out of a mixer, and packed variable-length batches (docs/math.md §7).
//!
//! **State.** A mixer's state after a prefix `x[0:a]` is exactly what its decoder holds after
//! consuming that prefix: a set of named tensors whose shapes [`Mixer::state_shapes`] gives for
//! the bound sizes. A run of `x[a:b]` started from that state equals rows `a..b` of the run of
//! `x[0:b]` (to rounding), for outputs and for gradients flowing through the state. The
//! log-linear base mixers hold one tensor `S [B, H, Dv, Dk]`, the `S_t` of their recurrence
//! (docs/math.md §2.1); their Fenwick lifts hold their level states `S [B, H, L, Dv, Dk]` and
//! the position `position [B]` ([`crate::mixers::loglinear::lift_state`]). A run without an
//! initial state starts from zeros (at position 0).
//!
//! **Packed batches.** A batch row of `B = 1` holds `N` sequences back to back, sequence `i`
//! at rows `cu_seqlens[i] .. cu_seqlens[i + 1]` (FlashAttention's and fla's convention). Every
//! sequence restarts: no token sees a token of another sequence, each sequence may start from
//! its own initial state (row `i` of a state with `N` batch rows), and the final states come
//! back one row per sequence. Rows past the last offset belong to no sequence: their outputs
//! and gradients are zero.

use std::ops::Range;

use ndarray::{ArrayD, Axis, IxDyn, Slice};

use crate::error::{Error, Result, fmt_shape};
use crate::mixer::Mixer;
use crate::real::Real;
use crate::spec::Constraint;
use crate::tensor::Tensors;

/// The arguments of a backward from a state (docs/math.md §7): the inputs `x`, the initial state
/// (`None`: zeros), the cotangent `dy` of `y`, the final state's cotangent (`None`: zero) and the
/// input gradients asked for.
#[derive(Clone, Copy)]
pub struct StateVjp<'a, F> {
    /// The inputs.
    pub x: &'a Tensors<F>,
    /// The initial state, `None` for zeros.
    pub initial: Option<&'a Tensors<F>>,
    /// The cotangent of `y`.
    pub dy: &'a ArrayD<F>,
    /// The cotangent of the final state, `None` for zero.
    pub d_final: Option<&'a Tensors<F>>,
    /// The input gradients asked for.
    pub requires: &'a crate::grad::Requires,
}

/// The names and shapes of a state's tensors, in a fixed order.
pub type StateShapes = Vec<(String, Vec<usize>)>;

/// The name of the position tensor (`[B]`, the tokens consumed before the state) of the states
/// that carry one: the log-linear lifts, the GLR and the Toeplitz mixer.
pub const POSITION: &str = "position";

/// The names and shapes of given state tensors.
pub fn shapes_of<F>(state: &Tensors<F>) -> StateShapes {
    state.iter().map(|(k, v)| (k.clone(), v.shape().to_vec())).collect()
}

/// The positions `a` of a state's `position [B]` tensor for a run of `t_len` tokens, per batch
/// row, after checking that each is a whole number `≥ 0` and that the final position `a + T`
/// is exact in the scalar type (`2^24` in `f32`, `2^53` in `f64`). Errors name the row.
pub fn positions<F: Real>(p: &ArrayD<F>, t_len: usize) -> Result<Vec<usize>> {
    positions_each(p, &vec![t_len; p.len()])
}

/// [`positions`] with a run of `lens[b]` tokens for row `b` (the sequences of a packed batch,
/// each from its own row of the state); `lens` has one entry per row.
pub fn positions_each<F: Real>(p: &ArrayD<F>, lens: &[usize]) -> Result<Vec<usize>> {
    let digits =
        if F::DTYPE == crate::tensor::DType::F32 { f32::MANTISSA_DIGITS } else { f64::MANTISSA_DIGITS };
    if p.len() != lens.len() {
        return Err(Error::shape(
            format!("state.{POSITION}"),
            format!("[{}]", lens.len()),
            fmt_shape(p.shape()),
        ));
    }
    p.iter()
        .zip(lens)
        .enumerate()
        .map(|(b, (&x, &t_len))| {
            let v = x.f64();
            if !(v >= 0.0 && v.fract() == 0.0 && v < 2f64.powi(53)) {
                return Err(Error::Value {
                    name: format!("state.{POSITION}[{b}]"),
                    constraint: "must be a whole number ≥ 0 (the tokens consumed before the state)".into(),
                    found: format!("{v}"),
                });
            }
            let a = v as usize;
            if (a + t_len) as f64 > 2f64.powi(digits as i32) {
                return Err(Error::Value {
                    name: format!("state.{POSITION}[{b}]"),
                    constraint: format!(
                        "position + T ≤ 2^{digits} (the positions are stored in the state's scalar type; use f64 beyond)"
                    ),
                    found: format!("position {a}, T = {t_len}"),
                });
            }
            Ok(a)
        })
        .collect()
}

/// `position [B]` holding `pos`, in the state's scalar type.
pub fn position_tensor<F: Real>(pos: &[usize]) -> ArrayD<F> {
    ArrayD::from_shape_vec(IxDyn(&[pos.len()]), pos.iter().map(|&a| F::of(a as f64)).collect())
        .expect("a vector of B entries has shape [B]")
}

/// The error for a mixer without the state API.
pub fn no_state(mixer: &str, why: &str) -> Error {
    Error::FormUnavailable {
        mixer: mixer.to_string(),
        form: "any form with a recurrent state".into(),
        backend: "any".into(),
        available: format!("none: {why}"),
    }
}

/// Checks a given state against the expected shapes: the same names, the same shapes, finite
/// values. Errors name the tensor, the expected and the given.
pub fn check_state<F: Real>(what: &str, want: &StateShapes, given: &Tensors<F>) -> Result<()> {
    check_shapes(what, want, &shapes_of(given))?;
    for (name, a) in given {
        if !Constraint::Finite.all(a) {
            return Err(Error::Value {
                name: format!("{what}.{name}"),
                constraint: "must be finite".into(),
                found: "a NaN or an infinity".into(),
            });
        }
    }
    Ok(())
}

/// The names and shapes of [`check_state`] (for a state whose values live elsewhere, e.g. on a
/// device): the same names as `want`, each with its shape.
pub fn check_shapes(what: &str, want: &StateShapes, given: &StateShapes) -> Result<()> {
    let names = || given.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>().join(", ");
    for (name, _) in given {
        if !want.iter().any(|(n, _)| n == name) {
            return Err(Error::UnexpectedInput {
                name: format!("{what}.{name}"),
                expected: want
                    .iter()
                    .map(|(n, s)| format!("{n} {}", fmt_shape(s)))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    for (name, shape) in want {
        let Some((_, a)) = given.iter().find(|(n, _)| n == name) else {
            return Err(Error::MissingInput {
                name: format!("{what}.{name}"),
                expected: fmt_shape(shape),
                given: names(),
            });
        };
        if a != shape {
            return Err(Error::shape(format!("{what}.{name}"), fmt_shape(shape), fmt_shape(a)));
        }
    }
    Ok(())
}

/// A state of zeros with these shapes (the start of a run without an initial state).
pub fn zeros<F: Real>(shapes: &StateShapes) -> Tensors<F> {
    shapes.iter().map(|(n, s)| (n.clone(), ArrayD::zeros(IxDyn(s)))).collect()
}

/// A state with these shapes whose entries are a fixed hash of `seed` and their index, in
/// `[−1, 1)` (the default of [`Mixer::random_state`]).
pub fn random(shapes: &StateShapes, seed: u64) -> Tensors<f64> {
    let mut s = zeros::<f64>(shapes);
    for (j, a) in s.values_mut().enumerate() {
        for (i, x) in a.iter_mut().enumerate() {
            let h = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ (seed + j as u64).wrapping_mul(0xBF58_476D);
            *x = (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
        }
    }
    s
}

/// The batch rows of each prefix length (or position), in increasing order of the length: the
/// groups whose *extended* sequences (a state's rows, then the run's tokens) have one length.
pub fn by_length(lens: &[usize]) -> std::collections::BTreeMap<usize, Vec<usize>> {
    let mut g: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (b, &a) in lens.iter().enumerate() {
        g.entry(a).or_default().push(b);
    }
    g
}

/// The extension of the per-token array `x [B, T, …]` for the batch `rows` by `len` rows before
/// its tokens: `[rows, len + T, …]`, rows `0 … len − 1` from `prefix [B, ≥ len, …]` (zeros
/// without one), then `x`.
pub fn prefixed<F: Real>(x: &ArrayD<F>, prefix: Option<&ArrayD<F>>, rows: &[usize], len: usize) -> ArrayD<F> {
    let mut shape = x.shape().to_vec();
    shape[0] = rows.len();
    shape[1] += len;
    let mut ext = ArrayD::<F>::zeros(IxDyn(&shape));
    for (i, &b) in rows.iter().enumerate() {
        let mut row = ext.index_axis_mut(Axis(0), i);
        if let Some(p) = prefix {
            row.slice_axis_mut(Axis(0), Slice::from(..len))
                .assign(&p.index_axis(Axis(0), b).slice_axis(Axis(0), Slice::from(..len)));
        }
        row.slice_axis_mut(Axis(0), Slice::from(len..)).assign(&x.index_axis(Axis(0), b));
    }
    ext
}

/// The inverse of [`prefixed`] for gradients: row `i` of `ext [rows, len + T, …]` goes to batch
/// row `rows[i]`, its first `len` rows into `prefix [B, ≥ len, …]` (added), the rest into
/// `x [B, T, …]` (assigned).
pub fn unprefix<F: Real>(
    ext: &ArrayD<F>,
    rows: &[usize],
    len: usize,
    prefix: &mut ArrayD<F>,
    x: &mut ArrayD<F>,
) {
    for (i, &b) in rows.iter().enumerate() {
        let row = ext.index_axis(Axis(0), i);
        let mut p = prefix.index_axis_mut(Axis(0), b);
        let mut p = p.slice_axis_mut(Axis(0), Slice::from(..len));
        p += &row.slice_axis(Axis(0), Slice::from(..len));
        x.index_axis_mut(Axis(0), b).assign(&row.slice_axis(Axis(0), Slice::from(len..)));
    }
}

/// A decoder of `B` batch rows made of one decoder per row: for a state whose rows are at
/// different positions (a decoder steps its rows together). `make` builds the decoder of one
/// row (sizes with `B = 1`) from that row's state; each step runs every row's decoder on its
/// row of the token, and [`Decoder::state`] stacks the rows' states.
pub fn decoder_by_rows<F: Real>(
    initial: &Tensors<F>,
    rows: usize,
    make: impl Fn(&Tensors<F>) -> Result<Box<dyn crate::Decoder<F>>>,
) -> Result<Box<dyn crate::Decoder<F>>> {
    let rows = (0..rows).map(|i| make(&state_row(initial, i))).collect::<Result<Vec<_>>>()?;
    Ok(Box::new(ByRows { rows }))
}

/// [`decoder_by_rows`] for a state whose rows' positions (or cached lengths) `counts` differ,
/// each row's decoder built by `make` from the sizes with `B = 1` and the row's state; `None`
/// when every row is at the same count (one decoder steps them together).
pub fn by_rows_if_uneven<F: Real>(
    counts: &[usize],
    initial: &Tensors<F>,
    dims: &crate::Dims,
    make: impl Fn(&crate::Dims, &Tensors<F>) -> Result<Box<dyn crate::Decoder<F>>>,
) -> Option<Result<Box<dyn crate::Decoder<F>>>> {
    let first = counts.first()?;
    if counts.iter().all(|c| c == first) {
        return None;
    }
    let mut one = dims.clone();
    one.insert("B", 1);
    Some(decoder_by_rows(initial, counts.len(), |row| make(&one, row)))
}

/// A decoder that starts from a state at position `start` (a KV cache of `start` tokens, a GLR's
/// cache at `start`, a Toeplitz history it replayed): `inner` counts positions from the sequence's
/// start, as its cache needs, while [`crate::Decoder::position`] counts the tokens consumed after
/// the state, as every decoder does (the lifts' count from their first step already). Stepping,
/// capacity and the exported state are `inner`'s.
pub fn resumed<F: Real>(inner: Box<dyn crate::Decoder<F>>, start: usize) -> Box<dyn crate::Decoder<F>> {
    if start == 0 {
        return inner;
    }
    Box::new(Resumed { inner, start })
}

/// The decoder of [`resumed`].
struct Resumed<F> {
    inner: Box<dyn crate::Decoder<F>>,
    start: usize,
}

impl<F: Real> crate::Decoder<F> for Resumed<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        self.inner.step(token)
    }
    fn cache_elems(&self) -> usize {
        self.inner.cache_elems()
    }
    fn position(&self) -> usize {
        self.inner.position().saturating_sub(self.start)
    }
    fn state(&self) -> Result<Tensors<F>> {
        self.inner.state()
    }
}

/// The decoder of [`decoder_by_rows`].
struct ByRows<F> {
    rows: Vec<Box<dyn crate::Decoder<F>>>,
}

impl<F: Real> crate::Decoder<F> for ByRows<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        let n = self.rows.len();
        if let Some((k, v)) = token.iter().find(|(_, v)| v.shape().first() != Some(&n)) {
            return Err(Error::shape(k.clone(), format!("a token of B = {n} rows"), fmt_shape(v.shape())));
        }
        let ys = self
            .rows
            .iter_mut()
            .enumerate()
            .map(|(i, d)| d.step(&state_row(token, i)))
            .collect::<Result<Vec<_>>>()?;
        let views: Vec<_> = ys.iter().map(|y| y.view()).collect();
        ndarray::concatenate(Axis(0), &views)
            .map_err(|e| Error::Decoder(format!("stacking the rows' outputs: {e}")))
    }
    fn cache_elems(&self) -> usize {
        self.rows.iter().map(|d| d.cache_elems()).sum()
    }
    fn position(&self) -> usize {
        self.rows.first().map_or(0, |d| d.position())
    }
    fn state(&self) -> Result<Tensors<F>> {
        stack_rows(&self.rows.iter().map(|d| d.state()).collect::<Result<Vec<_>>>()?)
    }
}

/// Checks packed-batch offsets for a buffer of `t_len` rows and `batch` batch rows: `B = 1`,
/// at least one offset, the first `0`, non-decreasing, the last `≤ T` (rows past it belong to
/// no sequence). Returns the sequences' row ranges.
pub fn check_cu_seqlens(cu: &[usize], batch: usize, t_len: usize) -> Result<Vec<Range<usize>>> {
    let bad =
        |constraint: String| Error::Value { name: "cu_seqlens".into(), constraint, found: format!("{cu:?}") };
    if batch != 1 {
        return Err(Error::Value {
            name: "cu_seqlens".into(),
            constraint: "packed sequences take a batch of one row (B = 1): put the sequences \
                         back to back along T"
                .into(),
            found: format!("B = {batch}"),
        });
    }
    match cu.first() {
        None => return Err(bad("needs at least one offset (N + 1 offsets for N sequences)".into())),
        Some(&f) if f != 0 => return Err(bad("must start at 0".into())),
        _ => {}
    }
    if let Some(w) = cu.windows(2).find(|w| w[1] < w[0]) {
        return Err(bad(format!("must be non-decreasing ({} then {})", w[0], w[1])));
    }
    if let Some(&last) = cu.last()
        && last > t_len
    {
        return Err(bad(format!("must end at most at T = {t_len}")));
    }
    Ok(cu.windows(2).map(|w| w[0]..w[1]).collect())
}

/// The inputs of the tokens `range` of `inputs`, as a sequence of their own: every per-token
/// input cut along the sequence axis, static inputs kept, and the axes whose size depends on
/// `T` exactly cut to the segment's length ([`Mixer::length_axes`], e.g. the GLR's slots).
/// An error when `range` is not inside every per-token input's sequence axis.
pub fn segment<F: Clone>(m: &dyn Mixer, inputs: &Tensors<F>, range: Range<usize>) -> Result<Tensors<F>> {
    cut(inputs, &m.spec().per_token(), &m.length_axes(range.len()), range)
}

/// The inputs of the tokens `range` for a run *from a state*: every per-token input cut along the
/// sequence axis, every other axis kept whole. The axes [`segment`] cuts to the segment's length
/// (the GLR's slots) are sized by absolute positions here: a run from position `a` reads
/// `K(a + T)` slots, so one slot axis sized for the whole sequence serves every part.
pub fn segment_from_state<F: Clone>(
    m: &dyn Mixer,
    inputs: &Tensors<F>,
    range: Range<usize>,
) -> Result<Tensors<F>> {
    cut(inputs, &m.spec().per_token(), &[], range)
}

/// [`segment`] from the per-token input names and the length axes.
pub fn cut<F: Clone>(
    inputs: &Tensors<F>,
    per_token: &[String],
    cuts: &[(&'static str, usize, usize)],
    range: Range<usize>,
) -> Result<Tensors<F>> {
    inputs
        .iter()
        .map(|(k, v)| {
            let mut v = if per_token.contains(k) {
                let t = v.shape().get(1).copied().unwrap_or(0);
                if range.start > range.end || range.end > t {
                    return Err(Error::shape(
                        k.clone(),
                        format!("a sequence axis of at least {} tokens for rows {range:?}", range.end),
                        fmt_shape(v.shape()),
                    ));
                }
                v.slice_axis(Axis(1), Slice::from(range.clone())).to_owned()
            } else {
                v.clone()
            };
            for &(name, axis, n) in cuts {
                if name == k && axis < v.ndim() && v.shape()[axis] >= n {
                    v = v.slice_axis(Axis(axis), Slice::from(0..n)).to_owned();
                }
            }
            Ok((k.clone(), v))
        })
        .collect()
}

/// Writes a segment's array `part` back into the full array `full` at the tokens `range`
/// (per-token arrays: axis 1) and at the leading entries of every other axis (the axes
/// [`segment`] cut; the rest of `full` is left as it is). Static arrays (`per_token` false)
/// are added instead: a parameter's gradient is the sum over the sequences.
pub fn scatter<F: Real>(
    full: &mut ArrayD<F>,
    part: &ArrayD<F>,
    range: Range<usize>,
    per_token: bool,
) -> Result<()> {
    if full.ndim() != part.ndim() {
        return Err(Error::shape("packed segment", fmt_shape(full.shape()), fmt_shape(part.shape())));
    }
    let mut view = full.view_mut();
    for (axis, &n) in part.shape().iter().enumerate() {
        let r = if per_token && axis == 1 { range.clone() } else { 0..n };
        if r.len() != n || r.end > view.shape()[axis] {
            return Err(Error::shape("packed segment", fmt_shape(full.shape()), fmt_shape(part.shape())));
        }
        view.slice_axis_inplace(Axis(axis), Slice::from(r));
    }
    if per_token {
        view.assign(part);
    } else {
        view.zip_mut_with(part, |a, &b| *a += b);
    }
    Ok(())
}

/// Row `i` of every tensor of a state (batch axis 0 kept, of length 1).
pub fn state_row<F: Clone>(state: &Tensors<F>, i: usize) -> Tensors<F> {
    state.iter().map(|(k, v)| (k.clone(), v.slice_axis(Axis(0), Slice::from(i..i + 1)).to_owned())).collect()
}

/// Stacks one-row states along the batch axis (`rows` in sequence order, each from
/// [`state_row`] or a run with `B = 1`).
pub fn stack_rows<F: Clone>(rows: &[Tensors<F>]) -> Result<Tensors<F>> {
    let Some(first) = rows.first() else {
        return Ok(Tensors::new());
    };
    first
        .keys()
        .map(|k| {
            let views: Vec<_> = rows.iter().map(|r| r[k].view()).collect();
            ndarray::concatenate(Axis(0), &views)
                .map(|a| (k.clone(), a))
                .map_err(|e| Error::Numerical(format!("stacking state `{k}`: {e}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_checked_with_what_was_given() {
        assert_eq!(check_cu_seqlens(&[0, 3, 3, 7], 1, 9).unwrap(), vec![0..3, 3..3, 3..7]);
        for (cu, b, t, needle) in [
            (&[0, 3][..], 2, 9, "B = 1"),
            (&[][..], 1, 9, "at least one offset"),
            (&[1, 3][..], 1, 9, "start at 0"),
            (&[0, 5, 4][..], 1, 9, "5 then 4"),
            (&[0, 10][..], 1, 9, "T = 9"),
        ] {
            let e = check_cu_seqlens(cu, b, t).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("cu_seqlens"), "{e}");
        }
    }

    #[test]
    fn states_are_checked_by_name_shape_and_value() {
        let want: StateShapes = vec![("S".into(), vec![1, 2, 3, 4])];
        let mut s = zeros::<f64>(&want);
        check_state("initial_state", &want, &s).unwrap();
        s.insert("S".into(), ArrayD::zeros(IxDyn(&[1, 2, 4, 3])));
        let e = check_state("initial_state", &want, &s).unwrap_err().to_string();
        assert!(
            e.contains("initial_state.S") && e.contains("[1, 2, 3, 4]") && e.contains("[1, 2, 4, 3]"),
            "{e}"
        );
        let mut s = zeros::<f64>(&want);
        s.get_mut("S").unwrap()[[0, 1, 2, 3]] = f64::NAN;
        assert!(check_state("initial_state", &want, &s).unwrap_err().to_string().contains("finite"));
        let e = check_state("initial_state", &want, &Tensors::<f64>::new()).unwrap_err().to_string();
        assert!(e.contains("missing") && e.contains("initial_state.S"), "{e}");
    }

    #[test]
    fn a_segment_outside_the_sequence_is_an_error() {
        let x: Tensors<f64> = [("x".to_string(), ArrayD::zeros(IxDyn(&[1, 5, 2])))].into_iter().collect();
        let per_token = vec!["x".to_string()];
        assert_eq!(cut(&x, &per_token, &[], 1..4).unwrap()["x"].shape(), [1, 3, 2]);
        let e = cut(&x, &per_token, &[], 3..7).unwrap_err().to_string();
        assert!(e.contains("`x`") && e.contains("7 tokens") && e.contains("[1, 5, 2]"), "{e}");
    }

    #[test]
    fn scatter_writes_tokens_and_sums_parameters() {
        let mut full = ArrayD::<f64>::zeros(IxDyn(&[1, 5, 3]));
        let part = ArrayD::from_elem(IxDyn(&[1, 2, 2]), 1.0);
        scatter(&mut full, &part, 2..4, true).unwrap();
        assert_eq!(full.sum(), 4.0);
        assert_eq!(full[[0, 2, 1]], 1.0);
        assert_eq!(full[[0, 2, 2]], 0.0);
        let mut w = ArrayD::<f64>::ones(IxDyn(&[2]));
        scatter(&mut w, &ArrayD::from_elem(IxDyn(&[2]), 2.0), 0..0, false).unwrap();
        assert_eq!(w.sum(), 6.0);
    }
}
