//! GLR decoder on the GPU. After token `t` the device cache holds `x` and/or `y` (as `on`
//! needs) at exactly the positions later tokens read: the lattice's `P_{t+1}` for
//! cache-efficient patterns (`≤ log_2 T + 1` positions for pow2), the window
//! `[t + 1 − f(K−1), t]` otherwise. Slots are assigned on the host; each step is one kernel
//! launch, one thread per (batch, channel). The step's slot table goes to the device with a
//! stream-ordered copy into the decoder's own buffer, so no step waits for the stream.

use std::collections::{BTreeSet, HashMap};

use mixer_core::mixer::check_decoder_capacity;
use mixer_core::mixers::glr::{Glr, Slots};
use mixer_core::{Dims, DimsExt, Result};

use super::common::FAMILY;
use crate::attention::decoder::token_shape;
use crate::forms::{DeviceDecoder, input};
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu, grid1, int, launch};
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// The GLR decoder (device-resident lattice cache).
pub struct GlrDecoder<F: GpuReal> {
    slots: Slots,
    has_a: bool,
    has_b: bool,
    b: usize,
    c: usize,
    tmax: usize,
    t: usize,
    cx: Pooled<F>,
    cy: Pooled<F>,
    /// The current step's slot table (`K` entries) on the device.
    dslots: Pooled<i32>,
    slot_of: HashMap<usize, i32>,
    free: Vec<i32>,
}

impl<F: GpuReal> GlrDecoder<F> {
    /// Sizes the cache for length `T` and allocates it on the device.
    pub fn new(glr: &Glr, dims: &Dims) -> Result<Self> {
        let (b, tmax, c) = (dims.size("B")?, dims.size("T")?, dims.size("C")?);
        let cap = glr.pattern().max_cache(tmax).max(1);
        let on = glr.on();
        let alloc = |used: bool| pool::zeros::<F>(FAMILY, if used { cap * b * c } else { 1 });
        let slots = glr.slots(tmax);
        Ok(GlrDecoder {
            dslots: pool::zeros::<i32>(FAMILY, slots.len().max(1))?,
            slots,
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

impl<F: GpuReal> DeviceDecoder for GlrDecoder<F> {
    fn step(&mut self, token: &DeviceTensors) -> Result<AnyDeviceTensor> {
        let t = self.t;
        check_decoder_capacity(t, self.tmax)?;
        let (b, c, k) = (self.b, self.c, self.slots.len());
        let na = if self.has_a { k + 1 } else { 1 };
        let g = gpu()?;
        let xt = input::<F>(token, "x")?;
        token_shape("x", xt.shape(), &[b, c])?;
        let at = input::<F>(token, "alpha")?;
        token_shape("alpha", at.shape(), &if self.has_a { vec![b, na, c] } else { vec![b, c] })?;
        let bt = if self.has_b {
            let bt = input::<F>(token, "beta")?;
            token_shape("beta", bt.shape(), &[b, k, c])?;
            Some(bt)
        } else {
            None
        };
        let zero = pool::zeros::<F>(FAMILY, 1)?;
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
        if !slots.is_empty() {
            g.stream()
                .memcpy_htod(&slots[..], &mut self.dslots.slice_mut(0..slots.len()))
                .map_err(|e| err(FAMILY, format!("copy of the slot table: {e}")))?;
        }
        let mut y = pool::take::<F>(FAMILY, b * c)?;
        let f = g.kernel(FAMILY, &kernels::GLR, &[], &format!("glr_step_{}", F::SUFFIX))?;
        let (bi, ci, ki, nai) =
            (int(FAMILY, "B", b)?, int(FAMILY, "C", c)?, int(FAMILY, "K", k)?, int(FAMILY, "K+1", na)?);
        let (ha, hb) = (self.has_a as i32, self.has_b as i32);
        let (xv, av) = (xt.view(), at.view());
        let bv = bt.as_ref().map_or_else(|| zero.slice(0..1), |d| d.view());
        launch!(g, FAMILY, f, grid1(b * c, 128);
            &xv, &av, &bv, &*self.dslots, &mut *self.cx, &mut *self.cy, &mut *y, &bi, &ci, &ki, &nai, &ha, &hb, &out)?;
        self.t += 1;
        Ok(F::wrap(DeviceTensor::from_pooled(y, &[b, c])?))
    }
    fn cache_elems(&self) -> usize {
        self.slot_of.len() * self.b * self.c * (self.has_a as usize + self.has_b as usize)
    }
    fn position(&self) -> usize {
        self.t
    }
}
