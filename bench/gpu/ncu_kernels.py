"""Per-kernel summary of an Nsight Compute metrics run, read from standard input:

    ncu --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,\
        dram__throughput.avg.pct_of_peak_sustained_elapsed --csv mixers bench ... | python3 bench/gpu/ncu_kernels.py

For each kernel name: the number of launches, the total and mean time (µs; ncu locks the clocks
to base, so times are ≈ 1.2× those of an unprofiled run) and the mean of every other metric.
"""
import csv, sys, collections
rows = [r for r in csv.reader(l for l in sys.stdin if l.startswith('"'))]
if not rows: print("no csv rows"); sys.exit()
hd = rows[0]; ki, mi, vi = hd.index("Kernel Name"), hd.index("Metric Name"), hd.index("Metric Value")
idi = hd.index("ID")
agg = collections.OrderedDict()
for r in rows[1:]:
    name = r[ki].split("(")[0]
    d = agg.setdefault(name, collections.defaultdict(list))
    d[r[mi]].append(float(r[vi].replace(",", "")))
for name, d in agg.items():
    parts = []
    for m, v in d.items():
        short = m.split("__")[-1][:30] if "__" in m else m
        if "duration" in m: parts.append(f"n={len(v)} time_us total {sum(v)/1e3:.1f} mean {sum(v)/len(v)/1e3:.1f}")
        else: parts.append(f"{m.split('.')[0][-18:]} {sum(v)/len(v):.1f}")
    print(f"{name:28s} " + " | ".join(parts))
