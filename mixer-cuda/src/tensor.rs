//! Device tensors: a pooled device buffer with a shape and a dtype, row-major, batch first —
//! the GPU counterpart of the `ndarray` inputs and outputs of every mixer.
//!
//! - [`DeviceTensor::upload`] / [`DeviceTensor::to_host`] copy from and to `ndarray`;
//!   `to_host` is the one place that waits for the stream.
//! - [`DeviceTensor::batch`] is a zero-copy view of a range of the batch axis (the buffer is
//!   shared, reference-counted).
//! - [`DeviceTensor::borrowed`] views a caller's device memory (a PyTorch tensor's) in place;
//!   [`DeviceTensor::external_owner`] gives back the owner of a result's memory when it came
//!   from a caller's allocator ([`crate::pool::with_allocator`]).
//! - Work that produces a tensor is enqueued on the backend's stream and returns at once.
//!   Checks whose outcome is only known on the device (input value constraints, a finite
//!   output) travel with the tensor as deferred checks ([`Deferred`]) and are reported as
//!   errors when the result is read, the way CUDA reports an asynchronous fault at the next
//!   synchronisation.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaView, DeviceRepr, ValidAsZeroBits};
use mixer_core::error::fmt_shape;
use mixer_core::{Error, Real, Result};
use ndarray::{ArrayD, IxDyn};

use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu};

/// bfloat16, as stored on the device.
pub use half::bf16;

/// An element type of device tensors: `f32`, `f64` or [`bf16`].
pub trait DeviceScalar:
    DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + Unpin + 'static
{
    /// Its name (`"f32"`, `"f64"`, `"bf16"`).
    const ELEM: &'static str;
    /// As [`AnyDeviceTensor`].
    fn wrap(t: DeviceTensor<Self>) -> AnyDeviceTensor;
    /// From [`AnyDeviceTensor`], if it holds this type.
    fn unwrap(t: &AnyDeviceTensor) -> Option<&DeviceTensor<Self>>;
}

/// A scalar type with device kernels: `f32` or `f64`.
pub trait GpuReal: Real + DeviceScalar {
    /// Suffix of the `extern "C"` kernel instantiation (`"f32"` / `"f64"`).
    const SUFFIX: &'static str;
}

impl GpuReal for f32 {
    const SUFFIX: &'static str = "f32";
}

impl GpuReal for f64 {
    const SUFFIX: &'static str = "f64";
}

impl DeviceScalar for f32 {
    const ELEM: &'static str = "f32";
    fn wrap(t: DeviceTensor<Self>) -> AnyDeviceTensor {
        AnyDeviceTensor::F32(t)
    }
    fn unwrap(t: &AnyDeviceTensor) -> Option<&DeviceTensor<Self>> {
        if let AnyDeviceTensor::F32(x) = t { Some(x) } else { None }
    }
}

impl DeviceScalar for f64 {
    const ELEM: &'static str = "f64";
    fn wrap(t: DeviceTensor<Self>) -> AnyDeviceTensor {
        AnyDeviceTensor::F64(t)
    }
    fn unwrap(t: &AnyDeviceTensor) -> Option<&DeviceTensor<Self>> {
        if let AnyDeviceTensor::F64(x) = t { Some(x) } else { None }
    }
}

impl DeviceScalar for bf16 {
    const ELEM: &'static str = "bf16";
    fn wrap(t: DeviceTensor<Self>) -> AnyDeviceTensor {
        AnyDeviceTensor::Bf16(t)
    }
    fn unwrap(t: &AnyDeviceTensor) -> Option<&DeviceTensor<Self>> {
        if let AnyDeviceTensor::Bf16(x) = t { Some(x) } else { None }
    }
}

/// A check whose outcome is on the device: a flag that a kernel sets (to a nonzero code, or
/// to `1 +` the flat index of the first violation), and how to turn it into an error.
pub struct Deferred {
    flag: Pooled<i64>,
    explain: Box<dyn Fn(i64) -> Error + Send + Sync>,
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deferred")
    }
}

impl Deferred {
    /// A zeroed flag (at most one `i64`) and the error for a nonzero value.
    pub fn new(kernel: &str, explain: impl Fn(i64) -> Error + Send + Sync + 'static) -> Result<Deferred> {
        Ok(Deferred { flag: pool::zeros::<i64>(kernel, 1)?, explain: Box::new(explain) })
    }
    /// The flag, for the kernel that sets it.
    pub fn flag(&self) -> &CudaSlice<i64> {
        &self.flag
    }
    /// Reads the flag (after the stream was synchronised) and returns its error, if set.
    fn outcome(&self) -> Result<()> {
        let g = gpu()?;
        let mut v = [0i64];
        g.stream()
            .memcpy_dtoh(&self.flag.slice(0..1), &mut v[..])
            .map_err(|e| err("tensor", format!("device→host copy of a check flag: {e}")))?;
        crate::runtime::count_sync();
        if v[0] != 0 { Err((self.explain)(v[0])) } else { Ok(()) }
    }
}

