//! Shared helpers: valid random inputs drawn by the library's gradient checks, conversions
//! between the library's arrays and candle tensors, and the typed calls of both APIs by name.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor, Var};
use mixers::ndarray::{ArrayD, Ix3, Ix4};
use mixers::ops::{self, Options};
use mixers::prelude::{Mixer, Tensors};
use mixers::registry::Sizes;

/// The typed mixers, each with its inputs in the order of its function's parameters.
pub const TYPED: [(&str, &[&str]); 7] = [
    ("attention", &["q", "k", "v"]),
    ("linear-attention", &["q", "k", "v"]),
    ("mamba2", &["q", "k", "v", "g"]),
    ("gated-deltanet", &["q", "k", "v", "g", "beta"]),
    ("loglinear-attention", &["q", "k", "v", "lambda"]),
    ("loglinear-mamba2", &["q", "k", "v", "g", "lambda"]),
    ("loglinear-gated-deltanet", &["q", "k", "v", "g", "beta", "lambda"]),
];

/// The sizes of a check: batch `b`, length `t`, 2 heads, `Dk = 5`, `Dv = 3`.
pub fn sizes(b: usize, t: usize) -> Sizes {
    Sizes { batch: b, seq: t, channels: 6, heads: 2, dk: 5, dv: 3 }
}

/// The mixer `name` with default options, and valid random inputs for it.
pub fn inputs(name: &str, sizes: &Sizes, seed: u64) -> (Box<dyn Mixer>, Tensors<f64>) {
    let m = ops::configured(name, &Options::default()).unwrap();
    let x = mixers::registry::grad_check::grad_inputs(m.as_ref(), sizes, seed).unwrap();
    (m, x)
}

/// An `f64` array as a candle tensor of `dtype` (values rounded once for `F32`).
pub fn tensor(a: &ArrayD<f64>, dtype: DType) -> Tensor {
    let t = Tensor::from_vec(a.iter().copied().collect::<Vec<_>>(), a.shape(), &Device::Cpu).unwrap();
    t.to_dtype(dtype).unwrap()
}

/// Every input as a candle variable of `dtype`.
pub fn vars(x: &Tensors<f64>, dtype: DType) -> BTreeMap<String, Var> {
    x.iter().map(|(k, a)| (k.clone(), Var::from_tensor(&tensor(a, dtype)).unwrap())).collect()
}

/// A candle tensor as a library array.
pub fn array<F: candle_core::WithDType>(t: &Tensor) -> ArrayD<F> {
    ArrayD::from_shape_vec(t.dims(), t.flatten_all().unwrap().to_vec1::<F>().unwrap()).unwrap()
}

/// The candle op of the typed mixer `name` on the named tensors.
pub fn candle_op(name: &str, t: &BTreeMap<String, Var>, opts: &Options) -> candle_core::Result<Tensor> {
    use mixers_candle::ops as c;
    let x = |n: &str| t[n].as_tensor();
    match name {
        "attention" => c::attention(x("q"), x("k"), x("v"), opts),
        "linear-attention" => c::linear_attention(x("q"), x("k"), x("v"), opts),
        "mamba2" => c::mamba2(x("q"), x("k"), x("v"), x("g"), opts),
        "gated-deltanet" => c::gated_deltanet(x("q"), x("k"), x("v"), x("g"), x("beta"), opts),
        "loglinear-attention" => c::loglinear_attention(x("q"), x("k"), x("v"), x("lambda"), opts),
        "loglinear-mamba2" => c::loglinear_mamba2(x("q"), x("k"), x("v"), x("g"), x("lambda"), opts),
        "loglinear-gated-deltanet" => {
            c::loglinear_gated_deltanet(x("q"), x("k"), x("v"), x("g"), x("beta"), x("lambda"), opts)
        }
        other => panic!("no typed candle op {other}"),
    }
}

/// `opts` with the CPU backend where it names none: what the candle ops do with CPU tensors,
/// while the typed API's default ([`mixers::registry::Backend::auto`]) is CUDA where a GPU is.
pub fn on_cpu(opts: &Options) -> Options {
    match opts.backend {
        Some(_) => opts.clone(),
        None => opts.clone().backend(mixers::registry::Backend::by_name("cpu").unwrap()),
    }
}

/// The typed API (`mixers::ops`) of the mixer `name` on the library's arrays, on the backend the
/// candle ops take for CPU tensors ([`on_cpu`]).
pub fn typed_api<F: ops::Scalar>(name: &str, x: &Tensors<F>, opts: &Options) -> ArrayD<F> {
    let opts = &on_cpu(opts);
    let a4 = |n: &str| x[n].view().into_dimensionality::<Ix4>().unwrap();
    let a3 = |n: &str| x[n].view().into_dimensionality::<Ix3>().unwrap();
    let y = match name {
        "attention" => ops::attention(a4("q"), a4("k"), a4("v"), opts),
        "linear-attention" => ops::linear_attention(a4("q"), a4("k"), a4("v"), opts),
        "mamba2" => ops::mamba2(a4("q"), a4("k"), a4("v"), a3("g"), opts),
        "gated-deltanet" => ops::gated_deltanet(a4("q"), a4("k"), a4("v"), a3("g"), a3("beta"), opts),
        "loglinear-attention" => ops::loglinear_attention(a4("q"), a4("k"), a4("v"), a4("lambda"), opts),
        "loglinear-mamba2" => ops::loglinear_mamba2(a4("q"), a4("k"), a4("v"), a3("g"), a4("lambda"), opts),
        "loglinear-gated-deltanet" => {
            ops::loglinear_gated_deltanet(a4("q"), a4("k"), a4("v"), a3("g"), a3("beta"), a4("lambda"), opts)
        }
        other => panic!("no typed API {other}"),
    };
    y.unwrap().into_dyn()
}

/// `x` converted to `f32`.
pub fn to_f32(x: &Tensors<f64>) -> Tensors<f32> {
    x.iter().map(|(k, a)| (k.clone(), a.mapv(|v| v as f32))).collect()
}
