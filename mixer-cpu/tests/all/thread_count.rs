//! The backward passes whose gradients sum over parallel work (attention's `q̄` over key blocks,
//! the Toeplitz `w̄` over columns) give the same bits on one thread and on several: their partial
//! sums are formed over fixed groups and added in a fixed order, not in the order in which
//! rayon's threads happen to finish (which differs between runs and between thread counts).

use mixer_core::mixers::attention::Attention;
use mixer_core::mixers::toeplitz::Toeplitz;
use mixer_core::{Dims, Requires, Tensors};
use mixer_registry::mixer;
use ndarray::ArrayD;
use serde_json::json;

fn on_threads<T: Send>(n: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap().install(f)
}

fn f32s(x: &Tensors<f64>) -> Tensors<f32> {
    x.iter().map(|(k, v)| (k.clone(), v.mapv(|e| e as f32))).collect()
}

fn same_on_1_and_4_threads(what: &str, run: impl Fn() -> Tensors<f32> + Sync) {
    let one = on_threads(1, &run);
    for _ in 0..3 {
        let four = on_threads(4, &run);
        for (k, v) in &one {
            assert_eq!(&four[k], v, "{what}: {k} differs between 1 and 4 threads");
        }
    }
}

#[test]
fn attention_and_toeplitz_backwards_give_the_same_bits_on_any_thread_count() {
    // Attention: T = 1000 is 8 key blocks of 128, so q̄ sums 8 groups.
    let m = mixer("attention", &json!({})).unwrap();
    let a = mixer_core::mixer::downcast::<Attention>(m.as_ref(), "test").unwrap();
    let dims: Dims = [("B", 2), ("T", 1000), ("H", 2), ("Dk", 8), ("Dv", 8)].into_iter().collect();
    let x = f32s(&m.random_inputs(&dims, 3).unwrap());
    let dy = ArrayD::from_shape_fn(x["v"].raw_dim(), |i| ((i[1] * 7 + i[3]) as f32 * 0.37).sin());
    same_on_1_and_4_threads("attention", || {
        mixer_cpu::attention::backward::vjp(a, &x, &dy, &Requires::All).unwrap()
    });
    // Toeplitz with one kernel per head: 3 × 24 columns in 16 groups.
    let m = mixer("toeplitz", &json!({"heads": 2})).unwrap();
    let tm = mixer_core::mixer::downcast::<Toeplitz>(m.as_ref(), "test").unwrap();
    let dims: Dims = [("B", 3), ("T", 300), ("C", 24)].into_iter().collect();
    let x = f32s(&m.random_inputs(&dims, 4).unwrap());
    let dy = ArrayD::from_shape_fn(x["x"].raw_dim(), |i| ((i[1] * 5 + i[2]) as f32 * 0.29).cos());
    same_on_1_and_4_threads("toeplitz", || {
        mixer_cpu::toeplitz::backward::vjp(tm, &x, &dy, &Requires::All).unwrap()
    });
}
