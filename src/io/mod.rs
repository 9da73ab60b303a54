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

    /// Issue 14: a write failure (here ENOSPC from /dev/full) is reported with the system's
    /// reason, not lost in the zip writer's drop message.
    #[test]
    fn write_failures_keep_the_reason() {
        let full = std::path::Path::new("/dev/full");
        if !full.exists() {
            return;
        }
        let a = Tensor::F64(ArrayD::from_elem(ndarray::IxDyn(&[64, 64]), 1.0));
        let e = write_npz(full, &[("y", &a)]).unwrap_err().to_string();
        assert!(e.contains("/dev/full") && e.contains("No space left on device"), "{e}");
        let e =
            write_npz(std::path::Path::new("/nonexistent-dir/y.npz"), &[("y", &a)]).unwrap_err().to_string();
        assert!(e.contains("cannot write /nonexistent-dir/y.npz"), "{e}");
    }
}
