//! The recurrent form of the GLR (docs/math.md §1.1–1.2): one token per step, a bounded cache.
//!
//! Token `t` reads past values at its dependency positions `d_k(t)` (outputs `y` when `on`
//! includes `b`, inputs `x` when it includes `a`). What is kept after token `t`:
//! - cache-efficient pattern: exactly the lattice positions `P_{t+1} = {d_k(t+1)}`. By the
//!   lattice invariant `P_{t+1} ⊆ P_t ∪ {t}`, so the new cache is drawn from the
//!   old one plus token `t`, and everything else is evicted. Its size is `O(f⁻¹(T))`
//!   (pow2: `≤ ⌊log_2 T⌋ + 1` positions).
//! - translation-invariant pattern: the last `f(K−1)` tokens (a ring buffer), what the largest
//!   active offset needs.
//!
//! [`Decoder::cache_elems`] counts the scalars held: positions × streams (x and/or y) × B × C.

use mixer_core::mixer::Decoder;
use mixer_core::mixers::glr::state as glr_state;
use mixer_core::mixers::glr::{Glr, On, Slots};
use mixer_core::tensor::contiguous;
use mixer_core::{Dims, DimsExt, Error, Real, Result, Tensors};
use ndarray::{ArrayD, IxDyn};

enum Store<F> {
    /// Sorted by position; each value holds `streams × B × C` scalars.
    Lattice(Vec<(usize, Vec<F>)>),
    /// `cap` slots; position `p` lives in slot `p % cap`.
    Window { ring: Vec<F>, cap: usize },
}

/// The GLR decoder on CPU.
pub struct GlrDecoder<F> {
    on: On,
    slots: Slots,
    t_len: usize,
    b_len: usize,
    c_len: usize,
    /// The slot axis of the tokens' `beta` (`alpha` has one more): at least `K(T)`.
    k_in: usize,
    pos: usize,
    store: Store<F>,
    /// Whether the cache is kept after the last token (a decoder whose state is exported).
    keep_last: bool,
    glr: Glr,
}

impl<F: Real> GlrDecoder<F> {
    /// A decoder for sequences of length `T` with `B × C` channels (from `dims`).
    pub fn new(g: &Glr, dims: &Dims) -> Result<Self> {
        let (t_len, b_len, c_len) = (dims.size("T")?, dims.size("B")?, dims.size("C")?);
        let slots = g.slots(t_len);
        let k_in = glr_state::slot_count(dims).unwrap_or(0).max(slots.len());
        let streams = Self::streams_of(g.on());
        let store = if g.pattern().cache_efficient() {
            Store::Lattice(Vec::new())
        } else {
            let cap = slots.offsets().last().copied().unwrap_or(0);
            Store::Window { ring: vec![F::zero(); cap * streams * b_len * c_len], cap }
        };
        Ok(GlrDecoder {
            on: g.on(),
            slots,
            t_len,
            b_len,
            c_len,
            k_in,
            pos: 0,
            store,
            keep_last: false,
            glr: g.clone(),
        })
    }

