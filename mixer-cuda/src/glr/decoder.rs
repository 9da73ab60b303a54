//! GLR decoder on the GPU. After token `t` the device cache holds `x` and/or `y` (as `on`
//! needs) at exactly the positions later tokens read: the lattice's `P_{t+1}` for
//! cache-efficient patterns (`≤ log_2 T + 1` positions for pow2), the window
//! `[t + 1 − f(K−1), t]` otherwise. Slots are assigned on the host; each step is one kernel
//! launch, one thread per (batch, channel). The step's slot table goes to the device with a
//! stream-ordered copy into the decoder's own buffer, so no step waits for the stream.
//!
//! From a state at position `a` (docs/math.md §7.1, [`from_state`]), as on the CPU: the state's
//! values are loaded into the cache at the positions they hold, the decoder steps the absolute
//! positions `a … a + T − 1` with the inputs' slot axis `K` (at least `K(a + T)`), and keeps its
//! cache after the last token so that [`StatefulDeviceDecoder::state`] can read it back. Rows at
//! different positions get a decoder each.

use std::collections::{BTreeSet, HashMap};

use mixer_core::mixer::{Decoder, check_decoder_capacity};
use mixer_core::mixers::glr::state as glr_state;
use mixer_core::mixers::glr::{Glr, Slots};
use mixer_core::state::{POSITION, by_rows_if_uneven, position_tensor, resumed};
use mixer_core::tensor::get;
use mixer_core::{Dims, DimsExt, Error, Result, Tensors};
use ndarray::{ArrayD, IxDyn};

use super::common::FAMILY;
use crate::attention::decoder::token_shape;
use crate::forms::{DeviceDecoder, StatefulDeviceDecoder, hosted_decoder, input};
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
    /// The slot axis `K` of the tokens' `beta` (`alpha` has one more): at least `K(T)`.
    k_in: usize,
    /// Whether the cache is kept after the last token (a decoder whose state is read back).
    keep_last: bool,
    /// The positions a translation-invariant pattern keeps: the last `f(K − 1)` (of the slots,
    /// or of the inputs' slot axis when a state is read back: the state's rows).
    window: usize,
    glr: Glr,
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
            k_in: glr.slots(tmax).len(),
            keep_last: false,
            window: slots_window(&glr.slots(tmax)),
            glr: glr.clone(),
        })
    }

    /// A decoder for `T` more tokens after the state `s` at position `a` (every batch row there,
    /// checked by the caller; `None`: position 0, an empty cache), whose cache outlives the last
    /// token (module documentation).
    fn from_state(glr: &Glr, dims: &Dims, s: Option<(&Tensors<F>, usize)>) -> Result<Self> {
        let (b, t_len, c) = (dims.size("B")?, dims.size("T")?, dims.size("C")?);
        let a = s.map_or(0, |(_, a)| a);
        let mut d = Self::new(glr, dims)?;
        // Slots through position a + T: the cache after the last token is P_(a+T).
        d.slots = Slots::new(glr.pattern(), a + t_len + 1);
        d.k_in = glr_state::slot_count(dims).unwrap_or(0).max(d.k_in);
        d.dslots = pool::zeros::<i32>(FAMILY, d.k_in.max(1))?;
        d.keep_last = true;
        d.tmax = a + t_len;
        d.t = a;
        let rows = glr_state::rows(glr, d.k_in);
        d.window = slots_window(&d.slots).max(rows);
        let cap =
            if glr.pattern().cache_efficient() { glr.pattern().max_cache(a + t_len + 1) } else { d.window }
                .max(1);
        d.free = (0..cap as i32).rev().collect();
        // The positions the tokens from a on read, each with the state's row that holds it.
        let rows: HashMap<usize, usize> = glr_state::kept_rows(glr, d.k_in, a).into_iter().collect();
        let live = if a == 0 { Default::default() } else { d.live_after(a - 1) };
        let mut hx = vec![F::default(); if d.has_a { cap * b * c } else { 1 }];
        let mut hy = vec![F::default(); if d.has_b { cap * b * c } else { 1 }];
        for p in live {
            let slot = d.free.pop().ok_or_else(|| err(FAMILY, "internal: decoder cache overflow"))?;
            d.slot_of.insert(p, slot);
            let (Some((st, _)), Some(&j)) = (s, rows.get(&p)) else { continue };
            for (used, name, host) in [(d.has_a, "x", &mut hx), (d.has_b, "y", &mut hy)] {
                if !used {
                    continue;
                }
                let v = get(st, name)?;
                for (bi, ci) in (0..b).flat_map(|bi| (0..c).map(move |ci| (bi, ci))) {
                    host[((slot as usize) * b + bi) * c + ci] = v[[bi, j, ci]];
                }
            }
        }
        d.cx = pool::upload(FAMILY, &hx)?;
        d.cy = pool::upload(FAMILY, &hy)?;
        Ok(d)
    }

    /// Positions read by token `t`, per slot of the tokens' slot axis (`None` when inactive).
    fn deps(&self, t: usize) -> Vec<Option<usize>> {
        let active = self.slots.active(t);
        (0..self.k_in).map(|k| (k < active).then(|| self.slots.pos(t, k))).collect()
    }

    /// Positions to keep after token `t`: those tokens `> t` read.
    fn live_after(&self, t: usize) -> BTreeSet<usize> {
        if t + 1 >= self.tmax && !self.keep_last {
            return BTreeSet::new();
        }
        if self.slots.cache_efficient() {
            self.slots.deps(t + 1).map(|(_, d)| d).collect()
        } else {
            ((t + 1).saturating_sub(self.window)..=t).collect()
        }
    }
}

