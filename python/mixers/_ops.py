"""The PyTorch ops: every registered mixer as a ``torch.library.custom_op``.

Each mixer ``NAME`` of the registry (builtins and the plugins linked into the extension) gets
two ops, ``mixers::NAME`` (``-`` becomes ``_``) and its backward ``mixers::NAME_backward``,
with one schema for all mixers::

    mixers::NAME(Tensor[] inputs, str[] names, Tensor? initial_state, Tensor? cu_seqlens,
                 bool output_final_state, str config, str form, str backend, str precision)
        -> (Tensor y, Tensor final_state)

``inputs[i]`` is the input called ``names[i]`` (docs/math.md: ``q``, ``k``, ``v``, ``g``,
``x``, ``lambda``, …). ``final_state`` is an empty tensor unless ``output_final_state``. A state
of several tensors (the lifts', the GLR's, attention's cache, the Toeplitz mixer's) is one
tensor in the op, their concatenation in name order (:func:`pack_state`), and the op's config
string carries a given initial state's shapes (:func:`_split_config`). Both
ops have a fake (meta) implementation, so ``torch.compile`` traces them without graph
breaks; the forward's autograd formula calls the backward op, which runs the library's own
backward (``fast`` on the CPU, or the forward's form where the backend has a backward of it).
:func:`call` (every function of the package) uses the ops while ``torch.compile`` traces, and
in eager mode the same implementations through :class:`_Eager` (no ``torch.library`` dispatch);
the common eager call on the zero-copy CUDA path (no state; a packed batch in the ``fast`` form
too) goes more directly still: through :class:`_Plain`, or with no autograd ``Function`` at all
when no gradient is wanted (:func:`_plain_forward`, the op's forward for that case; the backward
is the op's).

What is copied: every input is read through numpy (a CPU ``float32``/``float64`` tensor is
viewed, not copied) and copied once into the library's row-major arrays; outputs come back as
new arrays, wrapped without a copy. ``bfloat16``/``float16`` inputs are computed in
``float32`` (converted on the way in, ``y`` and the gradients converted back; states stay
``float32``). CUDA tensors run zero-copy on the CUDA backend (``mixers._cuda``: in place, on
the current stream, every buffer from PyTorch's allocator) for the ``parallel`` and ``fast``
forms and the ``fast`` backward, from a state where the library runs one on device tensors (the
log-linear base mixers) and over packed batches (``cu_seqlens``: every sequence run on views of
the buffer; mixers whose inputs are all per token); other CUDA calls are copied to the host and
back, run by the backend named by ``backend`` on host arrays.
"""

from __future__ import annotations

import functools
import json
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from . import _cuda, _mixers

_HALF = (torch.bfloat16, torch.float16)

_SCHEMA = (
    "(Tensor[] inputs, str[] names, Tensor? initial_state, Tensor? cu_seqlens, "
    "bool output_final_state, str config, str form, str backend, str precision) -> (Tensor, Tensor)"
)
_BACKWARD_SCHEMA = (
    "(Tensor[] inputs, str[] names, Tensor dy, Tensor? initial_state, Tensor? d_final_state, "
    "Tensor? cu_seqlens, str config, str form, str backend, str precision, Tensor? y=None) -> Tensor[]"
)


@functools.lru_cache(maxsize=None)
def spec(name: str, config: str = "{}") -> dict:
    """The inputs of mixer ``name`` with a JSON ``config``: ``{"mixed", "inputs": [{"name",
    "shape", "optional", "per_token"}], "family", "doc", "backward_reads_output",
    "cuda_saves_for_backward"}`` (cached)."""
    return json.loads(_mixers.spec(name, config))


@torch.compiler.assume_constant_result
def _cuda_saves(mixer: str, config: str) -> bool:
    """Whether the CUDA backend's forward run for a backward saves something that its backward
    reads instead of running the forward again (attention's row statistics; constant under
    ``torch.compile``)."""
    return spec(mixer, _split_config(config)[0])["cuda_saves_for_backward"]


@torch.compiler.assume_constant_result
def _reads_output(mixer: str, config: str) -> bool:
    """Whether the mixer's backward reads the forward's output ``y`` when given it (the GLR's
    ``d_beta``): then its autograd node keeps ``y`` and passes it, and the backward does not run
    the forward again (constant under ``torch.compile``)."""
    return spec(mixer, _split_config(config)[0])["backward_reads_output"]


