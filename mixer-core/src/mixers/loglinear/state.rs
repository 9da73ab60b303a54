//! The `f64` reference of the log-linear mixers run from a state (docs/math.md §7.1). For the
//! base mixers it is the plain materialized oracle on an extended sequence, so that their
//! states need no second reference implementation (below); the lifts' state (Fenwick level
//! states and a position) is referenced by their literal recurrence
//! ([`super::lift_state`]), which the tests check against the plain oracle at every
//! split.
//!
//! Per (batch row, head), with `S_0 ∈ ℝ^(D_v × D_k)` the initial state and `e_j` the unit
//! vectors of `ℝ^(D_k)`:
//! - **load** `S_0` by `D_k` tokens before the sequence, token `j` with `k = e_j`,
//!   `v = S_0 e_j`, `q = 0`, `g = 0`, `β = 1`. From a zero state they build
//!   `Σ_j S_0 e_j e_jᵀ = S_0` (for gated DeltaNet the erase `(I − e_j e_jᵀ)` of token `j`
//!   meets only columns `< j` of the state, which it leaves alone);
//! - the sequence's own tokens, with `σ q_t` in place of `q_t` and the scale set to 1 (the
//!   same matrix `A`);
//! - **probe** the final state by `D_k` tokens after it, token `j` with `q = e_j`, `k = 0`,
//!   `v = 0`, `g = 0`, `β = 0`: their transitions are the identity and they add nothing, so
//!   output `j` is `S_T e_j`, column `j` of the final state.
//!
//! The backward is the materialized backward of the extension with cotangent zero on the
//! load tokens, `ȳ` on the sequence and the final state's cotangent `S̄_T e_j` on probe `j`;
//! the initial state's gradient is `v̄` of the load tokens (`S̄_0 e_j = v̄_j`), and
//! `q̄_t = σ (q̄_t of the extension)`.

use ndarray::{ArrayD, Axis, IxDyn, Slice, s};

use super::LogLinear;
use crate::error::{Error, Result};
use crate::grad::{Requires, grad_name};
use crate::mixers::cache::Cache;
use crate::state::StateShapes;
use crate::tensor::{Tensors, get};

pub use super::STATE;

/// The state's shapes: `S [B, H, Dv, Dk]` for the base mixers, `S [B, H, L, Dv, Dk]` and
/// `position [B]` for the Fenwick lifts, and for the lifts under another mask the cache of
/// [`cache`]: `k [B, N, H, Dk]`, `v [B, N, H, Dv]`, `g [B, N, H]` and `beta [B, N, H]` where the
/// base mixer has them, `position [B]`.
pub(crate) fn shapes(m: &LogLinear, dims: &crate::Dims) -> std::result::Result<StateShapes, String> {
    let size = |s: &str| dims.get(s).copied().ok_or_else(|| format!("size `{s}` is unbound"));
    if let Some(c) = cache(m) {
        return c.shapes(dims, |name| match name {
            "k" => Ok(vec![size("H")?, size("Dk")?]),
            "v" => Ok(vec![size("H")?, size("Dv")?]),
            _ => Ok(vec![size("H")?]),
        });
    }
    if m.lift.is_some() {
        return super::lift_state::shapes(dims);
    }
    Ok(vec![(STATE.into(), vec![size("B")?, size("H")?, size("Dv")?, size("Dk")?])])
}

/// The state of a lift under a mask other than Fenwick (`None` for the base mixers and the
/// Fenwick lifts): such a mask's buckets have no recurrence, so the state is a cache of every
/// past token's `k`, `v` (and `g`, `β` where the base mixer has them) with their count
/// `position`, and a run from it is a run of the extended sequence ([`crate::mixers::cache`];
/// the prefix rows' `λ` repeat the run's first token's, the query side, which those rows' unused
/// outputs alone read).
pub fn cache(m: &LogLinear) -> Option<Cache> {
    if m.lift.is_none() || m.has_fenwick_structure() {
        return None;
    }
    let mut cached = vec!["k", "v"];
    if m.base.has_decay() {
        cached.push("g");
    }
    if m.base.has_beta() {
        cached.push("beta");
    }
    cached.sort();
    Some(Cache {
        cached,
        length: super::lift_state::POSITION,
        window: None,
        per_token: crate::mixer::Mixer::spec(m).per_token(),
        copy_first: vec!["lambda"],
        mixed: "v",
    })
}

