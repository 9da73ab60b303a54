//! The recurrent state of the GLR (docs/math.md §7.1) and runs from it for every form and
//! backend through the *extension*.
//!
//! **Layout.** After a prefix of `a` tokens a decoder keeps the past values later tokens read:
//! the outputs `y` when the pattern is on `B` (`on = "b"`), the inputs `x` when it is on `A`
//! (`on = "a"`). Every token `t ≥ a` reads positions `d_k(t) ≥ t − f(k)`, so with the `K` slots
//! of `beta` (or `K + 1` of `alpha`) the reads before `a` lie in `[a − f(K − 1), a)`. The state is
//! - `y [B, R, C]` (`on = "b"`) or `x [B, R, C]` (`on = "a"`): the values at the kept positions;
//! - `position [B]`: `a` per batch row.
//!
//! The rows `R` and their positions ([`kept`]):
//! - translation-invariant: `R = f(K − 1)`, row `j` is position `a − R + j` (zero when that is
//!   negative): the window of the last `f(K − 1)` tokens;
//! - cache-efficient lattice: `R = K`, row `k` is `d_k(a)`, the position slot `k` of the next
//!   token reads, for the slots active at `a` (`f(k) ≤ a`) and only for the first slot that
//!   reads each position; the other rows are zero. By the lattice invariant
//!   (`P_t ⊆ P_{t−1} ∪ {t − 1}`) these `|P_a|` values are all that any later token reads before
//!   `a`: the decoder's cache.
//!
//! Rows that hold no value must be zero. `K` is the slot axis of the inputs: a run of `T` tokens
//! from position `a` reads the slots active up to `a + T − 1`, so it needs `K ≥ K(a + T)` (the
//! slot axis may exceed `K(T)`: slots past `K(T)` are never read by a run from position 0). One
//! `beta` sized for the whole sequence therefore serves every part of it. `on = "both"` has no
//! state yet.
//!
//! **Runs from a state** ([`run`]): per group of batch rows at one position `a`, the form runs on
//! the extended sequence of `a + T` tokens at absolute positions `0 … a + T − 1`: prefix token
//! `p < a` has `x_p` = the state's value at `p` (zero where it holds none), `α_p = 1` and no
//! slots, so `y_p = x_p` — the kept output (`on = "b"`) or the kept input (`on = "a"`) — then
//! the run's tokens. Positions the state does not keep are never read (above), so `y` is the
//! extension's rows `a …` and the final state is read off the extension at [`kept`]`(a + T)`.
//!
//! **Backward** ([`vjp`]): the form's backward on the extension with the cotangent zero on the
//! prefix (and, with `on = "b"`, the final state's cotangent added at the kept outputs). The
//! prefix's `y_p = x_p`, so the state's gradient is `x̄_ext` at the kept positions; with
//! `on = "a"` the final state is a copy of inputs and its cotangent adds to `x̄_ext` there.

use ndarray::{ArrayD, Axis, IxDyn, s};

use super::{Glr, On};
use crate::error::{Error, Result, fmt_shape};
use crate::grad::grad_name;
use crate::pattern::Slots;
use crate::real::Real;
use crate::state::{POSITION, StateShapes, by_length, position_tensor};
use crate::tensor::{Tensors, get};

/// The name of the kept stream: `y` (pattern on `B`) or `x` (on `A`).
pub fn stream(m: &Glr) -> std::result::Result<&'static str, String> {
    match m.on() {
        On::B => Ok("y"),
        On::A => Ok("x"),
        On::Both => Err("a GLR with its pattern on both A and B (`on = \"both\"`) has no state yet".into()),
    }
}

/// The slot count `K` of the inputs' sizes (`K`, or `K1 − 1` with the pattern on `A`).
pub fn slot_count(dims: &crate::Dims) -> Option<usize> {
    dims.get("K").copied().or_else(|| dims.get("K1").map(|k| k.saturating_sub(1)))
}

/// The rows of the state for `K` slots: `f(K − 1)` (translation-invariant) or `K` (lattice).
pub fn rows(m: &Glr, k: usize) -> usize {
    match (k, m.pattern().cache_efficient()) {
        (0, _) => 0,
        (k, true) => k,
        (k, false) => m.pattern().offset(k - 1) as usize,
    }
}