# The dtypes the library computes in: a `y` of another dtype (float16 or bfloat16 inputs) holds a
# rounded output, and its autograd node does not keep it.
_WORK = (torch.float32, torch.float64)


class _KeptOutput:
    """The forward's output kept on an eager autograd node for a backward that reads it: an alias
    (``detach``: no reference back to the node) that notices in-place changes — the backward is
    given ``y`` only while it is as the forward wrote it, and otherwise runs the forward again, so
    that ``y += residual`` after the call keeps working."""

    def __init__(self, y: torch.Tensor):
        self.y, self.version = y.detach(), y._version

    def get(self) -> Optional[torch.Tensor]:
        return self.y if self.y._version == self.version else None


def _keeps_output(mixer, config, tensors, names, initial_state, cu_seqlens, output_final_state, backend,
                  precision) -> bool:
    """Whether a call's autograd node keeps ``y`` for its backward (:func:`_reads_output`): no
    state, no ``cu_seqlens``, ``y`` in a dtype the library computes in, and a backward that takes
    it — the CUDA backend's on CUDA tensors, or any in the exact mode (the host path passes it
    only there)."""
    if initial_state is not None or output_final_state or cu_seqlens is not None or not _reads_output(mixer, config):
        return False
    mixed = tensors[list(names).index(_mixed_name(mixer, config))]
    return mixed.dtype in _WORK and (precision == "exact" or (backend == "cuda" and mixed.is_cuda))


