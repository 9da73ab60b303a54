//! The sparse recurrence, pipelined over tiles of tokens ([`TILES`]; `kernels/glr.cu`,
//! `glr_tiled`): a block per (batch, [`CHANNELS`] channels). One warp runs the recurrence of a
//! tile with a single FMA per token on its critical path, `y_t = q_t + b1_t·y_{t−1}`, while one
//! thread per (token, channel) of the next tile gathers every term whose `y` is already final
//! (the α-terms and the far β-terms, many loads in flight), sums the coefficients of `y_{t−1}`
//! and `y_{t−2}` (kept in registers by the sequential warp), and lists the other taps that reach
//! the last two tiles as (β, ring slot) pairs, at least three tokens back, so that
//! `q_t = pre_t + b2_t·y_{t−2} + Σ β·ring` is gathered from shared memory two tokens ahead.
//! Positions come from the host-computed (offset, stride) table, so plugin patterns need no
//! kernel of their own.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use cudarc::driver::{CudaView, LaunchConfig};

use mixer_core::mixers::glr::Glr;
use mixer_core::{Mixer, Precision, Result};

use super::common::{FAMILY, dims};
use crate::forms::{finish, input, input_opt};
use crate::kernels;
use crate::pool::{self, Pooled};
use crate::runtime::{err, gpu, int, launch, max_dynamic_smem, opt_in};
use crate::tensor::GpuReal;
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// The pattern table the kernel takes for length `t_len`: [`Glr::slots`]'s offsets `f(k)`
/// and strides `a_k` for `k < K(T)`, as `i64`.
pub(crate) fn table(glr: &Glr, t_len: usize) -> Result<(Vec<i64>, Vec<i64>)> {
    let slots = glr.slots(t_len);
    let conv = |v: usize| i64::try_from(v).map_err(|_| err(FAMILY, format!("pattern value {v} exceeds i64")));
    Ok((
        slots.offsets().iter().map(|&v| conv(v)).collect::<Result<_>>()?,
        slots.strides().iter().map(|&v| conv(v.min(i64::MAX as usize))).collect::<Result<_>>()?,
    ))
}

/// A pattern table on the device, with the counts the kernel's [`Layout`] is chosen from (the
/// backward reads the table and `k` too).
pub(crate) struct DeviceTable {
    /// The offsets `f(k)`, `k < K`.
    pub(crate) off: Pooled<i64>,
    /// The lattice strides `a_k`, `k < K`.
    pub(crate) strides: Pooled<i64>,
    /// `K`, the number of taps.
    pub(crate) k: usize,
    /// The near-tap counts of [`near_taps`] for each tile of [`TILES`].
    near: [usize; TILES.len()],
    /// The taps of [`short_taps`].
    short: usize,
}

/// Device tables by (mixer name, mixer config, T), so that a repeated call uploads nothing. The
/// name is part of the key: aliases such as `diagonal-ssm` and `dense-recurrence` fix the pattern
/// by name and may share a config. Every stream reads them: a table's first call waits for its
/// upload once, so that work on another stream, not ordered after that upload, never reads it
/// early (a table made inside a CUDA graph capture fails there, as its upload would anyway).
static TABLES: LazyLock<Mutex<HashMap<(String, String, usize), Arc<DeviceTable>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The device table of `glr` for length `t`, uploaded on first use.
pub(crate) fn device_table(glr: &Glr, t: usize) -> Result<Arc<DeviceTable>> {
    let key = (glr.name().to_string(), glr.config().to_string(), t);
    let mut cache = TABLES.lock().map_err(|_| err(FAMILY, "pattern table cache poisoned"))?;
    if let Some(d) = cache.get(&key) {
        return Ok(d.clone());
    }
    let (off, strides) = table(glr, t)?;
    let d = Arc::new(DeviceTable {
        near: TILES.map(|tile| near_taps(&off, &strides, glr.pattern().cache_efficient(), tile)),
        short: short_taps(&off),
        k: off.len(),
        off: pool::upload(FAMILY, &off)?,
        strides: pool::upload(FAMILY, &strides)?,
    });
    gpu()?.sync(FAMILY)?;
    if cache.len() >= 1024 {
        cache.clear();
    }
    cache.insert(key, d.clone());
    Ok(d)
}

