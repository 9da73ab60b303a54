//! The recurrent state of softmax attention, a KV cache (docs/math.md §7.1), and runs from it
//! for every form and backend through the *extension*.
//!
//! **Layout.** After a prefix of `a` tokens the decoder holds the keys and values it attends
//! over next: all `a` of them without a window, the last `min(a, w − 1)` with a window `w`
//! (token `a` sees `a − w + 1 … a`, itself included). A cache's length varies with the split,
//! so the state is a cache of fixed *capacity* `N` with a length per batch row:
//! - `k [B, N, H, Dk]`, `v [B, N, H, Dv]`: rows `0 … ℓ − 1` are the cached keys and values,
//!   oldest first; rows `ℓ … N − 1` are empty and must be zero;
//! - `length [B]`: `ℓ` per batch row (rows may differ: packed sequences carry their own).
//!
//! With a window the capacity is `N = w − 1`. Without one it is the given cache's (the size
//! `N` of [`crate::Mixer::state_sizes`]), and `N = T` for a run without an initial state, whose
//! cache then holds exactly its `T` tokens: pass a cache of zeros with `length` 0 and the
//! capacity you need to keep prefilling into it. A run of `T` tokens from `ℓ` cached ones ends
//! with `ℓ + T` of them, so it needs `ℓ + T ≤ N` ([`lengths`] refuses it otherwise); with a
//! window the cache keeps the last `min(ℓ + T, w − 1)`. Attention has no absolute position, so
//! the state needs none.
//!
//! **Runs from a state** ([`run`]): per group of batch rows with one `ℓ`, the form runs on the
//! extended sequence `q_ext = [0 … 0, q]`, `k_ext = [k_cache, k]`, `v_ext = [v_cache, v]` of
//! `ℓ + T` tokens, and `y` is its rows `ℓ …`: query `ℓ + t` of the extension sees the cached keys
//! and the run's keys `≤ t` inside the window, exactly what token `a + t` sees. The prefix rows'
//! outputs are not used (their queries are zero). The final cache is rows
//! `ℓ + T − ℓ' … ℓ + T − 1` of `k_ext`, `v_ext` (`ℓ'` the final length).
//!
//! **Backward** ([`vjp`]): the form's backward on the extension with the cotangent zero on the
//! prefix rows; the final cache is a copy of rows of `k_ext`, `v_ext`, so its cotangent adds to
//! their gradients there. The cache's gradient is rows `0 … ℓ − 1` of `k̄_ext`, `v̄_ext` (zero
//! on the empty rows and for `length`).

use std::ops::AddAssign;

use ndarray::{ArrayD, Axis, IxDyn, Slice, s};

use super::Attention;
use crate::error::{Error, Result, fmt_shape};
use crate::grad::grad_name;
use crate::real::Real;
use crate::state::{StateShapes, by_length, prefixed, unprefix};
use crate::tensor::{Tensors, get};

/// The name of the cached lengths' tensor.
pub const LENGTH: &str = "length";

/// The size symbol of the cache's capacity.
pub const CAPACITY: &str = "N";

/// The cache's capacity: `w − 1` with a window, else the size `N` (the given cache's, or `T`).
fn capacity(m: &Attention, dims: &crate::Dims) -> std::result::Result<usize, String> {
    match m.window() {
        Some(w) => Ok(w - 1),
        None => dims.get(CAPACITY).or(dims.get("T")).copied().ok_or_else(|| "size `T` is unbound".into()),
    }
}

/// The capacity `N` of a full-attention cache: the given cache's (axis 1 of its `k`), else `T`.
pub(crate) fn sizes(m: &Attention, dims: &crate::Dims, given: Option<&StateShapes>) -> crate::Dims {
    let mut d = crate::Dims::new();
    if m.window().is_none() {
        let n = given.and_then(|g| g.iter().find(|(k, _)| k == "k")).and_then(|(_, s)| s.get(1).copied());
        if let Some(n) = n.or(dims.get("T").copied()) {
            d.insert(CAPACITY, n);
        }
    }
    d
}