def _work_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype the library computes in for a tensor of ``t``'s dtype (half types: float32;
    anything else is passed on, and the library refuses what is not float32/float64)."""
    return torch.float32 if t.dtype in _HALF else t.dtype


def _host(t: torch.Tensor, dtype: Optional[torch.dtype] = None):
    """``t`` as a numpy array on the host (a view when it already is one), of ``dtype``, else
    of its own dtype with half types as float32 (so the library sees, and refuses, inputs of
    mixed or non-float dtypes)."""
    dtype = dtype or _work_dtype(t)
    if t.is_cpu and t.dtype == dtype:
        return t.detach().numpy()  # the common case: a view, nothing to convert
    return t.detach().to(device="cpu", dtype=dtype).numpy()


def _offsets(cu_seqlens: Optional[torch.Tensor]) -> Optional[List[int]]:
    """Packed-batch offsets as a list of ints, or ``None``."""
    if cu_seqlens is None:
        return None
    if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"cu_seqlens: expected an integer tensor of offsets, got dtype {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1:
        raise ValueError(f"cu_seqlens: expected a 1-D tensor of offsets [N + 1], got shape {list(cu_seqlens.shape)}")
    values = [int(v) for v in cu_seqlens.tolist()]
    bad = [v for v in values if v < 0]
    if bad:
        raise ValueError(f"cu_seqlens: offsets must be non-negative integers, but found {bad[0]}")
    return values


def _mixed(name: str, config: str, inputs: Sequence[torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    """The mixed input (``y`` has its shape, dtype and device)."""
    mixed = spec(name, config)["mixed"]
    if mixed not in names:
        raise ValueError(f"missing input `{mixed}` of `{name}` (the mixed input); given: {', '.join(names)}")
    return inputs[list(names).index(mixed)]


_GIVEN = "__initial_state_shapes__"


def _split_config(config: str) -> Tuple[str, Optional[Dict[str, List[int]]]]:
    """The op's config string without the shapes of a several-tensor initial state that
    :func:`call` adds to it (the op's one state tensor is their concatenation), and those shapes."""
    if _GIVEN not in config:
        return config, None
    cfg = json.loads(config)
    given = cfg.pop(_GIVEN)
    return json.dumps(cfg, sort_keys=True), {k: list(v) for k, v in given}


@torch.compiler.assume_constant_result
def _with_given(config: str, given: tuple) -> str:
    """``config`` with the initial state's shapes ``((name, shape), …)`` (constant under
    ``torch.compile``)."""
    cfg = json.loads(config)
    cfg[_GIVEN] = [[k, list(v)] for k, v in given]
    return json.dumps(cfg, sort_keys=True)


def _shape_args(inputs: Sequence[torch.Tensor], names: Sequence[str], cu_seqlens) -> tuple:
    """``(names, shapes, nseq)`` of the inputs as plain tuples and ints (``nseq``: the sequences of a
    packed batch, ``-1`` without one): the arguments of :func:`_layout_const` and
    :func:`_state_names`."""
    nseq = -1 if cu_seqlens is None else int(cu_seqlens.shape[0]) - 1
    return tuple(names), tuple(tuple(map(int, t.shape)) for t in inputs), nseq


# `_layout_const`'s answers by argument (a cache written by hand: `functools.lru_cache` would hide
# the function from `torch.compiler.assume_constant_result`).
_LAYOUTS: Dict[tuple, tuple] = {}


@torch.compiler.assume_constant_result
def _layout_const(mixer: str, config: str, names: tuple, shapes: tuple, nseq: int, given: tuple) -> tuple:
    """The names and shapes of the mixer's state tensors for inputs of ``names`` and ``shapes``, in
    the library's order (one row per sequence of a packed batch), when the run starts from a state
    of the shapes ``given`` (``((name, shape), …)``; ``()``: from zero), as ``((name, shape), …)``
    with each shape a tuple; ``NotImplementedError`` (the library's message) for a mixer without a
    state. Asked of the library once per distinct argument (a decoding loop asks the same every
    step); a constant under ``torch.compile``."""
    key = (mixer, config, names, shapes, nseq, given)
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    given = {k: list(v) for k, v in given} or None
    layout = {k: list(v) for k, v in
              _mixers.state_shapes(mixer, dict(zip(names, map(list, shapes))), config, given).items()}
    if nseq >= 0 and given is None:
        layout = {k: [nseq] + v[1:] for k, v in layout.items()}
    if len(_LAYOUTS) >= 4096:
        _LAYOUTS.clear()
    _LAYOUTS[key] = tuple((k, tuple(v)) for k, v in layout.items())
    return _LAYOUTS[key]


def _state_layout(
    name: str, config: str, inputs: Sequence[torch.Tensor], names: Sequence[str], cu_seqlens, given=None
) -> Dict[str, List[int]]:
    """:func:`_layout_const` of tensors as a dict of shapes (lists), with ``given`` a dict
    (``None``: from zero)."""
    given = tuple((k, tuple(v)) for k, v in (given or {}).items())
    return {k: list(v) for k, v in _layout_const(name, config, *_shape_args(inputs, names, cu_seqlens), given)}


# The names of a mixer's state tensors by (mixer, config): they do not depend on the sizes.
_STATE_NAMES: Dict[Tuple[str, str], Tuple[str, ...]] = {}


@torch.compiler.assume_constant_result
def _state_names(mixer: str, config: str, names: tuple, shapes: tuple, nseq: int) -> tuple:
    """The names of the mixer's state tensors, asked of the library once per (mixer, config)
    (:func:`_layout_const` the first time); a constant under ``torch.compile``."""
    key = (mixer, config)
    if key not in _STATE_NAMES:
        _STATE_NAMES[key] = tuple(k for k, _ in _layout_const(mixer, config, names, shapes, nseq, ()))
    return _STATE_NAMES[key]


@torch.compiler.assume_constant_result
def _mixed_name(mixer: str, config: str) -> str:
    """The name of the mixed input (constant under ``torch.compile``)."""
    return spec(mixer, config)["mixed"]


def _op_state_shape(layout: Dict[str, List[int]]) -> List[int]:
    """The shape of the op's one state tensor: the state itself where it is one tensor, else the
    tensors flattened and concatenated in the layout's order (:func:`pack_state`)."""
    if len(layout) == 1:
        return next(iter(layout.values()))
    return [sum(_numel(v) for v in layout.values())]


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def pack_state(state, state_names: Sequence[str], dtype: torch.dtype) -> torch.Tensor:
    """The op's one state tensor from a state given as a tensor (a one-tensor state) or as a dict
    of its tensors by name (any state, of the names ``state_names``): flattened and concatenated in
    sorted name order where the state has several tensors (differentiable; their shapes are the
    library's to check)."""
    if isinstance(state, torch.Tensor):
        if len(state_names) != 1:
            raise ValueError(
                f"initial_state: this mixer's state has {len(state_names)} tensors ({', '.join(state_names)}); "
                "pass a dict of them by name"
            )
        return state
    if not isinstance(state, dict):
        raise TypeError(f"initial_state: expected a torch.Tensor or a dict of them, got {type(state).__name__}")
    if sorted(state) != sorted(state_names):
        raise ValueError(
            f"initial_state: expected the tensors {', '.join(state_names)}, got {', '.join(state) or 'none'}"
        )
    if len(state_names) == 1:
        return next(iter(state.values()))
    return torch.cat([state[k].to(dtype).reshape(-1) for k in sorted(state)])


def unpack_state(flat: torch.Tensor, layout: Optional[Dict[str, List[int]]]):
    """The op's state tensor as the user sees it: itself for a one-tensor state (``layout`` of one
    tensor, or ``None``), else a dict of the tensors (views of ``flat``)."""
    if layout is None or len(layout) == 1:
        return flat
    out, at = {}, 0
    for k, shape in layout.items():
        n = _numel(shape)
        out[k] = flat[at: at + n].reshape(shape)
        at += n
    return out


def _state_to_host(flat: torch.Tensor, layout: Dict[str, List[int]], dtype) -> Dict[str, object]:
    """The op's state tensor as the library's named host arrays."""
    return {k: _host(v, dtype) for k, v in _as_dict(unpack_state(flat, layout), layout).items()}


def _as_dict(state, layout):
    return state if isinstance(state, dict) else {next(iter(layout)): state}


def _state_from_host(arrays: Dict[str, object], layout: Dict[str, List[int]], device, dtype) -> torch.Tensor:
    """The library's named host arrays as the op's one state tensor."""
    if len(layout) == 1:
        return torch.from_numpy(arrays[next(iter(layout))]).to(device=device, dtype=dtype)
    return torch.cat([torch.from_numpy(arrays[k]).reshape(-1) for k in layout]).to(device=device, dtype=dtype)


def _several(mixer, config, inputs, names, cu_seqlens, stateful, given) -> bool:
    """Whether a stateful call's state has several tensors (``given``: a several-tensor initial
    state's shapes, from the op's config)."""
    if given is not None:
        return True
    return stateful and len(_state_names(mixer, config, *_shape_args(inputs, names, cu_seqlens))) > 1


def op_name(mixer: str) -> str:
    """The op name of a registered mixer: ``mixers::`` and the name with ``-`` as ``_``."""
    return "mixers::" + mixer.replace("-", "_").replace(".", "_")


_OPS: Dict[str, object] = {}
# The op's forward and backward implementations by mixer (for :class:`_Eager`).
_IMPLS: Dict[str, tuple] = {}


def mixer_op(mixer: str):
    """The ``torch.library`` op of registered mixer ``mixer`` (defined on first use; the package
    defines every registered mixer's op when it is imported)."""
    if mixer in _OPS:
        return _OPS[mixer]
    base = op_name(mixer)

    def forward_impl(inputs, names, initial_state, cu_seqlens, output_final_state, config, form, backend, precision):
        config, given = _split_config(config)
        mixed = _mixed(mixer, config, inputs, names)
        work = _work_dtype(mixed)
        stateful = initial_state is not None or output_final_state
        tensors = list(inputs) + ([] if initial_state is None else [initial_state])
        # (a state of several tensors travels packed: the zero-copy path takes one-tensor states)
        if not _several(mixer, config, inputs, names, cu_seqlens, stateful, given) and _cuda.applies(
                tensors, backend, form, stateful, cu_seqlens, precision):
            try:
                y, fin = _cuda.forward(mixer, names, inputs, config, form, precision, initial_state,
                                       bool(output_final_state), cu_seqlens=_offsets(cu_seqlens))
            except NotImplementedError:
                if not stateful and cu_seqlens is None:
                    raise
                # no run from a state or packed run on device tensors for this mixer: the host path below
            else:
                s = fin.to(work) if output_final_state else mixed.new_empty(0, dtype=work)
                return (y if y.dtype == mixed.dtype else y.to(mixed.dtype)), s
        x = {n: _host(t) for n, t in zip(names, inputs)}
        layout = _state_layout(mixer, config, inputs, names, cu_seqlens, given) if stateful else None
        initial = None if initial_state is None else _state_to_host(initial_state, given or layout, work)
        y, fin = _mixers.forward(
            mixer,
            x,
            config=config,
            form=form,
            backend=backend,
            precision=precision,
            cu_seqlens=_offsets(cu_seqlens),
            initial=initial,
            want_final=bool(output_final_state),
        )
        y = torch.from_numpy(y).to(device=mixed.device, dtype=mixed.dtype)
        if output_final_state:
            s = _state_from_host(fin, layout, mixed.device, work)
        else:
            s = mixed.new_empty(0, dtype=work)
        return y, s

    def forward_fake(inputs, names, initial_state, cu_seqlens, output_final_state, config, form, backend, precision):
        config, given = _split_config(config)
        mixed = _mixed(mixer, config, inputs, names)
        work = _work_dtype(mixed)
        y = mixed.new_empty(mixed.shape)
        if not output_final_state:
            return y, mixed.new_empty(0, dtype=work)
        if initial_state is not None and given is None:
            return y, initial_state.new_empty(initial_state.shape, dtype=work)
        layout = _state_layout(mixer, config, inputs, names, cu_seqlens, given)
        return y, mixed.new_empty(_op_state_shape(layout), dtype=work)

    fwd = torch.library.custom_op(base, forward_impl, mutates_args=(), schema=_SCHEMA)
    fwd.register_fake(forward_fake)

    def backward_impl(inputs, names, dy, initial_state, d_final_state, cu_seqlens, config, form, backend, precision,
                      y=None):
        """The backward op's implementation; ``y``, the forward's output where the autograd node
        kept it (:func:`_keeps_output`), is passed on without a state or ``cu_seqlens`` (to the
        CPU only in the exact mode, whose forward the CPU backward would run again)."""
        config, given = _split_config(config)
        mixed = _mixed(mixer, config, inputs, names)
        work = _work_dtype(mixed)
        stateful = initial_state is not None or d_final_state is not None
        if stateful or cu_seqlens is not None:
            y = None
        states = [s for s in (initial_state, d_final_state) if s is not None]
        if not _several(mixer, config, inputs, names, cu_seqlens, stateful, given) and _cuda.applies(
                list(inputs) + [dy] + states, backend, form, stateful, cu_seqlens, precision):
            try:
                grads = _cuda.backward(mixer, names, inputs, dy, config, precision,
                                       initial_state=initial_state, d_final=d_final_state,
                                       cu_seqlens=_offsets(cu_seqlens), y=y)
            except NotImplementedError:
                pass  # no CUDA backward of this mixer (from a state, packed): the host path below
            else:
                out = [grads["d_" + n].to(t.dtype) for n, t in zip(names, inputs)]
                if initial_state is None:
                    return out + [mixed.new_empty(0, dtype=work)]
                return out + [grads["d_initial_state"].to(initial_state.dtype)]
        x = {n: _host(t) for n, t in zip(names, inputs)}
        if y is not None and precision == "exact":
            x["y"] = _host(y, work)
        layout = _state_layout(mixer, config, inputs, names, cu_seqlens, given) if stateful else None
        initial = None if initial_state is None else _state_to_host(initial_state, given or layout, work)
        d_final = None if d_final_state is None else _state_to_host(d_final_state, layout, work)
        grads, d_init = _mixers.backward(
            mixer,
            x,
            _host(dy, work),
            config=config,
            forward_form=form,
            backend=backend,
            cu_seqlens=_offsets(cu_seqlens),
            initial=initial,
            d_final=d_final,
        )
        out = [torch.from_numpy(grads["d_" + n]).to(device=t.device, dtype=t.dtype) for n, t in zip(names, inputs)]
        if initial_state is None:
            out.append(mixed.new_empty(0, dtype=work))
        else:
            out.append(_state_from_host(d_init, given or layout, initial_state.device, initial_state.dtype))
        return out

    def backward_fake(inputs, names, dy, initial_state, d_final_state, cu_seqlens, config, form, backend, precision,
                      y=None):
        config, _ = _split_config(config)
        mixed = _mixed(mixer, config, inputs, names)
        out = [t.new_empty(t.shape) for t in inputs]
        if initial_state is None:
            out.append(mixed.new_empty(0, dtype=_work_dtype(mixed)))
        else:
            out.append(initial_state.new_empty(initial_state.shape))
        return out

    bwd = torch.library.custom_op(base + "_backward", backward_impl, mutates_args=(), schema=_BACKWARD_SCHEMA)
    bwd.register_fake(backward_fake)

    def setup_context(ctx, inputs, output):
        tensors, names, initial_state, cu_seqlens, output_final_state, config, form, backend, precision = inputs
        keep = _keeps_output(mixer, config, tensors, names, initial_state, cu_seqlens, output_final_state, backend,
                             precision)
        _save(ctx, tensors, names, initial_state, cu_seqlens, output_final_state, (config, form, backend, precision),
              output[0] if keep else None)

    def backward(ctx, d_y, d_state):
        grads, d_initial = _backward(ctx, d_y, d_state, bwd)
        return grads, None, d_initial, None, None, None, None, None, None

    fwd.register_autograd(backward, setup_context=setup_context)
    _OPS[mixer] = fwd
    _IMPLS[mixer] = (forward_impl, backward_impl)
    return fwd


class _Eager(torch.autograd.Function):
    """The op's forward and backward implementations without ``torch.library``'s dispatch: what
    :func:`call` runs outside ``torch.compile`` (the same functions, so the same results; the
    custom op's Python dispatch layer costs tens of microseconds a call)."""

    @staticmethod
    def forward(ctx, mixer, names, initial_state, cu_seqlens, output_final_state, config, form, backend, precision,
                *tensors):
        forward_impl, backward_impl = _IMPLS[mixer]
        y, s = forward_impl(list(tensors), names, initial_state, cu_seqlens, output_final_state, config, form,
                            backend, precision)
        _save(ctx, tensors, names, initial_state, cu_seqlens, output_final_state, (config, form, backend, precision))
        if _keeps_output(mixer, config, tensors, names, initial_state, cu_seqlens, output_final_state, backend,
                         precision):
            ctx.kept = _KeptOutput(y)
        ctx.backward_impl = backward_impl
        if not output_final_state:
            ctx.mark_non_differentiable(s)
        return y, s

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_y, d_state):
        grads, d_initial = _backward(ctx, d_y, d_state, ctx.backward_impl)
        return (None, None, d_initial, None, None, None, None, None, None, *grads)