/// The extension: a scale-1 copy of the mixer, its inputs, and the number of load tokens.
fn extend(
    m: &LogLinear,
    x: &Tensors<f64>,
    initial: Option<&ArrayD<f64>>,
) -> Result<(LogLinear, Tensors<f64>, usize)> {
    let q = get(x, "q")?;
    let v = get(x, "v")?;
    let (nb, t_len, nh, dk) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let dv = v.shape()[3];
    let pre = if initial.is_some() { dk } else { 0 };
    let total = pre + t_len + dk;
    let mut out = Tensors::new();
    let mut qe = ArrayD::<f64>::zeros(IxDyn(&[nb, total, nh, dk]));
    let mut ke = qe.clone();
    let mut ve = ArrayD::<f64>::zeros(IxDyn(&[nb, total, nh, dv]));
    let mut ge = ArrayD::<f64>::zeros(IxDyn(&[nb, total, nh]));
    let mut be = ge.clone();
    let body = Slice::from(pre..pre + t_len);
    qe.slice_axis_mut(Axis(1), body).assign(&q.mapv(|a| m.scale * a));
    ke.slice_axis_mut(Axis(1), body).assign(get(x, "k")?);
    ve.slice_axis_mut(Axis(1), body).assign(v);
    if m.base.has_decay() {
        ge.slice_axis_mut(Axis(1), body).assign(get(x, "g")?);
    }
    if m.base.has_beta() {
        be.slice_axis_mut(Axis(1), body).assign(get(x, "beta")?);
    }
    for b in 0..nb {
        for h in 0..nh {
            for j in 0..dk {
                if let Some(s0) = initial {
                    ke[[b, j, h, j]] = 1.0;
                    be[[b, j, h]] = 1.0;
                    for r in 0..dv {
                        ve[[b, j, h, r]] = s0[[b, h, r, j]];
                    }
                }
                qe[[b, pre + t_len + j, h, j]] = 1.0;
            }
        }
    }
    out.insert("q".into(), qe);
    out.insert("k".into(), ke);
    out.insert("v".into(), ve);
    if m.base.has_decay() {
        out.insert("g".into(), ge);
    }
    if m.base.has_beta() {
        out.insert("beta".into(), be);
    }
    let mut one = m.clone();
    one.scale = 1.0;
    Ok((one, out, pre))
}

fn initial_s(initial: Option<&Tensors<f64>>) -> Result<Option<&ArrayD<f64>>> {
    initial.map(|s| get(s, STATE)).transpose()
}

/// `y` and the final state `S_T` from the extension's oracle (module documentation).
pub(crate) fn oracle(
    m: &LogLinear,
    x: &Tensors<f64>,
    initial: Option<&Tensors<f64>>,
) -> Result<(ArrayD<f64>, Tensors<f64>)> {
    if let Some(c) = cache(m) {
        return c.run(x, initial, |e| crate::oracle::dense(m, e));
    }
    if m.lift.is_some() {
        return super::lift_state::run(m, x, initial);
    }
    let (one, xe, pre) = extend(m, x, initial_s(initial)?)?;
    let t_len = get(x, "q")?.shape()[1];
    let mat = crate::mixer::Mixer::materialize(&one, &xe)?;
    let ye = crate::oracle::solve(&mat, &xe["v"])?;
    let y = ye.slice_axis(Axis(1), Slice::from(pre..pre + t_len)).to_owned();
    // Probe j's output [B, H, Dv] is column j of S_T: S[b, h, r, j] = y_e[b, pre + T + j, h, r].
    let probes = ye.slice_axis(Axis(1), Slice::from(pre + t_len..)).to_owned();
    let s_t = probes.permuted_axes(IxDyn(&[0, 2, 3, 1])).as_standard_layout().to_owned();
    Ok((y, [(STATE.to_string(), s_t)].into_iter().collect()))
}

