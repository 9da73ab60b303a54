//! [`OnceMap`]: values computed once per key, each outside the map's lock.
//!
//! The module cache of [`crate::runtime::Gpu`] compiles a kernel source with NVRTC on its first
//! use, which takes from a fraction of a second to several seconds. Holding one lock over the
//! whole map while compiling made every thread wait for every other thread's compilation; here
//! the map's lock is held only to find (or add) the key's own cell, and the computation holds
//! that cell's lock alone: threads compiling different sources run at once, and a thread asking
//! for a source being compiled waits for that compilation and takes its result.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

/// A map whose value for a key is computed by the first caller that needs it (see the module
/// documentation). A failed computation keeps nothing: the next caller computes again.
pub struct OnceMap<K, V> {
    cells: Mutex<HashMap<K, Arc<Mutex<Option<V>>>>>,
}

impl<K, V> Default for OnceMap<K, V> {
    fn default() -> Self {
        OnceMap { cells: Mutex::new(HashMap::new()) }
    }
}

/// A lock whose holder panicked still guards consistent data here (a cell is `None` until a
/// computation succeeds), so poisoning is ignored.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<K: Eq + Hash, V: Clone> OnceMap<K, V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of `key`: the stored one, or `make()`'s, stored when it succeeds. Callers with
    /// the same key wait for one another; callers with other keys do not wait for `make`.
    pub fn get_or_try_insert<E>(&self, key: K, make: impl FnOnce() -> Result<V, E>) -> Result<V, E> {
        let cell = lock(&self.cells).entry(key).or_default().clone();
        let mut value = lock(&cell);
        if let Some(v) = value.as_ref() {
            return Ok(v.clone());
        }
        let v = make()?;
        *value = Some(v.clone());
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn one_key_is_computed_once_for_every_thread() {
        let map = OnceMap::<&str, usize>::new();
        let calls = AtomicUsize::new(0);
        let got: Vec<usize> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        map.get_or_try_insert("k", || {
                            std::thread::sleep(Duration::from_millis(20));
                            Ok::<_, ()>(calls.fetch_add(1, Ordering::SeqCst) + 7)
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
        });
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(got.iter().all(|&v| v == 7), "{got:?}");
    }

    #[test]
    fn other_keys_are_computed_at_the_same_time() {
        // Each computation waits for the other one to have started: with one lock over the whole
        // map the second could not start, and the first would give up after the timeout.
        let map = OnceMap::<u32, u32>::new();
        let (to_b, from_a) = mpsc::channel();
        let (to_a, from_b) = mpsc::channel();
        let meet = |me: u32, tell: mpsc::Sender<()>, hear: mpsc::Receiver<()>| {
            map.get_or_try_insert(me, || {
                tell.send(()).map_err(|_| "the other thread has gone")?;
                hear.recv_timeout(Duration::from_secs(10)).map_err(|_| "the other key never started")?;
                Ok::<_, &str>(me * 10)
            })
        };
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| meet(1, to_b, from_b));
            let b = s.spawn(|| meet(2, to_a, from_a));
            (a.join().unwrap(), b.join().unwrap())
        });
        assert_eq!((a, b), (Ok(10), Ok(20)));
    }

    #[test]
    fn a_failure_is_not_kept() {
        let map = OnceMap::<u8, String>::new();
        assert_eq!(map.get_or_try_insert(0, || Err("no")), Err("no"));
        assert_eq!(map.get_or_try_insert(0, || Ok::<_, &str>("yes".to_string())), Ok("yes".to_string()));
        assert_eq!(map.get_or_try_insert(0, || Err("not called")), Ok("yes".to_string()));
    }
}
