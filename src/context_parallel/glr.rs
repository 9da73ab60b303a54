//! The GLR's state map for context parallelism (docs/math.md §7.3): the kept streams
//! `[B, R, C]` (past outputs with the pattern on `B`, inputs on `A`, both with `on = "both"`)
//! and positions. The streams are handled stacked on the row axis, `[B, S·R, C]` for `S` streams
//! in the order of [`streams`]. A part's map is linear per channel in the start rows (`x = 0`
//! leaves only them), so its transition is `tr [B, S·R, C, S·R]`, `tr[b, j, c, i]` what start
//! row `i` adds to end row `j` in channel `c` (an output row may read a kept input row; a kept
//! input row reads only input rows, and none once the part is `R` tokens long).

use mixer_core::Result;
use mixer_core::Tensors;
use mixer_core::mixer::{Mixer, downcast};
use mixer_core::mixers::glr::Glr;
use mixer_core::mixers::glr::state::{kept, slot_count, streams};
use mixer_core::state::POSITION;
use mixer_core::tensor::{cast_tensors, get, tensors_to_f64};
use mixer_registry::Backend;
use mixer_registry::family::Scalar;
use ndarray::{Array1, Array3, Array4, ArrayD, Axis, Dimension, Ix3, Ix4, IxDyn, Slice};

use super::{internal, run_from};

/// A part's sizes: batch rows, tokens, channels, state rows per stream, slots, and the kept
/// streams' names.
#[derive(Clone, Copy)]
pub(super) struct Part {
    pub(super) b: usize,
    pub(super) t: usize,
    c: usize,
    r: usize,
    k: usize,
    names: &'static [&'static str],
}

impl Part {
    /// The part `x` of a GLR, or `None` for another family.
    pub(super) fn of<F: Scalar>(m: &dyn Mixer, x: &Tensors<F>) -> Result<Option<Part>> {
        let Ok(g) = downcast::<Glr>(m, "context parallel") else { return Ok(None) };
        let dims = mixer_registry::mixer_core::mixer::validate_typed(m, x)?;
        let k = slot_count(&dims).unwrap_or(0);
        let size = |s: &str| dims.get(s).copied().unwrap_or(0);
        let r = mixer_core::mixers::glr::state::rows(g, k);
        Ok(Some(Part { b: size("B"), t: size("T"), c: size("C"), r, k, names: streams(g) }))
    }

    /// The rows of the stacked streams, `S·R`.
    fn rows(&self) -> usize {
        self.names.len() * self.r
    }

    /// Stacked streams of zeros.
    pub(super) fn zeros(&self) -> ArrayD<f64> {
        Array3::zeros((self.b, self.rows(), self.c)).into_dyn()
    }

    /// The transition of an empty part: every row to itself.
    pub(super) fn identity(&self) -> ArrayD<f64> {
        let n = self.rows();
        Array4::from_shape_fn((self.b, n, self.c, n), |(_, j, _, i)| if i == j { 1.0 } else { 0.0 })
            .into_dyn()
    }

    /// A state in the library's layout from the stacked streams `[B, S·R, C]` and positions.
    pub(super) fn state<F: Scalar>(&self, values: &ArrayD<f64>, pos: &[usize]) -> Result<Tensors<F>> {
        let mut t: Tensors<f64> = self
            .names
            .iter()
            .enumerate()
            .map(|(i, &name)| {
                let rows = Slice::from(i * self.r..(i + 1) * self.r);
                (name.to_string(), values.slice_axis(Axis(1), rows).to_owned())
            })
            .collect();
        t.insert(POSITION.to_string(), Array1::from_iter(pos.iter().map(|&a| a as f64)).into_dyn());
        Ok(cast_tensors::<F>(&t))
    }

    /// A state's streams, stacked, and positions.
    pub(super) fn values<F: Scalar>(&self, t: &Tensors<F>) -> Result<(ArrayD<f64>, Vec<usize>)> {
        let t = tensors_to_f64(t);
        let pos =
            get(&t, POSITION).map(|a| a.iter().map(|&v| v as usize).collect()).unwrap_or(vec![0; self.b]);
        let streams = self.names.iter().map(|&n| get(&t, n).map(|a| a.view())).collect::<Result<Vec<_>>>()?;
        Ok((ndarray::concatenate(Axis(1), &streams).map_err(internal)?, pos))
    }

