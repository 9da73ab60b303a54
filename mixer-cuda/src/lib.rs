//! # mixer-cuda
//!
//! The CUDA backend, chosen at run time. It compiles without CUDA (cudarc with dynamic
//! loading) and checks that the driver library is present before touching it, because cudarc
//! panics when it is missing.

pub mod attention;
pub mod device;
pub mod glr;
pub mod loglinear;
pub mod toeplitz;

use mixer_registry::{BackendEntry, register};

#[register]
static CUDA: BackendEntry = BackendEntry {
    name: "cuda",
    doc: "NVIDIA GPU through the CUDA driver, NVRTC and cuFFT (loaded at run time)",
    priority: 10,
    probe: device::probe,
};
