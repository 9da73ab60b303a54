"""One training run: a :class:`~experiments.model.Model` on a task, AdamW with linear warm-up and
cosine decay, gradient clipping, cross-entropy on the labelled positions; its log (configuration,
seed, loss and accuracy curves, final validation and test accuracy, wall time) as a dict ready for
JSON. The same configuration and seed give the same data and the same initialisation."""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.nn.functional as F

from .model import Model
from .tasks import IGNORE, Split, TaskConfig, TrainStream


@dataclass
class RunConfig:
    """Everything a run depends on (logged with its results)."""

    task: TaskConfig
    mixer: str
    mixer_config: Dict = field(default_factory=dict)
    width: int = 32
    layers: int = 2
    heads: int = 2
    mlp: int = 2
    #: Kernel of the short causal depthwise convolution before each mixer (0: none).
    conv: int = 0
    #: Standard deviation of the learned position embedding's initial draw (tokens: 1).
    pos_std: float = 1.0
    steps: int = 1000
    batch: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.01
    betas: tuple = (0.9, 0.98)
    warmup: float = 0.05  # fraction of the steps
    min_lr: float = 0.1  # the cosine ends at this fraction of lr
    clip: float = 1.0
    #: Training examples: a fixed pool shuffled every epoch; 0: fresh examples every step.
    train_examples: int = 0
    val_size: int = 256
    test_size: int = 256
    eval_every: int = 0  # 0: a curve of 10 evaluations
    seed: int = 0
    dtype: str = "float32"
    backend: Optional[str] = None  # None: the package's default for the tensors' device
    form: str = "fast"  # the mixer's form (its backward: the same form where the backend has it)
    #: On CUDA, replay one captured training step (a CUDA graph) after the first GRAPH_AFTER steps.
    graph: bool = True

    def to_dict(self) -> Dict:
        d = asdict(self)
        d["task"] = self.task.to_dict()
        d["betas"] = list(self.betas)
        return d

    @staticmethod
    def from_dict(d: Dict) -> "RunConfig":
        d = dict(d)
        d["task"] = TaskConfig(**d["task"])
        d["betas"] = tuple(d.get("betas", (0.9, 0.98)))
        return RunConfig(**d)


#: Steps run as they are before a training step is captured (a capture needs warmed-up
#: kernels, allocator and autograd state).
GRAPH_AFTER = 3


def lr_at(cfg: RunConfig, step: int) -> float:
    """The learning rate of step ``step`` (0-based): linear warm-up over ``warmup·steps`` steps,
    then cosine decay from ``lr`` to ``min_lr·lr`` at the last step."""
    warm = max(1, int(round(cfg.warmup * cfg.steps)))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    span = max(1, cfg.steps - warm - 1)
    frac = min(1.0, (step - warm) / span)
    return cfg.lr * (cfg.min_lr + (1.0 - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * frac)))


