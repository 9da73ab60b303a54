//! Packed variable-length batches of linear attention, Mamba-2 and gated DeltaNet in one launch
//! sequence (docs/math.md §7.2): the sequences of `cu_seqlens` (`B = 1`) run as one batch whose
//! chunking restarts at every sequence start — a chunk table (`ChunkTable`) tells the chunk
//! kernels (the chunk states, the WY pieces, the outputs) each chunk's first token, length and
//! whether it starts its sequence, and the per-(row, head) passes (the scan, the walk, gated
//! DeltaNet's register passes) walk each sequence's chunks from its own row of the initial state
//! and write its own row of the final state. Every chunk is the chunk a sequence run alone has,
//! with the same operands in the same order, so the batch equals the sequences run one by one bit
//! for bit — at the cost of one run over the total length instead of one run per sequence.
//!
//! It serves f32 arithmetic (f32 or bf16 activations; f64 runs chunks of 32) without a lift: linear
//! attention and Mamba-2 in every mode (every output kernel without a lift — `llc_out`,
//! `llc_out_tc`, `llc_out_direct_tc` — takes the table), gated DeltaNet where its plan takes a
//! register state pass (`llc_delta_h_rg`, `llc_delta_h_rb`, which take it, after `llc_wy_tc`);
//! elsewhere `run` says `None` and the caller runs the sequences one by one
//! (`crate::device_packed`).

use std::borrow::Cow;

use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::{Precision, Result};

use super::common::{ChunkTable, Device, Elem, Storage, table_grids};
use super::fast::{Path, Plan, chunked_inputs, delta_bf16, plan, run_delta, storage};
use super::ssd;
use super::state_pass::StatePass;
use crate::forms::{finish, input, input_opt};
use crate::tensor::{AnyDeviceTensor, DeviceTensor, DeviceTensors};

/// The plan of a packed batch `cu` of `[1, T, H, Dk]` activations (`Dv` value columns) stored as
/// `storage`, in mode `p` on `device`, in one launch sequence; `None` where this path does not
/// serve `ll`, the mode or the sizes. It is the `fast` plan of the sequences as `N` rows of the
/// longest length (so the walk's and the state pass's rules count (sequence, head) blocks) with
/// its launches on the chunk table's grids.
pub fn plan_packed(
    ll: &LogLinear,
    [_, h, dk, dv]: [usize; 4],
    cu: &[usize],
    p: Precision,
    storage: Storage,
    device: Device,
) -> Result<Option<Plan>> {
    // Chunks of 64 tokens: f32 arithmetic (f64 runs chunks of 32).
    let served = ll.lift.is_none() && storage != Storage::Real(Elem::F64);
    let n = cu.len().saturating_sub(1);
    let longest = cu.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    if !served || longest == 0 {
        return Ok(None);
    }
    let mut pl = plan(ll, [n, longest, h, dk, dv], p, storage, device)?;
    let table_path = match pl.path {
        Path::Ssd | Path::SsdBf16 => true,
        Path::Delta | Path::DeltaBf16 => pl.state_pass.is_some_and(StatePass::in_registers),
        _ => false,
    };
    if !table_path {
        return Ok(None);
    }
    pl.launches = table_grids(&pl.launches, ChunkTable::count(cu), n, h);
    Ok(Some(pl))
}

