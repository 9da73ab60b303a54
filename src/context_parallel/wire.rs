//! [`Communicator::all_gather`](super::Communicator::all_gather) over a transport that gathers
//! equal-length `f64` buffers (NCCL's `ncclAllGather`): each rank's contribution — its named
//! tensors, or its error — is written as one flat vector, the ranks gather the vectors' lengths,
//! then the vectors padded to the longest, and each rank reads every rank's back.
//!
//! The layout of a contribution (every number an `f64`; counts, sizes and bytes are integers
//! far below 2⁵³, so they are exact):
//! - tensors: `0, n`, then per tensor (in name order) `len(name), name's bytes…, ndim, dims…,
//!   values…` (row-major);
//! - an error: `1, len(message), message's bytes…`.

use mixer_core::{Error, Result, Tensors};
use ndarray::{ArrayD, IxDyn};

use super::comm::failed_on;

/// A contribution as one flat vector (module documentation).
pub fn encode(mine: &Result<Tensors<f64>>) -> Vec<f64> {
    let bytes = |out: &mut Vec<f64>, s: &str| {
        out.push(s.len() as f64);
        out.extend(s.bytes().map(f64::from));
    };
    let mut out = Vec::new();
    match mine {
        Ok(t) => {
            out.extend([0.0, t.len() as f64]);
            for (name, a) in t {
                bytes(&mut out, name);
                out.push(a.ndim() as f64);
                out.extend(a.shape().iter().map(|&d| d as f64));
                out.extend(a.iter().copied());
            }
        }
        Err(e) => {
            out.push(1.0);
            bytes(&mut out, &e.to_string());
        }
    }
    out
}

/// Reads a flat vector back in order, with an error for anything [`encode`] does not write.
struct Reader<'a> {
    buf: &'a [f64],
    at: usize,
}

impl Reader<'_> {
    fn malformed(&self) -> Error {
        Error::Io(format!(
            "context parallel: internal: a gathered contribution is malformed at element {} of {}",
            self.at,
            self.buf.len()
        ))
    }

    fn take(&mut self, n: usize) -> Result<&[f64]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| self.malformed())?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    /// A count or size: a non-negative integer.
    fn count(&mut self) -> Result<usize> {
        let v = self.take(1)?[0];
        if (0.0..9.0e15).contains(&v) && v.fract() == 0.0 {
            Ok(v as usize)
        } else {
            self.at -= 1;
            Err(self.malformed())
        }
    }

    fn text(&mut self) -> Result<String> {
        let n = self.count()?;
        let at = self.at;
        let bytes: Option<Vec<u8>> = self
            .take(n)?
            .iter()
            .map(|&b| ((0.0..256.0).contains(&b) && b.fract() == 0.0).then_some(b as u8))
            .collect();
        bytes.and_then(|b| String::from_utf8(b).ok()).ok_or_else(|| {
            self.at = at;
            self.malformed()
        })
    }
}

/// A contribution from its flat vector: the tensors, or the rank's error message.
pub fn decode(buf: &[f64]) -> Result<std::result::Result<Tensors<f64>, String>> {
    let mut r = Reader { buf, at: 0 };
    match r.count()? {
        0 => {
            let n = r.count()?;
            let mut out = Tensors::new();
            for _ in 0..n {
                let name = r.text()?;
                let ndim = r.count()?;
                let shape = (0..ndim).map(|_| r.count()).collect::<Result<Vec<_>>>()?;
                let len =
                    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| r.malformed())?;
                let values = r.take(len)?.to_vec();
                let a = ArrayD::from_shape_vec(IxDyn(&shape), values).map_err(|_| r.malformed())?;
                out.insert(name, a);
            }
            Ok(Ok(out))
        }
        1 => Ok(Err(r.text()?)),
        _ => {
            r.at = 0;
            Err(r.malformed())
        }
    }
}