@functools.lru_cache(maxsize=None)
def _plan(mixer: str, names: Tuple[str, ...], config: str, form: str, backend: str, precision: str):
    """What a call without a state or ``cu_seqlens`` on the zero-copy CUDA path needs besides its
    tensors: ``(mixer, names, config, form, backend, precision, index of the mixed input)``, or
    ``None`` where the op's config carries a state's shapes (such a call takes :class:`_Eager`)."""
    config, given = _split_config(config)
    if given is not None:
        return None
    mixed = spec(mixer, config)["mixed"]
    if mixed not in names:
        raise ValueError(f"missing input `{mixed}` of `{mixer}` (the mixed input); given: {', '.join(names)}")
    return mixer, list(names), config, form, backend, precision, names.index(mixed)


def _wants_grad(requires_grad: bool) -> bool:
    """Whether a call needs an autograd node, given whether one of its tensors requires a
    gradient: one may be taken (grad mode on), or a forward-mode dual level is active (where a
    missing jvp must be an error, as it is for :class:`_Eager`)."""
    return (requires_grad and torch.is_grad_enabled()) or getattr(_FORWARD_AD, "_current_level", 0) != -1


def _plain_forward(plan, tensors: Sequence[torch.Tensor], cu_seqlens=None, saving=False):
    """``y`` of the op's forward implementation for a call of ``plan`` (:func:`_plan`) whose
    tensors are all on the CUDA backend's device: the zero-copy path, ``y`` in the mixed input's
    dtype; with ``cu_seqlens`` (the offsets tensor, ``fast`` form) the packed batch. With
    ``saving`` (the ``fast`` form without ``cu_seqlens``), the forward run for a backward:
    ``(y, the library's y, stats)``, ``stats`` what the library saved for the backward
    (:func:`mixers._cuda.forward_plain` with ``saving``) or ``None``."""
    mixer, names, config, form, _, precision, mixed = plan
    dtype = tensors[mixed].dtype
    if saving:
        y, stats = _cuda.forward_plain(mixer, names, tensors, config, "fast", precision, saving=True)
        return (y if y.dtype == dtype else y.to(dtype)), y, stats
    y = _cuda.forward_plain(mixer, names, tensors, config, form, precision, cu_seqlens=_offsets(cu_seqlens))
    return y if y.dtype == dtype else y.to(dtype)


