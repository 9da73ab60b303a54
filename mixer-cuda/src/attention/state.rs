//! Attention from a KV cache on CUDA (docs/math.md §7.1), the `fast` form from a state: the run's
//! `T` queries against the cached keys and the run's own, without computing the cached tokens'
//! rows again (the extension's `O((ℓ + T)²)` work becomes `O((ℓ + T)·T)`).
//!
//! Batch row `b` with `ℓ_b` cached tokens reads the keys `[k_cache[b, 0 … ℓ_b − 1]; k[b]]` (and
//! the values alike) from one buffer of `R ≥ ℓ_b + T` token rows per batch row, and the forward
//! kernels are told that its query `t` sits at position `ℓ_b + t` among them (`attention::common::Keys`); every
//! kernel of the plain run takes them (the FMA kernel, the split-tf32, tf32 and bf16 tensor-core
//! kernels). Without a window, in the state's own element type (the `exact` and `tf32` modes),
//! that buffer is the final cache itself (capacity `N ≥ ℓ_b + T`, its rows from `ℓ_b + T` on zero):
//! the cached rows are copied once. With a window (the final cache keeps the last `w − 1` tokens)
//! or in the `bf16` mode (the kernels read bf16 keys; the cache stays in `F`) the keys are put
//! together in a buffer of `max_b ℓ_b + T` rows in the kernels' type and the final cache is copied
//! from the cache's rows and the run's.
//!
//! The backward from a cache ([`backward_from`]) is the extension's, on the device: the plain
//! backward (exact mode, on the values as stored) over each batch row's `[cache; run]` with zero
//! queries and cotangents on the cache's rows (so it computes them again: `O((ℓ + T)²)`); the
//! cache's gradient is the extension's rows `0 … ℓ_b − 1`, and the final cache's cotangent adds to
//! the rows it copied.
//!
//! The lengths are read back to the host (`B` numbers: the launch needs them) and checked as the
//! host checks them (whole numbers, `ℓ + T ≤ N` without a window); the cache rows past a length
//! are not read (on host arrays a cache whose rows there are not zero is refused before the
//! upload, `DeviceFamily::check_host_state`, as the CPU refuses it).

use mixer_core::mixers::attention::Attention;
use mixer_core::mixers::attention::state::{LENGTH, check_lengths, final_len};
use mixer_core::{Precision, Requires, Result};

use super::common::{FAMILY, Keys};
use super::fast::run_keys;
use crate::forms::{cotangent, input};
use crate::runtime::{err, gpu};
use crate::state_rows::{counts, finals, gathered, joined, split_grad};
use crate::tensor::{AnyDeviceTensor, DeviceScalar, DeviceTensor, DeviceTensors, GpuReal, bf16};

/// A run's cache: its `k` and `v` (`None`: empty), the lengths (checked for a run of `T` tokens)
/// and the capacity of the final cache.
struct Cache<F: GpuReal> {
    kv: Option<(DeviceTensor<F>, DeviceTensor<F>)>,
    lens: Vec<usize>,
    cap: usize,
}

impl<F: GpuReal> Cache<F> {
    /// The cache `s0` of a run of `q`'s `T` tokens (`None`: empty, `B` rows).
    fn of(a: &Attention, q: &AnyDeviceTensor, s0: Option<&DeviceTensors>) -> Result<Self> {
        let [b, t_len] = [q.shape()[0], q.shape()[1]];
        Ok(match s0 {
            Some(s) => {
                let (kc, vc, l) = (input::<F>(s, "k")?, input::<F>(s, "v")?, input::<F>(s, LENGTH)?);
                let cap = kc.shape()[1];
                let lens = check_lengths(a, l.to_host()?.iter().map(|v| v.f64()), cap, t_len)?;
                Cache { kv: Some((kc.into_owned(), vc.into_owned())), lens, cap }
            }
            None => Cache { kv: None, lens: vec![0; b], cap: a.window().map_or(t_len, |w| w - 1) },
        })
    }
    fn k(&self) -> Option<&DeviceTensor<F>> {
        self.kv.as_ref().map(|c| &c.0)
    }
    fn v(&self) -> Option<&DeviceTensor<F>> {
        self.kv.as_ref().map(|c| &c.1)
    }
    /// The final lengths after `t_len` tokens.
    fn keeps(&self, a: &Attention, t_len: usize) -> Vec<usize> {
        self.lens.iter().map(|&l| final_len(a, l, t_len)).collect()
    }
    fn longest(&self) -> usize {
        self.lens.iter().copied().max().unwrap_or(0)
    }
}

/// `y` and the final cache of `a`'s `fast` form from the cache `s0` (`None`: empty) on device
/// tensors in mode `p` (module documentation): `q`, `k`, `v` as the mode stores them, the cache
/// `k [B, N, H, Dk]`, `v [B, N, H, Dv]`, `length [B]` in `F`.
pub fn run_from<F: GpuReal>(
    a: &Attention,
    x: &DeviceTensors,
    s0: Option<&DeviceTensors>,
    p: Precision,
) -> Result<(AnyDeviceTensor, DeviceTensors)> {
    let q = x.get("q").ok_or_else(|| err(FAMILY, "internal: no `q`"))?;
    let cache = Cache::<F>::of(a, q, s0)?;
    match q {
        AnyDeviceTensor::Bf16(_) => run_typed::<F, bf16>(a, x, &cache, p),
        _ => run_typed::<F, F>(a, x, &cache, p),
    }
}

