//! The recurrent state of the log-linear lifts (docs/math.md §7.1): the Fenwick level states of
//! the decoder (docs/math.md §2.5) and the position, its literal recurrence in any [`Real`]
//! (forward and reverse mode), and the `f64` reference built on it.
//!
//! **Layout.** After a prefix of `a` tokens the state is
//! - `S [B, H, L, Dv, Dk]`: slot `i` is the level state `S^(i+1)` *of the next token* `a`, i.e.
//!   the decayed sum `Σ_s Φ_{s+1..a−1}`-transported `β_s v_s k_sᵀ` over the bucket
//!   `{ s < a : bitlen(a ⊕ s) = i + 1 }` — the `2^i` positions `p … p + 2^i − 1`,
//!   `p = ⌊a / 2^(i+1)⌋ · 2^(i+1)`, non-empty exactly when bit `i` of `a` is set. Level 0 of the
//!   next token is always empty (it is the token itself), so it has no slot. `L` is the level
//!   axis of `lambda`; the sum of the slots is the base mixer's state `S_a`.
//! - `position [B]`: `a` per batch row (an integer stored in the state's scalar type; a run
//!   whose final position passes `2^24` in `f32` (`2^53` in `f64`) is refused).
//!
//! This is the decoder's level array after the Fenwick merge for token `a` (step 1 of §2.5
//! done ahead): the decoder started from it takes no merge at `a` (levels `0 … ctz(a)` are
//! empty), and a run of `x[a:b]` from it equals rows `a..b` of the run of `x[0:b]`. A run of
//! `T` tokens from position `a` reads levels up to `bitlen(a + T − 1)` and ends with slots up
//! to `bitlen(a + T) − 1`, so it needs `L ≥ L(a + T) = bitlen(a + T − 1) + 1`
//! ([`positions`] refuses it otherwise, and a slot that must be empty but is not).
//!
//! **Recurrence** ([`run_tokens`]): per token `t`, every level takes the transition, the token
//! enters level 0 (`β_t v_t k_tᵀ`), the read is `y_t = σ Σ_ℓ λ_t^(ℓ) S^(ℓ) q_t`, then the
//! merge for token `t + 1` adds levels `0 … m` (`m = ctz(t + 1)`) into level `m + 1`. Its
//! reverse mode is [`vjp_tokens`].

use ndarray::{ArrayD, Axis, IxDyn};

use super::{Base, LogLinear, STATE};
use crate::error::{Error, Result, fmt_shape};
use crate::fenwick::{bitlen, merge_level, num_levels};
use crate::grad::{Requires, grad_name};
use crate::real::{Real, dot8};
use crate::state::StateShapes;
use crate::tensor::{Tensors, get};

/// The name of the position tensor of a lift's state.
pub use crate::state::POSITION;

/// The state's shapes: `S [B, H, L, Dv, Dk]` and `position [B]`.
pub(crate) fn shapes(dims: &crate::Dims) -> std::result::Result<StateShapes, String> {
    let size = |s: &str| dims.get(s).copied().ok_or_else(|| format!("size `{s}` is unbound"));
    let b = size("B")?;
    Ok(vec![
        (STATE.into(), vec![b, size("H")?, size("L")?, size("Dv")?, size("Dk")?]),
        (POSITION.into(), vec![b]),
    ])
}

/// The positions of a lift's state for a run of `t_len` tokens, per batch row, after checking
/// them: whole numbers `≥ 0`, `L ≥ L(a + T)` for the state's `L` slots, and every slot `i`
/// with bit `i` of the position clear holding zeros (such a level is empty after that many
/// tokens). The tensors' names and shapes are checked by [`crate::state::check_state`].
pub fn positions<F: Real>(state: &Tensors<F>, t_len: usize) -> Result<Vec<usize>> {
    let nb = get(state, POSITION)?.len();
    positions_each(state, &vec![t_len; nb])
}

/// [`positions`] with a run of `lens[b]` tokens from row `b` (the sequences of a packed batch,
/// one state row each); `lens` has one entry per row.
pub fn positions_each<F: Real>(state: &Tensors<F>, lens: &[usize]) -> Result<Vec<usize>> {
    let s = get(state, STATE)?;
    let p = get(state, POSITION)?;
    if s.ndim() != 5 || p.shape() != [s.shape()[0]] {
        return Err(Error::shape(
            "state",
            "S [B, H, L, Dv, Dk] and position [B]",
            format!("S {}, position {}", fmt_shape(s.shape()), fmt_shape(p.shape())),
        ));
    }
    let slots = s.shape()[2];
    let pos = level_positions(p, slots, lens)?;
    for (b, &a) in pos.iter().enumerate() {
        for i in 0..slots {
            if (a >> i) & 1 == 0 && !is_zero(s.slice(ndarray::s![b, .., i, .., ..])) {
                return Err(Error::Value {
                    name: format!("state.{STATE}[{b}, :, {i}]"),
                    constraint: format!(
                        "slot {i} holds level {} of the next token, empty at position {a} (bit {i} \
                         of {a} is 0), so it must be zero",
                        i + 1
                    ),
                    found: "non-zero entries".into(),
                });
            }
        }
    }
    Ok(pos)
}

