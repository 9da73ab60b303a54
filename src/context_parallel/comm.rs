//! The collective a context-parallel run needs: every rank contributes one set of named tensors
//! and receives every rank's, in rank order (`all_gather`). [`InProcess`] is a group of ranks
//! that are threads of one process (the CPU simulation the tests use); a multi-GPU group would
//! implement the same trait over NCCL.

use std::sync::{Arc, Barrier, Mutex};

use mixer_core::{Error, Result, Tensors};

/// One rank's view of a group of `size()` ranks.
pub trait Communicator: Send + Sync {
    /// This rank, `0 ≤ rank < size`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// Every rank's `mine`, in rank order. Every rank of the group calls it the same number of
    /// times, also when its own work failed (`mine` an error): a call returns once every rank
    /// has contributed, and if any rank contributed an error, every rank gets an error that
    /// names the first failing rank and its message (so a failure on one rank never leaves the
    /// others waiting).
    fn all_gather(&self, mine: Result<Tensors<f64>>) -> Result<Vec<Tensors<f64>>>;
}

/// The error every rank returns when rank `rank` failed with `e`.
pub(super) fn failed_on(rank: usize, e: &str) -> Error {
    Error::Io(format!("context parallel: rank {rank} failed: {e}"))
}

/// The state a group of threads shares.
struct Shared {
    slots: Mutex<Vec<Option<std::result::Result<Tensors<f64>, String>>>>,
    barrier: Barrier,
}

/// One rank of a group of threads in one process ([`InProcess::group`]).
pub struct InProcess {
    rank: usize,
    shared: Arc<Shared>,
}

impl InProcess {
    /// The `n` ranks of a new group (`n ≥ 1`); hand one to each thread.
    pub fn group(n: usize) -> Result<Vec<InProcess>> {
        if n == 0 {
            return Err(Error::Value {
                name: "ranks".into(),
                constraint: "at least one rank".into(),
                found: "0".into(),
            });
        }
        let shared = Arc::new(Shared { slots: Mutex::new(vec![None; n]), barrier: Barrier::new(n) });
        Ok((0..n).map(|rank| InProcess { rank, shared: shared.clone() }).collect())
    }

    #[allow(clippy::type_complexity)]
    fn slots(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, Vec<Option<std::result::Result<Tensors<f64>, String>>>>> {
        self.shared.slots.lock().map_err(|_| Error::Io("context parallel: a rank's thread panicked".into()))
    }
}

impl Communicator for InProcess {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.slots().map_or(0, |s| s.len())
    }

    fn all_gather(&self, mine: Result<Tensors<f64>>) -> Result<Vec<Tensors<f64>>> {
        let written = self.slots().map(|mut s| s[self.rank] = Some(mine.map_err(|e| e.to_string())));
        // Every rank has written its slot ...
        self.shared.barrier.wait();
        let all = self.slots().map(|s| s.clone());
        // ... and every rank has read them all before any rank writes its next contribution.
        self.shared.barrier.wait();
        written?;
        let all = all?;
        let mut out = Vec::with_capacity(all.len());
        for (rank, slot) in all.into_iter().enumerate() {
            match slot {
                Some(Ok(t)) => out.push(t),
                Some(Err(e)) => return Err(failed_on(rank, &e)),
                None => return Err(Error::Io("context parallel: internal: a rank's slot was empty".into())),
            }
        }
        Ok(out)
    }
}
