//! The log-linear family's state map for context parallelism (docs/math.md §7.3): level states
//! `[B, H, L, Dv, Dk]` (a base mixer's one level) and positions; a part's transition is
//! `tr [B, H, L, L·Dk, Dk]`, block `(j, i)` of slot `j` being where start slot `i` goes, times `P`.
//! `P` and the output's reach are read off a widened run, except for Mamba-2 and linear
//! attention, where they are closed forms (`e^{G_T} I`, `σ e^{G_t} q_t`).

use mixer_core::mixer::{Mixer, downcast};
use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::state::POSITION;
use mixer_core::tensor::{cast_tensors, get, tensors_to_f64};
use mixer_core::{Error, Result, Tensors};
use mixer_registry::Backend;
use mixer_registry::family::Scalar;
use ndarray::{Array1, Array5, ArrayD, Axis, Ix5, IxDyn, Slice, s};

use super::{internal, run_from};

/// The state tensor's name (`S [B, H, Dv, Dk]`, or `[B, H, L, Dv, Dk]` for a lift).
const S: &str = mixer_core::mixers::loglinear::STATE;

/// A part's sizes and whether the mixer is a lift (its state has a level axis and a position).
#[derive(Clone, Copy)]
pub(super) struct Part {
    pub(super) b: usize,
    pub(super) t: usize,
    h: usize,
    dk: usize,
    dv: usize,
    /// Level slots of the state (1 for a base mixer).
    l: usize,
    lifted: bool,
    /// Mamba-2 and linear attention: the scale σ. Their transition `e^{G_T} I` and the reach
    /// `σ e^{G_t} q_t` are closed forms, so their run is not widened.
    closed: Option<f64>,
}

impl Part {
    /// The part `x` of a log-linear mixer, or `None` for another family.
    pub(super) fn of<F: Scalar>(m: &dyn Mixer, x: &Tensors<F>) -> Result<Option<Part>> {
        let Ok(ll) = downcast::<LogLinear>(m, "context parallel") else { return Ok(None) };
        let (k, v) = (get(x, "k")?.shape(), get(x, "v")?.shape());
        let (&[b, t, h, dk], &[_, _, _, dv]) = (k, v) else {
            return Err(Error::shape("k, v", "[B, T, H, D]", format!("{k:?}, {v:?}")));
        };
        let lifted = ll.lift.is_some();
        let l = if lifted { get(x, "lambda")?.shape().get(3).copied().unwrap_or(0) } else { 1 };
        let closed = (!lifted && ll.base != Base::GatedDeltaNet).then_some(ll.scale);
        Ok(Some(Part { b, t, h, dk, dv, l, lifted, closed }))
    }

    /// Level states of zeros.
    pub(super) fn zeros(&self) -> ArrayD<f64> {
        Array5::zeros((self.b, self.h, self.l, self.dv, self.dk)).into_dyn()
    }

    /// The transition of an empty part: every slot to itself, times `I`.
    pub(super) fn identity(&self) -> ArrayD<f64> {
        let (dk, rows) = (self.dk, self.l * self.dk);
        Array5::from_shape_fn(
            (self.b, self.h, self.l, rows, dk),
            |(_, _, j, r, c)| {
                if r == j * dk + c { 1.0 } else { 0.0 }
            },
        )
        .into_dyn()
    }

    /// A state in the library's layout from level states `[B, H, L, rows, Dk]` and positions.
    pub(super) fn state<F: Scalar>(&self, levels: &ArrayD<f64>, pos: &[usize]) -> Result<Tensors<F>> {
        let st = if self.lifted {
            levels.clone()
        } else {
            let d = levels.shape().to_vec();
            levels.clone().into_shape_with_order(IxDyn(&[d[0], d[1], d[3], d[4]])).map_err(internal)?
        };
        let mut t: Tensors<f64> = [(S.to_string(), st)].into_iter().collect();
        if self.lifted {
            t.insert(POSITION.into(), Array1::from_iter(pos.iter().map(|&a| a as f64)).into_dyn());
        }
        Ok(cast_tensors::<F>(&t))
    }