/// The positions `p [B]` of a lift's state with `slots` level slots for a run of `lens[b]` tokens
/// from row `b`, after the checks of [`positions_each`] that read the positions alone: whole
/// numbers `≥ 0` and `L ≥ L(a + T)`. The CUDA backend reads only the positions of a state on
/// device tensors back (the slots stay on the device, unchecked).
pub fn level_positions<F: Real>(p: &ArrayD<F>, slots: usize, lens: &[usize]) -> Result<Vec<usize>> {
    let pos = crate::state::positions_each(p, lens)?;
    for (b, (&a, &t_len)) in pos.iter().zip(lens).enumerate() {
        let need = num_levels(a + t_len);
        if need > slots {
            return Err(Error::Value {
                name: format!("state.{POSITION}[{b}]"),
                constraint: format!(
                    "a run of {t_len} tokens from position {a} uses Fenwick levels up to {}, so \
                     lambda and the state need L ≥ L({}) = {need} levels",
                    need - 1,
                    a + t_len
                ),
                found: format!("L = {slots}, position {a}"),
            });
        }
    }
    Ok(pos)
}

/// Whether every entry of `slot` (`[H, Dv, Dk]`) is zero; each head's `Dv × Dk` block read as
/// one slice where it is contiguous.
fn is_zero<F: Real>(slot: ndarray::ArrayView3<'_, F>) -> bool {
    // Blocks of 64 tested without a branch per entry (so that the test vectorises).
    let zero = |x: &[F]| !x.chunks(64).any(|c| c.iter().fold(false, |nz, &v| nz | (v != F::zero())));
    slot.outer_iter().all(|blk| match blk.as_slice() {
        Some(x) => zero(x),
        None => blk.iter().all(|&v| v == F::zero()),
    })
}

/// Zeroes the slots of a state-shaped `S [B, H, L, Dv, Dk]` that are empty at the positions
/// `pos` (bit `i` of the row's position clear). The initial state's gradient lives in the same
/// subspace as the state: those slots are not free (a state with entries there is refused).
pub fn project<F: Real>(s: &mut ArrayD<F>, pos: &[usize]) {
    for (mut row, &p) in s.outer_iter_mut().zip(pos) {
        for mut head in row.outer_iter_mut() {
            for (i, mut slot) in head.outer_iter_mut().enumerate() {
                if (p >> i) & 1 == 0 {
                    slot.fill(F::zero());
                }
            }
        }
    }
}

/// Moves a lift's state `s` to the positions `pos` (one per batch row): its slots that are empty
/// there zeroed ([`project`]) and `position` set, so that it is a valid state at them whatever
/// values its live slots hold.
pub fn at_positions<F: Real>(s: &mut Tensors<F>, pos: &[usize]) -> Result<()> {
    let st = s.get_mut(STATE).ok_or_else(|| Error::Numerical("no state tensor".into()))?;
    project(st, pos);
    s.insert(POSITION.into(), crate::state::position_tensor(pos));
    Ok(())
}

/// One head's tokens, row-major: `q, k` (`T·Dk`), `v` (`T·Dv`), `g` (`T`, log-decays; zeros
/// without a decay), `beta` (`T`; ones without the delta rule), `lam` (`T·nl`, the λ weights
/// after the scheme).
pub struct Tokens<'a, F> {
    /// Queries.
    pub q: &'a [F],
    /// Keys.
    pub k: &'a [F],
    /// Values.
    pub v: &'a [F],
    /// Log-decays.
    pub g: &'a [f64],
    /// Delta-rule strengths.
    pub beta: &'a [F],
    /// λ weights.
    pub lam: &'a [F],
    /// `Dk`.
    pub dk: usize,
    /// `Dv`.
    pub dv: usize,
    /// λ levels per token.
    pub nl: usize,
}

impl<F> Tokens<'_, F> {
    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.g.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.g.is_empty()
    }
}

/// The level states of one head: `levels[ℓ]` is `S^(ℓ)` (`Dv × Dk`, row-major), `ℓ = 0 … L`.
pub type Levels<F> = Vec<Vec<F>>;

/// The gradients of one head's tokens, laid out as [`Tokens`].
pub struct TokenGrads<F> {
    /// `q̄`.
    pub dq: Vec<F>,
    /// `k̄`.
    pub dk: Vec<F>,
    /// `v̄`.
    pub dv: Vec<F>,
    /// `ḡ`.
    pub dg: Vec<F>,
    /// `β̄` (zero without the delta rule).
    pub dbeta: Vec<F>,
    /// `λ̄` of the weights.
    pub dlam: Vec<F>,
}