class _Plain(torch.autograd.Function):
    """:class:`_Eager` for a call without a state on the zero-copy CUDA path: one non-tensor
    argument (the call's :func:`_plan` and its ``cu_seqlens``), ``y`` alone as the output, the forward
    :func:`_plain_forward`, the backward the op's backward implementation (so the same gradients,
    and the same fallback to the host path where the CUDA backend has no backward)."""

    @staticmethod
    def forward(ctx, call, *tensors):
        plan, cu_seqlens = call
        mixer, names, config, form, backend, precision, mixed = plan
        ctx.save_for_backward(*tensors)
        ctx.call = call
        if form == "fast" and cu_seqlens is None and _cuda_saves(mixer, config):
            # Run for the backward: where the library saves something for it (attention's row
            # statistics), the node keeps that and the library's `y`, and the backward skips the
            # forward it would otherwise run again.
            y, y_lib, stats = _plain_forward(plan, tensors, None, True)
            if stats is not None:
                ctx.saved_run = (_KeptOutput(y_lib), stats)
                return y
        else:
            y = _plain_forward(plan, tensors, cu_seqlens)
        if _keeps_output(mixer, config, tensors, names, None, cu_seqlens, False, backend, precision):
            ctx.kept = _KeptOutput(y)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_y):
        (mixer, names, config, form, backend, precision, _), cu_seqlens = ctx.call
        tensors = list(ctx.saved_tensors)
        if hasattr(ctx, "saved_run"):
            kept, stats = ctx.saved_run
            y = kept.get()
            if y is not None:  # (None: `y` was changed in place; the backward runs the forward)
                grads = _cuda.backward(mixer, names, tensors, d_y, config, precision, y=y, stats=stats)
                return (None, *(grads["d_" + n].to(t.dtype) for n, t in zip(names, tensors)))
        y = ctx.kept.get() if hasattr(ctx, "kept") else None
        grads = _IMPLS[mixer][1](tensors, names, d_y, None, None, cu_seqlens, config, form, backend, precision, y)
        return (None, *grads[: len(tensors)])