/// The backward of [`oracle`] (module documentation).
pub(crate) fn oracle_vjp(
    m: &LogLinear,
    x: &Tensors<f64>,
    initial: Option<&Tensors<f64>>,
    dy: &ArrayD<f64>,
    d_final: Option<&Tensors<f64>>,
    requires: &Requires,
) -> Result<(Tensors<f64>, Tensors<f64>)> {
    if let Some(c) = cache(m) {
        let args = crate::state::StateVjp { x, initial, dy, d_final, requires };
        return c.vjp(args, |e, d| crate::grad::materialized_backward(m, e, d, &Requires::All));
    }
    if m.lift.is_some() {
        return super::lift_state::vjp(m, x, initial, dy, d_final, requires);
    }
    let s0 = initial_s(initial)?;
    let (one, xe, pre) = extend(m, x, s0)?;
    let q = get(x, "q")?;
    let (nb, t_len, nh, dk) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let dv = get(x, "v")?.shape()[3];
    if dy.shape() != [nb, t_len, nh, dv] {
        return Err(Error::shape(
            "dy",
            format!("[{nb}, {t_len}, {nh}, {dv}]"),
            crate::error::fmt_shape(dy.shape()),
        ));
    }
    let mut dye = ArrayD::<f64>::zeros(IxDyn(&[nb, pre + t_len + dk, nh, dv]));
    dye.slice_axis_mut(Axis(1), Slice::from(pre..pre + t_len)).assign(dy);
    if let Some(df) = d_final.map(|d| get(d, STATE)).transpose()? {
        if df.shape() != [nb, nh, dv, dk] {
            return Err(Error::shape(
                "d_final_state.S",
                format!("[{nb}, {nh}, {dv}, {dk}]"),
                crate::error::fmt_shape(df.shape()),
            ));
        }
        let mut probes = dye.slice_mut(s![.., pre + t_len.., .., ..]);
        probes.assign(&df.view().permuted_axes(IxDyn(&[0, 3, 1, 2])));
    }
    let ge = crate::grad::materialized_backward(&one, &xe, &dye, &Requires::All)?;
    let body = Slice::from(pre..pre + t_len);
    let mut grads = Tensors::new();
    for name in ["q", "k", "v", "g", "beta"] {
        let key = grad_name(name);
        if !requires.wants(name) || !x.contains_key(name) {
            continue;
        }
        if let Some(d) = ge.get(&key) {
            let mut d = d.slice_axis(Axis(1), body).to_owned();
            if name == "q" {
                d.mapv_inplace(|a| m.scale * a);
            }
            grads.insert(key, d);
        }
    }
    let mut d_state = Tensors::new();
    if s0.is_some() {
        // S̄_0[b, h, r, j] = v̄_e[b, j, h, r].
        let dv_load = ge[&grad_name("v")].slice_axis(Axis(1), Slice::from(0..pre)).to_owned();
        d_state.insert(
            STATE.to_string(),
            dv_load.permuted_axes(IxDyn(&[0, 2, 3, 1])).as_standard_layout().to_owned(),
        );
    }
    Ok((grads, d_state))
}

#[cfg(test)]
mod tests {
    use super::super::lift_state::POSITION as POSITION_NAME;
    use super::*;
    use crate::mixer::{Mixer, complete_dims};
    use crate::mixers::loglinear::Base;
    use crate::mixers::state_check::{Cotangents, check_inputs, check_partial, close, split_run};
    use crate::state::segment;