    /// A decoder for `T` more tokens after the state `s` (docs/math.md §7.1; every batch row at
    /// the position `a`, checked): the state's values are its cache at their positions, it
    /// steps absolute positions `a … a + T − 1`, and it keeps its cache after the last token
    /// for [`Decoder::state`]. `None`: position 0, an empty cache.
    pub fn from_state(g: &Glr, dims: &Dims, s: Option<(&Tensors<F>, usize)>) -> Result<Self> {
        let mut d = Self::new(g, dims)?;
        d.keep_last = true;
        let a = s.map_or(0, |(_, a)| a);
        // Slots through position a + T: the cache after the last token is P_(a+T).
        d.slots = Slots::new(g.pattern(), a + d.t_len + 1);
        d.t_len += a;
        d.pos = a;
        let bc = d.b_len * d.c_len;
        let rows = glr_state::rows(g, d.k_in);
        let n = d.streams() * bc;
        if let Store::Window { ring, cap } = &mut d.store {
            *cap = rows;
            *ring = vec![F::zero(); rows * n];
        }
        let Some((s, _)) = s else { return Ok(d) };
        // A cached position holds y (pattern on B) first, then x (on A): the state's streams in
        // that order.
        let order: Vec<&str> = [(g.on().has_b(), "y"), (g.on().has_a(), "x")]
            .into_iter()
            .filter_map(|(has, n)| has.then_some(n))
            .collect();
        let vs =
            order.iter().map(|&n| contiguous(s, n, &[d.b_len, rows, d.c_len])).collect::<Result<Vec<_>>>()?;
        let mut entries: Vec<(usize, Vec<F>)> = Vec::new();
        for (j, at) in glr_state::kept(g, d.k_in, a).into_iter().enumerate() {
            let Some(p) = at else { continue };
            let entry: Vec<F> = vs
                .iter()
                .flat_map(|v| {
                    (0..d.b_len).flat_map(move |b| v[(b * rows + j) * d.c_len..][..d.c_len].to_vec())
                })
                .collect();
            entries.push((p, entry));
        }
        match &mut d.store {
            Store::Lattice(l) => {
                entries.sort_by_key(|e| e.0);
                *l = entries;
            }
            Store::Window { ring, cap } => {
                for (p, e) in entries {
                    ring[(p % *cap) * n..(p % *cap + 1) * n].copy_from_slice(&e);
                }
            }
        }
        Ok(d)
    }

    fn streams_of(on: On) -> usize {
        if on == On::Both { 2 } else { 1 }
    }

    fn streams(&self) -> usize {
        Self::streams_of(self.on)
    }

    /// Number of past positions held right now.
    pub fn cached_positions(&self) -> usize {
        match &self.store {
            Store::Lattice(v) => v.len(),
            Store::Window { cap, .. } if self.pos < self.t_len => self.pos.min(*cap),
            Store::Window { .. } => 0,
        }
    }

    /// The cached values of position `d` (`streams × B × C`: y first, then x).
    fn lookup(&self, d: usize) -> Result<&[F]> {
        let n = self.streams() * self.b_len * self.c_len;
        match &self.store {
            Store::Lattice(v) => {
                v.binary_search_by_key(&d, |e| e.0).map(|i| v[i].1.as_slice()).map_err(|_| {
                    Error::Decoder(format!("position {d} is not in the lattice cache at t = {}", self.pos))
                })
            }
            Store::Window { ring, cap } => {
                if *cap == 0 || d + cap < self.pos || d >= self.pos {
                    return Err(Error::Decoder(format!(
                        "position {d} is outside the window at t = {}",
                        self.pos
                    )));
                }
                Ok(&ring[(d % cap) * n..(d % cap + 1) * n])
            }
        }
    }
}

