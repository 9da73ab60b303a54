//! The Toeplitz mixer (docs/math.md §3; the Toeplitz MLP mixer of Badger & Roland, 2026).
//!
//! Inputs: `x [B,T,C]` (mixed), `w [H,Tw]` — or `[Kw,H,Tw]` when `kernel_width = Kw > 1` —
//! and an optional position bias `bias [H,Tw]`. `w` and `bias` are static (no per-token
//! axis). Head `h` owns the contiguous channels `[h·C/H, (h+1)·C/H)`; `C` must be divisible
//! by `H`. With `δ_i = K_w − 1 − i`:
//!
//! `y[t,e] = Σ_{i<K_w} Σ_{s≤ t} w[i, h(e), t−s] x[s, e−δ_i] + bias[h(e), t],`
//!
//! where an input channel `e − δᵢ` outside head `h(e)`'s range contributes 0 (for `Kw = 1`
//! this is the plain per-head causal convolution `y[t,c] = Σ_{s≤t} w[h(c), t−s] x[s,c]`).
//!
//! **Kernel length.** The tap axis `Tw` must be at least `T` (an error otherwise: lag `T−1`
//! would have no tap). Taps (and bias entries) beyond `T` are ignored — the forms use the
//! truncation to `T` — so that decoding a prefix of a sequence accepts the full-length
//! kernel. A decoder can run for up to `Tw` tokens.
//!
//! The materialization is, per batch row and head, the `T×T` causal Toeplitz matrix
//! `A_h[t,s] = w[h,t−s]` for `s≤ t` (per head and shift for the kernel variant, as one
//! multi-term [`Block`] per group of output channels with the same valid shifts), plus the
//! bias as an additive [`Offset`](crate::materialize::Offset).

use std::any::Any;
use std::sync::Arc;

use ndarray::{Array2, ArrayD, ArrayView1, Axis, IxDyn};
use rand::{SeedableRng, rngs::StdRng};
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, fmt_shape};
use crate::grad::{MatGrad, grad_name};
use crate::materialize::{Block, Materialization, Offset, Term};
use crate::mixer::{Mixer, complete_dims};
use crate::real::Real;
use crate::spec::{Bound, Dim, Dims, InputDecl, InputSpec};
use crate::tensor::{Tensors, get};

pub mod state;

/// The family key under which backends register the Toeplitz forms.
pub const FAMILY: &str = "toeplitz";

/// Whether `n ≥ 1` has no prime factor above 7 (`2^a 3^b 5^c 7^d`).
pub fn is_fast_size(mut n: usize) -> bool {
    if n == 0 {
        return false;
    }
    for f in [2, 3, 5, 7] {
        while n.is_multiple_of(f) {
            n /= f;
        }
    }
    n == 1
}

/// The FFT length of the fast form for any backend: the smallest size `≥ n` of the form
/// `2^a 3^b 5^c 7^d` (the sizes FFT libraries handle fastest), 1 for `n ≤ 1`. The linear
/// convolution of `T` taps with `T` inputs needs `n = 2T − 1`.
pub fn fast_size(n: usize) -> usize {
    let mut p = n.max(1);
    while !is_fast_size(p) {
        p += 1;
    }
    p
}

/// Which decoder the `recurrent` form uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecoderKind {
    /// Online (relaxed) FFT convolution: O(log² t) amortised work per token.
    #[default]
    Online,
    /// Naive: O(t) per token over the full history (as in the paper).
    Naive,
}

fn one() -> usize {
    1
}

/// Configuration: `{"heads": 1, "kernel_width": 1, "decoder": "online"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToeplitzConfig {
    /// Number of heads `H` (each with its own kernel; `C` must be divisible by `H`).
    #[serde(default = "one")]
    pub heads: usize,
    /// Kernel width `Kw` (number of channel shifts mixed, like a causal 1-D convolution over
    /// the channels of a head).
    #[serde(default = "one")]
    pub kernel_width: usize,
    /// Decoder of the `recurrent` form.
    #[serde(default)]
    pub decoder: DecoderKind,
}

