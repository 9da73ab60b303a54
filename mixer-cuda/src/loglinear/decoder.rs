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

use cudarc::driver::LaunchConfig;
use mixer_core::fenwick::{bitlen, merge_level, occupied_levels};
use mixer_core::mixer::check_decoder_capacity;
use mixer_core::mixers::loglinear::{DecoderSizes, LogLinear};
use mixer_core::{Dims, Error, Result};
use ndarray::ArrayD;

use super::common::{FAMILY, base_code};
use super::lambda;
use crate::attention::decoder::token_shape;
use crate::forms::{DeviceDecoder, input};
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
            pos: 0,
        })
    }

    /// Sets the λ scheme's parameter `lambda_param [H, L]` (a static input; absent = 1).
    pub fn with_lambda_param(mut self, p: Option<&ArrayD<F>>) -> Result<Self> {
        self.lambda_param = p.map(DeviceTensor::upload).transpose()?;
        Ok(self)
    }
}

impl<F: GpuReal> DeviceDecoder for LogLinearDecoder<F> {
    fn step(&mut self, tok: &DeviceTensors) -> Result<AnyDeviceTensor> {
        let (nb, nh, dk, dv) = (self.nb, self.nh, self.dk, self.dv);
        let bh = nb * nh;
        let base = self.m.base;
        let lifted = self.m.lift.is_some();
        let t = self.pos;
        check_decoder_capacity(t, self.t_len)?;
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
        self.pos
    }
}
