//! The fused tile kernel of the attention fast form: `f32`, `1 ≤ Dv ≤ 64`, on CPUs with
//! AVX-512 (checked at run time; elsewhere the faer-tiled path of [`super::fast`] runs).
//!
//! Keys are the lanes. Per head the keys are packed once (from `[B,T,H,D]` or `[B,H,T,D]`),
//! transposed in blocks of [`KB`] = 64 keys (`Kᵀ_j [Dk, 64]`, four registers per row), and
//! the values padded to 64 columns and to whole key blocks (zeros). A query block is cut into micro-tiles of
//! [`MR`] = 6 queries; for every key block `j` that the micro-tile sees (causal, window) the
//! kernel keeps in 24 registers the scores `u = sign(σ)·q_t·k_s` of 6 queries × 64 keys
//! (`Dk` broadcast-FMA steps), masks the keys outside `[first(t), t]` (only on blocks that
//! cross the diagonal or the window's edge), and runs the online softmax in the base-2
//! domain, `c = |σ|·log₂e`, with a running maximum `m` that is raised only when it must be:
//! while every score of the block has `c·u_s ≤ c·m + τ` (`τ` = [`TAU`] = 8) the maximum stays,
//! and `p_s = 2^{c·u_s − c·m}` (at most `2^τ`), `ℓ' = ℓ + Σₛ p_s`, `o' = o + Σₛ p_s v_s`;
//! otherwise (for any of the six rows) every row takes `m' = max(m, maxₛ u_s)` and
//! `p_s = 2^{c·u_s − c·m'}`, `ℓ' = 2^{c(m − m')} ℓ + Σₛ p_s`, `o' = 2^{c(m − m')} o + Σₛ p_s v_s`.
//! Any `m` gives the same `o/ℓ` and `|σ|·m + ln ℓ`; the rule spares most blocks the row
//! reductions, the rescaling `exp2` and the multiplications of `o` (the check is one compare
//! per row against the rows' lane-wise maxima). `o` is 6 queries × `Dv` outputs held in
//! registers across the keys of the block (the weights go through a 1.5 KiB stack buffer, no
//! faer call, no score matrix); the row maxima, when needed, are formed in registers (every
//! lane holds the row's maximum), the six rescaling factors by one `exp2`, and `ℓ` is kept as
//! 16 partial sums per row (summed in `f64` at the end). At the end `y_t = o/ℓ` and
//! `LSE_t = |σ|·m + ln ℓ`.
//! Within a query block the key blocks are the outer loop, so the 32 KiB of one key block's
//! `Kᵀ` and `V` serve all 16 micro-tiles while in cache.
//!
//! `2^x` ([`exp2`]): `n = round(x)`, `f = x − n ∈ [−½, ½]`, `2^f` by a degree-6 polynomial
//! (a relative-error least-squares fit on Chebyshev nodes; relative error below 1e-7 in
//! `f32`), times `2ⁿ` by `vscalefps`; arguments are clamped at −200 so that masked keys
//! (`−∞`) weigh exactly 0 (only on blocks with masked keys; elsewhere every argument is
//! finite).
//!
//! Range: the caller takes this path only where `|c|·Dk·max|q|·max|k|` stays far below
//! `f32::MAX` (so no score, no `c·u` and no `c·m` overflows) and where `2^τ·T·max|v|` does
//! ([`sums_fit`]: `ℓ` and `o` stay finite); otherwise the faer-tiled path with its exact
//! fallback runs.

// Elsewhere than on x86-64 the kernel is not built and [`query_block`] declines every block,
// so the tile's argument types are never read.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use mixer_core::mixers::attention::Attention;
use mixer_core::parallel::min_len;
use rayon::prelude::*;

/// Keys per block: the lanes of four AVX-512 registers.
pub const KB: usize = 64;
/// Queries per micro-tile: 6 × 4 score registers, then 6 × 4 output registers.
pub const MR: usize = 6;
/// Queries per block (the unit of the parallel tasks): 16 micro-tiles.
pub const QB: usize = 96;
/// How far (in the base-2 exponent) a key block's row maximum may exceed the running maximum
/// before the running maximum is raised: weights stay `≤ 2^TAU`, and most blocks skip the
/// rescaling of `ℓ` and `o`.
const TAU: f32 = 8.0;

