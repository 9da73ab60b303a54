//! The level states of the scalar-decay chunked form ([`super::ssd`]), stored with a pending
//! scalar decay.
//!
//! Level `e` holds `H^(e) = e^(ℓ_e) Z_e`: the stored matrix `Z_e` (`D_k × D_v`) and a log-scale
//! `ℓ_e ≤ 0` (in `f64`). A chunk transition `H^(e) ← e^(γ_{n−1}) H^(e)` only adds `γ_{n−1}` to
//! `ℓ_e`; a read `diag(w) Q H^(e)` folds `e^(ℓ_e)` into the row weights `w`. The stored matrix is
//! rescaled (`Z_e ← e^(ℓ_e) Z_e`, `ℓ_e ← 0`) only when `ℓ_e` falls below `−RESCALE`, so that
//! `e^(ℓ_e)` stays well inside `F`'s normal range, and at that rescaling entries that fall below
//! the smallest normal number are set to zero and a level left all zero is dropped
//! ([`scale_and_flush`]). Compared with scaling every state in every chunk this saves one pass
//! over each live state per chunk; the pending factor is formed once in `f64` instead of as a
//! product of per-chunk factors in `F`.
//!
//! The stored matrices are stacked vertically, level `e` in rows `e·D_k .. (e+1)·D_k` of one
//! `(levels·D_k) × D_v` matrix, so that a run of consecutive live levels is read by one matrix
//! product `[diag(w_a) Q | … | diag(w_b) Q] [Z_a; …; Z_b]` ([`LevelStates::live_runs`]). The
//! stack is kept row-major (as the columns of its transpose): faer's product with a row-major
//! right-hand side and a row-major output ran about 10 % faster at these sizes.

use faer::{Mat, MatMut, MatRef};

use super::chunked::scale_and_flush;
use crate::vmath::VecMath;

/// A pending log-scale below `−RESCALE` (`e^(−16) ≈ 1.1·10⁻⁷`) is applied to the stored state.
const RESCALE: f64 = 16.0;

/// The level states of one head; see the module documentation.
pub(crate) struct LevelStates<F> {
    /// `[Z_0; Z_1; …]ᵀ = [Z_0ᵀ | Z_1ᵀ | …]`, `D_v × (levels·D_k)`.
    zt: Mat<F>,
    /// `ℓ_e`.
    log_scale: Vec<f64>,
    /// Whether level `e` holds a state.
    live: Vec<bool>,
    dk: usize,
}

impl<F: VecMath> LevelStates<F> {
    /// `levels` empty levels of `D_k × D_v` states.
    pub fn new(levels: usize, dk: usize, dv: usize) -> Self {
        LevelStates {
            zt: Mat::zeros(dv, levels * dk),
            log_scale: vec![0.0; levels],
            live: vec![false; levels],
            dk,
        }
    }

    /// Loads `h` (`D_k × D_v`) as the state of level 0 (live, no pending scale): the initial
    /// state of a run from a state (docs/math.md §7).
    pub fn load0(&mut self, h: MatRef<'_, F>) {
        self.zt.as_mut().subcols_mut(0, self.dk).transpose_mut().copy_from(h);
        self.live[0] = true;
        self.log_scale[0] = 0.0;
    }

    /// The state `H^(0) = e^(ℓ_0) Z_0` of level 0 (`D_k × D_v`; zero when it is empty).
    pub fn value0(&self) -> Mat<F> {
        let z = self.zt.as_ref().subcols(0, self.dk).transpose();
        if self.live[0] { z * faer::Scale(self.scale(0)) } else { Mat::zeros(z.nrows(), z.ncols()) }
    }

    /// The number of levels.
    pub fn levels(&self) -> usize {
        self.live.len()
    }

    /// `e^(ℓ_e)`, the factor a read of level `e` applies to the stored matrix.
    pub fn scale(&self, e: usize) -> F {
        F::of(self.log_scale[e].exp())
    }

