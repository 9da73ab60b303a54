//! The `fast` form on CPU: the chunked algorithm of docs/math.md §2.6 (Fenwick structure; the
//! registry refuses other masks through [`Mixer::form_unsupported`](mixer_core::Mixer::form_unsupported)),
//! per (sequence, head) in parallel (batch rows, or the sequences of a packed batch:
//! [`common::Layout`]): linear attention, Mamba-2 and their lifts (scalar transitions)
//! take the specialisation [`super::ssd`], gated DeltaNet and its lift the general
//! [`super::chunked`] form.

use std::ops::Range;

use faer::Mat;
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::mixers::loglinear::lift_state::{POSITION, store_slots};
use mixer_core::mixers::loglinear::state::STATE;
use mixer_core::parallel::min_len;
use mixer_core::tensor::get;
use mixer_core::{Error, Result, Tensors};
use ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;

use super::common::{self, run_heads};
use super::{chunked, lift_state, ssd};
use crate::vmath::VecMath;

/// The `fast` form.
pub fn fast<F: VecMath>(m: &LogLinear, x: &Tensors<F>) -> Result<ArrayD<F>> {
    run(m, x, None, None, false).map(|(y, _)| y)
}

/// The `fast` form over a packed batch (`B = 1`, sequence `i` at the rows `ranges[i]`, checked;
/// docs/math.md §7.2), natively: one job list over (sequence, head), each job the form on the
/// sequence's rows alone, so that it computes exactly what [`fast`] (or, with `initial` or
/// `want_final`, [`fast_from`]) computes on the sequence cut out of the buffer. With `initial`
/// (one row per sequence) or `want_final`, every sequence runs from its state and the final
/// states come back one row per sequence. Rows past the last range get zeros.
pub fn fast_packed<F: VecMath>(
    m: &LogLinear,
    x: &Tensors<F>,
    ranges: &[Range<usize>],
    initial: Option<&Tensors<F>>,
    want_final: bool,
) -> Result<(ArrayD<F>, Option<Tensors<F>>)> {
    run(m, x, Some(ranges), initial, initial.is_some() || want_final)
}

/// [`fast`], [`fast_from`] and [`fast_packed`]: the sequences are the batch rows, or the
/// `packed` ranges; with `stateful`, every sequence runs from its row of `initial` (zero
/// without) and the final states come back.
fn run<F: VecMath>(
    m: &LogLinear,
    x: &Tensors<F>,
    packed: Option<&[Range<usize>]>,
    initial: Option<&Tensors<F>>,
    stateful: bool,
) -> Result<(ArrayD<F>, Option<Tensors<F>>)> {
    if stateful {
        let (y, fin) = if m.lift.is_some() {
            lift_from(m, x, packed, initial)?
        } else {
            base_from(m, x, packed, initial)?
        };
        return Ok((y, Some(fin)));
    }
    let y = if ssd::applies(m) {
        run_heads(m, x, |m, hd| flushed(|| ssd::run_head_from(m, hd, None).map(|(y, _)| y)), true, packed)
    } else {
        run_heads(
            m,
            x,
            |m, hd| flushed(|| chunked::run_head_from(m, hd, None).map(|(y, _)| y)),
            false,
            packed,
        )
    }?;
    Ok((y, None))
}

/// Runs one head's chunked form with subnormal results flushed to zero
/// ([`crate::flush::FlushToZero`]): its decaying level states would otherwise pass through
/// the subnormal range in every product.
fn flushed<T>(f: impl FnOnce() -> T) -> T {
    let _ftz = crate::flush::FlushToZero::new();
    f()
}

