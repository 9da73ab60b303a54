"""Seeded synthetic tasks as integer arrays: copy (Jelassi et al. 2024), multi-query associative
recall (MQAR, Zoology) and multi-hop recall, the definitions of the Rust trainer
(``train/src/tasks.rs``, docs/training.md) except where noted.

Every example has the task's fixed length ``T``: ``tokens [n, T]`` (int64), ``targets [n, T]``
(the next token where the loss is taken, :data:`IGNORE` elsewhere) and ``groups [n, T]`` (multi-hop:
the hop count − 1 of a labelled position; else 0).

- ``copy``: ``$ s | s .`` padded with ``*`` over an alphabet of ``A`` symbols (ids ``0..A−1``,
  then ``$ | . *``); ``|s|`` uniform in ``[min_len, max_len]``; ``T = 2·max_len + 2``; the inputs
  are the sequence without its last token, the targets the sequence shifted by one, labelled on
  the copied ``s`` and the final ``.``.
- ``mqar``: ``D`` pairs ``k v`` (distinct keys in ``[1, V/2)``, distinct values in ``[V/2, V)``), then
  every key once more in a query slot ``2D + 2j`` chosen without replacement with probability
  ``∝ (j+1)^(a−1)``, followed by its value; 0 elsewhere; the target at a queried key is its value.
  Values are distinct, as in Zoology.
- ``multihop``: node-disjoint chains ``x₀ → … → x_h`` over symbols ``0..V−2`` written as shuffled
  pairs ``a b``, then ``SEP = V − 1`` and the first symbols of ``queries`` chains (hops uniform in
  ``1..max_hops``), each labelled with its chain's end; distractor chains fill ``pairs``.

Splits are fixed by a hash of the tokens (:func:`bucket`): test, validation and training examples
never coincide, whatever the seeds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, Tuple

import numpy as np

#: The target of an unlabelled position (``torch.nn.functional.cross_entropy``'s default).
IGNORE = -100

TASKS = ("copy", "mqar", "multihop")


@dataclass(frozen=True)
class TaskConfig:
    """A task and its settings; fields that do not apply to the task are ignored."""

    task: str = "copy"
    #: copy: alphabet size; the vocabulary adds ``$ | . *``.
    alphabet: int = 8
    #: copy: shortest and longest string.
    min_len: int = 4
    max_len: int = 10
    #: mqar, multihop: vocabulary size.
    vocab: int = 32
    #: mqar: key–value pairs; multihop: pairs in the context.
    pairs: int = 6
    #: mqar: sequence length (≥ 4·pairs).
    seq_len: int = 32
    #: mqar: power-law exponent of the query gaps (Zoology: 0.01).
    power_a: float = 0.01
    #: multihop: longest chain and number of queries.
    max_hops: int = 3
    queries: int = 2

    def validate(self) -> None:
        """Raises ``ValueError`` (saying what was expected and given) on settings no generator
        can honour."""
        if self.task not in TASKS:
            raise ValueError(f"unknown task `{self.task}`; expected one of {', '.join(TASKS)}")
        if self.task == "copy":
            if not 1 <= self.alphabet <= 4096:
                raise ValueError(f"copy: alphabet must be in 1..=4096, got {self.alphabet}")
            if not 1 <= self.min_len <= self.max_len:
                raise ValueError(f"copy: need 1 ≤ min_len ≤ max_len, got {self.min_len}..{self.max_len}")
        elif self.task == "mqar":
            keys = self.vocab // 2 - 1
            if self.vocab < 6:
                raise ValueError(f"mqar: vocab must be ≥ 6, got {self.vocab}")
            if not 1 <= self.pairs <= keys or self.pairs > self.vocab - self.vocab // 2:
                raise ValueError(f"mqar: pairs must be in 1..={keys} (distinct keys in [1, V/2)), got {self.pairs}")
            if self.seq_len < 4 * self.pairs:
                raise ValueError(f"mqar: seq_len must be ≥ 4·pairs = {4 * self.pairs}, got {self.seq_len}")
            if not 0.0 < self.power_a <= 1.0:
                raise ValueError(f"mqar: power_a must be in (0, 1], got {self.power_a}")
        else:
            if self.max_hops < 1 or self.queries < 1:
                raise ValueError(f"multihop: max_hops and queries must be ≥ 1, got {self.max_hops}, {self.queries}")
            if self.pairs < self.queries * self.max_hops:
                raise ValueError(
                    f"multihop: pairs ({self.pairs}) must be ≥ queries·max_hops ({self.queries * self.max_hops})"
                )
            if self.vocab < 2 * self.pairs + 1:
                raise ValueError(f"multihop: vocab must be ≥ 2·pairs + 1 = {2 * self.pairs + 1}, got {self.vocab}")

    @property
    def vocab_size(self) -> int:
        """Number of token ids."""
        return self.alphabet + 4 if self.task == "copy" else self.vocab

    @property
    def length(self) -> int:
        """Input length ``T`` of every example."""
        if self.task == "copy":
            return 2 * self.max_len + 2
        if self.task == "mqar":
            return self.seq_len
        return 2 * self.pairs + 1 + self.queries

    @property
    def labels(self) -> int:
        """The most labelled positions an example has (copy: the string and its final `.`; mqar:
        a query per pair; multihop: the queries)."""
        if self.task == "copy":
            return self.max_len + 1
        if self.task == "mqar":
            return self.pairs
        return self.queries

    def to_dict(self) -> Dict:
        return asdict(self)


def _copy(c: TaskConfig, rng: np.random.Generator, n: int):
    a, t = c.alphabet, c.length
    dollar, bar, dot, pad = a, a + 1, a + 2, a + 3
    seq = np.full((n, t + 1), pad, dtype=np.int64)
    targets = np.full((n, t), IGNORE, dtype=np.int64)
    lens = rng.integers(c.min_len, c.max_len + 1, size=n)
    for i, m in enumerate(lens):
        s = rng.integers(0, a, size=m)
        seq[i, 0] = dollar
        seq[i, 1 : m + 1] = s
        seq[i, m + 1] = bar
        seq[i, m + 2 : 2 * m + 2] = s
        seq[i, 2 * m + 2] = dot
        # Position p predicts seq[p + 1]: labelled for the copied s and the final `.`.
        targets[i, m + 1 : 2 * m + 2] = seq[i, m + 2 : 2 * m + 3]
    return seq[:, :t], targets, np.zeros((n, t), dtype=np.int64)


def _distinct(rng: np.random.Generator, n: int, lo: int, hi: int, d: int) -> np.ndarray:
    """``[n, d]``: per row ``d`` distinct integers of ``[lo, hi)``, uniformly without replacement,
    in random order. Small ranges: the first ``d`` of a random permutation per row. Large ones
    (``hi − lo > 4d``): the first ``d`` distinct values of ``2d`` uniform draws (the same law),
    rows with fewer drawn again."""
    m = hi - lo
    if m <= 4 * d:
        return np.argsort(rng.random((n, m)), axis=1)[:, :d] + lo
    out = np.empty((n, d), dtype=np.int64)
    todo = np.arange(n)
    while len(todo):
        cand = rng.integers(0, m, size=(len(todo), 2 * d))
        order = np.argsort(cand, axis=1, kind="stable")
        sorted_ = np.take_along_axis(cand, order, axis=1)
        repeat = np.zeros_like(cand, dtype=bool)  # a value drawn earlier in the row
        np.put_along_axis(repeat, order[:, 1:], sorted_[:, 1:] == sorted_[:, :-1], axis=1)
        ok = (~repeat).sum(axis=1) >= d
        keep = np.argsort(repeat, axis=1, kind="stable")[:, :d]  # the first d distinct, in draw order
        out[todo[ok]] = np.take_along_axis(cand, keep, axis=1)[ok] + lo
        todo = todo[~ok]
    return out


def _mqar(c: TaskConfig, rng: np.random.Generator, n: int):
    v, d, t = c.vocab, c.pairs, c.seq_len
    half = v // 2
    space = (t - 2 * d) // 2
    logp = (c.power_a - 1.0) * np.log(np.arange(1, space + 1, dtype=np.float64))
    rows = np.arange(n)[:, None]
    tokens = np.zeros((n, t), dtype=np.int64)
    targets = np.full((n, t), IGNORE, dtype=np.int64)
    keys = _distinct(rng, n, 1, half, d)
    vals = _distinct(rng, n, half, v, d)
    tokens[:, 0 : 2 * d : 2] = keys
    tokens[:, 1 : 2 * d : 2] = vals
    # The query slots: d of `space` drawn one after another without replacement with probability
    # ∝ (j+1)^(a−1) among those left, as the Gumbel-top-d of the log weights (the same
    # distribution, ordered as the successive draws: key i goes to the i-th slot drawn).
    slots = 2 * d + 2 * np.argsort(-(logp + rng.gumbel(size=(n, space))), axis=1)[:, :d]
    tokens[rows, slots] = keys
    tokens[rows, slots + 1] = vals
    targets[rows, slots] = vals
    return tokens, targets, np.zeros((n, t), dtype=np.int64)


def _multihop(c: TaskConfig, rng: np.random.Generator, n: int):
    sep, t, q, pairs = c.vocab - 1, c.length, c.queries, c.pairs
    rows = np.arange(n)[:, None]
    # Hop counts per chain: the queried chains uniform in 1..max_hops, then distractor chains
    # uniform in 1..min(max_hops, pairs left) until `pairs` pairs are used (0: no chain).
    hops = np.zeros((n, pairs), dtype=np.int64)
    hops[:, :q] = rng.integers(1, c.max_hops + 1, size=(n, q))
    used = hops[:, :q].sum(axis=1)
    u = rng.random((n, pairs))
    for k in range(q, pairs):
        m = np.minimum(c.max_hops, pairs - used)
        hops[:, k] = np.where(m > 0, 1 + (u[:, k] * np.maximum(m, 1)).astype(np.int64), 0)
        used += hops[:, k]
    # Chain k takes symbols start_k … start_k + hops_k of a random permutation of 0..V−2 (node-
    # disjoint); its pairs start at every one of them but its last.
    symbols = np.argsort(rng.random((n, sep)), axis=1)
    size = hops + (hops > 0)  # symbols per chain
    ends = np.cumsum(size, axis=1) - 1  # the last symbol of each chain
    starts = ends - hops
    # True where a position is not a pair's first symbol: past the chains, or a chain's last.
    not_first = np.arange(sep + 1)[None, :] >= size.sum(axis=1)[:, None]
    np.put_along_axis(not_first, np.where(hops > 0, ends, sep), True, axis=1)
    first = np.argsort(not_first, axis=1, kind="stable")[:, :pairs]  # the `pairs` pair starts
    first = np.take_along_axis(first, np.argsort(rng.random((n, pairs)), axis=1), axis=1)  # shuffled
    tokens = np.zeros((n, t), dtype=np.int64)
    targets = np.full((n, t), IGNORE, dtype=np.int64)
    groups = np.zeros((n, t), dtype=np.int64)
    tokens[:, 0 : 2 * pairs : 2] = symbols[rows, first]
    tokens[:, 1 : 2 * pairs : 2] = symbols[rows, first + 1]
    tokens[:, 2 * pairs] = sep
    pos = 2 * pairs + 1 + np.arange(q)
    tokens[:, pos] = symbols[rows, starts[:, :q]]
    targets[:, pos] = symbols[rows, ends[:, :q]]
    groups[:, pos] = hops[:, :q] - 1
    return tokens, targets, groups


_GENERATORS = {"copy": _copy, "mqar": _mqar, "multihop": _multihop}


def generate(c: TaskConfig, n: int, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` examples drawn from ``rng``: ``(tokens, targets, groups)``, each ``[n, T]`` int64."""
    c.validate()
    if n < 0:
        raise ValueError(f"the number of examples must be ≥ 0, got {n}")
    return _GENERATORS[c.task](c, rng, n)


