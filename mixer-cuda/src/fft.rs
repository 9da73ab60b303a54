//! Batched FFTs through cuFFT, with plans cached per (size, batch, kind, dtype).
//!
//! Real forward: `batch` contiguous real rows of length `n` → `batch` rows of `n/2 + 1` complex
//! bins, `x̂_f = Σ_t x_t e^(−2π i f t / n)`. Real inverse: the unnormalized C2R transform
//! (the caller divides by `n` once). Complex: `batch` rows of `n` complex values, forward
//! (`e^(−2π i f t / n)`) or unnormalized inverse.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use cudarc::cufft::sys::{cufftType, double2, float2};
use cudarc::cufft::{CudaFft, FftDirection, result::CufftError};
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use mixer_core::Result;

use crate::pool::{self, Pooled};
use crate::runtime::{StreamKey, count_sync, err, gpu};
use crate::tensor::GpuReal;

/// The transform a plan computes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Kind {
    /// Real to complex (R2C / D2Z).
    Forward,
    /// Complex to real (C2R / Z2D).
    Inverse,
    /// Complex to complex (C2C / Z2Z; the direction is chosen at execution).
    Complex,
}

/// Cached cuFFT plans, keyed by (stream, n, batch, kind, f64). A plan's work area is its own,
/// so two streams do not share a plan: transforms in flight on two streams at once would write
/// the same work area. Inside a CUDA graph capture a plan cannot be made (cuFFT allocates its
/// work area), so a capturing stream without a plan of its own takes another stream's plan of
/// the same transform (a warm-up run made it) and moves it to itself. At most [`MAX_PLANS`] are
/// kept: when full (and not capturing), the device is waited for and all are dropped (plans of
/// streams that no longer run work would otherwise pile up).
#[allow(clippy::type_complexity)]
static PLANS: LazyLock<Mutex<HashMap<(StreamKey, usize, usize, Kind, bool), CudaFft>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Plans kept at most.
const MAX_PLANS: usize = 64;

