//! The recurrent form with the Fenwick mask (docs/math.md §2.5) on the GPU: per (batch, head) the
//! device holds level states `S^(ℓ) ∈ ℝ^(D_v × D_k)`. At token `t` one kernel
//! launch (`llc_step_*` of `kernels/loglinear_decoder.cu`, a warp per (b·h, state row), every
//! row independent) does:
//! 1. (lifts) if `t ≥ 1`, `m = ctz(t)`: `S^(m+1) ← Σ_{ℓ ≤ m} S^(ℓ)`,
//!    levels `0..m` emptied;
//! 2. every non-empty level takes the transition: Mamba-2 `S ← e^(g_t) S`, gated DeltaNet
//!    `S ← e^(g_t) S (I − β_t k_t k_tᵀ)`, linear attention none;
//! 3. insert `S^(0) += β_t v_t k_tᵀ` (`β = 1` except gated DeltaNet; level 0 is
//!    empty for the lifts after the merge, the base mixers keep one accumulating state);
//! 4. read `y_t = σ Σ_ℓ λ_t^(ℓ) S^(ℓ) q_t` (weight 1 for the base mixers).
//!
//! After token `t` the non-empty levels are 0 and every `ℓ ≥ 1` with bit `ℓ − 1` of `t` set,
//! i.e. `1 + popcount(t)` states; `cache_elems` counts those (`× D_v D_k B H`). The
//! device buffer has one slot per λ level (`L ≥ L(T)`); a token needing a level beyond it is an
//! error. The kernel reads the token's inputs where they are (λ mapped on the device first for
//! the lifts), and `y_t` stays on the device: nothing waits.
//!
//! From a state (docs/math.md §7.1, [`from_state`]): a base mixer's `S` is level 0. A lift's
//! state at position `a` holds the levels *after* the merge for token `a`, while the kernel's
//! step `a` does that merge itself, writing level `m + 1` (`m = ctz(a)`) as the sum of levels
//! `0 … m`; so the state's level `m + 1` is loaded into level 0 (levels `1 … m` are empty at `a`)
//! and every other level in place, and the first step's merge puts it back. The exported state
//! ([`StatefulDeviceDecoder::state`]) applies the merge for the next token to the levels read
//! back, as the CPU decoder does. A decoder steps its batch rows at one position, so a state
//! whose rows are at different positions gets a decoder per row.

use cudarc::driver::LaunchConfig;
use mixer_core::fenwick::{bitlen, merge_level, merge_states, occupied_levels};
use mixer_core::mixer::{Decoder, check_decoder_capacity};
use mixer_core::mixers::loglinear::lift_state::{POSITION, positions};
use mixer_core::mixers::loglinear::state::STATE;
use mixer_core::mixers::loglinear::{DecoderSizes, LogLinear};
use mixer_core::state::{by_rows_if_uneven, position_tensor};
use mixer_core::tensor::get;
use mixer_core::{Dims, DimsExt, Error, Result, Tensors};
use ndarray::{ArrayD, IxDyn};

use super::common::{FAMILY, base_code};
use super::lambda;
use crate::attention::decoder::token_shape;
use crate::forms::{DeviceDecoder, StatefulDeviceDecoder, hosted_decoder, input};
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu, int, launch};
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// The decoder of one configured member of the family (device-resident level states).
pub struct LogLinearDecoder<F: GpuReal> {
    m: LogLinear,
    nb: usize,
    nh: usize,
    dk: usize,
    dv: usize,
    /// λ levels per token (1 for the base mixers).
    n_levels: usize,
    /// The λ scheme's parameter `lambda_param [H, L]`, when given (a static input).
    lambda_param: Option<DeviceTensor<F>>,
    /// State slots per (b, h): `min(n_levels, 32)` (a token `t < 2³¹` uses levels `≤ 31`).
    slots: usize,
    states: Pooled<F>,
    /// One zero, passed for the gates a mixer does not have.
    zero: Pooled<F>,
    /// Bit `l` set when level `l` is non-empty after the last step.
    occ: u64,
    /// Tokens the decoder was built for (`T`).
    t_len: usize,
    /// The position of the first token (the state's `position`; 0 without a state).
    start: usize,
    /// The position of the next token.
    pos: usize,
}

