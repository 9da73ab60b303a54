"""The command line shared by the experiments: every (structure, task, learning rate, seed) run,
its JSON log under ``<out>/<experiment>/runs/``, then ``results.json``, ``table.md`` and the plots
(``<task>.png``) under ``<out>/<experiment>/``."""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import re
import sys
import time
from typing import Dict, List, Optional, Sequence

from . import report, settings
from .train import RunConfig, train_many


#: The settings of each task that the table reports.
_FIELDS = {"copy": ("alphabet", "min_len", "max_len"), "mqar": ("vocab", "pairs", "seq_len", "power_a"),
           "multihop": ("vocab", "pairs", "max_hops", "queries")}


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower()


def parser(experiment: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m experiments.{experiment}",
                                description=f"The `{experiment}` experiment (docs/papers.md).")
    p.add_argument("--device", default="cpu", help="torch device: cpu or cuda (default cpu)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (default 0)")
    p.add_argument("--budget", default="paper", choices=("tiny", "short", "paper"),
                   help="tiny: CPU smoke; short: a first GPU pass; paper: the full setting (default)")
    p.add_argument("--lrs", type=float, nargs="+", help="learning rates (default: the budget's sweep)")
    p.add_argument("--steps", type=int, help="override the budget's number of steps")
    p.add_argument("--only", help="comma-separated row labels or mixer names to run")
    p.add_argument("--tasks", help="comma-separated tasks to run")
    p.add_argument("--backend", help="the library backend (default: cuda for CUDA tensors, else cpu)")
    p.add_argument("--form", default="fast", help="the mixers' form: fast (default), parallel, materialized, …")
    p.add_argument("--eager", action="store_true",
                   help="on CUDA, launch every step's kernels instead of replaying a captured step (CUDA graph)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--pos-std", type=float,
                   help="standard deviation of the position embedding's initial draw (default: the budget's, 1)")
    p.add_argument("--glr-on", choices=("a", "b", "both"),
                   help="where the GLR rows' pattern sits (the mixer's `on`): b, the output recurrence "
                        "(default); a, the input mixing (attention over the pattern); both")
    p.add_argument("--out", default="out/papers", help="output folder (default out/papers)")
    p.add_argument("--resume", action="store_true",
                   help="keep the runs whose log already exists, and continue those stopped by --max-seconds "
                        "from their checkpoints")
    p.add_argument("--max-seconds", type=float,
                   help="stop after this many seconds: every run not finished by then writes a checkpoint "
                        "(`<log>.ckpt`) instead of its log, and the command exits with status 3 without a table; "
                        "run it again with --resume to go on (default: no limit)")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at once, each in its own process (default 1; each gets cores/jobs torch "
                        "threads unless --threads says); on one GPU a small model leaves it mostly idle, "
                        "so several runs share it")
    p.add_argument("--streams", type=int, default=1,
                   help="runs per process, a step of each in turn, each on its own CUDA stream (default 1): "
                        "on one GPU the small models' steps then overlap within one CUDA context")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's; 1 on a shared machine)")
    p.add_argument("--quiet", action="store_true")
    return p


def with_glr_on(row: settings.Row, on: str) -> settings.Row:
    """``row`` with its mixer's ``on`` set to ``on`` where it is a GLR mixer (others unchanged)."""
    from .model import family

    if family(row.mixer) != "glr":
        return row
    return dataclasses.replace(row, config={**row.config, "on": on})


def notes(experiment: str, cells: Dict, rows) -> List[str]:
    """The experiment's own comparisons: the lifts' MQAR gains; the Toeplitz copy ordering."""
    out = []
    means = {r.mixer: cells[(r.label, t)]["mean"] for r in rows for t in ("mqar", "copy") if (r.label, t) in cells}
    if experiment == "mqar":
        for base, lift, gain in settings.LIFTS:
            if base in means and lift in means:
                out.append(f"mqar: {lift} − {base} = {means[lift] - means[base]:+.1f} points (paper: {gain:+.1f})")
    if experiment == "toeplitz_copy" and all(m in means for m in ("attention", "toeplitz", "mamba2")):
        out.append(f"copy: toeplitz − attention = {means['toeplitz'] - means['attention']:+.1f} points, "
                   f"toeplitz − mamba2 = {means['toeplitz'] - means['mamba2']:+.1f} points (the paper's claim: "
                   "Toeplitz about as attention, Mamba-2 behind)")
    return out


