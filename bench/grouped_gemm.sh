#!/usr/bin/env bash
# The grouped-GEMM micro-benchmark: bench_grouped_gemm (moec's expert GEMMs: cuBLASLt per
# expert, bf16 and FP8 with 1x128 block scales or the weights' 128x128 squares; the
# device-driven wgmma FP8 kernel, with either) next to
# torch._grouped_mm (bf16) on the same shapes, in the same run; one row per case with ratios.
#   BENCH=build/bench_grouped_gemm bash bench/grouped_gemm.sh [REPS] [LOGDIR]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BENCH=${BENCH:-build/bench_grouped_gemm}
REPS=${1:-20}
LOG=${2:-/tmp/moec-grouped-gemm}
mkdir -p "$LOG"
"$BENCH" "$REPS" >"$LOG/moec.jsonl" 2>"$LOG/moec.err" || { echo "bench_grouped_gemm failed:"; tail -5 "$LOG/moec.err"; }
python3 "$here/grouped_mm_peer.py" "$REPS" >"$LOG/peer.jsonl" 2>"$LOG/peer.err" || { echo "peer failed:"; tail -5 "$LOG/peer.err"; }
python3 - "$LOG/moec.jsonl" "$LOG/peer.jsonl" <<'PY'
import json, sys
rows = {}
for path in sys.argv[1:]:
    for line in open(path):
        if not line.startswith("{"):
            print(line.rstrip()); continue
        r = json.loads(line)
        if "kernel" in r:
            print(f"kernel {r['model']} {r['kernel']}: {r['ms']:.3f} ms, {r['GB_per_s']} GB/s"); continue
        if "quantize" in r:
            print(f"quantize {r['model']} {r['quantize']}: {r['ms']:.3f} ms, {r['GB_per_s']} GB/s"); continue
        key = (r["model"], r["weight"], r["routing"], r["pass"])
        rows.setdefault(key, {})[r["dtype"]] = r
print(f"{'model':<9} {'weight':<7} {'routing':<8} {'pass':<5} {'torch bf16':>10} {'moec bf16':>10} {'moec fp8':>9} {'wgmma fp8':>9} {'bf16/torch':>10} {'fp8/bf16':>8} {'fp8/torch':>9} {'wgmma/fp8':>9} {'wgmma/bf16':>10} {'blk fp8':>8} {'blk/fp8':>7} {'wg blk':>7} {'wgblk/blk':>9}   (TFLOP/s)")
def tf(d, k):
    return d[k]["tflops"] if k in d and "tflops" in d[k] else float("nan")
for key, d in rows.items():
    t, b, f, w, k = tf(d, "torch_bf16"), tf(d, "bf16"), tf(d, "fp8"), tf(d, "fp8_wgmma"), tf(d, "fp8_blk")
    q = tf(d, "fp8_wgmma_blk")  # the wgmma kernel reading the weights' squares
    print(f"{key[0]:<9} {key[1]:<7} {key[2]:<8} {key[3]:<5} {t:10.1f} {b:10.1f} {f:9.1f} {w:9.1f} {b / t:10.2f} {f / b:8.2f} {f / t:9.2f} {w / f:9.2f} {w / b:10.2f} {k:8.1f} {k / f:7.2f} {q:7.1f} {q / k:9.2f}")
    if "torch_bf16" in d and "error" in d["torch_bf16"]:
        print("   torch:", d["torch_bf16"]["error"])
PY
