//! The kernel spectra `ŵ` of the fast form, cached per kernel tensor.
//!
//! A model keeps its Toeplitz kernels `w` as device tensors across calls; their spectra
//! depend only on `w`, `T` and the FFT size, so they are computed once and reused. The key is
//! the tensor's identity ([`DeviceTensor::identity`]): its buffer (held weakly, so a dropped
//! tensor — whose buffer the pool may hand out again — never matches), offset and shape, with
//! `T` and `p`, and the stream they were computed on (work on another stream is not ordered
//! after them). A host-array call uploads `w` afresh, so it always computes the spectra (as the
//! CPU's content-keyed cache would for changed taps). At most [`CAPACITY`] spectra are kept,
//! least recently used first out.

use std::any::Any;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use cudarc::driver::CudaView;
use mixer_core::Result;

use super::common::FAMILY;
use crate::fft::{FftReal, rfft};
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{StreamKey, err, gpu, grid1, int, launch};
use crate::tensor::DeviceTensor;

/// Spectra kept at most.
pub const CAPACITY: usize = 8;

struct Entry<F: FftReal> {
    owner: Weak<Pooled<F>>,
    /// The stream the spectra were computed on: work on another one is not ordered after it.
    stream: StreamKey,
    offset: usize,
    shape: Vec<usize>,
    t: usize,
    n: usize,
    spectra: Arc<Pooled<F::C>>,
}

thread_local! {
    static HITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Cache hits on the calling thread (for tests that run beside others).
pub fn thread_hits() -> u64 {
    HITS.with(|h| h.get())
}

/// Entries of every element type, most recently used last.
static CACHE: LazyLock<Mutex<Vec<Box<dyn Any + Send>>>> = LazyLock::new(|| Mutex::new(Vec::new()));

/// The spectra of the first `t` taps of each row of `w` (`[rows, Lw]`), zero-padded to `n`:
/// `rows` rows of `n/2 + 1` bins, from the cache or computed now.
pub fn spectra<F: FftReal>(
    w: &DeviceTensor<F>,
    rows: usize,
    t: usize,
    n: usize,
) -> Result<Arc<Pooled<F::C>>> {
    let (owner, offset, shape) = w.identity();
    let stream = gpu()?.stream_key();
    let mut cache = CACHE.lock().map_err(|_| err(FAMILY, "spectrum cache poisoned"))?;
    // Entries of dropped tensors can never match again.
    cache.retain(|e| e.downcast_ref::<Entry<F>>().is_none_or(|e| e.owner.strong_count() > 0));
    let hit = cache.iter().position(|e| {
        e.downcast_ref::<Entry<F>>().is_some_and(|e| {
            Weak::ptr_eq(&e.owner, &owner)
                && e.stream == stream
                && e.offset == offset
                && e.shape == shape
                && e.t == t
                && e.n == n
        })
    });
    if let Some(i) = hit {
        let e = cache.remove(i);
        let s = e.downcast_ref::<Entry<F>>().map(|e| e.spectra.clone());
        cache.push(e);
        if let Some(s) = s {
            HITS.with(|h| h.set(h.get() + 1));
            return Ok(s);
        }
    }
    let lw = *w.shape().last().unwrap_or(&0);
    let spectra = Arc::new(compute::<F>(&w.view(), rows, lw, t, n)?);
    if cache.len() >= CAPACITY {
        cache.remove(0);
    }
    cache.push(Box::new(Entry::<F> { owner, stream, offset, shape, t, n, spectra: spectra.clone() }));
    Ok(spectra)
}

/// The spectra of the first `t` taps of each of the `rows` rows of `w` (`[rows, lw]`, on the
/// device), zero-padded to `n`: `rows` rows of `n/2 + 1` bins, computed now (no cache).
pub(crate) fn compute<F: FftReal>(
    w: &CudaView<'_, F>,
    rows: usize,
    lw: usize,
    t: usize,
    n: usize,
) -> Result<Pooled<F::C>> {
    let g = gpu()?;
    let f = g.kernel(FAMILY, &kernels::TOEPLITZ, &[], &format!("toeplitz_pack_w_{}", F::SUFFIX))?;
    let (ri, ti, lwi, ni) =
        (int(FAMILY, "Kw·H", rows)?, int(FAMILY, "T", t)?, int(FAMILY, "Tw", lw)?, int(FAMILY, "p", n)?);
    let mut wp = pool::take::<F>(FAMILY, rows * n)?;
    launch!(g, FAMILY, f, grid1(rows * n, 256); w, &mut *wp, &ri, &ti, &lwi, &ni)?;
    rfft::<F>(FAMILY, &wp, n, rows)
}

/// Number of cached spectra (all element types), for tests.
pub fn cached() -> usize {
    CACHE.lock().map(|c| c.len()).unwrap_or(0)
}