/// The levels of one head of a state `S [B, H, L, Dv, Dk]` (level 0 empty, level `i + 1` from
/// slot `i`).
pub fn load<F: Real>(s: &ArrayD<F>, b: usize, h: usize) -> Levels<F> {
    let (dv, dk) = (s.shape()[3], s.shape()[4]);
    let head = s.index_axis(Axis(0), b);
    let head = head.index_axis(Axis(0), h);
    // Level `i + 1` is slot `i`, row-major `Dv × Dk` (one slice copy where it is contiguous).
    std::iter::once(vec![F::zero(); dv * dk])
        .chain(head.outer_iter().map(|slot| match slot.as_slice() {
            Some(x) => x.to_vec(),
            None => slot.iter().copied().collect(),
        }))
        .collect()
}

/// Writes the levels `1 …` of one head into slots `0 …` of `S [B, H, L, Dv, Dk]` (slots past
/// the levels given are zeroed); an error when level 0 or a level beyond the slots holds a
/// state.
pub fn store<F: Real>(s: &mut ArrayD<F>, b: usize, h: usize, levels: &Levels<F>) -> Result<()> {
    let mut head = s.index_axis_mut(Axis(0), b);
    let mut head = head.index_axis_mut(Axis(0), h);
    match head.as_slice_mut() {
        Some(dst) => store_slots(dst, levels),
        None => {
            let mut flat = vec![F::zero(); head.len()];
            store_slots(&mut flat, levels)?;
            head.iter_mut().zip(flat).for_each(|(d, x)| *d = x);
            Ok(())
        }
    }
}

/// [`store`] into one head's slots given as one slice (`[L, Dv, Dk]` in standard order, `L` the
/// number of slots: `dst.len() / (Dv·Dk)` for the levels' `Dv·Dk`).
pub fn store_slots<F: Real>(dst: &mut [F], levels: &Levels<F>) -> Result<()> {
    let width = levels.first().map_or(0, Vec::len);
    let nl = dst.len().checked_div(width).unwrap_or(0);
    if width > 0 {
        for (i, slot) in dst.chunks_exact_mut(width).enumerate() {
            match levels.get(i + 1) {
                Some(st) => slot.copy_from_slice(st),
                None => slot.fill(F::zero()),
            }
        }
    }
    for (l, st) in levels.iter().enumerate() {
        if (l == 0 || l > nl) && st.iter().any(|&x| x != F::zero()) {
            return Err(Error::Numerical(format!(
                "level {l} holds a state after the merge, but the state has slots for levels 1 … \
                 {nl} only"
            )));
        }
    }
    Ok(())
}

/// `S k` row by row (`S` is `Dv × Dk` row-major).
fn gdn_rows<F: Real>(st: &[F], k: &[F], dv: usize, dk: usize) -> Vec<F> {
    (0..dv).map(|r| dot8(&st[r * dk..(r + 1) * dk], k)).collect()
}

/// The transition of one token on one level: Mamba-2 `S ← e^g S`, gated DeltaNet
/// `S ← e^g S (I − β k kᵀ)`, linear attention nothing.
fn transition<F: Real>(base: Base, st: &mut [F], k: &[F], decay: F, bt: F, dv: usize, dk: usize) {
    match base {
        Base::LinearAttention => {}
        Base::Mamba2 => st.iter_mut().for_each(|x| *x *= decay),
        Base::GatedDeltaNet => {
            let u = gdn_rows(st, k, dv, dk);
            for r in 0..dv {
                for c in 0..dk {
                    st[r * dk + c] = decay * (st[r * dk + c] - bt * u[r] * k[c]);
                }
            }
        }
    }
}

/// The merge for token `t` (docs/math.md §2.5 step 1) on dense levels.
fn merge<F: Real>(levels: &mut Levels<F>, t: usize) {
    let Some(m) = merge_level(t) else { return };
    let n = levels.first().map_or(0, Vec::len);
    if levels.len() < m + 2 {
        levels.resize(m + 2, vec![F::zero(); n]);
    }
    let (lo, hi) = levels.split_at_mut(m + 1);
    for st in lo.iter_mut() {
        hi[0].iter_mut().zip(st.iter_mut()).for_each(|(d, s)| {
            *d += *s;
            *s = F::zero();
        });
    }
}

/// The strength `β_t` the recurrence uses (1 without the delta rule).
fn strength<F: Real>(base: Base, x: &Tokens<'_, F>, i: usize) -> F {
    if base == Base::GatedDeltaNet { x.beta[i] } else { F::one() }
}

