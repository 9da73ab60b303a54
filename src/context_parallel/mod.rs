//! Context parallelism: one sequence split over the ranks of a group, each rank holding a
//! contiguous part of the tokens, for the log-linear base mixers (linear attention, Mamba-2,
//! gated DeltaNet), forward and backward (docs/math.md §7.3).
//!
//! A part's state map is affine: from its start state `S` (`[B, H, Dv, Dk]`) its end state is
//! `S · P + S_loc`, with `S_loc` the end state from a zero start and the transition
//! `P = Π_t e^{g_t} (I − β_t k_t k_tᵀ)` (`e^{Σ g} I` without the delta rule, `I` for linear
//! attention), `Dk × Dk` per batch row and head. `P` is the end state of the part run from the
//! identity with `v = 0` (the state's rows evolve independently), so both come from the library's
//! own run from a state. Forward of rank `r`: compute `(S_loc, P)`, all-gather them, chain the
//! earlier ranks' maps from the sequence's initial state to get the start state `S_r`, and run
//! the part from `S_r`. Backward: the same start states, then the part's backward from `S_r`
//! with no cotangent of its end gives `S̄_loc` (the start state's gradient from the part's own
//! outputs); all-gather them; the cotangent of the part's end is chained back from the last rank
//! (`S̄_end(r − 1) = S̄_loc(r) + S̄_end(r) · P_rᵀ`, the adjoint of `S ↦ S · P` being
//! `S̄ ↦ S̄ · Pᵀ`), and the part's backward from `S_r` with that cotangent gives every gradient.
//! Only states and transitions cross ranks, `O(N · B · H · D²)` per call, never tokens. Each
//! rank runs its part on its own backend, in the exact mode; the cost is three forward passes of
//! the part (`S_loc`, `P`, `y`), and for the backward those and two backward passes.

pub mod comm;

pub use comm::{Communicator, InProcess};

use mixer_core::mixer::{Mixer, downcast};
use mixer_core::mixers::loglinear::LogLinear;
use mixer_core::tensor::{cast_tensors, get, tensors_to_f64};
use mixer_core::{Error, Form, Precision, Requires, Result, Tensors};
use mixer_registry::Backend;
use mixer_registry::family::Scalar;
use mixer_registry::state::{backward_state, run_state};
use ndarray::{Array4, ArrayD, Ix4, IxDyn, s};

/// The state tensor's name (`S [B, H, Dv, Dk]`).
const S: &str = mixer_core::mixers::loglinear::STATE;

/// `(B, T, H, Dk, Dv)` of a part, after checking that `m` is a log-linear base mixer.
fn sizes<F: Scalar>(m: &dyn Mixer, x: &Tensors<F>) -> Result<[usize; 5]> {
    let ll = downcast::<LogLinear>(m, "context parallel").map_err(|_| unsupported(m))?;
    if ll.lift.is_some() {
        return Err(unsupported(m));
    }
    let (k, v) = (get(x, "k")?.shape(), get(x, "v")?.shape());
    match (k, v) {
        (&[b, t, h, dk], &[_, _, _, dv]) => Ok([b, t, h, dk, dv]),
        _ => Err(Error::shape("k, v", "[B, T, H, D]", format!("{k:?}, {v:?}"))),
    }
}

fn unsupported(m: &dyn Mixer) -> Error {
    Error::config(
        m.name(),
        "context parallelism covers the log-linear base mixers (linear-attention, mamba2, \
         gated-deltanet); the lifts' Fenwick levels across ranks and the other families are not \
         implemented",
    )
}

/// A state tensor as the library's named state in `F`.
fn state<F: Scalar>(s: &Array4<f64>) -> Tensors<F> {
    cast_tensors::<F>(&[(S.to_string(), s.clone().into_dyn())].into_iter().collect())
}

/// The named state `S` of a run as an `f64` array.
fn array<F: Scalar>(t: &Tensors<F>) -> Result<Array4<f64>> {
    tensors_to_f64(t)
        .remove(S)
        .ok_or_else(|| Error::Io("context parallel: internal: no state S".into()))?
        .into_dimensionality::<Ix4>()
        .map_err(|e| Error::Io(format!("context parallel: internal: {e}")))
}

