//! Context parallelism over GPUs: one sequence split over `N` processes, one GPU each, joined by
//! NCCL (`mixers::context_parallel::Nccl`), forward and backward, checked against one process
//! running the whole sequence on one GPU, and timed.
//!
//! ```text
//! cargo run --release --example context_parallel_nccl -- [RANKS] [MIXER] [T]
//! ```
//! (defaults: 2 ranks, `gated-deltanet`, T = 4099; B = 1, H = 4, Dk = Dv = 32, f32, the exact
//! mode). The launcher starts `RANKS` copies of itself, copy `r` with `MIXERS_CUDA_DEVICE=r`
//! (needs `RANKS` GPUs; NCCL refuses two ranks on one GPU) and an id file in a fresh temporary
//! folder; each copy draws the same inputs (fixed seed), runs its part (`T/RANKS` tokens, the
//! last takes the rest), writes its `y` and gradients as `.npy` files, and prints its time. The
//! launcher then runs the whole sequence on device 0 and compares.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mixers::context_parallel::{Nccl, backward, forward};
use mixers::core::mixer::Mixer;
use mixers::core::state::segment;
use mixers::core::{Dims, Form, Precision, Requires, Tensors};
use mixers::registry::{Backend, mixer, state::backward_state, state::run_state};
use ndarray::{ArrayD, Axis, Dimension};
use ndarray_npy::{read_npy, write_npy};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Setup {
    ranks: usize,
    name: String,
    t: usize,
}

fn setup() -> Res<Setup> {
    let a: Vec<String> = std::env::args().skip(1).filter(|s| !s.starts_with("--")).collect();
    Ok(Setup {
        ranks: a.first().map_or(Ok(2), |s| s.parse())?,
        name: a.get(1).cloned().unwrap_or("gated-deltanet".into()),
        t: a.get(2).map_or(Ok(4099), |s| s.parse())?,
    })
}

/// The run's inputs (f32), the output's cotangent, and the mixer.
fn case(s: &Setup) -> Res<(Box<dyn Mixer>, Tensors<f32>, ArrayD<f32>)> {
    let m = mixer(&s.name, &serde_json::json!({"scale": 0.25}))?;
    let dims: Dims =
        [("B", 1), ("T", s.t), ("H", 4), ("Dk", 32), ("Dv", 32), ("C", 32)].into_iter().collect();
    let x = mixers::core::tensor::cast_tensors::<f32>(&m.random_inputs(&dims, 7)?);
    let mixed = &x[m.spec().mixed];
    let dy = ArrayD::from_shape_fn(mixed.raw_dim(), |i| {
        ((i[1] * 3 + i.slice().iter().sum::<usize>()) as f32 * 0.37).sin()
    });
    Ok((m, x, dy))
}

/// Rank `rank`'s tokens.
fn part(s: &Setup, rank: usize) -> std::ops::Range<usize> {
    let n = s.t / s.ranks;
    rank * n..if rank + 1 == s.ranks { s.t } else { (rank + 1) * n }
}

/// One rank: join, run its part forward and backward, write `y` and the gradients to `dir`.
fn rank(s: &Setup, rank: usize, dir: &Path) -> Res<()> {
    let comm = Nccl::rendezvous(rank, s.ranks, &dir.join("nccl-id"), Duration::from_secs(120))?;
    let (m, x, dy) = case(s)?;
    let cuda = Backend::by_name("cuda")?;
    let r = part(s, rank);
    let mine = segment(m.as_ref(), &x, r.clone())?;
    let dy = dy.slice_axis(Axis(1), r.into()).to_owned();
    let start = Instant::now();
    let (y, _) = forward(&comm, m.as_ref(), &cuda, &mine, None)?;
    let fwd = start.elapsed();
    let (grads, _) = backward(&comm, m.as_ref(), &cuda, &mine, None, &dy, None)?;
    let all = start.elapsed();
    println!(
        "rank {rank}: forward {:.1} ms, forward + backward {:.1} ms",
        fwd.as_secs_f64() * 1e3,
        all.as_secs_f64() * 1e3
    );
    write_npy(dir.join(format!("y.{rank}.npy")), &y)?;
    for (k, g) in grads {
        write_npy(dir.join(format!("{k}.{rank}.npy")), &g)?;
    }
    Ok(())
}

