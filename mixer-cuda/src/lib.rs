//! # mixer-cuda
//!
//! The CUDA backend, chosen at run time. It compiles without CUDA (cudarc with dynamic
//! loading) and checks that the driver library is present before touching it, because cudarc
//! panics when it is missing.
//!
//! - [`runtime`]: the lazily created context and stream on one device ([`runtime::select_device`]), a caller's stream lent
//!   for one call ([`on_stream`]), the NVRTC module cache (compiled for the device's compute
//!   capability), the count of host waits, errors as `Error::Backend { backend: "cuda", .. }`.
//! - [`tensor`]: device tensors ([`DeviceTensor`], `f32`/`f64`/`bf16`, zero-copy batch views,
//!   views of a caller's memory, deferred device-side checks); [`pool`]: the caching allocator
//!   every buffer comes from, or a caller's allocator ([`pool::with_allocator`]).
//! - [`forms`]: the device-tensor contract of the families ([`forms::DeviceFamily`],
//!   [`DeviceDecoder`]) and the host-array forms built on it; [`device_run`]: the entry points
//!   [`run_device`], [`backward_device`] and [`decoder_device`] for inputs that live on the GPU,
//!   and [`stream`]; [`device_state`]: runs from a recurrent state on device tensors
//!   ([`run_device_from_state`], [`backward_device_from_state`]); [`device_packed`]: packed
//!   batches (`cu_seqlens`) on device tensors, in one launch sequence over a chunk table where
//!   the family has one (`loglinear::packed`), else sequence by sequence on views of the buffer
//!   ([`run_device_packed`], [`backward_device_packed`]); [`device_call`]: one forward and one
//!   backward over these three, chosen by the call's options (the Python package's and the
//!   candle ops' entry).
//! - [`nccl`]: NCCL groups for context parallelism over several GPUs.
//! - [`timing`]: CUDA-event timing of forms and decode loops on device-resident inputs.
//! - [`kernels`]: the table of every kernel source (`mixer-cuda/kernels/*.cu`).
//! - [`nvrtc`]: one NVRTC compilation (NVRTC's CUBIN, which the runtime loads, and its PTX).
//! - [`fft`]: batched real FFTs through cuFFT with cached plans.
//! - one module per family, implementing `mixer_registry::Family` and registering a
//!   `FamilyEntry { backend: "cuda", .. }`:
//!
//! | family | forms on CUDA | kernel file |
//! |---|---|---|
//! | [`toeplitz`] | `fast` (cuFFT R2C/C2R, plans cached), `parallel` (direct), `recurrent` (online relaxed-FFT decoder, or naive; device state) | `toeplitz.cu` |
//! | [`glr`] | `fast` (sparse recurrence, any pattern via a host table), `recurrent` (lattice cache on device) | `glr.cu` |
//! | [`attention`] | `fast` (tiled online softmax, window; tensor cores in the `tf32`/`bf16` modes), `recurrent` (KV cache on device) | `attention.cu`, `attention_fused.cu` |
//! | [`loglinear`] | `parallel` (generic quadratic, mask and λ device functions spliced in), `fast` (chunked, Fenwick structure), `recurrent` (device level states, Fenwick structure); the `fast` backward of the base mixers, from a state too | `loglinear_*.cu` |
//!
//! GPU tests live in `mixer-cuda/tests/all/`; they are `#[ignore]`d (so `cargo test` reports
//! them as ignored, not passed) and run with `cargo test -p mixer-cuda -- --include-ignored`
//! on a machine with a GPU, where `MIXERS_REQUIRE_CUDA=1` turns a missing device into a
//! failure.

/// Registers one family of this backend: `cuda_family!(NAME, family, Ty)` writes the
/// `#[register]`ed `static NAME: FamilyEntry` of `family` on the `cuda` backend, whose `f64`
/// and `f32` host-array forms are [`forms::Hosted`]`(Ty)` and whose device forms are
/// [`device_run::Device`]`(Ty)`.
macro_rules! cuda_family {
    ($name:ident, $family:expr, $ty:expr) => {
        #[::mixer_registry::register]
        static $name: ::mixer_registry::FamilyEntry = ::mixer_registry::FamilyEntry {
            family: $family,
            backend: "cuda",
            f64: &$crate::forms::Hosted($ty),
            f32: &$crate::forms::Hosted($ty),
            device: Some(&$crate::device_run::Device($ty)),
        };
    };
}

pub mod attention;
pub mod device;
pub mod device_call;
pub mod device_packed;
pub mod device_run;
pub mod device_state;
pub mod fft;
pub mod forms;
pub mod glr;
pub mod kernels;
pub mod loglinear;
pub mod nccl;
pub mod nvrtc;
pub mod once_map;
pub(crate) mod pitched;
pub mod pool;
pub mod runtime;
pub(crate) mod state_rows;
pub mod tensor;
pub mod timing;
pub mod toeplitz;

pub use device_packed::{backward_device_packed, run_device_packed};
pub use device_run::{
    backward_device, backward_device_with, decoder_device, device_saves, run_device, run_device_saving,
    run_device_with, stream,
};
pub use device_state::{backward_device_from_state, run_device_from_state};
pub use forms::DeviceDecoder;
pub use runtime::{borrowed_stream, on_stream};
pub use tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors, bf16};

use mixer_registry::{BackendEntry, register};

#[register]
static CUDA: BackendEntry = BackendEntry {
    name: "cuda",
    doc: "NVIDIA GPU through the CUDA driver, NVRTC and cuFFT (loaded at run time)",
    priority: 10,
    probe: device::probe,
    timer: Some(&timing::CudaTimer),
    concurrent: false,
};
