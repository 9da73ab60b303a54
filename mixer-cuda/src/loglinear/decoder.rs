//! The recurrent form with the Fenwick mask (MATH.md §2.5) on the GPU: per (batch, head) the
//! device holds level states $S^{(\ell)} \in \mathbb R^{D_v \times D_k}$. At token `t` one kernel
//! launch (`ll_step_*`, a block per (b, h)) does:
//! 1. (lifts) if $t \ge 1$, $m = \operatorname{ctz}(t)$: $S^{(m+1)} \leftarrow \sum_{\ell \le m} S^{(\ell)}$,
//!    levels $0..m$ emptied;
//! 2. every non-empty level takes the transition: Mamba-2 $S \leftarrow e^{g_t} S$, gated DeltaNet
//!    $S \leftarrow e^{g_t} S (I - \beta_t k_t k_t^\top)$, linear attention none;
//! 3. insert $S^{(0)} \mathrel{+}= \beta_t v_t k_t^\top$ ($\beta = 1$ except gated DeltaNet; level 0 is
//!    empty for the lifts after the merge, the base mixers keep one accumulating state);
//! 4. read $y_t = \sigma \sum_\ell \lambda_t^{(\ell)} S^{(\ell)} q_t$ (weight 1 for the base mixers).
//!
//! After token $t$ the non-empty levels are 0 and every $\ell \ge 1$ with bit $\ell - 1$ of $t$ set,
//! i.e. $1 + \mathrm{popcount}(t)$ states; `cache_elems` counts those ($\times D_v D_k B H$). The
//! device buffer has one slot per λ level ($L \ge L(T)$); a token needing a level beyond it is an
//! error. Per token the host uploads one packed buffer (q, k, v, g, β, mapped λ of that token)
//! and downloads `y_t` (`B·H·Dv` values).

use cudarc::driver::{CudaSlice, LaunchConfig};
use mixer_core::error::fmt_shape;
use mixer_core::mixer::Decoder;
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::tensor::get;
use mixer_core::{Dims, Error, Result, Tensors};
use ndarray::ArrayD;

use super::chunked::{base_code, bitlen};
use super::{FENWICK_SRC, KERNEL};
use crate::runtime::{GpuReal, gpu, int, launch, source};

/// The decoder of one configured member of the family (device-resident level states).
pub struct LogLinearGpuDecoder<F: GpuReal> {
    m: LogLinear,
    nb: usize,
    nh: usize,
    dk: usize,
    dv: usize,
    /// λ levels per token (1 for the base mixers).
    n_levels: usize,
    /// The λ scheme's parameter `lambda_param [H, L]`, when given (a static input).
    lambda_param: Option<ArrayD<F>>,
    /// State slots per (b, h): `min(n_levels, 32)` (a token `t < 2³¹` uses levels `≤ 31`).
    slots: usize,
    states: CudaSlice<F>,
    /// Bit `l` set when level `l` is non-empty after the last step.
    occ: u64,
    pos: usize,
}

fn dim(dims: &Dims, s: &str) -> Result<usize> {
    dims.get(s)
        .copied()
        .ok_or_else(|| Error::Decoder(format!("loglinear cuda decoder: size `{s}` not given")))
}

impl<F: GpuReal> LogLinearGpuDecoder<F> {
    /// Allocates zero states for the sizes in `dims` (`B`, `H`, `Dk`, `Dv`, and `L` for lifts).
    pub fn new(m: &LogLinear, dims: &Dims) -> Result<Self> {
        let (nb, nh, dk, dv) = (dim(dims, "B")?, dim(dims, "H")?, dim(dims, "Dk")?, dim(dims, "Dv")?);
        let n_levels = if m.lift.is_some() { dim(dims, "L")? } else { 1 };
        let slots = n_levels.min(32);
        int(KERNEL, "B·H·L·Dk·Dv", nb * nh * slots * dk * dv)?;
        let states = gpu()?.zeros::<F>(KERNEL, nb * nh * slots * dk * dv)?;
        Ok(LogLinearGpuDecoder {
            m: m.clone(),
            nb,
            nh,
            dk,
            dv,
            n_levels,
            lambda_param: None,
            slots,
            states,
            occ: 0,
            pos: 0,
        })
    }