/// A tensor on the device: row-major, `shape`, starting `offset` elements into a shared
/// pooled buffer.
pub struct DeviceTensor<T: DeviceScalar> {
    buf: Arc<Pooled<T>>,
    offset: usize,
    shape: Vec<usize>,
    checks: Vec<Arc<Deferred>>,
}

impl<T: DeviceScalar> Clone for DeviceTensor<T> {
    /// Another handle on the same device memory (no copy).
    fn clone(&self) -> Self {
        DeviceTensor {
            buf: self.buf.clone(),
            offset: self.offset,
            shape: self.shape.clone(),
            checks: self.checks.clone(),
        }
    }
}

impl<T: DeviceScalar> std::fmt::Debug for DeviceTensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceTensor<{}>{}", T::ELEM, fmt_shape(&self.shape))
    }
}

impl<T: DeviceScalar> DeviceTensor<T> {
    /// Wraps a pooled buffer that holds at least `prod(shape)` elements.
    pub fn from_pooled(buf: Pooled<T>, shape: &[usize]) -> Result<Self> {
        let n: usize = shape.iter().product();
        if buf.len() < n {
            return Err(err(
                "tensor",
                format!(
                    "internal: a buffer of {} elements cannot hold shape {}",
                    buf.len(),
                    fmt_shape(shape)
                ),
            ));
        }
        Ok(DeviceTensor { buf: Arc::new(buf), offset: 0, shape: shape.to_vec(), checks: Vec::new() })
    }

    /// The row-major tensor of `shape` whose elements start at device address `ptr`, memory
    /// that someone else owns (e.g. a contiguous PyTorch tensor's `data_ptr()`): read and
    /// written in place, never freed; `owner` is dropped with the last view of it.
    ///
    /// # Safety
    /// `ptr` must address `prod(shape)` elements of `T` in the backend device's primary context, valid
    /// while `owner` lives and while work enqueued on them runs, and aligned to 16 bytes (the
    /// kernels' vector loads).
    pub unsafe fn borrowed(
        ptr: u64,
        shape: &[usize],
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Self> {
        let n: usize = shape.iter().product();
        if !ptr.is_multiple_of(16) || (ptr == 0 && n > 0) {
            return Err(Error::Value {
                name: "device address".into(),
                constraint: "a nonzero multiple of 16 bytes".into(),
                found: format!("{ptr:#x}"),
            });
        }
        // SAFETY: as the caller promises.
        let buf = unsafe { pool::borrowed::<T>(ptr, n, owner)? };
        Self::from_pooled(buf, shape)
    }

    /// The owner of this tensor's memory and the tensor's offset into it in bytes, when the
    /// memory came from a caller's allocator ([`crate::pool::with_allocator`]) or is a
    /// caller's ([`DeviceTensor::borrowed`]); `None` for the pool's memory.
    pub fn external_owner(&self) -> Option<(&(dyn std::any::Any + Send + Sync), usize)> {
        self.buf.external_owner().map(|o| (o, self.offset * std::mem::size_of::<T>()))
    }

    /// A zero-filled tensor.
    pub fn zeros(shape: &[usize]) -> Result<Self> {
        Self::from_pooled(pool::zeros::<T>("tensor", shape.iter().product())?, shape)
    }

    /// Copies a host array (any layout) to the device, row-major. The copy is enqueued on the
    /// backend's stream.
    pub fn upload(a: &ArrayD<T>) -> Result<Self> {
        let a = a.as_standard_layout();
        let s = a
            .as_slice()
            .ok_or_else(|| err("tensor", "internal: a standard-layout array is not contiguous"))?;
        let mut buf = pool::take::<T>("tensor", s.len())?;
        if !s.is_empty() {
            gpu()?
                .stream()
                .memcpy_htod(s, &mut buf.slice_mut(0..s.len()))
                .map_err(|e| err("tensor", format!("host→device copy of {} elements: {e}", s.len())))?;
        }
        Self::from_pooled(buf, a.shape())
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as a device view (what kernels take).
    pub fn view(&self) -> CudaView<'_, T> {
        self.buf.slice(self.offset..self.offset + self.len())
    }

    /// A zero-copy view of batch entries `range` (axis 0).
    pub fn batch(&self, range: std::ops::Range<usize>) -> Result<Self> {
        let Some(&nb) = self.shape.first() else {
            return Err(Error::shape("tensor", "at least one axis", "a scalar"));
        };
        if range.start > range.end || range.end > nb {
            return Err(Error::Value {
                name: "batch range".into(),
                constraint: format!("a range within 0..{nb}"),
                found: format!("{}..{}", range.start, range.end),
            });
        }
        let per: usize = self.shape[1..].iter().product();
        let mut shape = self.shape.clone();
        shape[0] = range.end - range.start;
        Ok(DeviceTensor {
            buf: self.buf.clone(),
            offset: self.offset + range.start * per,
            shape,
            checks: self.checks.clone(),
        })
    }

    /// The same elements under another shape with as many elements (no copy).
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        if shape.iter().product::<usize>() != self.len() {
            return Err(Error::shape("reshape", fmt_shape(&self.shape), fmt_shape(shape)));
        }
        Ok(DeviceTensor { shape: shape.to_vec(), ..self.clone() })
    }

