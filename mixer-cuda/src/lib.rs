//! # mixer-cuda
//!
//! The CUDA backend, chosen at run time. It compiles without CUDA (cudarc with dynamic
//! loading) and checks that the driver library is present before touching it, because cudarc
//! panics when it is missing.
//!
//! - [`runtime`]: the lazily created context and stream on device 0, the NVRTC module cache
//!   (kernels in `mixer-cuda/kernels/*.cu`, compiled for the device's compute capability),
//!   host↔device copies, errors as `Error::Backend { backend: "cuda", .. }`.
//! - [`fft`]: batched real FFTs through cuFFT with cached plans.
//! - one module per family, registering `KernelEntry { backend: "cuda", .. }`.

pub mod attention;
pub mod device;
pub mod fft;
pub mod glr;
pub mod loglinear;
pub mod runtime;
pub mod toeplitz;

use mixer_registry::{BackendEntry, register};

#[register]
static CUDA: BackendEntry = BackendEntry {
    name: "cuda",
    doc: "NVIDIA GPU through the CUDA driver, NVRTC and cuFFT (loaded at run time)",
    priority: 10,
    probe: device::probe,
};
