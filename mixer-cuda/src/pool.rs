//! The backend's caching allocator: every device buffer of this backend comes from here, and
//! a dropped buffer goes back to a free list instead of to the driver, so that a call that
//! repeats the sizes of an earlier one allocates nothing (PyTorch's habit).
//!
//! Buffers are bucketed by stream, element type and rounded-up length (8 sizes per power of
//! two, at most 12.5 % slack). Work is ordered by the stream it runs on (the backend's own, or
//! one lent by [`crate::runtime::on_stream`]), so a buffer freed after its last launch was
//! enqueued can be handed to the next launch on the same stream without waiting, and only
//! there. [`stats`] counts the driver allocations, for tests and reports; [`release_cached`]
//! gives the cached buffers back to the driver, as the pool itself does when the driver runs out
//! of memory (then it tries the allocation once more).
//!
//! A caller can provide the memory instead ([`with_allocator`]): inside, every buffer comes
//! from the caller's allocator (PyTorch's caching allocator, for the Python package), and a
//! dropped one goes back to its owner, not to the free lists, so the caller's memory
//! accounting and CUDA-graph capture see every byte.

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use mixer_core::Result;

use crate::runtime::{StreamKey, err, gpu};

/// A free list: (stream, element type, bucket length).
type Key = (StreamKey, TypeId, usize);

/// A caller's device allocator: `bytes` → the device address of at least that many bytes
/// (aligned to 256 bytes), and its owner, which keeps the memory allocated until it is dropped.
/// Called on the thread that runs the work, with the memory used on that thread's stream.
pub type ExternalAlloc = dyn Fn(usize) -> Result<(u64, Box<dyn Any + Send + Sync>)> + Send + Sync;

static FREE: LazyLock<Mutex<HashMap<Key, Vec<Box<dyn Any + Send>>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
static DRIVER_ALLOCS: AtomicU64 = AtomicU64::new(0);
static DRIVER_BYTES: AtomicUsize = AtomicUsize::new(0);
static CACHED_BYTES: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static THREAD_ALLOCS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static EXTERNAL: RefCell<Option<Arc<ExternalAlloc>>> = const { RefCell::new(None) };
}

/// Runs `f` with every buffer the calling thread takes ([`take`], [`zeros`], [`upload`]) allocated
/// by `alloc` instead of the pool; such a buffer is never cached: when it is dropped, its owner
/// is (nested calls restore the outer allocator on return, also when `f` panics).
pub fn with_allocator<R>(alloc: Arc<ExternalAlloc>, f: impl FnOnce() -> R) -> R {
    crate::runtime::scoped(&EXTERNAL, alloc, f)
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
/// returned to the pool (or to its external owner).
pub struct Pooled<T: DeviceRepr + 'static> {
    slice: Option<CudaSlice<T>>,
    len: usize,
    home: Home,
}

/// Where a buffer goes when it is dropped.
enum Home {
    /// The free list of this stream.
    Pool(StreamKey),
    /// Memory someone else owns: cudarc's handle is forgotten, the owner dropped.
    External(Box<dyn Any + Send + Sync>),
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

    /// The owner of this buffer's memory when it came from a caller's allocator
    /// ([`with_allocator`]) or is a view of a caller's memory ([`borrowed`]).
    pub fn external_owner(&self) -> Option<&(dyn Any + Send + Sync)> {
        match &self.home {
            Home::External(o) => Some(o.as_ref()),
            Home::Pool(_) => None,
        }
    }
}

/// A view of `n` elements of device memory that someone else owns, starting at `ptr`, as a
/// buffer: nothing is copied, and dropping it drops `owner` and never frees the memory.
///
/// # Safety
/// `ptr` must address at least `n` elements of `T` (any bytes, read as `T`) in the backend device's
/// primary context, valid while `owner` lives and while work enqueued on it runs.
pub unsafe fn borrowed<T: DeviceRepr + 'static>(
    ptr: u64,
    n: usize,
    owner: Box<dyn Any + Send + Sync>,
) -> Result<Pooled<T>> {
    let stream = gpu()?.stream();
    // SAFETY: as the caller promises; the slice is leaked on drop, never freed by cudarc.
    let slice = unsafe { stream.upgrade_device_ptr::<T>(ptr, n) };
    Ok(Pooled { slice: Some(slice), len: n, home: Home::External(owner) })
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
        let Some(s) = self.slice.take() else { return };
        let stream = match &self.home {
            Home::Pool(stream) => *stream,
            Home::External(_) => {
                // The memory is the owner's (dropped with `self.home`).
                s.leak();
                return;
            }
        };
        let bytes = s.len() * std::mem::size_of::<T>();
        if let Ok(mut free) = FREE.lock() {
            CACHED_BYTES.fetch_add(bytes, Ordering::Relaxed);
            free.entry((stream, TypeId::of::<T>(), s.len())).or_default().push(Box::new(s));
        } else {
            DRIVER_BYTES.fetch_sub(bytes, Ordering::Relaxed);
        }
    }
}

