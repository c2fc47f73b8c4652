#!/usr/bin/env python3
"""Sums Nsight Compute's per-kernel durations (ncu --csv --metrics gpu__time_duration.sum) by
kernel: what the GPU itself spent on each kernel of the profiled range, with none of the
host-side gaps that event timing charges to kernels. Where the CSV has more metrics (ncustep
with NCU_WIDE=1), each kernel's duration-weighted mean of them is printed too: DRAM throughput
and warps active (occupancy) as % of peak, and registers a thread -- a kernel far from the DRAM
roofline at low occupancy is latency-bound (bench/RESULTS.md, 2026-12-07 tenth session).
  python3 bench/ncu_sum.py NCU.csv [STEP_MS]   (STEP_MS: the unprofiled step, for the idle share)"""
import csv, sys
from collections import defaultdict

DUR = "gpu__time_duration.sum"
EXTRA = [("dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram%"),
         ("sm__warps_active.avg.pct_of_peak_sustained_active", "occ%"),
         ("launch__registers_per_thread", "regs")]
SCALE = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}


def number(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return float("nan")


rows = [l for l in open(sys.argv[1], errors="replace") if l.startswith('"')]
launches = defaultdict(dict)  # launch ID -> {"name": ..., metric: value}
for r in csv.DictReader(rows):
    metric, key = r.get("Metric Name"), r.get("ID")
    if metric is None or key is None:
        continue
    launch = launches[key]
    launch["name"] = r["Kernel Name"]
    if metric == DUR:
        launch[DUR] = number(r["Metric Value"]) * SCALE.get(r.get("Metric Unit", "ns"), 1e-6)
    else:
        launch[metric] = number(r["Metric Value"])

tot, cnt = defaultdict(float), defaultdict(int)
wsum = defaultdict(lambda: defaultdict(float))  # name -> metric -> sum of value x ms
present = [(m, h) for m, h in EXTRA if any(m in l for l in launches.values())]
for launch in launches.values():
    if DUR not in launch:
        continue
    name = launch["name"]
    name = name if len(name) <= 70 else name[:67] + "..."
    ms = launch[DUR]
    tot[name] += ms
    cnt[name] += 1
    for m, _ in present:
        if launch.get(m, float("nan")) == launch.get(m, float("nan")):  # not NaN
            wsum[name][m] += launch[m] * ms
all_ms = sum(tot.values())
print(f"ncu: {sum(cnt.values())} kernels, {all_ms:.2f} ms of kernel time in the profiled range")
if len(sys.argv) > 2:
    step = float(sys.argv[2])
    print(f"unprofiled step {step:.2f} ms: the GPU idles {step - all_ms:.2f} ms of it ({100 * (step - all_ms) / step:.0f}%)")
extra_head = "".join(f" {h:>6}" for _, h in present)
print(f"  {'kernel':<70} {'ms':>8} {'%':>5} {'calls':>6}{extra_head}")
for name, ms in sorted(tot.items(), key=lambda kv: -kv[1])[:45]:
    extra = "".join(f" {wsum[name][m] / ms if ms > 0 else float('nan'):6.1f}" for m, _ in present)
    print(f"  {name:<70} {ms:8.3f} {100 * ms / all_ms:5.1f} {cnt[name]:6d}{extra}")