impl Default for ToeplitzConfig {
    fn default() -> Self {
        ToeplitzConfig { heads: 1, kernel_width: 1, decoder: DecoderKind::Online }
    }
}

/// A configured Toeplitz mixer.
#[derive(Clone, Debug)]
pub struct Toeplitz {
    name: String,
    /// The configuration.
    pub cfg: ToeplitzConfig,
}

impl Toeplitz {
    /// Builds from a JSON config (`{}` gives the defaults); `name` is the registered name.
    pub fn from_json(name: &str, config: &serde_json::Value) -> Result<Self> {
        let cfg: ToeplitzConfig =
            serde_json::from_value(config.clone()).map_err(|e| Error::config(name, e.to_string()))?;
        Toeplitz::new(name, cfg)
    }

    /// Builds from a configuration, checking `heads ≥ 1` and `kernel_width ≥ 1`.
    pub fn new(name: &str, cfg: ToeplitzConfig) -> Result<Self> {
        if cfg.heads == 0 {
            return Err(Error::config(name, "`heads` must be ≥ 1, got 0"));
        }
        if cfg.kernel_width == 0 {
            return Err(Error::config(name, "`kernel_width` must be ≥ 1, got 0"));
        }
        Ok(Toeplitz { name: name.to_string(), cfg })
    }

    /// Checks that `channels` is divisible by the number of heads; returns `C/H`.
    pub fn head_dim(&self, channels: usize) -> Result<usize> {
        let h = self.cfg.heads;
        if !channels.is_multiple_of(h) {
            return Err(Error::shape(
                "x",
                format!("C divisible by heads = {h}"),
                format!("C = {channels} (C mod {h} = {})", channels % h),
            ));
        }
        Ok(channels / h)
    }

    /// The valid shifts of output channel `e` (head offset `e_in_head = e − h·D`): the
    /// `(i, δᵢ)` with `δᵢ = Kw−1−i ≤ e_in_head`.
    pub fn shifts(&self, e_in_head: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let kw = self.cfg.kernel_width;
        (0..kw).map(move |i| (i, kw - 1 - i)).filter(move |&(_, d)| d <= e_in_head)
    }

    /// The materialization blocks of one head with `d` channels, in order: output channels
    /// (within the head) and their valid shifts `(i, δᵢ)`. Channels `Kw−1..d` see every shift
    /// (one block of `Kw` terms); each of the first `Kw−1` channels sees fewer (one block each).
    pub fn head_blocks(&self, d: usize) -> Vec<(std::ops::Range<usize>, Vec<(usize, usize)>)> {
        let kw = self.cfg.kernel_width;
        let mut v = Vec::new();
        if kw - 1 < d {
            v.push((kw - 1..d, self.shifts(kw - 1).collect()));
        }
        for e in 0..(kw - 1).min(d) {
            v.push((e..e + 1, self.shifts(e).collect()));
        }
        v
    }