/// `y` `[1, T, H, Dv]` (zero past the last offset) and, with `want_final`, the final states
/// `[N, H, Dv, Dk]` of the packed batch `cu` (offsets checked by the caller against `T`), every
/// sequence from its row of `s0` (`[N, H, Dv, Dk]`, f32; `None`: zero); `None` where
/// [`plan_packed`] says so.
pub(crate) fn run(
    ll: &LogLinear,
    x: &DeviceTensors,
    cu: &[usize],
    s0: Option<&DeviceTensor<f32>>,
    want_final: bool,
    p: Precision,
) -> Result<Option<(AnyDeviceTensor, Option<DeviceTensor<f32>>)>> {
    let (Some(q), Some(v)) = (x.get("q"), x.get("v")) else {
        return Ok(None);
    };
    let (&[1, t, h, dk], &[_, _, _, dv]) = (q.shape(), v.shape()) else {
        return Ok(None);
    };
    let n = cu.len().saturating_sub(1);
    let Some(pl) = plan_packed(ll, [t, h, dk, dv], cu, p, storage::<f32>(x), Device::current())? else {
        return Ok(None);
    };
    let table = ChunkTable::upload(cu)?;
    let launches = &pl.launches;
    match (pl.path, pl.state_pass) {
        (Path::SsdBf16, _) => {
            let g = if ll.base.has_decay() { input_opt::<f32>(x, "g")? } else { None };
            let launches = (&launches[..], ssd::Bf16States::Bf16);
            let (y, fin, _) = ssd::run_bf16(ll, x, g.as_deref(), launches, s0, want_final, Some(&table))?;
            return Ok(Some((y, fin)));
        }
        (Path::DeltaBf16, Some(pass)) => {
            return delta_bf16(ll, x, pass, launches, s0, want_final, Some(&table)).map(Some);
        }
        _ => {}
    }
    let qkv: (Cow<'_, DeviceTensor<f32>>, _, _) = (input(x, "q")?, input(x, "k")?, input(x, "v")?);
    let inp = chunked_inputs(ll, x, qkv, [1, t, h, dk, dv])?;
    let (y, fin) = match (pl.path, pl.state_pass) {
        (Path::Delta, Some(pass)) => run_delta(ll, &inp, pass, launches, s0, want_final, Some(&table))?,
        _ => ssd::run(ll, &inp, launches, s0, want_final, Some(&table)).map(|(y, p)| (y, p.fin))?,
    };
    let fin = fin.map(|f| DeviceTensor::from_pooled(f, &[n, h, dv, dk])).transpose()?;
    Ok(Some((finish(DeviceTensor::from_pooled(y, &[1, t, h, dv])?, p)?, fin)))
}

#[cfg(test)]
mod tests {
    use mixer_core::mixers::loglinear::{LambdaScheme, LevelMask, Lift};

    use mixer_core::mixers::loglinear::Base;

    use super::*;

    const F: i32 = 1 << 16;

    fn mixer(lifted: bool) -> LogLinear {
        let lift = lifted.then(|| Lift { mask: LevelMask::fenwick(), lambda: LambdaScheme::identity() });
        LogLinear::new("m", Base::Mamba2, lift, 0.125, 64).unwrap()
    }

    /// The path and launches of [`plan_packed`].
    fn launches(
        ll: &LogLinear,
        dims: [usize; 4],
        cu: &[usize],
        p: Precision,
        st: Storage,
        d: Device,
    ) -> Result<Option<(Path, Vec<crate::loglinear::common::Launch>)>> {
        Ok(plan_packed(ll, dims, cu, p, st, d)?.map(|pl| (pl.path, pl.launches)))
    }

    #[test]
    fn the_chunk_table_restarts_the_chunking_at_every_sequence() {
        // An empty sequence, one token, 65 tokens (two chunks), 64 tokens (one).
        let tab = ChunkTable::host(&[0, 0, 1, 66, 130]).unwrap();
        let (starts, lens, firsts, order) = (&tab[..4], &tab[4..8], &tab[8..13], &tab[13..]);
        assert_eq!(starts, [0, 1, 65, 66]);
        assert_eq!(lens, [1 | F, 64 | F, 1, 64 | F]);
        assert_eq!(firsts, [0, 0, 1, 3, 4]);
        // Two chunks, then the one-chunk sequences in order, the empty one last.
        assert_eq!(order, [2, 1, 3, 0]);
        assert_eq!(ChunkTable::host(&[0]).unwrap(), [0]);
    }

    #[test]
    fn packed_batches_of_the_base_mixers_take_one_launch_sequence_on_the_table() {
        let (m, st) = (mixer(false), Storage::Real(Elem::F32));
        // 60 sequences of 100 tokens, H = 4, D = 64: 240 (sequence, head) blocks walk.
        let cu: Vec<usize> = (0..=60).map(|i| 100 * i).collect();
        let (path, l) =
            launches(&m, [6000, 4, 64, 64], &cu, Precision::Tf32, st, Device::H200).unwrap().unwrap();
        assert_eq!(path, Path::Ssd);
        assert_eq!(
            l.iter().map(|l| l.function.as_str()).collect::<Vec<_>>(),
            ["llc_walk_tc_f32", "llc_out_direct_tc_f32"]
        );
        assert_eq!((l[0].grid, l[1].grid), ([1, 240, 1], [120, 4, 1]));
        // Three sequences: the states over the table's chunks, the scan over (sequence, head).
        let bf = Storage::Bf16 { aligned: true };
        let (path, l) =
            launches(&m, [300, 4, 64, 64], &[0, 100, 130, 300], Precision::Bf16, bf, Device::H200)
                .unwrap()
                .unwrap();
        assert_eq!(path, Path::SsdBf16);
        assert_eq!((l[0].function.as_str(), l[0].grid), ("llc_states_tc_bf16", [2 + 1 + 3, 4, 1]));
        assert_eq!((l[1].function.as_str(), l[1].grid[1]), ("llc_scan_hb", 12));
        assert_eq!(l[2].grid, [6, 4, 1]);
        // The exact mode (FMA kernels) and Dk above the direct kernel's 128 (llc_out_tc) too.
        let cu = [0, 100, 300];
        let functions = |dk, p| -> Vec<String> {
            let (_, l) = launches(&m, [300, 4, dk, 64], &cu, p, st, Device::H200).unwrap().unwrap();
            l.into_iter().map(|l| l.function).collect()
        };
        assert_eq!(functions(64, Precision::Exact), ["llc_states_f32", "llc_scan_f32", "llc_out_f32"]);
        assert_eq!(functions(136, Precision::Tf32)[2], "llc_out_tc_f32");
        // Not served: f64 (chunks of 32), a lift, only empty sequences.
        let none = |m: &LogLinear, p, st, cu: &[usize]| {
            launches(m, [300, 4, 64, 64], cu, p, st, Device::H200).unwrap().is_none()
        };
        assert!(none(&m, Precision::Exact, Storage::Real(Elem::F64), &cu));
        assert!(none(&mixer(true), Precision::Tf32, st, &cu));
        assert!(none(&m, Precision::Tf32, st, &[0, 0, 0]));
    }

    #[test]
    fn packed_batches_of_gated_deltanet_take_the_register_passes_on_the_table() {
        let m = LogLinear::new("m", Base::GatedDeltaNet, None, 0.125, 64).unwrap();
        let (f32s, bf) = (Storage::Real(Elem::F32), Storage::Bf16 { aligned: true });
        // 60 sequences of 100 tokens, H = 4, D = 64: 240 (sequence, head) rows of the pass.
        let cu: Vec<usize> = (0..=60).map(|i| 100 * i).collect();
        let (path, l) =
            launches(&m, [6000, 4, 64, 64], &cu, Precision::Tf32, f32s, Device::H200).unwrap().unwrap();
        assert_eq!(path, Path::Delta);
        let names: Vec<&str> = l.iter().map(|l| l.function.as_str()).collect();
        assert_eq!(names, ["llc_wy_tc_f32", "llc_delta_h_rg_f32", "llc_out_direct_tc_f32"]);
        assert_eq!((l[0].grid, l[1].grid[0], l[2].grid), ([120, 4, 1], 240, [120, 4, 1]));
        let (path, l) =
            launches(&m, [6000, 4, 64, 64], &cu, Precision::Bf16, bf, Device::H200).unwrap().unwrap();
        assert_eq!((path, l[1].function.as_str()), (Path::DeltaBf16, "llc_delta_h_rb_bf16"));
        // The exact mode's FMA pass, and few rows (the shared-memory pass), take no table.
        assert!(
            launches(&m, [6000, 4, 64, 64], &cu, Precision::Exact, f32s, Device::H200).unwrap().is_none()
        );
        assert!(
            launches(&m, [300, 1, 64, 64], &[0, 100, 300], Precision::Tf32, f32s, Device::H200)
                .unwrap()
                .is_none()
        );
    }
}