/// A buffer of at least `n` elements (at least one) whose contents are whatever its last user
/// left; for buffers that the next launch overwrites entirely. From the caller's allocator
/// inside [`with_allocator`], else from the calling thread's stream's free list or the driver.
pub fn take<T: DeviceRepr + 'static>(kernel: &str, n: usize) -> Result<Pooled<T>> {
    if let Some(alloc) = EXTERNAL.with(|e| e.borrow().clone()) {
        return external::<T>(kernel, &*alloc, n);
    }
    let len = bucket(n);
    let stream = gpu()?.stream_key();
    let key = (stream, TypeId::of::<T>(), len);
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
            let alloc = || unsafe { g.stream().alloc::<T>(len) };
            let s = match alloc() {
                Ok(s) => Ok(s),
                // Out of device memory with buffers cached: give them back to the driver, wait for
                // the frees, and try once more (as PyTorch's caching allocator does).
                Err(_) if CACHED_BYTES.load(Ordering::Relaxed) > 0 => {
                    release_cached();
                    g.stream()
                        .synchronize()
                        .map_err(|e| err(kernel, format!("waiting for the device: {e}")))?;
                    alloc()
                }
                Err(e) => Err(e),
            }
            .map_err(|e| err(kernel, format!("allocating {bytes} bytes of device memory: {e}")))?;
            DRIVER_ALLOCS.fetch_add(1, Ordering::Relaxed);
            THREAD_ALLOCS.with(|c| c.set(c.get() + 1));
            DRIVER_BYTES.fetch_add(bytes, Ordering::Relaxed);
            s
        }
    };
    Ok(Pooled { slice: Some(slice), len: n, home: Home::Pool(stream) })
}

/// A buffer of `n` elements (at least one) from the caller's allocator.
fn external<T: DeviceRepr + 'static>(kernel: &str, alloc: &ExternalAlloc, n: usize) -> Result<Pooled<T>> {
    let elems = n.max(1);
    let bytes = elems * std::mem::size_of::<T>();
    let (ptr, owner) = alloc(bytes)?;
    if ptr == 0 || !ptr.is_multiple_of(256) {
        return Err(err(
            kernel,
            format!(
                "the caller's allocator returned address {ptr:#x} for {bytes} bytes; expected a nonzero multiple of 256"
            ),
        ));
    }
    // SAFETY: the allocator promises `bytes` bytes at `ptr`, valid while `owner` lives.
    let mut p = unsafe { borrowed::<T>(ptr, elems, owner)? };
    p.len = n;
    Ok(p)
}

/// A zero-filled buffer of at least `n` elements (the zeroing is a stream-ordered memset).
pub fn zeros<T: DeviceRepr + ValidAsZeroBits + 'static>(kernel: &str, n: usize) -> Result<Pooled<T>> {
    let mut p = take::<T>(kernel, n)?;
    gpu()?
        .stream()
        .memset_zeros(&mut *p)
        .map_err(|e| err(kernel, format!("zeroing a device buffer: {e}")))?;
    Ok(p)
}

/// Copies a host slice to a new pooled device buffer (at least one element, so that
/// kernels always get a valid pointer). The copy is enqueued on the stream.
pub fn upload<T: DeviceRepr + ValidAsZeroBits + 'static>(kernel: &str, s: &[T]) -> Result<Pooled<T>> {
    let mut p = take::<T>(kernel, s.len())?;
    if !s.is_empty() {
        gpu()?
            .stream()
            .memcpy_htod(s, &mut p.slice_mut(0..s.len()))
            .map_err(|e| err(kernel, format!("host→device copy of {} elements: {e}", s.len())))?;
    }
    Ok(p)
}

/// The first `n` elements of a pooled device buffer, copied to the host after the stream's work
/// before it (waits for the stream).
pub fn download<T: DeviceRepr + ValidAsZeroBits + Default + Clone + 'static>(
    kernel: &str,
    p: &Pooled<T>,
    n: usize,
) -> Result<Vec<T>> {
    let mut v = vec![T::default(); n];
    if n > 0 {
        let g = gpu()?;
        g.stream()
            .memcpy_dtoh(&p.slice(0..n), &mut v[..])
            .map_err(|e| err(kernel, format!("device→host copy of {n} elements: {e}")))?;
        g.sync(kernel)?;
    }
    Ok(v)
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

    /// An allocator that records which of two was asked and answers with an address that is not
    /// a multiple of 256, which `take` refuses before touching a device.
    fn recording(
        tag: usize,
        log: &std::sync::Arc<std::sync::Mutex<Vec<(usize, usize)>>>,
    ) -> std::sync::Arc<super::ExternalAlloc> {
        let log = log.clone();
        std::sync::Arc::new(move |bytes: usize| {
            log.lock().unwrap().push((tag, bytes));
            Ok((0x1001, Box::new(()) as Box<dyn std::any::Any + Send + Sync>))
        })
    }

    #[test]
    fn a_callers_allocator_is_asked_inside_its_scope_only_and_its_addresses_checked() {
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let e = super::with_allocator(recording(1, &log), || {
            let inner =
                super::with_allocator(recording(2, &log), || super::take::<f32>("test", 10).unwrap_err());
            assert!(inner.to_string().contains("0x1001"), "{inner}");
            // A panic inside a nested scope still restores the outer allocator.
            let caught =
                std::panic::catch_unwind(|| super::with_allocator(recording(3, &log), || panic!("inside")));
            assert!(caught.is_err());
            super::take::<f64>("test", 0).unwrap_err()
        });
        assert!(e.to_string().contains("expected a nonzero multiple of 256"), "{e}");
        // Requests are in bytes, at least one element.
        assert_eq!(*log.lock().unwrap(), vec![(2, 40), (1, 8)]);
    }
}
