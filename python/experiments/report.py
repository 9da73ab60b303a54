"""Aggregation of runs into cells, the Markdown table next to the papers' numbers with Kendall τ
per column, and the plots.

A cell (structure, task) is the learning rate with the best mean *validation* accuracy over the
seeds, reported as the mean (and standard deviation) of the *test* accuracy over the seeds at that
learning rate."""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> Optional[float]:
    """Kendall's τ-b between two score lists (ties allowed):
    ``(C − D) / √((C + D + T_a)(C + D + T_b))`` over the pairs ``i < j``, with ``C`` concordant and
    ``D`` discordant pairs, ``T_a`` pairs tied in ``a`` only and ``T_b`` tied in ``b`` only;
    ``None`` when the denominator is 0 (fewer than two items, or everything tied)."""
    if len(a) != len(b):
        raise ValueError(f"kendall_tau: the lists have different lengths ({len(a)} and {len(b)})")
    c = d = ta = tb = 0
    n = len(a)
    for i in range(n):
        for j in range(i + 1, n):
            x = (a[i] > a[j]) - (a[i] < a[j])
            y = (b[i] > b[j]) - (b[i] < b[j])
            if x == 0 and y == 0:
                continue
            if x == 0:
                ta += 1
            elif y == 0:
                tb += 1
            elif x == y:
                c += 1
            else:
                d += 1
    den = math.sqrt((c + d + ta) * (c + d + tb))
    return (c - d) / den if den > 0 else None


def _mean(v: Sequence[float]) -> float:
    return sum(v) / len(v) if v else float("nan")


def _std(v: Sequence[float]) -> float:
    if len(v) < 2:
        return 0.0
    m = _mean(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def cell(runs: List[Dict]) -> Dict:
    """The cell of one (structure, task) from its runs (logs of :func:`experiments.train.train`
    over learning rates and seeds): the chosen ``lr``, test accuracy ``mean``/``std`` (%) over the
    seeds, ``sequence`` (whole-example accuracy, %), ``per_seed``, ``per_lr`` (mean validation
    accuracy, %), ``wall_s`` (all its runs)."""
    by_lr: Dict[float, List[Dict]] = {}
    for r in runs:
        by_lr.setdefault(r["config"]["lr"], []).append(r)
    per_lr = {lr: 100 * _mean([r["val"]["accuracy"] for r in rs]) for lr, rs in sorted(by_lr.items())}
    lr = max(per_lr, key=lambda k: (per_lr[k], -k))
    chosen = sorted(by_lr[lr], key=lambda r: r["seed"])
    test = [100 * r["test"]["accuracy"] for r in chosen]
    return {
        "lr": lr,
        "mean": _mean(test),
        "std": _std(test),
        "sequence": _mean([100 * r["test"]["sequence_accuracy"] for r in chosen]),
        "per_seed": {r["seed"]: 100 * r["test"]["accuracy"] for r in chosen},
        "per_lr": per_lr,
        "wall_s": sum(r["wall_s"] for r in runs),
        "curves": [r["curve"] for r in chosen],
    }


def taus(rows, tasks: Sequence[str], cells: Dict) -> Dict[str, Optional[float]]:
    """Kendall τ per task between our means and the paper's numbers, over the rows that have
    both."""
    out = {}
    for t in tasks:
        pairs = [(cells[(r.label, t)]["mean"], r.paper[t]) for r in rows
                 if r.paper.get(t) is not None and (r.label, t) in cells]
        out[t] = kendall_tau([p[0] for p in pairs], [p[1] for p in pairs]) if len(pairs) >= 2 else None
    return out


def markdown(title: str, rows, tasks: Sequence[str], cells: Dict, notes: Sequence[str] = ()) -> str:
    """The table: per task, ours (mean ± sd over seeds, test accuracy on labelled positions, %;
    the chosen learning rate) next to the paper's; a Kendall τ line per task; ``notes``."""
    has_paper = {t: any(r.paper.get(t) is not None for r in rows) for t in tasks}
    head = ["structure", "mixer"]
    for t in tasks:
        head.append(f"{t} (ours)")
        if has_paper[t]:
            head.append(f"{t} (paper)")
    head.append("wall s")
    lines = [f"# {title}", "", "| " + " | ".join(head) + " |",
             "|---|---|" + "---:|" * (len(head) - 2)]
    for r in rows:
        cfg = f" `{_json(r.config)}`" if r.config else ""
        cols = [r.label, f"`{r.mixer}`{cfg}"]
        wall = 0.0
        for t in tasks:
            c = cells.get((r.label, t))
            if c is None:
                cols.append("—")
            else:
                cols.append(f"{c['mean']:.1f} ± {c['std']:.1f} (lr {c['lr']:g})")
                wall += c["wall_s"]
            if has_paper[t]:
                p = r.paper.get(t)
                cols.append("—" if p is None else f"{p:.2f}")
        cols.append(f"{wall:.0f}")
        lines.append("| " + " | ".join(cols) + " |")
    lines.append("")
    lines.append("Ours: test accuracy (%) on labelled positions, mean ± standard deviation over the seeds, at the "
                 "learning rate with the best mean validation accuracy.")
    lines.append("")
    for t, tau in taus(rows, tasks, cells).items():
        if has_paper[t]:
            lines.append(f"- {t}: Kendall τ against the paper: " + ("—" if tau is None else f"{tau:.2f}"))
    lines.extend(f"- {n}" for n in notes)
    return "\n".join(lines) + "\n"


def _json(d: Dict) -> str:
    import json

    return json.dumps(d, sort_keys=True)


def plot(path_stem: str, task: str, rows, cells: Dict) -> Optional[str]:
    """Validation accuracy against steps (mean over the seeds at the chosen learning rate), one
    line per structure, saved as ``<path_stem>.png``; ``None`` when matplotlib is not
    installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        c = cells.get((r.label, task))
        if c is None or not c["curves"]:
            continue
        steps = c["curves"][0]["eval_step"]
        acc = [100 * _mean([cv["val_accuracy"][i] for cv in c["curves"]]) for i in range(len(steps))]
        ax.plot(steps, acc, marker=".", label=r.label)
    ax.set_xlabel("step")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(task)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path_stem + ".png", dpi=120)
    plt.close(fig)
    return path_stem + ".png"
