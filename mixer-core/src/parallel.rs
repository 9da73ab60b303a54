//! Small calls run on the calling thread.
//!
//! The CPU backend's loops over heads, rows and tiles are rayon parallel iterators. Entering
//! rayon's pool from a thread outside it hands the work over and waits for it, about 8 µs per
//! loop on a 2-core machine (a one-token Mamba-2 call, `H = 4`, `D = 16`, took 22 µs with its
//! two loops handed over and 6.5 µs without), which is more than a call of a few tokens
//! computes. The registry runs each call inside
//! [`sized`], with the number of values the call reads (its inputs, state and cotangents);
//! below [`SERIAL_ELEMENTS`] the call is *small*, and every parallel loop of it asks
//! [`min_len`] for its `with_min_len`: no split in a small call (rayon then runs the loop as
//! one piece on the calling thread, without touching the pool), else 1 (rayon splits as it
//! likes). Results do not depend on it: every loop writes disjoint outputs or collects in
//! order.

use std::cell::Cell;

/// Calls that read fewer values than this run their parallel loops on the calling thread.
/// At 2¹⁴ values (for example Mamba-2 with `T = 64`, `H = 4`, `D = 16`, or one decoding step
/// of 16 heads of 32 × 32 states) a call computes for tens of microseconds, a few rayon hand-offs.
pub const SERIAL_ELEMENTS: usize = 1 << 14;

thread_local! {
    static SMALL: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's call marked small when it reads fewer than
/// [`SERIAL_ELEMENTS`] values (`elements`), restoring the previous mark afterwards (calls
/// nest: a small call's inner calls stay small).
pub fn sized<R>(elements: usize, f: impl FnOnce() -> R) -> R {
    let before = SMALL.with(Cell::get);
    SMALL.with(|s| s.set(before || elements < SERIAL_ELEMENTS));
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SMALL.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(before);
    f()
}

/// Whether the current thread runs a small call ([`sized`]).
pub fn small() -> bool {
    SMALL.with(Cell::get)
}

/// The `with_min_len` of a parallel loop: in a small call no split at all (the loop runs as
/// one piece on the calling thread), else 1.
pub fn min_len() -> usize {
    if small() { usize::MAX } else { 1 }
}

#[cfg(test)]
mod tests {
    use super::{SERIAL_ELEMENTS, min_len, sized, small};
    use rayon::prelude::*;

    #[test]
    fn a_small_call_runs_its_loops_on_the_calling_thread() {
        let caller = std::thread::current().id();
        let threads = |n: usize| -> Vec<std::thread::ThreadId> {
            (0..n).into_par_iter().with_min_len(min_len()).map(|_| std::thread::current().id()).collect()
        };
        let inside = sized(10, || threads(64));
        assert!(inside.iter().all(|&t| t == caller), "a small call's loop left the calling thread");
        assert!(!small(), "the mark outlived the call");
        // A large call leaves the split to rayon: with more than one worker, some item runs
        // on a worker of the pool, which the calling thread (outside the pool) is not.
        if rayon::current_num_threads() > 1 {
            let outside = sized(SERIAL_ELEMENTS, || threads(4096));
            assert!(outside.iter().any(|&t| t != caller), "a large call ran serially");
        }
    }

    #[test]
    fn marks_nest_and_are_restored() {
        sized(10, || {
            assert!(small());
            sized(SERIAL_ELEMENTS * 4, || assert!(small(), "an inner call of a small call is small"));
            assert!(small());
        });
        sized(SERIAL_ELEMENTS, || assert!(!small()));
        let _ = std::panic::catch_unwind(|| sized(1, || panic!("inside")));
        assert!(!small(), "a panic left the mark set");
    }
}