/// The position each row of a state at position `a` with `K` slots holds, or `None` for a row
/// that holds none (module documentation).
pub fn kept(m: &Glr, k: usize, a: usize) -> Vec<Option<usize>> {
    let r = rows(m, k);
    if !m.pattern().cache_efficient() {
        return (0..r).map(|j| (a + j).checked_sub(r)).collect();
    }
    let slots = Slots::new(m.pattern(), a + 1);
    let mut out = vec![None; r];
    let mut seen = Vec::new();
    for (i, d) in slots.deps(a).take(r) {
        if !seen.contains(&d) {
            seen.push(d);
            out[i] = Some(d);
        }
    }
    out
}

/// The state's shapes: `y` or `x` `[B, R, C]` and `position [B]`.
pub(crate) fn shapes(m: &Glr, dims: &crate::Dims) -> std::result::Result<StateShapes, String> {
    let name = stream(m)?;
    let size = |s: &str| dims.get(s).copied().ok_or_else(|| format!("size `{s}` is unbound"));
    let k = slot_count(dims).ok_or("size `K` is unbound")?;
    let b = size("B")?;
    Ok(vec![(name.into(), vec![b, rows(m, k), size("C")?]), (POSITION.into(), vec![b])])
}

/// The positions of a state for a run of `t_len` tokens with `k` slots, per batch row, after
/// checking them ([`crate::state::positions`]), `K ≥ K(a + T)`, and that the rows that hold no
/// value are zero.
pub fn positions<F: Real>(m: &Glr, state: &Tensors<F>, t_len: usize, k: usize) -> Result<Vec<usize>> {
    let name = stream(m).map_err(|why| crate::state::no_state(crate::Mixer::name(m), &why))?;
    let (v, p) = (get(state, name)?, get(state, POSITION)?);
    if v.ndim() != 3 || p.shape() != [v.shape()[0]] || v.shape()[1] != rows(m, k) {
        return Err(Error::shape(
            "state",
            format!("{name} [B, {}, C] and position [B]", rows(m, k)),
            format!("{name} {}, position {}", fmt_shape(v.shape()), fmt_shape(p.shape())),
        ));
    }
    let pos = crate::state::positions(p, t_len)?;
    for (b, &a) in pos.iter().enumerate() {
        let need = m.pattern().slots(a + t_len);
        if need > k {
            return Err(Error::Value {
                name: format!("state.{POSITION}[{b}]"),
                constraint: format!(
                    "a run of {t_len} tokens from position {a} reads K({}) = {need} slots, so alpha and \
                     beta need a slot axis of K ≥ {need} (one sized for the whole sequence serves every part)",
                    a + t_len
                ),
                found: format!("K = {k}, position {a}"),
            });
        }
        for (j, at) in kept(m, k, a).into_iter().enumerate() {
            if at.is_none() && v.slice(s![b, j, ..]).iter().any(|&x| x != F::zero()) {
                return Err(Error::Value {
                    name: format!("state.{name}[{b}, {j}]"),
                    constraint: format!(
                        "row {j} holds no value at position {a} (module docs: docs/math.md §7.1), so it must be zero"
                    ),
                    found: "non-zero entries".into(),
                });
            }
        }
    }
    Ok(pos)
}

/// The sizes `(B, T, C, K)` of GLR inputs.
fn sizes<F>(x: &Tensors<F>) -> Result<(usize, usize, usize, usize)> {
    let xs = get(x, "x")?.shape().to_vec();
    let a = get(x, "alpha")?;
    let k = match x.get("beta") {
        Some(b) if b.ndim() == 4 => b.shape()[2],
        _ if a.ndim() == 4 => a.shape()[2].saturating_sub(1),
        _ => 0,
    };
    match xs[..] {
        [b, t, c] => Ok((b, t, c, k)),
        _ => Err(Error::shape("x", "[B, T, C]", fmt_shape(&xs))),
    }
}

