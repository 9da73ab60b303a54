"""Bad input raises the library's own messages, as ValueError (bad input), NotImplementedError
(a form, state or option a mixer lacks) or RuntimeError (a backend not available)."""

import numpy as np
import pytest
import torch

import mixers

from conftest import inputs

SIZES = dict(batch=2, seq=5, heads=2, dk=3, dv=2)


def test_wrong_shape():
    x = inputs("mamba2", **SIZES)
    x["k"] = x["k"][..., :2]
    with pytest.raises(ValueError, match=r"input `.`: expected shape .*Dk"):
        mixers.mamba2(**x)


def test_missing_and_unknown_inputs():
    x = inputs("mamba2", **SIZES)
    with pytest.raises(ValueError, match="missing input `g`"):
        mixers.run("mamba2", q=x["q"], k=x["k"], v=x["v"])
    with pytest.raises(ValueError, match="unexpected input `beta`"):
        mixers.run("mamba2", beta=x["g"], **x)


def test_wrong_dtypes():
    x = inputs("mamba2", **SIZES)
    with pytest.raises(ValueError, match="mix f32 and f64"):
        mixers.mamba2(x["q"].float(), x["k"], x["v"], x["g"])
    with pytest.raises(ValueError, match="expected a float32 or float64 numpy array, got a numpy array of dtype int64"):
        mixers.mamba2(x["q"].long(), x["k"].long(), x["v"].long(), x["g"].long())


def test_non_finite_and_out_of_range_values():
    x = inputs("mamba2", **SIZES)
    x["q"][0, 1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="input `q`: values must be finite"):
        mixers.mamba2(**x)
    x = inputs("gated-deltanet", **SIZES)
    x["g"][0, 0, 0] = 0.5
    with pytest.raises(ValueError, match="input `g`"):
        mixers.gated_delta_rule(**x)
    x = inputs("gated-deltanet", **SIZES)
    x["beta"][0, 0, 0] = 1.5
    with pytest.raises(ValueError, match="input `beta`"):
        mixers.gated_delta_rule(**x)


def test_packed_batches_need_one_row():
    x = inputs("mamba2", **SIZES)
    with pytest.raises(ValueError, match="cu_seqlens"):
        mixers.mamba2(**x, cu_seqlens=torch.tensor([0, 2, 5]))
    x = inputs("mamba2", **dict(SIZES, batch=1))
    with pytest.raises(ValueError, match="cu_seqlens"):
        mixers.mamba2(**x, cu_seqlens=torch.tensor([0, 4, 2]))
    with pytest.raises(ValueError, match="non-negative"):
        mixers.mamba2(**x, cu_seqlens=torch.tensor([0, -1]))
    with pytest.raises(ValueError, match="integer tensor"):
        mixers.mamba2(**x, cu_seqlens=torch.tensor([0.0, 5.0]))


def test_wrong_initial_state_shape():
    x = inputs("mamba2", **SIZES)
    with pytest.raises(ValueError, match="initial_state"):
        mixers.mamba2(**x, initial_state=torch.zeros(2, 2, 3, 3, dtype=torch.float64))


def test_a_form_without_a_state_refuses_one():
    # A lift under a level mask other than Fenwick's runs from its cache in the parallel and
    # materialized forms only.
    x = inputs("log-distance-mamba2", **SIZES)
    with pytest.raises(NotImplementedError, match="needs the Fenwick mask"):
        mixers.run("log-distance-mamba2", **x, form="fast", output_final_state=True)


def test_unknown_mixer_and_bad_config():
    with pytest.raises(ValueError, match="did you mean `mamba2`"):
        mixers.run("mamba3", q=torch.zeros(1))
    x = inputs("mamba2", **SIZES)
    with pytest.raises(ValueError, match="invalid config for `mamba2`"):
        mixers.run("mamba2", {"chunk": 3}, **x)
    with pytest.raises(ValueError, match="unknown form"):
        mixers.mamba2(**x, form="quick")
    with pytest.raises(ValueError, match="exact, tf32, bf16"):
        mixers.mamba2(**x, precision="fp8")
    with pytest.raises(ValueError, match="the bf16 mode takes f32 inputs"):
        mixers.mamba2(**x, precision="bf16")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_backend_not_available_here():
    x = inputs("mamba2", **SIZES)
    with pytest.raises(RuntimeError, match="backend `cuda` is not available"):
        mixers.mamba2(**x, backend="cuda")


def test_numpy_layer_and_listing():
    listing = mixers.list()
    names = [m["name"] for m in listing["mixers"]]
    assert "gated-deltanet" in names and "fibonacci-glr" in names
    assert "mixers-plugin-fibonacci" in " ".join(listing["plugins"]) or listing["plugins"]
    x = {k: v.numpy() for k, v in inputs("mamba2", **SIZES).items()}
    y = mixers.run_numpy("mamba2", **x)
    assert isinstance(y, np.ndarray) and y.shape == x["v"].shape
    assert np.array_equal(y, mixers.mamba2(**{k: torch.from_numpy(v) for k, v in x.items()}).numpy())
    dy = np.ones_like(y)
    grads = mixers.backward("mamba2", dy, **x)
    assert sorted(grads) == ["d_g", "d_k", "d_q", "d_v"]
    t = {k: torch.from_numpy(v).requires_grad_() for k, v in x.items()}
    mixers.mamba2(**t).backward(torch.from_numpy(dy))
    for k, v in t.items():
        assert np.array_equal(grads["d_" + k], v.grad.numpy())