    /// The maximal runs `a..b` of consecutive live levels, increasing.
    pub fn live_runs(&self) -> Vec<std::ops::Range<usize>> {
        let mut runs = Vec::new();
        let mut e = 0;
        while e < self.live.len() {
            if !self.live[e] {
                e += 1;
                continue;
            }
            let a = e;
            while e < self.live.len() && self.live[e] {
                e += 1;
            }
            runs.push(a..e);
        }
        runs
    }

    /// The stored matrices of the levels `run`, stacked: `[Z_a; …; Z_{b−1}]`.
    pub fn stored(&self, run: std::ops::Range<usize>) -> MatRef<'_, F> {
        self.zt.as_ref().subcols(run.start * self.dk, run.len() * self.dk).transpose()
    }

    /// The transition through a chunk with total log-decay `last ≤ 0`: `ℓ_e += last` for every
    /// live level, then the rescaling of those below `−RESCALE` (module documentation).
    pub fn decay(&mut self, last: f64) {
        for e in 0..self.levels() {
            if self.live[e] {
                self.log_scale[e] += last;
                if self.log_scale[e] < -RESCALE {
                    self.rescale(e);
                }
            }
        }
    }

    /// `Z_e ← e^(ℓ_e) Z_e`, `ℓ_e ← 0`, entries below the smallest normal number set to zero and
    /// the level dropped when nothing is left.
    fn rescale(&mut self, e: usize) {
        let s = self.scale(e);
        let dk = self.dk;
        self.live[e] = scale_and_flush(self.zt.as_mut().subcols_mut(e * dk, dk), s);
        self.log_scale[e] = 0.0;
    }

    /// Level 0 with no pending scale, ready for a sum into it: the stored matrix and whether it
    /// holds a state (when not, its content is to be replaced). The level is live afterwards.
    pub fn level0_for_update(&mut self) -> (MatMut<'_, F>, bool) {
        if self.live[0] && self.log_scale[0] != 0.0 {
            self.rescale(0);
        }
        let was = self.live[0];
        self.live[0] = true;
        (self.zt.as_mut().subcols_mut(0, self.dk).transpose_mut(), was)
    }

    /// The chunk-granular Fenwick merge before chunk `i ≥ 1` with `ctz(i) = mz`: the states of
    /// levels `0..=mz` are added into level `mz + 1` and emptied. The sum is stored with the
    /// largest log-scale of its terms, the others scaled down to it.
    pub fn merge(&mut self, mz: usize) {
        let (dst, dk) = (mz + 1, self.dk);
        let terms: Vec<usize> = (0..=dst).filter(|&e| self.live[e]).collect();
        if terms.iter().all(|&e| e == dst) {
            return;
        }
        let top = terms.iter().map(|&e| self.log_scale[e]).fold(f64::NEG_INFINITY, f64::max);
        let factor = |l: f64| F::of((l - top).exp());
        let dst_factor = self.live[dst].then(|| factor(self.log_scale[dst]));
        let src: Vec<(usize, F)> =
            terms.iter().filter(|&&e| e != dst).map(|&e| (e, factor(self.log_scale[e]))).collect();
        let unit = "unit row stride";
        let (lo, mut hi) = self.zt.as_mut().split_at_col_mut(dst * dk);
        let lo = lo.as_ref();
        for j in 0..dk {
            let out = hi.as_mut().col_mut(j).try_as_col_major_mut().expect(unit).as_slice_mut();
            let col = |e: usize| lo.col(e * dk + j).try_as_col_major().expect(unit).as_slice();
            // Without a state at `dst`, the first term is written rather than added.
            let added = match dst_factor {
                None => {
                    let (e, s) = src[0];
                    out.iter_mut().zip(col(e)).for_each(|(x, &v)| *x = s * v);
                    &src[1..]
                }
                Some(s) => {
                    if s != F::one() {
                        out.iter_mut().for_each(|x| *x *= s);
                    }
                    &src[..]
                }
            };
            for &(e, s) in added {
                out.iter_mut().zip(col(e)).for_each(|(x, &v)| *x += s * v);
            }
        }
        for e in 0..dst {
            self.live[e] = false;
            self.log_scale[e] = 0.0;
        }
        self.live[dst] = true;
        self.log_scale[dst] = top;
    }
}