/// Whether the kernel's sums stay finite for `T` keys: `ℓ ≤ 2^TAU·T` and
/// `|o| ≤ 2^TAU·T·max|v|` must stay below `f32::MAX` (by a factor 2 for rounding); the
/// scores' range is the caller's check.
pub fn sums_fit(pk: &Packed, tn: usize) -> bool {
    (tn as f64) * (TAU as f64).exp2() * (pk.vmax as f64).max(1.0) * 2.0 < f32::MAX as f64
}

/// Whether this CPU runs the kernel, for values of width `dv`.
pub fn available(dv: usize) -> bool {
    (1..=KB).contains(&dv) && has_avx512()
}

fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Every head's keys transposed per key block, `[BH][n_kb][Dk][64]`, and values padded to 64
/// columns, `[BH][n_kb·64][64]` (zeros past `T` and past `Dv`).
pub struct Packed {
    kt: Vec<[f32; KB]>,
    v: Vec<[f32; KB]>,
    nkb: usize,
    dk: usize,
    dv: usize,
    /// `max |v|` (NaN entries skipped).
    vmax: f32,
}

impl Packed {
    /// From `k [B,T,H,Dk]`, `v [B,T,H,Dv]` (`Dk, Dv ≥ 1`), or from `[B,H,T,·]` where
    /// `heads_major`, in parallel over heads.
    pub fn new(
        k: &[f32],
        v: &[f32],
        (bn, tn, hn, dk, dv): (usize, usize, usize, usize, usize),
        heads_major: bool,
    ) -> Self {
        let nkb = tn.div_ceil(KB);
        let bh = bn * hn;
        // Start of row t of head `i = b·H + h` in rows of width d.
        let row = |i: usize, t: usize, d: usize| {
            if heads_major { (i * tn + t) * d } else { ((i / hn * tn + t) * hn + i % hn) * d }
        };
        let mut kt = vec![[0.0f32; KB]; bh * nkb * dk];
        let mut vp = vec![[0.0f32; KB]; bh * nkb * KB];
        let mut vmax = 0.0;
        if tn > 0 {
            kt.par_chunks_mut(nkb * dk).with_min_len(min_len()).enumerate().for_each(|(i, dst)| {
                for t in 0..tn {
                    let (b, lane) = (t / KB, t % KB);
                    for (lanes, &x) in dst[b * dk..][..dk].iter_mut().zip(&k[row(i, t, dk)..][..dk]) {
                        lanes[lane] = x;
                    }
                }
            });
            vmax = vp
                .par_chunks_mut(nkb * KB)
                .with_min_len(min_len())
                .enumerate()
                .map(|(i, dst)| {
                    let mut mx = 0.0f32;
                    for (t, out) in dst[..tn].iter_mut().enumerate() {
                        out[..dv].copy_from_slice(&v[row(i, t, dv)..][..dv]);
                        mx = out[..dv].iter().fold(mx, |m, x| m.max(x.abs()));
                    }
                    mx
                })
                .reduce(|| 0.0, f32::max);
        }
        Packed { kt, v: vp, nkb, dk, dv, vmax }
    }
}

/// Work buffers of one task, reused across its query blocks; after [`query_block`], `y`
/// (`[nq][64]`, the first `Dv` columns) and `lse` hold the block's results.
pub struct Scratch {
    qt: Vec<[f32; MR]>,
    pub y: Vec<[f32; KB]>,
    m: Vec<[f32; 16]>,
    l: Vec<[f32; 16]>,
    pub lse: Vec<f64>,
}