/// Runs the literal recurrence of a lift (module documentation) over the tokens `x`, the
/// first at position `pos`, from the merged-ahead `levels` (left as the merged-ahead levels
/// of position `pos + T`); writes `y` (`T·Dv`). With `trace`, the levels before each token's
/// transition are pushed to it (for [`vjp_tokens`]).
pub fn run_tokens<F: Real>(
    m: &LogLinear,
    x: &Tokens<'_, F>,
    pos: usize,
    levels: &mut Levels<F>,
    y: &mut [F],
    mut trace: Option<&mut Vec<Levels<F>>>,
) -> Result<()> {
    let (dk, dv, nl) = (x.dk, x.dv, x.nl);
    let scale = F::of(m.scale);
    if levels.is_empty() {
        levels.push(vec![F::zero(); dv * dk]);
    }
    for i in 0..x.len() {
        if let Some(tr) = trace.as_mut() {
            tr.push(levels.clone());
        }
        let (q, k, v) = (&x.q[i * dk..(i + 1) * dk], &x.k[i * dk..(i + 1) * dk], &x.v[i * dv..(i + 1) * dv]);
        let decay = F::of(if m.base.has_decay() { x.g[i].exp() } else { 1.0 });
        let bt = strength(m.base, x, i);
        for st in levels.iter_mut() {
            transition(m.base, st, k, decay, bt, dv, dk);
        }
        for r in 0..dv {
            for c in 0..dk {
                levels[0][r * dk + c] += bt * v[r] * k[c];
            }
        }
        let yt = &mut y[i * dv..(i + 1) * dv];
        yt.iter_mut().for_each(|a| *a = F::zero());
        for (l, st) in levels.iter().enumerate() {
            if l >= nl {
                if st.iter().any(|&a| a != F::zero()) {
                    return Err(m.level_error(pos + i, pos + i, l, nl));
                }
                continue;
            }
            let w = scale * x.lam[i * nl + l];
            for r in 0..dv {
                yt[r] += w * dot8(&st[r * dk..(r + 1) * dk], q);
            }
        }
        merge(levels, pos + i + 1);
    }
    Ok(())
}

/// The reverse mode of [`run_tokens`] from the levels `initial` at position `pos`: from the
/// cotangents `dy` (`T·Dv`) and `d_levels` (the adjoint of the final levels, replaced by the
/// adjoint of the initial levels), the gradients of the tokens.
pub fn vjp_tokens<F: Real>(
    m: &LogLinear,
    x: &Tokens<'_, F>,
    pos: usize,
    initial: &Levels<F>,
    dy: &[F],
    d_levels: &mut Levels<F>,
) -> Result<TokenGrads<F>> {
    let (dk, dv, nl, n) = (x.dk, x.dv, x.nl, x.len());
    let scale = F::of(m.scale);
    let mut levels = initial.clone();
    let mut trace = Vec::with_capacity(n);
    let mut y = vec![F::zero(); n * dv];
    run_tokens(m, x, pos, &mut levels, &mut y, Some(&mut trace))?;
    let z = F::zero();
    let mut gr = TokenGrads {
        dq: vec![z; n * dk],
        dk: vec![z; n * dk],
        dv: vec![z; n * dv],
        dg: vec![z; n],
        dbeta: vec![z; n],
        dlam: vec![z; n * nl],
    };
    let width = dv * dk;
    for (i, pre) in trace.into_iter().enumerate().rev() {
        let (q, k, v) = (&x.q[i * dk..(i + 1) * dk], &x.k[i * dk..(i + 1) * dk], &x.v[i * dv..(i + 1) * dv]);
        let decay = F::of(if m.base.has_decay() { x.g[i].exp() } else { 1.0 });
        let bt = strength(m.base, x, i);
        let gy = &dy[i * dv..(i + 1) * dv];
        // Forward values of this token: after the transition (post) and after the insert.
        let mut post = pre.clone();
        for st in post.iter_mut() {
            transition(m.base, st, k, decay, bt, dv, dk);
        }
        let mut ins = post.clone();
        for r in 0..dv {
            for c in 0..dk {
                ins[0][r * dk + c] += bt * v[r] * k[c];
            }
        }
        // Merge for t + 1: level m + 1 received levels 0 … m.
        let nlev = ins.len().max(d_levels.len());
        d_levels.resize(nlev, vec![z; width]);
        if let Some(mg) = merge_level(pos + i + 1)
            && d_levels.len() < mg + 2
        {
            d_levels.resize(mg + 2, vec![z; width]);
        }
        let mut dz = d_levels.clone();
        if let Some(mg) = merge_level(pos + i + 1) {
            let top = d_levels[mg + 1].clone();
            for slot in &mut dz[..=mg] {
                slot.clone_from(&top);
            }
        }
        // Read y = σ Σ_ℓ λ^(ℓ) S^(ℓ) q.
        for (l, st) in ins.iter().enumerate().take(nl) {
            let w = scale * x.lam[i * nl + l];
            let mut dl = z;
            for r in 0..dv {
                let sq = dot8(&st[r * dk..(r + 1) * dk], q);
                dl += gy[r] * sq;
                for c in 0..dk {
                    dz[l][r * dk + c] += w * gy[r] * q[c];
                    gr.dq[i * dk + c] += w * st[r * dk + c] * gy[r];
                }
            }
            gr.dlam[i * nl + l] = scale * dl;
        }
        // Insert S^(0) += β v kᵀ.
        for r in 0..dv {
            for c in 0..dk {
                let d = dz[0][r * dk + c];
                gr.dv[i * dv + r] += bt * d * k[c];
                gr.dk[i * dk + c] += bt * d * v[r];
                if m.base == Base::GatedDeltaNet {
                    gr.dbeta[i] += d * v[r] * k[c];
                }
            }
        }
        // Transition, level by level.
        for (l, d) in dz.iter_mut().enumerate() {
            let Some(x_pre) = pre.get(l) else {
                d.iter_mut().for_each(|a| *a = z);
                continue;
            };
            if m.base.has_decay() {
                gr.dg[i] += d.iter().zip(&post[l]).fold(z, |a, (&p, &q)| a + p * q);
            }
            match m.base {
                Base::LinearAttention => {}
                Base::Mamba2 => d.iter_mut().for_each(|a| *a *= decay),
                Base::GatedDeltaNet => {
                    // post = e^g (X − β (X k) kᵀ); d = ∂/∂post.
                    let u = gdn_rows(x_pre, k, dv, dk);
                    let dk_row = gdn_rows(d, k, dv, dk);
                    for r in 0..dv {
                        gr.dbeta[i] -= decay * dk_row[r] * u[r];
                        for c in 0..dk {
                            // −e^g β [Xᵀ (D k) + Dᵀ (X k)].
                            gr.dk[i * dk + c] -=
                                decay * bt * (x_pre[r * dk + c] * dk_row[r] + d[r * dk + c] * u[r]);
                        }
                    }
                    for r in 0..dv {
                        for c in 0..dk {
                            d[r * dk + c] = decay * (d[r * dk + c] - bt * dk_row[r] * k[c]);
                        }
                    }
                }
            }
        }
        *d_levels = dz;
    }
    Ok(gr)
}

