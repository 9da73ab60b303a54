//! GLR decoder on the GPU. After token $t$ the device cache holds $x$ and/or $y$ (as `on`
//! needs) at exactly the positions later tokens read: the lattice's $P_{t+1}$ for
//! cache-efficient patterns ($\le \log_2 T + 1$ positions for pow2), the window
//! $[t + 1 - f(K-1), t]$ otherwise. Slots are assigned on the host; each step is one kernel
//! launch, one thread per (batch, channel).

use std::collections::{BTreeSet, HashMap};

use cudarc::driver::CudaSlice;
use mixer_core::mixer::Decoder;
use mixer_core::mixers::glr::Glr;
use mixer_core::{Dims, Error, Result, Tensors};
use ndarray::ArrayD;

use super::{KERNEL, SRC, dep};
use crate::runtime::{GpuReal, err, gpu, grid1, input, int, launch, source};

/// The GLR decoder (device-resident lattice cache).
pub struct GlrDecoder<F: GpuReal> {
    off: Vec<u64>,
    strides: Vec<u64>,
    ce: bool,
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
        let get = |s: &str| {
            dims.get(s).copied().ok_or_else(|| Error::Decoder(format!("glr decoder: size `{s}` not bound")))
        };
        let (b, tmax, c) = (get("B")?, get("T")?, get("C")?);
        let p = glr.pattern();
        let off = p.offsets(tmax);
        let ce = p.cache_efficient();
        let strides = if ce { p.strides(off.len()) } else { vec![1; off.len()] };
        let cap = p.max_cache(tmax).max(1);
        let on = glr.on();
        let g = gpu()?;
        let alloc = |used: bool| g.zeros::<F>(KERNEL, if used { cap * b * c } else { 1 });
        Ok(GlrDecoder {
            off,
            strides,
            ce,
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
        self.off
            .iter()
            .zip(&self.strides)
            .map(|(&fk, &ak)| (fk <= t as u64).then(|| dep(t as u64, fk, ak, self.ce) as usize))
            .collect()
    }

    /// Positions to keep after token `t`: those tokens `> t` read.
    fn live_after(&self, t: usize) -> BTreeSet<usize> {
        if t + 1 >= self.tmax {
            return BTreeSet::new();
        }
        if self.ce {
            self.deps(t + 1).into_iter().flatten().collect()
        } else {
            let w = self.off.last().copied().unwrap_or(0) as usize;
            ((t + 1).saturating_sub(w)..=t).collect()
        }
    }
}

fn upload_token<F: GpuReal>(token: &Tensors<F>, name: &str, want: &[usize]) -> Result<CudaSlice<F>> {
    let a = input(token, KERNEL, name)?;
    if a.shape() != want {
        return Err(Error::shape(name, format!("{want:?} (one token)"), format!("{:?}", a.shape())));
    }
    gpu()?.upload(KERNEL, a)
}

impl<F: GpuReal> Decoder<F> for GlrDecoder<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        let t = self.t;
        if t >= self.tmax {
            return Err(Error::Decoder(format!("glr decoder: step {t} beyond T = {}", self.tmax)));
        }
        let (b, c, k) = (self.b, self.c, self.off.len());
        let na = if self.has_a { k + 1 } else { 1 };
        let g = gpu()?;
        let xt = upload_token(token, "x", &[b, c])?;
        let at = upload_token(token, "alpha", &if self.has_a { vec![b, na, c] } else { vec![b, c] })?;
        let bt = if self.has_b { upload_token(token, "beta", &[b, k, c])? } else { g.zeros::<F>(KERNEL, 1)? };
        let slots: Vec<i32> = self
            .deps(t)
            .into_iter()
            .map(|d| match d {
                None => Ok(-1),
                Some(p) => self.slot_of.get(&p).copied().ok_or_else(|| {
                    err(KERNEL, format!("internal: position {p} read at t = {t} is not in the cache"))
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
            let s = self.free.pop().ok_or_else(|| err(KERNEL, "internal: decoder cache overflow"))?;
            self.slot_of.insert(t, s);
            s
        } else {
            -1
        };
        let dslots = g.upload_slice(KERNEL, &slots)?;
        let mut y = g.zeros::<F>(KERNEL, b * c)?;
        let f = g.function(KERNEL, &source(SRC), &[], &format!("glr_step_{}", F::SUFFIX))?;
        let (bi, ci, ki, nai) =
            (int(KERNEL, "B", b)?, int(KERNEL, "C", c)?, int(KERNEL, "K", k)?, int(KERNEL, "K+1", na)?);
        let (ha, hb) = (self.has_a as i32, self.has_b as i32);
        launch!(g, KERNEL, f, grid1(b * c, 128);
            &xt, &at, &bt, &dslots, &mut self.cx, &mut self.cy, &mut y, &bi, &ci, &ki, &nai, &ha, &hb, &out)?;
        g.sync(KERNEL)?;
        self.t += 1;
        g.download(KERNEL, &y, &[b, c])
    }
    fn cache_elems(&self) -> usize {
        self.slot_of.len() * self.b * self.c * (self.has_a as usize + self.has_b as usize)
    }
    fn position(&self) -> usize {
        self.t
    }
}