/// Every rank's `mine`, in rank order, through `gather` (which returns every rank's equal-length
/// buffer, concatenated in rank order), with [`Communicator::all_gather`]'s contract: a rank's
/// error reaches every rank as an error naming it.
///
/// [`Communicator::all_gather`]: super::Communicator::all_gather
pub fn all_gather(
    size: usize,
    mine: Result<Tensors<f64>>,
    gather: impl Fn(&[f64]) -> Result<Vec<f64>>,
) -> Result<Vec<Tensors<f64>>> {
    let mut buf = encode(&mine);
    let lens = gather(&[buf.len() as f64])?;
    let lens: Vec<usize> = lens.iter().map(|&l| l as usize).collect();
    if lens.len() != size {
        return Err(Error::Io(format!(
            "context parallel: internal: {} lengths gathered from {size} ranks",
            lens.len()
        )));
    }
    let longest = lens.iter().copied().max().unwrap_or(0);
    buf.resize(longest, 0.0);
    let all = gather(&buf)?;
    if all.len() != size * longest {
        return Err(Error::Io(format!(
            "context parallel: internal: {} values gathered, {size} ranks of {longest} expected",
            all.len()
        )));
    }
    let mut out = Vec::with_capacity(size);
    for (rank, &len) in lens.iter().enumerate() {
        match decode(&all[rank * longest..rank * longest + len])? {
            Ok(t) => out.push(t),
            Err(e) => return Err(failed_on(rank, &e)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier, Mutex};

    use super::*;

    fn sample(seed: f64) -> Tensors<f64> {
        [
            (
                "L".to_string(),
                ArrayD::from_shape_fn(IxDyn(&[2, 3, 1]), |i| seed + (i[0] * 3 + i[1]) as f64 * 0.1),
            ),
            ("tr".to_string(), ArrayD::from_elem(IxDyn(&[0, 4]), 0.0)),
            ("pos".to_string(), ArrayD::from_elem(IxDyn(&[]), -1.5e-300)),
            ("é ünïcode".to_string(), ArrayD::from_shape_vec(IxDyn(&[2]), vec![f64::MAX, -0.0]).unwrap()),
        ]
        .into_iter()
        .collect()
    }

    #[test]
    fn contributions_round_trip() {
        let t = sample(3.25);
        assert_eq!(decode(&encode(&Ok(t.clone()))).unwrap(), Ok(t));
        assert_eq!(decode(&encode(&Ok(Tensors::new()))).unwrap(), Ok(Tensors::new()));
        let e = Error::Io("a rank's part failed".into());
        assert_eq!(decode(&encode(&Err(e.clone()))).unwrap(), Err(e.to_string()));
    }

    #[test]
    fn malformed_buffers_are_errors() {
        let good = encode(&Ok(sample(1.0)));
        for bad in [&good[..good.len() - 1], &[2.0][..], &[0.0, 1.0, 300.0][..], &[0.0, 0.5][..], &[][..]] {
            let e = decode(bad).unwrap_err().to_string();
            assert!(e.contains("malformed"), "{e}");
        }
    }

    /// Ranks as threads over a gather of equal-length buffers (what NCCL provides): the
    /// contributions of different lengths come back in rank order; one rank's error fails every
    /// rank, naming it; a buffer of the wrong length is refused.
    #[test]
    fn threads_gather_through_flat_buffers() {
        let n = 3;
        let run = |fail: Option<usize>| -> Vec<Result<Vec<Tensors<f64>>>> {
            let slots = Arc::new(Mutex::new(vec![Vec::<f64>::new(); n]));
            let barrier = Arc::new(Barrier::new(n));
            let handles: Vec<_> = (0..n)
                .map(|rank| {
                    let (slots, barrier) = (slots.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        let gather = |mine: &[f64]| -> Result<Vec<f64>> {
                            slots.lock().unwrap()[rank] = mine.to_vec();
                            barrier.wait();
                            let all = slots.lock().unwrap().concat();
                            barrier.wait();
                            Ok(all)
                        };
                        let mut mine = sample(rank as f64);
                        mine.retain(|k, _| rank != 1 || k == "L");
                        let mine = if fail == Some(rank) {
                            Err(Error::Io(format!("boom on {rank}")))
                        } else {
                            Ok(mine)
                        };
                        all_gather(n, mine, gather)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        };
        for got in run(None) {
            let got = got.unwrap();
            assert_eq!(got.len(), n);
            for (rank, t) in got.iter().enumerate() {
                let mut want = sample(rank as f64);
                want.retain(|k, _| rank != 1 || k == "L");
                assert_eq!(t, &want, "rank {rank}");
            }
        }
        for got in run(Some(2)) {
            let e = got.unwrap_err().to_string();
            assert!(e.contains("rank 2 failed") && e.contains("boom on 2"), "{e}");
        }
        let e = all_gather(2, Ok(sample(0.0)), |b| Ok(b.to_vec())).unwrap_err().to_string();
        assert!(e.contains("1 lengths gathered from 2 ranks"), "{e}");
    }
}