/// The state's shapes: `k [B, N, H, Dk]`, `v [B, N, H, Dv]`, `length [B]`.
pub(crate) fn shapes(m: &Attention, dims: &crate::Dims) -> std::result::Result<StateShapes, String> {
    let size = |s: &str| dims.get(s).copied().ok_or_else(|| format!("size `{s}` is unbound"));
    let (b, h, n) = (size("B")?, size("H")?, capacity(m, dims)?);
    Ok(vec![
        ("k".into(), vec![b, n, h, size("Dk")?]),
        (LENGTH.into(), vec![b]),
        ("v".into(), vec![b, n, h, size("Dv")?]),
    ])
}

/// The cached lengths of a state for a run of `t_len` tokens, per batch row, after checking
/// them: whole numbers `≤ N`, `ℓ + T ≤ N` without a window, and empty rows zero.
pub fn lengths<F: Real>(m: &Attention, state: &Tensors<F>, t_len: usize) -> Result<Vec<usize>> {
    let (k, v, l) = (get(state, "k")?, get(state, "v")?, get(state, LENGTH)?);
    if k.ndim() != 4 || v.ndim() != 4 || l.shape() != [k.shape()[0]] || v.shape()[1] != k.shape()[1] {
        return Err(Error::shape(
            "state",
            "k [B, N, H, Dk], v [B, N, H, Dv] and length [B]",
            format!(
                "k {}, v {}, length {}",
                fmt_shape(k.shape()),
                fmt_shape(v.shape()),
                fmt_shape(l.shape())
            ),
        ));
    }
    let n = k.shape()[1];
    let mut out = Vec::with_capacity(l.len());
    for (b, &x) in l.iter().enumerate() {
        let x = x.f64();
        if !(x >= 0.0 && x.fract() == 0.0 && x <= n as f64) {
            return Err(Error::Value {
                name: format!("state.{LENGTH}[{b}]"),
                constraint: format!("must be a whole number in 0 … N = {n} (the cached tokens)"),
                found: format!("{x}"),
            });
        }
        let len = x as usize;
        if m.window().is_none() && len + t_len > n {
            return Err(Error::Value {
                name: format!("state.{LENGTH}[{b}]"),
                constraint: format!(
                    "a run of {t_len} tokens after {len} cached ones ends with {} cached, so it needs a \
                     cache of capacity N ≥ length + T (pass a larger cache: zeros with length 0 for a \
                     fresh one)",
                    len + t_len
                ),
                found: format!("N = {n}, length {len}, T = {t_len}"),
            });
        }
        for (name, a) in [("k", k), ("v", v)] {
            if a.slice(s![b, len.., .., ..]).iter().any(|&x| x != F::zero()) {
                return Err(Error::Value {
                    name: format!("state.{name}[{b}, {len}..]"),
                    constraint: format!("rows from the length {len} on are empty, so they must be zero"),
                    found: "non-zero entries".into(),
                });
            }
        }
        out.push(len);
    }
    Ok(out)
}

/// The final length after `t_len` more tokens from `len` cached ones.
fn final_len(m: &Attention, len: usize, t_len: usize) -> usize {
    m.window().map_or(len + t_len, |w| (len + t_len).min(w - 1))
}

/// The cached lengths and the cache tensors of `initial` (checked), or an empty cache of
/// capacity `cap` (the final state's) without one.
type Cache<'a, F> = (Vec<usize>, Option<(&'a ArrayD<F>, &'a ArrayD<F>)>, usize);

fn cache<'a, F: Real>(
    m: &Attention,
    x: &Tensors<F>,
    initial: Option<&'a Tensors<F>>,
) -> Result<Cache<'a, F>> {
    let q = get(x, "q")?;
    let (nb, t_len) = (q.shape()[0], q.shape()[1]);
    match initial {
        Some(s) => {
            let lens = lengths(m, s, t_len)?;
            Ok((lens, Some((get(s, "k")?, get(s, "v")?)), get(s, "k")?.shape()[1]))
        }
        None => Ok((vec![0; nb], None, m.window().map_or(t_len, |w| w - 1))),
    }
}

