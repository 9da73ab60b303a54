//! Context parallelism: one sequence split over the ranks of a group, each rank holding a
//! contiguous part of the tokens, for the log-linear family (linear attention, Mamba-2, gated
//! DeltaNet and their lifts) and the GLR, forward and backward (docs/math.md §7.3).
//!
//! A part's state map is affine: from its start state `S` (`[B, H, Dv, Dk]`) its end state is
//! `S · P + S_loc`, with `S_loc` the end state from a zero start and the transition
//! `P = Π_t e^{g_t} (I − β_t k_t k_tᵀ)` (`e^{Σ g} I` without the delta rule, `I` for linear
//! attention), `Dk × Dk` per batch row and head. `P` is the end state of the part run from the
//! identity with `v = 0` (the state's rows evolve independently), so both come from the library's
//! own run from a state. A lift's state is `L` level slots and a position: its map sends each
//! start slot `i` into one end slot `j` (the Fenwick merges, fixed by the positions) times the
//! same `P`, so its transition is the `L × L` blocks `tr[j][i]`, read off one run from the state
//! whose slot `i` holds the identity in rows `i·Dk …` (`v = 0` of width `L·Dk`); a base mixer is
//! the case `L = 1` ([`loglinear`]). The GLR's state (the kept past outputs, or inputs) maps
//! linearly per channel, its transition read off one run with `x = 0` and each channel repeated
//! once per state row ([`glr`]).
//!
//! Forward of rank `r`: all-gather the parts' lengths (for the start position), compute
//! `(S_loc, tr)`, all-gather them, chain the earlier ranks' maps from the sequence's initial
//! state to get the start state `S_r`; the part's output is affine in `S_r` too,
//! `y_t = y_t^loc + S_r · r_t`, and the same widened run gives `y^loc` and each start row's reach
//! `r_t` (its `y`'s first and widened columns), so the part is not run again. Backward: the same start
//! states and widened run, whose reach gives `S̄_loc = Σ_t dy_t r_tᵀ` (the start state's gradient
//! from the part's own outputs, the adjoint of the reach); all-gather them; the cotangent of the
//! part's end is chained back from the last rank (`S̄_end(r − 1) = S̄_loc(r) + trᵀ(S̄_end(r))`,
//! for a base mixer `S̄_end(r) · P_rᵀ`, the adjoint of `S ↦ S · P`), and the part's backward from
//! `S_r` with that cotangent gives every gradient. Only lengths, states and transitions cross
//! ranks, `O(N · B · H · L² · D²)` per call, never tokens. Each rank runs its part on its own
//! backend, in the exact mode; the forward costs one run of the part with its values widened by
//! `L·Dk` zero columns, the backward that run and one backward pass of the part.

pub mod comm;
mod glr;
mod loglinear;
mod nccl;
pub mod wire;

pub use comm::{Communicator, InProcess};
pub use nccl::Nccl;

use mixer_core::mixer::Mixer;
use mixer_core::tensor::get;
use mixer_core::{Error, Form, Precision, Requires, Result, Tensors, grad_name};
use mixer_registry::Backend;
use mixer_registry::family::Scalar;
use mixer_registry::state::{backward_state, run_state};
use ndarray::{ArrayD, IxDyn};

/// A part of a family with a context-parallel form.
#[derive(Clone, Copy)]
enum Part {
    LogLinear(loglinear::Part),
    Glr(glr::Part),
}

/// Dispatches one method of [`Part`] to its family.
macro_rules! each {
    ($self:ident, $p:ident => $e:expr) => {
        match $self {
            Part::LogLinear($p) => $e,
            Part::Glr($p) => $e,
        }
    };
}

impl Part {
    fn of<F: Scalar>(m: &dyn Mixer, x: &Tensors<F>) -> Result<Part> {
        if let Some(p) = loglinear::Part::of(m, x)? {
            return Ok(Part::LogLinear(p));
        }
        glr::Part::of(m, x)?.map(Part::Glr).ok_or_else(|| unsupported(m))
    }
    fn t(&self) -> usize {
        each!(self, p => p.t)
    }
    fn batch(&self) -> usize {
        each!(self, p => p.b)
    }
    fn zeros(&self) -> ArrayD<f64> {
        each!(self, p => p.zeros())
    }
    fn identity(&self) -> ArrayD<f64> {
        each!(self, p => p.identity())
    }
    fn state<F: Scalar>(&self, values: &ArrayD<f64>, pos: &[usize]) -> Result<Tensors<F>> {
        each!(self, p => p.state(values, pos))
    }
    fn values<F: Scalar>(&self, t: &Tensors<F>) -> Result<(ArrayD<f64>, Vec<usize>)> {
        each!(self, p => p.values(t))
    }
    fn local_and_transition<F: Scalar>(
        &self,
        m: &dyn Mixer,
        backend: &Backend,
        x: &Tensors<F>,
        pos: &[usize],
    ) -> Result<Widened> {
        each!(self, p => p.local_and_transition(m, backend, x, pos))
    }
    fn output(&self, widened_y: &ArrayD<f64>, s: &ArrayD<f64>) -> Result<ArrayD<f64>> {
        each!(self, p => p.output(widened_y, s))
    }
    fn output_adjoint(&self, widened_y: &ArrayD<f64>, dy: &ArrayD<f64>) -> Result<ArrayD<f64>> {
        each!(self, p => p.output_adjoint(widened_y, dy))
    }
    fn apply(&self, s: &ArrayD<f64>, tr: &ArrayD<f64>, transpose: bool) -> Result<ArrayD<f64>> {
        each!(self, p => p.apply(s, tr, transpose))
    }
}

