//! The recurrent form with the Fenwick mask (docs/math.md §2.5) on the GPU: per (batch, head) the
//! device holds level states `S^(ℓ) ∈ ℝ^(D_v × D_k)`. At token `t` one kernel
//! launch (`ll_step_*`, a block per (b, h)) does:
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
//! error. Per token the device gathers one packed buffer (q, k, v, g, β, mapped λ of that
//! token) with device-to-device copies, and `y_t` stays on the device: nothing waits.

use cudarc::driver::{CudaView, LaunchConfig};
use mixer_core::fenwick::{bitlen, merge_level, occupied_levels};
use mixer_core::mixer::check_decoder_capacity;
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Dims, DimsExt, Error, Result};
use ndarray::ArrayD;

use super::chunked::base_code;
use super::{FAMILY, lambda};
use crate::attention::decoder::token_shape;
use crate::forms::{DeviceDecoder, input};
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{GpuReal, err, gpu, int, launch};
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
    /// The packed token `[q | k | v | g | β | λ]`, gathered on the device each step.
    tok: Pooled<F>,
    /// Bit `l` set when level `l` is non-empty after the last step.
    occ: u64,
    /// Tokens the decoder was built for (`T`).
    t_len: usize,
    pos: usize,
}

impl<F: GpuReal> LogLinearDecoder<F> {
    /// Allocates zero states for the sizes in `dims` (`B`, `H`, `Dk`, `Dv`, and `L` for lifts).
    pub fn new(m: &LogLinear, dims: &Dims) -> Result<Self> {
        let (nb, nh, dk, dv) = (dims.size("B")?, dims.size("H")?, dims.size("Dk")?, dims.size("Dv")?);
        let n_levels = if m.lift.is_some() { dims.size("L")? } else { 1 };
        let t_len = dims.size("T")?;
        let slots = n_levels.min(32);
        int(FAMILY, "B·H·L·Dk·Dv", nb * nh * slots * dk * dv)?;
        let states = pool::zeros::<F>(FAMILY, nb * nh * slots * dk * dv)?;
        let lifted = m.lift.is_some();
        let tok = pool::zeros::<F>(FAMILY, nb * nh * (2 * dk + dv + 2 + if lifted { n_levels } else { 0 }))?;
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
            tok,
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

impl<F: GpuReal> LogLinearDecoder<F> {
    /// Copies `src` into the packed token at element `at` (device to device).
    fn pack(&mut self, at: usize, src: &CudaView<'_, F>) -> Result<()> {
        let n = src.len();
        if n > 0 {
            gpu()?
                .stream
                .memcpy_dtod(src, &mut self.tok.slice_mut(at..at + n))
                .map_err(|e| err(FAMILY, format!("gathering the token: {e}")))?;
        }
        Ok(())
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
        let mut at = 0;
        for (name, d) in [("q", dk), ("k", dk), ("v", dv)] {
            let x = input::<F>(tok, name)?;
            token_shape(name, x.shape(), &[nb, nh, d])?;
            self.pack(at, &x.view())?;
            at += bh * d;
        }
        // An unused gate's slot keeps the zeros it was allocated with.
        for (name, used) in [("g", base.has_decay()), ("beta", base.has_beta())] {
            if used {
                let x = input::<F>(tok, name)?;
                token_shape(name, x.shape(), &[nb, nh])?;
                self.pack(at, &x.view())?;
            }
            at += bh;
        }
        let mut checks = Vec::new();
        if lifted {
            let raw = input::<F>(tok, "lambda")?;
            token_shape("lambda", raw.shape(), &[nb, nh, self.n_levels])?;
            let w = lambda::weights(&self.m, &raw, self.lambda_param.as_ref())?;
            self.pack(at, &w.view())?;
            checks = w.checks().to_vec();
        }
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
        let f =
            g.function(FAMILY, &kernels::LOGLINEAR_FENWICK.full(), &[], &format!("ll_step_{}", F::SUFFIX))?;
        let cfg = LaunchConfig {
            grid_dim: (int(FAMILY, "B·H", bh)? as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: int(FAMILY, "shared bytes", self.slots * dv * std::mem::size_of::<F>())? as u32,
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
        launch!(g, FAMILY, f, cfg;
            &*self.tok, &mut *self.states, &mut *y, &bhi, &dki, &dvi, &nl, &li, &basei, &liftedi, &ti, &mi, &occ32, &scale)?;
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