# Forward-mode AD's current level (-1 outside `torch.autograd.forward_ad.dual_level`).
_FORWARD_AD = torch.autograd.forward_ad


def _save(ctx, tensors, names, initial_state, cu_seqlens, output_final_state, options, y=None):
    """What the backward of a forward needs, kept on its autograd context (``y``, the forward's
    output, where the backward reads it: :func:`_keeps_output`; the op's autograd formula saves it
    as PyTorch saves an output, so that changing it in place is an error at the backward, as for
    PyTorch's own ops; the eager path keeps a :class:`_KeptOutput` instead)."""
    ctx.save_for_backward(*tensors, initial_state, cu_seqlens, y)
    ctx.count, ctx.names = len(tensors), list(names)
    ctx.want_final, ctx.options = bool(output_final_state), options


def _backward(ctx, d_y, d_state, backward_fn):
    """The inputs' gradients and the initial state's (``None`` without one) from the cotangents of
    ``y`` and of the final state, by ``backward_fn`` (the backward op or its implementation)."""
    saved = ctx.saved_tensors
    tensors, initial_state, cu_seqlens = list(saved[: ctx.count]), saved[ctx.count], saved[ctx.count + 1]
    y = saved[ctx.count + 2]
    if y is None and hasattr(ctx, "kept"):
        y = ctx.kept.get()
    d_final = d_state if ctx.want_final and d_state is not None else None
    grads = backward_fn(tensors, ctx.names, d_y, initial_state, d_final, cu_seqlens, *ctx.options, y)
    return list(grads[: ctx.count]), (grads[ctx.count] if initial_state is not None else None)


