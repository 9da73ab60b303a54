//! Several named tensors laid end to end in one flat buffer: how the ops pass any number of
//! inputs through candle's one-argument custom op, and `y` with a final state through its one
//! output.
//!
//! A [`Packing`] is the list of `(name, shape)` in buffer order; part `i` occupies the
//! elements `[o_i, o_i + n_i)` with `o_i = Σ_{j<i} n_j` and `n_i` the product of its shape,
//! row-major. The candle side packs with `cat` of the flattened tensors and unpacks with
//! `narrow` + `reshape`, whose backward passes candle already has: the cotangent of a packed
//! buffer is the cotangents of its parts packed the same way.

use std::collections::BTreeMap;
use std::ops::Range;

use candle_core::Tensor;
use mixer_core::Tensors;
use ndarray::{ArrayD, IxDyn};

use crate::error::Error;

/// Names and shapes of the parts of a flat buffer, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Packing {
    parts: Vec<(String, Vec<usize>)>,
}

impl Packing {
    /// A packing of these parts, in this order.
    pub fn new(parts: Vec<(String, Vec<usize>)>) -> Self {
        Packing { parts }
    }

    /// The parts, in buffer order.
    pub fn parts(&self) -> &[(String, Vec<usize>)] {
        &self.parts
    }

    /// Total number of elements.
    pub fn len(&self) -> usize {
        self.parts.iter().map(|(_, s)| s.iter().product::<usize>()).sum()
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each part's name, shape and element range in the buffer.
    pub(crate) fn ranges(&self) -> impl Iterator<Item = (&str, &[usize], Range<usize>)> {
        let mut at = 0;
        self.parts.iter().map(move |(n, s)| {
            let len: usize = s.iter().product();
            at += len;
            (n.as_str(), s.as_slice(), at - len..at)
        })
    }

    /// The parts of `flat` as owned row-major arrays (one copy), keyed by name.
    pub fn unpack<F: Clone>(&self, op: &str, flat: &[F]) -> Result<Tensors<F>, Error> {
        self.check_len(op, flat.len())?;
        self.ranges()
            .map(|(n, s, r)| {
                let a = ArrayD::from_shape_vec(IxDyn(s), flat[r].to_vec()).map_err(|e| Error::Packing {
                    op: op.into(),
                    expected: format!("part `{n}` of shape {s:?}"),
                    got: e.to_string(),
                })?;
                Ok((n.to_string(), a))
            })
            .collect()
    }

    /// Appends the tensors named by the parts to `out`, in order, row-major; each must be
    /// present with its part's shape.
    pub fn pack_into<F: Copy>(&self, op: &str, tensors: &Tensors<F>, out: &mut Vec<F>) -> Result<(), Error> {
        for (n, s, _) in self.ranges() {
            let a = part(op, tensors, n, s, |a| a.shape())?;
            out.extend(a.as_standard_layout().iter().copied());
        }
        Ok(())
    }

    /// The tensors named by the parts, taken out of `tensors` in the parts' order, each checked
    /// to be present with its part's shape (as [`Packing::pack_into`] checks them).
    pub fn take<F>(&self, op: &str, mut tensors: Tensors<F>) -> Result<Vec<ArrayD<F>>, Error> {
        self.parts
            .iter()
            .map(|(n, s)| {
                part(op, &tensors, n, s, |a| a.shape())?;
                tensors.remove(n).ok_or_else(|| Error::Packing {
                    op: op.into(),
                    expected: format!("a tensor `{n}`"),
                    got: "none (internal: it was just found)".into(),
                })
            })
            .collect()
    }

    /// The tensors named by the parts, taken, as one flat row-major buffer. A packing of one
    /// part whose array is row-major already hands its memory over without a copy.
    pub fn pack<F: Copy>(&self, op: &str, tensors: Tensors<F>) -> Result<Vec<F>, Error> {
        if self.parts.len() == 1 {
            return Ok(self.take(op, tensors)?.into_iter().next().map(into_flat).unwrap_or_default());
        }
        let mut out = Vec::with_capacity(self.len());
        self.pack_into(op, &tensors, &mut out)?;
        Ok(out)
    }

    /// One flat candle tensor of `tensors` (in the parts' order; a differentiable `cat`).
    pub fn pack_tensors(tensors: &[&Tensor]) -> candle_core::Result<Tensor> {
        let flat = tensors.iter().map(|t| t.flatten_all()).collect::<candle_core::Result<Vec<_>>>()?;
        Tensor::cat(&flat, 0)
    }

    /// The parts of the flat candle tensor `flat` in order, each reshaped (differentiable
    /// `narrow` + `reshape`).
    pub fn unpack_tensor(&self, flat: &Tensor) -> candle_core::Result<Vec<Tensor>> {
        self.ranges().map(|(_, s, r)| flat.narrow(0, r.start, r.len())?.reshape(s)).collect()
    }

    fn check_len(&self, op: &str, got: usize) -> Result<(), Error> {
        if got == self.len() {
            return Ok(());
        }
        Err(Error::Packing {
            op: op.into(),
            expected: format!("{} elements ({:?})", self.len(), self.parts),
            got: format!("{got}"),
        })
    }
}

/// The elements of `a` in row-major order, moved out of it where they already lie so.
pub(crate) fn into_flat<F: Copy>(a: ArrayD<F>) -> Vec<F> {
    if !a.is_standard_layout() {
        return a.iter().copied().collect();
    }
    let n = a.len();
    match a.into_raw_vec_and_offset() {
        (v, Some(0) | None) if v.len() == n => v,
        (v, off) => {
            let at = off.unwrap_or(0);
            v[at..at + n].to_vec()
        }
    }
}

/// The tensor of the part `name` in `tensors`, checked to have the part's shape `shape`
/// (`shape_of` reads a tensor's).
pub(crate) fn part<'a, T>(
    op: &str,
    tensors: &'a BTreeMap<String, T>,
    name: &str,
    shape: &[usize],
    shape_of: impl Fn(&T) -> &[usize],
) -> Result<&'a T, Error> {
    let t = tensors.get(name).ok_or_else(|| Error::Packing {
        op: op.into(),
        expected: format!("a tensor `{name}`"),
        got: format!("only {:?}", tensors.keys().collect::<Vec<_>>()),
    })?;
    if shape_of(t) != shape {
        return Err(Error::Packing {
            op: op.into(),
            expected: format!("`{name}` of shape {shape:?}"),
            got: format!("shape {:?}", shape_of(t)),
        });
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpack_inverts_pack_and_checks_lengths() {
        let p = Packing::new(vec![("a".into(), vec![2, 3]), ("b".into(), vec![1]), ("c".into(), vec![0, 4])]);
        assert_eq!(p.len(), 7);
        let flat: Vec<f64> = (0..7).map(|i| i as f64 * 0.5).collect();
        let t = p.unpack("t", &flat).unwrap();
        assert_eq!(t["a"][[1, 2]], 2.5);
        assert_eq!(t["b"][[0]], 3.0);
        assert_eq!(t["c"].shape(), &[0, 4]);
        let mut back = Vec::new();
        p.pack_into("t", &t, &mut back).unwrap();
        assert_eq!(back, flat);
        let e = p.unpack("t", &flat[..6]).unwrap_err().to_string();
        assert!(e.contains("expected 7 elements") && e.contains("got 6"), "{e}");
        let mut wrong = t.clone();
        wrong.insert("b".into(), ArrayD::zeros(IxDyn(&[2])));
        let e = p.pack_into("t", &wrong, &mut Vec::new()).unwrap_err().to_string();
        assert!(e.contains("`b` of shape [1]") && e.contains("shape [2]"), "{e}");
    }

    #[test]
    fn pack_takes_a_single_row_major_part_without_a_copy() {
        let a = ArrayD::from_shape_vec(IxDyn(&[2, 3]), (0..6).map(f64::from).collect()).unwrap();
        let at = a.as_ptr();
        let one = Packing::new(vec![("y".into(), vec![2, 3])]);
        let v = one.pack("t", Tensors::from([("y".to_string(), a.clone())])).unwrap();
        assert_eq!(v, (0..6).map(f64::from).collect::<Vec<_>>());
        let moved = one.pack("t", Tensors::from([("y".to_string(), a)])).unwrap();
        assert_eq!(moved.as_ptr(), at, "a row-major single part is handed over, not copied");
        // A transposed (column-major) array and a sliced one come out row-major.
        let t = ArrayD::from_shape_vec(IxDyn(&[3, 2]), vec![0., 3., 1., 4., 2., 5.]).unwrap();
        let tt = t.t().to_owned();
        let v =
            Packing::new(vec![("y".into(), vec![2, 3])]).pack("t", Tensors::from([("y".to_string(), tt)]));
        assert_eq!(v.unwrap(), vec![0., 1., 2., 3., 4., 5.]);
        let mut s = ArrayD::from_shape_vec(IxDyn(&[4]), vec![9., 1., 2., 3.]).unwrap();
        s.slice_collapse(ndarray::s![1..]);
        assert_eq!(into_flat(s), vec![1., 2., 3.]);
        let e =
            one.pack("t", Tensors::from([("y".to_string(), ArrayD::<f64>::zeros(IxDyn(&[3])))])).unwrap_err();
        assert!(e.to_string().contains("`y` of shape [2, 3]"), "{e}");
        let two = Packing::new(vec![("a".into(), vec![1]), ("b".into(), vec![2])]);
        let parts = Tensors::from([
            ("a".to_string(), ArrayD::from_elem(IxDyn(&[1]), 1.0)),
            ("b".to_string(), ArrayD::from_elem(IxDyn(&[2]), 2.0)),
        ]);
        assert_eq!(two.pack("t", parts).unwrap(), vec![1.0, 2.0, 2.0]);
    }

    #[test]
    fn candle_pack_and_unpack_round_trip() {
        let dev = candle_core::Device::Cpu;
        let a = Tensor::arange(0f32, 6., &dev).unwrap().reshape((2, 3)).unwrap();
        let b = Tensor::new(&[7f32, 8.], &dev).unwrap();
        let flat = Packing::pack_tensors(&[&a.t().unwrap(), &b]).unwrap();
        assert_eq!(flat.to_vec1::<f32>().unwrap(), vec![0., 3., 1., 4., 2., 5., 7., 8.]);
        let p = Packing::new(vec![("at".into(), vec![3, 2]), ("b".into(), vec![2])]);
        let parts = p.unpack_tensor(&flat).unwrap();
        assert_eq!(parts[0].to_vec2::<f32>().unwrap(), a.t().unwrap().to_vec2::<f32>().unwrap());
        assert_eq!(parts[1].to_vec1::<f32>().unwrap(), vec![7., 8.]);
    }
}
