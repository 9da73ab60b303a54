//! The `fast` backward of the base mixers on CUDA (docs/math.md §2.7, docs/gradients.md "GPU"):
//! the vector–Jacobian products `d_q`, `d_k`, `d_v`, `d_g`, `d_beta` for a cotangent `dy`,
//! kernels in `kernels/loglinear_backward.cu`. The lifts are refused ([`unsupported`]).
//!
//! **Linear attention and Mamba-2, by transposed operators.** Per (batch, head), with
//! `G_t = Σ_{r≤t} g_r` and `y_t = σ Σ_{s≤t} e^{G_t−G_s} (q_t·k_s) v_s`:
//! - `dq_t = σ Σ_{s≤t} e^{G_t−G_s} (dy_t·v_s) k_s` — the forward with `(q, k, v) ← (dy, v, k)`;
//! - `dv_s = σ Σ_{t≥s} e^{G_t−G_s} (k_s·q_t) dy_t` and `dk_s = σ Σ_{t≥s} e^{G_t−G_s} (v_s·dy_t) q_t`
//!   — anti-causal, so the forward on time-reversed sequences (`t' = T−1−t`) with the reversed
//!   log-decays `g'_0 = 0`, `g'_j = g_{T−j}`: `dv = rev(fwd(rev k, rev q, rev dy, g'))`,
//!   `dk = rev(fwd(rev v, rev dy, rev q, g'))`;
//! - `dG_t = q_t·dq_t − k_t·dk_t`, `dg_i = Σ_{t≥i} dG_t` (f64 dots and sums): `dG` token-parallel
//!   (a warp per token), then the suffix sums by tiles of `L` tokens ([`dg_tile`]): each tile's
//!   sum, the exclusive suffix sums of the tile sums, and each tile walked from its suffix, every
//!   sum in a fixed order (last token first).
//!
//! The forward is this backend's `fast` form ([`super::fast::run`]), in the call's mode (exact or
//! tf32; the bf16 mode converts the activations and `dy` to f32 and runs the tf32 kernels). The
//! recipe ([`transposed`]) is written once over [`Transposes`]; the tests run it on the CPU too.
//!
//! **Gated DeltaNet** runs the chunked backward through the WY/UT form
//! ([`super::backward_chunked`]).

use std::marker::PhantomData;

use mixer_core::mixers::loglinear::{Base, LogLinear};
use mixer_core::{Error, Precision, Requires, Result, grad_name};

use super::common::FAMILY;
use super::{backward_chunked, fast};
use crate::forms::input;
use crate::kernels;
use crate::pool;
use crate::runtime::{err, gpu, grid1, int, launch};
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// Why the `fast` backward of `ll` does not run on CUDA, or `None`.
pub fn unsupported(ll: &LogLinear) -> Option<String> {
    ll.lift.is_some().then(|| "the lifted backward is not on CUDA yet (the CPU backend has it)".to_string())
}