impl Scratch {
    pub fn new(dk: usize) -> Self {
        let tiles = QB.div_ceil(MR);
        Scratch {
            qt: vec![[0.0; MR]; tiles * dk],
            y: vec![[0.0; KB]; tiles * MR],
            m: vec![[0.0; 16]; tiles * MR],
            l: vec![[0.0; 16]; tiles * MR],
            lse: vec![0.0; tiles * MR],
        }
    }
}

/// One query block: `nq ≤ QB` queries (tokens `i₀..i₀+nq`) of head `bh`, row `r` at
/// `q[r·stride..][..Dk]`; `neg` whether `σ < 0`, `abs = |σ|`. Leaves `y_t` (normalised) and
/// `LSE_t` in `sc`; `false` (nothing computed) where the CPU lacks AVX-512.
#[allow(clippy::too_many_arguments)]
pub fn query_block(
    a: &Attention,
    pk: &Packed,
    bh: usize,
    (q, stride, nq, i0): (&[f32], usize, usize, usize),
    neg: bool,
    abs: f64,
    sc: &mut Scratch,
) -> bool {
    if nq == 0 || nq > QB || !has_avx512() {
        return false;
    }
    let dk = pk.dk;
    let tiles = nq.div_ceil(MR);
    // Qᵀ per micro-tile, sign(σ) folded in (exact); padding queries are zero.
    let sign = if neg { -1.0f32 } else { 1.0 };
    let qt = &mut sc.qt[..tiles * dk];
    for (tile, qtile) in qt.chunks_exact_mut(dk).enumerate() {
        for r in 0..MR {
            let row = tile * MR + r;
            if row < nq {
                for (lanes, &x) in qtile.iter_mut().zip(&q[row * stride..][..dk]) {
                    lanes[r] = sign * x;
                }
            } else {
                qtile.iter_mut().for_each(|lanes| lanes[r] = 0.0);
            }
        }
    }
    let n = tiles * MR;
    sc.m[..n].fill([f32::NEG_INFINITY; 16]);
    sc.l[..n].fill([0.0; 16]);
    sc.y[..n].fill([0.0; KB]);
    let c = (abs * std::f64::consts::LOG2_E) as f32;
    let head = Head {
        kt: &pk.kt[bh * pk.nkb * dk..][..pk.nkb * dk],
        v: &pk.v[bh * pk.nkb * KB..][..pk.nkb * KB],
        dk,
        nv: pk.dv.div_ceil(16),
    };
    let i1 = i0 + nq;
    let first_kb = a.first_key(i0) / KB;
    let last_kb = (i1 - 1) / KB;
    for kb in first_kb..=last_kb {
        for tile in 0..tiles {
            let t_lo = i0 + tile * MR;
            if t_lo >= i1 {
                break;
            }
            // Token of each row (padding rows repeat the last query's mask).
            let toks: [usize; MR] = std::array::from_fn(|r| (t_lo + r).min(i1 - 1));
            let firsts: [usize; MR] = toks.map(|t| a.first_key(t));
            let j0 = kb * KB;
            let t_hi = toks[MR - 1];
            if j0 > t_hi || j0 + KB <= firsts[0] {
                continue;
            }
            let st = TileState {
                m: (&mut sc.m[tile * MR..][..MR]).try_into().expect("MR rows"),
                l: (&mut sc.l[tile * MR..][..MR]).try_into().expect("MR rows"),
                o: (&mut sc.y[tile * MR..][..MR]).try_into().expect("MR rows"),
            };
            let span = Span { kb, j0, toks, firsts, c };
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `has_avx512()` above confirmed that this CPU executes AVX-512F, the only
            // target feature the kernel is compiled for.
            unsafe {
                avx512::tile(&head, &qt[tile * dk..][..dk], &span, st);
            }
        }
    }
    for r in 0..nq {
        let (m, l) = (sc.m[r][0], sc.l[r].iter().map(|&x| x as f64).sum::<f64>());
        let inv = (1.0 / l) as f32;
        sc.y[r][..pk.dv].iter_mut().for_each(|x| *x *= inv);
        sc.lse[r] = abs * m as f64 + l.ln();
    }
    true
}

