//! Named tensors: the inputs and outputs of every mixer (`ndarray`, row-major, batch first).

use std::borrow::Cow;
use std::collections::BTreeMap;

use ndarray::{ArrayD, Axis};

use crate::error::{Error, Result, fmt_shape};
pub use crate::real::DType;
use crate::real::Real;

/// Named tensors of one scalar type, e.g. `{"q": [B,T,H,Dk], "k": …, "v": …}`.
pub type Tensors<F> = BTreeMap<String, ArrayD<F>>;

/// A tensor of either scalar type.
#[derive(Clone, Debug, PartialEq)]
pub enum Tensor {
    /// `f32` data.
    F32(ArrayD<f32>),
    /// `f64` data.
    F64(ArrayD<f64>),
}

impl Tensor {
    /// The scalar type.
    pub fn dtype(&self) -> DType {
        match self {
            Tensor::F32(_) => DType::F32,
            Tensor::F64(_) => DType::F64,
        }
    }
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            Tensor::F32(a) => a.shape(),
            Tensor::F64(a) => a.shape(),
        }
    }
    /// A copy in `f64`.
    pub fn to_f64(&self) -> ArrayD<f64> {
        match self {
            Tensor::F32(a) => a.mapv(|x| x as f64),
            Tensor::F64(a) => a.clone(),
        }
    }
}

/// Named tensors of one scalar type, either `f32` or `f64`.
#[derive(Clone, Debug, PartialEq)]
pub enum AnyTensors {
    /// All `f32`.
    F32(Tensors<f32>),
    /// All `f64`.
    F64(Tensors<f64>),
}

impl AnyTensors {
    /// Gathers named tensors; they must share one scalar type.
    pub fn from_tensors(map: BTreeMap<String, Tensor>) -> Result<Self> {
        let dtypes: std::collections::BTreeSet<DType> = map.values().map(Tensor::dtype).collect();
        if dtypes.len() > 1 {
            let list: Vec<String> = map.iter().map(|(k, v)| format!("{k}: {}", v.dtype().name())).collect();
            return Err(Error::Io(format!(
                "inputs mix f32 and f64 ({}); expected one dtype",
                list.join(", ")
            )));
        }
        if dtypes.contains(&DType::F32) {
            Ok(AnyTensors::F32(
                map.into_iter()
                    .map(|(k, v)| if let Tensor::F32(a) = v { (k, a) } else { unreachable!() })
                    .collect(),
            ))
        } else {
            Ok(AnyTensors::F64(map.into_iter().map(|(k, v)| (k, v.to_f64())).collect()))
        }
    }
    /// The scalar type.
    pub fn dtype(&self) -> DType {
        match self {
            AnyTensors::F32(_) => DType::F32,
            AnyTensors::F64(_) => DType::F64,
        }
    }
    /// All tensors converted to `f64`.
    pub fn to_f64(&self) -> Tensors<f64> {
        match self {
            AnyTensors::F32(m) => m.iter().map(|(k, v)| (k.clone(), v.mapv(|x| x as f64))).collect(),
            AnyTensors::F64(m) => m.clone(),
        }
    }
    /// Names and shapes, for messages.
    pub fn shapes(&self) -> BTreeMap<String, Vec<usize>> {
        match self {
            AnyTensors::F32(m) => m.iter().map(|(k, v)| (k.clone(), v.shape().to_vec())).collect(),
            AnyTensors::F64(m) => m.iter().map(|(k, v)| (k.clone(), v.shape().to_vec())).collect(),
        }
    }
}

/// Tensors with more elements than this are cast (and drawn, [`crate::spec::draw`]) in parallel.
pub const PARALLEL: usize = 1 << 22;

/// Converts named `f64` tensors to another scalar type (large tensors in parallel).
pub fn cast_tensors<F: Real>(m: &Tensors<f64>) -> Tensors<F> {
    m.iter().map(|(k, v)| (k.clone(), cast(v))).collect()
}

/// One tensor as another scalar type; above [`PARALLEL`] elements, in parallel.
fn cast<F: Real>(v: &ArrayD<f64>) -> ArrayD<F> {
    if v.len() <= PARALLEL {
        return v.mapv(F::of);
    }
    let mut out = ArrayD::<F>::zeros(v.raw_dim());
    ndarray::Zip::from(&mut out).and(v).par_for_each(|o, &x| *o = F::of(x));
    out
}

/// Converts a tensor to `f64`.
pub fn to_f64<F: Real>(a: &ArrayD<F>) -> ArrayD<f64> {
    a.mapv(|x| x.f64())
}

/// Converts named tensors to `f64`.
pub fn tensors_to_f64<F: Real>(m: &Tensors<F>) -> Tensors<f64> {
    m.iter().map(|(k, v)| (k.clone(), to_f64(v))).collect()
}

/// Looks up a named input, with an error listing what was given.
pub fn get<'a, F>(m: &'a Tensors<F>, name: &str) -> Result<&'a ArrayD<F>> {
    m.get(name).ok_or_else(|| Error::MissingInput {
        name: name.to_string(),
        expected: "a tensor".into(),
        given: m.keys().cloned().collect::<Vec<_>>().join(", "),
    })
}

/// Input `name` as a contiguous row-major slice (borrowed when it already is), after checking
/// that its shape is exactly `want`. Decoders use it for the per-token inputs (`want` without
/// the sequence axis), forms for whole inputs.
pub fn contiguous<'a, F: Copy>(m: &'a Tensors<F>, name: &str, want: &[usize]) -> Result<Cow<'a, [F]>> {
    let a = get(m, name)?;
    if a.shape() != want {
        return Err(Error::shape(name, fmt_shape(want), fmt_shape(a.shape())));
    }
    Ok(match a.as_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(a.iter().copied().collect()),
    })
}

/// The slice of every per-token input at position `t` (sequence axis 1 removed), for decoders.
pub fn token_slice<F: Clone>(m: &Tensors<F>, per_token: &[String], t: usize) -> Tensors<F> {
    m.iter()
        .filter(|(k, _)| per_token.contains(k))
        .map(|(k, v)| (k.clone(), v.index_axis(Axis(1), t).to_owned()))
        .collect()
}

/// The prefix `[0, len)` along the sequence axis of every per-token input.
pub fn prefix<F: Clone>(m: &Tensors<F>, per_token: &[String], len: usize) -> Tensors<F> {
    m.iter()
        .map(|(k, v)| {
            let v = if per_token.contains(k) {
                v.slice_axis(Axis(1), ndarray::Slice::from(0..len)).to_owned()
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

/// The shape of an array, formatted as `[2, 7, 3]` (for messages).
pub fn fmt_shape_of<F>(a: &ArrayD<F>) -> String {
    crate::error::fmt_shape(a.shape())
}
