//! The errors of this crate's own checks (dtypes, devices, packing), and the conversion of
//! every error, the library's included, into a candle error that keeps its message.

use candle_core::{DType, Device};

/// What went wrong before or after the library ran: a tensor of the wrong dtype or on another
/// device, or a packed buffer that does not match its layout. The library's own errors
/// ([`mixer_core::Error`]: shapes, values, configs, forms) pass through unchanged.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor's element type is not one the op computes in.
    #[error("input `{name}`: expected dtype {expected}, got {got:?}")]
    Dtype { name: String, expected: String, got: DType },
    /// A tensor lives on a device this build cannot run on, or on another device than the
    /// first input.
    #[error("input `{name}`: expected a tensor on {expected}, got one on {got}")]
    Device { name: String, expected: String, got: String },
    /// A buffer handed to an op does not have the layout the op packed (an internal error).
    #[error("packed buffer of `{op}`: expected {expected}, got {got}")]
    Packing { op: String, expected: String, got: String },
    /// An error of the library, with its message.
    #[error(transparent)]
    Mixers(#[from] mixer_core::Error),
}

impl From<Error> for candle_core::Error {
    fn from(e: Error) -> Self {
        candle_core::Error::wrap(e)
    }
}

/// A library result as a candle result (the message kept).
pub(crate) fn lib<T>(r: mixer_core::Result<T>) -> candle_core::Result<T> {
    r.map_err(|e| Error::Mixers(e).into())
}

/// How a device is named in messages.
pub(crate) fn device_name(d: &Device) -> String {
    match d {
        Device::Cpu => "the CPU".into(),
        Device::Cuda(_) => "a CUDA device".into(),
        Device::Metal(_) => "a Metal device".into(),
    }
}