/// One head's packed keys and values.
struct Head<'a> {
    kt: &'a [[f32; KB]],
    v: &'a [[f32; KB]],
    dk: usize,
    /// Registers per value row (`⌈Dv/16⌉`).
    nv: usize,
}

/// A micro-tile against one key block: block index and first key, the rows' tokens and first
/// visible keys, `c = |σ|·log₂e`.
struct Span {
    kb: usize,
    j0: usize,
    toks: [usize; MR],
    firsts: [usize; MR],
    c: f32,
}

/// The running state of a micro-tile's rows: maximum key (in every lane), denominator (16
/// partial sums), unnormalised output.
struct TileState<'a> {
    m: &'a mut [[f32; 16]; MR],
    l: &'a mut [[f32; 16]; MR],
    o: &'a mut [[f32; KB]; MR],
}

/// The visible lanes `[lo, hi)` of a 64-key block as a bit mask (bounds clamped to 0..=64).
fn lane_bits(lo: usize, hi: usize) -> u64 {
    let upto = |n: usize| if n >= KB { u64::MAX } else { (1u64 << n) - 1 };
    upto(hi) & !upto(lo)
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use super::{Head, KB, MR, Span, TAU, TileState, lane_bits};
    use std::arch::x86_64::*;

    /// Coefficients of `2^f ≈ Σᵢ Cᵢ fⁱ` on `[−½, ½]`, lowest degree first.
    const C: [f32; 7] = [
        1.0,
        std::f32::consts::LN_2,
        0.240_226_46,
        0.055_503_29,
        0.009_618_52,
        0.001_339_986,
        0.000_153_375_77,
    ];

    /// `2^x` lane by lane (see the module docs); `x` is never NaN here, `−∞` gives 0.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(in crate::attention) fn exp2(x: __m512) -> __m512 {
        exp2_finite(_mm512_max_ps(x, _mm512_set1_ps(-200.0)))
    }

    /// `2^x` lane by lane for finite `x` (no clamp: `−∞` would give NaN).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp2_finite(x: __m512) -> __m512 {
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
        let f = _mm512_sub_ps(x, n);
        let mut p = _mm512_set1_ps(C[6]);
        for &ci in C[..6].iter().rev() {
            p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(ci));
        }
        _mm512_scalef_ps(p, n)
    }

    /// Runs `$body` with `$r` = 0, 1, …, `MR − 1`, unrolled (so that arrays indexed by `$r`
    /// stay in registers).
    macro_rules! each_row {
        ($r:ident => $body:block) => {{
            const _: () = assert!(MR == 6);
            each_row!(@ $r => $body; 0usize 1usize 2usize 3usize 4usize 5usize)
        }};
        (@ $r:ident => $body:block; $($i:literal)*) => {{
            $({
                let $r = $i;
                $body
            })*
        }};
    }

    /// 16 lanes from `x[at..at + 16]`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load(x: &[f32; KB], at: usize) -> __m512 {
        let s = &x[at..at + 16];
        // SAFETY: `s` holds 16 initialised `f32`; the load is unaligned.
        unsafe { _mm512_loadu_ps(s.as_ptr()) }
    }

    /// `maxᵢ xᵢ` in every lane (swaps of halves, then of quarters, pairs and neighbours).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn hmax(x: __m512) -> __m512 {
        let x = _mm512_max_ps(x, _mm512_shuffle_f32x4::<0x4E>(x, x));
        let x = _mm512_max_ps(x, _mm512_shuffle_f32x4::<0xB1>(x, x));
        let x = _mm512_max_ps(x, _mm512_permute_ps::<0x4E>(x));
        _mm512_max_ps(x, _mm512_permute_ps::<0xB1>(x))
    }

    /// Lane `r` of `x` in every lane.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn lane_bcast(r: usize, x: __m512) -> __m512 {
        _mm512_permutexvar_ps(_mm512_set1_epi32(r as i32), x)
    }

    /// 16 lanes from `x`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load16(x: &[f32; 16]) -> __m512 {
        // SAFETY: `x` holds 16 initialised `f32`; the load is unaligned.
        unsafe { _mm512_loadu_ps(x.as_ptr()) }
    }

    /// `x ← v`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn store16(x: &mut [f32; 16], v: __m512) {
        // SAFETY: `x` is 16 writable `f32`; the store is unaligned.
        unsafe { _mm512_storeu_ps(x.as_mut_ptr(), v) }
    }

    /// `x[at..at + 16] ← v`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn store(x: &mut [f32; KB], at: usize, v: __m512) {
        let s = &mut x[at..at + 16];
        // SAFETY: `s` is 16 writable `f32`; the store is unaligned.
        unsafe { _mm512_storeu_ps(s.as_mut_ptr(), v) }
    }

    /// One micro-tile (`qt`: its `[Dk][MR]` signed queries) against key block `span.kb`.
    #[target_feature(enable = "avx512f")]
    pub(super) fn tile(h: &Head<'_>, qt: &[[f32; MR]], span: &Span, st: TileState<'_>) {
        match h.nv {
            1 => tile_nv::<1>(h, qt, span, st),
            2 => tile_nv::<2>(h, qt, span, st),
            3 => tile_nv::<3>(h, qt, span, st),
            _ => tile_nv::<4>(h, qt, span, st),
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn tile_nv<const NV: usize>(h: &Head<'_>, qt: &[[f32; MR]], span: &Span, st: TileState<'_>) {
        let Span { kb, j0, toks, firsts, c } = *span;
        let kt = &h.kt[kb * h.dk..][..h.dk];
        // Scores u = sign(σ) q·k: 6 queries × 64 keys.
        let mut s = [[_mm512_setzero_ps(); 4]; MR];
        for (krow, qv) in kt.iter().zip(qt) {
            let kv = [load(krow, 0), load(krow, 16), load(krow, 32), load(krow, 48)];
            for r in 0..MR {
                let b = _mm512_set1_ps(qv[r]);
                for (acc, &k) in s[r].iter_mut().zip(&kv) {
                    *acc = _mm512_fmadd_ps(b, k, *acc);
                }
            }
        }
        // Masks only where the block crosses the diagonal or the window's edge.
        let masked = j0 + KB - 1 > toks[0] || j0 < firsts[MR - 1];
        let zero = _mm512_setzero_ps();
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let cv = _mm512_set1_ps(c);
        let tau = _mm512_set1_ps(TAU);
        // Per row: the lane-wise maximum of the block's scores, the running maximum, and
        // whether some score exceeds the running maximum by more than TAU in the exponent
        // (always where the running one is −∞ and the block has a visible key).
        let mut m_old = [zero; MR];
        let mut m4 = [zero; MR];
        let mut grow: u16 = 0;
        each_row!(r => {
            if masked {
                let bits = lane_bits(firsts[r].saturating_sub(j0), (toks[r] + 1).saturating_sub(j0));
                for (i, acc) in s[r].iter_mut().enumerate() {
                    *acc = _mm512_mask_blend_ps((bits >> (16 * i)) as u16, ninf, *acc);
                }
            }
            m4[r] = _mm512_max_ps(_mm512_max_ps(s[r][0], s[r][1]), _mm512_max_ps(s[r][2], s[r][3]));
            m_old[r] = load16(&st.m[r]);
            let above = _mm512_fmadd_ps(cv, m_old[r], tau);
            grow |= _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_mul_ps(cv, m4[r]), above);
        });
        // The maxima the weights are taken against: the running ones, unless some row grew;
        // then every row's becomes max(running, the block's row maximum) and the old sums are
        // rescaled by 2^{c(m − m')} (all six factors by one exp2, row r in lane r).
        let rescale = grow != 0;
        let mut m_run = m_old;
        let mut corr = [zero; MR];
        if rescale {
            let mut diff = zero;
            each_row!(r => {
                let m_new = _mm512_max_ps(m_old[r], hmax(m4[r]));
                store16(&mut st.m[r], m_new);
                m_run[r] = m_new;
                // Before any visible key the maximum is −∞: the factor of the (zero) sums is 0.
                let none = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(m_new, ninf);
                let safe = _mm512_mask_blend_ps(none, m_new, zero);
                diff = _mm512_mask_blend_ps(1 << r, diff, _mm512_sub_ps(m_old[r], safe));
            });
            let corr_all = exp2(_mm512_mul_ps(cv, diff));
            each_row!(r => {
                corr[r] = lane_bcast(r, corr_all);
            });
        }
        // Weights p = 2^{c·u − c·m} (≤ 2^TAU) into the stack buffer, and ℓ ← corr·ℓ + Σ p.
        let mut p = Weights([[0.0f32; KB]; MR]);
        each_row!(r => {
            // Before any visible key the maximum is −∞ (only on masked blocks: an unmasked one
            // gives every row a finite maximum): weights 2^{c(u − 0)} of −∞ keys are 0.
            let cm = if masked {
                let none = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(m_run[r], ninf);
                _mm512_mul_ps(cv, _mm512_mask_blend_ps(none, m_run[r], zero))
            } else {
                _mm512_mul_ps(cv, m_run[r])
            };
            let mut sum = zero;
            for (i, &acc) in s[r].iter().enumerate() {
                let x = _mm512_fmsub_ps(cv, acc, cm);
                // Unmasked blocks hold finite scores only: no −∞ to clamp.
                let w = if masked { exp2(x) } else { exp2_finite(x) };
                store(&mut p.0[r], 16 * i, w);
                sum = _mm512_add_ps(sum, w);
            }
            let l_old = load16(&st.l[r]);
            let l = if rescale { _mm512_fmadd_ps(l_old, corr[r], sum) } else { _mm512_add_ps(l_old, sum) };
            store16(&mut st.l[r], l);
        });
        // o ← corr·o + Σ_s p_s v_s over the keys some row sees.
        let lo = firsts[0].saturating_sub(j0);
        let hi = (toks[MR - 1] + 1 - j0).min(KB);
        let mut o = [[zero; NV]; MR];
        each_row!(r => {
            for (i, acc) in o[r].iter_mut().enumerate() {
                let x = load(&st.o[r], 16 * i);
                *acc = if rescale { _mm512_mul_ps(x, corr[r]) } else { x };
            }
        });
        let vb = &h.v[kb * KB..][..KB];
        for j in lo..hi {
            let vrow = &vb[j];
            let vv: [__m512; NV] = std::array::from_fn(|i| load(vrow, 16 * i));
            for r in 0..MR {
                let b = _mm512_set1_ps(p.0[r][j]);
                for (acc, &x) in o[r].iter_mut().zip(&vv) {
                    *acc = _mm512_fmadd_ps(b, x, *acc);
                }
            }
        }
        each_row!(r => {
            for (i, &acc) in o[r].iter().enumerate() {
                store(&mut st.o[r], 16 * i, acc);
            }
        });
    }

    /// The weights of one micro-tile, one cache-line-aligned row of 64 keys per query.
    #[repr(align(64))]
    struct Weights([[f32; KB]; MR]);
}

