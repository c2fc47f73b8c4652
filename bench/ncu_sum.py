#!/usr/bin/env python3
"""Sums Nsight Compute's per-kernel durations (ncu --csv --metrics gpu__time_duration.sum) by
kernel: what the GPU itself spent on each kernel of the profiled range, with none of the
host-side gaps that event timing charges to kernels.
  python3 bench/ncu_sum.py NCU.csv [STEP_MS]   (STEP_MS: the unprofiled step, for the idle share)"""
import csv, sys
from collections import defaultdict

rows = [l for l in open(sys.argv[1], errors="replace") if l.startswith('"')]
tot, cnt = defaultdict(float), defaultdict(int)
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    ms = v * {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}.get(unit, 1e-6)
    name = r["Kernel Name"]
    name = name if len(name) <= 70 else name[:67] + "..."
    tot[name] += ms
    cnt[name] += 1
all_ms = sum(tot.values())
print(f"ncu: {sum(cnt.values())} kernels, {all_ms:.2f} ms of kernel time in the profiled range")
if len(sys.argv) > 2:
    step = float(sys.argv[2])
    print(f"unprofiled step {step:.2f} ms: the GPU idles {step - all_ms:.2f} ms of it ({100 * (step - all_ms) / step:.0f}%)")
print(f"  {'kernel':<70} {'ms':>8} {'%':>5} {'calls':>6}")
for name, ms in sorted(tot.items(), key=lambda kv: -kv[1])[:45]:
    print(f"  {name:<70} {ms:8.3f} {100 * ms / all_ms:5.1f} {cnt[name]:6d}")