    /// A state's level states `[B, H, L, Dv, Dk]` (a base mixer's one level) and positions.
    pub(super) fn values<F: Scalar>(&self, t: &Tensors<F>) -> Result<(ArrayD<f64>, Vec<usize>)> {
        let t = tensors_to_f64(t);
        let st = get(&t, S)?;
        let want = if self.lifted { 5 } else { 4 };
        if st.ndim() != want {
            let layout = if self.lifted { "[B, H, L, Dv, Dk]" } else { "[B, H, Dv, Dk]" };
            return Err(Error::shape(
                format!("context parallel: state {S}"),
                layout,
                format!("{:?}", st.shape()),
            ));
        }
        let st = if self.lifted {
            st.clone()
        } else {
            let d = st.shape().to_vec();
            st.clone().into_shape_with_order(IxDyn(&[d[0], d[1], 1, d[2], d[3]])).map_err(internal)?
        };
        let pos = match t.get(POSITION) {
            Some(a) => a.iter().map(|&v| v as usize).collect(),
            None => vec![0; self.b],
        };
        Ok((st, pos))
    }

    /// The part's end state from a zero start, `L`, its transition `tr` (module documentation)
    /// and the run's `y`, from one run: the part with `v` widened by `L·Dk` zero columns, from the
    /// state whose rows `0 … Dv − 1` are zero and whose slot `i` holds the identity in rows
    /// `Dv + i·Dk …` for every slot that may be non-empty at the start position (bit `i` of it
    /// set, for a lift; the one slot of a base mixer). Each row of a state evolves on its own, so
    /// the end state's first `Dv` rows are `L` and the rest `tr`; `y`'s first `Dv` columns are
    /// the part's output from a zero start, columns `Dv + i·Dk …` slot `i`'s reach.
    pub(super) fn local_and_transition<F: Scalar>(
        &self,
        m: &dyn Mixer,
        backend: &Backend,
        x: &Tensors<F>,
        pos: &[usize],
    ) -> Result<super::Widened> {
        if let Some(scale) = self.closed {
            return self.closed_form(m, backend, x, pos, scale);
        }
        let (dk, dv, wide) = (self.dk, self.dv, self.l * self.dk);
        let basis = Array5::from_shape_fn((self.b, self.h, self.l, dv + wide, dk), |(b, _, i, r, c)| {
            let live = !self.lifted || (pos[b] >> i) & 1 == 1;
            if live && r == dv + i * dk + c { 1.0 } else { 0.0 }
        });
        let v = get(x, "v")?;
        let zeros = ArrayD::<F>::zeros(IxDyn(&[self.b, self.t, self.h, wide]));
        let mut xw = x.clone();
        xw.insert("v".into(), ndarray::concatenate(Axis(3), &[v.view(), zeros.view()]).map_err(internal)?);
        let (y, end) = run_from(m, backend, &xw, &self.state::<F>(&basis.into_dyn(), pos)?)?;
        let end = self.values(&end)?.0;
        let local = end.slice_axis(Axis(3), Slice::from(..dv)).to_owned();
        let tr = end.slice_axis(Axis(3), Slice::from(dv..)).to_owned();
        Ok(super::Widened { local, tr, y: Some(y.mapv(|v| v.f64())) })
    }

    /// [`Part::local_and_transition`] of Mamba-2 and linear attention: the part's own run from
    /// zeros gives `L` and `y^loc`; with `G_t` the running sum of `g` over the part (zero without
    /// `g`), `tr = e^{G_T} I` and the reach `σ e^{G_t} q_t` (in the widened run's layout).
    fn closed_form<F: Scalar>(
        &self,
        m: &dyn Mixer,
        backend: &Backend,
        x: &Tensors<F>,
        pos: &[usize],
        scale: f64,
    ) -> Result<super::Widened> {
        let (b, t, h, dk, dv) = (self.b, self.t, self.h, self.dk, self.dv);
        let (y, end) = run_from(m, backend, x, &self.state::<F>(&self.zeros(), pos)?)?;
        let local = self.values(&end)?.0;
        let q = get(x, "q")?.view().into_dimensionality::<ndarray::Ix4>().map_err(internal)?;
        let y = y.view().into_dimensionality::<ndarray::Ix4>().map_err(internal)?;
        // G_t per (b, t, h): the running sum of g over the part (the part is not empty).
        let mut logs = match x.get("g") {
            Some(g) => g.view().into_dimensionality::<ndarray::Ix3>().map_err(internal)?.mapv(|v| v.f64()),
            None => ndarray::Array3::zeros((b, t, h)),
        };
        logs.accumulate_axis_inplace(Axis(1), |&prev, cur| *cur += prev);
        let widened = ndarray::Array4::from_shape_fn((b, t, h, dv + dk), |(bi, ti, hi, c)| {
            if c < dv {
                y[[bi, ti, hi, c]].f64()
            } else {
                scale * logs[[bi, ti, hi]].exp() * q[[bi, ti, hi, c - dv]].f64()
            }
        });
        let decay = |bi: usize, hi: usize| logs[[bi, t - 1, hi]].exp();
        let tr = Array5::from_shape_fn(
            (b, h, 1, dk, dk),
            |(bi, hi, _, r, c)| if r == c { decay(bi, hi) } else { 0.0 },
        );
        Ok(super::Widened { local, tr: tr.into_dyn(), y: Some(widened.into_dyn()) })
    }