/// The extension of the batch `rows` with `len` cached tokens (module documentation).
fn extension<F: Real>(
    x: &Tensors<F>,
    kv: Option<(&ArrayD<F>, &ArrayD<F>)>,
    rows: &[usize],
    len: usize,
) -> Result<Tensors<F>> {
    Ok([
        ("q".to_string(), prefixed(get(x, "q")?, None, rows, len)),
        ("k".to_string(), prefixed(get(x, "k")?, kv.map(|c| c.0), rows, len)),
        ("v".to_string(), prefixed(get(x, "v")?, kv.map(|c| c.1), rows, len)),
    ]
    .into_iter()
    .collect())
}

/// `y` and the final cache of a run from `initial` (`None`: an empty cache) by `form` on the
/// extension (module documentation).
pub fn run<F: Real>(
    m: &Attention,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    form: impl Fn(&Tensors<F>) -> Result<ArrayD<F>>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    let (k, v) = (get(x, "k")?, get(x, "v")?);
    let (nb, t_len, nh, dk, dv) = (k.shape()[0], k.shape()[1], k.shape()[2], k.shape()[3], v.shape()[3]);
    let (lens, kv, cap) = cache(m, x, initial)?;
    let mut y = ArrayD::<F>::zeros(v.raw_dim());
    let mut fk = ArrayD::<F>::zeros(IxDyn(&[nb, cap, nh, dk]));
    let mut fv = ArrayD::<F>::zeros(IxDyn(&[nb, cap, nh, dv]));
    let mut fl = vec![0; nb];
    for (len, rows) in by_length(&lens) {
        let ext = extension(x, kv, &rows, len)?;
        let ye = form(&ext)?;
        let keep = final_len(m, len, t_len);
        let from = Slice::from(len + t_len - keep..len + t_len);
        for (i, &b) in rows.iter().enumerate() {
            y.index_axis_mut(Axis(0), b).assign(&ye.slice(s![i, len.., .., ..]));
            for (dst, src) in [(&mut fk, &ext["k"]), (&mut fv, &ext["v"])] {
                dst.slice_mut(s![b, ..keep, .., ..])
                    .assign(&src.index_axis(Axis(0), i).slice_axis(Axis(0), from));
            }
            fl[b] = keep;
        }
    }
    let fl = ArrayD::from_shape_vec(IxDyn(&[nb]), fl.iter().map(|&l| F::of(l as f64)).collect())
        .map_err(|e| Error::Numerical(e.to_string()))?;
    Ok((y, [("k".to_string(), fk), (LENGTH.to_string(), fl), ("v".to_string(), fv)].into_iter().collect()))
}