def _run(jobs) -> List[tuple]:
    """Runs in this process, a step of each in turn (:func:`~experiments.train.train_many`); writes
    each finished run's log (whole or not at all: a run cut short leaves no log, so that
    ``--resume`` runs it again — from its checkpoint where the deadline wrote one); returns
    [(path, log)] of the finished runs."""
    threads, deadline = jobs[0][4], jobs[0][5]
    if threads:
        import torch

        torch.set_num_threads(threads)
    cfgs = [RunConfig.from_dict(cfg) for cfg, *_ in jobs]
    ckpts = [path + ".ckpt" for _, _, path, *_ in jobs]
    # (checkpoints are read even without a deadline: --resume goes on from them)
    logs = train_many(cfgs, jobs[0][1], checkpoints=ckpts, deadline=deadline)
    out = []
    for (_, _, path, meta, _, _), log in zip(jobs, logs):
        if log is None:
            continue
        log.update(meta)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".part", "w") as f:
            json.dump(log, f)
        os.replace(path + ".part", path)
        out.append((path, log))
    return out


def _store(runs: Dict, path: str, log: Dict, quiet: bool) -> None:
    runs[(log["structure"], log["config"]["task"]["task"])][path] = log
    if not quiet:
        print(f"{log['structure']:32s} {log['config']['task']['task']:9s} lr {log['config']['lr']:<8g} seed "
              f"{log['seed']}: test {100 * log['test']['accuracy']:5.1f} %  loss {log['curve']['loss'][0]:.3f} → "
              f"{log['curve']['loss'][-1]:.3f}  {log['wall_s']:.1f} s", file=sys.stderr)