/// The `fast` form run from the initial state `initial` (`None`: zero; docs/math.md §7.1): `y`
/// and the final state. Base mixers (`S [B, H, Dv, Dk]`) take the same paths as [`fast`]
/// ([`super::ssd`] for the scalar decays, [`super::chunked`] for gated DeltaNet), started from
/// `H_0 = S_0ᵀ` and read at the end; the lifts (`S [B, H, L, Dv, Dk]`, `position [B]`) run
/// [`super::lift_state::run_head`] from their level states.
pub fn fast_from<F: VecMath>(
    m: &LogLinear,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    let (y, fin) = run(m, x, None, initial, true)?;
    Ok((y, fin.unwrap_or_default()))
}

/// [`fast_from`] for the base mixers, over the batch rows or the `packed` ranges (one state row
/// per sequence).
fn base_from<F: VecMath>(
    m: &LogLinear,
    x: &Tensors<F>,
    packed: Option<&[Range<usize>]>,
    initial: Option<&Tensors<F>>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    let s0 = common::state_tensor(m, initial)?;
    let x = common::standard(x);
    let (sz, layout, heads) = common::heads(m, &x, None, packed)?;
    let scalar = ssd::applies(m);
    let outs: Vec<(Mat<F>, Mat<F>)> = heads
        .par_iter()
        .with_min_len(min_len())
        .map(|hd| {
            let h0 = s0.map(|s| common::state_head(s, hd.b, hd.h));
            flushed(|| if scalar { ssd::run_head_from(m, hd, h0) } else { chunked::run_head_from(m, hd, h0) })
        })
        .collect::<Result<_>>()?;
    let views: Vec<_> = outs.iter().map(|(y, _)| if scalar { y.transpose() } else { y.as_ref() }).collect();
    let y = common::assemble(sz, &layout, &heads, &views);
    let mut fin = ArrayD::<F>::zeros(IxDyn(&[layout.len(), sz.h, sz.dv, sz.dk]));
    for (hd, (_, last)) in heads.iter().zip(&outs) {
        common::put_state(&mut fin, hd.b, hd.h, last.as_ref());
    }
    Ok((y, [(STATE.to_string(), fin)].into_iter().collect()))
}

/// [`fast_from`] for the lifts, over the batch rows or the `packed` ranges (one state row and
/// position per sequence).
fn lift_from<F: VecMath>(
    m: &LogLinear,
    x: &Tensors<F>,
    packed: Option<&[Range<usize>]>,
    initial: Option<&Tensors<F>>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    let x = common::standard(x);
    let lam = m.lambda_weights_ref(get(&x, "lambda")?, x.get("lambda_param"))?;
    let (sz, layout, heads) = common::heads(m, &x, Some(&lam), packed)?;
    let nl = lam.shape()[3];
    let (pos, s0) = lift_state::initial(initial, &layout)?;
    // Each job writes its final levels into its own block of the final state (no second copy of
    // the levels, and the new pages are touched in parallel).
    let mut fin = ArrayD::<F>::zeros(IxDyn(&[layout.len(), sz.h, nl, sz.dv, sz.dk]));
    let blocks = common::head_blocks(&mut fin, &heads, sz.h)?;
    let ys: Vec<Mat<F>> = heads
        .par_iter()
        .with_min_len(min_len())
        .zip(blocks)
        .map(|(hd, dst)| {
            let levels = lift_state::levels_of(s0, hd.b, hd.h, nl, sz.dk, sz.dv);
            let (y, last) = flushed(|| lift_state::run_head(m, hd, pos[hd.b], levels))?;
            store_slots(dst, &last)?;
            Ok(y)
        })
        .collect::<Result<_>>()?;
    let views: Vec<_> = ys.iter().map(Mat::as_ref).collect();
    let y = common::assemble(sz, &layout, &heads, &views);
    let fin_pos =
        (0..layout.len()).map(|i| F::of((pos[i] + layout.seq(i).1.len()) as f64)).collect::<Vec<F>>();
    let fin_pos = ArrayD::from_shape_vec(IxDyn(&[layout.len()]), fin_pos)
        .map_err(|e| Error::Numerical(e.to_string()))?;
    Ok((y, [(STATE.to_string(), fin), (POSITION.to_string(), fin_pos)].into_iter().collect()))
}
