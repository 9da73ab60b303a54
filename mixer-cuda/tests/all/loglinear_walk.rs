//! The walk over chunks (`llc_walk_tc`: linear attention's and Mamba-2's chunk states and scan in
//! one launch, the tf32 and bf16 modes) against the states and the scan it replaces, bit for bit.

use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::tensor::cast_tensors;
use mixer_core::{Dims, Precision};
use mixer_cuda::loglinear::fast::run_planned_for;
use mixer_cuda::loglinear::{Device, Elem, Storage, plan};
use mixer_cuda::{AnyDeviceTensor, DeviceTensor};
use mixer_registry::run::bf16_activations;

use super::common;

/// `y` of a device run as f32 bits on the host, whatever its dtype (bf16 widened exactly).
fn host_bits(y: &AnyDeviceTensor) -> Vec<u32> {
    match y {
        AnyDeviceTensor::Bf16(y) => y.to_host().unwrap().iter().map(|v| v.to_f32().to_bits()).collect(),
        AnyDeviceTensor::F32(y) => y.to_host().unwrap().iter().map(|v| v.to_bits()).collect(),
        AnyDeviceTensor::F64(_) => panic!("an f64 output in a tensor-core mode"),
    }
}

/// Linear attention and Mamba-2 in the tf32 and bf16 modes, with and without an initial state
/// and a final state: the plans for a device of one multiprocessor (which takes the walk with 64
/// value columns a block at every shape here), for one with just too many for that (the walk
/// with 32 columns) and for one with very many (which never walks) write the same `y` and final
/// state bit for bit — the walk forms each chunk state with the same tensor-core operands
/// and order as `llc_states_tc` and chains them with `llc_scan`'s fma. Shapes: one chunk, one
/// partial chunk, chunks plus a partial one; key dims 64, 100, 128 and 130 (three key tiles),
/// value dims 48, 64, 72 and 200 (four value tiles), one and several (batch, head) pairs.
#[test]
#[ignore = "needs a CUDA device"]
fn the_walk_over_chunks_equals_the_chunk_states_and_the_scan_bit_for_bit() {
    let Some(_turn) = common::gpu() else {
        return;
    };
    let here = Device::current();
    let (few, many) = (Device { sms: 1, ..here }, Device { sms: 1 << 30, ..here });
    for name in ["linear-attention", "mamba2"] {
        let m = mixer_registry::mixer(name, &serde_json::json!({})).unwrap();
        let ll = m.as_any().downcast_ref::<LogLinear>().unwrap();
        for (b, h, dk, dv) in [
            (1usize, 2usize, 64usize, 64usize),
            (2, 3, 128, 128),
            (1, 2, 100, 72),
            (1, 1, 130, 48),
            (1, 2, 64, 200),
        ] {
            // Just too many multiprocessors for 64-column blocks (1.5 per multiprocessor).
            let blocks32 = dk.div_ceil(64) * dv.div_ceil(32) * b * h;
            let mid = Device { sms: 2 * blocks32 / 3, ..here };
            for t in [1, 63, 64, 1000] {
                let dims: Dims = [("B", b), ("T", t), ("H", h), ("Dk", dk), ("Dv", dv)].into_iter().collect();
                let x = cast_tensors::<f32>(&m.random_inputs(&dims, 3 + t as u64).unwrap());
                let s0 = cast_tensors::<f32>(&m.random_state(&dims, 4).unwrap());
                let s0 = DeviceTensor::<f32>::upload(&s0["S"]).unwrap();
                for p in [Precision::Tf32, Precision::Bf16] {
                    let (x, storage) = if p == Precision::Bf16 {
                        (bf16_activations(&x), Storage::Bf16 { aligned: true })
                    } else {
                        (x.clone(), Storage::Real(Elem::F32))
                    };
                    let first = |d| plan(ll, [b, t, h, dk, dv], p, storage, d).unwrap().launches.remove(0);
                    let (wide, narrow, split) = (first(few), first(mid), first(many));
                    for (l, vt) in [(&wide, "LLW_VT=64"), (&narrow, "LLW_VT=32")] {
                        let walks =
                            l.function.starts_with("llc_walk_tc") && l.defines.iter().any(|d| d == vt);
                        assert!(walks, "{name} {p} {dims:?}: {l:?}");
                    }
                    assert!(split.function.starts_with("llc_states_tc"), "{name} {p} {dims:?}: {split:?}");
                    let dev = mixer_cuda::forms::upload_inputs(&x, p).unwrap();
                    let bits = |f: Option<DeviceTensor<f32>>| {
                        f.map(|f| f.to_host().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>())
                    };
                    for (s0, want_final) in [(None, false), (Some(&s0), true)] {
                        let run = |d| run_planned_for::<f32>(ll, &dev, p, s0, want_final, d).unwrap();
                        let (ys, fs) = run(many);
                        for d in [few, mid] {
                            let (yw, fw) = run(d);
                            let what = format!("{name} {p} {dims:?} {d:?} from a state: {}", s0.is_some());
                            assert_eq!(host_bits(&yw), host_bits(&ys), "{what}: y");
                            assert_eq!(bits(fw), bits(fs.clone()), "{what}: final state");
                        }
                    }
                }
            }
        }
    }
}