def _tensor(a: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(a).to(device)


def labelled(tgt: np.ndarray):
    """``(rows, labels)``: the positions of ``tgt``'s labelled targets in its flattened ``B·T``
    positions, and those targets."""
    flat = tgt.reshape(-1)
    rows = np.flatnonzero(flat != IGNORE)
    return rows, flat[rows]


@torch.no_grad()
def evaluate(model: Model, split: Split, device, batch: int = 256) -> Dict:
    """Accuracy on labelled positions, whole-example accuracy (every labelled position right), and
    per group (multi-hop: per hop count), over ``split``; the mean cross-entropy. Only the labelled
    positions' logits are formed (:meth:`Model.logits_at`), as in training."""
    model.eval()
    right = total = seq_right = 0
    loss_sum = 0.0
    per_group: Dict[int, list] = {}
    for lo in range(0, len(split.tokens), batch):
        tok = split.tokens[lo : lo + batch]
        tgt = split.targets[lo : lo + batch]
        rows, labels = labelled(tgt)
        logits = model.logits_at(_tensor(tok, device), _tensor(rows, device)).float()
        lab = _tensor(labels, device)
        loss_sum += F.cross_entropy(logits, lab, reduction="sum").item()
        ok = (logits.argmax(-1) == lab).cpu().numpy()
        right += int(ok.sum())
        total += len(rows)
        # An example is right where none of its labelled positions is wrong.
        wrong = np.bincount(rows[~ok] // tgt.shape[1], minlength=len(tok))
        seq_right += int((wrong == 0).sum())
        groups = split.groups[lo : lo + batch].reshape(-1)[rows]
        for g in np.unique(groups):
            sel = groups == g
            acc = per_group.setdefault(int(g), [0, 0])
            acc[0] += int(ok[sel].sum())
            acc[1] += int(sel.sum())
    model.train()
    return {
        "accuracy": right / max(total, 1),
        "sequence_accuracy": seq_right / max(len(split.tokens), 1),
        "loss": loss_sum / max(total, 1),
        "per_group": {g: r / n for g, (r, n) in sorted(per_group.items())},
    }


class Trainer:
    """One run, a step at a time (:meth:`step` until :attr:`done`, then :meth:`log`), so that
    several runs can share a process (:func:`train_many`). On CUDA the run keeps to a stream of
    its own: every copy, step, replay and evaluation of it is queued there, so the steps of
    different runs overlap on the device."""

    def __init__(self, cfg: RunConfig, device: str = "cpu", progress=None):
        self.start = time.time()
        self.cfg, self.device, self.progress = cfg, device, progress
        torch.manual_seed(cfg.seed)
        c = cfg.task
        c.validate()
        self.val = Split(c, cfg.val_size, seed=(cfg.seed << 8) + 1, which="val")
        self.test = Split(c, cfg.test_size, seed=(cfg.seed << 8) + 2, which="test")
        self.stream_in = TrainStream(c, cfg.batch, cfg.seed, cfg.train_examples)
        dtype = getattr(torch, cfg.dtype)
        self.graphed = cfg.graph and torch.device(device).type == "cuda"
        self.cuda_stream = torch.cuda.Stream(device) if self.graphed else None
        with self._on():
            self.model = Model(cfg.mixer, cfg.mixer_config, c.vocab_size, c.length, cfg.width, cfg.layers, cfg.heads,
                               cfg.mlp, cfg.backend, cfg.form, cfg.conv, cfg.pos_std).to(device=device, dtype=dtype)
            model = self.model
            decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "slot_bias" not in n
                     and "taps" not in n and "lambda_param" not in n and "tok" not in n and "pos" not in n]
            rest = [p for p in model.parameters() if all(p is not q for q in decay)]
            # Replayed steps read the learning rate from the device: a tensor, and an optimizer whose
            # state lives there (`capturable`).
            self.opt = torch.optim.AdamW(
                [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                lr=torch.tensor(cfg.lr, device=device) if self.graphed else cfg.lr, betas=cfg.betas,
                capturable=self.graphed)
        #: Labelled positions a batch can have (the padded length of :meth:`_labelled`).
        self.slots = cfg.batch * min(c.labels, c.length)
        self.every = cfg.eval_every or max(1, cfg.steps // 10)
        self.curve = {"step": [], "loss": [], "lr": [], "eval_step": [], "val_accuracy": []}
        self.pending = []
        self.graph = None
        self.at = 0
        self.eager = 0  # steps run as they are by this object (the warm-up a capture needs)
        self.before = 0.0  # wall seconds of the run before a checkpoint it was restored from

    def _on(self):
        """The run's stream as the current one (CUDA), else nothing."""
        return torch.cuda.stream(self.cuda_stream) if self.cuda_stream is not None else contextlib.nullcontext()

    @property
    def done(self) -> bool:
        return self.at >= self.cfg.steps

    def _flush(self):
        if self.pending:
            self.curve["loss"].extend(torch.stack(self.pending).tolist())
            self.pending.clear()

    def _labelled(self, tgt: np.ndarray):
        """``(rows, labels)``: the flattened positions of a batch's labelled targets and those
        targets, padded to :attr:`slots` entries (row 0, label ``IGNORE``) so that a captured step
        sees the same shapes every time."""
        rows, labels = labelled(tgt)
        if len(rows) > self.slots:
            raise ValueError(f"a batch with {len(rows)} labelled positions, expected at most {self.slots} "
                             f"({self.cfg.batch} examples of at most {self.cfg.task.labels})")
        out = np.zeros(self.slots, dtype=np.int64)
        lab = np.full(self.slots, IGNORE, dtype=np.int64)
        out[: len(rows)], lab[: len(rows)] = rows, labels
        return out, lab

    def _step_on(self, tok: torch.Tensor, rows: torch.Tensor, lab: torch.Tensor) -> torch.Tensor:
        """Forward, backward, clipping and the optimizer's step (gradients start unset). The loss
        is the cross-entropy of the labelled positions (``rows``, ``lab`` of :meth:`_labelled`),
        whose logits alone are formed: the same loss as over every position's logits with the
        others ignored, without the head's work for them (three quarters of MQAR's positions,
        whose vocabulary head of 8192 outputs dominates the step)."""
        logits = self.model.logits_at(tok, rows).float()
        loss = F.cross_entropy(logits, lab, ignore_index=IGNORE)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
        self.opt.step()
        return loss.detach()

    def step(self) -> None:
        """One training step (and the evaluation due after it), queued on the run's stream."""
        cfg, step, device = self.cfg, self.at, self.device
        with self._on():
            lr = lr_at(cfg, step)
            for g in self.opt.param_groups:
                if self.graphed:
                    g["lr"].fill_(lr)
                else:
                    g["lr"] = lr
            tok, tgt = self.stream_in.next()
            rows, lab = self._labelled(tgt)
            if self.graph is not None:
                # From page-locked copies, without waiting: the host draws the next batch while
                # the device runs this step (torch keeps each pinned block until its copy is done).
                for buf, a in zip(self.static_in, (tok, rows, lab)):
                    buf.copy_(torch.from_numpy(a).pin_memory(), non_blocking=True)
                self.graph.replay()
                loss = self.static_loss.clone()
            else:
                # On CUDA the warm-up steps run on the run's own stream (not the default one), as a
                # capture requires.
                self.opt.zero_grad(set_to_none=True)
                loss = self._step_on(*(_tensor(a, device) for a in (tok, rows, lab)))
            self.eager += self.graph is None
            if self.graphed and self.graph is None and self.eager == GRAPH_AFTER:
                # The first steps run as they are (the warm-up a capture needs); the rest replay
                # one captured step on fixed input buffers: one launch instead of hundreds.
                self.static_in = [_tensor(a, device) for a in (tok, rows, lab)]
                self.opt.zero_grad(set_to_none=True)
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph, stream=self.cuda_stream):
                    self.static_loss = self._step_on(*self.static_in)
            self.curve["step"].append(step)
            # Kept on the device and read at the evaluations: a read per step would make the
            # host wait for every step's kernels instead of preparing the next batch meanwhile.
            self.pending.append(loss)
            self.curve["lr"].append(lr)
            if self.progress is not None:
                self._flush()
                self.progress(step, self.curve["loss"][-1])
            if (step + 1) % self.every == 0 and step + 1 < cfg.steps:
                self._flush()
                self.curve["eval_step"].append(step + 1)
                self.curve["val_accuracy"].append(evaluate(self.model, self.val, device)["accuracy"])
        self.at += 1

    def log(self) -> Dict:
        """The run's log, after the final evaluations (see :func:`train`)."""
        cfg = self.cfg
        with self._on():
            self._flush()
            final_val = evaluate(self.model, self.val, self.device)
            self.curve["eval_step"].append(cfg.steps)
            self.curve["val_accuracy"].append(final_val["accuracy"])
            test = evaluate(self.model, self.test, self.device)
        return {
            "config": cfg.to_dict(),
            "seed": cfg.seed,
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "device": str(self.device),
            "curve": self.curve,
            "val": final_val,
            "test": test,
            "wall_s": self.before + time.time() - self.start,
        }

    def checkpoint(self, path: str) -> None:
        """Writes what the run needs to go on from here (whole or not at all): its step, curve,
        wall time so far, the model's and optimizer's states, torch's random states and the
        training stream's position. :meth:`restore` on a new :class:`Trainer` of the same
        configuration continues the run as if it had not stopped (the same bits on the CPU)."""
        with self._on():
            self._flush()
            state = {
                "config": self.cfg.to_dict(),
                "at": self.at,
                "curve": self.curve,
                "wall_s": self.before + time.time() - self.start,
                "model": self.model.state_dict(),
                "opt": self.opt.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state(self.device) if self.cuda_stream is not None else None,
                "stream": self.stream_in.state(),
            }
            if self.cuda_stream is not None:
                self.cuda_stream.synchronize()
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        torch.save(state, path + ".part")
        os.replace(path + ".part", path)

    def restore(self, path: str) -> None:
        """Continues from :meth:`checkpoint`'s file ``path``, written by a run of the same
        configuration (``ValueError`` otherwise)."""
        # On the CPU: the random states must stay there, and load_state_dict copies the tensors
        # onto the model's and the optimizer's device.
        state = torch.load(path, map_location="cpu", weights_only=False)
        if state["config"] != self.cfg.to_dict():
            raise ValueError(f"{path}: a checkpoint of another run configuration ({state['config']}), "
                             f"expected {self.cfg.to_dict()}")
        with self._on():
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["opt"])
            if self.graphed:
                # A replayed step reads the learning rate from the device (a tensor), as set up
                # in __init__; the state dict carried it as the number it held.
                for g in self.opt.param_groups:
                    g["lr"] = torch.tensor(float(g["lr"]), device=self.device)
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] is not None and self.cuda_stream is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.stream_in.restore(state["stream"])
        self.at, self.curve, self.before = state["at"], state["curve"], state["wall_s"]
        self.start = time.time()