/// The backward of [`run`] by `backward` (the form's backward on the extension) (module
/// documentation): the gradients of `q`, `k`, `v` in `requires` and, with an initial state, the
/// cache's gradient.
pub fn vjp<F: Real>(
    m: &Attention,
    args: crate::state::StateVjp<'_, F>,
    backward: impl Fn(&Tensors<F>, &ArrayD<F>) -> Result<Tensors<F>>,
) -> Result<(Tensors<F>, Tensors<F>)> {
    let crate::state::StateVjp { x, initial, dy, d_final, requires } = args;
    let (q, k, v) = (get(x, "q")?, get(x, "k")?, get(x, "v")?);
    if dy.shape() != v.shape() {
        return Err(Error::shape("dy", fmt_shape(v.shape()), fmt_shape(dy.shape())));
    }
    let (nb, t_len) = (k.shape()[0], k.shape()[1]);
    let (lens, kv, cap) = cache(m, x, initial)?;
    let mut d = [q, k, v].map(|a| ArrayD::<F>::zeros(a.raw_dim()));
    let mut dc = [k, v].map(|a| {
        let mut sh = a.shape().to_vec();
        sh[1] = cap;
        ArrayD::<F>::zeros(IxDyn(&sh))
    });
    let mut spare = ArrayD::<F>::zeros(IxDyn(&[nb, cap.max(1), q.shape()[2], q.shape()[3]]));
    for (len, rows) in by_length(&lens) {
        let ext = extension(x, kv, &rows, len)?;
        let mut dye = prefixed(dy, None, &rows, len);
        dye.slice_axis_mut(Axis(1), Slice::from(..len)).fill(F::zero());
        let mut g = backward(&ext, &dye)?;
        let keep = final_len(m, len, t_len);
        for (j, name) in ["k", "v"].into_iter().enumerate() {
            let mut ge = g.remove(&grad_name(name)).ok_or_else(|| missing(name))?;
            if let Some(df) = d_final.map(|s| get(s, name)).transpose()? {
                for (i, &b) in rows.iter().enumerate() {
                    ge.slice_mut(s![i, len + t_len - keep..len + t_len, .., ..]).add_assign(&df.slice(s![
                        b,
                        ..keep,
                        ..,
                        ..
                    ]));
                }
            }
            unprefix(&ge, &rows, len, &mut dc[j], &mut d[j + 1]);
        }
        let gq = g.remove(&grad_name("q")).ok_or_else(|| missing("q"))?;
        unprefix(&gq, &rows, len, &mut spare, &mut d[0]);
    }
    let [dq, dk, dv] = d;
    let grads: Tensors<F> = [("q", dq), ("k", dk), ("v", dv)]
        .into_iter()
        .filter(|(n, _)| requires.wants(n))
        .map(|(n, a)| (grad_name(n), a))
        .collect();
    let mut ds = Tensors::new();
    if initial.is_some() {
        let [dkc, dvc] = dc;
        ds.insert("k".to_string(), dkc);
        ds.insert(LENGTH.to_string(), ArrayD::zeros(IxDyn(&[nb])));
        ds.insert("v".to_string(), dvc);
    }
    Ok((grads, ds))
}

fn missing(name: &str) -> Error {
    Error::Numerical(format!("attention backward from a state: the backward returned no `d_{name}`"))
}

