//! `mixers bench --packed N,…`: the cost of a packed batch (docs/math.md §7.2) against one
//! sequence of the same total length. Per mixer, backend, `T` and count `N`: the inputs of one
//! batch row of `T` tokens (`Mixer::random_inputs`), and `N` sequences of random lengths filling
//! it ([`random_offsets`], seeded by `--seed`; empty sequences excluded). The fast form runs the
//! row once as one sequence and once as the packed batch ([`mixer_registry::call::forward`],
//! the entry point of the command line and the Python package), in `--precision`'s mode; where
//! the backend has a fast backward, both backwards run too (exact mode: the packed backward
//! takes no other) from one standard-normal cotangent. With `--states` both runs start from random
//! initial states (`Mixer::random_state`, one row per sequence for the batch; the lifts' with
//! [`SPARE_LEVELS`] levels of room, so they start from populated levels), return their final
//! states, and the backwards take random cotangents of those (every entry): the path of chunked prefill and of
//! truncated backpropagation through time. Median of `reps` timed runs after one
//! untimed run, wall time of the host-array calls (validation included; on a device backend,
//! the copies to and from the device too).

use mixer_core::mixer::{Mixer, complete_dims};
use mixer_core::spec::{Gen, draw};
use mixer_core::state::{no_state, random};
use mixer_core::tensor::cast_tensors;
use mixer_core::{DType, Dims, Error, Form, Precision, Requires, Result, Tensors};
use mixer_registry::Backend;
use mixer_registry::backward::backward_forms;
use mixer_registry::call::{Target, backward, forward};
use mixer_registry::family::Scalar;
use mixers::ndarray::ArrayD;
use rand::SeedableRng;

use super::{Options, default_mixers, label, sizes};
use crate::table::markdown;
use mixers::timing::time;

/// `cu_seqlens` of `n` non-empty sequences of random lengths filling `t` tokens: `n − 1`
/// distinct cut points drawn uniformly from `1 .. t − 1`. Errors when `n` is 0 or above `t`.
pub fn random_offsets(t: usize, n: usize, seed: u64) -> Result<Vec<usize>> {
    if n == 0 || n > t {
        return Err(Error::Io(format!("--packed: a count of sequences must be in 1..=T = {t}, given {n}")));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x9ac4);
    let mut cuts: Vec<usize> =
        rand::seq::index::sample(&mut rng, t - 1, n - 1).into_iter().map(|c| c + 1).collect();
    cuts.sort_unstable();
    Ok(std::iter::once(0).chain(cuts).chain(std::iter::once(t)).collect())
}

/// Medians (seconds) of one row: forward as one sequence and packed, and the same for the
/// backward (`None` without a fast backward on the backend).
struct Times {
    one: f64,
    packed: f64,
    backward: Option<(f64, f64)>,
}

/// With `--states`: the initial states and the final states' cotangents of the one sequence
/// (`B = 1`) and of the packed batch (one row per sequence).
struct States<F> {
    one: (Tensors<F>, Tensors<F>),
    rows: (Tensors<F>, Tensors<F>),
}

impl<F: Scalar> States<F> {
    /// Random states (`Mixer::random_state`) for `n` sequences of the sizes `dims` (`B = 1`),
    /// and cotangents of the final states with every entry drawn from `[−1, 1)`
    /// (`mixer_core::state::random`: a valid state's empty slots, e.g. a lift's levels above
    /// its position, would make its cotangent partly zero).
    fn draw(m: &dyn Mixer, dims: &Dims, n: usize, seed: u64) -> Result<Self> {
        let mut rows = dims.clone();
        rows.insert("B", n);
        let pair = |d: &Dims, s: u64| -> Result<(Tensors<F>, Tensors<F>)> {
            let shapes = m.state_shapes(d).map_err(|why| no_state(m.name(), &why))?;
            Ok((cast_tensors::<F>(&m.random_state(d, s)?), cast_tensors::<F>(&random(&shapes, s + 1))))
        };
        Ok(States { one: pair(dims, seed)?, rows: pair(&rows, seed + 2)? })
    }
}

#[allow(clippy::too_many_arguments)]
fn measure<F: Scalar>(
    m: &dyn Mixer,
    b: &Backend,
    x: &Tensors<F>,
    dy: &ArrayD<F>,
    cu: &[usize],
    states: Option<(&Dims, u64)>,
    with_backward: bool,
    opts: &Options,
) -> Result<Times> {
    let states = states.map(|(dims, seed)| States::<F>::draw(m, dims, cu.len() - 1, seed)).transpose()?;
    let states = states.as_ref();
    let (reps, budget) = (opts.reps, opts.max_seconds);
    let at = Target::new(m, b, Form::Fast);
    let (one, rows) = (states.map(|s| &s.one), states.map(|s| &s.rows));
    let mut err = None;
    let mut fwd = |t: Target<'_>, s: Option<&(Tensors<F>, Tensors<F>)>, p: Precision| {
        let s0 = s.map(|s| &s.0);
        time(1, reps, budget, || forward(t, x, s0, s0.is_some(), p).map_err(|e| err = Some(e))).median
    };
    let t_one = fwd(at, one, opts.precision);
    let t_packed = fwd(at.packed(Some(cu)), rows, opts.precision);
    if let Some(e) = err.take() {
        return Err(e);
    }
    let backward = if with_backward {
        let mut bwd = |t: Target<'_>, s: Option<&(Tensors<F>, Tensors<F>)>| {
            let (s0, df) = (s.map(|s| &s.0), s.map(|s| &s.1));
            time(1, reps, budget, || {
                backward(t, x, s0, dy, df, &Requires::All, Precision::Exact).map_err(|e| err = Some(e))
            })
            .median
        };
        let pair = (bwd(at, one), bwd(at.packed(Some(cu)), rows));
        if let Some(e) = err {
            return Err(e);
        }
        Some(pair)
    } else {
        None
    };
    Ok(Times { one: t_one, packed: t_packed, backward })
}