/// The `fast` backward on device tensors: `d_<input>` for every given input `req` asks for
/// (shapes of the inputs, `F`; f32 in the bf16 mode). See the module documentation.
pub fn run<F: GpuReal>(
    ll: &LogLinear,
    x: &DeviceTensors,
    dy: &AnyDeviceTensor,
    req: &Requires,
    p: Precision,
) -> Result<DeviceTensors> {
    if let Some(why) = unsupported(ll) {
        return Err(err(FAMILY, why));
    }
    let (q, k, v) = (input::<F>(x, "q")?, input::<F>(x, "k")?, input::<F>(x, "v")?);
    let dy_map: DeviceTensors = [("dy".to_string(), dy.clone())].into_iter().collect();
    let dy = input::<F>(&dy_map, "dy")?;
    let &[b, t, h, dk] = q.shape() else {
        return Err(Error::shape("q", "[B, T, H, Dk]", format!("{:?}", q.shape())));
    };
    let dv = v.shape().get(3).copied().unwrap_or(0);
    for (name, got, want) in
        [("k", k.shape(), [b, t, h, dk]), ("v", v.shape(), [b, t, h, dv]), ("dy", dy.shape(), [b, t, h, dv])]
    {
        if got != want {
            return Err(Error::shape(name, format!("{want:?}"), format!("{got:?}")));
        }
    }
    let g = if ll.base.has_decay() { Some(input::<F>(x, "g")?) } else { None };
    let beta = if ll.base.has_beta() { Some(input::<F>(x, "beta")?) } else { None };
    for (name, a) in [("g", &g), ("beta", &beta)] {
        if let Some(a) = a
            && a.shape() != [b, t, h]
        {
            return Err(Error::shape(name, format!("{:?}", [b, t, h]), format!("{:?}", a.shape())));
        }
    }
    let wants = |n: &str| req.wants(n) && x.contains_key(n);
    let mut out = DeviceTensors::new();
    let mut put = |name: &str, a: DeviceTensor<F>| {
        if wants(name) {
            out.insert(grad_name(name), F::wrap(a));
        }
    };
    if b * t * h * dk * dv == 0 {
        // y is identically zero (or empty): every gradient is zero.
        put("q", DeviceTensor::zeros(q.shape())?);
        put("k", DeviceTensor::zeros(k.shape())?);
        put("v", DeviceTensor::zeros(v.shape())?);
        if ll.base.has_decay() {
            put("g", DeviceTensor::zeros(&[b, t, h])?);
        }
        if ll.base.has_beta() {
            put("beta", DeviceTensor::zeros(&[b, t, h])?);
        }
        return Ok(out);
    }
    match ll.base {
        Base::LinearAttention | Base::Mamba2 => {
            // `d_g` is the reverse cumulative sum of `q·dq − k·dk`, a difference of nearly equal
            // sums (its total over the sequence is exactly 0), so the tf32 kernels' rounding of
            // `dq` and `dk` grows far past the mode's bound there: with decays the transposed runs
            // take the exact kernels in every mode (the tf32/bf16 test failed on the H200 before).
            // Without decays (linear attention) the tf32 kernels run in the tf32 and bf16 modes
            // (on f32 activations in the bf16 mode).
            let fp =
                if p == Precision::Exact || ll.base.has_decay() { Precision::Exact } else { Precision::Tf32 };
            let ops = OnDevice::<F> { ll, p: fp, _f: PhantomData };
            let want = Wants { q: wants("q"), k: wants("k"), v: wants("v"), g: g.is_some() && wants("g") };
            let r = transposed(&ops, &q, &k, &v, g.as_deref(), &dy, want)?;
            for (name, a) in [("q", r.dq), ("k", r.dk), ("v", r.dv), ("g", r.dg)] {
                if let Some(a) = a {
                    put(name, a);
                }
            }
        }
        Base::GatedDeltaNet => {
            let (Some(g), Some(beta)) = (g.as_deref(), beta.as_deref()) else {
                return Err(err(FAMILY, "gated DeltaNet needs `g` and `beta`"));
            };
            let [dq, dkk, dvv, db, dg] =
                backward_chunked::delta(ll, [&q, &k, &v, g, beta, &dy], [b, t, h, dk, dv])?;
            put("q", dq);
            put("k", dkk);
            put("v", dvv);
            put("beta", db);
            put("g", dg);
        }
    }
    Ok(out)
}

/// Which gradients the transposed-operator backward must produce.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Wants {
    pub q: bool,
    pub k: bool,
    pub v: bool,
    /// `d_g` (only with a decay).
    pub g: bool,
}

/// The gradients the transposed-operator backward produced (`None`: not wanted).
pub(crate) struct Transposed<T> {
    pub dq: Option<T>,
    pub dk: Option<T>,
    pub dv: Option<T>,
    pub dg: Option<T>,
}