impl<F: Real> Decoder<F> for GlrDecoder<F> {
    fn step(&mut self, token: &Tensors<F>) -> Result<ArrayD<F>> {
        let t = self.pos;
        mixer_core::mixer::check_decoder_capacity(t, self.t_len)?;
        let (bn, cn, kn) = (self.b_len, self.c_len, self.k_in);
        let bc = bn * cn;
        let x = contiguous(token, "x", &[bn, cn])?;
        let alpha = if self.on.has_a() {
            contiguous(token, "alpha", &[bn, kn + 1, cn])?
        } else {
            contiguous(token, "alpha", &[bn, cn])?
        };
        let beta = if self.on.has_b() { Some(contiguous(token, "beta", &[bn, kn, cn])?) } else { None };
        let n = self.slots.active(t);
        let mut y = vec![F::zero(); bc];
        if self.on.has_a() {
            for b in 0..bn {
                for c in 0..cn {
                    y[b * cn + c] = alpha[b * (kn + 1) * cn + c] * x[b * cn + c];
                }
            }
        } else {
            for i in 0..bc {
                y[i] = alpha[i] * x[i];
            }
        }
        // Stream layout of a cached position: y (when on has b) first, then x (when on has a).
        let x_off = if self.on.has_b() { bc } else { 0 };
        for k in 0..n {
            let d = self.slots.pos(t, k);
            let past = self.lookup(d)?;
            for b in 0..bn {
                for c in 0..cn {
                    let i = b * cn + c;
                    let mut acc = y[i];
                    if self.on.has_a() {
                        acc += alpha[(b * (kn + 1) + k + 1) * cn + c] * past[x_off + i];
                    }
                    if let Some(beta) = &beta {
                        acc += beta[(b * kn + k) * cn + c] * past[i];
                    }
                    y[i] = acc;
                }
            }
        }
        let mut entry = Vec::with_capacity(self.streams() * bc);
        if self.on.has_b() {
            entry.extend_from_slice(&y);
        }
        if self.on.has_a() {
            entry.extend_from_slice(&x);
        }
        let slots = &self.slots;
        let last = t + 1 == self.t_len && !self.keep_last;
        match &mut self.store {
            // No later token reads anything: the cache empties (`Glr::decoder_cache`).
            Store::Lattice(v) if last => v.clear(),
            Store::Window { ring, .. } if last => ring.clear(),
            Store::Lattice(v) => {
                // Keep exactly P_{t+1} ⊆ P_t ∪ {t}.
                v.push((t, entry));
                let mut keep: Vec<usize> = slots.deps(t + 1).map(|(_, d)| d).collect();
                keep.sort_unstable();
                keep.dedup();
                v.retain(|e| keep.binary_search(&e.0).is_ok());
                if v.len() != keep.len() {
                    return Err(Error::Decoder(format!(
                        "lattice invariant broken at t = {t}: P_(t+1) = {keep:?}, cache holds {:?}",
                        v.iter().map(|e| e.0).collect::<Vec<_>>()
                    )));
                }
            }
            Store::Window { ring, cap } => {
                if *cap > 0 {
                    let m = entry.len();
                    ring[(t % *cap) * m..(t % *cap + 1) * m].copy_from_slice(&entry);
                }
            }
        }
        self.pos += 1;
        ArrayD::from_shape_vec(IxDyn(&[bn, cn]), y).map_err(|e| Error::Decoder(e.to_string()))
    }

    fn cache_elems(&self) -> usize {
        self.cached_positions() * self.streams() * self.b_len * self.c_len
    }

    fn position(&self) -> usize {
        self.pos
    }

    /// The cached values at the positions the next token and its successors read
    /// ([`glr_state::kept`]), and the position.
    fn state(&self) -> Result<Tensors<F>> {
        let (bn, cn) = (self.b_len, self.c_len);
        let bc = bn * cn;
        let rows = glr_state::rows(&self.glr, self.k_in);
        let mut out = Tensors::new();
        // A cached position holds y first (pattern on B), then x (on A).
        let offsets =
            [(self.on.has_b(), "y", 0), (self.on.has_a(), "x", if self.on.has_b() { bc } else { 0 })];
        for (_, name, off) in offsets.into_iter().filter(|e| e.0) {
            let mut v = ndarray::Array3::<F>::zeros((bn, rows, cn));
            for (j, at) in glr_state::kept(&self.glr, self.k_in, self.pos).into_iter().enumerate() {
                let Some(p) = at else { continue };
                let e = self.lookup(p)?;
                for b in 0..bn {
                    for c in 0..cn {
                        v[[b, j, c]] = e[off + b * cn + c];
                    }
                }
            }
            out.insert(name.to_string(), v.into_dyn());
        }
        out.insert(
            mixer_core::state::POSITION.to_string(),
            mixer_core::state::position_tensor(&vec![self.pos; bn]),
        );
        Ok(out)
    }
}