impl<F: GpuReal> LogLinearDecoder<F> {
    /// Allocates zero states for the sizes in `dims` (`B`, `H`, `Dk`, `Dv`, and `L` for lifts).
    pub fn new(m: &LogLinear, dims: &Dims) -> Result<Self> {
        let DecoderSizes { nb, nh, dk, dv, n_levels, t_len } = m.decoder_sizes(dims)?;
        let slots = n_levels.min(32);
        int(FAMILY, "B·H·L·Dk·Dv", nb * nh * slots * dk * dv)?;
        let states = pool::zeros::<F>(FAMILY, nb * nh * slots * dk * dv)?;
        Ok(LogLinearDecoder {
            m: m.clone(),
            nb,
            nh,
            dk,
            dv,
            n_levels,
            lambda_param: None,
            slots,
            states,
            zero: pool::zeros::<F>(FAMILY, 1)?,
            occ: 0,
            t_len,
            start: 0,
            pos: 0,
        })
    }

    /// Loads the state `s` (every batch row at one position; checked by [`positions`]) into the
    /// level states ([`load_levels`]) and starts at its position.
    fn load(mut self, s: &Tensors<F>) -> Result<Self> {
        let a = match self.m.lift {
            Some(_) => Some(positions(s, self.t_len)?.first().copied().unwrap_or(0)),
            None => None,
        };
        let host = load_levels(get(s, STATE)?, a, self.slots)?;
        if let Some(a) = a {
            self.start = a;
            self.pos = a;
            self.occ = (a as u64) << 1;
        }
        self.states = pool::upload(FAMILY, &host)?;
        Ok(self)
    }

    /// Sets the λ scheme's parameter `lambda_param [H, L]` (a static input; absent = 1).
    pub fn with_lambda_param(mut self, p: Option<&ArrayD<F>>) -> Result<Self> {
        self.lambda_param = p.map(DeviceTensor::upload).transpose()?;
        Ok(self)
    }
}

/// The decoder of `m` started from the state `initial` (docs/math.md §7.1; `None`: zeros), driven
/// with host arrays: the registry's decoder from a state on this backend. Its state lives on the
/// device; [`Decoder::state`] reads it back.
pub fn from_state<F: GpuReal>(
    m: &LogLinear,
    statics: &Tensors<F>,
    dims: &Dims,
    initial: Option<&Tensors<F>>,
) -> Result<Box<dyn Decoder<F>>> {
    if let (Some(s), Some(_)) = (initial, m.lift) {
        let pos = positions(s, dims.size("T")?)?;
        if let Some(d) = by_rows_if_uneven(&pos, s, dims, |one, row| from_state(m, statics, one, Some(row))) {
            return d;
        }
    }
    let d = LogLinearDecoder::<F>::new(m, dims)?.with_lambda_param(statics.get("lambda_param"))?;
    let d = match initial {
        Some(s) => d.load(s)?,
        None => d,
    };
    Ok(hosted_decoder(Box::new(d)))
}

