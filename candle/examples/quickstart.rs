use candle_core::{Device, Tensor, Var};
use mixers_candle::{Options, ops};

fn main() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    let (b, t, h, dk, dv) = (2, 100, 4, 16, 16);
    let q = Var::from_tensor(&Tensor::randn(0f32, 1., (b, t, h, dk), &dev)?)?;
    let k = Tensor::randn(0f32, 1., (b, t, h, dk), &dev)?;
    let k = k.broadcast_div(&k.sqr()?.sum_keepdim(3)?.sqrt()?)?; // unit keys
    let v = Var::from_tensor(&Tensor::randn(0f32, 1., (b, t, h, dv), &dev)?)?;
    let g = (Tensor::rand(0f32, 1., (b, t, h), &dev)? * -0.1)?; // log decay ≤ 0
    let beta = Tensor::rand(0f32, 1., (b, t, h), &dev)?; // in [0, 1]
    let opts = Options::default().scale(1.0 / (dk as f64).sqrt());

    let y = ops::gated_deltanet(&q, &k, &v, &g, &beta, &opts)?; // y [B, T, H, Dv]
    let (y2, s) = ops::gated_deltanet_state(&q, &k, &v, &g, &beta, None, &opts)?; // and S_T [B, H, Dv, Dk]
    let grads = (y.sqr()?.sum_all()? + s.sqr()?.sum_all()?)?.backward()?; // the library's CPU backward
    assert_eq!(grads.get(&q).unwrap().dims(), &[b, t, h, dk]);
    assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, y2.flatten_all()?.to_vec1::<f32>()?); // the same y
    Ok(())
}