/// Tokens per tile (`GLR_L`), in the order [`Layout::choose`] tries them: 64, or, up to
/// [`SHORT_TILES_MAX_T`] tokens, a shorter tile where more near taps than [`MAX_LIST`] reach the
/// last two tiles of 64 (patterns with many small offsets, such as the dense recurrence
/// `f(k) = k + 1`), which the sequential warp would otherwise add one by one on its critical path;
/// with shorter tiles those taps are final before the tile that reads them and the gathering
/// threads add them, many loads in flight.
const TILES: [usize; 4] = [64, 32, 16, 8];
/// The longest sequence that takes the shorter tiles: their gathering threads read every earlier
/// token once per tile, `T²/L` loads per channel, which wins while `T` is short and loses at long
/// ones. Measured on the H200 (dense recurrence, C = 64, `mixers bench`, 2026-12-03), tiles of 8
/// against 64: 1.00 against 29.9 ms at (B, T) = (64, 256), 16.0 against 36.2 ms at (8, 1024),
/// 251 against 154 ms at (1, 4096).
const SHORT_TILES_MAX_T: usize = 1024;
/// Channels per block (`GLR_CH`).
const CHANNELS: usize = 8;
/// Threads per block at tiles of `tile` tokens: the sequential warp and one thread per (token,
/// channel) of a tile.
fn threads(tile: usize) -> usize {
    32 + tile * CHANNELS
}
/// Longest gather list per token (`GLR_NN`): taps beyond it that reach the last two tiles are
/// added by the sequential warp itself, which is slower.
const MAX_LIST: usize = 16;

/// Length of a token's record `[pre, b1, b2, β…]` with gather lists of `nl` taps
/// (`GLR_REC`: a multiple of 16 bytes of `f32`).
fn record_len(nl: usize) -> usize {
    (3 + nl).div_ceil(4) * 4
}

/// Dynamic shared memory of `glr_tiled` at tiles of `tile` tokens with gather lists of `nl` taps
/// (see the kernel's layout: records and slot records of two tiles, and the ring of the last two
/// tiles' outputs).
fn smem_bytes(nl: usize, elem: usize, tile: usize) -> usize {
    let cells = tile * CHANNELS;
    let slots = if nl > 8 { 16 } else { 8 };
    2 * cells * record_len(nl) * elem + (2 * tile + 1) * CHANNELS * elem + 2 * cells * slots * 2
}

/// The kernel's compile-time shape for one pattern table: tokens per tile (`GLR_L`) and the near
/// taps at that tile (the kernel's `knear`), taps sorted per token (`GLR_NN`), taps never listed
/// (`GLR_K2`, those with `f(k) ≤ 2`), gather-list length (`GLR_NL`), whether near taps beyond
/// `GLR_NN` exist (`GLR_FARNEAR`), and the dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    tile: usize,
    knear: usize,
    nn: usize,
    k2: usize,
    nl: usize,
    farnear: bool,
    smem: usize,
}

impl Layout {
    /// For the near-tap counts `near` at each tile of [`TILES`], of which `short` have `f(k) ≤ 2`,
    /// a sequence of `t_len` tokens, elements of `elem` bytes and a shared-memory ceiling `limit`:
    /// the longest tile whose near taps all fit a list of [`MAX_LIST`] (the shortest tile where
    /// none does; always 64 beyond [`SHORT_TILES_MAX_T`] tokens), and the longest list at it that
    /// fits the shared memory.
    fn choose(near: [usize; TILES.len()], short: usize, t_len: usize, elem: usize, limit: usize) -> Layout {
        let i = if t_len > SHORT_TILES_MAX_T {
            0
        } else {
            near.iter().position(|&n| n <= MAX_LIST).unwrap_or(TILES.len() - 1)
        };
        let (tile, knear) = (TILES[i], near[i]);
        // Taps k < nn are sorted by the gathering threads; entries short..min(knear, nn) can be listed.
        let list_len = |nn: usize| knear.min(nn).saturating_sub(short);
        let mut nn = knear.clamp(1, MAX_LIST);
        while nn > 1 && smem_bytes(list_len(nn), elem, tile) > limit {
            nn -= 1;
        }
        let nl = list_len(nn);
        let smem = smem_bytes(nl, elem, tile);
        Layout { tile, knear, nn, k2: short.min(nn), nl, farnear: knear > nn, smem }
    }

    /// The NVRTC defines of this layout.
    fn defines(&self) -> [String; 6] {
        [
            format!("-DGLR_L={}", self.tile),
            format!("-DGLR_CH={CHANNELS}"),
            format!("-DGLR_NN={}", self.nn),
            format!("-DGLR_K2={}", self.k2),
            format!("-DGLR_NL={}", self.nl),
            format!("-DGLR_FARNEAR={}", i32::from(self.farnear)),
        ]
    }
}

/// `1 + max{k : f(k) − a_k + 1 ≤ 2·tile − 1}` (`a_k = 1` when translation-invariant): taps from
/// `knear` on always lie before the previous tile of `tile` tokens (`d_k(t) ≤ t − f(k) + a_k − 1`).
fn near_taps(off: &[i64], strides: &[i64], ce: bool, tile: usize) -> usize {
    let reach = 2 * tile as i64 - 1;
    (0..off.len())
        .filter(|&k| {
            let a = if ce { strides[k] } else { 1 };
            off[k].saturating_sub(a) < reach
        })
        .max()
        .map_or(0, |k| k + 1)
}