fn unsupported(m: &dyn Mixer) -> Error {
    Error::config(
        m.name(),
        "context parallelism covers the log-linear family (linear-attention, mamba2, gated-deltanet \
         and their lifts) and the GLR; the other families are not implemented",
    )
}

fn internal(e: impl std::fmt::Display) -> Error {
    Error::Io(format!("context parallel: internal: {e}"))
}

/// The part run from the state `s0` (`y`, end state).
fn run_from<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    x: &Tensors<F>,
    s0: &Tensors<F>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    run_state(m, backend, Form::Fast, x, Some(s0), Precision::Exact)
}

/// An error unless `a` (a state's values) has the shape of the part's state.
fn sized(what: &str, a: &ArrayD<f64>, p: &Part) -> Result<()> {
    let want = p.zeros();
    if a.shape() == want.shape() {
        return Ok(());
    }
    Err(Error::shape(
        format!("context parallel: the {what}"),
        format!("{:?}", want.shape()),
        format!("{:?}", a.shape()),
    ))
}

/// An error unless every rank's gathered tensors have this rank's shapes (the ranks' parts must
/// share every size but `T`, and their initial states).
fn same_sizes(all: &[Tensors<f64>], want: &[(&str, &[usize])]) -> Result<()> {
    for (rank, g) in all.iter().enumerate() {
        for &(k, shape) in want {
            let got = get(g, k)?.shape();
            if got != shape {
                return Err(Error::shape(
                    format!("context parallel: rank {rank}'s {k}"),
                    format!("{shape:?} (this rank's: every part shares every size but T)"),
                    format!("{got:?}"),
                ));
            }
        }
    }
    Ok(())
}

/// This rank's contribution to a collective: its payload, or (its own work having failed) the
/// error, which the collective reports to every rank ([`Communicator::all_gather`]).
fn contribution<T>(local: &Result<T>, payload: impl FnOnce(&T) -> Tensors<f64>) -> Result<Tensors<f64>> {
    match local {
        Ok(t) => Ok(payload(t)),
        Err(e) => Err(Error::Io(e.to_string())),
    }
}

/// What a part's widened run gives (module documentation): the end state from a zero start `L`,
/// the transition `tr`, and the run's `y` (`None` for an empty part): the part's `y` from a
/// zero start in its first columns, each start row's reach in the widened ones.
pub(super) struct Widened {
    pub(super) local: ArrayD<f64>,
    pub(super) tr: ArrayD<f64>,
    pub(super) y: Option<ArrayD<f64>>,
}

/// [`starts`]' result: this rank's part, start state (values and positions), its own widened
/// run, and every rank's transition.
struct Start {
    p: Part,
    s: ArrayD<f64>,
    pos: Vec<usize>,
    own: Widened,
    trs: Vec<ArrayD<f64>>,
}

