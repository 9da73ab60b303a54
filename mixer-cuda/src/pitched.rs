//! Pitched copies on the device (`kernels/tensor.cu`, `copy_rows_*`): runs of elements at a fixed
//! pitch, and from them a range of one axis of a row-major tensor cut out as a tensor of its own
//! ([`slice_axis`]) or written back into a larger one ([`put_axis`]).

use std::ops::Range;

use cudarc::driver::{CudaView, CudaViewMut};
use mixer_core::{Error, Result};

use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu, grid1, launch};
use crate::tensor::{DeviceScalar, DeviceTensor};

const WHAT: &str = "pitched copy";

/// `rows` runs of `width` elements from `src` (run `r` at `r · src_pitch`) to `dst` (at
/// `r · dst_pitch`), on the device.
pub(crate) fn copy_rows<T: DeviceScalar>(
    src: &CudaView<'_, T>,
    src_pitch: usize,
    dst: &mut CudaViewMut<'_, T>,
    dst_pitch: usize,
    width: usize,
    rows: usize,
) -> Result<()> {
    let n = width * rows;
    if n == 0 {
        return Ok(());
    }
    let last = |pitch: usize| (rows - 1) * pitch + width;
    if last(src_pitch) > src.len() || last(dst_pitch) > dst.len() {
        return Err(err(WHAT, "internal: a row copy past its buffers"));
    }
    let g = gpu()?;
    let f = g.kernel(WHAT, &kernels::TENSOR, &[], &format!("copy_rows_{}", T::ELEM))?;
    let (sp, dp, w, r) = (src_pitch as i64, dst_pitch as i64, width as i64, rows as i64);
    launch!(g, WHAT, f, grid1(n.min(1 << 20), 256); src, &sp, dst, &dp, &w, &r)
}

/// The runs of entries `r` of axis `axis` in a row-major `shape`: `(rows, width, pitch, start)` —
/// `rows` runs of `width` elements, `pitch` apart, the first at element `start`.
fn runs(shape: &[usize], axis: usize, r: &Range<usize>) -> Result<(usize, usize, usize, usize)> {
    let Some(&n) = shape.get(axis) else {
        return Err(err(WHAT, format!("internal: axis {axis} of a tensor of {} axes", shape.len())));
    };
    if r.start > r.end || r.end > n {
        return Err(Error::Value {
            name: format!("axis {axis} range"),
            constraint: format!("a range within 0..{n}"),
            found: format!("{}..{}", r.start, r.end),
        });
    }
    let inner: usize = shape[axis + 1..].iter().product();
    let rows: usize = shape[..axis].iter().product();
    Ok((rows, r.len() * inner, n * inner, r.start * inner))
}

/// Entries `r` of axis `axis` of `x`, as a new contiguous tensor (one copy on the device).
pub(crate) fn slice_axis<T: DeviceScalar>(
    x: &DeviceTensor<T>,
    axis: usize,
    r: Range<usize>,
) -> Result<DeviceTensor<T>> {
    let (rows, width, pitch, start) = runs(x.shape(), axis, &r)?;
    let mut shape = x.shape().to_vec();
    shape[axis] = r.len();
    let mut buf: Pooled<T> = pool::take::<T>(WHAT, rows * width)?;
    copy_rows(&x.view().slice(start.min(x.len())..), pitch, &mut buf.slice_mut(..), width, width, rows)?;
    DeviceTensor::from_pooled(buf, &shape)
}

/// Writes `part` into entries `r` of axis `axis` of `full` (a buffer of row-major `shape`), where
/// `part` has `shape` with that axis cut to `r`.
pub(crate) fn put_axis<T: DeviceScalar>(
    part: &DeviceTensor<T>,
    full: &mut Pooled<T>,
    shape: &[usize],
    axis: usize,
    r: Range<usize>,
) -> Result<()> {
    let (rows, width, pitch, start) = runs(shape, axis, &r)?;
    if part.len() != rows * width {
        return Err(err(WHAT, format!("internal: {} elements for {rows} runs of {width}", part.len())));
    }
    let end = full.len();
    copy_rows(&part.view(), width, &mut full.slice_mut(start.min(end)..), pitch, width, rows)
}