    /// The part's end streams from a zero start, `L`, and its transition `tr`, from one run: the
    /// part's `C` channels from zeros, then every channel again `N = S·R` times with `x = 0`,
    /// copy `C + c·N + i` started from 1 in stacked row `i` for every row that holds a value at
    /// the start position (the rows of a channel evolve together, so each needs a channel of its
    /// own).
    pub(super) fn local_and_transition<F: Scalar>(
        &self,
        m: &dyn Mixer,
        backend: &Backend,
        x: &Tensors<F>,
        pos: &[usize],
    ) -> Result<super::Widened> {
        let g = downcast::<Glr>(m, "context parallel")?;
        let (c, r, n) = (self.c, self.r, self.rows());
        let wide: Tensors<F> = x
            .iter()
            .map(|(k, v)| {
                let mut shape = v.shape().to_vec();
                let last = shape.len() - 1;
                shape[last] = c + c * n;
                let rep = ArrayD::from_shape_fn(IxDyn(&shape), |ix: IxDyn| {
                    let mut src = ix.slice().to_vec();
                    let ch = src[last];
                    if ch < c {
                        return v[IxDyn(&src)];
                    }
                    if k == "x" {
                        return F::zero();
                    }
                    src[last] = (ch - c) / n;
                    v[IxDyn(&src)]
                });
                Ok((k.clone(), rep))
            })
            .collect::<Result<_>>()?;
        let live: Vec<Vec<bool>> =
            pos.iter().map(|&a| kept(g, self.k, a).iter().map(Option::is_some).collect()).collect();
        let basis = Array3::from_shape_fn((self.b, n, c + c * n), |(b, i, ch)| {
            let on = ch >= c && (ch - c) % n == i && live[b].get(i % r).copied().unwrap_or(false);
            if on { 1.0 } else { 0.0 }
        });
        let (y, end) = run_from(m, backend, &wide, &self.state::<F>(&basis.into_dyn(), pos)?)?;
        let end = self.values(&end)?.0.into_dimensionality::<Ix3>().map_err(internal)?;
        let local = end.slice(ndarray::s![.., .., ..c]).to_owned().into_dyn();
        let tr = Array4::from_shape_fn((self.b, n, c, n), |(b, j, ch, i)| end[[b, j, c + ch * n + i]]);
        Ok(super::Widened { local, tr: tr.into_dyn(), y: Some(y.mapv(|v| v.f64())) })
    }

    /// The part's `y` from the start streams `s` `[B, N, C]` and its widened run's `y`
    /// `[B, T, C + C·N]`: `y[t, c] = y^loc[t, c] + Σ_i s[i, c] · y[t, C + c·N + i]` (copy
    /// `(c, i)`'s output is row `i`'s reach in channel `c`).
    pub(super) fn output(&self, widened: &ArrayD<f64>, s: &ArrayD<f64>) -> Result<ArrayD<f64>> {
        let w = widened.view().into_dimensionality::<Ix3>().map_err(internal)?;
        let s = s.view().into_dimensionality::<Ix3>().map_err(internal)?;
        let (c, n) = (self.c, self.rows());
        let y = Array3::from_shape_fn((self.b, self.t, c), |(b, t, ch)| {
            w[[b, t, ch]] + (0..n).map(|i| s[[b, i, ch]] * w[[b, t, c + ch * n + i]]).sum::<f64>()
        });
        Ok(y.into_dyn())
    }

    /// The adjoint of [`Part::output`] in the start streams: the start state's gradient through
    /// the part's own outputs, `Λ[b, i, c] = Σ_t dy[b, t, c] · y[b, t, C + c·N + i]` `[B, N, C]`.
    pub(super) fn output_adjoint(&self, widened: &ArrayD<f64>, dy: &ArrayD<f64>) -> Result<ArrayD<f64>> {
        let w = widened.view().into_dimensionality::<Ix3>().map_err(internal)?;
        let dy = dy.view().into_dimensionality::<Ix3>().map_err(internal)?;
        let (c, n) = (self.c, self.rows());
        let out = Array3::from_shape_fn((self.b, n, c), |(b, i, ch)| {
            (0..self.t).map(|t| dy[[b, t, ch]] * w[[b, t, c + ch * n + i]]).sum::<f64>()
        });
        Ok(out.into_dyn())
    }

    /// A part's transition applied to a stream: `out[b, j, c] = Σ_i tr[b, j, c, i] s[b, i, c]`, or
    /// its adjoint (`transpose`: `out[b, i, c] = Σ_j tr[b, j, c, i] s[b, j, c]`).
    pub(super) fn apply(&self, s: &ArrayD<f64>, tr: &ArrayD<f64>, transpose: bool) -> Result<ArrayD<f64>> {
        let s = s.view().into_dimensionality::<Ix3>().map_err(internal)?;
        let tr = tr.view().into_dimensionality::<Ix4>().map_err(internal)?;
        let (b, r, c) = s.dim();
        let mut out = Array3::<f64>::zeros((b, r, c));
        for ((bi, j, ch, i), &w) in tr.indexed_iter() {
            if transpose {
                out[[bi, i, ch]] += w * s[[bi, j, ch]];
            } else {
                out[[bi, j, ch]] += w * s[[bi, i, ch]];
            }
        }
        Ok(out.into_dyn())
    }
}
