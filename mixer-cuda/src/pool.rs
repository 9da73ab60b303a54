//! The backend's caching allocator: every device buffer of this backend comes from here, and
//! a dropped buffer goes back to a free list instead of to the driver, so that a call that
//! repeats the sizes of an earlier one allocates nothing (PyTorch's habit).
//!
//! Buffers are bucketed by element type and rounded-up length (8 sizes per power of two, at
//! most 12.5 % slack). All work of the backend is ordered on its one stream, so a buffer
//! freed after its last launch was enqueued can be handed to the next launch on the same
//! stream without waiting. [`stats`] counts the driver allocations, for tests and reports;
//! [`release_cached`] gives the cached buffers back to the driver.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use mixer_core::Result;

use crate::runtime::{err, gpu};

type Key = (TypeId, usize);

static FREE: LazyLock<Mutex<HashMap<Key, Vec<Box<dyn Any + Send>>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
static DRIVER_ALLOCS: AtomicU64 = AtomicU64::new(0);
static DRIVER_BYTES: AtomicUsize = AtomicUsize::new(0);
static CACHED_BYTES: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static THREAD_ALLOCS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Driver allocations made by the calling thread (for tests that run beside others).
pub fn thread_driver_allocs() -> u64 {
    THREAD_ALLOCS.with(|c| c.get())
}

/// What the allocator has done so far in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    /// Buffers obtained from the driver (a steady-state call adds none).
    pub driver_allocs: u64,
    /// Bytes obtained from the driver and not released.
    pub driver_bytes: usize,
    /// Bytes sitting in the free lists.
    pub cached_bytes: usize,
}

/// The allocator's counters.
pub fn stats() -> PoolStats {
    PoolStats {
        driver_allocs: DRIVER_ALLOCS.load(Ordering::Relaxed),
        driver_bytes: DRIVER_BYTES.load(Ordering::Relaxed),
        cached_bytes: CACHED_BYTES.load(Ordering::Relaxed),
    }
}

/// Gives every cached buffer back to the driver (buffers in use are not affected).
pub fn release_cached() {
    if let Ok(mut free) = FREE.lock() {
        let n: usize = CACHED_BYTES.swap(0, Ordering::Relaxed);
        DRIVER_BYTES.fetch_sub(n, Ordering::Relaxed);
        free.clear();
    }
}

/// The bucket length for a request of `n` elements: at least 256, then 8 steps per octave.
pub fn bucket(n: usize) -> usize {
    let n = n.max(1);
    if n <= 256 {
        return 256;
    }
    let top = usize::BITS - 1 - (n - 1).leading_zeros(); // 2^top ≤ n − 1 < 2^(top+1)
    let step = 1usize << (top - 3);
    n.div_ceil(step) * step
}

/// A device buffer of at least `len` elements, owned by the caller until dropped, then
/// returned to the pool.
pub struct Pooled<T: DeviceRepr + 'static> {
    slice: Option<CudaSlice<T>>,
    len: usize,
}

impl<T: DeviceRepr + 'static> std::fmt::Debug for Pooled<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pooled({} of {})", self.len, std::any::type_name::<T>())
    }
}

impl<T: DeviceRepr + 'static> Pooled<T> {
    /// The requested length (the buffer may be longer).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the requested length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: DeviceRepr + 'static> Deref for Pooled<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        self.slice.as_ref().expect("a pooled buffer is present until dropped")
    }
}

impl<T: DeviceRepr + 'static> DerefMut for Pooled<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        self.slice.as_mut().expect("a pooled buffer is present until dropped")
    }
}

impl<T: DeviceRepr + 'static> Drop for Pooled<T> {
    fn drop(&mut self) {
        if let Some(s) = self.slice.take() {
            let bytes = s.len() * std::mem::size_of::<T>();
            if let Ok(mut free) = FREE.lock() {
                CACHED_BYTES.fetch_add(bytes, Ordering::Relaxed);
                free.entry((TypeId::of::<T>(), s.len())).or_default().push(Box::new(s));
            } else {
                DRIVER_BYTES.fetch_sub(bytes, Ordering::Relaxed);
            }
        }
    }
}

/// A buffer of at least `n` elements (at least one) whose contents are whatever its last user
/// left; for buffers that the next launch overwrites entirely.
pub fn take<T: DeviceRepr + 'static>(kernel: &str, n: usize) -> Result<Pooled<T>> {
    let len = bucket(n);
    let key = (TypeId::of::<T>(), len);
    let cached =
        FREE.lock().map_err(|_| err(kernel, "device memory pool poisoned"))?.get_mut(&key).and_then(Vec::pop);
    let bytes = len * std::mem::size_of::<T>();
    let slice = match cached.map(|b| b.downcast::<CudaSlice<T>>()) {
        Some(Ok(s)) => {
            CACHED_BYTES.fetch_sub(bytes, Ordering::Relaxed);
            *s
        }
        _ => {
            let g = gpu()?;
            // SAFETY: device memory; every user either overwrites it or zeroes it first
            // ([`zeros`]).
            let s = unsafe { g.stream.alloc::<T>(len) }
                .map_err(|e| err(kernel, format!("allocating {bytes} bytes of device memory: {e}")))?;
            DRIVER_ALLOCS.fetch_add(1, Ordering::Relaxed);
            THREAD_ALLOCS.with(|c| c.set(c.get() + 1));
            DRIVER_BYTES.fetch_add(bytes, Ordering::Relaxed);
            s
        }
    };
    Ok(Pooled { slice: Some(slice), len: n })
}

/// A zero-filled buffer of at least `n` elements (the zeroing is a stream-ordered memset).
pub fn zeros<T: DeviceRepr + ValidAsZeroBits + 'static>(kernel: &str, n: usize) -> Result<Pooled<T>> {
    let mut p = take::<T>(kernel, n)?;
    gpu()?.stream.memset_zeros(&mut *p).map_err(|e| err(kernel, format!("zeroing a device buffer: {e}")))?;
    Ok(p)
}

/// Copies a host slice to a new pooled device buffer (at least one element, so that
/// kernels always get a valid pointer). The copy is enqueued on the stream.
pub fn upload<T: DeviceRepr + ValidAsZeroBits + 'static>(kernel: &str, s: &[T]) -> Result<Pooled<T>> {
    let mut p = take::<T>(kernel, s.len())?;
    if !s.is_empty() {
        gpu()?
            .stream
            .memcpy_htod(s, &mut p.slice_mut(0..s.len()))
            .map_err(|e| err(kernel, format!("host→device copy of {} elements: {e}", s.len())))?;
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    #[test]
    fn buckets_cover_the_request_with_little_slack() {
        for n in [0usize, 1, 255, 256, 257, 1000, 1023, 1024, 1025, 4097, 123_457, 1 << 30] {
            let b = super::bucket(n);
            assert!(b >= n.max(1), "{n} → {b}");
            assert!(n <= 256 || (b - n) * 8 <= n, "{n} → {b}: more than 12.5 % slack");
        }
        assert_eq!(super::bucket(1025), 1152);
    }
}
