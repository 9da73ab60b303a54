//! What the candle op costs over the library: gated DeltaNet's forward through
//! `mixers_candle::ops::gated_deltanet` (on variables, so through the custom op and its packed
//! argument, and on plain tensors, which need no gradient and skip both) against
//! `mixers::ops::gated_deltanet` on the same values, and candle's `backward()` through the op against the library's backward
//! (`mixers::registry::call::backward`) for the same cotangent (`ȳ = 1`). Median of `REPS` runs each.
//!
//! ```sh
//! cargo run --release -p mixers-candle --example overhead
//! ```

use std::time::{Duration, Instant};

use candle_core::{Device, Tensor, Var};
use mixers::ndarray::{ArrayD, Ix3, Ix4};
use mixers::ops::{self, Options};
use mixers::prelude::{Form, Requires, Tensors};
use mixers::registry::call::Target;
use mixers::registry::{Backend, Sizes, call, grad_check::grad_inputs};

const REPS: usize = 15;

fn median(mut f: impl FnMut()) -> Duration {
    f();
    let mut t: Vec<Duration> = (0..REPS)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .collect();
    t.sort();
    t[REPS / 2]
}

fn main() -> candle_core::Result<()> {
    let cpu = Backend::by_name("cpu").map_err(candle_core::Error::wrap)?;
    println!(
        "| B | T | H | D | typed API forward | candle op forward, no gradient | candle op forward | library backward | candle forward + `backward()` |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (b, t, h, d) in [(1, 1000, 4, 64), (4, 2048, 8, 64), (2, 4096, 4, 128)] {
        let sizes = Sizes { batch: b, seq: t, channels: 1, heads: h, dk: d, dv: d };
        let m = ops::configured("gated-deltanet", &Options::default()).map_err(candle_core::Error::wrap)?;
        let x: Tensors<f32> = grad_inputs(m.as_ref(), &sizes, 1)
            .map_err(candle_core::Error::wrap)?
            .into_iter()
            .map(|(k, a)| (k, a.mapv(|v| v as f32)))
            .collect();
        let vars: Vec<(String, Var)> = x
            .iter()
            .map(|(k, a)| {
                let t = Tensor::from_vec(a.iter().copied().collect::<Vec<_>>(), a.shape(), &Device::Cpu)?;
                Ok((k.clone(), Var::from_tensor(&t)?))
            })
            .collect::<candle_core::Result<_>>()?;
        let var = |n: &str| vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_tensor()).unwrap();
        let a4 = |n: &str| x[n].view().into_dimensionality::<Ix4>().unwrap();
        let a3 = |n: &str| x[n].view().into_dimensionality::<Ix3>().unwrap();
        let opts = Options::default();
        let dy = ArrayD::<f32>::from_elem(x["v"].shape(), 1.0);

        let typed = median(|| {
            ops::gated_deltanet(a4("q"), a4("k"), a4("v"), a3("g"), a3("beta"), &opts).unwrap();
        });
        let plain: Vec<(String, Tensor)> =
            vars.iter().map(|(k, v)| (k.clone(), v.as_tensor().detach())).collect();
        let tensor = |n: &str| plain.iter().find(|(k, _)| k == n).map(|(_, t)| t).unwrap();
        let candle_plain = median(|| {
            mixers_candle::ops::gated_deltanet(
                tensor("q"),
                tensor("k"),
                tensor("v"),
                tensor("g"),
                tensor("beta"),
                &opts,
            )
            .unwrap();
        });
        let candle = median(|| {
            mixers_candle::ops::gated_deltanet(var("q"), var("k"), var("v"), var("g"), var("beta"), &opts)
                .unwrap();
        });
        let lib_bwd = median(|| {
            let at = Target::new(m.as_ref(), &cpu, Form::Fast);
            call::backward(at, &x, None, &dy, None, &Requires::All, Default::default()).unwrap();
        });
        let candle_bwd = median(|| {
            let y = mixers_candle::ops::gated_deltanet(
                var("q"),
                var("k"),
                var("v"),
                var("g"),
                var("beta"),
                &opts,
            )
            .unwrap();
            y.sum_all().unwrap().backward().unwrap();
        });
        let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
        println!(
            "| {b} | {t} | {h} | {d} | {} | {} | {} | {} | {} |",
            ms(typed),
            ms(candle_plain),
            ms(candle),
            ms(lib_bwd),
            ms(candle_bwd)
        );
    }
    Ok(())
}
