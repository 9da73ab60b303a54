//! The recurrent form (docs/math.md §2.5): O(log T) states per head for the lifts, one state for
//! the base mixers.
//!
//! Per (batch, head) the decoder keeps level states `S^(ℓ) ∈ ℝ^(D_v × D_k)`, row-major, the
//! layout of the state a run returns (docs/math.md §7.1), so that a state goes in and out as a
//! plain copy (only the non-empty levels). At token `t`:
//! 1. (lifts) if `t ≥ 1`, `m = ctz(t)`: `S^(m+1) ← Σ_{ℓ ≤ m} S^(ℓ)`,
//!    levels `0..m` emptied;
//! 2. every level takes the transition: Mamba-2 `S ← e^(g_t) S`; gated DeltaNet
//!    `S ← e^(g_t) S (I − β_t k_t k_tᵀ)`; linear attention nothing;
//! 3. insert `S^(0) ← v_t k_tᵀ` (gated DeltaNet `β_t v_t k_tᵀ`; the base
//!    mixers add it to their single state);
//! 4. read `y_t = σ Σ_ℓ λ_t^(ℓ) S^(ℓ) q_t`.
//!
//! Steps 2–4 take one pass over the rows of each level (per value channel: the transition, the
//! insert at level 0, then the read, as axpys and dots over the `D_k` keys), and a level whose
//! entries have all decayed below the smallest normal number is dropped after it.
//!
//! A step costs `O(L · D_k D_v)` with `L ≤ ⌊log_2 t⌋ + 2` non-empty levels, and
//! the merge is amortized O(1) states; `cache_elems` counts the scalars in non-empty states.

use mixer_core::fenwick::merge_states;
use mixer_core::mixer::{Decoder, check_decoder_capacity};
use mixer_core::mixers::loglinear::lift_state::{POSITION, positions};
use mixer_core::mixers::loglinear::state::STATE;
use mixer_core::mixers::loglinear::{Base, DecoderSizes, LogLinear};
use mixer_core::real::dot8;
use mixer_core::tensor::{contiguous, get};
use mixer_core::{Dims, Error, Real, Result, Tensors};
use ndarray::{ArrayD, IxDyn};

/// The decoder of one configured member of the family.
pub struct LogLinearDecoder<F: Real> {
    m: LogLinear,
    /// `B`, `H`, `Dk`, `Dv`, λ levels per token, `T`.
    sizes: DecoderSizes,
    /// The λ scheme's parameter `lambda_param [H, L]`, when given (a static input).
    lambda_param: Option<ArrayD<F>>,
    /// Per (batch, head): the level states, `Dv×Dk` row-major.
    states: Vec<Vec<Option<Vec<F>>>>,
    /// Per batch row: the position of the first token (a lift's state's `position`; else 0).
    start: Vec<usize>,
    /// Tokens consumed.
    pos: usize,
}

/// Whether every entry is below the smallest positive normal number of `F`.
pub(crate) fn negligible<F: Real>(xs: &[F]) -> bool {
    let tiny = F::min_positive_value();
    xs.iter().all(|x| x.abs() < tiny)
}

/// Builds the decoder (Fenwick structure: the registry refuses other masks through
/// `Mixer::form_unsupported`).
pub fn build<F: Real>(m: &LogLinear, statics: &Tensors<F>, dims: &Dims) -> Result<Box<dyn Decoder<F>>> {
    let sizes = m.decoder_sizes(dims)?;
    Ok(Box::new(LogLinearDecoder::<F> {
        m: m.clone(),
        sizes,
        lambda_param: statics.get("lambda_param").cloned(),
        states: vec![Vec::new(); sizes.nb * sizes.nh],
        start: vec![0; sizes.nb],
        pos: 0,
    }))
}

