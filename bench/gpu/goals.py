"""The log-linear family's speed goals, read from side_by_side.py's JSON (one run, T = 16k, B = 1):

    python3 bench/gpu/goals.py side_by_side.json [more.json ...] [--T 16384] [--B 1]

Prints one line per goal: the measured numbers, the ratio, the bound and whether it is met. Rows
from several files are pooled (a later file's row replaces an earlier one of the same mixer,
mode, B and T), so a run of only some mixers can be combined with an earlier full run; say so
when quoting the result, since the goals ask for one run. Goals (H200, CUDA events,
device-resident inputs):
  * mamba2, gated-deltanet in tf32 / bf16: ours / fla (fp32 / bf16) ≤ 1.0;
  * loglinear-mamba2 tf32: ≤ 1.5 ms, and fla's chunk_log_linear_attn / ours ≥ 5;
  * loglinear-gated-deltanet tf32: ours / our gated-deltanet tf32 ≤ 2.5;
  * exact / tf32 ≤ 3 for the four log-linear members above (and any other mixer with both modes).
A goal whose rows are missing is reported as such, never as met.
"""
import argparse
import json
import sys


def load(paths, T, B):
    rows = {}
    for p in paths:
        for r in json.load(open(p)):
            if r.get("T") == T and r.get("B") == B:
                rows[(r["mixer"], r["precision"])] = r
    return rows


def goals(rows):
    """(goal, measured text, value, bound, met or None when rows are missing) for each goal."""
    out = []

    def ms(mixer, mode):
        r = rows.get((mixer, mode))
        return r["ours_ms"] if r else None

    for mixer in ("mamba2", "gated-deltanet"):
        for mode in ("tf32", "bf16"):
            r = rows.get((mixer, mode))
            ratio = r["ratio"] if r else None
            text = f"{r['ours_ms']:.3g} ms / {r['reference']} {r['ref_ms']:.3g} ms" if ratio else "missing"
            out.append((f"{mixer} {mode} / fla", text, ratio, 1.0, None if ratio is None else ratio <= 1.0))
    r = rows.get(("loglinear-mamba2", "tf32"))
    if r and r["ours_ms"] is not None and r["ref_ms"]:
        speedup = r["ref_ms"] / r["ours_ms"]
        text = f"{r['ours_ms']:.3g} ms, {r['reference']} {r['ref_ms']:.3g} ms: {speedup:.1f}× faster"
        out.append(("loglinear-mamba2 tf32 ≤ 1.5 ms and ≥ 5× fla", text, speedup, 5.0,
                    r["ours_ms"] <= 1.5 and speedup >= 5.0))
    else:
        out.append(("loglinear-mamba2 tf32 ≤ 1.5 ms and ≥ 5× fla", "missing", None, 5.0, None))
    lift, base = ms("loglinear-gated-deltanet", "tf32"), ms("gated-deltanet", "tf32")
    ratio = lift / base if lift and base else None
    text = f"{lift:.3g} / {base:.3g} ms" if ratio else "missing"
    out.append(("loglinear-gated-deltanet / gated-deltanet, tf32", text, ratio, 2.5,
                None if ratio is None else ratio <= 2.5))
    # The four members the issue names always get a row (missing when a mode is); any other mixer
    # with both modes in the file too.
    named = ("mamba2", "gated-deltanet", "loglinear-mamba2", "loglinear-gated-deltanet")
    others = sorted({m for m, _ in rows} - set(named))
    for mixer in named + tuple(others):
        ex, tf = ms(mixer, "exact"), ms(mixer, "tf32")
        if ex and tf:
            out.append((f"{mixer} exact / tf32", f"{ex:.3g} / {tf:.3g} ms", ex / tf, 3.0, ex / tf <= 3.0))
        elif mixer in named:
            out.append((f"{mixer} exact / tf32", "missing", None, 3.0, None))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json", nargs="+")
    ap.add_argument("--T", type=int, default=16384)
    ap.add_argument("--B", type=int, default=1)
    a = ap.parse_args()
    rows = load(a.json, a.T, a.B)
    if not rows:
        sys.exit(f"no rows at T = {a.T}, B = {a.B} in {a.json}")
    print(f"| goal (T = {a.T}, B = {a.B}) | measured | value | bound | met |")
    print("|---|---|---|---|---|")
    for name, text, value, bound, met in goals(rows):
        v = "–" if value is None else f"{value:.3g}"
        verdict = "rows missing" if met is None else ("yes" if met else "**no**")
        print(f"| {name} | {text} | {v} | {bound:g} | {verdict} |")


if __name__ == "__main__":
    main()
