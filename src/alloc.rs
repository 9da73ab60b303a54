//! A counting global allocator: current and peak heap bytes, for "peak working memory".
//!
//! Install it in a binary (the `mixers` binary of crate `mixers-cli` does, and so do the
//! robustness tests):
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: mixers::alloc::CountingAlloc = mixers::alloc::CountingAlloc;
//! ```
//!
//! The working memory of a run ([`measure`]) is the largest rise of the live bytes above the
//! lowest level they reached since the run started (at first the baseline `reset_peak()`,
//! the bytes live just before the run): everything the run allocated and held at its worst
//! moment, including its output — also when memory that was live before the run is freed
//! meanwhile, which a plain `peak − baseline` would subtract. Counters are process-wide
//! (every thread, so rayon workers count too). Where the allocator is not installed,
//! [`counting`] is `false` and memory is reported as "n/a".

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Lowest live bytes since the last [`reset_peak`].
static LOW: AtomicUsize = AtomicUsize::new(0);
/// Largest rise of the live bytes above [`LOW`] since the last [`reset_peak`].
static RISE: AtomicUsize = AtomicUsize::new(0);
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// [`System`] with byte counters (current and peak live bytes).
#[derive(Clone, Copy, Debug, Default)]
pub struct CountingAlloc;

#[inline]
fn grew(n: usize) {
    if !ACTIVE.load(Relaxed) {
        ACTIVE.store(true, Relaxed);
    }
    let now = CURRENT.fetch_add(n, SeqCst) + n;
    PEAK.fetch_max(now, Relaxed);
    RISE.fetch_max(now.saturating_sub(LOW.load(SeqCst)), Relaxed);
}

#[inline]
fn shrank(n: usize) {
    // The low-water mark before the count, so that an allocation on another thread never
    // measures its rise from a level above the one this free reaches (at worst it counts the
    // bytes of a concurrent allocation twice).
    LOW.fetch_min(CURRENT.load(SeqCst).saturating_sub(n), SeqCst);
    CURRENT.fetch_sub(n, SeqCst);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the
// counters are plain atomics and never touch the memory.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` through us with this layout.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        p
    }
}

/// Whether a [`CountingAlloc`] is the global allocator of this process (it has counted an
/// allocation).
pub fn counting() -> bool {
    ACTIVE.load(Relaxed)
}

/// Live heap bytes now (0 when not [`counting`]).
pub fn current_bytes() -> usize {
    CURRENT.load(Relaxed)
}

/// Highest live heap bytes since the last [`reset_peak`].
pub fn peak_bytes() -> usize {
    PEAK.load(Relaxed)
}

/// Sets the peak and the low-water mark to the current live bytes and returns them (the
/// baseline of a run).
pub fn reset_peak() -> usize {
    let now = CURRENT.load(SeqCst);
    PEAK.store(now, Relaxed);
    LOW.store(now, SeqCst);
    RISE.store(0, Relaxed);
    now
}

/// Peak working memory of `f`: the largest rise of the live bytes above the lowest level
/// they reached since `f` started (see the module docs), or `None` when the counting
/// allocator is not installed.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Option<usize>) {
    reset_peak();
    let out = f();
    let rise = RISE.load(Relaxed);
    (out, counting().then_some(rise))
}

/// Human-readable bytes (`12.3 MiB`).
pub fn human(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = bytes as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{bytes} B") } else { format!("{x:.1} {}", UNITS[u]) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn human_units() {
        assert_eq!(super::human(0), "0 B");
        assert_eq!(super::human(1023), "1023 B");
        assert_eq!(super::human(1536), "1.5 KiB");
        assert_eq!(super::human(3 << 30), "3.0 GiB");
    }
}