/// The operations [`transposed`] is written in: sequences `[B, T, H, D]`, decays `[B, T, H]`.
pub(crate) trait Transposes {
    /// A tensor.
    type T;
    /// `out[b, t] = x[b, T−1−t]`.
    fn reverse(&self, x: &Self::T) -> Result<Self::T>;
    /// The reversed log-decays: `g'[b, 0] = 0`, `g'[b, j] = g[b, T−j]` (j ≥ 1).
    fn reverse_decay(&self, g: &Self::T) -> Result<Self::T>;
    /// The base mixer's forward `y_t = σ Σ_{s≤t} e^{G_t−G_s} (q_t·k_s) v_s` (no decay: `G = 0`).
    fn forward(&self, q: &Self::T, k: &Self::T, v: &Self::T, g: Option<&Self::T>) -> Result<Self::T>;
    /// `dg_i = Σ_{t≥i} (q_t·dq_t − k_t·dk_t)`.
    fn decay_grad(&self, q: &Self::T, dq: &Self::T, k: &Self::T, dk: &Self::T) -> Result<Self::T>;
}

/// The VJP of linear attention (`g = None`) or Mamba-2 by transposed operators (module
/// documentation): one forward for `dq`, one reversed forward each for `dv` and `dk`, then `dg`.
pub(crate) fn transposed<O: Transposes>(
    o: &O,
    q: &O::T,
    k: &O::T,
    v: &O::T,
    g: Option<&O::T>,
    dy: &O::T,
    want: Wants,
) -> Result<Transposed<O::T>> {
    let need_q = want.q || want.g;
    let need_k = want.k || want.g;
    let dq = if need_q { Some(o.forward(dy, v, k, g)?) } else { None };
    let (mut dk, mut dv) = (None, None);
    if need_k || want.v {
        let gr = g.map(|g| o.reverse_decay(g)).transpose()?;
        let (rq, rdy) = (o.reverse(q)?, o.reverse(dy)?);
        if want.v {
            let rk = o.reverse(k)?;
            dv = Some(o.reverse(&o.forward(&rk, &rq, &rdy, gr.as_ref())?)?);
        }
        if need_k {
            let rv = o.reverse(v)?;
            dk = Some(o.reverse(&o.forward(&rv, &rdy, &rq, gr.as_ref())?)?);
        }
    }
    let dg = match (want.g, &dq, &dk) {
        (true, Some(dq), Some(dk)) => Some(o.decay_grad(q, dq, k, dk)?),
        _ => None,
    };
    Ok(Transposed { dq: if want.q { dq } else { None }, dk: if want.k { dk } else { None }, dv, dg })
}

/// [`Transposes`] on device tensors: the `kernels/loglinear_backward.cu` reversals and the decay
/// gradient's `llb_dg_*` passes, and this backend's `fast` forward in mode `p`.
struct OnDevice<'a, F> {
    ll: &'a LogLinear,
    p: Precision,
    _f: PhantomData<F>,
}

/// `[B, T, H, D]` of a sequence tensor (`D = 1` for `[B, T, H]`).
fn bthd(s: &[usize]) -> Result<[i32; 4]> {
    let d = s.get(3).copied().unwrap_or(1);
    match s {
        [b, t, h, ..] => {
            Ok([int(FAMILY, "B", *b)?, int(FAMILY, "T", *t)?, int(FAMILY, "H", *h)?, int(FAMILY, "D", d)?])
        }
        _ => Err(err(FAMILY, format!("internal: a sequence tensor of shape {s:?}"))),
    }
}