/// The taps with `f(k) ≤ 2` (a prefix, `f` being increasing): always at lag 1 or 2, so never in a
/// gather list.
fn short_taps(off: &[i64]) -> usize {
    off.iter().filter(|&&f| f <= 2).count()
}

/// Runs the fast (sparse recurrence) form on device tensors.
pub fn run<F: GpuReal>(glr: &Glr, x: &DeviceTensors, p: Precision) -> Result<AnyDeviceTensor> {
    let xs = input::<F>(x, "x")?;
    let (b, t, c) = (xs.shape()[0], xs.shape()[1], xs.shape()[2]);
    if b * t * c == 0 {
        return finish(DeviceTensor::<F>::zeros(&[b, t, c])?, p);
    }
    let tab = device_table(glr, t)?;
    let k = tab.k;
    let on = glr.on();
    let na = if on.has_a() { k + 1 } else { 1 };
    let ce = glr.pattern().cache_efficient();
    let alpha = input::<F>(x, "alpha")?;
    let beta = if on.has_b() { input_opt::<F>(x, "beta")? } else { None };
    // The kernels index the slot axis by the pattern table's K(T): a longer axis (which the
    // CPU takes for runs from a state) is refused, not misread.
    let want_a = if on.has_a() { vec![b, t, na, c] } else { vec![b, t, c] };
    for (name, got, want) in [
        ("alpha", Some(alpha.shape().to_vec()), want_a),
        ("beta", beta.as_ref().map(|v| v.shape().to_vec()), vec![b, t, k, c]),
    ] {
        if let Some(got) = got
            && got != want
        {
            return Err(mixer_core::Error::shape(
                name,
                format!("{} (on CUDA the slot axis is exactly K(T))", mixer_core::error::fmt_shape(&want)),
                mixer_core::error::fmt_shape(&got),
            ));
        }
    }
    let zero = pool::zeros::<F>(FAMILY, 1)?;
    let bv = beta.as_ref().map_or_else(|| zero.slice(0..1), |d| d.view());
    let y =
        tiled::<F>(&tab, ce, [&xs.view(), &alpha.view(), &bv], [b, t, c], [on.has_a(), on.has_b()], false)?;
    finish(DeviceTensor::from_pooled(y, &[b, t, c])?, p)
}

