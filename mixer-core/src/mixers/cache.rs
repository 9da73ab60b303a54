//! A prefix cache as a mixer's recurrent state, and runs from it through the *extension*
//! (docs/math.md §7.1). It is the state of the mixers whose next outputs read past tokens
//! themselves rather than a summary of them: softmax attention (its KV cache) and the
//! log-linear lifts under a level mask other than Fenwick (their buckets have no recurrence).
//!
//! **Layout.** For each cached per-token input `x [B, T, …]` a tensor `[B, N, …]` whose rows
//! `0 … ℓ − 1` are its last `ℓ` tokens, oldest first, and whose rows `ℓ … N − 1` are empty and
//! zero; and the lengths `ℓ [B]` (rows may differ). The capacity is `N = w − 1` with a window
//! `w` (the cache keeps the last `min(ℓ + T, w − 1)` tokens), else the given cache's (the size
//! `N`), and `N = T` for a run without an initial state. A run of `T` tokens after `ℓ` cached
//! ones ends with `ℓ + T` of them, so without a window it needs `ℓ + T ≤ N`.
//!
//! **Runs** ([`Cache::run`]): per group of batch rows with one `ℓ`, the form runs on the
//! extended sequence of `ℓ + T` tokens: the cached inputs' first `ℓ` rows from the cache, the
//! inputs of `copy_first` repeating the run's first token there (query-side inputs that must
//! keep valid values), every other per-token input zero there (the queries), inputs without a
//! token axis as given. `y` is the extension's rows `ℓ …`; the prefix rows' outputs are not
//! used. The final cache is the last `ℓ'` rows of the extension's cached inputs (`ℓ'` the final
//! length).
//!
//! **Backward** ([`Cache::vjp`]): the form's backward on the extension with the cotangent zero
//! on the prefix rows. The final cache is a copy of rows of the extension, so its cotangent adds
//! to their gradients; the initial cache's gradient is the prefix rows' gradients of the cached
//! inputs (zero on the empty rows and for the lengths); inputs without a token axis sum their
//! gradients over the groups.

use std::ops::AddAssign;

use ndarray::{ArrayD, Axis, IxDyn, Slice};

use crate::error::{Error, Result, fmt_shape};
use crate::grad::grad_name;
use crate::real::Real;
use crate::state::{StateShapes, StateVjp, by_length, prefixed, unprefix};
use crate::tensor::{Tensors, get};

/// The size symbol of a cache's capacity.
pub const CAPACITY: &str = "N";

/// How a mixer keeps its prefix cache (module documentation).
#[derive(Clone, Debug)]
pub struct Cache {
    /// The cached per-token inputs, in the state's (name) order.
    pub cached: Vec<&'static str>,
    /// The name of the lengths' tensor.
    pub length: &'static str,
    /// A window `w`: the cache keeps the last `w − 1` tokens (`None`: all of them).
    pub window: Option<usize>,
    /// Every input with a token axis (axis 1).
    pub per_token: Vec<String>,
    /// The per-token inputs whose prefix rows repeat the run's first token (zeros otherwise).
    pub copy_first: Vec<&'static str>,
    /// The mixed input, whose shape `y` has.
    pub mixed: &'static str,
}

/// The lengths, the initial cache (checked) and the capacity of a run.
type Prefix<'a, F> = (Vec<usize>, Option<&'a Tensors<F>>, usize);

impl Cache {
    /// The capacity: `w − 1` with a window, else the size `N` (the given cache's, or `T`).
    pub fn capacity(&self, dims: &crate::Dims) -> std::result::Result<usize, String> {
        match self.window {
            Some(w) => Ok(w - 1),
            None => dims.get(CAPACITY).or(dims.get("T")).copied().ok_or_else(|| "size `T` is unbound".into()),
        }
    }

    /// The size `N` without a window: axis 1 of the given cache's first cached tensor, else `T`.
    pub fn sizes(&self, dims: &crate::Dims, given: Option<&StateShapes>) -> crate::Dims {
        let mut d = crate::Dims::new();
        if self.window.is_none() {
            let first = self.cached.first().copied().unwrap_or_default();
            let n =
                given.and_then(|g| g.iter().find(|(k, _)| k == first)).and_then(|(_, s)| s.get(1).copied());
            if let Some(n) = n.or(dims.get("T").copied()) {
                d.insert(CAPACITY, n);
            }
        }
        d
    }

