"""The zero-copy CUDA path of the PyTorch ops.

A call whose tensors are all CUDA tensors of the backend's device (:func:`device`: one device a
process, the first CUDA tensor's unless ``MIXERS_CUDA_DEVICE`` names it), run by the ``cuda`` backend in the
``parallel`` or ``fast`` form without ``cu_seqlens`` (and from a state only in the ``fast`` form
and the ``exact`` mode, for the mixers whose state runs on device tensors: linear attention,
Mamba-2, gated DeltaNet), goes here instead of through host copies:

- the library reads each input in place (a tensor that is not contiguous, or whose address is
  not a multiple of 16 bytes, is made contiguous first; dtypes are converted only where the
  precision mode needs another: half types to float32, the activations to bfloat16 in the
  ``bf16`` mode);
- the work is enqueued on ``torch.cuda.current_stream()`` and nothing waits for the device;
- every buffer the library needs, scratch and outputs alike, is allocated by PyTorch's caching
  allocator (``torch.empty`` of the bytes asked for, on the current stream, called from the
  library), and each output is such a tensor (resized in place to the output's shape) or a
  tensor on its storage, so memory statistics, stream semantics and CUDA-graph capture are
  PyTorch's own;
- kernels are compiled by NVRTC on a shape's first call: run each op once before capturing a
  graph (:func:`warmup`).

The common call (no state, outside ``torch.compile``; a packed batch too) comes here straight from
:func:`mixers._ops.call` through :func:`forward_plain` (no autograd ``Function`` at all when no
gradient is wanted): the same library call as :func:`forward`, with less Python around it.

Value constraints (``g ≤ 0``, ``beta ∈ [0, 1]``, finite inputs) are not checked on this path:
their outcome lives on the device and reading it would wait for the stream.
"""

from __future__ import annotations

import functools
import math
from typing import Dict, List, Optional, Sequence

import torch

from . import _mixers

_NAMES = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16"}
_DTYPES = {v: k for k, v in _NAMES.items()}
_HALF = (torch.bfloat16, torch.float16)
# mixer_core::precision::ACTIVATIONS: the inputs stored as bfloat16 in the `bf16` mode.
_ACTIVATIONS = ("x", "q", "k", "v")


def applies(tensors: Sequence[torch.Tensor], backend: str, form: str, stateful: bool, cu_seqlens,
            precision: str = "exact") -> bool:
    """Whether a call runs on the zero-copy path (else through host copies). A call from a state
    that the library cannot run on device tensors raises ``NotImplementedError`` there, and the
    caller falls back to the host path."""
    return (
        backend == "cuda"
        and form in ("fast", "parallel")
        and (not stateful or form == "fast")
        and (cu_seqlens is None or form == "fast")
        and all(t.is_cuda and t.get_device() == device(t) for t in tensors)
    )


# The ordinal of the CUDA backend's device (None until the first CUDA tensor binds it).
DEVICE: Optional[int] = None


def device(t: torch.Tensor) -> int:
    """The CUDA backend's device in this process: one device a process, bound on the first call
    with a CUDA tensor to that tensor's device (``MIXERS_CUDA_DEVICE``, where set, chooses it
    instead), as a process of ``torch.distributed`` works on one GPU; ``-1`` before a CUDA
    tensor was seen, or where the backend cannot start. A tensor on another device takes the
    host path (copied to the host and back), run on the backend's device."""
    global DEVICE
    if DEVICE is not None:
        return DEVICE
    if not t.is_cuda:
        return -1
    DEVICE = _mixers.cuda_bind_device(t.get_device())
    return DEVICE


@functools.lru_cache(maxsize=None)
def _allocator(device: torch.device):
    """``nbytes → (tensor, data_ptr)``: PyTorch's caching allocator, on the current stream (a
    float32 tensor where ``nbytes`` is a multiple of 4, else bytes: most outputs are float32, and
    :func:`_view` returns such an output's tensor itself)."""

    def alloc(nbytes: int):
        if nbytes % 4 == 0:
            t = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
        else:
            t = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return t, t.data_ptr()

    return alloc


def _dtype(name: str, t: torch.Tensor, precision: str) -> torch.dtype:
    """The dtype the library takes input ``name`` in: bfloat16 for the activations in the
    ``bf16`` mode (from float32 or a half type), float32 for half types otherwise; anything else
    as given (the library refuses what does not suit the mode, with its message)."""
    if precision == "bf16" and name in _ACTIVATIONS and t.dtype in (torch.float32,) + _HALF:
        return torch.bfloat16
    return torch.float32 if t.dtype in _HALF else t.dtype


