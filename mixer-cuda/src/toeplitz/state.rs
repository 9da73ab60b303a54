//! The Toeplitz mixer from a state on CUDA (docs/math.md §7.1): the extension by the state's input
//! history, built and run on the device (`crate::state_rows`).
//!
//! Batch row `b` at position `a_b` runs the `fast` form over `[x_hist[b, 0 … a_b − 1]; x[b]]`, its
//! rows in one buffer of `max_b a_b + T` tokens per batch row (zeros past `a_b + T`: a causal
//! convolution's earlier outputs never read them), and `y` is rows `a_b … a_b + T − 1` of the
//! result: `O(n log n)` for `n = max a_b + T`, the cost of reading every input the outputs depend
//! on. The final history is rows `0 … a_b + T − 1` of the extension (capacity `Tw`), the position
//! `a_b + T`. The backward ([`backward_from`]) is the extension's backward (exact mode, on the values
//! as stored) with the cotangent zero off the run's rows; the history's gradient is the
//! extension's rows `0 … a_b − 1`, and the final history's cotangent adds to the rows it copied.
//! The positions are read back to the host (the copies need them) and checked as the host checks
//! them; the history's rows from a position on are not read (on host arrays a history whose rows
//! there are not zero is refused before the upload, `DeviceFamily::check_host_state`).

use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::mixers::toeplitz::state::{HISTORY, check_positions};
use mixer_core::state::POSITION;
use mixer_core::{Precision, Requires, Result};

use super::common::FAMILY;
use crate::fft::FftReal;
use crate::forms::{cotangent, input};
use crate::runtime::err;
use crate::state_rows::{counts, finals, gathered, joined, split_grad};
use crate::tensor::{AnyDeviceTensor, DeviceScalar, DeviceTensor, DeviceTensors, bf16};

/// What a run from a state needs of it: the history (`None`: none), the positions (checked for a
/// run of `t_len` tokens with taps of length `tw`, `a + T ≤ Tw`; without a state `T ≤ Tw` is the
/// plain run's check).
struct History<F: FftReal> {
    hist: Option<DeviceTensor<F>>,
    pos: Vec<usize>,
    t_len: usize,
    tw: usize,
}

fn history<F: FftReal>(x: &DeviceTensors, s0: Option<&DeviceTensors>) -> Result<History<F>> {
    let xs = x.get("x").ok_or_else(|| err(FAMILY, "internal: no `x`"))?;
    let w = x.get("w").ok_or_else(|| err(FAMILY, "internal: no `w`"))?;
    let (b, t_len, tw) = (xs.shape()[0], xs.shape()[1], w.shape().last().copied().unwrap_or(0));
    Ok(match s0 {
        Some(s) => {
            let pos = check_positions(&input::<F>(s, POSITION)?.to_host()?, tw, t_len)?;
            History { hist: Some(input::<F>(s, HISTORY)?.into_owned()), pos, t_len, tw }
        }
        None => History { hist: None, pos: vec![0; b], t_len, tw },
    })
}

/// `y` and the final state of the `fast` form from `s0` (`None`: position 0) on device tensors in
/// mode `p` (module documentation).
pub fn run_from<F: FftReal>(
    tz: &Toeplitz,
    x: &DeviceTensors,
    s0: Option<&DeviceTensors>,
    p: Precision,
) -> Result<(AnyDeviceTensor, DeviceTensors)> {
    match x.get("x") {
        Some(AnyDeviceTensor::Bf16(_)) => run_typed::<F, bf16>(tz, x, s0, p),
        _ => run_typed::<F, F>(tz, x, s0, p),
    }
}

/// [`run_from`] with the activations in `E` (`F`, or bf16 in the bf16 mode).
fn run_typed<F: FftReal, E: DeviceScalar>(
    tz: &Toeplitz,
    x: &DeviceTensors,
    s0: Option<&DeviceTensors>,
    p: Precision,
) -> Result<(AnyDeviceTensor, DeviceTensors)> {
    let History { hist, pos, t_len, tw } = history::<F>(x, s0)?;
    let xs = x.get("x").and_then(E::unwrap).ok_or_else(|| err(FAMILY, "internal: `x` of another type"))?;
    let n = pos.iter().copied().max().unwrap_or(0) + t_len;
    let mut ext = x.clone();
    ext.insert("x".into(), E::wrap(joined::<F, E>(hist.as_ref(), xs, &pos, n)?));
    let y = match super::fast::run::<F>(tz, &ext, p)? {
        AnyDeviceTensor::Bf16(y) => AnyDeviceTensor::Bf16(gathered(&y, &pos, t_len)?),
        AnyDeviceTensor::F32(y) => AnyDeviceTensor::F32(gathered(&y, &pos, t_len)?),
        AnyDeviceTensor::F64(y) => AnyDeviceTensor::F64(gathered(&y, &pos, t_len)?),
    };
    let ends: Vec<usize> = pos.iter().map(|&a| a + t_len).collect();
    let fin = finals::<F, E>(hist.as_ref(), xs, &pos, &ends, tw)?;
    let fin = [(HISTORY, fin), (POSITION, counts::<F>(&ends)?)];
    Ok((y, fin.into_iter().map(|(k, t)| (k.to_string(), F::wrap(t))).collect()))
}

/// The backward of [`run_from`] (module documentation): the gradients of the inputs (`d_x`, `d_w`
/// and `d_bias` where given) and, with `s0`, the state's (the position's zero), from `dy` and the
/// final state's cotangent `d_final` (`None`: zero); exact mode on the values as stored.
pub fn backward_from<F: FftReal>(
    tz: &Toeplitz,
    x: &DeviceTensors,
    s0: Option<&DeviceTensors>,
    dy: &AnyDeviceTensor,
    d_final: Option<&DeviceTensors>,
    _req: &Requires,
    _p: Precision,
) -> Result<(DeviceTensors, DeviceTensors)> {
    let History { hist, pos, t_len, tw } = history::<F>(x, s0)?;
    let xs = input::<F>(x, "x")?;
    let dy = cotangent::<F>(dy, xs.shape())?;
    let n = pos.iter().copied().max().unwrap_or(0) + t_len;
    let mut ext = x.clone();
    ext.insert("x".into(), F::wrap(joined::<F, F>(hist.as_ref(), &xs, &pos, n)?));
    let dy_ext = F::wrap(joined::<F, F>(None, &dy, &pos, n)?);
    let mut g = super::backward::run::<F>(tz, &ext, &dy_ext, &Requires::All, Precision::Exact)?;
    let ends: Vec<usize> = pos.iter().map(|&a| a + t_len).collect();
    let df = d_final.map(|d| input::<F>(d, HISTORY)).transpose()?;
    let dx_ext = input::<F>(&g, "d_x")?.into_owned();
    let (dx, dh) = split_grad::<F>(&dx_ext, df.as_deref(), &pos, &ends, t_len, tw)?;
    g.insert("d_x".into(), F::wrap(dx));
    let mut ds = DeviceTensors::new();
    if s0.is_some() {
        ds.insert(HISTORY.into(), F::wrap(dh));
        ds.insert(POSITION.into(), F::wrap(DeviceTensor::<F>::zeros(&[pos.len()])?));
    }
    Ok((g, ds))
}