def train(cfg: RunConfig, device: str = "cpu", progress=None) -> Dict:
    """Trains one model; returns its log: ``config``, ``seed``, ``curve`` (every step's loss and
    learning rate; validation accuracy every ``eval_every`` steps), ``val`` and ``test`` (the
    final evaluations), ``parameters``, ``wall_s``."""
    run = Trainer(cfg, device, progress)
    while not run.done:
        run.step()
    return run.log()


def train_many(cfgs: List[RunConfig], device: str = "cpu", checkpoints: Optional[List[str]] = None,
               deadline: Optional[float] = None) -> List[Optional[Dict]]:
    """Trains several models in one process, a step of each in turn; returns their logs in
    order, each the log :func:`train` gives the run alone (``wall_s``: from the start of all to
    the run's end). On CUDA each run has its own stream, so while the host queues one run's step
    the device runs the others': small models that leave the device mostly idle share it with
    one CUDA context instead of several processes' (which the device time-slices).

    With ``checkpoints`` (a file path per run): a run whose file exists continues from it
    (:meth:`Trainer.restore`), and at ``deadline`` (a :func:`time.time`) every unfinished run
    writes its file (:meth:`Trainer.checkpoint`) and its log is ``None``; a finished run's file is
    removed. A ``deadline`` needs ``checkpoints``."""
    if deadline is not None and checkpoints is None:
        raise ValueError("train_many: a deadline needs a checkpoint path per run")
    runs = [Trainer(c, device) for c in cfgs]
    if checkpoints is not None:
        for r, path in zip(runs, checkpoints):
            if os.path.exists(path):
                r.restore(path)
    logs: List[Optional[Dict]] = [None] * len(runs)
    while any(lg is None for lg in logs):
        if deadline is not None and time.time() >= deadline:
            for r, path, lg in zip(runs, checkpoints, logs):
                if lg is None:
                    r.checkpoint(path)
            return logs
        for i, r in enumerate(runs):
            if logs[i] is not None:
                continue
            if r.done:
                logs[i] = r.log()
                if checkpoints is not None and os.path.exists(checkpoints[i]):
                    os.remove(checkpoints[i])
            else:
                r.step()
    return logs