#: Held-out buckets: an example is in the test split when ``hash(tokens) mod 8 = 0``, in the
#: validation split when it is 1, in the training split otherwise (the Rust trainer's rule, with a
#: validation bucket added).
BUCKETS = 8
SPLITS = {"test": 0, "val": 1}


def token_hash(tokens: np.ndarray) -> np.ndarray:
    """FNV-1a over each row's tokens, then a final mix (the Rust trainer's ``hash``): ``[n]``
    uint64."""
    h = np.full(tokens.shape[0], 0xCBF29CE484222325, dtype=np.uint64)
    prime = np.uint64(0x100000001B3)
    with np.errstate(over="ignore"):
        for col in tokens.astype(np.uint64).T:
            h = (h ^ col) * prime
        h ^= h >> np.uint64(33)
        h = h * np.uint64(0xFF51AFD7ED558CCD)
    return h ^ (h >> np.uint64(33))


def bucket(tokens: np.ndarray) -> np.ndarray:
    """The split bucket of each row: ``token_hash mod 8``."""
    return (token_hash(tokens) % np.uint64(BUCKETS)).astype(np.int64)


def sample(c: TaskConfig, n: int, rng: np.random.Generator, split: str):
    """``n`` examples of ``split`` (``train``, ``val`` or ``test``): drawn from ``rng`` and redrawn
    until their bucket is the split's; ``ValueError`` when the task has too few distinct examples
    to fill it."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"unknown split `{split}`; expected train, val or test")
    parts, have, draws = [], 0, 0
    while have < n:
        # A quarter of the draws fall in the held-out buckets: draw a third more than needed.
        t, y, g = generate(c, max((n - have) * 4 // 3 + 8, 16), rng)
        b = bucket(t)
        keep = (b >= len(SPLITS)) if split == "train" else (b == SPLITS[split])
        parts.append((t[keep], y[keep], g[keep]))
        have += int(keep.sum())
        draws += len(t)
        if draws > 1000 * max(n, 16) and have < n:
            raise ValueError(f"task {c.task}: only {have} of {n} {split} examples found in {draws} draws; "
                             "the task has too few distinct examples for its splits")
    return tuple(np.concatenate([p[i] for p in parts])[:n] for i in range(3))


class Split:
    """A fixed held-out set (``val`` or ``test``) of ``n`` examples drawn with ``seed``."""

    def __init__(self, c: TaskConfig, n: int, seed: int, which: str):
        self.tokens, self.targets, self.groups = sample(c, n, np.random.default_rng(seed), which)


class TrainStream:
    """Training batches for a seed: from a fixed pool of ``pool`` training-split examples shuffled
    every epoch (Zoology's finite training set), or fresh ones every step with ``pool = 0``."""

    def __init__(self, c: TaskConfig, batch: int, seed: int, pool: int):
        self.c, self.batch = c, batch
        self.rng = np.random.default_rng([seed, 1])
        self.pool = None
        if pool > 0:
            if pool < batch:
                raise ValueError(f"the training pool ({pool} examples) is smaller than a batch ({batch})")
            self.pool = sample(c, pool, self.rng, "train")
            self.order, self.at = self.rng.permutation(pool), 0

    def next(self) -> Tuple[np.ndarray, np.ndarray]:
        """``(tokens, targets)`` of the next batch."""
        if self.pool is None:
            t, y, _ = sample(self.c, self.batch, self.rng, "train")
            return t, y
        if self.at + self.batch > len(self.order):
            self.order, self.at = self.rng.permutation(len(self.order)), 0
        idx = self.order[self.at : self.at + self.batch]
        self.at += self.batch
        return self.pool[0][idx], self.pool[1][idx]

    def state(self) -> Dict:
        """Where the stream is: its generator's state and, with a pool, the epoch's order and
        position (:meth:`restore` goes on from there)."""
        d = {"rng": self.rng.bit_generator.state}
        if self.pool is not None:
            d.update(order=self.order.copy(), at=self.at)
        return d

    def restore(self, d: Dict) -> None:
        """Goes on from :meth:`state` of a stream of the same task, batch, seed and pool."""
        self.rng.bit_generator.state = d["rng"]
        if self.pool is not None:
            self.order, self.at = np.asarray(d["order"]), int(d["at"])
