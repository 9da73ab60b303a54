//! Reading `.npz` inputs with every member checked before anything is allocated from it.
//!
//! A member's `.npy` header declares a dtype and a shape. Before the data is read, the
//! declared size `∏ shape · itemsize` must equal the bytes the zip entry holds after its
//! header (its uncompressed size), and the declared sizes of all members together must fit
//! the memory budget ([`mixer_core::memory`]). So a small file whose header declares 10¹²
//! elements is an error, not an allocation. The dtype is read from the header and the member
//! is decoded as exactly that type, so errors name the declared dtype.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Cursor, Read, Seek};
use std::path::Path;

use mixer_core::memory::{Budget, check_against};
use mixer_core::{AnyTensors, Error, Result, Tensor};
use ndarray::ArrayD;
use ndarray_npy::ReadNpyExt;
use ndarray_npy::npy::header::Header;

/// Longest `.npy` header accepted, in bytes (NumPy writes 128 or a little more).
pub const MAX_HEADER_BYTES: usize = 1 << 20;

/// A member's declared scalar type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scalar {
    F32,
    F64,
}

/// The checked header of one member.
struct Member {
    name: String,
    index: usize,
    scalar: Scalar,
    bytes: u64,
}

fn err(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Io(format!("{}: {msg}", path.display()))
}

/// Reads the fixed part of a `.npy` header (magic, version, length) and returns it with the
/// header length, refusing lengths beyond [`MAX_HEADER_BYTES`] or the entry itself.
fn header_prefix(r: &mut impl Read, entry_size: u64) -> std::result::Result<(Vec<u8>, usize), String> {
    let mut pre = vec![0u8; 8];
    r.read_exact(&mut pre).map_err(|e| format!("too short for a .npy header ({e})"))?;
    if &pre[..6] != b"\x93NUMPY" {
        return Err("does not start with the .npy magic string \\x93NUMPY".into());
    }
    let len = match pre[6] {
        1 => {
            let mut b = [0u8; 2];
            r.read_exact(&mut b).map_err(|e| format!("truncated .npy header ({e})"))?;
            pre.extend_from_slice(&b);
            u16::from_le_bytes(b) as usize
        }
        2 | 3 => {
            let mut b = [0u8; 4];
            r.read_exact(&mut b).map_err(|e| format!("truncated .npy header ({e})"))?;
            pre.extend_from_slice(&b);
            u32::from_le_bytes(b) as usize
        }
        v => return Err(format!(".npy format version {v}.{} is not 1, 2 or 3", pre[7])),
    };
    if len > MAX_HEADER_BYTES || (pre.len() + len) as u64 > entry_size {
        return Err(format!(
            "its .npy header declares {len} bytes of header, but the member holds {entry_size} bytes in all \
             (at most {MAX_HEADER_BYTES} accepted)"
        ));
    }
    Ok((pre, len))
}

/// Parses and checks one member's header: dtype f32/f64, declared size equal to the data the
/// entry holds.
fn inspect(path: &Path, name: &str, entry: &mut impl Read, entry_size: u64) -> Result<(Scalar, u64)> {
    let (mut head, len) =
        header_prefix(entry, entry_size).map_err(|m| err(path, format!("array `{name}` {m}")))?;
    let start = head.len();
    head.resize(start + len, 0);
    entry
        .read_exact(&mut head[start..])
        .map_err(|e| err(path, format!("array `{name}`: truncated .npy header ({e})")))?;
    let header = Header::from_reader(&mut Cursor::new(&head))
        .map_err(|e| err(path, format!("array `{name}` has an unreadable .npy header: {e}")))?;
    let descr = header.type_descriptor.to_string();
    let descr = descr.trim_matches(|c| c == '\'' || c == '"');
    let scalar = match descr {
        "<f4" | "|f4" | ">f4" => Scalar::F32,
        "<f8" | "|f8" | ">f8" => Scalar::F64,
        other => {
            return Err(err(
                path,
                format!("array `{name}` has dtype `{other}`; expected float32 (`<f4`) or float64 (`<f8`)"),
            ));
        }
    };
    let item = if scalar == Scalar::F32 { 4u64 } else { 8 };
    let shape = &header.shape;
    let shape_str = mixer_core::error::fmt_shape(shape);
    let declared = shape.iter().try_fold(item, |acc, &d| acc.checked_mul(d as u64)).ok_or_else(|| {
        err(path, format!("array `{name}` declares shape {shape_str}, whose size overflows"))
    })?;
    let data = entry_size - head.len() as u64;
    if declared != data {
        return Err(err(
            path,
            format!(
                "array `{name}` declares {descr} shape {shape_str} ({declared} bytes of data), but the member \
                 holds {data} bytes after its header; the file is truncated or its header is wrong"
            ),
        ));
    }
    Ok((scalar, declared))
}

fn decode<R: Read + Seek>(path: &Path, zip: &mut zip::ZipArchive<R>, m: &Member) -> Result<Tensor> {
    let entry = zip.by_index(m.index).map_err(|e| err(path, format!("array `{}`: {e}", m.name)))?;
    let what = |e: ndarray_npy::ReadNpyError| {
        let dt = if m.scalar == Scalar::F32 { "f32" } else { "f64" };
        err(path, format!("array `{}` (declared {dt}) cannot be read: {e}", m.name))
    };
    Ok(match m.scalar {
        Scalar::F32 => Tensor::F32(ArrayD::<f32>::read_npy(entry).map_err(what)?),
        Scalar::F64 => Tensor::F64(ArrayD::<f64>::read_npy(entry).map_err(what)?),
    })
}

/// Reads every array of an `.npz` file (each `f32` or `f64`; all must share one dtype),
/// against the current memory budget.
pub fn read_npz(path: &Path) -> Result<AnyTensors> {
    read_npz_within(path, mixer_core::memory::budget()?.as_ref())
}

/// [`read_npz`] against an explicit budget (`None`: no limit beyond the consistency checks).
pub fn read_npz_within(path: &Path, budget: Option<&Budget>) -> Result<AnyTensors> {
    let file = File::open(path).map_err(|e| Error::Io(format!("cannot open {}: {e}", path.display())))?;
    read_npz_from(path, file, budget)
}

/// Reads an `.npz` from any seekable reader (`path` is only used in messages).
pub fn read_npz_from<R: Read + Seek>(path: &Path, reader: R, budget: Option<&Budget>) -> Result<AnyTensors> {
    let mut zip = zip::ZipArchive::new(reader)
        .map_err(|e| Error::Io(format!("{} is not a readable .npz (zip archive): {e}", path.display())))?;
    let mut members = Vec::new();
    for index in 0..zip.len() {
        let mut entry = zip.by_index(index).map_err(|e| err(path, e))?;
        if entry.is_dir() {
            continue;
        }
        let raw = entry.name().to_string();
        let name = raw.strip_suffix(".npy").unwrap_or(&raw).to_string();
        let size = entry.size();
        let (scalar, bytes) = inspect(path, &name, &mut entry, size)?;
        members.push(Member { name, index, scalar, bytes });
    }
    let total: u64 = members.iter().map(|m| m.bytes).sum();
    check_against(&format!("reading {}", path.display()), total as f64, budget)?;
    let mut map = BTreeMap::new();
    for m in &members {
        let t = decode(path, &mut zip, m)?;
        if map.insert(m.name.clone(), t).is_some() {
            return Err(err(path, format!("array `{}` appears twice", m.name)));
        }
    }
    AnyTensors::from_tensors(map)
}
