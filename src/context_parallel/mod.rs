//! Context parallelism: one sequence split over the ranks of a group, each rank holding a
//! contiguous part of the tokens, for the log-linear family (linear attention, Mamba-2, gated
//! DeltaNet and their lifts), forward and backward (docs/math.md §7.3).
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
//! the case `L = 1`.
//!
//! Forward of rank `r`: all-gather the parts' lengths (for the start position), compute
//! `(S_loc, tr)`, all-gather them, chain the earlier ranks' maps from the sequence's initial
//! state to get the start state `S_r`, and run the part from `S_r`. Backward: the same start
//! states, then the part's backward from `S_r` with no cotangent of its end gives `S̄_loc` (the
//! start state's gradient from the part's own outputs); all-gather them; the cotangent of the
//! part's end is chained back from the last rank (`S̄_end(r − 1) = S̄_loc(r) + trᵀ(S̄_end(r))`,
//! for a base mixer `S̄_end(r) · P_rᵀ`, the adjoint of `S ↦ S · P`), and the part's backward from
//! `S_r` with that cotangent gives every gradient. Only lengths, states and transitions cross
//! ranks, `O(N · B · H · L² · D²)` per call, never tokens. Each rank runs its part on its own
//! backend, in the exact mode; the cost is three forward passes of the part (`S_loc`, the
//! transition, `y`; the transition's with `L·Dk` value columns), and for the backward those and
//! two backward passes.

pub mod comm;

pub use comm::{Communicator, InProcess};

use mixer_core::mixer::{Mixer, downcast};
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::state::POSITION;
use mixer_core::tensor::{cast_tensors, get, tensors_to_f64};
use mixer_core::{Error, Form, Precision, Requires, Result, Tensors};
use mixer_registry::Backend;
use mixer_registry::family::Scalar;
use mixer_registry::state::{backward_state, run_state};
use ndarray::{Array1, Array5, ArrayD, Ix5, IxDyn, s};

/// The state tensor's name (`S [B, H, Dv, Dk]`, or `[B, H, L, Dv, Dk]` for a lift).
const S: &str = mixer_core::mixers::loglinear::STATE;

/// The sizes of a part and whether the mixer is a lift (its state has a level axis and a
/// position), after checking that `m` is a log-linear mixer.
#[derive(Clone, Copy)]
struct Part {
    b: usize,
    t: usize,
    h: usize,
    dk: usize,
    dv: usize,
    /// Level slots of the state (1 for a base mixer).
    l: usize,
    lifted: bool,
}

fn part<F: Scalar>(m: &dyn Mixer, x: &Tensors<F>) -> Result<Part> {
    let ll = downcast::<LogLinear>(m, "context parallel").map_err(|_| unsupported(m))?;
    let (k, v) = (get(x, "k")?.shape(), get(x, "v")?.shape());
    let (&[b, t, h, dk], &[_, _, _, dv]) = (k, v) else {
        return Err(Error::shape("k, v", "[B, T, H, D]", format!("{k:?}, {v:?}")));
    };
    let lifted = ll.lift.is_some();
    let l = if lifted { get(x, "lambda")?.shape().get(3).copied().unwrap_or(0) } else { 1 };
    Ok(Part { b, t, h, dk, dv, l, lifted })
}

fn unsupported(m: &dyn Mixer) -> Error {
    Error::config(
        m.name(),
        "context parallelism covers the log-linear family (linear-attention, mamba2, gated-deltanet \
         and their lifts); the other families are not implemented",
    )
}

fn internal(e: impl std::fmt::Display) -> Error {
    Error::Io(format!("context parallel: internal: {e}"))
}

/// A state in the library's layout from level states `[B, H, L, rows, Dk]` and positions.
fn state<F: Scalar>(p: Part, levels: &Array5<f64>, pos: &[usize]) -> Result<Tensors<F>> {
    let (b, h, l, rows, dk) = levels.dim();
    let st = if p.lifted {
        levels.clone().into_dyn()
    } else {
        levels.clone().into_shape_with_order(IxDyn(&[b, h, rows, dk])).map_err(internal)?.into_dyn()
    };
    let _ = l;
    let mut t: Tensors<f64> = [(S.to_string(), st)].into_iter().collect();
    if p.lifted {
        t.insert(POSITION.into(), Array1::from_iter(pos.iter().map(|&a| a as f64)).into_dyn());
    }
    Ok(cast_tensors::<F>(&t))
}

