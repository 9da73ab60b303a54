//! Writing `.npz` outputs: the archive is built in memory and written with one call, so a
//! failure (a full disk, a missing folder) is reported with the system's reason and leaves
//! no partial file behind.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::Path;

use mixer_core::{Error, Result, Tensor};
use ndarray::ArrayD;
use ndarray_npy::NpzWriter;

/// Writes named arrays to an `.npz` file.
pub fn write_npz(path: &Path, arrays: &[(&str, &Tensor)]) -> Result<()> {
    let mut npz = NpzWriter::new(Cursor::new(Vec::new()));
    for (name, t) in arrays {
        let r = match t {
            Tensor::F32(a) => npz.add_array(*name, a),
            Tensor::F64(a) => npz.add_array(*name, a),
        };
        r.map_err(|e| Error::Io(format!("{}: encoding `{name}`: {e}", path.display())))?;
    }
    let bytes = npz.finish().map_err(|e| Error::Io(format!("{}: {e}", path.display())))?.into_inner();
    if let Err(e) = std::fs::write(path, &bytes) {
        // A partly written regular file would read as a corrupt archive later (devices and
        // other special files are left alone).
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file()) {
            std::fs::remove_file(path).ok();
        }
        return Err(Error::Io(format!("cannot write {} ({} bytes): {e}", path.display(), bytes.len())));
    }
    Ok(())
}

/// Writes `f64` tensors to an `.npz` file (e.g. random inputs for `mixers run`).
pub fn write_tensors(path: &Path, tensors: &BTreeMap<String, ArrayD<f64>>) -> Result<()> {
    let owned: Vec<(String, Tensor)> =
        tensors.iter().map(|(k, v)| (k.clone(), Tensor::F64(v.clone()))).collect();
    let refs: Vec<(&str, &Tensor)> = owned.iter().map(|(k, v)| (k.as_str(), v)).collect();
    write_npz(path, &refs)
}