/// [`run_from`] with the run's activations in `E` (`F`, or bf16 in the bf16 mode).
fn run_typed<F: GpuReal, E: DeviceScalar>(
    a: &Attention,
    x: &DeviceTensors,
    cache: &Cache<F>,
    p: Precision,
) -> Result<(AnyDeviceTensor, DeviceTensors)> {
    let run = |name: &str| -> Result<&DeviceTensor<E>> {
        let t = x.get(name).ok_or_else(|| err(FAMILY, format!("internal: no `{name}`")))?;
        E::unwrap(t).ok_or_else(|| err(FAMILY, format!("`{name}` is {}, `q` is {}", t.dtype(), E::ELEM)))
    };
    let (k, v) = (run("k")?, run("v")?);
    let (t_len, lens, cap) = (k.shape()[1], &cache.lens, cache.cap);
    let keeps = cache.keeps(a, t_len);
    let longest = cache.longest();
    let prefix: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
    let prefix = gpu()?
        .stream()
        .clone_htod(&prefix)
        .map_err(|e| err(FAMILY, format!("uploading the lengths: {e}")))?;
    // The final cache is the key buffer where nothing is dropped and no type changes.
    let in_place = a.window().is_none() && E::ELEM == F::ELEM;
    let rows = if in_place { cap } else { longest + t_len };
    let kx = joined::<F, E>(cache.k(), k, lens, rows)?;
    let vx = joined::<F, E>(cache.v(), v, lens, rows)?;
    let mut inputs = x.clone();
    inputs.insert("k".into(), E::wrap(kx.clone()));
    inputs.insert("v".into(), E::wrap(vx.clone()));
    let keys = Keys { prefix: &prefix, rows, longest };
    let y = run_keys::<F>(a, &inputs, p, Some(&keys))?;
    let (kf, vf) = if in_place {
        (same::<E, F>(&kx)?, same::<E, F>(&vx)?)
    } else {
        (finals::<F, E>(cache.k(), k, lens, &keeps, cap)?, finals::<F, E>(cache.v(), v, lens, &keeps, cap)?)
    };
    let fin = [("k", kf), ("v", vf), (LENGTH, counts::<F>(&keeps)?)];
    Ok((y, fin.into_iter().map(|(n, t)| (n.to_string(), F::wrap(t))).collect()))
}

/// The backward of [`run_from`] (module documentation): the gradients `d_q`, `d_k`, `d_v` and,
/// with `s0`, the cache's (`length`'s zero), from `dy` and the final cache's cotangent `d_final`
/// (`None`: zero); computed in the exact mode on the values as stored, whatever `_p`.
pub fn backward_from<F: GpuReal>(
    a: &Attention,
    x: &DeviceTensors,
    s0: Option<&DeviceTensors>,
    dy: &AnyDeviceTensor,
    d_final: Option<&DeviceTensors>,
    _req: &Requires,
    _p: Precision,
) -> Result<(DeviceTensors, DeviceTensors)> {
    let q0 = x.get("q").ok_or_else(|| err(FAMILY, "internal: no `q`"))?;
    let cache = Cache::<F>::of(a, q0, s0)?;
    let (q, k, v) = (input::<F>(x, "q")?, input::<F>(x, "k")?, input::<F>(x, "v")?);
    let (t_len, lens) = (q.shape()[1], &cache.lens);
    let mut y_shape = q.shape().to_vec();
    y_shape[3] = v.shape()[3];
    let dy = cotangent::<F>(dy, &y_shape)?;
    let n = cache.longest() + t_len;
    let mut ext = x.clone();
    ext.insert("q".into(), F::wrap(joined::<F, F>(None, &q, lens, n)?));
    ext.insert("k".into(), F::wrap(joined::<F, F>(cache.k(), &k, lens, n)?));
    ext.insert("v".into(), F::wrap(joined::<F, F>(cache.v(), &v, lens, n)?));
    let dy_ext = F::wrap(joined::<F, F>(None, &dy, lens, n)?);
    let g = super::backward::run::<F>(a, &ext, &dy_ext, &Requires::All, Precision::Exact)?;
    let keeps = cache.keeps(a, t_len);
    let grad = |name: &str| input::<F>(&g, &format!("d_{name}"));
    let df = |name: &str| d_final.map(|d| input::<F>(d, name)).transpose();
    let dq = gathered::<F>(&*grad("q")?, lens, t_len)?;
    let (dk, dkc) = split_grad::<F>(&*grad("k")?, df("k")?.as_deref(), lens, &keeps, t_len, cache.cap)?;
    let (dv, dvc) = split_grad::<F>(&*grad("v")?, df("v")?.as_deref(), lens, &keeps, t_len, cache.cap)?;
    let grads = [("d_q", dq), ("d_k", dk), ("d_v", dv)];
    let grads = grads.into_iter().map(|(n, t)| (n.to_string(), F::wrap(t))).collect();
    let mut ds = DeviceTensors::new();
    if s0.is_some() {
        ds.insert("k".into(), F::wrap(dkc));
        ds.insert("v".into(), F::wrap(dvc));
        ds.insert(LENGTH.into(), F::wrap(DeviceTensor::<F>::zeros(&[lens.len()])?));
    }
    Ok((grads, ds))
}

/// `t` as the same tensor of type `B` (`A` and `B` the same type here).
fn same<A: DeviceScalar, B: DeviceScalar>(t: &DeviceTensor<A>) -> Result<DeviceTensor<B>> {
    B::unwrap(&A::wrap(t.clone())).cloned().ok_or_else(|| err(FAMILY, "internal: key buffer of another type"))
}