#[cfg(test)]
mod tests {
    use super::lane_bits;

    /// The sums' bound: `2^8·T·max|v|·2` against `f32::MAX` (3.4e38), NaN values skipped.
    #[test]
    fn sums_fit_bounds_the_values() {
        let (tn, dk, dv) = (100, 3, 5);
        let k = vec![1.0f32; tn * dk];
        let fits = |scale: f32, nan: bool| {
            let mut v: Vec<f32> = (0..tn * dv).map(|i| scale * ((i % 7) as f32 - 3.0) / 3.0).collect();
            if nan {
                v[17] = f32::NAN;
            }
            super::sums_fit(&super::Packed::new(&k, &v, (1, tn, 1, dk, dv), true), tn)
        };
        // 100·256·1e33·2 = 5.1e37 fits, 100·256·1e34·2 = 5.1e38 does not.
        assert!(fits(1e33, false) && fits(1e33, true) && fits(1.0, false));
        assert!(!fits(1e34, false) && !fits(-1e34, true));
    }

    #[test]
    fn lane_bits_are_the_visible_range() {
        assert_eq!(lane_bits(0, 64), u64::MAX);
        assert_eq!(lane_bits(0, 0), 0);
        assert_eq!(lane_bits(3, 5), 0b11000);
        assert_eq!(lane_bits(10, 3), 0);
        assert_eq!(lane_bits(63, 80), 1 << 63);
    }

