//! The element types the typed operations accept (`f32`, `f64`), and their bridge to the
//! dynamic path's dtype-tagged tensors.

use mixer_core::mixer::{Decoder, Mixer};
use mixer_core::{AnyTensors, Dims, Error, Real, Result, Tensor, Tensors};
use ndarray::ArrayD;

use super::dispatch::BackendArg;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// An element type of the typed operations: `f32` or `f64` (bf16 storage is the `bf16`
/// precision mode on `f32` arrays). Sealed: the backends compute in exactly these types.
pub trait Scalar: Real + sealed::Sealed {
    /// Tags named tensors of this type for the dynamic path.
    #[doc(hidden)]
    fn tag(t: Tensors<Self>) -> AnyTensors;
    /// Takes the output of the dynamic path back, failing if its dtype is not this type.
    #[doc(hidden)]
    fn untag(t: Tensor) -> Result<ArrayD<Self>>;
    /// Opens the backend's decoder of `m` in this type (the registry's typed entry point).
    #[doc(hidden)]
    fn open_decoder(
        m: &dyn Mixer,
        backend: BackendArg,
        statics: &Tensors<Self>,
        dims: &Dims,
    ) -> Result<Box<dyn Decoder<Self>>>;
}

fn dtype_error(want: &str, got: &Tensor) -> Error {
    Error::Backend {
        backend: "ops".into(),
        family: None,
        message: format!("expected a {want} output, the dynamic path returned {}", got.dtype().name()),
    }
}

impl Scalar for f32 {
    fn tag(t: Tensors<f32>) -> AnyTensors {
        AnyTensors::F32(t)
    }
    fn untag(t: Tensor) -> Result<ArrayD<f32>> {
        match t {
            Tensor::F32(a) => Ok(a),
            other => Err(dtype_error("f32", &other)),
        }
    }
    fn open_decoder(
        m: &dyn Mixer,
        backend: BackendArg,
        statics: &Tensors<f32>,
        dims: &Dims,
    ) -> Result<Box<dyn Decoder<f32>>> {
        mixer_registry::run::decoder::<f32>(m, &backend, statics, dims)
    }
}

impl Scalar for f64 {
    fn tag(t: Tensors<f64>) -> AnyTensors {
        AnyTensors::F64(t)
    }
    fn untag(t: Tensor) -> Result<ArrayD<f64>> {
        match t {
            Tensor::F64(a) => Ok(a),
            other => Err(dtype_error("f64", &other)),
        }
    }
    fn open_decoder(
        m: &dyn Mixer,
        backend: BackendArg,
        statics: &Tensors<f64>,
        dims: &Dims,
    ) -> Result<Box<dyn Decoder<f64>>> {
        mixer_registry::run::decoder::<f64>(m, &backend, statics, dims)
    }
}