    /// The state's shapes: `[B, N, tail…]` per cached input (`tail` gives its shape after the
    /// token axis) and the lengths `[B]`, in name order.
    pub fn shapes(
        &self,
        dims: &crate::Dims,
        tail: impl Fn(&str) -> std::result::Result<Vec<usize>, String>,
    ) -> std::result::Result<StateShapes, String> {
        let b = dims.get("B").copied().ok_or("size `B` is unbound")?;
        let n = self.capacity(dims)?;
        let mut out: StateShapes = vec![(self.length.into(), vec![b])];
        for &name in &self.cached {
            out.push((name.into(), [vec![b, n], tail(name)?].concat()));
        }
        out.sort();
        Ok(out)
    }

    /// The cached lengths of `state` for a run of `t_len` tokens, per batch row, after checking
    /// them: whole numbers `≤ N`, `ℓ + T ≤ N` without a window, and empty rows zero.
    pub fn lengths<F: Real>(&self, state: &Tensors<F>, t_len: usize) -> Result<Vec<usize>> {
        let l = get(state, self.length)?;
        let tensors =
            self.cached.iter().map(|&n| get(state, n).map(|a| (n, a))).collect::<Result<Vec<_>>>()?;
        let (b0, n) = tensors
            .first()
            .map_or((l.len(), 0), |(_, a)| (a.shape()[0], a.shape().get(1).copied().unwrap_or(0)));
        if l.shape() != [b0] || tensors.iter().any(|(_, a)| a.ndim() < 2 || a.shape()[..2] != [b0, n]) {
            let got: Vec<String> = tensors
                .iter()
                .map(|(k, a)| format!("{k} {}", fmt_shape(a.shape())))
                .chain([format!("{} {}", self.length, fmt_shape(l.shape()))])
                .collect();
            return Err(Error::shape(
                "state",
                format!("{} [B, N, …] and {} [B]", self.cached.join(", "), self.length),
                got.join(", "),
            ));
        }
        let out = self.check_lengths(l.iter().map(|x| x.f64()), n, t_len)?;
        for (b, &len) in out.iter().enumerate() {
            for (name, a) in &tensors {
                let empty = a.index_axis(Axis(0), b);
                if empty.slice_axis(Axis(0), Slice::from(len..)).iter().any(|&x| x != F::zero()) {
                    return Err(Error::Value {
                        name: format!("state.{name}[{b}, {len}..]"),
                        constraint: format!(
                            "rows from the {} {len} on are empty, so they must be zero",
                            self.length
                        ),
                        found: "non-zero entries".into(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// The cached lengths `lengths` (one per batch row) checked for a run of `t_len` tokens into
    /// caches of capacity `n`: whole numbers `≤ n`, and `ℓ + T ≤ n` without a window. The
    /// length checks of [`Cache::lengths`], for a state whose cached rows are not on the host.
    pub fn check_lengths(
        &self,
        lengths: impl IntoIterator<Item = f64>,
        n: usize,
        t_len: usize,
    ) -> Result<Vec<usize>> {
        let mut out = Vec::new();
        for (b, x) in lengths.into_iter().enumerate() {
            if !(x >= 0.0 && x.fract() == 0.0 && x <= n as f64) {
                return Err(Error::Value {
                    name: format!("state.{}[{b}]", self.length),
                    constraint: format!("must be a whole number in 0 … N = {n} (the cached tokens)"),
                    found: format!("{x}"),
                });
            }
            let len = x as usize;
            if self.window.is_none() && len + t_len > n {
                return Err(Error::Value {
                    name: format!("state.{}[{b}]", self.length),
                    constraint: format!(
                        "a run of {t_len} tokens after {len} cached ones ends with {} cached, so it needs a \
                         cache of capacity N ≥ {} + T (pass a larger cache: zeros with {} 0 for a fresh one)",
                        len + t_len,
                        self.length,
                        self.length
                    ),
                    found: format!("N = {n}, {} {len}, T = {t_len}", self.length),
                });
            }
            out.push(len);
        }
        Ok(out)
    }

    /// The final length after `t_len` more tokens from `len` cached ones.
    pub fn final_len(&self, len: usize, t_len: usize) -> usize {
        self.window.map_or(len + t_len, |w| (len + t_len).min(w - 1))
    }

    /// The lengths and cache of `initial` (checked), or an empty cache of the final state's
    /// capacity without one.
    fn prefix<'a, F: Real>(&self, x: &Tensors<F>, initial: Option<&'a Tensors<F>>) -> Result<Prefix<'a, F>> {
        let y = get(x, self.mixed)?;
        let (nb, t_len) = (y.shape()[0], y.shape()[1]);
        match initial {
            Some(s) => {
                let lens = self.lengths(s, t_len)?;
                let first = self.cached.first().copied().unwrap_or_default();
                Ok((lens, Some(s), get(s, first)?.shape()[1]))
            }
            None => Ok((vec![0; nb], None, self.window.map_or(t_len, |w| w - 1))),
        }
    }

    /// The extension of the batch `rows` by `len` cached tokens (module documentation).
    fn extension<F: Real>(
        &self,
        x: &Tensors<F>,
        cache: Option<&Tensors<F>>,
        rows: &[usize],
        len: usize,
    ) -> Result<Tensors<F>> {
        x.iter()
            .map(|(name, a)| {
                let ext = if !self.per_token.contains(name) {
                    a.clone()
                } else if self.cached.contains(&name.as_str()) {
                    prefixed(a, cache.map(|c| get(c, name)).transpose()?, rows, len)
                } else if self.copy_first.contains(&name.as_str()) && a.shape()[1] > 0 {
                    let first = a.slice_axis(Axis(1), Slice::from(..1));
                    let mut shape = first.shape().to_vec();
                    shape[1] = len;
                    let repeated = first.broadcast(IxDyn(&shape)).map(|r| r.to_owned());
                    prefixed(a, repeated.as_ref(), rows, len)
                } else {
                    prefixed(a, None, rows, len)
                };
                Ok((name.clone(), ext))
            })
            .collect()
    }

    /// `y` and the final cache of a run from `initial` (`None`: an empty cache) by `form` on
    /// the extension (module documentation).
    pub fn run<F: Real>(
        &self,
        x: &Tensors<F>,
        initial: Option<&Tensors<F>>,
        form: impl Fn(&Tensors<F>) -> Result<ArrayD<F>>,
    ) -> Result<(ArrayD<F>, Tensors<F>)> {
        let mixed = get(x, self.mixed)?;
        let (nb, t_len) = (mixed.shape()[0], mixed.shape()[1]);
        let (lens, cache, cap) = self.prefix(x, initial)?;
        let mut y = ArrayD::<F>::zeros(mixed.raw_dim());
        let mut fin = self.empty_cache(x, cap)?;
        let mut fl = vec![0; nb];
        for (len, rows) in by_length(&lens) {
            let ext = self.extension(x, cache, &rows, len)?;
            let ye = if t_len == 0 { ArrayD::zeros(ext[self.mixed].raw_dim()) } else { form(&ext)? };
            let keep = self.final_len(len, t_len);
            let from = Slice::from(len + t_len - keep..len + t_len);
            for (i, &b) in rows.iter().enumerate() {
                y.index_axis_mut(Axis(0), b)
                    .assign(&ye.index_axis(Axis(0), i).slice_axis(Axis(0), Slice::from(len..)));
                for &name in &self.cached {
                    let dst = fin.get_mut(name).ok_or_else(|| missing(name))?;
                    dst.index_axis_mut(Axis(0), b)
                        .slice_axis_mut(Axis(0), Slice::from(..keep))
                        .assign(&ext[name].index_axis(Axis(0), i).slice_axis(Axis(0), from));
                }
                fl[b] = keep;
            }
        }
        let fl = ArrayD::from_shape_vec(IxDyn(&[nb]), fl.iter().map(|&l| F::of(l as f64)).collect())
            .map_err(|e| Error::Numerical(e.to_string()))?;
        fin.insert(self.length.into(), fl);
        Ok((y, fin))
    }

    /// Zero tensors `[B, cap, …]` for the cached inputs of `x`.
    fn empty_cache<F: Real>(&self, x: &Tensors<F>, cap: usize) -> Result<Tensors<F>> {
        self.cached
            .iter()
            .map(|&name| {
                let mut shape = get(x, name)?.shape().to_vec();
                shape[1] = cap;
                Ok((name.to_string(), ArrayD::zeros(IxDyn(&shape))))
            })
            .collect()
    }

    /// The backward of [`Cache::run`] by `backward` (the form's backward on the extension,
    /// returning `d_<input>` for every input) (module documentation): the gradients of the
    /// inputs in `requires` and, with an initial state, the cache's gradient.
    pub fn vjp<F: Real>(
        &self,
        args: StateVjp<'_, F>,
        backward: impl Fn(&Tensors<F>, &ArrayD<F>) -> Result<Tensors<F>>,
    ) -> Result<(Tensors<F>, Tensors<F>)> {
        let StateVjp { x, initial, dy, d_final, requires } = args;
        let mixed = get(x, self.mixed)?;
        if dy.shape() != mixed.shape() {
            return Err(Error::shape("dy", fmt_shape(mixed.shape()), fmt_shape(dy.shape())));
        }
        let (nb, t_len) = (mixed.shape()[0], mixed.shape()[1]);
        let (lens, cache, cap) = self.prefix(x, initial)?;
        let mut grads: Tensors<F> = x.iter().map(|(k, a)| (k.clone(), ArrayD::zeros(a.raw_dim()))).collect();
        let mut d_cache = self.empty_cache(x, cap)?;
        for (len, rows) in by_length(&lens) {
            let ext = self.extension(x, cache, &rows, len)?;
            let mut dye = prefixed(dy, None, &rows, len);
            dye.slice_axis_mut(Axis(1), Slice::from(..len)).fill(F::zero());
            let mut g = if t_len == 0 {
                ext.iter().map(|(k, a)| (grad_name(k), ArrayD::zeros(a.raw_dim()))).collect()
            } else {
                backward(&ext, &dye)?
            };
            let keep = self.final_len(len, t_len);
            for (name, full) in grads.iter_mut() {
                let mut ge = g.remove(&grad_name(name)).ok_or_else(|| missing(name))?;
                if !self.per_token.contains(name) {
                    full.add_assign(&ge);
                    continue;
                }
                let cached = self.cached.contains(&name.as_str());
                if let Some(df) = d_final.filter(|_| cached).map(|s| get(s, name)).transpose()? {
                    for (i, &b) in rows.iter().enumerate() {
                        ge.index_axis_mut(Axis(0), i)
                            .slice_axis_mut(Axis(0), Slice::from(len + t_len - keep..len + t_len))
                            .add_assign(&df.index_axis(Axis(0), b).slice_axis(Axis(0), Slice::from(..keep)));
                    }
                }
                // The prefix rows of an input that is not cached are not the caller's: dropped.
                let mut spare;
                let prefix = match d_cache.get_mut(name.as_str()) {
                    Some(p) if cached => p,
                    _ => {
                        let mut shape = full.shape().to_vec();
                        shape[1] = len;
                        spare = ArrayD::zeros(IxDyn(&shape));
                        &mut spare
                    }
                };
                unprefix(&ge, &rows, len, prefix, full);
            }
        }
        let grads =
            grads.into_iter().filter(|(n, _)| requires.wants(n)).map(|(n, a)| (grad_name(&n), a)).collect();
        let mut ds = Tensors::new();
        if initial.is_some() {
            ds = d_cache;
            ds.insert(self.length.into(), ArrayD::zeros(IxDyn(&[nb])));
        }
        Ok((grads, ds))
    }

    /// A random valid cache of the shapes `shapes` (entries from [`crate::state::random`] with
    /// `seed`): row `b` holding `(5 + 4b) mod 7` tokens at most 5 (rows differ), no more than
    /// `N` or `max_len`, its empty rows zeroed.
    pub fn random_state(&self, shapes: &StateShapes, seed: u64, max_len: usize) -> Result<Tensors<f64>> {
        let mut st = crate::state::random(shapes, seed);
        let first = self.cached.first().copied().unwrap_or_default();
        let (nb, n) = shapes
            .iter()
            .find(|(k, _)| k == first)
            .map(|(_, s)| (s[0], s[1]))
            .ok_or_else(|| missing(first))?;
        let lens: Vec<usize> =
            (0..nb).map(|b| (5 + 4 * b) % 7).map(|l| l.min(n).min(5).min(max_len)).collect();
        for &name in &self.cached {
            let a = st.get_mut(name).ok_or_else(|| missing(name))?;
            for (b, &l) in lens.iter().enumerate() {
                a.index_axis_mut(Axis(0), b).slice_axis_mut(Axis(0), Slice::from(l..)).fill(0.0);
            }
        }
        st.insert(
            self.length.into(),
            ArrayD::from_shape_vec(IxDyn(&[nb]), lens.iter().map(|&l| l as f64).collect())
                .map_err(|e| Error::Numerical(e.to_string()))?,
        );
        Ok(st)
    }
}

fn missing(name: &str) -> Error {
    Error::Numerical(format!("a run from a cache: no tensor or gradient `{name}` came back"))
}