/// One head's inputs as owned row-major vectors (`dims`: `(Dk, Dv, L)`), the storage that
/// [`TokenRows::tokens`] lends as [`Tokens`]; the CPU fast form builds it from its own rows.
pub struct TokenRows<F> {
    /// Queries, `T × Dk`.
    pub q: Vec<F>,
    /// Keys, `T × Dk`.
    pub k: Vec<F>,
    /// Values, `T × Dv`.
    pub v: Vec<F>,
    /// Log-decays, `T`.
    pub g: Vec<f64>,
    /// Delta-rule strengths, `T`.
    pub beta: Vec<F>,
    /// λ weights, `T × L`.
    pub lam: Vec<F>,
    /// `(Dk, Dv, L)`.
    pub dims: (usize, usize, usize),
}

impl<F> TokenRows<F> {
    /// The rows as the [`Tokens`] that [`run_tokens`] and [`vjp_tokens`] read.
    pub fn tokens(&self) -> Tokens<'_, F> {
        let (dk, dv, nl) = self.dims;
        Tokens {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
            lam: &self.lam,
            dk,
            dv,
            nl,
        }
    }
}

/// The inputs of head `h` of batch row `b` of `x` (`lam`: the λ weights `[B, T, H, L]`).
fn owned<F: Real>(
    m: &LogLinear,
    x: &Tensors<F>,
    lam: &ArrayD<F>,
    b: usize,
    h: usize,
) -> Result<TokenRows<F>> {
    let row = |a: &ArrayD<F>| -> Vec<F> { a.slice(ndarray::s![b, .., h, ..]).iter().copied().collect() };
    let t_len = get(x, "q")?.shape()[1];
    let scalar = |name: &str, default: f64| -> Result<Vec<F>> {
        Ok(match x.get(name) {
            Some(a) => a.slice(ndarray::s![b, .., h]).iter().copied().collect(),
            None => vec![F::of(default); t_len],
        })
    };
    let (dk, dv, nl) = (get(x, "q")?.shape()[3], get(x, "v")?.shape()[3], lam.shape()[3]);
    Ok(TokenRows {
        q: row(get(x, "q")?),
        k: row(get(x, "k")?),
        v: row(get(x, "v")?),
        g: if m.base.has_decay() {
            scalar("g", 0.0)?.iter().map(|a| a.f64()).collect()
        } else {
            vec![0.0; t_len]
        },
        beta: scalar("beta", 1.0)?,
        lam: row(lam),
        dims: (dk, dv, nl),
    })
}

/// The sizes `(B, T, H, Dk, Dv, L)` of a lift's inputs.
fn sizes<F: Real>(x: &Tensors<F>) -> Result<(usize, usize, usize, usize, usize, usize)> {
    let q = get(x, "q")?.shape();
    let dv = get(x, "v")?.shape()[3];
    let nl = get(x, "lambda")?.shape()[3];
    Ok((q[0], q[1], q[2], q[3], dv, nl))
}

