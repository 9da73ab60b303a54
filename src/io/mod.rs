//! `.npz` input/output with the names of MATH.md; `f32` and `f64` arrays.

mod read;
mod write;

pub use read::{MAX_HEADER_BYTES, read_npz, read_npz_from, read_npz_within};
pub use write::{write_npz, write_tensors};

#[cfg(test)]
mod tests {
    use super::*;
    use mixer_core::{AnyTensors, Tensor};
    use ndarray::ArrayD;

    #[test]
    fn npz_round_trip_keeps_dtype_and_values() {
        let dir = std::env::temp_dir().join(format!("mixers-io-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.npz");
        let a = Tensor::F32(ArrayD::from_shape_fn(ndarray::IxDyn(&[2, 3]), |i| (i[0] * 3 + i[1]) as f32));
        let b = Tensor::F32(ArrayD::from_elem(ndarray::IxDyn(&[4]), 0.5f32));
        write_npz(&p, &[("x", &a), ("alpha", &b)]).unwrap();
        match read_npz(&p).unwrap() {
            AnyTensors::F32(m) => {
                assert_eq!(Tensor::F32(m["x"].clone()), a);
                assert_eq!(m["alpha"].shape(), &[4]);
            }
            other => panic!("expected f32, got {:?}", other.dtype()),
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
