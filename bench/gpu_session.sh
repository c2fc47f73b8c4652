#!/usr/bin/env bash
# One device call's worth of GPU checks and benchmarks (the bench/RESULTS.md runs of 2026-12-03):
# the kernel tests, genos_1b naive with the per-op profile and the peer, naive without profile,
# naive with MOEC_GEMM_TUNE=0, the fused pipeline (bf16 and mxfp8), the step test against the CPU, og2_8x1b with
# its peer. Summaries go to stdout; logs to $OUT (bench.tgz, kernels.log).
#   here:  scripts/gpu_bundle.sh build --with-moec && cp -r build/gpu-carry .dev/carry &&
#          cp ../shared/peers/hf_mixtral_bench.py .dev/carry/        (carry .dev to the GPU)
#   there: OUT=/tmp/out bash bench/gpu_session.sh [CARRY_DIR]        (default .dev/carry)
set -u
C=$(cd "${1:-.dev/carry}" && pwd)
OUT=${OUT:-/tmp/moec-gpu-session}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$C/gpu-libs:/usr/local/cuda/lib64 MOEC_CACHE=${MOEC_CACHE:-/tmp/mc} NCCL_NVLS_ENABLE=0
FUSED=--passes=lower,group-linear,grouped-mlp,autodiff,fold-grad-cast,dce
echo "== test_gpu_kernels"; timeout 150 "$C/test_gpu_kernels" >"$OUT/kernels.log" 2>&1; echo "rc $?"
grep -i "fail\|algorithm cache" "$OUT/kernels.log" | head -12; tail -1 "$OUT/kernels.log"
for d in b1 b2 b3 b4 b5; do mkdir -p /tmp/$d; done
echo "== genos_1b naive, MOEC_PROFILE=1, + peer"
env MOEC=$C/moec PEER=$C/hf_mixtral_bench.py STEPS=8 LOGDIR=/tmp/b1 MOEC_PROFILE=1 timeout 200 bash bench/run_bench.sh genos_1b
grep -A26 "GPU profile" /tmp/b1/moec_genos_1b.out | head -26
for d in b2 b3 b4; do cp /tmp/b1/peer_genos_1b.out /tmp/$d/; done
echo "== genos_1b naive"
env MOEC=$C/moec STEPS=10 LOGDIR=/tmp/b2 PEER_SKIP=1 timeout 120 bash bench/run_bench.sh genos_1b
grep -h "tokens_per_s" /tmp/b2/moec_genos_1b.jsonl | sed 's/.*"tokens_per_s":\([0-9.]*\).*/\1/' | tr '\n' ' '; echo
echo "== genos_1b naive, MOEC_GEMM_TUNE=0"
env MOEC=$C/moec STEPS=10 LOGDIR=/tmp/b3 PEER_SKIP=1 MOEC_GEMM_TUNE=0 timeout 120 bash bench/run_bench.sh genos_1b
echo "== genos_1b fused"
env MOEC=$C/moec STEPS=10 LOGDIR=/tmp/b4 PEER_SKIP=1 MOEC_ARGS=$FUSED timeout 150 bash bench/run_bench.sh genos_1b
echo "== genos_1b fused, mxfp8 (numerics; bf16 GEMMs)"
mkdir -p /tmp/b6; cp /tmp/b1/peer_genos_1b.out /tmp/b6/
env MOEC=$C/moec STEPS=10 LOGDIR=/tmp/b6 PEER_SKIP=1 PRECISION=mxfp8 MOEC_ARGS=--passes=lower,group-linear,grouped-mlp,autodiff,fold-grad-cast,mxfp8,dce timeout 150 bash bench/run_bench.sh genos_1b
echo "== test_gpu_step"; timeout 240 "$C/test_gpu_step" >/tmp/step.log 2>&1; echo "rc $?"
grep -c "worst loss" /tmp/step.log; grep -i fail /tmp/step.log | head -5
echo "== og2_8x1b naive + peer"
env MOEC=$C/moec PEER=$C/hf_mixtral_bench.py STEPS=8 LOGDIR=/tmp/b5 timeout 240 bash bench/run_bench.sh og2_8x1b
tar czf "$OUT/bench.tgz" /tmp/b1 /tmp/b2 /tmp/b3 /tmp/b4 /tmp/b5 /tmp/b6 /tmp/step.log 2>/dev/null