/// A lift's run from a state by the literal recurrence, in `F`: `y` and the final state
/// (`None`: a zero state at position 0).
pub fn run<F: Real>(
    m: &LogLinear,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    let (nb, t_len, nh, dk, dv, nl) = sizes(x)?;
    let lam = m.lambda_weights(get(x, "lambda")?, x.get("lambda_param"))?;
    let pos = match initial {
        Some(s) => positions(s, t_len)?,
        None => vec![0; nb],
    };
    if let Some(&a) = pos.iter().find(|&&a| num_levels(a + t_len) > nl) {
        return Err(m.level_error(a + t_len - 1, 0, bitlen(a + t_len - 1), nl));
    }
    let mut y = ArrayD::<F>::zeros(IxDyn(&[nb, t_len, nh, dv]));
    let mut fin = ArrayD::<F>::zeros(IxDyn(&[nb, nh, nl, dv, dk]));
    for b in 0..nb {
        for h in 0..nh {
            let o = owned(m, x, &lam, b, h)?;
            let mut levels = match initial {
                Some(s) => load(get(s, STATE)?, b, h),
                None => vec![vec![F::zero(); dv * dk]; nl + 1],
            };
            let mut yh = vec![F::zero(); t_len * dv];
            run_tokens(m, &o.tokens(), pos[b], &mut levels, &mut yh, None)?;
            for t in 0..t_len {
                for r in 0..dv {
                    y[[b, t, h, r]] = yh[t * dv + r];
                }
            }
            store(&mut fin, b, h, &levels)?;
        }
    }
    let fin_pos =
        ArrayD::from_shape_vec(IxDyn(&[nb]), pos.iter().map(|&a| F::of((a + t_len) as f64)).collect())
            .map_err(|e| Error::Numerical(e.to_string()))?;
    Ok((y, [(STATE.to_string(), fin), (POSITION.to_string(), fin_pos)].into_iter().collect()))
}

/// The reverse mode of [`run`]: the gradients `d_<input>` (those in `requires`) and of the
/// initial state (`S`, zero in the slots that must be empty ([`project`]), and a zero
/// `position`: it is an index, not a value), from the
/// cotangents `dy` and `d_final` (`None`: zero; its `position` is not read).
pub fn vjp<F: Real>(
    m: &LogLinear,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    dy: &ArrayD<F>,
    d_final: Option<&Tensors<F>>,
    requires: &Requires,
) -> Result<(Tensors<F>, Tensors<F>)> {
    let (nb, t_len, nh, dk, dv, nl) = sizes(x)?;
    if dy.shape() != [nb, t_len, nh, dv] {
        return Err(Error::shape("dy", format!("[{nb}, {t_len}, {nh}, {dv}]"), fmt_shape(dy.shape())));
    }
    let raw = get(x, "lambda")?;
    let param = x.get("lambda_param");
    let lam = m.lambda_weights(raw, param)?;
    let pos = match initial {
        Some(s) => positions(s, t_len)?,
        None => vec![0; nb],
    };
    let df = d_final.map(|d| get(d, STATE)).transpose()?;
    if let Some(d) = df
        && d.shape() != [nb, nh, nl, dv, dk]
    {
        return Err(Error::shape(
            format!("d_final_state.{STATE}"),
            format!("[{nb}, {nh}, {nl}, {dv}, {dk}]"),
            fmt_shape(d.shape()),
        ));
    }
    let mut dq = ArrayD::<F>::zeros(IxDyn(&[nb, t_len, nh, dk]));
    let mut dkk = dq.clone();
    let mut dvv = ArrayD::<F>::zeros(IxDyn(&[nb, t_len, nh, dv]));
    let mut dg = ArrayD::<F>::zeros(IxDyn(&[nb, t_len, nh]));
    let mut db = dg.clone();
    let mut dlam = ArrayD::<F>::zeros(IxDyn(&[nb, t_len, nh, nl]));
    let mut ds = ArrayD::<F>::zeros(IxDyn(&[nb, nh, nl, dv, dk]));
    for b in 0..nb {
        for h in 0..nh {
            let o = owned(m, x, &lam, b, h)?;
            let levels = match initial {
                Some(s) => load(get(s, STATE)?, b, h),
                None => vec![vec![F::zero(); dv * dk]; nl + 1],
            };
            let mut d_levels = match df {
                Some(d) => load(d, b, h),
                None => vec![vec![F::zero(); dv * dk]; nl + 1],
            };
            let dyh: Vec<F> = dy.slice(ndarray::s![b, .., h, ..]).iter().copied().collect();
            let g = vjp_tokens(m, &o.tokens(), pos[b], &levels, &dyh, &mut d_levels)?;
            for t in 0..t_len {
                for c in 0..dk {
                    dq[[b, t, h, c]] = g.dq[t * dk + c];
                    dkk[[b, t, h, c]] = g.dk[t * dk + c];
                }
                for r in 0..dv {
                    dvv[[b, t, h, r]] = g.dv[t * dv + r];
                }
                dg[[b, t, h]] = g.dg[t];
                db[[b, t, h]] = g.dbeta[t];
                for l in 0..nl {
                    dlam[[b, t, h, l]] = g.dlam[t * nl + l];
                }
            }
            // The adjoint of level 0 is dropped: the state has no slot for it (it is empty).
            d_levels[0].iter_mut().for_each(|a| *a = F::zero());
            d_levels.truncate(nl + 1);
            store(&mut ds, b, h, &d_levels)?;
        }
    }
    let mut grads = Tensors::new();
    let mut put = |name: &str, a: ArrayD<F>| {
        if requires.wants(name) && x.contains_key(name) {
            grads.insert(grad_name(name), a);
        }
    };
    put("q", dq);
    put("k", dkk);
    put("v", dvv);
    put("g", dg);
    put("beta", db);
    let (d_raw, d_param) = m.lambda_vjp(raw, param, &dlam)?;
    put("lambda", d_raw);
    if let Some(dp) = d_param {
        put("lambda_param", dp);
    }
    let mut d_state = Tensors::new();
    if initial.is_some() {
        project(&mut ds, &pos);
        d_state.insert(STATE.to_string(), ds);
        d_state.insert(POSITION.to_string(), ArrayD::zeros(IxDyn(&[nb])));
    }
    Ok((grads, d_state))
}

