//! GLR decoder on the GPU. After token `t` the device cache holds `x` and/or `y` (as `on`
//! needs) at exactly the positions later tokens read: the lattice's `P_{t+1}` for
//! cache-efficient patterns (`≤ log_2 T + 1` positions for pow2), the window
//! `[t + 1 − f(K−1), t]` otherwise. Slots are assigned on the host; each step is one kernel
//! launch, one thread per (batch, channel).

use std::collections::{BTreeSet, HashMap};

use cudarc::driver::CudaSlice;
use mixer_core::mixer::{Decoder, check_decoder_capacity};
use mixer_core::mixers::glr::{Glr, Slots};
use mixer_core::tensor::contiguous;
use mixer_core::{Dims, DimsExt, Result, Tensors};
use ndarray::ArrayD;

use super::FAMILY;
use crate::kernels;
use crate::runtime::{GpuReal, err, gpu, grid1, int, launch};

/// The GLR decoder (device-resident lattice cache).
pub struct GlrDecoder<F: GpuReal> {
    slots: Slots,
    has_a: bool,
    has_b: bool,
    b: usize,
    c: usize,
    tmax: usize,
    t: usize,
    cx: CudaSlice<F>,
    cy: CudaSlice<F>,
    slot_of: HashMap<usize, i32>,
    free: Vec<i32>,
}

impl<F: GpuReal> GlrDecoder<F> {
    /// Sizes the cache for length `T` and allocates it on the device.
    pub fn new(glr: &Glr, dims: &Dims) -> Result<Self> {
        let (b, tmax, c) = (dims.size("B")?, dims.size("T")?, dims.size("C")?);
        let cap = glr.pattern().max_cache(tmax).max(1);
        let on = glr.on();
        let g = gpu()?;
        let alloc = |used: bool| g.zeros::<F>(FAMILY, if used { cap * b * c } else { 1 });
        Ok(GlrDecoder {
            slots: glr.slots(tmax),
            has_a: on.has_a(),
            has_b: on.has_b(),
            b,
            c,
            tmax,
            t: 0,
            cx: alloc(on.has_a())?,
            cy: alloc(on.has_b())?,
            slot_of: HashMap::new(),
            free: (0..cap as i32).rev().collect(),
        })
    }

    /// Positions read by token `t`, per slot (`None` when inactive).
    fn deps(&self, t: usize) -> Vec<Option<usize>> {
        let active = self.slots.active(t);
        (0..self.slots.len()).map(|k| (k < active).then(|| self.slots.pos(t, k))).collect()
    }

    /// Positions to keep after token `t`: those tokens `> t` read.
    fn live_after(&self, t: usize) -> BTreeSet<usize> {
        if t + 1 >= self.tmax {
            return BTreeSet::new();
        }
        if self.slots.cache_efficient() {
            self.slots.deps(t + 1).map(|(_, d)| d).collect()
        } else {
            let w = self.slots.offsets().last().copied().unwrap_or(0);
            ((t + 1).saturating_sub(w)..=t).collect()
        }
    }
}

/// Per-token input `name`, shape-checked, on the device.
fn upload_token<F: GpuReal>(token: &Tensors<F>, name: &str, want: &[usize]) -> Result<CudaSlice<F>> {
    gpu()?.upload_slice(FAMILY, &contiguous(token, name, want)?)
}

impl<F: GpuReal> Decoder<F> for GlrDecoder<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        let t = self.t;
        check_decoder_capacity(t, self.tmax)?;
        let (b, c, k) = (self.b, self.c, self.slots.len());
        let na = if self.has_a { k + 1 } else { 1 };
        let g = gpu()?;
        let xt = upload_token(token, "x", &[b, c])?;
        let at = upload_token(token, "alpha", &if self.has_a { vec![b, na, c] } else { vec![b, c] })?;
        let bt = if self.has_b { upload_token(token, "beta", &[b, k, c])? } else { g.zeros::<F>(FAMILY, 1)? };
        let slots: Vec<i32> = self
            .deps(t)
            .into_iter()
            .map(|d| match d {
                None => Ok(-1),
                Some(p) => self.slot_of.get(&p).copied().ok_or_else(|| {
                    err(FAMILY, format!("internal: position {p} read at t = {t} is not in the cache"))
                }),
            })
            .collect::<Result<_>>()?;
        // Drop positions no later token reads, then give t a slot if it is kept.
        let live = self.live_after(t);
        let dropped: Vec<usize> = self.slot_of.keys().copied().filter(|p| !live.contains(p)).collect();
        for p in dropped {
            if let Some(s) = self.slot_of.remove(&p) {
                self.free.push(s);
            }
        }
        let out = if live.contains(&t) {
            let s = self.free.pop().ok_or_else(|| err(FAMILY, "internal: decoder cache overflow"))?;
            self.slot_of.insert(t, s);
            s
        } else {
            -1
        };
        let dslots = g.upload_slice(FAMILY, &slots)?;
        let mut y = g.zeros::<F>(FAMILY, b * c)?;
        let f = g.function(FAMILY, &kernels::GLR.full(), &[], &format!("glr_step_{}", F::SUFFIX))?;
        let (bi, ci, ki, nai) =
            (int(FAMILY, "B", b)?, int(FAMILY, "C", c)?, int(FAMILY, "K", k)?, int(FAMILY, "K+1", na)?);
        let (ha, hb) = (self.has_a as i32, self.has_b as i32);
        launch!(g, FAMILY, f, grid1(b * c, 128);
            &xt, &at, &bt, &dslots, &mut self.cx, &mut self.cy, &mut y, &bi, &ci, &ki, &nai, &ha, &hb, &out)?;
        g.sync(FAMILY)?;
        self.t += 1;
        g.download(FAMILY, &y, &[b, c])
    }
    fn cache_elems(&self) -> usize {
        self.slot_of.len() * self.b * self.c * (self.has_a as usize + self.has_b as usize)
    }
    fn position(&self) -> usize {
        self.t
    }
}