def main(experiment: str, title: str, argv: Optional[Sequence[str]] = None) -> Dict:
    """Runs ``experiment`` with the command line ``argv``; returns the aggregated results."""
    a = parser(experiment).parse_args(argv)
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    if a.jobs < 1:
        raise SystemExit(f"--jobs: expected at least 1 run at once, got {a.jobs}")
    if a.streams < 1:
        raise SystemExit(f"--streams: expected at least 1 run per process, got {a.streams}")
    b = settings.budget(experiment, a.budget, a.steps)
    if a.pos_std is not None:
        if not a.pos_std >= 0.0:
            raise SystemExit(f"--pos-std: expected a standard deviation ≥ 0, got {a.pos_std}")
        b = dataclasses.replace(b, run={**b.run, "pos_std": a.pos_std})
    rows = settings.ROWS[experiment]
    if a.glr_on:
        rows = [with_glr_on(r, a.glr_on) for r in rows]
    if a.only:
        want = set(a.only.split(","))
        rows = [r for r in rows if r.label in want or r.mixer in want]
        if not rows:
            raise SystemExit(f"--only {a.only}: no row matches (labels or mixers of `{experiment}`)")
    tasks = list(b.tasks)
    if a.tasks:
        want = set(a.tasks.split(","))
        tasks = [t for t in tasks if t.task in want]
        if not tasks:
            raise SystemExit(f"--tasks {a.tasks}: no task of `{experiment}` matches")
    lrs = a.lrs or list(b.lrs)
    root = os.path.join(a.out, experiment)
    os.makedirs(os.path.join(root, "runs"), exist_ok=True)
    start = time.time()
    if a.max_seconds is not None and not a.max_seconds > 0:
        raise SystemExit(f"--max-seconds: expected a positive number of seconds, got {a.max_seconds}")
    deadline = None if a.max_seconds is None else start + a.max_seconds
    # Parallel runs share the cores: torch's default (a thread per core in every process) would
    # oversubscribe them.
    threads = a.threads or (max(1, (os.cpu_count() or 1) // a.jobs) if a.jobs > 1 else None)
    runs: Dict = {}  # (label, task) -> logs in the order of lrs and seeds
    todo = []
    for r in rows:
        for t in tasks:
            for lr in lrs:
                for seed in a.seeds:
                    on = r.config.get("on", "b")
                    folder = _slug(r.label) + ("" if on == "b" else f"-on-{on}")  # no log shared across `on`
                    path = os.path.join(root, "runs", folder, t.task, f"lr{lr:g}-seed{seed}.json")
                    runs.setdefault((r.label, t.task), {})[path] = None
                    if not a.resume and os.path.exists(path + ".ckpt"):
                        os.remove(path + ".ckpt")  # a fresh run does not go on from an old one
                    if a.resume and os.path.exists(path):
                        with open(path) as f:
                            runs[(r.label, t.task)][path] = json.load(f)
                        continue
                    cfg = RunConfig(task=t, mixer=r.mixer, mixer_config=dict(r.config), lr=lr, seed=seed,
                                    dtype=a.dtype, backend=a.backend, form=a.form, graph=not a.eager, **b.run)
                    meta = {"experiment": experiment, "structure": r.label, "budget": a.budget}
                    todo.append((r.cost * t.length, (cfg.to_dict(), a.device, path, meta, threads, deadline)))
    if a.jobs > 1 or a.streams > 1:
        # The costliest runs first, so that none of them starts last and alone; a process takes
        # `streams` runs of about the same cost.
        todo.sort(key=lambda c: -c[0])
    groups = [[job for _, job in todo[i : i + a.streams]] for i in range(0, len(todo), a.streams)]
    if a.jobs > 1:
        ctx = multiprocessing.get_context("spawn")  # a CUDA context per process, none inherited
        with concurrent.futures.ProcessPoolExecutor(max_workers=a.jobs, mp_context=ctx) as pool:
            done = [pool.submit(_run, group) for group in groups]
            for fut in concurrent.futures.as_completed(done):
                for path, log in fut.result():
                    _store(runs, path, log, a.quiet)
    else:
        for group in groups:
            for path, log in _run(group):
                _store(runs, path, log, a.quiet)
    stopped = [path for logs in runs.values() for path, log in logs.items() if log is None]
    if stopped:
        print(f"{len(stopped)} of {sum(len(v) for v in runs.values())} runs stopped at --max-seconds "
              f"{a.max_seconds:g} with a checkpoint each (`<log>.ckpt` under {os.path.join(root, 'runs')}); run the "
              "same command with --resume to go on", file=sys.stderr)
        raise SystemExit(3)
    cells = {key: report.cell(list(logs.values())) for key, logs in runs.items()}
    names = [t.task for t in tasks]
    extra = notes(experiment, cells, rows)
    wall = time.time() - start
    for t in tasks:
        fields = {k: v for k, v in t.to_dict().items() if k in _FIELDS[t.task]}
        extra.append(f"Task `{t.task}`: {json.dumps(fields)} (T = {t.length}).")
    extra.append("Model and training: " + json.dumps({k: v for k, v in b.run.items()}) + ".")
    if a.glr_on:
        extra.append(f"The GLR rows' pattern on `{a.glr_on}` (`--glr-on`; the default is `b`, the output recurrence).")
    runs_wall = sum(c["wall_s"] for c in cells.values())
    extra.append(f"Budget `{a.budget}`, seeds {a.seeds}, learning rates {lrs}, device `{a.device}`, form "
                 f"`{a.form}`: {runs_wall:.0f} s of training wall time (the runs' sum).")
    md = report.markdown(title, rows, names, cells, extra)
    plots = [report.plot(os.path.join(root, t), t, rows, cells) for t in names]
    if any(p is None for p in plots):
        md += "\nNo plots: matplotlib is not installed in this environment.\n"
    with open(os.path.join(root, "table.md"), "w") as f:
        f.write(md)
    results = {
        "experiment": experiment,
        "budget": a.budget,
        "seeds": a.seeds,
        "lrs": lrs,
        "tasks": [t.to_dict() for t in tasks],
        "run": {k: list(v) if isinstance(v, tuple) else v for k, v in b.run.items()},
        "rows": [{"label": r.label, "mixer": r.mixer, "config": r.config, "paper": r.paper} for r in rows],
        "cells": [{"structure": k[0], "task": k[1], **{f: v for f, v in c.items() if f != "curves"}}
                  for k, c in cells.items()],
        "kendall_tau": report.taus(rows, names, cells),
        "notes": extra,
        "wall_s": wall,
    }
    with open(os.path.join(root, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    if not a.quiet:
        print(md)
    return results
