"""Every experiment's rows (structure, registered mixer, config, the paper's numbers) and its
settings per budget. docs/papers.md tabulates them with where each value comes from: the paper
where it states it, else its task's standard source (Zoology for MQAR, Jelassi et al. 2024 for
copy), else our choice, fixed across structures.

Budgets: ``tiny`` (CPU smoke: tiny tasks and model, seconds), ``short`` (the paper's tasks and
model, fewer steps and one learning rate: a first GPU pass), ``paper`` (the full setting with the
learning-rate sweep)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from .tasks import TaskConfig


@dataclass(frozen=True)
class Row:
    """One structure: label, registered mixer, its config, the paper's accuracy (%) per task."""

    label: str
    mixer: str
    config: Dict = field(default_factory=dict)
    paper: Dict[str, Optional[float]] = field(default_factory=dict)
    #: Relative cost of a training step per token (scheduling only: with ``--jobs`` the costliest
    #: runs start first).
    cost: float = 1.0


@dataclass(frozen=True)
class Budget:
    """Tasks, model and optimisation of one budget of an experiment (``run`` holds the
    :class:`~experiments.train.RunConfig` fields shared by every run)."""

    tasks: Tuple[TaskConfig, ...]
    run: Dict
    lrs: Tuple[float, ...]


#: Kernel of the short causal convolution before every mixer of `table1` and `mqar` (the
#: layers of Mamba-2, gated DeltaNet and Zoology's attention models have one): without it
#: attention learned MQAR at T = 64 but not at T = 128 or 256 (docs/papers.md).
SHORT_CONV = 3

WINDOW = 8  # local attention's window and the k-th order recurrence's k (Table 1 gives neither)

TABLE1_ROWS = [
    Row("Attention", "attention", {}, {"copy": 100.00, "mqar": 100.00, "multihop": 39.21}),
    Row(f"Local attention (w = {WINDOW})", "local-attention", {"window": WINDOW},
        {"copy": 23.75, "mqar": 26.20, "multihop": 23.59}),
    Row("Diagonal SSM", "diagonal-ssm", {}, {"copy": 42.98, "mqar": 32.53, "multihop": 27.17}),
    Row(f"k-th order recurrence (k = {WINDOW})", "kth-order", {"order": WINDOW},
        {"copy": 74.66, "mqar": 41.12, "multihop": 39.08}),
    Row("Dense recurrence", "dense-recurrence", {}, {"copy": 100.00, "mqar": 99.99, "multihop": 99.80}, cost=10.0),
    Row("f(k) = 2^k", "glr", {"pattern": "pow2"}, {"copy": 92.63, "mqar": 49.03, "multihop": 34.85}),
    Row("f(k) = 2^k + cache-eff", "glr", {"pattern": "pow2", "cache_efficient": True},
        {"copy": 75.47, "mqar": 52.59, "multihop": 38.63}),
    Row("f(k) = k²+1", "glr", {"pattern": "sq1"}, {"copy": 99.66, "mqar": 53.61, "multihop": 35.68}),
    Row("f(k) = k²+1 + cache-eff", "glr", {"pattern": "sq1", "cache_efficient": True},
        {"copy": 91.59, "mqar": 54.56, "multihop": 38.02}),
]

MQAR_ROWS = [
    Row("Mamba-2", "mamba2", {}, {"mqar": 89.6}),
    Row("Log-linear Mamba-2", "loglinear-mamba2", {}, {"mqar": 92.9}),
    Row("Gated DeltaNet", "gated-deltanet", {}, {"mqar": 79.0}),
    Row("Log-linear gated DeltaNet", "loglinear-gated-deltanet", {}, {"mqar": 84.4}),
]

#: The lifts and their bases, with the log-linear paper's MQAR gain (points).
LIFTS = [("mamba2", "loglinear-mamba2", 3.3), ("gated-deltanet", "loglinear-gated-deltanet", 5.4)]

# The Toeplitz paper reports training curves, not a table: its claim is an ordering.
TOEPLITZ_ROWS = [
    Row("Attention", "attention", {}),
    Row("Toeplitz", "toeplitz", {}),
    Row("Mamba-2", "mamba2", {}),
]

_TINY_RUN = dict(width=16, layers=1, heads=2, mlp=2, steps=120, batch=16, val_size=64, test_size=64,
                 eval_every=20)