def _raw(name: str, t: torch.Tensor, dtype: torch.dtype):
    """``(name, data_ptr, shape, dtype)`` of ``t`` as ``dtype``, contiguous and 16-byte aligned
    (converted or copied only where it is not already)."""
    if t.dtype == dtype and dtype in _NAMES and t.is_contiguous():
        ptr = t.data_ptr()
        if ptr % 16 == 0:  # the common case: read in place, nothing to make
            return t, (name, ptr, list(t.shape), _NAMES[dtype])
    t = t.detach()
    if t.dtype != dtype:
        t = t.to(dtype)
    if not t.is_contiguous():
        t = t.contiguous()
    if t.data_ptr() % 16:
        t = t.clone()
    if t.dtype not in _NAMES:
        raise ValueError(f"input `{name}`: expected a float32, float64 or bfloat16 CUDA tensor, got {t.dtype}")
    return t, (name, t.data_ptr(), list(t.shape), _NAMES[t.dtype])


# The current stream's handle without building a `torch.cuda.Stream` object (a few microseconds a
# call); the public call where this PyTorch lacks the private one.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(device: torch.device) -> int:
    """The handle of ``torch.cuda.current_stream(device)``."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _RAW_STREAM is not None:
        return _RAW_STREAM(index)
    return torch.cuda.current_stream(device).cuda_stream


def _prepare(names: Sequence[str], tensors: Sequence[torch.Tensor], precision: str):
    """The inputs as the library takes them, and the tensors made for them (converted or copied),
    which the caller keeps alive for the call. One pass: a float32/float64 tensor that the mode
    takes as it is, contiguous and 16-byte aligned, is read in place without further ado
    (:func:`_raw` for anything else)."""
    keep, raw = [], []
    bf16 = precision == "bf16"
    f32, f64 = torch.float32, torch.float64
    for n, t in zip(names, tensors):
        dt = t.dtype
        # (`_dtype` keeps float64, and float32 except for an activation in the bf16 mode)
        if (dt is f32 and not (bf16 and n in _ACTIVATIONS)) or dt is f64:
            if t.is_contiguous():
                ptr = t.data_ptr()
                if not ptr % 16:
                    raw.append((n, ptr, t.shape, "f32" if dt is f32 else "f64"))
                    continue
        t, r = _raw(n, t, _dtype(n, t, precision))
        keep.append(t)
        raw.append(r)
    return keep, raw


def _view(out, fresh: bool = True) -> torch.Tensor:
    """An output of the library as a tensor on the storage of the PyTorch tensor that owns its
    memory (no copy; contiguous; not an autograd view of it, so it may be modified in place).
    Where the output fills that tensor (from offset 0, of its dtype) and is the first output of
    it (``fresh``), the output is that tensor itself, resized to the output's shape in place: the
    tensor is one of :func:`_allocator`'s, which nothing else holds once the library returns."""
    owner, offset, shape, dtype = out
    dt = _DTYPES[dtype]
    if fresh and offset == 0 and owner.dtype is dt and owner.numel() == math.prod(shape):
        return owner.resize_(shape)
    return owner.new_empty(0, dtype=dt).set_(owner.untyped_storage(), offset // dt.itemsize, shape)


def _views(outs) -> List[torch.Tensor]:
    """:func:`_view` of several outputs (``None`` stays ``None``), each owner's tensor reused by
    its first output only."""
    seen, views = set(), []
    for out in outs:
        if out is None:
            views.append(None)
            continue
        views.append(_view(out, id(out[0]) not in seen))
        seen.add(id(out[0]))
    return views


def _state(name: str, s: Optional[torch.Tensor], tensors: Sequence[torch.Tensor]):
    """A state tensor as the library takes it (float64 with float64 inputs, else float32), or
    ``(None, None)``."""
    if s is None:
        return None, None
    return _raw(name, s, torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32)


def forward(mixer: str, names: Sequence[str], tensors: Sequence[torch.Tensor], config: str, form: str,
            precision: str, initial_state: Optional[torch.Tensor] = None, want_final: bool = False,
            cu_seqlens: Optional[List[int]] = None):
    """``(y, final_state)`` of the ``parallel`` or ``fast`` form, enqueued on the current stream
    (``y`` in the library's dtype: the mixed input's work dtype, bfloat16 in the ``bf16`` mode;
    ``final_state`` ``None`` unless ``want_final``). With ``initial_state`` or ``want_final`` the
    ``fast`` form runs from the state (zeros without one), in the mode asked (the state float32,
    or float64 with float64 inputs). With ``cu_seqlens`` (the offsets, a list) the ``fast`` form runs
    over the packed batch (one state row per sequence): in one launch sequence where the library has
    one (linear attention and Mamba-2 in the tf32 and bf16 modes), else sequence by sequence on views
    of the buffer."""
    keep, raw = _prepare(names, tensors, precision)
    s0, s0_raw = _state("initial_state", initial_state, tensors)
    device = tensors[0].device
    stream = _stream(device)
    y, fin, _ = _mixers.cuda_forward(mixer, raw, stream, _allocator(device), config=config, form=form,
                                     precision=precision, initial=s0_raw, want_final=want_final,
                                     cu_seqlens=cu_seqlens)
    del keep, s0
    y, fin = _views((y, fin))
    return y, fin


@functools.lru_cache(maxsize=None)
def _allocator_of(index: int):
    """:func:`_allocator` of CUDA device ``index``."""
    return _allocator(torch.device("cuda", index))


def forward_plain(mixer: str, names: Sequence[str], tensors: Sequence[torch.Tensor], config: str, form: str,
                  precision: str, cu_seqlens: Optional[List[int]] = None, saving: bool = False):
    """``y`` of :func:`forward` without a state, for tensors that are all on the backend's device (the
    caller has checked; :func:`applies` holds), enqueued on the current stream: the same library
    call, with less Python around it (the common call of :func:`mixers._ops.call`); with
    ``cu_seqlens`` (the offsets) the packed batch. With ``saving`` (the ``fast`` form, no
    ``cu_seqlens``) the forward runs for a backward and the result is ``(y, stats)``, ``stats``
    what the CUDA backend saves for that backward (attention on tensor cores: each row's softmax
    statistics, a float32 tensor) or ``None``: give both ``y`` (as the library returned it) and
    ``stats`` to :func:`backward`, which then skips the forward it would otherwise run again."""
    keep, raw = _prepare(names, tensors, precision)
    index = device(tensors[0])
    stream = _RAW_STREAM(index) if _RAW_STREAM is not None else torch.cuda.current_stream(index).cuda_stream
    y, _, stats = _mixers.cuda_forward(mixer, raw, stream, _allocator_of(index), config=config, form=form,
                                       precision=precision, cu_seqlens=cu_seqlens, saving=saving)
    del keep
    return tuple(_views((y, stats))) if saving else _view(y)


def backward(mixer: str, names: Sequence[str], tensors: Sequence[torch.Tensor], dy: torch.Tensor, config: str,
             precision: str, requires: Optional[List[str]] = None, initial_state: Optional[torch.Tensor] = None,
             d_final: Optional[torch.Tensor] = None, cu_seqlens: Optional[List[int]] = None,
             y: Optional[torch.Tensor] = None, stats: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
    """The ``fast`` backward for the cotangent ``dy``, enqueued on the current stream:
    ``{"d_<input>": tensor}`` (float32 in the ``tf32`` and ``bf16`` modes, else the inputs'
    dtype). From a state (``initial_state`` or the final state's cotangent ``d_final``) computed in
    the exact mode on the values as the mode stores them, with ``"d_initial_state"`` when
    ``initial_state`` is given. With ``cu_seqlens``, the backward of the packed batch. ``y``: the
    forward's output (float32 or float64; no state, no ``cu_seqlens``), which a backward that
    reads it then does not recompute; with ``stats`` (from :func:`forward_plain` with ``saving``, given with its
    ``y``) the backward skips the forward. ``NotImplementedError`` where the CUDA backend has no
    such backward for the mixer."""
    keep, raw = _prepare(names, tensors, precision)
    dy_dtype = torch.bfloat16 if precision == "bf16" else (torch.float32 if dy.dtype in _HALF else dy.dtype)
    dy_t, dy_raw = _raw("dy", dy, dy_dtype)
    for name, t in (("y", y), ("y_stats", stats)):
        if t is not None:
            t, r = _raw(name, t, t.dtype)
            keep.append(t)
            raw.append(r)
    (s0, s0_raw), (df, df_raw) = _state("initial_state", initial_state, tensors), _state("d_final", d_final, tensors)
    device = tensors[0].device
    stream = _stream(device)
    grads = _mixers.cuda_backward(mixer, raw, dy_raw, stream, _allocator(device), config=config,
                                  precision=precision, requires=requires, initial=s0_raw, d_final=df_raw,
                                  cu_seqlens=cu_seqlens)
    del keep, dy_t, s0, df
    return dict(zip(grads, _views(grads.values())))


def warmup(fn, *args, **kwargs):
    """Runs ``fn(*args, **kwargs)`` once on a side stream, with its backward (through
    ``torch.autograd.grad``, so no ``.grad`` is touched) when the result requires a gradient,
    and waits for it: every kernel the call needs is then compiled (NVRTC) and every FFT plan
    made, so that the same call can be captured in a CUDA graph. Returns ``fn``'s result."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fn(*args, **kwargs)
        first = out[0] if isinstance(out, (tuple, list)) else out
        leaves = [t for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor) and t.requires_grad]
        if isinstance(first, torch.Tensor) and first.requires_grad and leaves:
            torch.autograd.grad(first.float().sum(), leaves, allow_unused=True)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    return out