/// Levels `L` to spare for runs from states: a lift's random state sits at a position in
/// `1 … 2^(L−1) − T` (`Mixer::random_state`), so with the fewest levels `T` needs it would sit at
/// 0 with every level empty; two more levels put it at a small nonzero position with
/// populated levels, and the run crosses chunk boundaries after a head of its own.
const SPARE_LEVELS: usize = 2;

/// The sizes of the inputs: the completed sizes `dims`, and with `--states` [`SPARE_LEVELS`]
/// more levels than `T` needs for a mixer with levels (the log-linear lifts).
fn room_for_states(mut dims: Dims, with_states: bool) -> Dims {
    if with_states && let Some(&l) = dims.get("L") {
        dims.insert("L", l + SPARE_LEVELS);
    }
    dims
}

/// Lengths measured when `--seq` is left at its default.
pub const DEFAULT_SEQS: [usize; 2] = [4096, 16384];

/// Runs the measurement and prints one table; exit code 1 when a run failed.
pub(crate) fn run(opts: &Options, counts: &[usize], with_states: bool) -> Result<i32> {
    super::check_options(opts)?;
    if opts.batch != 1 {
        return Err(Error::Io(format!(
            "--packed runs one batch row holding the sequences (B = 1, as cu_seqlens requires), given --batch {}",
            opts.batch
        )));
    }
    let mixers = if opts.mixers.is_empty() { default_mixers(opts.heads) } else { opts.mixers.clone() };
    let backends: Vec<Backend> = if opts.backends.is_empty() {
        Backend::available()
    } else {
        opts.backends.iter().map(|b| Backend::by_name(b)).collect::<Result<_>>()?
    };
    let (mut rows, mut failed) = (Vec::new(), 0);
    for (name, cfg) in &mixers {
        let m = mixer_registry::mixer(name, cfg)?;
        let lab = label(name, cfg);
        for b in &backends {
            let with_backward = backward_forms(m.as_ref(), b.name()).contains(&Form::Fast);
            for &seq in &opts.seqs {
                let dims = room_for_states(complete_dims(m.as_ref(), &sizes(opts, seq).dims()), with_states);
                let x = m.random_inputs(&dims, opts.seed)?;
                let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed ^ 0xb4c);
                let dy = draw(Gen::Normal(1.0), x[m.spec().mixed].shape(), &mut rng);
                for &n in counts {
                    let cu = random_offsets(seq, n, opts.seed)?;
                    let states = with_states.then_some((&dims, opts.seed ^ 0x57a7));
                    let r = match opts.dtype {
                        DType::F64 => measure(m.as_ref(), b, &x, &dy, &cu, states, with_backward, opts),
                        DType::F32 => {
                            let (x, dy) = (cast_tensors::<f32>(&x), dy.mapv(|v| v as f32));
                            measure(m.as_ref(), b, &x, &dy, &cu, states, with_backward, opts)
                        }
                    };
                    let mut row = vec![lab.clone(), b.name().into(), seq.to_string(), n.to_string()];
                    match r {
                        Ok(t) => {
                            row.extend([ms(t.one), ms(t.packed), format!("{:.2}", t.packed / t.one)]);
                            match t.backward {
                                Some((one, packed)) => {
                                    row.extend([ms(one), ms(packed), format!("{:.2}", packed / one)])
                                }
                                None => row.extend(["-".into(), "-".into(), "no fast backward".into()]),
                            }
                        }
                        Err(e) => {
                            failed += 1;
                            row.extend([
                                "-".into(),
                                "-".into(),
                                format!("FAIL: {e}"),
                                "-".into(),
                                "-".into(),
                                "-".into(),
                            ]);
                        }
                    }
                    rows.push(row);
                }
            }
        }
    }
    println!(
        "packed batch of N sequences of random lengths vs one sequence of the same total length T, fast forms, \
         {} {} (backward exact) H={} D={}{}; wall time of the host-array calls (validation included; on a device \
         backend the copies too)\n",
        opts.dtype.name(),
        opts.precision,
        opts.heads,
        opts.dim,
        if with_states {
            ", from random initial states with the final states and their cotangents"
        } else {
            ""
        }
    );
    let head = [
        "mixer",
        "backend",
        "T",
        "N",
        "one ms",
        "packed ms",
        "packed/one",
        "one backward ms",
        "packed backward ms",
        "packed/one backward",
    ];
    print!("{}", markdown(&head, &rows));
    if rows.is_empty() {
        return Err(Error::Io("nothing to measure".into()));
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

fn ms(s: f64) -> String {
    format!("{:.3}", s * 1e3)
}

#[cfg(test)]
mod tests {
    use super::random_offsets;

    #[test]
    fn offsets_are_n_nonempty_sequences_filling_t() {
        for (t, n) in [(1, 1), (7, 7), (1000, 1), (1000, 13), (4099, 64)] {
            let cu = random_offsets(t, n, 3).unwrap();
            assert_eq!(cu.len(), n + 1);
            assert_eq!((cu[0], cu[n]), (0, t));
            assert!(cu.windows(2).all(|w| w[0] < w[1]), "{cu:?}");
        }
        assert_ne!(random_offsets(1000, 13, 3).unwrap(), random_offsets(1000, 13, 4).unwrap());
        for (t, n) in [(5, 0), (5, 6)] {
            let e = random_offsets(t, n, 0).unwrap_err().to_string();
            assert!(e.contains(&format!("given {n}")), "{e}");
        }
    }
}