BUDGETS: Dict[str, Dict[str, Budget]] = {
    "table1": {
        "tiny": Budget(
            (TaskConfig("copy", alphabet=4, min_len=1, max_len=4),
             TaskConfig("mqar", vocab=16, pairs=2, seq_len=12),
             TaskConfig("multihop", vocab=12, pairs=4, max_hops=2, queries=2)),
            dict(_TINY_RUN, conv=SHORT_CONV), (1e-2,)),
        "short": Budget(
            (TaskConfig("copy", alphabet=26, min_len=1, max_len=64),
             TaskConfig("mqar", vocab=256, pairs=16, seq_len=256),
             TaskConfig("multihop", vocab=64, pairs=24, max_hops=4, queries=4)),
            dict(width=64, layers=2, heads=2, mlp=2, conv=SHORT_CONV, steps=1000, batch=64, val_size=512,
                 test_size=1000),
            (3e-3,)),
        "paper": Budget(
            (TaskConfig("copy", alphabet=26, min_len=1, max_len=64),
             TaskConfig("mqar", vocab=256, pairs=16, seq_len=256),
             TaskConfig("multihop", vocab=64, pairs=24, max_hops=4, queries=4)),
            dict(width=64, layers=2, heads=2, mlp=2, conv=SHORT_CONV, steps=4000, batch=64, val_size=512,
                 test_size=1000),
            (1e-3, 3e-3, 1e-2)),
    },
    "mqar": {
        "tiny": Budget((TaskConfig("mqar", vocab=16, pairs=2, seq_len=12),), dict(_TINY_RUN, conv=SHORT_CONV),
                       (1e-2,)),
        # Zoology's MQAR at 64 pairs: vocabulary 8192, T = 256, 100 000 training examples, a
        # test set of 3000, AdamW with weight decay 0.1, learning rates logspace(−4, −2, 4)
        # (Zoology's batches at T = 256 are 256; ours are 64); model width 32 (the log-linear
        # paper's MQAR), 2 blocks.
        "short": Budget(
            (TaskConfig("mqar", vocab=8192, pairs=64, seq_len=256),),
            dict(width=32, layers=2, heads=2, mlp=2, conv=SHORT_CONV, steps=12500, batch=64, train_examples=100_000,
                 val_size=1000, test_size=3000, weight_decay=0.1, betas=(0.9, 0.999)),
            (2.154e-3, 1e-2)),
        "paper": Budget(
            (TaskConfig("mqar", vocab=8192, pairs=64, seq_len=256),),
            dict(width=32, layers=2, heads=2, mlp=2, conv=SHORT_CONV, steps=100_000, batch=64, train_examples=100_000,
                 val_size=1000, test_size=3000, weight_decay=0.1, betas=(0.9, 0.999), eval_every=5000),
            (1e-4, 4.642e-4, 2.154e-3, 1e-2)),
    },
    "toeplitz_copy": {
        "tiny": Budget((TaskConfig("copy", alphabet=6, min_len=3, max_len=3),), dict(_TINY_RUN), (1e-2,)),
        # The Toeplitz paper's copy: 512 tokens copied from the input to the output (alphabet 26 as
        # Jelassi et al.).
        "short": Budget(
            (TaskConfig("copy", alphabet=26, min_len=512, max_len=512),),
            dict(width=64, layers=2, heads=2, mlp=2, steps=1000, batch=32, val_size=256, test_size=512),
            (3e-3,)),
        "paper": Budget(
            (TaskConfig("copy", alphabet=26, min_len=512, max_len=512),),
            dict(width=64, layers=2, heads=2, mlp=2, steps=4000, batch=32, val_size=256, test_size=512,
                 eval_every=200),
            (1e-3, 3e-3)),
    },
}

ROWS: Dict[str, List[Row]] = {"table1": TABLE1_ROWS, "mqar": MQAR_ROWS, "toeplitz_copy": TOEPLITZ_ROWS}


def budget(experiment: str, name: str, steps: Optional[int] = None) -> Budget:
    """The budget ``name`` of ``experiment`` (``ValueError`` naming the choices otherwise);
    ``steps`` overrides its number of steps."""
    if experiment not in BUDGETS:
        raise ValueError(f"unknown experiment `{experiment}`; expected one of {', '.join(BUDGETS)}")
    if name not in BUDGETS[experiment]:
        raise ValueError(f"unknown budget `{name}`; expected one of {', '.join(BUDGETS[experiment])}")
    b = BUDGETS[experiment][name]
    if steps is not None:
        b = replace(b, run={**b.run, "steps": steps})
    return b