#[cfg(test)]
mod tests {
    use super::LevelStates;
    use faer::Mat;

    /// The state of level `e` as the module defines it, `e^(ℓ_e) Z_e` (zero when not live).
    fn value(s: &LevelStates<f64>, e: usize) -> Mat<f64> {
        let (dk, dv) = (s.dk, s.zt.nrows());
        let f = if s.live[e] { s.log_scale[e].exp() } else { 0.0 };
        Mat::from_fn(dk, dv, |i, j| f * s.zt[(j, e * dk + i)])
    }

    fn put(s: &mut LevelStates<f64>, e: usize, seed: usize) {
        let (dk, dv) = (s.dk, s.zt.nrows());
        for i in 0..dk {
            for j in 0..dv {
                s.zt[(j, e * dk + i)] = ((seed * 31 + i * 7 + j * 3) % 13) as f64 - 6.0;
            }
        }
        s.live[e] = true;
        s.log_scale[e] = 0.0;
    }

    /// Decays, rescalings and merges against the same operations on explicit matrices: the
    /// values `e^(ℓ_e) Z_e` follow `H ← e^(γ) H` and the Fenwick merge, the pending scale stays
    /// within `[−16, 0]` after each transition, and a level decayed to nothing is dropped.
    #[test]
    fn lazy_scaling_and_merges_follow_the_explicit_states() {
        let (dk, dv, levels) = (5usize, 3usize, 5usize);
        let mut s = LevelStates::<f64>::new(levels, dk, dv);
        let mut want: Vec<Mat<f64>> = vec![Mat::zeros(dk, dv); levels];
        let decays = [-0.3, -7.5, -0.01, -12.0, -2.5, -0.0, -9.0, -1e4, -4.0, -3.0, -0.7];
        for (ci, &g) in decays.iter().enumerate() {
            if ci >= 1 {
                let mz = ci.trailing_zeros() as usize;
                s.merge(mz);
                let sum = (0..=mz).fold(want[mz + 1].clone(), |acc, e| acc + &want[e]);
                want[mz + 1] = sum;
                (0..=mz).for_each(|e| want[e] = Mat::zeros(dk, dv));
            }
            for e in 0..levels {
                let got = value(&s, e);
                let scale = want[e].norm_max().max(1e-300);
                assert!((&got - &want[e]).norm_max() <= 1e-12 * scale, "chunk {ci} level {e}");
            }
            s.decay(g);
            want.iter_mut().for_each(|w| *w *= faer::Scale(g.exp()));
            assert!(s.log_scale.iter().all(|&l| (-16.0..=0.0).contains(&l)), "{:?}", s.log_scale);
            let (mut z0, was) = s.level0_for_update();
            assert!(!was, "level 0 is merged away before every chunk");
            z0.fill(0.0);
            put(&mut s, 0, ci);
            want[0] = value(&s, 0);
        }
        let mut t = LevelStates::<f64>::new(2, dk, dv);
        put(&mut t, 1, 4);
        t.decay(-1e4);
        assert!(!t.live[1]);
        assert_eq!(t.live_runs(), Vec::<std::ops::Range<usize>>::new());
    }

    #[test]
    fn live_runs_are_the_maximal_blocks() {
        let mut s = LevelStates::<f32>::new(7, 2, 2);
        for e in [0, 1, 3, 5, 6] {
            s.live[e] = true;
        }
        assert_eq!(s.live_runs(), vec![0..2, 3..4, 5..7]);
        assert_eq!(s.stored(3..4).nrows(), 2);
    }
}