    /// The part's `y` from the start levels `s` `[B, H, L, Dv, Dk]` and its widened run's `y`
    /// `[B, T, H, Dv + L·Dk]`: `y_t = y_t^loc + Σ_i s^(i) · r_t^(i)`.
    pub(super) fn output(&self, widened: &ArrayD<f64>, s: &ArrayD<f64>) -> Result<ArrayD<f64>> {
        let w = widened.view().into_dimensionality::<ndarray::Ix4>().map_err(internal)?;
        let s = s.view().into_dimensionality::<Ix5>().map_err(internal)?;
        let (dk, dv) = (self.dk, self.dv);
        let mut y = w.slice(s![.., .., .., ..dv]).to_owned();
        for b in 0..self.b {
            for h in 0..self.h {
                for i in 0..self.l {
                    let reach = w.slice(s![b, .., h, dv + i * dk..dv + (i + 1) * dk]);
                    let add = reach.dot(&s.slice(s![b, h, i, .., ..]).t());
                    let mut o = y.slice_mut(s![b, .., h, ..]);
                    o += &add;
                }
            }
        }
        Ok(y.into_dyn())
    }

    /// The adjoint of [`Part::output`] in the start levels: the start state's gradient through
    /// the part's own outputs, `Λ^(i) = Σ_t dy_t r_t^(i)ᵀ` `[B, H, L, Dv, Dk]`, from the widened
    /// run's `y` and `dy [B, T, H, Dv]`.
    pub(super) fn output_adjoint(&self, widened: &ArrayD<f64>, dy: &ArrayD<f64>) -> Result<ArrayD<f64>> {
        let w = widened.view().into_dimensionality::<ndarray::Ix4>().map_err(internal)?;
        let dy = dy.view().into_dimensionality::<ndarray::Ix4>().map_err(internal)?;
        let (dk, dv) = (self.dk, self.dv);
        let mut out = Array5::<f64>::zeros((self.b, self.h, self.l, dv, dk));
        for b in 0..self.b {
            for h in 0..self.h {
                let g = dy.slice(s![b, .., h, ..]);
                for i in 0..self.l {
                    let reach = w.slice(s![b, .., h, dv + i * dk..dv + (i + 1) * dk]);
                    out.slice_mut(s![b, h, i, .., ..]).assign(&g.t().dot(&reach));
                }
            }
        }
        Ok(out.into_dyn())
    }

    /// A part's transition applied to level states: `out[j] = Σ_i s[i] · tr[j][i-th block of
    /// Dk rows]`, or its adjoint (`transpose`: `out[i] = Σ_j s[j] · tr[j][i-th block]ᵀ`).
    pub(super) fn apply(&self, s: &ArrayD<f64>, tr: &ArrayD<f64>, transpose: bool) -> Result<ArrayD<f64>> {
        let s = s.view().into_dimensionality::<Ix5>().map_err(internal)?;
        let tr = tr.view().into_dimensionality::<Ix5>().map_err(internal)?;
        let (b, h, l, rows, dk) = s.dim();
        let mut out = Array5::<f64>::zeros((b, h, l, rows, dk));
        for bi in 0..b {
            for hi in 0..h {
                for j in 0..l {
                    for i in 0..l {
                        let block = tr.slice(s![bi, hi, j, i * dk..(i + 1) * dk, ..]);
                        let (from, to) = if transpose { (j, i) } else { (i, j) };
                        let sv = s.slice(s![bi, hi, from, .., ..]);
                        let prod = if transpose { sv.dot(&block.t()) } else { sv.dot(&block) };
                        let mut o = out.slice_mut(s![bi, hi, to, .., ..]);
                        o += &prod;
                    }
                }
            }
        }
        Ok(out.into_dyn())
    }
}
