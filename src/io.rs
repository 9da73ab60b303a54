//! `.npz` input/output with the names of docs/math.md; `f32` and `f64` arrays.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use mixer_core::{AnyTensors, Error, Result, Tensor};
use ndarray::{ArrayD, OwnedRepr};
use ndarray_npy::{NpzReader, NpzWriter};

/// Reads every array of an `.npz` file (each `f32` or `f64`; all must share one dtype).
pub fn read_npz(path: &Path) -> Result<AnyTensors> {
    let file = File::open(path).map_err(|e| Error::Io(format!("cannot open {}: {e}", path.display())))?;
    let mut npz = NpzReader::new(file)
        .map_err(|e| Error::Io(format!("{} is not a readable .npz: {e}", path.display())))?;
    let names = npz.names().map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    let mut map = BTreeMap::new();
    for name in names {
        let t = match npz.by_name::<OwnedRepr<f64>, ndarray::IxDyn>(&name) {
            Ok(a) => Tensor::F64(a),
            Err(_) => match npz.by_name::<OwnedRepr<f32>, ndarray::IxDyn>(&name) {
                Ok(a) => Tensor::F32(a),
                Err(e) => {
                    return Err(Error::Io(format!(
                        "{}: array `{name}` is neither f32 nor f64 (little-endian, C or Fortran order): {e}",
                        path.display()
                    )));
                }
            },
        };
        map.insert(name, t);
    }
    AnyTensors::from_tensors(map)
}

/// Writes named arrays to an `.npz` file.
pub fn write_npz(path: &Path, arrays: &[(&str, &Tensor)]) -> Result<()> {
    let file = File::create(path).map_err(|e| Error::Io(format!("cannot create {}: {e}", path.display())))?;
    let mut npz = NpzWriter::new(file);
    for (name, t) in arrays {
        let r = match t {
            Tensor::F32(a) => npz.add_array(*name, a),
            Tensor::F64(a) => npz.add_array(*name, a),
        };
        r.map_err(|e| Error::Io(format!("{}: writing `{name}`: {e}", path.display())))?;
    }
    npz.finish().map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    Ok(())
}

/// Writes `f64` tensors to an `.npz` file (e.g. random inputs for `mixers run`).
pub fn write_tensors(path: &Path, tensors: &BTreeMap<String, ArrayD<f64>>) -> Result<()> {
    let owned: Vec<(String, Tensor)> =
        tensors.iter().map(|(k, v)| (k.clone(), Tensor::F64(v.clone()))).collect();
    let refs: Vec<(&str, &Tensor)> = owned.iter().map(|(k, v)| (k.as_str(), v)).collect();
    write_npz(path, &refs)
}

#[cfg(test)]
mod tests {
    use super::*;

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