/// Builds the decoder started from the state `initial` (docs/math.md §7.1; `None`: zero): a
/// base mixer's `S [B, H, Dv, Dk]` as its one state; a lift's `S [B, H, L, Dv, Dk]`
/// (slot `i`: level `i + 1`) as its level states and `position [B]` as the position of each
/// row's first token (checked: [`positions`]). The state is merged ahead, so the first step's
/// merge finds its levels empty.
pub fn build_from<F: Real>(
    m: &LogLinear,
    statics: &Tensors<F>,
    dims: &Dims,
    initial: Option<&Tensors<F>>,
) -> Result<Box<dyn Decoder<F>>> {
    let sizes = m.decoder_sizes(dims)?;
    let (dk, dv) = (sizes.dk, sizes.dv);
    let mut states = vec![Vec::new(); sizes.nb * sizes.nh];
    let mut start = vec![0; sizes.nb];
    match (initial, m.lift) {
        (None, _) => {}
        (Some(s), None) => {
            let s0 = get(s, STATE)?.as_standard_layout();
            let flat = flat(&s0)?;
            for (bh, st) in states.iter_mut().enumerate() {
                *st = vec![Some(flat[bh * dk * dv..][..dk * dv].to_vec())];
            }
        }
        (Some(s), Some(_)) => {
            start = positions(s, sizes.t_len)?;
            let s0 = get(s, STATE)?.as_standard_layout();
            let slots = s0.shape()[2];
            let flat = flat(&s0)?;
            for (bh, st) in states.iter_mut().enumerate() {
                // An all-zero slot is an empty level.
                let level = |i: usize| {
                    Some(flat[(bh * slots + i) * dk * dv..][..dk * dv].to_vec())
                        .filter(|sm| sm.iter().any(|&x| x != F::zero()))
                };
                *st = std::iter::once(None).chain((0..slots).map(level)).collect();
            }
        }
    }
    Ok(Box::new(LogLinearDecoder::<F> {
        m: m.clone(),
        sizes,
        lambda_param: statics.get("lambda_param").cloned(),
        states,
        start,
        pos: 0,
    }))
}

/// The entries of a standard-layout array.
fn flat<'a, F>(a: &'a ndarray::CowArray<'_, F, IxDyn>) -> Result<&'a [F]> {
    a.as_slice().ok_or_else(|| Error::Decoder("internal: a standard-layout state is not contiguous".into()))
}

impl<F: Real> Decoder<F> for LogLinearDecoder<F> {
    /// The state after the tokens consumed (docs/math.md §7.1): a base mixer's `S [B, H, Dv, Dk]`;
    /// a lift's level states after the merge for the next token, slot `i` holding
    /// level `i + 1`, and `position` (zero where nothing was inserted or a state decayed
    /// away).
    fn state(&self) -> Result<Tensors<F>> {
        let DecoderSizes { nb, nh, dk, dv, n_levels, .. } = self.sizes;
        // Each `D_v × D_k` block of `S` is a level state as it is.
        let put = |s: &mut ArrayD<F>, block: usize, sm: &[F]| -> Result<()> {
            let dst = s
                .as_slice_mut()
                .ok_or_else(|| Error::Decoder("internal: a new state array is not contiguous".into()))?;
            dst[block * dk * dv..][..dk * dv].copy_from_slice(sm);
            Ok(())
        };
        if self.m.lift.is_none() {
            let mut s = ArrayD::<F>::zeros(IxDyn(&[nb, nh, dv, dk]));
            for (bh, st) in self.states.iter().enumerate() {
                if let Some(Some(hm)) = st.first() {
                    put(&mut s, bh, hm)?;
                }
            }
            return Ok([(STATE.to_string(), s)].into_iter().collect());
        }
        let mut s = ArrayD::<F>::zeros(IxDyn(&[nb, nh, n_levels, dv, dk]));
        for (bh, st) in self.states.iter().enumerate() {
            let next = self.start[bh / nh] + self.pos;
            let mut levels = st.clone();
            merge_states(&mut levels, next, |mut acc, s| {
                acc.iter_mut().zip(&s).for_each(|(a, x)| *a += *x);
                acc
            });
            for (l, hm) in levels.iter().enumerate() {
                let Some(hm) = hm else { continue };
                match l.checked_sub(1).filter(|&i| i < n_levels) {
                    Some(i) => put(&mut s, bh * n_levels + i, hm)?,
                    None => {
                        return Err(Error::Decoder(format!(
                            "at position {next} level {l} holds a state, but the state has slots for \
                             levels 1 … {n_levels} (L = {n_levels})"
                        )));
                    }
                }
            }
        }
        let pos: Vec<F> = self.start.iter().map(|&a| F::of((a + self.pos) as f64)).collect();
        let pos = ArrayD::from_shape_vec(IxDyn(&[nb]), pos).map_err(|e| Error::Decoder(e.to_string()))?;
        Ok([(STATE.to_string(), s), (POSITION.to_string(), pos)].into_iter().collect())
    }