fn worst(got: &ArrayD<f32>, want: &ArrayD<f32>) -> f64 {
    let scale = want.iter().fold(0.0f64, |a, &v| a.max(f64::from(v).abs())).max(1e-30);
    got.iter().zip(want).fold(0.0f64, |a, (&g, &w)| a.max(f64::from(g - w).abs())) / scale
}

/// Waits for every rank; when one fails, stops the others (which would wait for it) and says so.
fn wait_all(mut children: Vec<std::process::Child>) -> Res<()> {
    let mut running: Vec<usize> = (0..children.len()).collect();
    while !running.is_empty() {
        let mut still = Vec::new();
        for r in running {
            match children[r].try_wait()? {
                None => still.push(r),
                Some(status) if status.success() => {}
                Some(status) => {
                    for c in &mut children {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    return Err(format!("rank {r} failed ({status}; its message is above)").into());
                }
            }
        }
        running = still;
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn launch(s: &Setup) -> Res<()> {
    let dir: PathBuf = std::env::temp_dir().join(format!("mixers-cp-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let me = std::env::current_exe()?;
    let children: Vec<_> = (0..s.ranks)
        .map(|r| {
            Command::new(&me)
                .args([s.ranks.to_string(), s.name.clone(), s.t.to_string()])
                .arg(format!("--rank={r}"))
                .arg(format!("--dir={}", dir.display()))
                .env("MIXERS_CUDA_DEVICE", r.to_string())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    wait_all(children)?;
    let (m, x, dy) = case(s)?;
    let cuda = Backend::by_name("cuda")?;
    let start = Instant::now();
    let (y, _) = run_state(m.as_ref(), &cuda, Form::Fast, &x, None, Precision::Exact)?;
    let fwd = start.elapsed();
    let (grads, _) = backward_state(m.as_ref(), &cuda, Form::Fast, &x, None, &dy, None, &Requires::All)?;
    let all = start.elapsed();
    println!(
        "one GPU: forward {:.1} ms, forward + backward {:.1} ms",
        fwd.as_secs_f64() * 1e3,
        all.as_secs_f64() * 1e3
    );
    let joined = |k: &str| -> Res<ArrayD<f32>> {
        let parts: Vec<ArrayD<f32>> =
            (0..s.ranks).map(|r| read_npy(dir.join(format!("{k}.{r}.npy")))).collect::<Result<_, _>>()?;
        Ok(ndarray::concatenate(Axis(1), &parts.iter().map(|a| a.view()).collect::<Vec<_>>())?)
    };
    let mut bad = 0;
    for (k, want) in std::iter::once(("y".to_string(), &y)).chain(grads.iter().map(|(k, g)| (k.clone(), g))) {
        let e = worst(&joined(&k)?, want);
        let ok = e < 1e-4;
        bad += usize::from(!ok);
        println!("{k}: max |split − whole| / max |whole| = {e:.2e} {}", if ok { "ok" } else { "DIFFERS" });
    }
    std::fs::remove_dir_all(&dir)?;
    if bad > 0 {
        return Err(format!("{bad} outputs differ").into());
    }
    Ok(())
}

fn main() -> Res<()> {
    let s = setup()?;
    let flag =
        |name: &str| std::env::args().find_map(|a| a.strip_prefix(&format!("--{name}=")).map(str::to_string));
    match (flag("rank"), flag("dir")) {
        (Some(r), Some(d)) => rank(&s, r.parse()?, Path::new(&d)),
        _ => launch(&s),
    }
}
