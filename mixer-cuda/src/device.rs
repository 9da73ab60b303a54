//! Probing for a usable CUDA device without panicking.

use mixer_registry::Availability;

/// Whether the CUDA driver library can be loaded and a device exists.
pub fn probe() -> Availability {
    // SAFETY: only attempts to dlopen the driver library; no driver call is made before it.
    let present =
        std::panic::catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() }).unwrap_or(false);
    if !present {
        return Availability::Unavailable("the CUDA driver library (libcuda.so) was not found".into());
    }
    match std::panic::catch_unwind(cudarc::driver::result::init) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Availability::Unavailable(format!("cuInit failed: {e}")),
        Err(_) => return Availability::Unavailable("the CUDA driver could not be initialised".into()),
    }
    match cudarc::driver::CudaContext::device_count() {
        Ok(0) => Availability::Unavailable("the driver reports no CUDA device".into()),
        Ok(n) => match cudarc::driver::CudaContext::new(0) {
            Ok(ctx) => {
                let name = ctx.name().unwrap_or_else(|_| "unknown device".into());
                Availability::Available(format!("{name} ({n} device(s))"))
            }
            Err(e) => Availability::Unavailable(format!("cannot create a context on device 0: {e}")),
        },
        Err(e) => Availability::Unavailable(format!("cannot count devices: {e}")),
    }
}
