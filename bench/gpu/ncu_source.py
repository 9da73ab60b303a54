"""The source lines (CUDA or SASS) of one profiled kernel with the most warp-stall samples:

    ncu --import-source yes --section SourceCounters --section WarpStateStats -k regex:NAME -c 1 -o rep CMD...
    ncu -i rep.ncu-rep --page source --csv --print-source sass > rep.csv
    python3 bench/gpu/ncu_source.py rep.csv [N]

prints the N lines (default 30) with the largest share of samples and their three main stall reasons.
"""
import csv, sys, io
txt = open(sys.argv[1], errors="replace").read()
n = int(sys.argv[2]) if len(sys.argv) > 2 else 30
rows = list(csv.reader(io.StringIO(txt)))
h = next((i for i, r in enumerate(rows) if any("Sampling" in c for c in r)), None)
if h is None:
    print("no header with 'Sampling'; first lines:"); print(txt[:1500]); sys.exit()
hd = rows[h]
print("columns:", "; ".join(hd)[:1500])
allc = next(i for i, c in enumerate(hd) if "Sampling (All" in c)
src = next((i for i, c in enumerate(hd) if c.strip() in ("Source", "# Source")), 1)
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
body = [r for r in rows[h + 1:] if len(r) == len(hd)]
tot = sum(num(r[allc]) for r in body) or 1
print(f"total samples {tot:.0f}, lines {len(body)}")
reason = [i for i, c in enumerate(hd) if i not in (allc,) and ("stall" in c.lower() or "Stall" in c) and "Sampling" not in c]
for r in sorted(body, key=lambda r: -num(r[allc]))[:n]:
    rs = sorted(((num(r[i]), hd[i]) for i in reason), reverse=True)[:3]
    print(f"{100*num(r[allc])/tot:5.1f}% | {r[src].strip()[:100]:100s} | " + ", ".join(f"{k[:28]}={v:.0f}" for v, k in rs if v > 0))
