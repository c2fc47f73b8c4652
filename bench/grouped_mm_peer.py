"""torch._grouped_mm (bf16) on the expert GEMMs bench_grouped_gemm.c times: the same models,
weights, routings and passes (fwd: xs . W; dgrad: dy . W^T; wgrad: xs^T . dy per expert).
One JSON line per case, as bench_grouped_gemm prints them. TFLOP/s = 2 S K N / time.
  python3 bench/grouped_mm_peer.py [REPS]"""
import json
import sys

import torch

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
E, S = 8, 16384
models = [("genos_1b", 1024, 4096), ("og2_8x1b", 2048, 4096)]
routings = {"balanced": [2048] * 8, "skewed": [5000, 3000, 2504, 2000, 1896, 1184, 800, 0]}
dev = torch.device("cuda")


def timed(fn):
    for _ in range(3):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


for name, hidden, ffn in models:
    for weight, K, N in (("gate_up", hidden, 2 * ffn), ("down", ffn, hidden)):
        for routing, counts in routings.items():
            offs = torch.tensor(counts, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            bf = dict(device=dev, dtype=torch.bfloat16)
            cases = {
                # weights K-major (E, N, K) seen as (E, K, N), as torch's own MoE layers keep them
                "fwd": (torch.randn(S, K, **bf), torch.randn(E, N, K, **bf).mT),
                "dgrad": (torch.randn(S, N, **bf), torch.randn(E, K, N, **bf).mT),
                "wgrad": (torch.randn(K, S, **bf), torch.randn(N, S, **bf).t()),
            }
            for kind, (a, b) in cases.items():
                rec = dict(model=name, weight=weight, K=K, N=N, routing=routing, dtype="torch_bf16")
                rec["pass"] = kind
                try:
                    ms = timed(lambda: torch._grouped_mm(a, b, offs=offs))
                    rec.update(ms=round(ms, 4), tflops=round(2 * S * K * N / (ms * 1e9), 1))
                except Exception as e:  # report, keep going
                    rec.update(error=str(e).splitlines()[0][:200])
                print(json.dumps(rec), flush=True)