/// The extension of the batch `rows` at position `a` (module documentation).
fn extension<F: Real>(
    m: &Glr,
    x: &Tensors<F>,
    state: Option<&ArrayD<F>>,
    rows: &[usize],
    a: usize,
    k: usize,
) -> Result<Tensors<F>> {
    let mut out = Tensors::new();
    for (name, v) in x {
        let prefix = (name == "x").then_some(state).flatten();
        let mut e = crate::state::prefixed(v, None, rows, a);
        if name == "alpha" {
            // α_p = 1 on x_p (slot 0 of the K + 1 axis with the pattern on A).
            if m.on().has_a() { e.slice_mut(s![.., ..a, 0, ..]) } else { e.slice_mut(s![.., ..a, ..]) }
                .fill(F::one());
        }
        if let (Some(st), true) = (prefix, a > 0) {
            for (j, at) in kept(m, k, a).into_iter().enumerate() {
                if let Some(p) = at {
                    for (i, &b) in rows.iter().enumerate() {
                        e.slice_mut(s![i, p, ..]).assign(&st.slice(s![b, j, ..]));
                    }
                }
            }
        }
        out.insert(name.clone(), e);
    }
    Ok(out)
}

/// `y` and the final state of a run from `initial` (`None`: zeros at position 0) by `form` on
/// the extension (module documentation).
pub fn run<F: Real>(
    m: &Glr,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    form: impl Fn(&Tensors<F>) -> Result<ArrayD<F>>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    let name = stream(m).map_err(|why| crate::state::no_state(crate::Mixer::name(m), &why))?;
    let (nb, t_len, c, k) = sizes(x)?;
    let (st, pos) = match initial {
        Some(s) => (Some(get(s, name)?), positions(m, s, t_len, k)?),
        None => (None, vec![0; nb]),
    };
    let mut y = ArrayD::<F>::zeros(IxDyn(&[nb, t_len, c]));
    let mut fin = ArrayD::<F>::zeros(IxDyn(&[nb, rows(m, k), c]));
    for (a, group) in by_length(&pos) {
        let ext = extension(m, x, st, &group, a, k)?;
        let ye = form(&ext)?;
        let src = if m.on().has_b() { &ye } else { &ext["x"] };
        for (i, &b) in group.iter().enumerate() {
            y.index_axis_mut(Axis(0), b).assign(&ye.slice(s![i, a.., ..]));
            for (j, at) in kept(m, k, a + t_len).into_iter().enumerate() {
                if let Some(p) = at {
                    fin.slice_mut(s![b, j, ..]).assign(&src.slice(s![i, p, ..]));
                }
            }
        }
    }
    let fin_pos: Vec<usize> = pos.iter().map(|&a| a + t_len).collect();
    Ok((
        y,
        [(name.to_string(), fin), (POSITION.to_string(), position_tensor(&fin_pos))].into_iter().collect(),
    ))
}

/// The backward of [`run`] by `backward` (the form's backward on the extension) (module
/// documentation): the gradients of the inputs in `requires` and, with an initial state, the
/// state's gradient.
pub fn vjp<F: Real>(
    m: &Glr,
    args: crate::state::StateVjp<'_, F>,
    backward: impl Fn(&Tensors<F>, &ArrayD<F>) -> Result<Tensors<F>>,
) -> Result<(Tensors<F>, Tensors<F>)> {
    let crate::state::StateVjp { x, initial, dy, d_final, requires } = args;
    let name = stream(m).map_err(|why| crate::state::no_state(crate::Mixer::name(m), &why))?;
    let (nb, t_len, c, k) = sizes(x)?;
    if dy.shape() != [nb, t_len, c] {
        return Err(Error::shape("dy", format!("[{nb}, {t_len}, {c}]"), fmt_shape(dy.shape())));
    }
    let (st, pos) = match initial {
        Some(s) => (Some(get(s, name)?), positions(m, s, t_len, k)?),
        None => (None, vec![0; nb]),
    };
    let df = d_final.map(|d| get(d, name)).transpose()?;
    let mut grads: Tensors<F> = x.iter().map(|(n, v)| (grad_name(n), ArrayD::zeros(v.raw_dim()))).collect();
    let mut ds = ArrayD::<F>::zeros(IxDyn(&[nb, rows(m, k), c]));
    for (a, group) in by_length(&pos) {
        let ext = extension(m, x, st, &group, a, k)?;
        let mut dye = crate::state::prefixed(dy, None, &group, a);
        dye.slice_mut(s![.., ..a, ..]).fill(F::zero());
        let ends = kept(m, k, a + t_len);
        if let (Some(df), true) = (df, m.on().has_b()) {
            add_kept(&mut dye, df, &group, &ends);
        }
        let mut g = backward(&ext, &dye)?;
        let dxe = g.get_mut(&grad_name("x")).ok_or_else(|| {
            Error::Numerical("glr backward from a state: the backward returned no `d_x`".into())
        })?;
        if let (Some(df), true) = (df, m.on().has_a()) {
            add_kept(dxe, df, &group, &ends);
        }
        for (j, at) in kept(m, k, a).into_iter().enumerate() {
            if let Some(p) = at {
                for (i, &b) in group.iter().enumerate() {
                    ds.slice_mut(s![b, j, ..]).assign(&dxe.slice(s![i, p, ..]));
                }
            }
        }
        for (n, full) in grads.iter_mut() {
            let ge =
                g.get(n).ok_or_else(|| Error::Numerical(format!("glr backward from a state: no `{n}`")))?;
            for (i, &b) in group.iter().enumerate() {
                full.index_axis_mut(Axis(0), b)
                    .assign(&ge.index_axis(Axis(0), i).slice_axis(Axis(0), (a..).into()));
            }
        }
    }
    grads.retain(|n, _| n.strip_prefix("d_").is_some_and(|n| requires.wants(n)));
    let mut out = Tensors::new();
    if initial.is_some() {
        out.insert(name.to_string(), ds);
        out.insert(POSITION.to_string(), ArrayD::zeros(IxDyn(&[nb])));
    }
    Ok((grads, out))
}