    /// The identity of this tensor's elements, for caches of values derived from them: the
    /// buffer (weakly held, so a dropped tensor never matches), the offset and the shape.
    /// Device tensors are not mutated by this library, so equal identity means equal values.
    pub fn identity(&self) -> (std::sync::Weak<Pooled<T>>, usize, Vec<usize>) {
        (Arc::downgrade(&self.buf), self.offset, self.shape.clone())
    }

    /// Attaches deferred checks (reported when this tensor is read).
    pub fn with_checks(mut self, checks: impl IntoIterator<Item = Arc<Deferred>>) -> Self {
        for c in checks {
            if !self.checks.iter().any(|d| Arc::ptr_eq(d, &c)) {
                self.checks.push(c);
            }
        }
        self
    }

    /// The deferred checks this tensor carries.
    pub fn checks(&self) -> &[Arc<Deferred>] {
        &self.checks
    }

    /// Waits for the stream, reports any failed deferred check or asynchronous kernel fault,
    /// and copies the tensor to the host.
    pub fn to_host(&self) -> Result<ArrayD<T>> {
        let g = gpu()?;
        let n = self.len();
        let mut v = vec![T::default(); n];
        if n > 0 {
            g.stream()
                .memcpy_dtoh(&self.view(), &mut v[..])
                .map_err(|e| err("tensor", format!("device→host copy: {e}")))?;
        }
        g.sync("tensor")?;
        for c in &self.checks {
            c.outcome()?;
        }
        ArrayD::from_shape_vec(IxDyn(&self.shape), v).map_err(|e| err("tensor", format!("internal: {e}")))
    }
}

/// A device tensor of any element type.
#[derive(Clone, Debug)]
pub enum AnyDeviceTensor {
    /// `f32` elements.
    F32(DeviceTensor<f32>),
    /// `f64` elements.
    F64(DeviceTensor<f64>),
    /// bfloat16 elements.
    Bf16(DeviceTensor<bf16>),
}

impl AnyDeviceTensor {
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            AnyDeviceTensor::F32(t) => t.shape(),
            AnyDeviceTensor::F64(t) => t.shape(),
            AnyDeviceTensor::Bf16(t) => t.shape(),
        }
    }
    /// The element type's name.
    pub fn dtype(&self) -> &'static str {
        match self {
            AnyDeviceTensor::F32(_) => "f32",
            AnyDeviceTensor::F64(_) => "f64",
            AnyDeviceTensor::Bf16(_) => "bf16",
        }
    }
    /// The deferred checks the tensor carries.
    pub fn checks(&self) -> &[Arc<Deferred>] {
        match self {
            AnyDeviceTensor::F32(t) => t.checks(),
            AnyDeviceTensor::F64(t) => t.checks(),
            AnyDeviceTensor::Bf16(t) => t.checks(),
        }
    }
    /// The same tensor carrying `checks` too (reported when it is read).
    pub fn with_checks(self, checks: impl IntoIterator<Item = Arc<Deferred>>) -> Self {
        match self {
            AnyDeviceTensor::F32(t) => AnyDeviceTensor::F32(t.with_checks(checks)),
            AnyDeviceTensor::F64(t) => AnyDeviceTensor::F64(t.with_checks(checks)),
            AnyDeviceTensor::Bf16(t) => AnyDeviceTensor::Bf16(t.with_checks(checks)),
        }
    }
    /// A zero-copy view of batch entries `range`.
    pub fn batch(&self, range: std::ops::Range<usize>) -> Result<Self> {
        Ok(match self {
            AnyDeviceTensor::F32(t) => AnyDeviceTensor::F32(t.batch(range)?),
            AnyDeviceTensor::F64(t) => AnyDeviceTensor::F64(t.batch(range)?),
            AnyDeviceTensor::Bf16(t) => AnyDeviceTensor::Bf16(t.batch(range)?),
        })
    }
    /// The same elements under another shape with as many elements (no copy).
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        Ok(match self {
            AnyDeviceTensor::F32(t) => AnyDeviceTensor::F32(t.reshape(shape)?),
            AnyDeviceTensor::F64(t) => AnyDeviceTensor::F64(t.reshape(shape)?),
            AnyDeviceTensor::Bf16(t) => AnyDeviceTensor::Bf16(t.reshape(shape)?),
        })
    }
    /// The `T` tensor, or an error naming the input and both dtypes.
    pub fn typed<T: DeviceScalar>(&self, name: &str) -> Result<&DeviceTensor<T>> {
        T::unwrap(self).ok_or_else(|| Error::Value {
            name: name.to_string(),
            constraint: format!("a {} device tensor", T::ELEM),
            found: format!("a {} device tensor", self.dtype()),
        })
    }
}

/// Named device tensors, e.g. `{"q": [B,T,H,Dk] bf16, "g": [B,T,H] f32, …}`.
pub type DeviceTensors = BTreeMap<String, AnyDeviceTensor>;