    /// Sets the λ scheme's parameter `lambda_param [H, L]` (a static input; absent = 1).
    pub fn with_lambda_param(mut self, p: Option<ArrayD<F>>) -> Self {
        self.lambda_param = p;
        self
    }

    fn input<'a>(&self, tok: &'a Tensors<F>, name: &str, shape: &[usize]) -> Result<&'a ArrayD<F>> {
        let a = get(tok, name)?;
        if a.shape() != shape {
            return Err(Error::Decoder(format!(
                "token {}: input `{name}` expected {}, got {}",
                self.pos,
                fmt_shape(shape),
                fmt_shape(a.shape())
            )));
        }
        Ok(a)
    }
}

fn push<F: GpuReal>(buf: &mut Vec<F>, a: &ArrayD<F>) {
    buf.extend(a.as_standard_layout().iter().copied());
}

impl<F: GpuReal> Decoder<F> for LogLinearGpuDecoder<F> {
    fn step(&mut self, tok: &Tensors<F>) -> Result<ArrayD<F>> {
        let (nb, nh, dk, dv) = (self.nb, self.nh, self.dk, self.dv);
        let bh = nb * nh;
        let base = self.m.base;
        let lifted = self.m.lift.is_some();
        let t = self.pos;
        let mut buf: Vec<F> = Vec::with_capacity(bh * (2 * dk + dv + 2 + self.n_levels));
        push(&mut buf, self.input(tok, "q", &[nb, nh, dk])?);
        push(&mut buf, self.input(tok, "k", &[nb, nh, dk])?);
        push(&mut buf, self.input(tok, "v", &[nb, nh, dv])?);
        let zeros = vec![F::zero(); bh];
        if base.has_decay() {
            push(&mut buf, self.input(tok, "g", &[nb, nh])?);
        } else {
            buf.extend_from_slice(&zeros);
        }
        if base.has_beta() {
            push(&mut buf, self.input(tok, "beta", &[nb, nh])?);
        } else {
            buf.extend_from_slice(&zeros);
        }
        if lifted {
            let raw = self.input(tok, "lambda", &[nb, nh, self.n_levels])?;
            push(&mut buf, &self.m.lambda_weights(raw, self.lambda_param.as_ref())?);
        }
        // Levels after this step's merge.
        let m = if t >= 1 { t.trailing_zeros() as usize } else { 0 };
        let occ =
            if !lifted || t == 0 { 1u64 } else { (self.occ & !((2u64 << m) - 1)) | (1u64 << (m + 1)) | 1 };
        if lifted && bitlen(t) >= self.slots {
            return Err(Error::Decoder(format!(
                "token {t} needs Fenwick level {}, but lambda has {} levels",
                bitlen(t),
                self.n_levels
            )));
        }
        let g = gpu()?;
        let dtok = g.upload_slice(KERNEL, &buf)?;
        let mut y = g.zeros::<F>(KERNEL, bh * dv)?;
        let f = g.function(KERNEL, &source(FENWICK_SRC), &[], &format!("ll_step_{}", F::SUFFIX))?;
        let cfg = LaunchConfig {
            grid_dim: (int(KERNEL, "B·H", bh)? as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: int(KERNEL, "shared bytes", self.slots * dv * std::mem::size_of::<F>())? as u32,
        };
        let (bhi, dki, dvi, nl) =
            (int(KERNEL, "B·H", bh)?, int(KERNEL, "Dk", dk)?, int(KERNEL, "Dv", dv)?, self.slots as i32);
        let (li, basei, liftedi, ti, mi) = (
            int(KERNEL, "L", self.n_levels)?,
            base_code(base),
            lifted as i32,
            int(KERNEL, "t", t)?,
            m as i32,
        );
        let occ32 = occ as u32;
        let scale = self.m.scale;
        launch!(g, KERNEL, f, cfg;
            &dtok, &mut self.states, &mut y, &bhi, &dki, &dvi, &nl, &li, &basei, &liftedi, &ti, &mi, &occ32, &scale)?;
        self.occ = occ;
        self.pos += 1;
        g.download(KERNEL, &y, &[nb, nh, dv])
    }

    fn cache_elems(&self) -> usize {
        self.occ.count_ones() as usize * self.dk * self.dv * self.nb * self.nh
    }

    fn position(&self) -> usize {
        self.pos
    }
}