/// This rank's start state (values and positions) and every rank's transition, from two
/// all-gathers: the parts' lengths, then every part's `(L, tr)` (module documentation). Every
/// rank reaches every collective until one reports a failure (then all return it).
fn starts<F: Scalar>(
    comm: &dyn Communicator,
    m: &dyn Mixer,
    backend: &Backend,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
) -> Result<Start> {
    let rank = comm.rank();
    let p = Part::of(m, x);
    let lens = comm.all_gather(contribution(&p, |p| {
        [("len".to_string(), ArrayD::from_elem(IxDyn(&[1]), p.t() as f64))].into_iter().collect()
    }))?;
    let offset: usize = lens[..rank].iter().map(|g| get(g, "len").map_or(0, |a| a[[0]] as usize)).sum();
    let local = p.and_then(|p| {
        let (s, pos0) = match initial {
            Some(s0) => p.values(s0)?,
            None => (p.zeros(), vec![0; p.batch()]),
        };
        sized("initial state", &s, &p)?;
        let pos: Vec<usize> = pos0.iter().map(|&a| a + offset).collect();
        let own = if p.t() == 0 {
            Widened { local: p.zeros(), tr: p.identity(), y: None }
        } else {
            p.local_and_transition(m, backend, x, &pos)?
        };
        Ok((p, s, pos, own))
    });
    let all = comm.all_gather(contribution(&local, |(_, _, _, own)| {
        [("L".to_string(), own.local.clone()), ("tr".to_string(), own.tr.clone())].into_iter().collect()
    }))?;
    let (p, mut s, pos, own) = local?;
    same_sizes(&all, &[("L", own.local.shape()), ("tr", own.tr.shape())])?;
    for g in &all[..rank] {
        s = p.apply(&s, get(g, "tr")?, false)? + get(g, "L")?;
    }
    let trs = all.iter().map(|g| get(g, "tr").cloned()).collect::<Result<Vec<_>>>()?;
    Ok(Start { p, s, pos, own, trs })
}

/// The forward of this rank's part `x` (its tokens, `[B, T_r, …]`) of a sequence that starts
/// from `initial` (`None`: zeros at position 0; the same on every rank): `y` of the part and the
/// state at its end (the last rank's is the sequence's final state). Every rank of `comm` calls
/// it together.
pub fn forward<F: Scalar>(
    comm: &dyn Communicator,
    m: &dyn Mixer,
    backend: &Backend,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    let Start { p, s, pos, own, .. } = starts(comm, m, backend, x, initial)?;
    let Some(widened_y) = own.y else {
        let mixed = get(x, m.spec().mixed)?;
        return Ok((ArrayD::zeros(mixed.raw_dim()), p.state::<F>(&s, &pos)?));
    };
    // The output is affine in the start state (math.md §7.3, the output's reach), and so is the
    // end state: no second run of the part.
    let y = p.output(&widened_y, &s)?.mapv(F::of);
    let end = p.apply(&s, &own.tr, false)? + &own.local;
    let end_pos: Vec<usize> = pos.iter().map(|&a| a + p.t()).collect();
    Ok((y, p.state::<F>(&end, &end_pos)?))
}

/// The backward of [`forward`]: from this rank's `dy` and the cotangent `d_final` of the
/// sequence's final state (`None`: zero; the same on every rank, used by the last), the gradients
/// of this rank's inputs and, on rank 0 when `initial` is given, the initial state's gradient
/// (empty otherwise). Every rank of `comm` calls it together.
pub fn backward<F: Scalar>(
    comm: &dyn Communicator,
    m: &dyn Mixer,
    backend: &Backend,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
    dy: &ArrayD<F>,
    d_final: Option<&Tensors<F>>,
) -> Result<(Tensors<F>, Tensors<F>)> {
    let Start { p, s, pos, own, trs } = starts(comm, m, backend, x, initial)?;
    // The start state's gradient through the part's own outputs, Λ = Σ_t dy_t r_tᵀ: the adjoint
    // of the output's reach (math.md §7.3), read off the widened run the forward made; no
    // backward pass.
    let local = p.state::<F>(&s, &pos).and_then(|s0| {
        let own = match &own.y {
            None => p.zeros(),
            Some(widened) => p.output_adjoint(widened, &dy.mapv(|v| v.f64()))?,
        };
        Ok((s0, own))
    });
    let all = comm.all_gather(contribution(&local, |(_, own)| {
        [("dS".to_string(), own.clone())].into_iter().collect()
    }))?;
    let (s0, own) = local?;
    same_sizes(&all, &[("dS", own.shape())])?;
    let mut d = match d_final {
        Some(df) => p.values(df)?.0,
        None => p.zeros(),
    };
    sized("final state's cotangent", &d, &p)?;
    for q in (comm.rank() + 1..comm.size()).rev() {
        d = p.apply(&d, &trs[q], true)? + get(&all[q], "dS")?;
    }
    // Cotangents carry a zero position (an integer has no gradient).
    let zero_pos = vec![0; pos.len()];
    let (grads, ds) = if p.t() == 0 {
        let g: Tensors<F> = x.iter().map(|(k, v)| (grad_name(k), ArrayD::zeros(v.raw_dim()))).collect();
        (g, p.state::<F>(&p.apply(&d, &trs[comm.rank()], true)?, &zero_pos)?)
    } else {
        let df = p.state::<F>(&d, &zero_pos)?;
        backward_state(m, backend, Form::Fast, x, Some(&s0), dy, Some(&df), &Requires::All)?
    };
    Ok((grads, if comm.rank() == 0 && initial.is_some() { ds } else { Tensors::new() }))
}