impl<F: GpuReal> DeviceDecoder for LogLinearDecoder<F> {
    fn step(&mut self, tok: &DeviceTensors) -> Result<AnyDeviceTensor> {
        let (nb, nh, dk, dv) = (self.nb, self.nh, self.dk, self.dv);
        let bh = nb * nh;
        let base = self.m.base;
        let lifted = self.m.lift.is_some();
        let t = self.pos;
        check_decoder_capacity(t - self.start, self.t_len)?;
        let mut toks = Vec::with_capacity(3);
        for (name, d) in [("q", dk), ("k", dk), ("v", dv)] {
            let x = input::<F>(tok, name)?;
            token_shape(name, x.shape(), &[nb, nh, d])?;
            toks.push(x);
        }
        // A gate the mixer does not have is passed as the zero buffer (the kernel does not read it).
        let mut gates = Vec::with_capacity(2);
        for (name, used) in [("g", base.has_decay()), ("beta", base.has_beta())] {
            if used {
                let x = input::<F>(tok, name)?;
                token_shape(name, x.shape(), &[nb, nh])?;
                gates.push(Some(x));
            } else {
                gates.push(None);
            }
        }
        let lam = if lifted {
            let raw = input::<F>(tok, "lambda")?;
            token_shape("lambda", raw.shape(), &[nb, nh, self.n_levels])?;
            Some(lambda::weights(&self.m, &raw, self.lambda_param.as_ref())?)
        } else {
            None
        };
        let checks = lam.as_ref().map(|w| w.checks().to_vec()).unwrap_or_default();
        // The merge level of this step and the levels occupied after it (MATH §2.5).
        let m = merge_level(t).unwrap_or(0);
        let occ = if lifted { occupied_levels(t) } else { 1 };
        if lifted && bitlen(t) >= self.slots {
            return Err(Error::Decoder(format!(
                "token {t} needs Fenwick level {}, but lambda has {} levels",
                bitlen(t),
                self.n_levels
            )));
        }
        let g = gpu()?;
        let mut y = pool::take::<F>(FAMILY, bh * dv)?;
        let f = g.kernel(FAMILY, &kernels::LOGLINEAR_DECODER, &[], &format!("llc_step_{}", F::SUFFIX))?;
        if bh > 65535 {
            return Err(err(FAMILY, format!("the decoder takes B·H ≤ 65535, got {bh}")));
        }
        let cfg = LaunchConfig {
            grid_dim: (dv.div_ceil(4) as u32, bh as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (bhi, dki, dvi, nl) =
            (int(FAMILY, "B·H", bh)?, int(FAMILY, "Dk", dk)?, int(FAMILY, "Dv", dv)?, self.slots as i32);
        let (li, basei, liftedi, ti, mi) = (
            int(FAMILY, "L", self.n_levels)?,
            base_code(base),
            lifted as i32,
            int(FAMILY, "t", t)?,
            m as i32,
        );
        let occ32 = occ as u32;
        let scale = self.m.scale;
        let zero = &self.zero;
        let (qv, kv, vv) = (toks[0].view(), toks[1].view(), toks[2].view());
        let gv = gates[0].as_deref().map_or_else(|| zero.slice(0..1), |d| d.view());
        let bv = gates[1].as_deref().map_or_else(|| zero.slice(0..1), |d| d.view());
        let lv = lam.as_ref().map_or_else(|| zero.slice(0..1), |d| d.view());
        launch!(g, FAMILY, f, cfg;
            &qv, &kv, &vv, &gv, &bv, &lv, &mut *self.states, &mut *y,
            &bhi, &dki, &dvi, &nl, &li, &basei, &liftedi, &ti, &mi, &occ32, &scale)?;
        self.occ = occ;
        self.pos += 1;
        Ok(F::wrap(DeviceTensor::from_pooled(y, &[nb, nh, dv])?.with_checks(checks)))
    }

    fn cache_elems(&self) -> usize {
        self.occ.count_ones() as usize * self.dk * self.dv * self.nb * self.nh
    }

    fn position(&self) -> usize {
        self.pos - self.start
    }
}

impl<F: GpuReal> StatefulDeviceDecoder<F> for LogLinearDecoder<F> {
    /// A base mixer's `S [B, H, Dv, Dk]` (level 0); a lift's `S [B, H, L, Dv, Dk]` after the merge
    /// for the next token (slot `i`: level `i + 1`) and `position [B]` (docs/math.md §7.1).
    fn state(&self) -> Result<Tensors<F>> {
        let (nb, nh, dk, dv, slots) = (self.nb, self.nh, self.dk, self.dv, self.slots);
        let host = pool::download(FAMILY, &self.states, nb * nh * slots * dk * dv)?;
        let lift = self.m.lift.map(|_| (self.n_levels, self.pos));
        export_levels(&host, [nb, nh, dk, dv], slots, lift)
    }
}

/// The device's level states `[B·H][slots][Dv][Dk]` holding the state `s0` (module
/// documentation): a base mixer's `S [B, H, Dv, Dk]` (`a = None`) as level 0; a lift's
/// `S [B, H, L, Dv, Dk]` at position `a` with its level `ctz(a) + 1` as level 0, which the first
/// step's merge moves back, and every other live level in place.
fn load_levels<F: GpuReal>(s0: &ArrayD<F>, a: Option<usize>, slots: usize) -> Result<Vec<F>> {
    let sh = s0.shape();
    let (nb, nh, dd) = (sh[0], sh[1], sh[sh.len() - 2] * sh[sh.len() - 1]);
    // Each (batch, head[, slot]) block of `S` is one `Dv × Dk` level state, rows as the device's.
    let src = s0.as_standard_layout();
    let src = src.as_slice().unwrap_or_default();
    let mut host = vec![F::default(); nb * nh * slots * dd];
    let Some(a) = a else {
        for bh in 0..nb * nh {
            host[bh * slots * dd..][..dd].copy_from_slice(&src[bh * dd..][..dd]);
        }
        return Ok(host);
    };
    let (nl, m) = (sh[2], merge_level(a));
    for i in (0..nl).filter(|i| (a >> i) & 1 == 1) {
        let level = if m == Some(i) { 0 } else { i + 1 };
        if level >= slots {
            return Err(Error::Decoder(format!(
                "position {a} holds Fenwick level {}, but the decoder has {slots} level slots",
                i + 1
            )));
        }
        for bh in 0..nb * nh {
            host[(bh * slots + level) * dd..][..dd].copy_from_slice(&src[(bh * nl + i) * dd..][..dd]);
        }
    }
    Ok(host)
}

/// The state held by the device's level states `host` (`[B·H][slots][Dv][Dk]`, `dims`
/// `[B, H, Dk, Dv]`): a base mixer's `S` (level 0), or, with `lift = (L, p)`, a lift's `S`
/// after the merge for the next token `p` (slot `i`: level `i + 1`) and `position` `p`.
fn export_levels<F: GpuReal>(
    host: &[F],
    [nb, nh, dk, dv]: [usize; 4],
    slots: usize,
    lift: Option<(usize, usize)>,
) -> Result<Tensors<F>> {
    let dd = dk * dv;
    let block = |bh: usize, l: usize| host[(bh * slots + l) * dd..][..dd].to_vec();
    let shape_err = |e: ndarray::ShapeError| Error::Decoder(format!("the exported state: {e}"));
    let Some((nl, pos)) = lift else {
        let s: Vec<F> = (0..nb * nh).flat_map(|bh| block(bh, 0)).collect();
        let s = ArrayD::from_shape_vec(IxDyn(&[nb, nh, dv, dk]), s).map_err(shape_err)?;
        return Ok([(STATE.to_string(), s)].into_iter().collect());
    };
    let mut s = vec![F::default(); nb * nh * nl * dd];
    for bh in 0..nb * nh {
        let mut levels: Vec<Option<Vec<F>>> = (0..slots).map(|l| Some(block(bh, l))).collect();
        merge_states(&mut levels, pos, |mut acc, x| {
            acc.iter_mut().zip(&x).for_each(|(a, b)| *a += *b);
            acc
        });
        for (l, st) in levels.iter().enumerate().skip(1) {
            let Some(st) = st else { continue };
            if l <= nl {
                s[(bh * nl + l - 1) * dd..][..dd].copy_from_slice(st);
            } else if st.iter().any(|&x| x != F::default()) {
                return Err(Error::Decoder(format!(
                    "at position {pos} level {l} holds a state, but the state has slots for levels \
                     1 … {nl} (L = {nl})"
                )));
            }
        }
    }
    let s = ArrayD::from_shape_vec(IxDyn(&[nb, nh, nl, dv, dk]), s).map_err(shape_err)?;
    Ok([(STATE.to_string(), s), (POSITION.to_string(), position_tensor::<F>(&vec![pos; nb]))]
        .into_iter()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lift's state at every position up to 70 (live slots only, as a decoder leaves them)
    /// loaded into the device layout and exported again, before any step, is the same state;
    /// and the device layout holds level `ctz(a) + 1` at level 0, as the kernel's first merge
    /// expects. A base mixer's `S` goes through level 0.
    #[test]
    fn a_state_loaded_and_exported_is_the_same_state() {
        let (nb, nh, nl, dv, dk, slots) = (1, 2, 8, 3, 2, 8);
        for a in 0..70usize {
            let s0 = ArrayD::from_shape_fn(IxDyn(&[nb, nh, nl, dv, dk]), |i| {
                if (a >> i[2]) & 1 == 1 { (i[1] * 97 + i[2] * 13 + i[3] * 5 + i[4] + 1) as f64 } else { 0.0 }
            });
            let host = load_levels(&s0, Some(a), slots).unwrap();
            let block = |l: usize| &host[(slots + l) * dv * dk..][..dv * dk];
            if a > 0 {
                let m = a.trailing_zeros() as usize;
                assert_eq!(block(0)[0], s0[[0, 1, m, 0, 0]], "a={a}: level {} at level 0", m + 1);
                assert!(block(m + 1).iter().all(|&x| x == 0.0), "a={a}");
            }
            let out = export_levels(&host, [nb, nh, dk, dv], slots, Some((nl, a))).unwrap();
            assert_eq!(out[STATE], s0, "a={a}");
            assert_eq!(out[POSITION].as_slice().unwrap(), &[a as f64]);
        }
        let s0 = ArrayD::from_shape_fn(IxDyn(&[2, 2, dv, dk]), |i| {
            (i[0] * 31 + i[1] * 7 + i[2] * 3 + i[3]) as f64
        });
        let host = load_levels(&s0, None, 1).unwrap();
        assert_eq!(export_levels(&host, [2, 2, dk, dv], 1, None).unwrap()[STATE], s0);
    }
}