impl<F: GpuReal> Transposes for OnDevice<'_, F> {
    type T = DeviceTensor<F>;

    fn reverse(&self, x: &DeviceTensor<F>) -> Result<DeviceTensor<F>> {
        let [b, t, h, d] = bthd(x.shape())?;
        let mut out = pool::take::<F>(FAMILY, x.len())?;
        let g = gpu()?;
        let f = g.kernel(FAMILY, &kernels::LOGLINEAR_BACKWARD, &[], &format!("llb_reverse_{}", F::SUFFIX))?;
        let xv = x.view();
        launch!(g, FAMILY, f, grid1(x.len().min(1 << 20), 256); &xv, &mut *out, &b, &t, &h, &d)?;
        DeviceTensor::from_pooled(out, x.shape())
    }

    fn reverse_decay(&self, gt: &DeviceTensor<F>) -> Result<DeviceTensor<F>> {
        let [b, t, h, _] = bthd(gt.shape())?;
        let mut out = pool::take::<F>(FAMILY, gt.len())?;
        let g = gpu()?;
        let f =
            g.kernel(FAMILY, &kernels::LOGLINEAR_BACKWARD, &[], &format!("llb_reverse_g_{}", F::SUFFIX))?;
        let gv = gt.view();
        launch!(g, FAMILY, f, grid1(gt.len().min(1 << 20), 256); &gv, &mut *out, &b, &t, &h)?;
        DeviceTensor::from_pooled(out, gt.shape())
    }

    fn forward(
        &self,
        q: &DeviceTensor<F>,
        k: &DeviceTensor<F>,
        v: &DeviceTensor<F>,
        g: Option<&DeviceTensor<F>>,
    ) -> Result<DeviceTensor<F>> {
        let mut x: DeviceTensors = [("q", q), ("k", k), ("v", v)]
            .into_iter()
            .map(|(n, a)| (n.to_string(), F::wrap(a.clone())))
            .collect();
        if let Some(g) = g {
            x.insert("g".into(), F::wrap(g.clone()));
        }
        let y = fast::run::<F>(self.ll, &x, self.p)?;
        F::unwrap(&y).cloned().ok_or_else(|| {
            err(
                FAMILY,
                format!("internal: the forward returned {} where {} was expected", y.dtype(), F::ELEM),
            )
        })
    }

    fn decay_grad(
        &self,
        q: &DeviceTensor<F>,
        dq: &DeviceTensor<F>,
        k: &DeviceTensor<F>,
        dk: &DeviceTensor<F>,
    ) -> Result<DeviceTensor<F>> {
        let [b, t, h, d] = bthd(q.shape())?;
        let (bh, tn) = (q.shape()[0] * q.shape()[2], q.shape()[1]);
        let l = dg_tile(tn);
        let nt = tn.div_ceil(l);
        let (bhi, li, nti) = (int(FAMILY, "B·H", bh)?, int(FAMILY, "tile", l)?, int(FAMILY, "tiles", nt)?);
        let mut a = pool::take::<f64>(FAMILY, bh * tn)?;
        let mut s = pool::take::<f64>(FAMILY, bh * nt)?;
        let mut out = pool::take::<F>(FAMILY, bh * tn)?;
        let g = gpu()?;
        let kernel = |name: &str| g.kernel(FAMILY, &kernels::LOGLINEAR_BACKWARD, &[], name);
        let (qv, dqv, kv, dkv) = (q.view(), dq.view(), k.view(), dk.view());
        let f = kernel(&format!("llb_dg_dot_{}", F::SUFFIX))?;
        launch!(g, FAMILY, f, grid1((bh * tn * 32).min(1 << 22), 256);
            &qv, &dqv, &kv, &dkv, &mut *a, &b, &t, &h, &d)?;
        let f = kernel("llb_dg_tile")?;
        launch!(g, FAMILY, f, grid1((bh * nt).min(1 << 20), 128); &*a, &mut *s, &bhi, &t, &li, &nti)?;
        let f = kernel("llb_dg_scan")?;
        launch!(g, FAMILY, f, grid1(bh.min(1 << 20), 128); &mut *s, &bhi, &nti)?;
        let f = kernel(&format!("llb_dg_out_{}", F::SUFFIX))?;
        launch!(g, FAMILY, f, grid1((bh * nt).min(1 << 20), 128);
            &*a, &*s, &mut *out, &bhi, &t, &h, &li, &nti)?;
        DeviceTensor::from_pooled(out, &q.shape()[..3])
    }
}

/// The tile length `L` of the decay gradient's suffix scan over `T` tokens: `max(64, ⌈√T⌉)`, so
/// that a tile's walk and the scan over the `⌈T/L⌉` tile sums are both `O(√T)` long.
pub(crate) fn dg_tile(t: usize) -> usize {
    let mut r = t.isqrt();
    if r * r < t {
        r += 1;
    }
    r.max(64)
}