    /// The kernel `w` as `[Kw, H, Tw]` (a view; `[H, Tw]` gains a leading axis of 1).
    pub fn taps_view<'a, F>(&self, w: &'a ArrayD<F>) -> Result<ndarray::ArrayView3<'a, F>> {
        self.check_w(w.shape())?;
        let v = w.view();
        let v = if w.ndim() == 2 { v.insert_axis(Axis(0)) } else { v };
        v.into_dimensionality().map_err(|_| Error::shape("w", "[Kw, H, Tw]", fmt_shape(w.shape())))
    }

    /// Checks the shape of `w`: `[H, Tw]` (kernel width 1) or `[Kw, H, Tw]`.
    fn check_w(&self, shape: &[usize]) -> Result<()> {
        let (kw, h) = (self.cfg.kernel_width, self.cfg.heads);
        let want = if kw == 1 { "[H, Tw]" } else { "[Kw, H, Tw]" };
        let full: Vec<usize> =
            if shape.len() == 2 && kw == 1 { [&[1], shape].concat() } else { shape.to_vec() };
        if full.len() != 3 {
            return Err(Error::shape("w", want, fmt_shape(shape)));
        }
        if full[0] != kw || full[1] != h {
            return Err(Error::shape("w", format!("{want} with Kw = {kw}, H = {h}"), fmt_shape(shape)));
        }
        Ok(())
    }

    /// The checks of [`Toeplitz::prepare_statics`] on the shapes alone (for inputs that live
    /// elsewhere, e.g. on a device): `w` and `bias` of the configured heads and kernel width, with
    /// rows of at least `limit` entries.
    pub fn check_statics(&self, w: &[usize], bias: Option<&[usize]>, limit: usize) -> Result<()> {
        self.check_w(w)?;
        check_taps("w", w, limit)?;
        if let Some(b) = bias {
            if b.len() != 2 || b[0] != self.cfg.heads {
                return Err(Error::shape("bias", format!("[H = {}, Tw]", self.cfg.heads), fmt_shape(b)));
            }
            check_taps("bias", b, limit)?;
        }
        Ok(())
    }
}

/// Checks that every row of `taps` (last axis) has at least `t_len` entries.
fn check_taps(name: &str, shape: &[usize], t_len: usize) -> Result<()> {
    let tw = shape.last().copied().unwrap_or(0);
    if tw < t_len {
        return Err(Error::shape(
            name,
            format!("Tw ≥ T = {t_len} taps (longer kernels are truncated to T)"),
            format!("{} (Tw = {tw})", fmt_shape(shape)),
        ));
    }
    Ok(())
}

/// Validated sizes and the truncated-to-`T` static inputs, shared by every form.
#[derive(Clone, Debug)]
pub struct Prepared<F> {
    /// Batch.
    pub batch: usize,
    /// Sequence length.
    pub seq: usize,
    /// Channels.
    pub channels: usize,
    /// Heads.
    pub heads: usize,
    /// Channels per head `C/H`.
    pub head_dim: usize,
    /// Kernel width.
    pub kernel_width: usize,
    /// Taps truncated to `T`, contiguous: `taps[(i·H + h)·T + j] = w[i, h, j]`.
    pub taps: Vec<F>,
    /// Bias truncated to `T`, contiguous: `bias[h·T + t]`.
    pub bias: Option<Vec<F>>,
}

impl<F: Copy> Prepared<F> {
    /// The taps `w[i, h, 0..T)`.
    pub fn tap_row(&self, i: usize, h: usize) -> &[F] {
        let t = self.seq;
        &self.taps[(i * self.heads + h) * t..(i * self.heads + h + 1) * t]
    }
    /// The bias `bias[h, 0..T)`, if present.
    pub fn bias_row(&self, h: usize) -> Option<&[F]> {
        self.bias.as_ref().map(|b| &b[h * self.seq..(h + 1) * self.seq])
    }
}

impl Toeplitz {
    /// Checks `x`, `w`, `bias` (shapes, `C mod H`, `Tw ≥ T`) and copies the taps and bias
    /// truncated to `limit` (normally `T`; a decoder passes `Tw`) into contiguous rows.
    pub fn prepare_statics<F: Copy>(
        &self,
        w: &ArrayD<F>,
        bias: Option<&ArrayD<F>>,
        limit: usize,
    ) -> Result<(Vec<F>, Option<Vec<F>>)> {
        self.check_statics(w.shape(), bias.map(|b| b.shape()), limit)?;
        let wv = self.taps_view(w)?;
        let mut taps = Vec::with_capacity(wv.shape()[0] * wv.shape()[1] * limit);
        for i in 0..wv.shape()[0] {
            for h in 0..wv.shape()[1] {
                let row = wv.slice(ndarray::s![i, h, ..limit]);
                match row.as_slice() {
                    Some(r) => taps.extend_from_slice(r),
                    None => taps.extend(row.iter().copied()),
                }
            }
        }
        let bias = bias.map(|b| {
            let mut v = Vec::with_capacity(self.cfg.heads * limit);
            for h in 0..self.cfg.heads {
                let row = b.index_axis(Axis(0), h);
                let row = row.slice(ndarray::s![..limit.min(row.len())]);
                match row.as_slice() {
                    Some(r) => v.extend_from_slice(r),
                    None => v.extend(row.iter().copied()),
                }
            }
            v
        });
        Ok((taps, bias))
    }