    fn dims(t: usize) -> crate::Dims {
        [("B", 2), ("T", t), ("H", 2), ("Dk", 3), ("Dv", 2)].into_iter().collect()
    }

    fn random_state(seed: u64) -> Tensors<f64> {
        let mut st = crate::state::zeros::<f64>(&vec![(STATE.into(), vec![2, 2, 2, 3])]);
        for (i, x) in st.get_mut(STATE).unwrap().iter_mut().enumerate() {
            *x = ((i as u64 * 7 + seed * 13) % 11) as f64 / 5.0 - 1.0;
        }
        st
    }

    /// The literal recurrence `S_t = e^(g_t) S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ`,
    /// `y_t = σ S_t q_t` from `S_0` (β = 1 without the delta rule, g = 0 without decay, and
    /// no erase for linear attention and Mamba-2).
    fn recurrence(m: &LogLinear, x: &Tensors<f64>, s0: &ArrayD<f64>) -> (ArrayD<f64>, ArrayD<f64>) {
        let (q, k, v) = (&x["q"], &x["k"], &x["v"]);
        let (nb, t_len, nh, dk) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
        let dv = v.shape()[3];
        let mut y = ArrayD::zeros(v.raw_dim());
        let mut fin = s0.clone();
        for b in 0..nb {
            for h in 0..nh {
                let mut st = s0.slice(s![b, h, .., ..]).to_owned();
                for t in 0..t_len {
                    let e = x.get("g").map_or(1.0, |g| g[[b, t, h]].exp());
                    let bt = x.get("beta").map_or(1.0, |g| g[[b, t, h]]);
                    let kt: Vec<f64> = (0..dk).map(|c| k[[b, t, h, c]]).collect();
                    if m.base == Base::GatedDeltaNet {
                        for r in 0..dv {
                            let sk: f64 = (0..dk).map(|c| st[[r, c]] * kt[c]).sum();
                            for c in 0..dk {
                                st[[r, c]] -= bt * sk * kt[c];
                            }
                        }
                    }
                    st.mapv_inplace(|a| a * e);
                    for r in 0..dv {
                        for c in 0..dk {
                            st[[r, c]] += bt * v[[b, t, h, r]] * kt[c];
                        }
                        y[[b, t, h, r]] =
                            m.scale * (0..dk).map(|c| st[[r, c]] * q[[b, t, h, c]]).sum::<f64>();
                    }
                }
                fin.slice_mut(s![b, h, .., ..]).assign(&st);
            }
        }
        (y, fin)
    }

    fn members() -> Vec<LogLinear> {
        [Base::LinearAttention, Base::Mamba2, Base::GatedDeltaNet]
            .into_iter()
            .map(|b| LogLinear::new(b.name(), b, None, 0.7, 4).unwrap())
            .collect()
    }

    #[test]
    fn the_extension_equals_the_literal_recurrence_from_a_state() {
        for m in members() {
            let x = m.random_inputs(&complete_dims(&m, &dims(9)), 5).unwrap();
            let s0 = random_state(1);
            let (y, fin) = oracle(&m, &x, Some(&s0)).unwrap();
            let (ry, rfin) = recurrence(&m, &x, &s0[STATE]);
            close(&y, &ry, &format!("{} y", m.name));
            close(&fin[STATE], &rfin, &format!("{} final state", m.name));
            // Without an initial state: zeros, and y is the plain oracle's.
            let (y0, _) = oracle(&m, &x, None).unwrap();
            let plain = crate::oracle::dense(&m, &x).unwrap();
            close(&y0, &plain, &format!("{} y from zeros", m.name));
        }
    }