/// A state's level states `[B, H, L, Dv, Dk]` (a base mixer's one level) and positions.
fn levels<F: Scalar>(p: Part, t: &Tensors<F>) -> Result<(Array5<f64>, Vec<usize>)> {
    let t = tensors_to_f64(t);
    let st = get(&t, S)?;
    let st = if p.lifted {
        st.clone()
    } else {
        let d = st.shape().to_vec();
        st.clone().into_shape_with_order(IxDyn(&[d[0], d[1], 1, d[2], d[3]])).map_err(internal)?
    };
    let pos = match t.get(POSITION) {
        Some(a) => a.iter().map(|&v| v as usize).collect(),
        None => vec![0; p.b],
    };
    Ok((st.into_dimensionality::<Ix5>().map_err(internal)?, pos))
}

/// One gathered tensor as a 5-d array.
fn gathered(g: &Tensors<f64>, k: &str) -> Result<Array5<f64>> {
    get(g, k)?.clone().into_dimensionality::<Ix5>().map_err(internal)
}

/// A part's transition applied to level states: `out[j] = Σ_i s[i] · tr[j][i-th block of Dk rows]`
/// (`tr [B, H, L, L·Dk, Dk]`, see [`transition`]), or its adjoint (`transpose`:
/// `out[i] = Σ_j s[j] · tr[j][i-th block]ᵀ`).
fn apply(s: &Array5<f64>, tr: &Array5<f64>, transpose: bool) -> Array5<f64> {
    let (b, h, l, rows, dk) = s.dim();
    let mut out = Array5::<f64>::zeros((b, h, l, rows, dk));
    for bi in 0..b {
        for hi in 0..h {
            for j in 0..l {
                for i in 0..l {
                    let block = tr.slice(s![bi, hi, j, i * dk..(i + 1) * dk, ..]);
                    let (from, to) = if transpose { (j, i) } else { (i, j) };
                    let sv = s.slice(s![bi, hi, from, .., ..]);
                    let prod = if transpose { sv.dot(&block.t()) } else { sv.dot(&block) };
                    let mut o = out.slice_mut(s![bi, hi, to, .., ..]);
                    o += &prod;
                }
            }
        }
    }
    out
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

/// The part's transition `tr [B, H, L, L·Dk, Dk]`: block `(j, i)` is where level slot `i` of
/// the start state goes in slot `j` of the end state, times `P` (module documentation). It is
/// the end state of the part run with `v = 0` (`Dv = L·Dk`) from the state whose slot `i` holds
/// the identity in rows `i·Dk …` for every slot that may be non-empty at the start position
/// (bit `i` of it set, for a lift; the one slot of a base mixer), since each row of a state
/// evolves on its own.
fn transition<F: Scalar>(
    m: &dyn Mixer,
    backend: &Backend,
    x: &Tensors<F>,
    p: Part,
    pos: &[usize],
) -> Result<Array5<f64>> {
    let rows = p.l * p.dk;
    let basis = Array5::from_shape_fn((p.b, p.h, p.l, rows, p.dk), |(b, _, i, r, c)| {
        let live = !p.lifted || (pos[b] >> i) & 1 == 1;
        if live && r == i * p.dk + c { 1.0 } else { 0.0 }
    });
    let mut xz = x.clone();
    xz.insert("v".into(), ArrayD::zeros(IxDyn(&[p.b, p.t, p.h, rows])));
    let (_, end) = run_from(m, backend, &xz, &state::<F>(p, &basis, pos)?)?;
    Ok(levels(p, &end)?.0)
}

/// This rank's start state (level states and positions) and every rank's transition, from two
/// all-gathers: the parts' lengths, then every part's `(L, tr)` (module documentation).
fn starts<F: Scalar>(
    comm: &dyn Communicator,
    m: &dyn Mixer,
    backend: &Backend,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
) -> Result<(Array5<f64>, Vec<usize>, Vec<Array5<f64>>)> {
    let p = part(m, x)?;
    let rank = comm.rank();
    let lens = comm.all_gather(
        [("len".to_string(), ArrayD::from_elem(IxDyn(&[1]), p.t as f64))].into_iter().collect(),
    )?;
    let offset: usize = lens[..rank].iter().map(|g| get(g, "len").map_or(0, |a| a[[0]] as usize)).sum();
    let (mut s, pos0) = match initial {
        Some(s0) => levels(p, s0)?,
        None => (Array5::zeros((p.b, p.h, p.l, p.dv, p.dk)), vec![0; p.b]),
    };
    let pos: Vec<usize> = pos0.iter().map(|&a| a + offset).collect();
    let (loc, tr) = if p.t == 0 {
        let rows = p.l * p.dk;
        let id =
            Array5::from_shape_fn(
                (p.b, p.h, p.l, rows, p.dk),
                |(_, _, j, r, c)| if r == j * p.dk + c { 1.0 } else { 0.0 },
            );
        (Array5::zeros((p.b, p.h, p.l, p.dv, p.dk)), id)
    } else {
        let zeros = Array5::zeros((p.b, p.h, p.l, p.dv, p.dk));
        let (_, loc) = run_from(m, backend, x, &state::<F>(p, &zeros, &pos)?)?;
        (levels(p, &loc)?.0, transition(m, backend, x, p, &pos)?)
    };
    let all = comm.all_gather(
        [("L".to_string(), loc.into_dyn()), ("tr".to_string(), tr.into_dyn())].into_iter().collect(),
    )?;
    for g in &all[..rank] {
        s = apply(&s, &gathered(g, "tr")?, false) + gathered(g, "L")?;
    }
    let trs = all.iter().map(|g| gathered(g, "tr")).collect::<Result<Vec<_>>>()?;
    Ok((s, pos, trs))
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
    let (s, pos, _) = starts(comm, m, backend, x, initial)?;
    let p = part(m, x)?;
    let s0 = state::<F>(p, &s, &pos)?;
    if p.t == 0 {
        return Ok((ArrayD::zeros(get(x, "v")?.raw_dim()), s0));
    }
    run_from(m, backend, x, &s0)
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
    let (s, pos, trs) = starts(comm, m, backend, x, initial)?;
    let p = part(m, x)?;
    let s0 = state::<F>(p, &s, &pos)?;
    let zeros = || Array5::<f64>::zeros((p.b, p.h, p.l, p.dv, p.dk));
    let own = if p.t == 0 {
        zeros()
    } else {
        let (_, ds) = backward_state(m, backend, Form::Fast, x, Some(&s0), dy, None, &Requires::All)?;
        levels(p, &ds)?.0
    };
    let all = comm.all_gather([("dS".to_string(), own.into_dyn())].into_iter().collect())?;
    let mut d = match d_final {
        Some(df) => levels(p, df)?.0,
        None => zeros(),
    };
    for q in (comm.rank() + 1..comm.size()).rev() {
        d = gathered(&all[q], "dS")? + apply(&d, &trs[q], true);
    }
    let end_pos: Vec<usize> = pos.iter().map(|&a| a + p.t).collect();
    let (grads, ds) = if p.t == 0 {
        let g: Tensors<F> = x.iter().map(|(k, v)| (format!("d_{k}"), ArrayD::zeros(v.raw_dim()))).collect();
        (g, state::<F>(p, &apply(&d, &trs[comm.rank()], true), &pos)?)
    } else {
        let df = state::<F>(p, &d, &end_pos)?;
        backward_state(m, backend, Form::Fast, x, Some(&s0), dy, Some(&df), &Requires::All)?
    };
    Ok((grads, if comm.rank() == 0 && initial.is_some() { zero_position(ds) } else { Tensors::new() }))
}

/// A state gradient with its position's gradient zero (the position is an integer: it has none).
fn zero_position<F: Scalar>(mut ds: Tensors<F>) -> Tensors<F> {
    if let Some(p) = ds.get_mut(POSITION) {
        p.fill(F::zero());
    }
    ds
}
