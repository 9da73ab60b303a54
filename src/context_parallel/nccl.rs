//! [`Communicator`] over NCCL: ranks that are processes, one GPU each, each running its part on
//! the CUDA backend of its own device ([`mixers::cuda::runtime::select_device`] or
//! `MIXERS_CUDA_DEVICE`); the contributions travel as flat `f64` buffers ([`super::wire`]) through
//! [`mixer_cuda::nccl::Group::all_gather`].
//!
//! [`mixers::cuda::runtime::select_device`]: mixer_cuda::runtime::select_device

use std::path::Path;
use std::time::Duration;

use mixer_core::{Result, Tensors};
use mixer_cuda::nccl::{Group, ID_BYTES};

use super::{Communicator, wire};

/// One rank of a group of processes joined by NCCL.
#[derive(Debug)]
pub struct Nccl {
    group: Group,
}

impl Nccl {
    /// Rank `rank` of `size`, joined with the id from [`mixer_cuda::nccl::unique_id`] (made on
    /// one rank and handed to all); every rank calls it.
    pub fn join(rank: usize, size: usize, id: &[u8; ID_BYTES]) -> Result<Nccl> {
        Ok(Nccl { group: Group::join(rank, size, id)? })
    }

    /// Rank `rank` of `size`, the id passed through the file `path` (which must not exist before
    /// the run; [`Group::rendezvous`]).
    pub fn rendezvous(rank: usize, size: usize, path: &Path, timeout: Duration) -> Result<Nccl> {
        Ok(Nccl { group: Group::rendezvous(rank, size, path, timeout)? })
    }
}

impl Communicator for Nccl {
    fn rank(&self) -> usize {
        self.group.rank()
    }

    fn size(&self) -> usize {
        self.group.size()
    }

    fn all_gather(&self, mine: Result<Tensors<f64>>) -> Result<Vec<Tensors<f64>>> {
        wire::all_gather(self.group.size(), mine, |b| self.group.all_gather(b))
    }
}