    fn step(&mut self, tok: &Tensors<F>) -> Result<ArrayD<F>> {
        let DecoderSizes { nb, nh, dk, dv, n_levels: nl, t_len } = self.sizes;
        let base = self.m.base;
        check_decoder_capacity(self.pos, t_len)?;
        // Contiguous row-major views: q, k [B·H·Dk], v [B·H·Dv], g, beta [B·H], λ [B·H·L].
        let q = contiguous(tok, "q", &[nb, nh, dk])?;
        let k = contiguous(tok, "k", &[nb, nh, dk])?;
        let v = contiguous(tok, "v", &[nb, nh, dv])?;
        let g = if base.has_decay() { Some(contiguous(tok, "g", &[nb, nh])?) } else { None };
        let beta = if base.has_beta() { Some(contiguous(tok, "beta", &[nb, nh])?) } else { None };
        let lam = match self.m.lift {
            Some(_) => {
                contiguous(tok, "lambda", &[nb, nh, nl])?;
                let w = self.m.lambda_weights(get(tok, "lambda")?, self.lambda_param.as_ref())?;
                Some(w.iter().copied().collect::<Vec<F>>())
            }
            None => None,
        };
        if dv == 0 || dk == 0 {
            // No value channels or no keys: every state is empty and `y_t` is zero (and rows of
            // width 0 cannot be iterated below).
            self.pos += 1;
            return Ok(ArrayD::zeros(IxDyn(&[nb, nh, dv])));
        }
        let lifted = lam.is_some();
        let scale = F::of(self.m.scale);
        let mut y = vec![F::zero(); nb * nh * dv];
        for bh in 0..nb * nh {
            let t = self.start[bh / nh] + self.pos;
            let st = &mut self.states[bh];
            // 1. merge (lifts only).
            if lifted {
                merge_states(st, t, |mut acc, s| {
                    acc.iter_mut().zip(&s).for_each(|(a, x)| *a += *x);
                    acc
                });
            }
            // 2–4 in one pass over each level's rows: the transition, the insert (level 0), the
            // read (levels are independent, so each is read as soon as it is updated).
            let kt = &k[bh * dk..(bh + 1) * dk];
            let qt = &q[bh * dk..(bh + 1) * dk];
            let vt = &v[bh * dv..(bh + 1) * dv];
            let decay = g.as_ref().map_or(F::one(), |g| F::of(g[bh].f64().exp()));
            let bt = beta.as_ref().map_or(F::one(), |x| x[bh]);
            if st.is_empty() {
                st.push(None);
            }
            st[0].get_or_insert_with(|| vec![F::zero(); dk * dv]);
            let yt = &mut y[bh * dv..(bh + 1) * dv];
            for (l, s) in st.iter_mut().enumerate() {
                let Some(s) = s else { continue };
                let w = match &lam {
                    Some(lam) => {
                        if l >= nl {
                            return Err(Error::Decoder(format!(
                                "token {t} reads level {l}, but lambda has {nl} levels"
                            )));
                        }
                        lam[bh * nl + l]
                    }
                    None => F::one(),
                } * scale;
                for ((row, &vv), yv) in s.chunks_exact_mut(dk).zip(vt).zip(yt.iter_mut()) {
                    match base {
                        Base::LinearAttention => {}
                        Base::Mamba2 => row.iter_mut().for_each(|x| *x *= decay),
                        // S ← e^g (S − β (S k) kᵀ).
                        Base::GatedDeltaNet => {
                            let bu = bt * dot8(row, kt);
                            row.iter_mut().zip(kt).for_each(|(x, &kd)| *x = decay * (*x - bu * kd));
                        }
                    }
                    if l == 0 {
                        let bv = bt * vv;
                        row.iter_mut().zip(kt).for_each(|(x, &kd)| *x += bv * kd);
                    }
                    if w != F::zero() {
                        *yv += w * dot8(row, qt);
                    }
                }
            }
            // Levels whose entries have all decayed below the smallest normal number are
            // dropped: their contribution is below the type's resolution, and carrying them
            // through subnormal arithmetic is 10-100x slower (with g ≈ −0.05, a Fenwick bucket
            // reaches that range after ~15k tokens).
            if base.has_decay() {
                for slot in st.iter_mut() {
                    if slot.as_ref().is_some_and(|s| negligible(s)) {
                        *slot = None;
                    }
                }
            }
        }
        self.pos += 1;
        ArrayD::from_shape_vec(IxDyn(&[nb, nh, dv]), y).map_err(|e| Error::Decoder(e.to_string()))
    }

    fn cache_elems(&self) -> usize {
        self.states.iter().map(|st| st.iter().flatten().map(Vec::len).sum::<usize>()).sum()
    }

    fn position(&self) -> usize {
        self.pos
    }
}
