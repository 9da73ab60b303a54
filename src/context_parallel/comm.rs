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
    /// times; a call returns once every rank has contributed.
    fn all_gather(&self, mine: Tensors<f64>) -> Result<Vec<Tensors<f64>>>;
}

/// The state a group of threads shares.
struct Shared {
    slots: Mutex<Vec<Option<Tensors<f64>>>>,
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

    fn slots(&self) -> Result<std::sync::MutexGuard<'_, Vec<Option<Tensors<f64>>>>> {
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

    fn all_gather(&self, mine: Tensors<f64>) -> Result<Vec<Tensors<f64>>> {
        self.slots()?[self.rank] = Some(mine);
        // Every rank has written its slot ...
        self.shared.barrier.wait();
        let all = self.slots()?.iter().cloned().collect::<Option<Vec<_>>>();
        // ... and every rank has read them all before any rank writes its next contribution.
        self.shared.barrier.wait();
        all.ok_or_else(|| Error::Io("context parallel: internal: a rank's slot was empty".into()))
    }
}
