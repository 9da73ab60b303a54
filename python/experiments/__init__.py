"""The papers' synthetic experiments in PyTorch, with the library's mixers as the token mixers
(docs/papers.md): the GLR paper's Table 1 (copy, associative recall, multi-hop recall for its nine
structures), the log-linear paper's MQAR (Mamba-2, gated DeltaNet and their lifts) and the
Toeplitz paper's copy claim.

- :mod:`experiments.tasks`: seeded data generators (copy, MQAR, multi-hop recall);
- :mod:`experiments.model`: embedding, blocks of norm → mixer → norm → MLP, head; one mixer layer
  per family (attention, GLR, Mamba-2 / gated DeltaNet and lifts, Toeplitz) calling
  ``mixers.run``;
- :mod:`experiments.train`: one training run (AdamW, warm-up and cosine decay) and its JSON log;
- :mod:`experiments.report`: Kendall τ, the Markdown table, the plots;
- :mod:`experiments.settings`: every experiment's settings per budget (``tiny``, ``short``,
  ``paper``);
- ``python -m experiments.table1``, ``python -m experiments.mqar``,
  ``python -m experiments.toeplitz_copy``: one command per experiment (run from ``python/``).
"""

import os as _os
import sys as _sys


def _installed_mixers_first() -> None:
    """``python -m experiments.…`` run from ``python/`` puts ``python/`` first on ``sys.path``,
    where the source tree of ``mixers`` (without its compiled extension) would shadow the installed
    package: that entry moves to the end, so the installed package is found first and the source
    tree only when nothing is installed."""
    here = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    hits = [p for p in _sys.path if _os.path.abspath(p or ".") == here]
    for p in hits:
        _sys.path.remove(p)
    _sys.path.extend(hits)


_installed_mixers_first()
