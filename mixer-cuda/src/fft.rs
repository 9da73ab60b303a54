//! Batched real FFTs through cuFFT, with plans cached per (size, batch, direction, dtype).
//!
//! Forward: `batch` contiguous real rows of length `n` → `batch` rows of `n/2 + 1` complex
//! bins, `x̂_f = Σ_t x_t e^(−2π i f t / n)`. Inverse: the unnormalized C2R transform
//! (the caller divides by `n` once).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use cudarc::cufft::sys::{cufftType, double2, float2};
use cudarc::cufft::{CudaFft, result::CufftError};
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use mixer_core::Result;

use crate::pool::{self, Pooled};
use crate::runtime::{GpuReal, err, gpu};

/// Cached cuFFT plans, keyed by (n, batch, inverse, f64), for the backend's one stream.
static PLANS: LazyLock<Mutex<HashMap<(usize, usize, bool, bool), CudaFft>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

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
    /// Runs a forward plan.
    fn exec_fwd(p: &CudaFft, x: &CudaSlice<Self>, y: &mut CudaSlice<Self::C>) -> Result<(), CufftError>;
    /// Runs an inverse plan (cuFFT may overwrite its input).
    fn exec_inv(p: &CudaFft, x: &mut CudaSlice<Self::C>, y: &mut CudaSlice<Self>) -> Result<(), CufftError>;
}

impl FftReal for f32 {
    type C = float2;
    const DOUBLE: bool = false;
    const FWD: cufftType = cufftType::CUFFT_R2C;
    const INV: cufftType = cufftType::CUFFT_C2R;
    fn exec_fwd(p: &CudaFft, x: &CudaSlice<f32>, y: &mut CudaSlice<float2>) -> Result<(), CufftError> {
        p.exec_r2c(x, y)
    }
    fn exec_inv(p: &CudaFft, x: &mut CudaSlice<float2>, y: &mut CudaSlice<f32>) -> Result<(), CufftError> {
        p.exec_c2r(x, y)
    }
}

impl FftReal for f64 {
    type C = double2;
    const DOUBLE: bool = true;
    const FWD: cufftType = cufftType::CUFFT_D2Z;
    const INV: cufftType = cufftType::CUFFT_Z2D;
    fn exec_fwd(p: &CudaFft, x: &CudaSlice<f64>, y: &mut CudaSlice<double2>) -> Result<(), CufftError> {
        p.exec_d2z(x, y)
    }
    fn exec_inv(p: &CudaFft, x: &mut CudaSlice<double2>, y: &mut CudaSlice<f64>) -> Result<(), CufftError> {
        p.exec_z2d(x, y)
    }
}

fn cufft_present() -> bool {
    // SAFETY: only attempts to dlopen the cuFFT library.
    std::panic::catch_unwind(|| unsafe { cudarc::cufft::sys::is_culib_present() }).unwrap_or(false)
}

/// Runs `f` with the cached plan for (n, batch, direction) of type `F`, creating it if needed.
/// The cache's lock is held while the transform is enqueued.
fn with_plan<F: FftReal, R>(
    kernel: &str,
    n: usize,
    batch: usize,
    inverse: bool,
    f: impl FnOnce(&CudaFft) -> Result<R, CufftError>,
) -> mixer_core::Result<R> {
    let g = gpu()?;
    if !cufft_present() {
        return Err(err(kernel, "the cuFFT library (libcufft.so) was not found"));
    }
    let ni = i32::try_from(n).map_err(|_| err(kernel, format!("FFT size {n} exceeds i32")))?;
    let bi = i32::try_from(batch).map_err(|_| err(kernel, format!("FFT batch {batch} exceeds i32")))?;
    let mut cache = PLANS.lock().map_err(|_| err(kernel, "FFT plan cache poisoned"))?;
    let key = (n, batch, inverse, F::DOUBLE);
    let plan = match cache.entry(key) {
        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            let ty = if inverse { F::INV } else { F::FWD };
            let plan = CudaFft::plan_1d(ni, ty, bi, g.stream.clone())
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
    with_plan::<F, ()>(kernel, n, batch, false, |p| F::exec_fwd(p, x, &mut *y))?;
    Ok(y)
}

/// Unnormalized inverse real FFT of `batch` rows of `n/2 + 1` bins (consumed: cuFFT may
/// overwrite them); returns `batch` real rows of length `n`, scaled by `n`.
pub fn irfft<F: FftReal>(kernel: &str, mut x: Pooled<F::C>, n: usize, batch: usize) -> Result<Pooled<F>> {
    let mut y = pool::take::<F>(kernel, batch * n)?;
    with_plan::<F, ()>(kernel, n, batch, true, |p| F::exec_inv(p, &mut *x, &mut *y))?;
    Ok(y)
}