/// One launch of the forward's kernel (`glr_tiled`) for the pattern table `tab` (`ce`: a
/// cache-efficient lattice) on `[x, α, β]` of `[B, T, C]` (α `[B, T, K + 1, C]` with taps on `A`,
/// β `[B, T, K, C]` with taps on `B`, else a one-element buffer), shapes already checked: `y`.
/// With `rev` (taps on `B` only, translation-invariant) it is compiled with `GLR_REV`: the
/// backward's reverse recurrence ([`super::backward`]), `x` the output's cotangent, α not read, and
/// `y` the total cotangent in reversed time.
pub(crate) fn tiled<F: GpuReal>(
    tab: &DeviceTable,
    ce: bool,
    [xv, av, bv]: [&CudaView<'_, F>; 3],
    [b, t, c]: [usize; 3],
    [has_a, has_b]: [bool; 2],
    rev: bool,
) -> Result<Pooled<F>> {
    let k = tab.k;
    let na = if has_a { k + 1 } else { 1 };
    let lay = Layout::choose(tab.near, tab.short, t, std::mem::size_of::<F>(), max_dynamic_smem());
    let g = gpu()?;
    let mut opts = lay.defines().to_vec();
    if rev {
        opts.push("-DGLR_REV=1".into());
    }
    let f = g.kernel(FAMILY, &kernels::GLR, &opts, &format!("glr_tiled_{}", F::SUFFIX))?;
    if lay.smem > 48 << 10 {
        opt_in(FAMILY, &f)?;
    }
    let mut y = pool::take::<F>(FAMILY, b * t * c)?;
    let [bi, ti, ci, ki, nai] = dims(b, t, c, k, na)?;
    let (ha, hb, cei) = (has_a as i32, has_b as i32, ce as i32);
    let kni = int(FAMILY, "near taps", lay.knear)?;
    let blocks = b * c.div_ceil(CHANNELS);
    let cfg = LaunchConfig {
        grid_dim: (int(FAMILY, "blocks", blocks)? as u32, 1, 1),
        block_dim: (threads(lay.tile) as u32, 1, 1),
        shared_mem_bytes: lay.smem as u32,
    };
    launch!(g, FAMILY, f, cfg;
        xv, av, bv, &*tab.off, &*tab.strides, &mut *y, &bi, &ti, &ci, &ki, &nai, &ha, &hb, &cei, &kni)?;
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mixer_core::mixers::glr::{GlrConfig, On};

    fn near(pattern: &str, ce: bool, t: usize) -> ([usize; 4], usize) {
        let f = mixer_registry::pattern(pattern).unwrap().offset;
        let cfg = GlrConfig { pattern: pattern.into(), cache_efficient: ce, order: None, on: On::B };
        let glr = Glr::new("glr", cfg, f).unwrap();
        let (off, strides) = table(&glr, t).unwrap();
        (TILES.map(|tile| near_taps(&off, &strides, ce, tile)), short_taps(&off))
    }

    /// The layouts the H200 ran in session 8 (the CuPy harness computes them with its own
    /// formula; pow2 at T = 65536, f32): 7 near taps (offsets 1 … 64), two never listed,
    /// 5 list entries, 53 280 bytes; cache-efficient: 8 near taps, 6 entries, 69 664 bytes.
    #[test]
    fn pow2_layouts_match_the_kernel_runs() {
        let limit = 219 << 10;
        let (kn, short) = near("pow2", false, 65536);
        assert_eq!((kn[0], short), (7, 2));
        let l = Layout::choose(kn, short, 65536, 4, limit);
        assert_eq!(l, Layout { tile: 64, knear: 7, nn: 7, k2: 2, nl: 5, farnear: false, smem: 53_280 });
        let (kn, short) = near("pow2", true, 65536);
        assert_eq!((kn[0], short), (8, 2));
        assert_eq!(Layout::choose(kn, short, 65536, 4, limit).smem, 69_664);
        assert_eq!(Layout::choose(kn, short, 65536, 4, limit).nl, 6);
    }

    /// Many small offsets (`f(k) = k + 1`: 127 taps reach the last two tiles of 64) take tiles of
    /// 8 tokens, where 15 do and all are listed; a pattern whose near taps fit keeps tiles of 64.
    #[test]
    fn many_near_taps_take_shorter_tiles() {
        let off: Vec<i64> = (1..=255).collect();
        let ones = vec![1; off.len()];
        let kn = TILES.map(|tile| near_taps(&off, &ones, false, tile));
        assert_eq!(kn, [127, 63, 31, 15]);
        let l = Layout::choose(kn, short_taps(&off), 256, 4, 219 << 10);
        assert_eq!((l.tile, l.knear, l.nn, l.k2, l.nl, l.farnear), (8, 15, 15, 2, 13, false));
        assert_eq!(l.smem, smem_bytes(13, 4, 8));
        assert!(l.defines().contains(&"-DGLR_L=8".to_string()));
        // None fits: the shortest tile, its near taps beyond the list to the sequential warp.
        let l = Layout::choose([200, 100, 50, 25], 2, 1000, 4, 219 << 10);
        assert_eq!((l.tile, l.knear, l.nn, l.farnear), (8, 25, 16, true));
        let (kn, _) = near("sq1", false, 4096);
        assert_eq!(Layout::choose(kn, 2, 4096, 4, 219 << 10).tile, 64, "{kn:?}");
        // Long sequences keep tiles of 64 whatever their near taps.
        let l = Layout::choose([127, 63, 31, 15], 2, 4096, 4, 219 << 10);
        assert_eq!((l.tile, l.knear, l.nn, l.farnear), (64, 127, 16, true));
        assert_eq!(Layout::choose([127, 63, 31, 15], 2, 1024, 4, 219 << 10).tile, 8);
    }

    /// A tight shared-memory ceiling shortens the sorted taps (and the list), leaving the near
    /// taps beyond them to the sequential warp; the list never counts the taps with f(k) ≤ 2.
    #[test]
    fn short_shared_memory_moves_near_taps_to_the_sequential_warp() {
        let at64 = |n: usize| [n, n, n, n];
        let full = Layout::choose(at64(16), 2, 100, 8, usize::MAX);
        assert_eq!((full.tile, full.nn, full.nl, full.farnear), (64, 16, 14, false));
        let tight = Layout::choose(at64(16), 2, 100, 8, full.smem - 1);
        assert!(tight.nn < 16 && tight.farnear && tight.smem < full.smem);
        assert_eq!(tight.nl, tight.nn - 2);
        let one = Layout::choose(at64(16), 2, 100, 8, 0);
        assert_eq!((one.nn, one.k2, one.nl, one.farnear), (1, 1, 0, true));
        assert_eq!(
            Layout::choose(at64(0), 0, 100, 4, usize::MAX),
            Layout { tile: 64, knear: 0, nn: 1, k2: 0, nl: 0, farnear: false, smem: smem_bytes(0, 4, 64) }
        );
    }
}