@torch.compiler.assume_constant_result
def config_json(config: Optional[dict]) -> str:
    """A config dict as the JSON string the op takes (keys sorted; constant under
    ``torch.compile``)."""
    if not config:
        return "{}"  # the common call: no config (json.dumps costs microseconds)
    return json.dumps(config, sort_keys=True)


def default_backend(t: torch.Tensor) -> str:
    """``cuda`` for a CUDA tensor, else ``cpu``."""
    return "cuda" if t.is_cuda else "cpu"


def call(
    mixer: str,
    config: Optional[dict],
    inputs: Dict[str, Optional[torch.Tensor]],
    *,
    form: str = "fast",
    backend: Optional[str] = None,
    precision: str = "exact",
    initial_state=None,
    output_final_state: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
):
    """Runs mixer ``mixer`` through its op: ``y``, or ``(y, final_state)`` with
    ``output_final_state``. ``inputs`` maps docs/math.md names to tensors (``None``: omitted);
    ``config`` is the mixer's config (a dict, ``None``: defaults). The state is the library's
    (docs/math.md §7.1): a tensor where it is one (``S [B, H, Dv, Dk]`` of the base mixers), a
    dict of tensors by name where it has several (the lifts' ``S`` and ``position``, the GLR's
    ``y`` and ``position``, attention's ``k``, ``v`` and ``length``, the Toeplitz mixer's ``x``
    and ``position``); a one-tensor state may be given as a dict too."""
    names, tensors = [], []
    for k, v in inputs.items():
        if v is None:
            continue
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"input `{k}`: expected a torch.Tensor, got {type(v).__name__}")
        names.append(k)
        tensors.append(v)
    if not tensors:
        raise ValueError(f"`{mixer}`: no inputs given")
    cfg = config_json(config)
    if backend is None:
        backend = default_backend(tensors[0])
    op = mixer_op(mixer)
    # The common call on the zero-copy path (`_cuda.applies` without a state; a packed batch in the
    # fast form), in eager mode outside functorch's transforms (which take the op's `_Eager`).
    if (initial_state is None and not output_final_state and backend == "cuda"
            and (form == "fast" or (form == "parallel" and cu_seqlens is None))
            and not torch.compiler.is_compiling() and not torch._C._are_functorch_transforms_active()):
        grad = False
        dev = _cuda.device(tensors[0])
        for t in tensors:
            if not (t.is_cuda and t.get_device() == dev):
                break
            if t.requires_grad:
                grad = True
        else:
            plan = _plan(mixer, tuple(names), cfg, form, backend, precision)
            if plan is not None:
                # No autograd node where no gradient is wanted, backward or forward-mode (a dual
                # level makes the Function's missing jvp an error, as it is for `_Eager`). A packed
                # batch the CUDA backend cannot run on device tensors takes the op's path below
                # (its host path).
                try:
                    if _wants_grad(grad):
                        return _Plain.apply((plan, cu_seqlens), *tensors)
                    return _plain_forward(plan, tensors, cu_seqlens)
                except NotImplementedError:
                    if cu_seqlens is None:
                        raise
    given = dict(zip(names, tensors))
    layout = None
    if initial_state is not None or output_final_state:
        args = _shape_args(tensors, names, cu_seqlens)
        state_names = _state_names(mixer, cfg, *args)
        if initial_state is not None:
            work = _work_dtype(given.get(_mixed_name(mixer, cfg), tensors[0]))
            packed = pack_state(initial_state, state_names, work)
        if len(state_names) > 1:
            # The final state's shapes (to unpack it) follow from the given state's.
            state_shapes = () if initial_state is None else tuple(
                (k, tuple(int(d) for d in t.shape)) for k, t in sorted(initial_state.items()))
            layout = dict(_layout_const(mixer, cfg, *args, state_shapes))
            if state_shapes:
                cfg = _with_given(cfg, state_shapes)
        if initial_state is not None:
            initial_state = packed
    args = (initial_state, cu_seqlens, bool(output_final_state), cfg, form, backend, precision)
    grad = any(t.requires_grad for t in tensors) or (initial_state is not None and initial_state.requires_grad)
    if torch.compiler.is_compiling():
        y, s = op(tensors, names, *args)
    elif _wants_grad(grad) or torch._C._are_functorch_transforms_active():
        y, s = _Eager.apply(mixer, names, *args, *tensors)
    else:
        # No gradient wanted (inference: prefill from a state, packed batches): the op's forward
        # implementation itself, without an autograd node (the same results).
        y, s = _IMPLS[mixer][0](tensors, names, *args)
    return (y, unpack_state(s, layout)) if output_final_state else y