/// The window a translation-invariant pattern's decoder keeps for `slots`: the largest offset.
fn slots_window(slots: &Slots) -> usize {
    slots.offsets().last().copied().unwrap_or(0)
}

impl<F: GpuReal> DeviceDecoder for GlrDecoder<F> {
    fn step(&mut self, token: &DeviceTensors) -> Result<AnyDeviceTensor> {
        let t = self.t;
        check_decoder_capacity(t, self.tmax)?;
        let (b, c, k) = (self.b, self.c, self.k_in);
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

impl<F: GpuReal> StatefulDeviceDecoder<F> for GlrDecoder<F> {
    /// The kept streams (`y`, `x`) `[B, R, C]` at the positions the state's rows hold after the
    /// tokens consumed, and `position [B]` (docs/math.md §7.1).
    fn state(&self) -> Result<Tensors<F>> {
        let (b, c) = (self.b, self.c);
        let kept = glr_state::kept(&self.glr, self.k_in, self.t);
        let mut out = Tensors::new();
        for (used, name, cache) in [(self.has_b, "y", &self.cy), (self.has_a, "x", &self.cx)] {
            if !used {
                continue;
            }
            let host = pool::download(FAMILY, cache, cache.len())?;
            let mut v = vec![F::default(); b * kept.len() * c];
            for (j, p) in kept.iter().enumerate() {
                let Some(p) = p else { continue };
                let &slot = self.slot_of.get(p).ok_or_else(|| {
                    Error::Decoder(format!("position {p} of the state at {} is not in the cache", self.t))
                })?;
                for (bi, ci) in (0..b).flat_map(|bi| (0..c).map(move |ci| (bi, ci))) {
                    v[(bi * kept.len() + j) * c + ci] = host[((slot as usize) * b + bi) * c + ci];
                }
            }
            let v = ArrayD::from_shape_vec(IxDyn(&[b, kept.len(), c]), v)
                .map_err(|e| Error::Decoder(format!("the exported cache: {e}")))?;
            out.insert(name.to_string(), v);
        }
        out.insert(POSITION.to_string(), position_tensor::<F>(&vec![self.t; b]));
        Ok(out)
    }
}

/// The decoder started from the state `initial` (module documentation; `None`: position 0),
/// driven with host arrays: the registry's decoder from a state on this backend.
pub fn from_state<F: GpuReal>(
    g: &Glr,
    _statics: &Tensors<F>,
    dims: &Dims,
    initial: Option<&Tensors<F>>,
) -> Result<Box<dyn Decoder<F>>> {
    let Some(s) = initial else {
        return Ok(hosted_decoder(Box::new(GlrDecoder::<F>::from_state(g, dims, None)?)));
    };
    let k = glr_state::slot_count(dims).unwrap_or(0);
    let pos = glr_state::positions(g, s, dims.size("T")?, k)?;
    if let Some(d) = by_rows_if_uneven(&pos, s, dims, |one, row| from_state(g, _statics, one, Some(row))) {
        return d;
    }
    let a = pos.first().copied().unwrap_or(0);
    Ok(resumed(hosted_decoder(Box::new(GlrDecoder::<F>::from_state(g, dims, Some((s, a)))?)), a))
}
