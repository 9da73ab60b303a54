// A pre-norm block (RMSNorm → Mamba-2 → residual → RMSNorm → MLP → residual), forward only,
// written against the typed API `mixers::ops`. `--cpu` / `--cuda` pick the backend (default:
// CUDA when present, else the CPU). Run: cargo run --release --example prenorm_block -- --cpu
use mixers::ndarray::{Array2, Array3, Axis, s};
use mixers::ops::{self, Options};
use mixers::prelude::Backend;

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// `h = x + W_o·mamba2(norm(x))`, `out = h + W_2·gelu(W_1·norm(h))`, with `q, k, v, g`
/// projected from `norm(x)` and the log-decay `g = −softplus(·) ≤ 0`.
struct Block {
    heads: usize,
    dk: usize,
    dv: usize,
    w_q: Array2<f32>, // [D, H·Dk]
    w_k: Array2<f32>, // [D, H·Dk]
    w_v: Array2<f32>, // [D, H·Dv]
    w_g: Array2<f32>, // [D, H]
    w_o: Array2<f32>, // [H·Dv, D]
    w_1: Array2<f32>, // [D, 4D]
    w_2: Array2<f32>, // [4D, D]
    opts: Options,
}

/// A fixed pseudo-random `[rows, cols]` matrix with entries of size ~`1/√rows`.
fn init(rows: usize, cols: usize, seed: usize) -> Array2<f32> {
    let s = 1.0 / (rows as f32).sqrt();
    Array2::from_shape_fn((rows, cols), |(i, j)| s * ((i * 7919 + j * 104_729 + seed * 31) as f32).sin())
}

/// RMSNorm over the last axis of `[N, D]` rows (unit gain).
fn rms_norm(x: &Array2<f32>) -> Array2<f32> {
    let mut y = x.clone();
    for mut row in y.rows_mut() {
        let r = (row.mapv(|v| v * v).mean().unwrap_or(0.0) + 1e-6).sqrt();
        row /= r;
    }
    y
}

fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
}

impl Block {
    fn new(d: usize, heads: usize, dk: usize, dv: usize, opts: Options) -> Self {
        Block {
            heads,
            dk,
            dv,
            w_q: init(d, heads * dk, 1),
            w_k: init(d, heads * dk, 2),
            w_v: init(d, heads * dv, 3),
            w_g: init(d, heads, 4),
            w_o: init(heads * dv, d, 5),
            w_1: init(d, 4 * d, 6),
            w_2: init(4 * d, d, 7),
            opts,
        }
    }

    /// `x [B, T, D]` → `[B, T, D]`.
    fn forward(&self, x: &Array3<f32>) -> Res<Array3<f32>> {
        let (b, t, d) = x.dim();
        let (h, dk, dv) = (self.heads, self.dk, self.dv);
        let x = x.as_standard_layout().into_owned().into_shape_with_order((b * t, d))?;
        let n = rms_norm(&x);
        let q = n.dot(&self.w_q).into_shape_with_order((b, t, h, dk))?;
        let k = n.dot(&self.w_k).into_shape_with_order((b, t, h, dk))?;
        let v = n.dot(&self.w_v).into_shape_with_order((b, t, h, dv))?;
        let g = n.dot(&self.w_g).mapv(|z| -(z.exp().ln_1p())).into_shape_with_order((b, t, h))?;
        let y = ops::mamba2(q.view(), k.view(), v.view(), g.view(), &self.opts)?; // [B, T, H, Dv]
        let mixed = x + y.into_shape_with_order((b * t, h * dv))?.dot(&self.w_o);
        let mlp = rms_norm(&mixed).dot(&self.w_1).mapv(gelu).dot(&self.w_2);
        Ok((mixed + mlp).into_shape_with_order((b, t, d))?)
    }
}

pub fn run(backend: Backend) -> Res<()> {
    let block = Block::new(48, 3, 16, 16, Options::default().backend(backend));
    let (b, t, d) = (2, 150, 48);
    let x = Array3::from_shape_fn((b, t, d), |(i, s, c)| ((i * 13 + s * 5 + c) as f32 * 0.37).sin());
    let y = block.forward(&x)?;
    // Causality: editing the last token changes its output and no earlier one.
    let mut x2 = x.clone();
    x2.index_axis_mut(Axis(1), t - 1).fill(3.0);
    let diff = (&block.forward(&x2)? - &y).mapv(f32::abs); // [B, T, D]
    let before = diff.slice(s![.., ..t - 1, ..]).fold(0.0f32, |m, &e| m.max(e));
    let last = diff.index_axis(Axis(1), t - 1).sum();
    println!(
        "backend {}: y {:?}, rms {:.4}",
        backend.name(),
        y.dim(),
        y.mapv(|e| e * e).mean().unwrap_or(0.0).sqrt()
    );
    println!("max change before the edited token {before:e}, change at it {last:.3}");
    if before > 1e-5 || last == 0.0 {
        return Err("the block is not causal".into());
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let backend = if args.iter().any(|a| a == "--cuda") {
        Backend::by_name("cuda")
    } else if args.iter().any(|a| a == "--cpu") {
        Backend::by_name("cpu")
    } else {
        Backend::auto()
    };
    if let Err(e) = backend.map_err(Into::into).and_then(run) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