    #[test]
    fn splitting_a_sequence_is_invisible() {
        for m in members() {
            let t_len = 11;
            let x = m.random_inputs(&complete_dims(&m, &dims(t_len)), 9).unwrap();
            let (y, fin) = oracle(&m, &x, None).unwrap();
            for a in [0, 1, 4, 7, 11] {
                let (head, tail) = (segment(&m, &x, 0..a).unwrap(), segment(&m, &x, a..t_len).unwrap());
                let (joined, sb) = split_run(|x, s| oracle(&m, x, s), &head, &tail, None);
                close(&joined, &y, &format!("{} split at {a}", m.name));
                close(&sb[STATE], &fin[STATE], &format!("{} final state split at {a}", m.name));
            }
        }
    }

    /// Central differences of `⟨ȳ, y⟩ + ⟨S̄, S_T⟩` against the reference backward, for the
    /// initial state and every input.
    #[test]
    fn the_state_backward_matches_finite_differences() {
        for m in members() {
            let x = m.random_inputs(&complete_dims(&m, &dims(6)), 3).unwrap();
            let s0 = random_state(2);
            let (y, fin) = oracle(&m, &x, Some(&s0)).unwrap();
            let c = Cotangents::new(&y, &fin, &[STATE]);
            let (g, gs) = oracle_vjp(&m, &x, Some(&s0), &c.dy, Some(&c.d_final), &Requires::All).unwrap();
            let loss = |x: &Tensors<f64>, s: &Tensors<f64>| c.loss(oracle(&m, x, Some(s)).unwrap());
            for ix in [[0, 1, 0, 2], [1, 1, 1, 0]] {
                check_partial(&format!("{} d_S0", m.name), gs[STATE][ix], &s0, STATE, &ix, |s| loss(&x, s));
            }
            check_inputs(&m.name, &g, &x, &["q", "k", "v", "g", "beta"], |x| loss(x, &s0));
        }
    }

    /// A mask that depends on absolute positions (blocks of 4) and on the distance: level 0 for
    /// the token itself, then 1 in the same block, 2 in another block within 5 tokens, 3 beyond.
    fn block_level(t: usize, s: usize) -> usize {
        match (t == s, t / 4 == s / 4, t - s <= 5) {
            (true, ..) => 0,
            (_, true, _) => 1,
            (_, _, true) => 2,
            _ => 3,
        }
    }
    fn block_levels(_t: usize) -> usize {
        4
    }
    /// `λ = raw² · p`, a scheme with a parameter (so `lambda_param` has a gradient).
    fn scaled(raw: f64, p: f64) -> f64 {
        raw * raw * p
    }
    fn d_scaled(raw: f64, p: f64) -> (f64, f64) {
        (2.0 * raw * p, raw * raw)
    }

    /// The three lifts under the block mask, the last with the scaled λ scheme.
    fn cached_lifts() -> Vec<LogLinear> {
        let mask = super::super::LevelMask { name: "block", level: block_level, levels: block_levels };
        let schemes = [
            super::super::LambdaScheme::identity(),
            super::super::LambdaScheme::identity(),
            super::super::LambdaScheme { name: "scaled", map: scaled, grad: Some(d_scaled) },
        ];
        [Base::LinearAttention, Base::Mamba2, Base::GatedDeltaNet]
            .into_iter()
            .zip(schemes)
            .map(|(b, lambda)| {
                let lift = super::super::Lift { mask, lambda };
                LogLinear::new(&format!("loglinear-{}", b.name()), b, Some(lift), 0.7, 4).unwrap()
            })
            .collect()
    }

    fn lift_dims(t: usize, n: usize) -> crate::Dims {
        [("B", 2), ("T", t), ("H", 2), ("Dk", 3), ("Dv", 2), ("L", 4), ("N", n)].into_iter().collect()
    }

