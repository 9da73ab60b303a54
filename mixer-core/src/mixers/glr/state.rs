//! The recurrent state of the GLR (docs/math.md §7.1) and runs from it through the *extension*:
//! the reference (`Mixer::state_oracle`) and the CUDA backend's `fast` form from a state (the
//! CPU backend's runs over the run's tokens alone, reading the state: `mixer_cpu::glr::fast`).
//!
//! **Layout.** After a prefix of `a` tokens a decoder keeps the past values later tokens read:
//! the outputs `y` when the pattern is on `B` (`on = "b"`), the inputs `x` when it is on `A`
//! (`on = "a"`). Every token `t ≥ a` reads positions `d_k(t) ≥ t − f(k)`, so with the `K` slots
//! of `beta` (or `K + 1` of `alpha`) the reads before `a` lie in `[a − f(K − 1), a)`. The state is
//! - `y [B, R, C]` (`on = "b"`), `x [B, R, C]` (`on = "a"`), or both (`on = "both"`): the values at
//!   the kept positions;
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
//! `beta` sized for the whole sequence therefore serves every part of it. `on = "both"` keeps both
//! streams (`x` and `y`, the same rows).
//!
//! **Runs from a state** ([`run`]): per group of batch rows at one position `a`, the form runs on
//! the extended sequence of `a + T` tokens at absolute positions `0 … a + T − 1` (for a
//! translation-invariant pattern at `a' = min(a, f(K − 1))` instead, `a' + T` tokens: the same
//! run, since its taps read only `t − f(k)` and the state holds the last `f(K − 1)` positions):
//! prefix token
//! `p < a` has `x_p` = the state's value at `p` (zero where it holds none), `α_p = 1` and no
//! slots, so `y_p = x_p` — the kept output (`on = "b"`) or the kept input (`on = "a"`) — then
//! the run's tokens. Positions the state does not keep are never read (above), so `y` is the
//! extension's rows `a …` and the final state is read off the extension at [`kept`]`(a + T)`.
//! With `on = "both"` the run is the sum of two extensions (docs/math.md §7.1): one whose prefix
//! holds the kept outputs (its taps on `A` that read the prefix zeroed), one whose prefix holds
//! the kept inputs and whose own inputs are zero (its taps on `B` that read the prefix zeroed).
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