/// A random valid cache for `dims` (entries of `k`, `v` from `fill`): without a window a
/// capacity of `T + 5` (room for 5 cached tokens before the run), row `b` holding
/// `min(N, 5 − 2b mod 6)`-ish tokens (different rows differ), its empty rows zeroed.
pub(crate) fn random_state(m: &Attention, dims: &crate::Dims, seed: u64) -> Result<Tensors<f64>> {
    let mut d = dims.clone();
    if m.window().is_none() {
        d.insert(CAPACITY, dims.get("T").copied().unwrap_or(0) + 5);
    }
    let sh = shapes(m, &d).map_err(|why| crate::state::no_state("attention", &why))?;
    let mut st = crate::state::random(&sh, seed);
    let (nb, n) = (sh[0].1[0], sh[0].1[1]);
    let lens: Vec<usize> = (0..nb).map(|b| (5 + 4 * b) % 7).map(|l| l.min(n).min(5)).collect();
    for name in ["k", "v"] {
        let a = st.get_mut(name).ok_or_else(|| missing(name))?;
        for (b, &l) in lens.iter().enumerate() {
            a.slice_mut(s![b, l.., .., ..]).fill(0.0);
        }
    }
    st.insert(
        LENGTH.into(),
        ArrayD::from_shape_vec(IxDyn(&[nb]), lens.iter().map(|&l| l as f64).collect())
            .map_err(|e| Error::Numerical(e.to_string()))?,
    );
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad::Requires;
    use crate::mixer::{Mixer, complete_dims};
    use crate::mixers::state_check::{Cotangents, check_inputs, check_partial, close, split_run};
    use crate::state::segment;

    fn mixers() -> Vec<Attention> {
        [serde_json::json!({}), serde_json::json!({"window": 4}), serde_json::json!({"window": 1})]
            .iter()
            .map(|c| Attention::from_json("attention", c).unwrap())
            .collect()
    }

    fn dims(t: usize) -> crate::Dims {
        [("B", 2), ("T", t), ("H", 2), ("Dk", 3), ("Dv", 2)].into_iter().collect()
    }

    /// A split anywhere gives the rows of the plain oracle of the whole sequence, and the same
    /// final cache, when the first part starts from an empty cache of the whole run's capacity.
    #[test]
    fn a_split_anywhere_is_the_whole_run() {
        for m in mixers() {
            let t_len = 11;
            let x = m.random_inputs(&complete_dims(&m, &dims(t_len)), 3).unwrap();
            let whole = crate::oracle::dense(&m, &x).unwrap();
            let (y0, f0) = m.state_oracle(&x, None).unwrap();
            close(&y0, &whole, "from an empty cache");
            let d =
                [("B", 2), ("N", t_len), ("H", 2), ("Dk", 3), ("Dv", 2), ("T", t_len)].into_iter().collect();
            let empty = crate::state::zeros::<f64>(&shapes(&m, &d).unwrap());
            for a in [0, 1, 4, 10, 11] {
                let (head, tail) = (segment(&m, &x, 0..a).unwrap(), segment(&m, &x, a..t_len).unwrap());
                let (joined, sb) = split_run(|x, s| m.state_oracle(x, s), &head, &tail, Some(&empty));
                close(&joined, &whole, &format!("split at {a}"));
                for k in ["k", "v", LENGTH] {
                    close(&sb[k], &f0[k], &format!("final `{k}` at {a}"));
                }
            }
        }
    }

    #[test]
    fn the_state_backward_matches_finite_differences() {
        for m in mixers() {
            let x = m.random_inputs(&complete_dims(&m, &dims(5)), 4).unwrap();
            let s0 = random_state(&m, &dims(5), 9).unwrap();
            let (y, fin) = m.state_oracle(&x, Some(&s0)).unwrap();
            let c = Cotangents::new(&y, &fin, &["k", "v"]);
            let (g, gs) = m.state_oracle_vjp(&x, Some(&s0), &c.dy, Some(&c.d_final), &Requires::All).unwrap();
            let loss = |x: &Tensors<f64>, s: &Tensors<f64>| c.loss(m.state_oracle(x, Some(s)).unwrap());
            let l0 = s0[LENGTH][0] as usize;
            for name in ["k", "v"] {
                if l0 == 0 {
                    continue;
                }
                let ix = [0, l0 - 1, 1, 1];
                check_partial(&format!("d_state.{name}"), gs[name][ix], &s0, name, &ix, |s| loss(&x, s));
            }
            check_inputs(m.name(), &g, &x, &["q", "k", "v"], |x| loss(x, &s0));
        }
    }

    #[test]
    fn bad_caches_are_refused_with_what_was_given() {
        let m = &mixers()[0];
        let x = m.random_inputs(&complete_dims(m, &dims(5)), 4).unwrap();
        let s0 = random_state(m, &dims(5), 9).unwrap();
        let mut full = s0.clone();
        full.get_mut(LENGTH).unwrap()[0] = 6.0;
        let e = m.state_oracle(&x, Some(&full)).unwrap_err().to_string();
        assert!(e.contains("capacity N ≥ length + T") && e.contains("N = 10, length 6, T = 5"), "{e}");
        let mut dirty = s0.clone();
        let l = s0[LENGTH][1] as usize;
        dirty.get_mut("v").unwrap()[[1, l, 0, 0]] = 1.0;
        let e = m.state_oracle(&x, Some(&dirty)).unwrap_err().to_string();
        assert!(e.contains(&format!("state.v[1, {l}..]")) && e.contains("must be zero"), "{e}");
    }
}