    /// Under a mask other than Fenwick a lift's state is the cache of its past tokens: a split
    /// anywhere gives the plain oracle's rows of the whole sequence and the same final cache.
    #[test]
    fn a_lift_under_another_mask_continues_from_its_cache() {
        for m in cached_lifts() {
            let c = cache(&m).unwrap();
            let t_len = 11;
            let mut x = m.random_inputs(&complete_dims(&m, &lift_dims(t_len, t_len)), 3).unwrap();
            if m.lift.is_some_and(|l| l.lambda.name == "scaled") {
                let p = ArrayD::from_shape_fn(IxDyn(&[2, 4]), |i| 0.5 + 0.25 * (i[0] + i[1]) as f64);
                x.insert("lambda_param".into(), p);
            }
            let whole = crate::oracle::dense(&m, &x).unwrap();
            let (y0, f0) = oracle(&m, &x, None).unwrap();
            close(&y0, &whole, &format!("{} from no state", m.name));
            let names: Vec<String> =
                shapes(&m, &lift_dims(t_len, t_len)).unwrap().into_iter().map(|(k, _)| k).collect();
            assert_eq!(names.len(), c.cached.len() + 1, "{}: {names:?}", m.name);
            let empty = crate::state::zeros::<f64>(&shapes(&m, &lift_dims(t_len, t_len)).unwrap());
            for a in [0, 1, 3, 4, 9, 11] {
                let (head, tail) = (segment(&m, &x, 0..a).unwrap(), segment(&m, &x, a..t_len).unwrap());
                let (joined, sb) = split_run(|x, s| oracle(&m, x, s), &head, &tail, Some(&empty));
                close(&joined, &whole, &format!("{} split at {a}", m.name));
                for k in &names {
                    close(&sb[k], &f0[k], &format!("{} final `{k}` split at {a}", m.name));
                }
            }
            // A cache too small for the run is refused, with the sizes.
            let small = crate::state::zeros::<f64>(&shapes(&m, &lift_dims(t_len, t_len - 1)).unwrap());
            let e = oracle(&m, &x, Some(&small)).unwrap_err().to_string();
            assert!(e.contains("N = 10, position 0, T = 11"), "{e}");
        }
    }

    /// Central differences of `⟨ȳ, y⟩ + Σ ⟨S̄, S_T⟩` against the cache's backward, for the
    /// cached tokens, every input and `lambda_param`.
    #[test]
    fn a_lift_cache_backward_matches_finite_differences() {
        for m in cached_lifts() {
            let c = cache(&m).unwrap();
            let d = complete_dims(&m, &lift_dims(5, 10));
            let mut x = m.random_inputs(&d, 4).unwrap();
            if m.lift.is_some_and(|l| l.lambda.name == "scaled") {
                x.insert("lambda_param".into(), ArrayD::from_elem(IxDyn(&[2, 4]), 0.8));
            }
            let s0 = m.random_state(&lift_dims(5, 5), 9).unwrap();
            assert_eq!(s0[POSITION_NAME].as_slice().unwrap(), &[5.0, 2.0], "{}", m.name);
            let (y, fin) = oracle(&m, &x, Some(&s0)).unwrap();
            let cached: Vec<&str> = c.cached.clone();
            let co = Cotangents::new(&y, &fin, &cached);
            let (g, gs) = oracle_vjp(&m, &x, Some(&s0), &co.dy, Some(&co.d_final), &Requires::All).unwrap();
            let loss = |x: &Tensors<f64>, s: &Tensors<f64>| co.loss(oracle(&m, x, Some(s)).unwrap());
            for name in &cached {
                let mut ix = vec![0, 3];
                ix.extend(std::iter::repeat_n(1, s0[*name].ndim() - 2));
                check_partial(
                    &format!("{} d_state.{name}", m.name),
                    gs[*name][ix.as_slice()],
                    &s0,
                    name,
                    &ix,
                    |s| loss(&x, s),
                );
            }
            assert!(gs[POSITION_NAME].iter().all(|&v| v == 0.0));
            check_inputs(&m.name, &g, &x, &["q", "k", "v", "g", "beta", "lambda", "lambda_param"], |x| {
                loss(x, &s0)
            });
        }
    }
}