    /// Validates all inputs and gathers what every form needs (taps and bias truncated to T).
    pub fn prepare<F: Copy>(&self, inputs: &Tensors<F>) -> Result<Prepared<F>> {
        let x = get(inputs, "x")?;
        if x.ndim() != 3 {
            return Err(Error::shape("x", "[B, T, C]", fmt_shape(x.shape())));
        }
        let (batch, seq, channels) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let head_dim = self.head_dim(channels)?;
        let (taps, bias) = self.prepare_statics(get(inputs, "w")?, inputs.get("bias"), seq)?;
        Ok(Prepared {
            batch,
            seq,
            channels,
            heads: self.cfg.heads,
            head_dim,
            kernel_width: self.cfg.kernel_width,
            taps,
            bias,
        })
    }
}

/// The causal Toeplitz matrix `A[t,s] = taps[t−s]` for `s ≤ t` (`T = taps.len()`).
pub fn toeplitz_matrix(taps: ArrayView1<'_, f64>) -> Array2<f64> {
    let t = taps.len();
    Array2::from_shape_fn((t, t), |(i, j)| if j <= i { taps[i - j] } else { 0.0 })
}

impl Mixer for Toeplitz {
    fn name(&self) -> &str {
        &self.name
    }
    fn family(&self) -> &'static str {
        FAMILY
    }
    /// The naive decoder keeps the input history, `n · B · C`; the online decoder's
    /// pending partial sums depend on its block schedule (no closed form here).
    fn decoder_cache(&self, dims: &Dims, consumed: usize) -> Option<usize> {
        match self.cfg.decoder {
            DecoderKind::Naive => Some(consumed * dims.get("B")? * dims.get("C")?),
            DecoderKind::Online => None,
        }
    }
    fn config(&self) -> serde_json::Value {
        serde_json::to_value(&self.cfg).unwrap_or(serde_json::Value::Null)
    }
    fn spec(&self) -> InputSpec {
        let h = Dim::Fixed(self.cfg.heads);
        let w_shape = if self.cfg.kernel_width == 1 {
            vec![h.clone(), Dim::Sym("Tw")]
        } else {
            vec![Dim::Fixed(self.cfg.kernel_width), h.clone(), Dim::Sym("Tw")]
        };
        InputSpec {
            inputs: vec![
                InputDecl::new("x", vec![Dim::Sym("B"), Dim::Sym("T"), Dim::Sym("C")]),
                InputDecl::new("w", w_shape).fixed(),
                InputDecl::new("bias", vec![h, Dim::Sym("Tw")]).fixed().optional(),
            ],
            mixed: "x",
        }
    }
    /// `Tw ≥ T` (a tap per lag; longer kernels are truncated to `T`), and `C` a multiple of
    /// `H` (reported as `C` = the next multiple).
    fn bounds(&self, dims: &Dims) -> Vec<(&'static str, Bound, &'static str)> {
        let mut v = Vec::new();
        if let Some(&t) = dims.get("T") {
            v.push((
                "Tw",
                Bound::AtLeast(t),
                "w and bias need a tap for every lag 0..T; extra taps are ignored",
            ));
        }
        if let Some(&c) = dims.get("C") {
            let h = self.cfg.heads;
            if !c.is_multiple_of(h) {
                v.push((
                    "C",
                    Bound::Exact(c.div_ceil(h).max(1) * h),
                    "channels must be a multiple of `heads`",
                ));
            }
        }
        v
    }
    fn materialize(&self, inputs: &Tensors<f64>) -> Result<Materialization> {
        let p = self.prepare(inputs)?;
        let (t, d, kw) = (p.seq, p.head_dim, p.kernel_width);
        let mut mat = Materialization::new(t);
        // A per (shift i, head h), shared by every batch row and channel group.
        let a: Vec<Vec<Arc<Array2<f64>>>> = (0..kw)
            .map(|i| {
                (0..p.heads).map(|h| Arc::new(toeplitz_matrix(ArrayView1::from(p.tap_row(i, h))))).collect()
            })
            .collect();
        for b in 0..p.batch {
            for h in 0..p.heads {
                let h0 = h * d;
                for (out, shifts) in self.head_blocks(d) {
                    let out = h0 + out.start..h0 + out.end;
                    let terms = shifts
                        .iter()
                        .map(|&(i, dl)| Term { a: a[i][h].clone(), cols: out.start - dl..out.end - dl })
                        .collect();
                    mat.blocks.push(Block { batch: b, out_cols: out, terms, b: None });
                }
                if let Some(row) = p.bias_row(h) {
                    let vals = Array2::from_shape_fn((t, d), |(s, _)| row[s]);
                    mat.offsets.push(Offset { batch: b, out_cols: h0..h0 + d, values: Arc::new(vals) });
                }
            }
        }
        Ok(mat)
    }
    materialized_vjp!(Self::entry_vjp);
    /// `x [B, Tw, C]` (the inputs consumed, rows from the position on zero) and
    /// `position [B]` ([`super::toeplitz_state`]).
    fn state_shapes(&self, dims: &Dims) -> std::result::Result<crate::state::StateShapes, String> {
        state::shapes(dims)
    }
    /// `Tw = 2T`: room for a state at a position up to `T`.
    fn state_check_dims(&self, dims: &Dims) -> Dims {
        let mut d = dims.clone();
        if let Some(&t) = dims.get("T") {
            d.insert("Tw", 2 * t);
        }
        d
    }
    fn random_state(&self, dims: &Dims, seed: u64) -> Result<Tensors<f64>> {
        let shapes = self.state_shapes(dims).map_err(|why| crate::state::no_state(&self.name, &why))?;
        state::random_state(dims, crate::state::random(&shapes, seed))
    }
    state_oracle!(|m, x, s| state::run(x, s, |e| crate::oracle::dense(m, e)), |m, x, s, dy, df, req| {
        state::vjp(crate::state::StateVjp { x, initial: s, dy, d_final: df, requires: req }, |e, d| {
            crate::grad::materialized_backward(m, e, d, &crate::grad::Requires::All)
        })
    });
    /// `x ~ N(0,1)`; `w[i,h,j] = n·exp(−j/τ)·√(2/(τ·Kw))` with `n ~ N(0,1)` and
    /// `τ = max(Tw/4, 2)` (decaying, `Σⱼ w² ≈ 1/Kw`, yet long-range lags still matter);
    /// `bias ~ N(0, 1/4)` (drawn, so the oracle checks cover it).
    fn random_inputs(&self, dims: &Dims, seed: u64) -> Result<Tensors<f64>> {
        let dims = complete_dims(self, dims);
        let mut out = self.spec().random(&dims, seed, false)?;
        let tw = *dims.get("Tw").ok_or_else(|| Error::config(&self.name, "size `Tw` (or `T`) not given"))?;
        let (kw, h) = (self.cfg.kernel_width, self.cfg.heads);
        let tau = (tw as f64 / 4.0).max(2.0);
        let scale = (2.0 / (tau * kw as f64)).sqrt();
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7031_7a11_u64);
        let shape: Vec<usize> = if kw == 1 { vec![h, tw] } else { vec![kw, h, tw] };
        let w = ArrayD::from_shape_fn(IxDyn(&shape), |ix| {
            let j = ix[shape.len() - 1];
            let n: f64 = StandardNormal.sample(&mut rng);
            n * (-(j as f64) / tau).exp() * scale
        });
        let bias = ArrayD::from_shape_fn(IxDyn(&[h, tw]), |_| {
            let n: f64 = StandardNormal.sample(&mut rng);
            0.5 * n
        });
        out.insert("w".into(), w);
        out.insert("bias".into(), bias);
        Ok(out)
    }
    fn working_memory(&self, form: crate::Form, dims: &crate::Dims, elem: f64) -> f64 {
        crate::memory::toeplitz(form, dims, elem, self.cfg.heads, self.cfg.kernel_width)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Toeplitz {
    /// `w̄[i,h,j] = Σ_t Ā_{i,h}[t, t−j]` summed over every block (batch row,
    /// channel group) that uses the term of shift `i` and head `h`; taps `j ≥ T` get 0;
    /// `bar(bias)[h,t] = Σ_{b, c ∈ h} D̄[b,t,c]`.
    fn entry_vjp(&self, inputs: &Tensors<f64>, grad: &MatGrad) -> Result<Tensors<f64>> {
        let p = self.prepare(inputs)?;
        let (t, d) = (p.seq, p.head_dim);
        let w = get(inputs, "w")?;
        let mut dw = ArrayD::<f64>::zeros(w.raw_dim());
        let bias = inputs.get("bias");
        let mut dbias = bias.map(|b| ArrayD::<f64>::zeros(b.raw_dim()));
        let layout = self.head_blocks(d);
        let (mut blk, mut off) = (0, 0);
        for _b in 0..p.batch {
            for h in 0..p.heads {
                for (_, shifts) in &layout {
                    let bg = grad
                        .blocks
                        .get(blk)
                        .ok_or_else(|| Error::Numerical("toeplitz backward: too few blocks".into()))?;
                    for (&(i, _), ga) in shifts.iter().zip(&bg.terms) {
                        for j in 0..t {
                            let g: f64 = (j..t).map(|r| ga[[r, r - j]]).sum();
                            if w.ndim() == 2 {
                                dw[[h, j]] += g;
                            } else {
                                dw[[i, h, j]] += g;
                            }
                        }
                    }
                    blk += 1;
                }
                if let Some(db) = dbias.as_mut() {
                    let go = grad
                        .offsets
                        .get(off)
                        .ok_or_else(|| Error::Numerical("toeplitz backward: too few offsets".into()))?;
                    for r in 0..t {
                        db[[h, r]] += go.row(r).sum();
                    }
                    off += 1;
                }
            }
        }
        let mut out = Tensors::new();
        out.insert(grad_name("w"), dw);
        if let Some(db) = dbias {
            out.insert(grad_name("bias"), db);
        }
        Ok(out)
    }
}

/// Reference evaluation straight from the formula (any scalar type, `O(T²·Kw)` per column).
/// Only this module's tests use it (as an oracle that is independent of the materialization);
/// backends are checked against the materialized oracle by the shared suite.
pub fn reference<F: Real>(m: &Toeplitz, inputs: &Tensors<F>) -> Result<ArrayD<F>> {
    let p = m.prepare(inputs)?;
    let x = get(inputs, "x")?;
    let mut y = ArrayD::<F>::zeros(x.raw_dim());
    for b in 0..p.batch {
        for e in 0..p.channels {
            let h = e / p.head_dim;
            for t in 0..p.seq {
                let mut acc = p.bias_row(h).map(|r| r[t]).unwrap_or_else(F::zero);
                for (i, dl) in m.shifts(e % p.head_dim) {
                    let w = p.tap_row(i, h);
                    for s in 0..=t {
                        acc += w[t - s] * x[[b, s, e - dl]];
                    }
                }
                y[[b, t, e]] = acc;
            }
        }
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_sizes() {
        assert_eq!(fast_size(0), 1);
        assert_eq!(fast_size(1), 1);
        assert_eq!(fast_size(11), 12);
        assert_eq!(fast_size(13), 14);
        assert_eq!(fast_size(73), 75);
        assert_eq!(fast_size(121), 125);
        assert_eq!(fast_size(2 * 257 - 1), 525);
        assert_eq!(fast_size(262_143), 262_144);
        for n in 1..2000 {
            let p = fast_size(n);
            assert!(p >= n && is_fast_size(p));
            assert!((n..p).all(|q| !is_fast_size(q)), "n = {n}");
        }
    }
    use crate::mixer::validate;
    use crate::tensor::AnyTensors;

    fn mk(cfg: serde_json::Value) -> Toeplitz {
        Toeplitz::from_json("toeplitz", &cfg).unwrap()
    }

    fn dims(b: usize, t: usize, c: usize) -> Dims {
        [("B", b), ("T", t), ("C", c)].into_iter().collect()
    }

    #[test]
    fn config_defaults_and_rejections() {
        let m = mk(serde_json::json!({}));
        assert_eq!(m.cfg, ToeplitzConfig::default());
        assert_eq!(m.config()["decoder"], "online");
        for bad in [
            serde_json::json!({"heads": 0}),
            serde_json::json!({"kernel_width": 0}),
            serde_json::json!({"decoder": "fast"}),
            serde_json::json!({"head": 2}),
        ] {
            let e = Toeplitz::from_json("toeplitz", &bad).unwrap_err().to_string();
            assert!(e.contains("invalid config for `toeplitz`"), "{e}");
        }
    }

    /// The oracle (materialization) equals the formula, for every variant, with bias.
    #[test]
    fn materialization_matches_formula() {
        for (cfg, c) in [
            (serde_json::json!({}), 3),
            (serde_json::json!({"heads": 2}), 6),
            (serde_json::json!({"heads": 2, "kernel_width": 2}), 6),
            (serde_json::json!({"heads": 3, "kernel_width": 4}), 9),
            (serde_json::json!({"heads": 2, "kernel_width": 5}), 4),
        ] {
            let m = mk(cfg.clone());
            let inp = m.random_inputs(&dims(2, 11, c), 3).unwrap();
            assert_eq!(inp["w"].shape().last(), Some(&11));
            let mat = m.materialize(&inp).unwrap();
            let y = crate::oracle::solve(&mat, &inp["x"]).unwrap();
            let r = reference(&m, &inp).unwrap();
            let cmp = crate::tolerance::Tolerance::F64.compare(y.view(), r.view());
            assert!(cmp.pass, "{cfg}: {cmp:?}");
        }
    }

    /// A hand-computed case: one head, w = [1, 2, 3], kernel width 2 across two channels.
    #[test]
    fn small_case_by_hand() {
        let m = mk(serde_json::json!({"kernel_width": 2}));
        let mut inp = Tensors::new();
        // x[s, c]: channel 0 = [1, 0, 0], channel 1 = [0, 1, 0].
        let x = ndarray::arr3(&[[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]]).into_dyn();
        // w[0] (shift δ=1, reads channel e−1) = [10, 20, 30]; w[1] (δ=0) = [1, 2, 3].
        let w = ndarray::arr3(&[[[10.0, 20.0, 30.0, 99.0]], [[1.0, 2.0, 3.0, 99.0]]]).into_dyn();
        inp.insert("x".into(), x);
        inp.insert("w".into(), w);
        let y = reference(&m, &inp).unwrap();
        // Channel 0: only δ=0 → conv([1,2,3], [1,0,0]) = [1,2,3].
        // Channel 1: δ=0 on [0,1,0] → [0,1,2]; δ=1 on channel 0 → [10,20,30]. Sum [10,21,32].
        let want = ndarray::arr3(&[[[1.0, 10.0], [2.0, 21.0], [3.0, 32.0]]]).into_dyn();
        assert_eq!(y, want);
        let yo = crate::oracle::solve(&m.materialize(&inp).unwrap(), &inp["x"]).unwrap();
        assert!(crate::tolerance::Tolerance::F64.compare(yo.view(), want.view()).pass);
    }

    /// The shape-only checks give the errors of the data path, for every way a shape can be
    /// wrong (rank, kernel width, heads, too few taps, bias shape).
    #[test]
    fn check_statics_agrees_with_prepare_statics() {
        let m1 = mk(serde_json::json!({"heads": 2}));
        let m3 = mk(serde_json::json!({"heads": 2, "kernel_width": 3}));
        let cases: [(&Toeplitz, &[usize], Option<&[usize]>); 9] = [
            (&m1, &[2, 9], Some(&[2, 9])),
            (&m1, &[2, 9], None),
            (&m1, &[3, 9], None),
            (&m1, &[2, 7], None),
            (&m1, &[2, 9], Some(&[3, 9])),
            (&m1, &[2, 9], Some(&[2, 7])),
            (&m1, &[1, 2, 9], None),
            (&m3, &[3, 2, 9], None),
            (&m3, &[2, 9], None),
        ];
        for (m, w, bias) in cases {
            let data = m.prepare_statics(
                &ArrayD::<u8>::zeros(IxDyn(w)),
                bias.map(|b| ArrayD::<u8>::zeros(IxDyn(b))).as_ref(),
                8,
            );
            let shapes = m.check_statics(w, bias, 8);
            assert_eq!(data.is_ok(), shapes.is_ok(), "{w:?} {bias:?}");
            if let (Err(a), Err(b)) = (data, shapes) {
                assert_eq!(a.to_string(), b.to_string());
            }
        }
    }

    #[test]
    fn clear_errors_for_short_kernels_and_bad_channels() {
        let m = mk(serde_json::json!({"heads": 2}));
        let mut inp = m.random_inputs(&dims(1, 8, 4), 0).unwrap();
        validate(&m, &AnyTensors::F64(inp.clone())).unwrap();
        // Longer kernels are accepted (truncated).
        let long = m.random_inputs(&[("B", 1), ("T", 8), ("C", 4), ("Tw", 12)].into_iter().collect(), 0);
        let long = long.unwrap();
        assert_eq!(long["w"].shape(), &[2, 12]);
        validate(&m, &AnyTensors::F64(long.clone())).unwrap();
        m.materialize(&long).unwrap();
        // Shorter: error naming w, T and Tw.
        inp.insert("w".into(), ArrayD::zeros(IxDyn(&[2, 5])));
        inp.insert("bias".into(), ArrayD::zeros(IxDyn(&[2, 5])));
        let e = validate(&m, &AnyTensors::F64(inp.clone())).unwrap_err().to_string();
        assert!(e.contains("Tw ≥ 8") && e.contains("Tw = 5"), "{e}");
        let e = m.materialize(&inp).unwrap_err().to_string();
        assert!(e.contains("`w`") && e.contains("T = 8"), "{e}");
        // C not divisible by H.
        let m3 = mk(serde_json::json!({"heads": 3}));
        let mut inp = m3.random_inputs(&dims(1, 8, 6), 0).unwrap();
        inp.insert("x".into(), ArrayD::zeros(IxDyn(&[1, 8, 4])));
        let e = validate(&m3, &AnyTensors::F64(inp.clone())).unwrap_err().to_string();
        assert!(e.contains("multiple of `heads`") && e.contains("C = 4"), "{e}");
        let e = m3.materialize(&inp).unwrap_err().to_string();
        assert!(e.contains("divisible by heads = 3"), "{e}");
        // Wrong head count in w.
        let mut inp = m.random_inputs(&dims(1, 8, 4), 0).unwrap();
        inp.insert("w".into(), ArrayD::zeros(IxDyn(&[3, 8])));
        assert!(validate(&m, &AnyTensors::F64(inp)).is_err());
    }
}