/// A random valid state for `dims` (entries of `S` from `fill`, then zeroed in the slots that
/// must be empty): row `b` at a position in `1 … 2^(L−1) − T` (0 when that range is empty),
/// different rows at different positions, so a run of `T` tokens fits the `L` levels.
pub(crate) fn random_state(dims: &crate::Dims, mut s: Tensors<f64>) -> Result<Tensors<f64>> {
    let t_len = dims.get("T").copied().unwrap_or(1);
    let nl = get(&s, STATE)?.shape()[2];
    let span = (1usize << nl.saturating_sub(1).min(40)).saturating_sub(t_len);
    let nb = get(&s, POSITION)?.len();
    let pos: Vec<usize> = (0..nb).map(|b| if span == 0 { 0 } else { 1 + (b * 7 + 5) % span }).collect();
    at_positions(&mut s, &pos)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mixer::{Mixer, complete_dims};
    use crate::mixers::loglinear::{LambdaScheme, LevelMask, Lift};
    use crate::mixers::state_check::{Cotangents, check_partial, close, middle};
    use crate::state::segment;
    use ndarray::Axis;

    fn dims(t: usize) -> crate::Dims {
        [("B", 2), ("T", t), ("H", 2), ("Dk", 3), ("Dv", 2), ("L", 6)].into_iter().collect()
    }

    fn members() -> Vec<LogLinear> {
        let lift = Lift { mask: LevelMask::fenwick(), lambda: LambdaScheme::identity() };
        [Base::LinearAttention, Base::Mamba2, Base::GatedDeltaNet]
            .into_iter()
            .map(|b| LogLinear::new(b.name(), b, Some(lift), 0.7, 4).unwrap())
            .collect()
    }

    fn inputs(m: &LogLinear, t: usize, seed: u64) -> Tensors<f64> {
        m.random_inputs(&complete_dims(m, &dims(t)), seed).unwrap()
    }

    /// From a zero state the recurrence is the plain oracle of the lift, and the slots of the
    /// final state sum to the base mixer's final state (its own reference, §7.1).
    #[test]
    fn the_recurrence_from_zeros_is_the_plain_oracle() {
        for m in members() {
            let x = inputs(&m, 13, 4);
            let (y, fin) = run(&m, &x, None).unwrap();
            let plain = crate::oracle::dense(&m, &x).unwrap();
            close(&y, &plain, &format!("{} y", m.name));
            assert!(fin[POSITION].iter().all(|&p| p == 13.0));
            let base = LogLinear::new(m.base.name(), m.base, None, 0.7, 4).unwrap();
            let mut xb = x.clone();
            xb.remove("lambda");
            let (_, sb) = base.state_oracle(&xb, None).unwrap();
            let sum = fin[STATE].sum_axis(Axis(2));
            close(&sum, &sb[STATE], &format!("{} Σ slots = base state", m.name));
        }
    }

    /// A position the scalar type cannot hold exactly (after the run) is refused, not rounded.
    #[test]
    fn positions_past_the_exact_integers_are_refused() {
        let state = |p: f32| -> Tensors<f32> {
            [
                (STATE.to_string(), ndarray::ArrayD::zeros(vec![1, 1, 30, 1, 1])),
                (POSITION.to_string(), ndarray::arr1(&[p]).into_dyn()),
            ]
            .into_iter()
            .collect()
        };
        // 2^24 − 4 is a valid position: slots of bits 2..23 set are zero here, so only the bound matters.
        let ok = positions(&state((1 << 24) as f32 - 4.0), 4);
        assert!(ok.is_ok(), "{ok:?}");
        let e = positions(&state((1 << 24) as f32 - 4.0), 5).unwrap_err().to_string();
        assert!(e.contains("2^24"), "{e}");
    }

    /// Splitting at every point, and twice, gives rows of the whole run and its final state.
    #[test]
    fn splitting_at_every_point_is_invisible() {
        for m in members() {
            let t_len = 19;
            let x = inputs(&m, t_len, 9);
            let plain = crate::oracle::dense(&m, &x).unwrap();
            let (_, fin) = run(&m, &x, None).unwrap();
            for a in 0..=t_len {
                let (ya, sa) = run(&m, &segment(&m, &x, 0..a).unwrap(), None).unwrap();
                let mid = (a + t_len) / 2;
                let (yb, sb) = run(&m, &segment(&m, &x, a..mid).unwrap(), Some(&sa)).unwrap();
                let (yc, sc) = run(&m, &segment(&m, &x, mid..t_len).unwrap(), Some(&sb)).unwrap();
                let joined = ndarray::concatenate(Axis(1), &[ya.view(), yb.view(), yc.view()]).unwrap();
                close(&joined, &plain, &format!("{} split at {a}, {mid}", m.name));
                close(&sc[STATE], &fin[STATE], &format!("{} final state split at {a}", m.name));
                close(&sc[POSITION], &fin[POSITION], "position");
            }
        }
    }

    /// From zeros (no final cotangent) the reverse mode is the materialized backward.
    #[test]
    fn the_reverse_mode_from_zeros_is_the_materialized_backward() {
        for m in members() {
            let x = inputs(&m, 10, 2);
            let (y, _) = run(&m, &x, None).unwrap();
            let dy = y.mapv(|a| (a * 2.3).sin());
            let (g, ds) = vjp(&m, &x, None, &dy, None, &Requires::All).unwrap();
            assert!(ds.is_empty());
            let want = crate::grad::materialized_backward(&m, &x, &dy, &Requires::All).unwrap();
            for (k, w) in &want {
                close(&g[k], w, &format!("{} {k}", m.name));
            }
        }
    }

    /// Central differences of `⟨ȳ, y⟩ + ⟨S̄, S_T⟩` against the reverse mode, for the initial
    /// state and every input (λ included), from a state at a position with several levels.
    #[test]
    fn the_state_backward_matches_finite_differences() {
        for m in members() {
            let t_len = 7;
            let d = complete_dims(&m, &dims(t_len));
            let x = inputs(&m, t_len, 3);
            let s0 = m.random_state(&d, 5).unwrap();
            assert!(s0[POSITION].iter().all(|&p| p >= 1.0));
            let (y, fin) = run(&m, &x, Some(&s0)).unwrap();
            let c = Cotangents::new(&y, &fin, &[STATE]);
            // The final position's cotangent is passed and not read.
            let mut dfin = c.d_final.clone();
            dfin.insert(POSITION.to_string(), fin[POSITION].clone());
            let (g, gs) = vjp(&m, &x, Some(&s0), &c.dy, Some(&dfin), &Requires::All).unwrap();
            let loss = |x: &Tensors<f64>, s: &Tensors<f64>| c.loss(run(&m, x, Some(s)).unwrap());
            let pos = positions(&s0, t_len).unwrap();
            let mut checked = 0;
            for b in 0..2 {
                for i in 0..6 {
                    if (pos[b] >> i) & 1 == 0 {
                        continue;
                    }
                    let ix = [b, 1, i, 1, 2];
                    check_partial(&format!("{} d_S0", m.name), gs[STATE][ix], &s0, STATE, &ix, |s| {
                        loss(&x, s)
                    });
                    checked += 1;
                }
            }
            assert!(checked >= 2, "positions {pos:?} leave too few levels to check");
            for name in ["q", "k", "v", "g", "beta", "lambda"] {
                let Some(a) = x.get(name) else { continue };
                for ix in [middle(a), vec![0; a.ndim()]] {
                    let (what, got) = (format!("{} {name}", m.name), g[&grad_name(name)][ix.as_slice()]);
                    check_partial(&what, got, &x, name, &ix, |x| loss(x, &s0));
                }
            }
        }
    }

    /// Positions that are not whole, runs beyond the levels, and levels that must be empty.
    #[test]
    fn wrong_states_are_refused_with_what_was_given() {
        let m = &members()[1];
        let d = complete_dims(m, &dims(5));
        let x = inputs(m, 5, 1);
        let s0 = m.random_state(&d, 2).unwrap();
        let mut bad = s0.clone();
        bad.get_mut(POSITION).unwrap()[0] = 2.5;
        let e = run(m, &x, Some(&bad)).unwrap_err().to_string();
        assert!(e.contains("position[0]") && e.contains("2.5"), "{e}");
        let mut far = s0.clone();
        far.get_mut(POSITION).unwrap()[1] = 30.0;
        far.get_mut(STATE).unwrap().fill(0.0);
        let e = run(m, &x, Some(&far)).unwrap_err().to_string();
        assert!(e.contains("L(35) = 7") && e.contains("L = 6"), "{e}");
        let mut full = s0.clone();
        full.get_mut(POSITION).unwrap()[0] = 4.0;
        full.get_mut(STATE).unwrap().fill(0.5);
        let e = run(m, &x, Some(&full)).unwrap_err().to_string();
        assert!(e.contains("slot 0") && e.contains("position 4"), "{e}");
    }
}
