//! A group of processes, one GPU each, joined by NCCL (loaded at run time, as the driver is):
//! the transport of context parallelism across GPUs (`mixers::context_parallel::Nccl`). Each
//! process runs its backend on its own device ([`crate::runtime::select_device`] or
//! `MIXERS_CUDA_DEVICE`), rank 0 makes the group's id ([`unique_id`]) and the others receive it
//! (a file through [`Group::rendezvous`], or any channel of the caller's through
//! [`Group::join`]). The one collective is [`Group::all_gather`] of `f64` buffers of equal
//! length, on the backend's own stream, which it waits for.
//!
//! NCCL is found as `libnccl.so` on the library path (pip's `nvidia-nccl` wheels ship
//! `libnccl.so.2`: a link named `libnccl.so` to it in a folder of `LD_LIBRARY_PATH` serves).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;
use cudarc::nccl::{Comm, Id};
use mixer_core::{Error, Result};

use crate::runtime::{err, gpu};

const WHAT: &str = "nccl";
/// Bytes of a group's id.
pub const ID_BYTES: usize = 128;

/// Whether NCCL's library can be loaded, else why not.
fn present() -> Result<()> {
    if crate::runtime::culib_present!(nccl) {
        Ok(())
    } else {
        Err(Error::BackendUnavailable {
            backend: "cuda".into(),
            reason: "NCCL's library (libnccl.so) was not found on the library path (pip's nvidia-nccl ships \
                     libnccl.so.2: link it as libnccl.so in a folder of LD_LIBRARY_PATH)"
                .into(),
        })
    }
}

/// A new group's id, made once (on rank 0) and handed to every rank's [`Group::join`].
pub fn unique_id() -> Result<[u8; ID_BYTES]> {
    present()?;
    let id = Id::new().map_err(|e| err(WHAT, format!("ncclGetUniqueId: {e:?}")))?;
    Ok(id.internal().map(|c| c as u8))
}

/// The communicator, used by one thread at a time.
struct Shared(Comm);

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it do not
// overlap; `Group` reaches it only through its mutex.
unsafe impl Send for Shared {}

/// One rank of a group (module documentation).
pub struct Group {
    comm: Mutex<Shared>,
    stream: Arc<CudaStream>,
    rank: usize,
    size: usize,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "nccl::Group(rank {} of {})", self.rank, self.size)
    }
}

impl Group {
    /// Rank `rank` of a group of `size` processes with the id `id` (from [`unique_id`] on one
    /// rank), on this process's device. Every rank calls it; it returns once all have joined.
    pub fn join(rank: usize, size: usize, id: &[u8; ID_BYTES]) -> Result<Group> {
        if rank >= size || i32::try_from(size).is_err() {
            return Err(Error::Value {
                name: "NCCL rank".into(),
                constraint: format!("0 ≤ rank < size ≤ 2³¹ − 1 (size {size})"),
                found: rank.to_string(),
            });
        }
        present()?;
        let g = gpu()?;
        // NCCL finds its device as the thread's current one: the backend's context.
        g.ctx.bind_to_thread().map_err(|e| err(WHAT, format!("cannot bind the backend's context: {e}")))?;
        let stream = g.stream();
        let id = Id::uninit(id.map(|b| b as std::ffi::c_char));
        let comm = Comm::from_rank(stream.clone(), rank, size, id)
            .map_err(|e| err(WHAT, format!("ncclCommInitRank (rank {rank} of {size}): {e:?}")))?;
        Ok(Group { comm: Mutex::new(Shared(comm)), stream, rank, size })
    }

    /// [`Group::join`] with the id passed through the file `path`, which must not exist before
    /// the run (a fresh temporary folder's, on a file system every rank sees): rank 0 makes the
    /// id and writes it there; the other ranks wait for it up to `timeout`.
    pub fn rendezvous(rank: usize, size: usize, path: &Path, timeout: Duration) -> Result<Group> {
        let io = |what: &str, e: std::io::Error| {
            Error::Io(format!("NCCL rendezvous: {what} {}: {e}", path.display()))
        };
        let id = if rank == 0 {
            if path.exists() {
                return Err(Error::Io(format!(
                    "NCCL rendezvous: {} exists already (an earlier run's?): rank 0 writes a new id there, so give \
                     a path that does not exist",
                    path.display()
                )));
            }
            let id = unique_id()?;
            let tmp = path.with_extension("partial");
            std::fs::write(&tmp, id).map_err(|e| io("cannot write", e))?;
            std::fs::rename(&tmp, path).map_err(|e| io("cannot create", e))?;
            id
        } else {
            let start = Instant::now();
            loop {
                match std::fs::read(path) {
                    Ok(b) if b.len() == ID_BYTES => break b.try_into().unwrap_or([0; ID_BYTES]),
                    Ok(b) => {
                        return Err(Error::Io(format!(
                            "NCCL rendezvous: {} holds {} bytes, not an id of {ID_BYTES}",
                            path.display(),
                            b.len()
                        )));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && start.elapsed() < timeout => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => {
                        return Err(io(
                            &format!("no id from rank 0 after {:.1} s in", start.elapsed().as_secs_f64()),
                            e,
                        ));
                    }
                }
            }
        };
        Group::join(rank, size, &id)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Every rank's `mine` (all of one length), concatenated in rank order: `ncclAllGather` on
    /// the backend's stream, waited for.
    pub fn all_gather(&self, mine: &[f64]) -> Result<Vec<f64>> {
        let e = |what: &str, x: &dyn std::fmt::Debug| err(WHAT, format!("{what}: {x:?}"));
        let comm =
            self.comm.lock().map_err(|_| err(WHAT, "a thread panicked while it held the communicator"))?;
        let send = self.stream.clone_htod(mine).map_err(|x| e("copy to the device", &x))?;
        let mut recv =
            self.stream.alloc_zeros::<f64>(mine.len() * self.size).map_err(|x| e("allocation", &x))?;
        if !mine.is_empty() {
            comm.0.all_gather(&send, &mut recv).map_err(|x| e("ncclAllGather", &x))?;
        }
        crate::runtime::count_sync();
        self.stream.clone_dtoh(&recv).map_err(|x| e("copy to the host", &x))
    }
}
