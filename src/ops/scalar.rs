//! The element types the typed operations accept (`f32`, `f64`), and their bridge to the
//! dynamic path's dtype-tagged tensors.

use mixer_core::mixer::{Decoder, Mixer};
use mixer_core::{Dims, Real, Result, Tensors};

use mixer_registry::Backend;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// An element type of the typed operations: `f32` or `f64` (bf16 storage is the `bf16`
/// precision mode on `f32` arrays). Sealed: the backends compute in exactly these types.
pub trait Scalar: Real + mixer_registry::Scalar + sealed::Sealed {
    /// Opens the backend's decoder of `m` in this type (the registry's typed entry point).
    #[doc(hidden)]
    fn open_decoder(
        m: &dyn Mixer,
        backend: Backend,
        statics: &Tensors<Self>,
        dims: &Dims,
    ) -> Result<Box<dyn Decoder<Self>>>;
}

impl Scalar for f32 {
    fn open_decoder(
        m: &dyn Mixer,
        backend: Backend,
        statics: &Tensors<f32>,
        dims: &Dims,
    ) -> Result<Box<dyn Decoder<f32>>> {
        mixer_registry::run::decoder::<f32>(m, &backend, statics, dims)
    }
}

impl Scalar for f64 {
    fn open_decoder(
        m: &dyn Mixer,
        backend: Backend,
        statics: &Tensors<f64>,
        dims: &Dims,
    ) -> Result<Box<dyn Decoder<f64>>> {
        mixer_registry::run::decoder::<f64>(m, &backend, statics, dims)
    }
}