/// Whether `stream` is capturing a CUDA graph (a query that capture allows); `false` where the
/// driver cannot tell.
fn is_capturing(stream: &cudarc::driver::CudaStream) -> bool {
    use cudarc::driver::sys::{CUresult, CUstreamCaptureStatus, cuStreamIsCapturing};
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: writes one enum; the stream is live for the call.
    let r = unsafe { cuStreamIsCapturing(stream.cu_stream(), &mut status) };
    r == CUresult::CUDA_SUCCESS && status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

/// A scalar with cuFFT real transforms.
pub trait FftReal: GpuReal {
    /// The interleaved complex type (`float2` / `double2`).
    type C: DeviceRepr + ValidAsZeroBits + Unpin + 'static;
    /// Whether this is `f64` (plan key).
    const DOUBLE: bool;
    /// Forward (R2C / D2Z) transform type.
    const FWD: cufftType;
    /// Inverse (C2R / Z2D) transform type.
    const INV: cufftType;
    /// Complex (C2C / Z2Z) transform type.
    const CPLX: cufftType;
    /// Runs a forward plan.
    fn exec_fwd(p: &CudaFft, x: &CudaSlice<Self>, y: &mut CudaSlice<Self::C>) -> Result<(), CufftError>;
    /// Runs an inverse plan (cuFFT may overwrite its input).
    fn exec_inv(p: &CudaFft, x: &mut CudaSlice<Self::C>, y: &mut CudaSlice<Self>) -> Result<(), CufftError>;
    /// Runs a complex plan, forward or inverse.
    fn exec_cplx(
        p: &CudaFft,
        x: &mut CudaSlice<Self::C>,
        y: &mut CudaSlice<Self::C>,
        inverse: bool,
    ) -> Result<(), CufftError>;
}

fn direction(inverse: bool) -> FftDirection {
    if inverse { FftDirection::Inverse } else { FftDirection::Forward }
}

impl FftReal for f32 {
    type C = float2;
    const DOUBLE: bool = false;
    const FWD: cufftType = cufftType::CUFFT_R2C;
    const INV: cufftType = cufftType::CUFFT_C2R;
    const CPLX: cufftType = cufftType::CUFFT_C2C;
    fn exec_fwd(p: &CudaFft, x: &CudaSlice<f32>, y: &mut CudaSlice<float2>) -> Result<(), CufftError> {
        p.exec_r2c(x, y)
    }
    fn exec_inv(p: &CudaFft, x: &mut CudaSlice<float2>, y: &mut CudaSlice<f32>) -> Result<(), CufftError> {
        p.exec_c2r(x, y)
    }
    fn exec_cplx(
        p: &CudaFft,
        x: &mut CudaSlice<float2>,
        y: &mut CudaSlice<float2>,
        inverse: bool,
    ) -> Result<(), CufftError> {
        p.exec_c2c(x, y, direction(inverse))
    }
}

impl FftReal for f64 {
    type C = double2;
    const DOUBLE: bool = true;
    const FWD: cufftType = cufftType::CUFFT_D2Z;
    const INV: cufftType = cufftType::CUFFT_Z2D;
    const CPLX: cufftType = cufftType::CUFFT_Z2Z;
    fn exec_fwd(p: &CudaFft, x: &CudaSlice<f64>, y: &mut CudaSlice<double2>) -> Result<(), CufftError> {
        p.exec_d2z(x, y)
    }
    fn exec_inv(p: &CudaFft, x: &mut CudaSlice<double2>, y: &mut CudaSlice<f64>) -> Result<(), CufftError> {
        p.exec_z2d(x, y)
    }
    fn exec_cplx(
        p: &CudaFft,
        x: &mut CudaSlice<double2>,
        y: &mut CudaSlice<double2>,
        inverse: bool,
    ) -> Result<(), CufftError> {
        p.exec_z2z(x, y, direction(inverse))
    }
}

fn cufft_present() -> bool {
    crate::runtime::culib_present!(cufft)
}

/// Runs `f` with the cached plan for (n, batch, kind) of type `F`, creating it if needed.
/// The cache's lock is held while the transform is enqueued.
fn with_plan<F: FftReal, R>(
    kernel: &str,
    n: usize,
    batch: usize,
    kind: Kind,
    f: impl FnOnce(&CudaFft) -> Result<R, CufftError>,
) -> mixer_core::Result<R> {
    let g = gpu()?;
    if !cufft_present() {
        return Err(err(kernel, "the cuFFT library (libcufft.so) was not found"));
    }
    let ni = i32::try_from(n).map_err(|_| err(kernel, format!("FFT size {n} exceeds i32")))?;
    let bi = i32::try_from(batch).map_err(|_| err(kernel, format!("FFT batch {batch} exceeds i32")))?;
    let mut cache = PLANS.lock().map_err(|_| err(kernel, "FFT plan cache poisoned"))?;
    let key = (g.stream_key(), n, batch, kind, F::DOUBLE);
    let stream = g.stream();
    let capturing = !cache.contains_key(&key) && is_capturing(&stream);
    if capturing {
        let same =
            |k: &(StreamKey, usize, usize, Kind, bool)| (k.1, k.2, k.3, k.4) == (n, batch, kind, F::DOUBLE);
        let other = cache.keys().find(|k| same(k)).copied();
        if let Some(mut plan) = other.and_then(|o| cache.remove(&o)) {
            // SAFETY: the plan is used under the cache's lock only, and the stream outlives the
            // call that lent it (`runtime::on_stream`).
            unsafe { plan.set_stream(stream.clone()) }
                .map_err(|e| err(kernel, format!("cuFFT: moving a plan to the capturing stream: {e}")))?;
            cache.insert(key, plan);
        }
    }
    if !capturing && cache.len() >= MAX_PLANS && !cache.contains_key(&key) {
        // Transforms may still be in flight on the plans' work areas.
        g.ctx.synchronize().map_err(|e| err(kernel, format!("waiting for the device: {e}")))?;
        count_sync();
        cache.clear();
    }
    let plan = match cache.entry(key) {
        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            let ty = match kind {
                Kind::Forward => F::FWD,
                Kind::Inverse => F::INV,
                Kind::Complex => F::CPLX,
            };
            let plan = CudaFft::plan_1d(ni, ty, bi, stream)
                .map_err(|e| err(kernel, format!("cuFFT plan (n = {n}, batch = {batch}, {ty:?}): {e}")))?;
            v.insert(plan)
        }
    };
    f(plan).map_err(|e| err(kernel, format!("cuFFT execution (n = {n}, batch = {batch}): {e}")))
}

/// Forward real FFT of `batch` contiguous rows of length `n` (`x` holds `batch·n` values);
/// returns `batch` rows of `n/2 + 1` bins.
pub fn rfft<F: FftReal>(kernel: &str, x: &CudaSlice<F>, n: usize, batch: usize) -> Result<Pooled<F::C>> {
    let mut y = pool::take::<F::C>(kernel, batch * (n / 2 + 1))?;
    with_plan::<F, ()>(kernel, n, batch, Kind::Forward, |p| F::exec_fwd(p, x, &mut *y))?;
    Ok(y)
}

/// Unnormalized inverse real FFT of `batch` rows of `n/2 + 1` bins (consumed: cuFFT may
/// overwrite them); returns `batch` real rows of length `n`, scaled by `n`.
pub fn irfft<F: FftReal>(kernel: &str, mut x: Pooled<F::C>, n: usize, batch: usize) -> Result<Pooled<F>> {
    let mut y = pool::take::<F>(kernel, batch * n)?;
    with_plan::<F, ()>(kernel, n, batch, Kind::Inverse, |p| F::exec_inv(p, &mut *x, &mut *y))?;
    Ok(y)
}

/// Complex FFT of `batch` rows of `n` values (consumed: cuFFT may overwrite them), forward or
/// unnormalized inverse (scaled by `n`); returns `batch` rows of `n` values.
pub fn cfft<F: FftReal>(
    kernel: &str,
    mut x: Pooled<F::C>,
    n: usize,
    batch: usize,
    inverse: bool,
) -> Result<Pooled<F::C>> {
    let mut y = pool::take::<F::C>(kernel, batch * n)?;
    with_plan::<F, ()>(kernel, n, batch, Kind::Complex, |p| F::exec_cplx(p, &mut *x, &mut *y, inverse))?;
    Ok(y)
}