/// `a · p` (`p` transposed when `transpose`) per batch row and head.
fn mul(a: &Array4<f64>, p: &Array4<f64>, transpose: bool) -> Array4<f64> {
    let (b, h, rows, _) = a.dim();
    let cols = if transpose { p.dim().2 } else { p.dim().3 };
    let mut out = Array4::<f64>::zeros((b, h, rows, cols));
    for i in 0..b {
        for j in 0..h {
            let (am, pm) = (a.slice(s![i, j, .., ..]), p.slice(s![i, j, .., ..]));
            let prod = if transpose { am.dot(&pm.t()) } else { am.dot(&pm) };
            out.slice_mut(s![i, j, .., ..]).assign(&prod);
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

/// This rank's start state `S_r` and every rank's transition `P`, from one all-gather of every
/// rank's `(S_loc, P)` (module documentation).
fn starts<F: Scalar>(
    comm: &dyn Communicator,
    m: &dyn Mixer,
    backend: &Backend,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
) -> Result<(Array4<f64>, Vec<Array4<f64>>)> {
    let [b, t, h, dk, dv] = sizes(m, x)?;
    let (loc, p) = if t == 0 {
        (Array4::zeros((b, h, dv, dk)), identity(b, h, dk))
    } else {
        let (_, loc) = run_from(m, backend, x, &state::<F>(&Array4::zeros((b, h, dv, dk))))?;
        let mut xz = x.clone();
        xz.insert("v".into(), ArrayD::zeros(IxDyn(&[b, t, h, dk])));
        let (_, p) = run_from(m, backend, &xz, &state::<F>(&identity(b, h, dk)))?;
        (array(&loc)?, array(&p)?)
    };
    let mine = [("S_loc".to_string(), loc.into_dyn()), ("P".to_string(), p.into_dyn())].into_iter().collect();
    let all = comm.all_gather(mine)?;
    let part = |g: &Tensors<f64>, k: &str| -> Result<Array4<f64>> {
        get(g, k)?
            .clone()
            .into_dimensionality::<Ix4>()
            .map_err(|e| Error::Io(format!("context parallel: {k}: {e}")))
    };
    let mut s = match initial {
        Some(s0) => array(s0)?,
        None => Array4::zeros((b, h, dv, dk)),
    };
    for g in &all[..comm.rank()] {
        s = mul(&s, &part(g, "P")?, false) + part(g, "S_loc")?;
    }
    let ps = all.iter().map(|g| part(g, "P")).collect::<Result<Vec<_>>>()?;
    Ok((s, ps))
}

fn identity(b: usize, h: usize, d: usize) -> Array4<f64> {
    Array4::from_shape_fn((b, h, d, d), |(_, _, i, j)| if i == j { 1.0 } else { 0.0 })
}

/// The forward of this rank's part `x` (its tokens, `[B, T_r, …]`) of a sequence that starts
/// from `initial` (`None`: zeros; the same on every rank): `y` of the part and the state at its
/// end (the last rank's is the sequence's final state). Every rank of `comm` calls it together.
pub fn forward<F: Scalar>(
    comm: &dyn Communicator,
    m: &dyn Mixer,
    backend: &Backend,
    x: &Tensors<F>,
    initial: Option<&Tensors<F>>,
) -> Result<(ArrayD<F>, Tensors<F>)> {
    let (s, _) = starts(comm, m, backend, x, initial)?;
    if sizes(m, x)?[1] == 0 {
        let v = get(x, "v")?;
        return Ok((ArrayD::zeros(v.raw_dim()), state::<F>(&s)));
    }
    run_from(m, backend, x, &state::<F>(&s))
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
    let (s, ps) = starts(comm, m, backend, x, initial)?;
    let [b, t, h, dk, dv] = sizes(m, x)?;
    let s0 = state::<F>(&s);
    let ds_loc = if t == 0 {
        Array4::zeros((b, h, dv, dk))
    } else {
        let (_, ds) = backward_state(m, backend, Form::Fast, x, Some(&s0), dy, None, &Requires::All)?;
        array(&ds)?
    };
    let all = comm.all_gather([("dS".to_string(), ds_loc.into_dyn())].into_iter().collect())?;
    let mut d = match d_final {
        Some(df) => array(df)?,
        None => Array4::zeros((b, h, dv, dk)),
    };
    for q in (comm.rank() + 1..comm.size()).rev() {
        let loc =
            get(&all[q], "dS")?.clone().into_dimensionality::<Ix4>().map_err(|e| Error::Io(e.to_string()))?;
        d = loc + mul(&d, &ps[q], true);
    }
    let (grads, ds) = if t == 0 {
        let zeros: Tensors<F> =
            x.iter().map(|(k, v)| (format!("d_{k}"), ArrayD::zeros(v.raw_dim()))).collect();
        (zeros, state::<F>(&mul(&d, &ps[comm.rank()], true)))
    } else {
        backward_state(m, backend, Form::Fast, x, Some(&s0), dy, Some(&state::<F>(&d)), &Requires::All)?
    };
    Ok((grads, if comm.rank() == 0 && initial.is_some() { ds } else { Tensors::new() }))
}
