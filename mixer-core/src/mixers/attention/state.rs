//! The recurrent state of softmax attention, a KV cache (docs/math.md §7.1), and runs from it
//! for every form and backend through the *extension* ([`crate::mixers::cache`], shared with the
//! lifts under masks other than Fenwick).
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

use ndarray::ArrayD;

use super::Attention;
use crate::error::Result;
use crate::mixers::cache::Cache;
use crate::real::Real;
use crate::state::StateShapes;
use crate::tensor::Tensors;

/// The name of the cached lengths' tensor.
pub const LENGTH: &str = "length";

/// The size symbol of the cache's capacity.
pub use crate::mixers::cache::CAPACITY;

/// Attention's cache: `k` and `v`, the lengths `length`, the window's capacity.
fn cache(m: &Attention) -> Cache {
    Cache {
        cached: vec!["k", "v"],
        length: LENGTH,
        window: m.window(),
        per_token: ["q", "k", "v"].map(String::from).to_vec(),
        copy_first: Vec::new(),
        mixed: "v",
    }
}

/// The capacity `N` of a full-attention cache: the given cache's (axis 1 of its `k`), else `T`.
pub(crate) fn sizes(m: &Attention, dims: &crate::Dims, given: Option<&StateShapes>) -> crate::Dims {
    cache(m).sizes(dims, given)
}

/// The state's shapes: `k [B, N, H, Dk]`, `v [B, N, H, Dv]`, `length [B]`.
pub(crate) fn shapes(m: &Attention, dims: &crate::Dims) -> std::result::Result<StateShapes, String> {
    let size = |s: &str| dims.get(s).copied().ok_or_else(|| format!("size `{s}` is unbound"));
    cache(m).shapes(dims, |name| Ok(vec![size("H")?, size(if name == "k" { "Dk" } else { "Dv" })?]))
}

/// The cached lengths of a state for a run of `t_len` tokens, per batch row, after checking
/// them: whole numbers `≤ N`, `ℓ + T ≤ N` without a window, and empty rows zero.
pub fn lengths<F: Real>(m: &Attention, state: &Tensors<F>, t_len: usize) -> Result<Vec<usize>> {
    cache(m).lengths(state, t_len)
}

/// [`lengths`]' checks of the cached lengths alone (for a cache whose rows are not on the host):
/// whole numbers `≤ n`, `ℓ + T ≤ n` without a window.
pub fn check_lengths(
    m: &Attention,
    lengths: impl IntoIterator<Item = f64>,
    n: usize,
    t_len: usize,
) -> Result<Vec<usize>> {
    cache(m).check_lengths(lengths, n, t_len)
}

/// The cache's length after a run of `t_len` tokens from `len` cached ones: `len + T`, at most
/// `w − 1` with a window.
pub fn final_len(m: &Attention, len: usize, t_len: usize) -> usize {
    cache(m).final_len(len, t_len)
}

/// `y` and the final cache of a run from `initial` (`None`: an empty cache) by `form` on the
/// extension (module documentation).
pub fn run<F: Real>(
    m: &Attention,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    form: impl Fn(&Tensors<F>) -> Result<ArrayD<F>>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    cache(m).run(x, initial, form)
}

/// The backward of [`run`] by `backward` (the form's backward on the extension) (module
/// documentation): the gradients of `q`, `k`, `v` in `requires` and, with an initial state, the
/// cache's gradient.
pub fn vjp<F: Real>(
    m: &Attention,
    args: crate::state::StateVjp<'_, F>,
    backward: impl Fn(&Tensors<F>, &ArrayD<F>) -> Result<Tensors<F>>,
) -> Result<(Tensors<F>, Tensors<F>)> {
    cache(m).vjp(args, backward)
}

/// A random valid cache for `dims`: without a window a capacity of `T + 5` (room for 5 cached
/// tokens before the run), row `b` holding up to 5 tokens (rows differ), its empty rows zeroed.
pub(crate) fn random_state(m: &Attention, dims: &crate::Dims, seed: u64) -> Result<Tensors<f64>> {
    let mut d = dims.clone();
    if m.window().is_none() {
        d.insert(CAPACITY, dims.get("T").copied().unwrap_or(0) + 5);
    }
    let sh = shapes(m, &d).map_err(|why| crate::state::no_state("attention", &why))?;
    cache(m).random_state(&sh, seed, usize::MAX)
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