/// Adds the final state's cotangent `df [B, R, C]` at the kept positions `ends` to `ext`.
fn add_kept<F: Real>(ext: &mut ArrayD<F>, df: &ArrayD<F>, group: &[usize], ends: &[Option<usize>]) {
    for (j, at) in ends.iter().enumerate() {
        if let Some(p) = *at {
            for (i, &b) in group.iter().enumerate() {
                let mut row = ext.slice_mut(s![i, p, ..]);
                row += &df.slice(s![b, j, ..]);
            }
        }
    }
}

/// The room for a state's prefix that `K` slots leave a run of `T` tokens: the largest position
/// `a ≤ 4T + 8` with `K(a + T) ≤ K`, where the slot axis has more than `K(T)` slots or the
/// pattern is truncated at `K` slots; else 0. The random inputs are drawn valid for every start
/// in `0 … room`, and the random states start there.
pub fn room(m: &Glr, t_len: usize, k: usize) -> usize {
    let p = m.pattern();
    if k <= p.slots(t_len) && p.order() != Some(k) {
        return 0;
    }
    let mut a = 0;
    while a < 4 * t_len + 8 && p.slots(a + 1 + t_len) <= k {
        a += 1;
    }
    a
}

/// A random valid state for `dims` (entries from `fill`): row `b` at a position in `1 … room`
/// ([`room`]), its rows without a value zeroed.
pub(crate) fn random_state(m: &Glr, dims: &crate::Dims, mut s: Tensors<f64>) -> Result<Tensors<f64>> {
    let name = stream(m).map_err(|why| crate::state::no_state(crate::Mixer::name(m), &why))?;
    let t_len = dims.get("T").copied().unwrap_or(1);
    let k = slot_count(dims).unwrap_or(0);
    let a_max = room(m, t_len, k);
    let v = s.get_mut(name).ok_or_else(|| Error::Numerical("no state tensor".into()))?;
    let nb = v.shape()[0];
    let pos: Vec<usize> = (0..nb).map(|b| if a_max == 0 { 0 } else { a_max - (b * 3) % a_max }).collect();
    for (b, &a) in pos.iter().enumerate() {
        for (j, at) in kept(m, k, a).into_iter().enumerate() {
            if at.is_none() {
                v.slice_mut(s![b, j, ..]).fill(0.0);
            }
        }
    }
    s.insert(POSITION.into(), position_tensor(&pos));
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad::Requires;
    use crate::mixer::{Mixer, complete_dims};
    use crate::mixers::state_check::{Cotangents, check_partial, close_within, split_run};
    use crate::state::cut;

    fn resolve(n: &str) -> Result<crate::pattern::OffsetFn> {
        Ok(match n {
            "pow2" => crate::pattern::pow2,
            "sq1" => crate::pattern::sq1,
            _ => crate::pattern::linear,
        })
    }

    fn mixers() -> Vec<Glr> {
        [
            ("glr", serde_json::json!({"pattern": "pow2"})),
            ("glr", serde_json::json!({"pattern": "sq1", "cache_efficient": true})),
            ("glr", serde_json::json!({"pattern": "pow2", "cache_efficient": true, "on": "a"})),
            ("kth-order", serde_json::json!({"order": 3})),
            ("dense-recurrence", serde_json::json!({})),
        ]
        .iter()
        .map(|(n, c)| Glr::from_json(n, c, resolve).unwrap())
        .collect()
    }

    fn inputs(m: &Glr, t: usize, room: usize, seed: u64) -> Tensors<f64> {
        let k = m.pattern().slots(t + room);
        let key = if m.on().has_a() { "K1" } else { "K" };
        let d: crate::Dims =
            [("B", 2), ("T", t), ("C", 3), (key, k + usize::from(m.on().has_a()))].into_iter().collect();
        m.random_inputs(&complete_dims(m, &d), seed).unwrap()
    }

    fn close(a: &ArrayD<f64>, b: &ArrayD<f64>, what: &str) {
        close_within(a, b, 1e-10, what);
    }

    /// A split anywhere gives the rows of the plain oracle of the whole sequence, and the same
    /// final state; the lattice's state keeps `|P_a|` values.
    #[test]
    fn a_split_anywhere_is_the_whole_run() {
        for m in mixers() {
            let t_len = 23;
            let x = inputs(&m, t_len, 0, 3);
            let whole = crate::oracle::dense(&m, &x).unwrap();
            let (y0, f0) = m.state_oracle(&x, None).unwrap();
            close(&y0, &whole, &format!("{} from zeros", m.name()));
            let per_token = m.spec().per_token();
            for a in [1, 2, 5, 8, 16, 17, 22, 23] {
                let head = cut(&x, &per_token, &[], 0..a).unwrap();
                let tail = cut(&x, &per_token, &[], a..t_len).unwrap();
                let (joined, sb) = split_run(|x, s| m.state_oracle(x, s), &head, &tail, None);
                close(&joined, &whole, &format!("{} split at {a}", m.name()));
                let name = stream(&m).unwrap();
                close(&sb[name], &f0[name], &format!("{} final state at {a}", m.name()));
                if m.pattern().cache_efficient() {
                    let live = kept(&m, sizes(&x).unwrap().3, a).iter().flatten().count();
                    assert_eq!(live, Slots::new(m.pattern(), a + 1).distinct_positions(a), "{}", m.name());
                }
            }
        }
    }

    #[test]
    fn the_state_backward_matches_finite_differences() {
        for m in mixers() {
            let x = inputs(&m, 5, 6, 4);
            let k = sizes(&x).unwrap().3;
            let key = if m.on().has_a() { "K1" } else { "K" };
            let d: crate::Dims =
                [("B", 2), ("T", 5), ("C", 3), (key, k + usize::from(m.on().has_a()))].into_iter().collect();
            let shapes = shapes(&m, &d).unwrap();
            let s0 = random_state(&m, &d, crate::state::random(&shapes, 8)).unwrap();
            let name = stream(&m).unwrap();
            assert!(s0[POSITION][0] > 0.0, "{}", m.name());
            let (y, fin) = m.state_oracle(&x, Some(&s0)).unwrap();
            let c = Cotangents::new(&y, &fin, &[name]);
            let (g, gs) = m.state_oracle_vjp(&x, Some(&s0), &c.dy, Some(&c.d_final), &Requires::All).unwrap();
            let loss = |x: &Tensors<f64>, s: &Tensors<f64>| c.loss(m.state_oracle(x, Some(s)).unwrap());
            let a0 = s0[POSITION][0] as usize;
            for (j, at) in kept(&m, k, a0).into_iter().enumerate() {
                if at.is_none() {
                    continue;
                }
                let (what, ix) = (format!("{} d_state row {j}", m.name()), [0, j, 1]);
                check_partial(&what, gs[name][ix], &s0, name, &ix, |s| loss(&x, s));
            }
            for input in ["x", "alpha", "beta"] {
                let Some(a) = x.get(input) else { continue };
                let ix: Vec<usize> = a
                    .shape()
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| if i == 2 && a.ndim() == 4 { 0 } else { n / 2 })
                    .collect();
                let (what, got) = (format!("{} {input}", m.name()), g[&grad_name(input)][ix.as_slice()]);
                check_partial(&what, got, &x, input, &ix, |x| loss(x, &s0));
            }
        }
    }
}