/// The names of the kept streams: `y` (pattern on `B`), `x` (on `A`), both (`on = "both"`).
pub fn streams(m: &Glr) -> &'static [&'static str] {
    match m.on() {
        On::B => &["y"],
        On::A => &["x"],
        On::Both => &["x", "y"],
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

/// [`kept`] as `(position, row)` pairs sorted by position: the positions a state at `a` keeps and
/// the row that holds each.
pub fn kept_rows(m: &Glr, k: usize, a: usize) -> Vec<(usize, usize)> {
    let mut rows: Vec<(usize, usize)> =
        kept(m, k, a).into_iter().enumerate().filter_map(|(j, p)| p.map(|p| (p, j))).collect();
    rows.sort_unstable();
    rows
}

/// The state's shapes: each kept stream (`y`, `x`) `[B, R, C]` and `position [B]`.
pub(crate) fn shapes(m: &Glr, dims: &crate::Dims) -> std::result::Result<StateShapes, String> {
    let size = |s: &str| dims.get(s).copied().ok_or_else(|| format!("size `{s}` is unbound"));
    let k = slot_count(dims).ok_or("size `K` is unbound")?;
    let (b, c) = (size("B")?, size("C")?);
    let mut out: StateShapes = streams(m).iter().map(|&n| (n.into(), vec![b, rows(m, k), c])).collect();
    out.push((POSITION.into(), vec![b]));
    Ok(out)
}

/// The positions of a state for a run of `t_len` tokens with `k` slots, per batch row, after
/// checking them ([`crate::state::positions`]), `K ≥ K(a + T)`, and that the rows that hold no
/// value are zero.
pub fn positions<F: Real>(m: &Glr, state: &Tensors<F>, t_len: usize, k: usize) -> Result<Vec<usize>> {
    let p = get(state, POSITION)?;
    let mut pos = None;
    for &name in streams(m) {
        let v = get(state, name)?;
        if v.ndim() != 3 || p.shape() != [v.shape()[0]] || v.shape()[1] != rows(m, k) {
            return Err(Error::shape(
                "state",
                format!("{name} [B, {}, C] and position [B]", rows(m, k)),
                format!("{name} {}, position {}", fmt_shape(v.shape()), fmt_shape(p.shape())),
            ));
        }
        let at = crate::state::positions(p, t_len)?;
        for (b, &a) in at.iter().enumerate() {
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
        pos = Some(at);
    }
    pos.ok_or_else(|| Error::Numerical("internal: a GLR state without a stream".into()))
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

/// Which part of a run from a state an extension computes: the whole run (one kept stream), or
/// with `on = "both"` the part through the kept outputs (`ReadsY`: the prefix holds `y`, the taps
/// on `A` that read it are zeroed) or through the kept inputs (`ReadsX`: the prefix holds `x`, the
/// run's own inputs are zero and the taps on `B` that read the prefix are zeroed); each with the
/// taps that read the prefix ([`prefix_reads`]).
#[derive(Clone, Copy)]
enum Part<'r> {
    Whole,
    ReadsY(&'r [(usize, usize)]),
    ReadsX(&'r [(usize, usize)]),
}

/// The `(t, k)` (absolute positions `t` of the run, slot `k`) whose tap reads a position before
/// `a`, for a run of `t_len` tokens from `a`.
fn prefix_reads(m: &Glr, a: usize, t_len: usize) -> Vec<(usize, usize)> {
    let slots = Slots::new(m.pattern(), a + t_len);
    (a..a + t_len).flat_map(|t| slots.deps(t).filter(|&(_, d)| d < a).map(move |(k, _)| (t, k))).collect()
}

/// Zeroes the entries `[.., t, k + shift, ..]` of `v` for the taps `reads`.
fn zero_taps<F: Real>(v: &mut ArrayD<F>, reads: &[(usize, usize)], shift: usize) {
    for &(t, k) in reads {
        v.slice_mut(s![.., t, k + shift, ..]).fill(F::zero());
    }
}

/// `v [B, T, C]` of the batch `rows` after a prefix of `a` rows holding the state stream `st`
/// (`[B, R, C]`) at its kept positions (zero elsewhere).
fn with_prefix<F: Real>(
    m: &Glr,
    v: &ArrayD<F>,
    st: Option<&ArrayD<F>>,
    rows: &[usize],
    a: usize,
    k: usize,
) -> ArrayD<F> {
    let mut e = crate::state::prefixed(v, None, rows, a);
    if let (Some(st), true) = (st, a > 0) {
        for (j, at) in kept(m, k, a).into_iter().enumerate() {
            if let Some(p) = at {
                for (i, &b) in rows.iter().enumerate() {
                    e.slice_mut(s![i, p, ..]).assign(&st.slice(s![b, j, ..]));
                }
            }
        }
    }
    e
}

/// The extension of the batch `rows` at position `a` for `part` (module documentation); `st`: the
/// stream the prefix holds.
fn extension<F: Real>(
    m: &Glr,
    x: &Tensors<F>,
    st: Option<&ArrayD<F>>,
    rows: &[usize],
    (a, k): (usize, usize),
    part: Part<'_>,
) -> Result<Tensors<F>> {
    let mut out = Tensors::new();
    for (name, v) in x {
        let mut e = if name == "x" {
            with_prefix(m, v, st, rows, a, k)
        } else {
            crate::state::prefixed(v, None, rows, a)
        };
        match name.as_str() {
            // α_p = 1 on x_p (slot 0 of the K + 1 axis with the pattern on A).
            "alpha" => {
                if m.on().has_a() { e.slice_mut(s![.., ..a, 0, ..]) } else { e.slice_mut(s![.., ..a, ..]) }
                    .fill(F::one());
                if let Part::ReadsY(reads) = part {
                    zero_taps(&mut e, reads, 1);
                }
            }
            "beta" => {
                if let Part::ReadsX(reads) = part {
                    zero_taps(&mut e, reads, 0);
                }
            }
            "x" if matches!(part, Part::ReadsX(_)) => e.slice_mut(s![.., a.., ..]).fill(F::zero()),
            _ => {}
        }
        out.insert(name.clone(), e);
    }
    Ok(out)
}

/// The state's streams by name, and the positions (`None`: zeros at position 0).
fn state_of<'a, F: Real>(
    m: &Glr,
    x: &Tensors<F>,
    initial: Option<&'a Tensors<F>>,
) -> Result<(Vec<Option<&'a ArrayD<F>>>, Vec<usize>)> {
    let (nb, t_len, _, k) = sizes(x)?;
    match initial {
        Some(s) => {
            let pos = positions(m, s, t_len, k)?;
            Ok((
                streams(m)
                    .iter()
                    .map(|&n| get(s, n))
                    .collect::<Result<Vec<_>>>()?
                    .into_iter()
                    .map(Some)
                    .collect(),
                pos,
            ))
        }
        None => Ok((vec![None; streams(m).len()], vec![0; nb])),
    }
}

/// The position at which a run of a translation-invariant pattern from a state at `a` with `K`
/// slots is computed: `min(a, f(K − 1))`. Its taps read `t − f(k)` for every slot, all `K` slots
/// are active from `f(K − 1)` on, and the state's rows are the last `f(K − 1)` positions, so the
/// run at that position is the same run; the extension's prefix then has at most `f(K − 1)` rows
/// instead of `a`. A lattice's positions depend on the absolute position: it keeps `a`.
fn effective(m: &Glr, k: usize, a: usize) -> usize {
    if m.pattern().cache_efficient() { a } else { a.min(rows(m, k)) }
}

/// `y` and the final state of a run from `initial` (`None`: zeros at position 0) by `form` on
/// the extension (module documentation).
pub fn run<F: Real>(
    m: &Glr,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    form: impl Fn(&Tensors<F>) -> Result<ArrayD<F>>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    let names = streams(m);
    let (nb, t_len, c, k) = sizes(x)?;
    let (st, pos) = state_of(m, x, initial)?;
    let mut y = ArrayD::<F>::zeros(IxDyn(&[nb, t_len, c]));
    let mut fin: Vec<ArrayD<F>> =
        names.iter().map(|_| ArrayD::<F>::zeros(IxDyn(&[nb, rows(m, k), c]))).collect();
    for (a, group) in by_length(&pos) {
        let a = effective(m, k, a);
        // The streams over the extension: y (the form's output; with `on = "both"` the sum of the
        // parts through the kept outputs and the kept inputs), x (the inputs after the prefix).
        let (ye, xe) = if m.on() == On::Both {
            let (sx, sy) = (st[0], st[1]);
            let reads = prefix_reads(m, a, t_len);
            let mut ye = form(&extension(m, x, sy, &group, (a, k), Part::ReadsY(&reads))?)?;
            let y2 = form(&extension(m, x, sx, &group, (a, k), Part::ReadsX(&reads))?)?;
            let mut tail = ye.slice_mut(s![.., a.., ..]);
            tail += &y2.slice(s![.., a.., ..]);
            (ye, with_prefix(m, get(x, "x")?, sx, &group, a, k))
        } else {
            let ext = extension(m, x, st[0], &group, (a, k), Part::Whole)?;
            let ye = form(&ext)?;
            let xe = ext["x"].clone();
            (ye, xe)
        };
        let ends = kept(m, k, a + t_len);
        for (i, &b) in group.iter().enumerate() {
            y.index_axis_mut(Axis(0), b).assign(&ye.slice(s![i, a.., ..]));
            for (f, &name) in fin.iter_mut().zip(names) {
                let src = if name == "y" { &ye } else { &xe };
                for (j, at) in ends.iter().enumerate() {
                    if let Some(p) = *at {
                        f.slice_mut(s![b, j, ..]).assign(&src.slice(s![i, p, ..]));
                    }
                }
            }
        }
    }
    let fin_pos: Vec<usize> = pos.iter().map(|&a| a + t_len).collect();
    let mut out: Tensors<F> = names.iter().map(|n| n.to_string()).zip(fin).collect();
    out.insert(POSITION.to_string(), position_tensor(&fin_pos));
    Ok((y, out))
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
    let names = streams(m);
    let (nb, t_len, c, k) = sizes(x)?;
    if dy.shape() != [nb, t_len, c] {
        return Err(Error::shape("dy", format!("[{nb}, {t_len}, {c}]"), fmt_shape(dy.shape())));
    }
    let (st, pos) = state_of(m, x, initial)?;
    // The final state's cotangents per stream (`None`: none given).
    let df: Vec<Option<&ArrayD<F>>> =
        names.iter().map(|&n| d_final.map(|d| get(d, n)).transpose()).collect::<Result<_>>()?;
    let df_of = |n: &str| names.iter().position(|&m| m == n).and_then(|i| df[i]);
    let mut grads: Tensors<F> = x.iter().map(|(n, v)| (grad_name(n), ArrayD::zeros(v.raw_dim()))).collect();
    let mut ds: Vec<ArrayD<F>> =
        names.iter().map(|_| ArrayD::<F>::zeros(IxDyn(&[nb, rows(m, k), c]))).collect();
    let dx_name = grad_name("x");
    for (a, group) in by_length(&pos) {
        let a = effective(m, k, a);
        let mut dye = crate::state::prefixed(dy, None, &group, a);
        dye.slice_mut(s![.., ..a, ..]).fill(F::zero());
        let ends = kept(m, k, a + t_len);
        let starts = kept(m, k, a);
        // Stream `i`'s gradient: the prefix rows of `dp` (an extended `x̄`) at the kept positions.
        let mut put_state = |i: usize, dp: &ArrayD<F>| {
            for (j, at) in starts.iter().enumerate() {
                if let Some(p) = *at {
                    for (r, &b) in group.iter().enumerate() {
                        ds[i].slice_mut(s![b, j, ..]).assign(&dp.slice(s![r, p, ..]));
                    }
                }
            }
        };
        // The gradient of the extended inputs.
        let g: Tensors<F> = if m.on() == On::Both {
            let (sx, sy) = (st[0], st[1]);
            let mut dye1 = dye.clone();
            if let Some(df) = df_of("y") {
                // The final y at a kept position: the sum of both parts after the prefix, the
                // state's own y (part 1's prefix) before it.
                add_kept(&mut dye1, df, &group, &ends);
                let main: Vec<Option<usize>> = ends.iter().map(|p| p.filter(|&p| p >= a)).collect();
                add_kept(&mut dye, df, &group, &main);
            }
            let reads = prefix_reads(m, a, t_len);
            let mut g1 = backward(&extension(m, x, sy, &group, (a, k), Part::ReadsY(&reads))?, &dye1)?;
            let mut g2 = backward(&extension(m, x, sx, &group, (a, k), Part::ReadsX(&reads))?, &dye)?;
            // Taps zeroed in a part: their gradient there is not a gradient of the true input.
            if let Some(da) = g1.get_mut(&grad_name("alpha")) {
                zero_taps(da, &reads, 1);
            }
            if let Some(db) = g2.get_mut(&grad_name("beta")) {
                zero_taps(db, &reads, 0);
            }
            let mut dx1 = g1.remove(&dx_name).ok_or_else(no_dx)?;
            let mut dx2 = g2.remove(&dx_name).ok_or_else(no_dx)?;
            if let Some(df) = df_of("x") {
                // The final x at a kept position: the run's input after the prefix (part 1's
                // gradient), the state's x before it (part 2's prefix).
                let (pre, main): (Vec<_>, Vec<_>) =
                    ends.iter().map(|p| (p.filter(|&p| p < a), p.filter(|&p| p >= a))).unzip();
                add_kept(&mut dx1, df, &group, &main);
                add_kept(&mut dx2, df, &group, &pre);
            }
            let mut sum = Tensors::new();
            for (n, v1) in g1 {
                let v = match g2.get(&n) {
                    Some(v2) => v1 + v2,
                    None => v1,
                };
                sum.insert(n, v);
            }
            // Streams `x` and `y`: the prefix rows of part 2's and part 1's x̄.
            put_state(0, &dx2);
            put_state(1, &dx1);
            sum.insert(dx_name.clone(), dx1);
            sum
        } else {
            let ext = extension(m, x, st[0], &group, (a, k), Part::Whole)?;
            let name = names[0];
            if let (Some(df), "y") = (df[0], name) {
                add_kept(&mut dye, df, &group, &ends);
            }
            let mut g = backward(&ext, &dye)?;
            let dxe = g.get_mut(&dx_name).ok_or_else(no_dx)?;
            if let (Some(df), "x") = (df[0], name) {
                add_kept(dxe, df, &group, &ends);
            }
            put_state(0, dxe);
            g
        };
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
        for (n, d) in names.iter().zip(ds) {
            out.insert(n.to_string(), d);
        }
        out.insert(POSITION.to_string(), ArrayD::zeros(IxDyn(&[nb])));
    }
    Ok((grads, out))
}

fn no_dx() -> Error {
    Error::Numerical("glr backward from a state: the backward returned no `d_x`".into())
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
    let t_len = dims.get("T").copied().unwrap_or(1);
    let k = slot_count(dims).unwrap_or(0);
    let a_max = room(m, t_len, k);
    let nb = dims.get("B").copied().unwrap_or(1);
    let pos: Vec<usize> = (0..nb).map(|b| if a_max == 0 { 0 } else { a_max - (b * 3) % a_max }).collect();
    for &name in streams(m) {
        let v = s.get_mut(name).ok_or_else(|| Error::Numerical(format!("no state tensor `{name}`")))?;
        for (b, &a) in pos.iter().enumerate() {
            for (j, at) in kept(m, k, a).into_iter().enumerate() {
                if at.is_none() {
                    v.slice_mut(s![b, j, ..]).fill(0.0);
                }
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
            ("glr", serde_json::json!({"pattern": "pow2", "on": "both"})),
            ("glr", serde_json::json!({"pattern": "sq1", "cache_efficient": true, "on": "both"})),
            ("kth-order", serde_json::json!({"order": 3})),
            ("dense-recurrence", serde_json::json!({})),
        ]
        .iter()
        .map(|(n, c)| Glr::from_json(n, c, resolve).unwrap())
        .collect()
    }

    fn inputs(m: &Glr, t: usize, room: usize, seed: u64) -> Tensors<f64> {
        let k = m.pattern().slots(t + room);
        m.random_inputs(&complete_dims(m, &dims(m, t, k)), seed).unwrap()
    }

    /// `B = 2, T, C = 3` and `k` slots on the axes the mixer has (`K` on `beta`, `K1 = k + 1` on
    /// `alpha` with the pattern on A).
    fn dims(m: &Glr, t: usize, k: usize) -> crate::Dims {
        let mut d: crate::Dims = [("B", 2), ("T", t), ("C", 3)].into_iter().collect();
        if m.on().has_b() {
            d.insert("K", k);
        }
        if m.on().has_a() {
            d.insert("K1", k + 1);
        }
        d
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
                for &name in streams(&m) {
                    close(&sb[name], &f0[name], &format!("{} final state `{name}` at {a}", m.name()));
                }
                if m.pattern().cache_efficient() {
                    let live = kept(&m, sizes(&x).unwrap().3, a).iter().flatten().count();
                    assert_eq!(live, Slots::new(m.pattern(), a + 1).distinct_positions(a), "{}", m.name());
                }
            }
        }
    }

    /// After a long prefix a translation-invariant pattern's run from a state extends the run by
    /// `f(K − 1)` rows, not by the prefix, and still gives the whole run's rows and final state;
    /// a lattice keeps the whole prefix.
    #[test]
    fn a_long_prefix_extends_a_translation_invariant_run_by_its_window_only() {
        for m in mixers() {
            let t_len = 90;
            let x = inputs(&m, t_len, 0, 5);
            let k = sizes(&x).unwrap().3;
            let whole = crate::oracle::dense(&m, &x).unwrap();
            let (_, f0) = m.state_oracle(&x, None).unwrap();
            let per_token = m.spec().per_token();
            let a = 83;
            let (head, tail) =
                (cut(&x, &per_token, &[], 0..a).unwrap(), cut(&x, &per_token, &[], a..t_len).unwrap());
            let (_, sa) = m.state_oracle(&head, None).unwrap();
            let lens = std::cell::RefCell::new(Vec::new());
            let (yb, sb) = run(&m, &tail, Some(&sa), |e| {
                lens.borrow_mut().push(get(e, "x")?.shape()[1]);
                crate::oracle::dense(&m, e)
            })
            .unwrap();
            let want = if m.pattern().cache_efficient() { a } else { a.min(rows(&m, k)) } + t_len - a;
            assert!(
                lens.borrow().iter().all(|&n| n == want),
                "{}: extensions {:?}, want {want}",
                m.name(),
                lens
            );
            close(
                &yb,
                &whole.slice(s![.., a.., ..]).to_owned().into_dyn(),
                &format!("{} after a prefix of {a}", m.name()),
            );
            for &name in streams(&m) {
                close(&sb[name], &f0[name], &format!("{} final state `{name}`", m.name()));
            }
        }
    }

    #[test]
    fn the_state_backward_matches_finite_differences() {
        for m in mixers() {
            let x = inputs(&m, 5, 6, 4);
            let k = sizes(&x).unwrap().3;
            let d = dims(&m, 5, k);
            let shapes = shapes(&m, &d).unwrap();
            let s0 = random_state(&m, &d, crate::state::random(&shapes, 8)).unwrap();
            let names = streams(&m);
            assert!(s0[POSITION][0] > 0.0, "{}", m.name());
            let (y, fin) = m.state_oracle(&x, Some(&s0)).unwrap();
            let c = Cotangents::new(&y, &fin, names);
            let (g, gs) = m.state_oracle_vjp(&x, Some(&s0), &c.dy, Some(&c.d_final), &Requires::All).unwrap();
            let loss = |x: &Tensors<f64>, s: &Tensors<f64>| c.loss(m.state_oracle(x, Some(s)).unwrap());
            let a0 = s0[POSITION][0] as usize;
            for &name in names {
                for (j, at) in kept(&m, k, a0).into_iter().enumerate() {
                    if at.is_none() {
                        continue;
                    }
                    let (what, ix) = (format!("{} d_state `{name}` row {j}", m.name()), [0, j, 1]);
                    check_partial(&what, gs[name][ix], &s0, name, &ix, |s| loss(&x, s));
                }
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
                // The run's first token: its taps read the state (the prefix) — on A and on B.
                if a.ndim() == 4 {
                    let first = if input == "alpha" { 1 } else { 0 };
                    for slot in first..a.shape()[2].min(first + 3) {
                        let ix = [0, 0, slot, 1];
                        let what = format!("{} {input} first token slot {slot}", m.name());
                        check_partial(&what, g[&grad_name(input)][ix], &x, input, &ix, |x| loss(x, &s0));
                    }
                }
            }
        }
    }
}