/// The CPU `fast` backward of `m` in f64, every gradient: the reference of this module's and
/// [`super::backward_chunked`]'s host tests.
#[cfg(test)]
pub(crate) fn cpu_backward(
    m: &dyn mixer_core::mixer::Mixer,
    x: &mixer_core::Tensors<f64>,
    dy: &ndarray::ArrayD<f64>,
) -> mixer_core::Tensors<f64> {
    use mixer_core::{AnyTensors, Form, Tensor};
    mixer_registry::backward::backward(
        m,
        "cpu",
        Form::Fast,
        &AnyTensors::F64(x.clone()),
        &Tensor::F64(dy.clone()),
        &Requires::All,
    )
    .unwrap()
    .into_iter()
    .map(|(k, v)| (k, v.to_f64()))
    .collect()
}

#[cfg(test)]
mod tests {
    //! The transposed-operator recipe ([`transposed`]) run on the CPU — reversals on host arrays,
    //! the CPU's `fast` forward — against the CPU backward: fails if the reversal identities or
    //! the decay gradient are wrong.
    use super::*;
    use mixer_core::mixer::downcast;
    use mixer_core::{AnyTensors, Form, Tensors};
    use mixer_cpu as _;
    use mixer_registry::Backend;
    use ndarray::{ArrayD, Axis};