    /// `2^x` of the kernel against `f64` over the softmax range, and exact zeros below it.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp2_is_within_two_ulp() {
        use std::arch::x86_64::*;
        if !super::has_avx512() {
            return;
        }
        let mut worst = 0.0f64;
        let mut x = -126.0f32;
        let mut out = [0.0f32; 16];
        while x <= 0.0 {
            let lanes: [f32; 16] = std::array::from_fn(|i| x + 0.000_37 * i as f32);
            // SAFETY: AVX-512F was detected above; `lanes` and `out` are 16 f32 each.
            unsafe {
                let v = super::avx512::exp2(_mm512_loadu_ps(lanes.as_ptr()));
                _mm512_storeu_ps(out.as_mut_ptr(), v);
            }
            for (&xi, &g) in lanes.iter().zip(&out) {
                let want = (xi as f64).exp2();
                worst = worst.max((g as f64 / want - 1.0).abs());
            }
            x += 0.0713;
        }
        assert!(worst < 2.4e-7, "worst relative error {worst}");
        for x in [f32::NEG_INFINITY, -200.0, -1e30] {
            // SAFETY: as above.
            unsafe {
                _mm512_storeu_ps(out.as_mut_ptr(), super::avx512::exp2(_mm512_set1_ps(x)));
            }
            assert_eq!(out, [0.0; 16], "2^{x}");
        }
    }

    /// The kernel's rate on one thread over one causal head (`T` from `FUSED_T`, default
    /// 4096; `Dk = Dv = 64`), by the thread's CPU time (`/proc/thread-self/schedstat`, so that
    /// other load on the machine does not count) and wall clock; FLOPs `2·T²·D` (the causal
    /// halves of `QKᵀ` and `PV`). A measurement, not a check:
    /// `cargo test --release -p mixer-cpu --lib -- --ignored --nocapture fused_kernel_rate`.
    #[test]
    #[ignore]
    fn fused_kernel_rate() {
        use mixer_core::mixers::attention::{Attention, AttentionConfig};
        let tn: usize = std::env::var("FUSED_T").ok().and_then(|s| s.parse().ok()).unwrap_or(4096);
        let d = 64;
        if !super::available(d) {
            return;
        }
        let a = Attention::new("attention", AttentionConfig::default()).unwrap();
        let x: Vec<f32> = (0..tn * d).map(|i| ((i * 7919) % 1013) as f32 / 1013.0 - 0.5).collect();
        let pk = super::Packed::new(&x, &x, (1, tn, 1, d, d), true);
        let mut sc = super::Scratch::new(d);
        let cpu_ns = || -> f64 {
            let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
            s.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
        };
        let run = |sc: &mut super::Scratch| {
            for i0 in (0..tn).step_by(super::QB) {
                let nq = super::QB.min(tn - i0);
                assert!(super::query_block(&a, &pk, 0, (&x[i0 * d..], d, nq, i0), false, 0.125, sc));
            }
        };
        run(&mut sc);
        let (c0, w0) = (cpu_ns(), std::time::Instant::now());
        let reps = 5;
        for _ in 0..reps {
            run(&mut sc);
        }
        let (cpu, wall) = ((cpu_ns() - c0) * 1e-9, w0.elapsed().as_secs_f64());
        let flop = 2.0 * (tn * tn * d) as f64 * reps as f64;
        println!(
            "fused kernel, T = {tn}, one thread: {:.1} GFLOP/s by CPU time, {:.1} by wall clock",
            flop / cpu / 1e9,
            flop / wall / 1e9
        );
    }
}
