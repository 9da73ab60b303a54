//! With the feature `linked`, links cuFFT: cudarc's dynamic linking names the driver, NVRTC,
//! NCCL and the BLAS libraries to the linker but not cuFFT, whose bindings the backend uses.
//! The default build (libraries loaded at run time) needs nothing here.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_LINKED").is_some() {
        println!("cargo:rustc-link-lib=dylib=cufft");
    }
}