    struct OnHost<'a> {
        m: &'a LogLinear,
    }

    impl Transposes for OnHost<'_> {
        type T = ArrayD<f64>;
        fn reverse(&self, x: &ArrayD<f64>) -> Result<ArrayD<f64>> {
            let mut y = x.clone();
            y.invert_axis(Axis(1));
            Ok(y.as_standard_layout().into_owned())
        }
        fn reverse_decay(&self, g: &ArrayD<f64>) -> Result<ArrayD<f64>> {
            let t = g.shape()[1];
            let mut out = ArrayD::zeros(g.raw_dim());
            for j in 1..t {
                out.index_axis_mut(Axis(1), j).assign(&g.index_axis(Axis(1), t - j));
            }
            Ok(out)
        }
        fn forward(
            &self,
            q: &ArrayD<f64>,
            k: &ArrayD<f64>,
            v: &ArrayD<f64>,
            g: Option<&ArrayD<f64>>,
        ) -> Result<ArrayD<f64>> {
            let mut x: Tensors<f64> =
                [("q", q), ("k", k), ("v", v)].into_iter().map(|(n, a)| (n.to_string(), a.clone())).collect();
            if let Some(g) = g {
                x.insert("g".into(), g.clone());
            }
            let cpu = Backend::by_name("cpu")?;
            Ok(mixer_registry::run::run(self.m, &cpu, Form::Fast, &AnyTensors::F64(x))?.to_f64())
        }
        fn decay_grad(
            &self,
            q: &ArrayD<f64>,
            dq: &ArrayD<f64>,
            k: &ArrayD<f64>,
            dk: &ArrayD<f64>,
        ) -> Result<ArrayD<f64>> {
            let mut d = (q * dq - k * dk).sum_axis(Axis(3));
            for mut lane in d.lanes_mut(Axis(1)) {
                let dg = suffix_by_tiles(&lane.to_vec());
                lane.assign(&ndarray::ArrayView1::from(&dg));
            }
            Ok(d)
        }
    }

    /// The loops of `llb_dg_tile`, `llb_dg_scan` and `llb_dg_out` on one (batch, head)'s `dG`, in
    /// the kernels' order: `dg_i = Σ_{t≥i} dG_t`.
    fn suffix_by_tiles(a: &[f64]) -> Vec<f64> {
        let (tn, l) = (a.len(), dg_tile(a.len()));
        let nt = tn.div_ceil(l);
        let tile = |c: usize| c * l..tn.min(c * l + l);
        let mut s: Vec<f64> = (0..nt).map(|c| tile(c).rev().fold(0.0, |x, t| x + a[t])).collect();
        let mut acc = 0.0;
        for c in (0..nt).rev() {
            let x = s[c];
            s[c] = acc;
            acc += x;
        }
        let mut out = vec![f64::NAN; tn];
        for (c, &sc) in s.iter().enumerate() {
            let mut acc = sc;
            for t in tile(c).rev() {
                acc += a[t];
                out[t] = acc;
            }
        }
        out
    }

    #[test]
    fn the_tiled_suffix_scan_is_the_suffix_sum() {
        assert_eq!([0, 1, 64, 4096, 4097, 16384].map(dg_tile), [64, 64, 64, 64, 65, 128]);
        for tn in [1, 2, 63, 64, 65, 128, 129, 4095, 4097, 10000] {
            // Integers: every order of summation is exact, so the scan must match bit for bit.
            let a: Vec<f64> = (0..tn).map(|t| ((t * 7919 + 13) % 201) as f64 - 100.0).collect();
            let mut want = vec![0.0; tn];
            let mut acc = 0.0;
            for t in (0..tn).rev() {
                acc += a[t];
                want[t] = acc;
            }
            assert_eq!(suffix_by_tiles(&a), want, "T = {tn}");
            // Reals: within rounding of the sequential sum.
            let a: Vec<f64> = (0..tn).map(|t| (t as f64 * 0.37).sin()).collect();
            let got = suffix_by_tiles(&a);
            let mut acc = 0.0;
            for t in (0..tn).rev() {
                acc += a[t];
                assert!((got[t] - acc).abs() <= 1e-12 * (1.0 + acc.abs()), "T = {tn}, t = {t}");
            }
        }
    }

    #[test]
    fn the_transposed_recipe_on_the_cpu_is_the_cpu_backward() {
        for name in ["linear-attention", "mamba2"] {
            let boxed = mixer_registry::mixer(name, &serde_json::json!({"scale": 0.8})).unwrap();
            let ll: &LogLinear = downcast(boxed.as_ref(), "test").unwrap();
            for (b, t, h, dk, dv) in [(2, 37, 2, 5, 3), (1, 1, 1, 4, 6), (1, 70, 1, 3, 8)] {
                let dims = [("B", b), ("T", t), ("H", h), ("Dk", dk), ("Dv", dv)].into_iter().collect();
                let x = boxed.random_inputs(&dims, 7).unwrap();
                let dy = x["v"].mapv(|e| (3.0 * e + 0.2).sin());
                let want = cpu_backward(boxed.as_ref(), &x, &dy);
                let g = x.get("g");
                let want_g = Wants { q: true, k: true, v: true, g: g.is_some() };
                let got = transposed(&OnHost { m: ll }, &x["q"], &x["k"], &x["v"], g, &dy, want_g).unwrap();
                let got = [("d_q", got.dq), ("d_k", got.dk), ("d_v", got.dv), ("d_g", got.dg)];
                for (k, a) in got {
                    let Some(w) = want.get(k) else {
                        assert!(a.is_none(), "{name}: {k} without a decay");
                        continue;
                    };
                    let (a, w) = (a.unwrap(), w.clone());
                    // Relative, or absolute where the gradient is 0 (d_g at T = 1: q·dq = k·dk).
                    let err =
                        (&a - &w).mapv(|e| e * e).sum().sqrt() / w.mapv(|e| e * e).sum().sqrt().max(1.0);
                    assert!(err < 1e-12, "{name} {:?} {k}: error {err:.3e}", (b, t, h, dk, dv));
                }
            }
        }
    }

    #[test]
    fn only_the_wanted_gradients_are_computed() {
        let boxed = mixer_registry::mixer("mamba2", &serde_json::json!({})).unwrap();
        let ll: &LogLinear = downcast(boxed.as_ref(), "test").unwrap();
        let dims = [("B", 1), ("T", 9), ("H", 1), ("Dk", 2), ("Dv", 3)].into_iter().collect();
        let x = boxed.random_inputs(&dims, 3).unwrap();
        let dy = x["v"].clone();
        let want = Wants { q: false, k: false, v: true, g: false };
        let r = transposed(&OnHost { m: ll }, &x["q"], &x["k"], &x["v"], x.get("g"), &dy, want).unwrap();
        assert!(r.dv.is_some() && r.dq.is_none() && r.dk.is_none() && r.dg.is_none());
        let want = Wants { q: false, k: false, v: false, g: true };
        let r = transposed(&OnHost { m: ll }, &x["q"], &x["k"], &x["v"], x.get("g"), &dy, want).unwrap();
        assert!(r.dg.is_some() && r.dq.is_none() && r.dk.is_none() && r.dv.is_none());
    }
}
