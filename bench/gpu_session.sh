#!/usr/bin/env bash
# One device call's worth of GPU checks and benchmarks, chosen by part (a device call has 600 s;
# pick parts whose limits, in brackets, add up to less; starting the machine costs ~2 minutes of
# the session's device time on top):
# checks
#   kernels  test_gpu_kernels against the CPU, test_gpu_nccl (one-rank world), test_gpu_tiles,
#            test_gpu_narrow and test_gpu_fused, where the carry has them               [270 s]
#   narrow   test_gpu_narrow alone (the router's f32 GEMMs against the CPU)        [30 s]
#   step     test_gpu_step: tiny and l0_sanity, 20 steps against the CPU        [300 s]
#   steptiny test_gpu_step on tiny only (MOEC_GPU_STEP_ONLY=tiny; 120 s with warm NVRTC caches) [180 s]
#   steptinywg  the same with the FP8 expert GEMMs on the wgmma kernel (MOEC_FP8_GEMM=wgmma) [180 s]
#   parallel test_gpu_parallel: dp=2, ep=2, ep=2 x dp=2 vs one rank (host-staged; NCCL with 2+ GPUs) [300 s]
#   cudnn    test_gpu_attention --cudnn: cuDNN's fused attention against the CPU, timed against
#            flash (needs test_gpu_attention in the carry); on a failure again with MOEC_CUDNN_DEBUG=1 [150 s]
#   attn     genos_1b mxfp8(block=128) fused with MOEC_ATTENTION=cudnn (reuses the peer; compare
#            with stack's or fp8prof's moec row)                                 [120 s]
#   hfshard  transformers' from_pretrained on tiny's step-0 checkpoint written by one rank and
#            by ep=2 (two parts and an index; CPU ranks): the same tensors (python3 + transformers) [60 s]
#   determinism  l0_sanity 300 steps on chr20, twice with MOEC_DETERMINISTIC=1 and twice
#            without, side by side: are the logs (loss, grad norm, val) identical? [120 s]
# benchmarks (bench/run_bench.sh: moec and the peer in the same call)
#   genos    genos_1b bf16 default (fused experts) + peer              [200 s]
#   profile  genos_1b bf16 default, MOEC_PROFILE=kernels (reuses the peer)    [120 s]
#   awoff    genos_1b bf16 default with MOEC_ADAMW_MULTI=0 (one AdamW launch a parameter; reuses the peer) [120 s]
#   fused    genos_1b bf16 and mxfp8 on the fused pipeline (reuses the peer)    [300 s]
#   og2      og2_8x1b bf16 default + peer                               [240 s]
#   og2fused og2_8x1b bf16 on the fused pipeline (+ peer unless og2/og2fp8 ran)  [240 s]
#   fusedprof genos_1b bf16 fused with MOEC_PROFILE=kernels (+ peer unless genos/fp8prof/fused ran) [150 s]
#   og2fp8   og2_8x1b mxfp8(block=128) fused (FP8 expert GEMMs) + peer          [240 s]
#   fp8      genos_1b mxfp8(block=128) fused: FP8 expert GEMMs, then MOEC_FP8_GEMM=0 [300 s]
#   fp8peer  genos_1b mxfp8(block=128) fused (FP8 expert GEMMs) + peer, and the host's time line [200 s]
#   fp8tile  genos_1b mxfp8(block=128, weight_tile=128) fused: expert weights in 128 x 128
#            squares (cuBLASLt's square scales) + peer unless fp8peer/fp8prof/genos ran [200 s]
#   fp8tile2, fp8tile4  fp8tile with the disjoint expert GEMMs on 2 or 4 streams
#            (MOEC_GEMM_STREAMS; default 1), reusing fp8tile's peer                                  [100 s each]
#   fp8tilenw  fp8tile with MOEC_NARROW_GEMM=0 (the router's f32 GEMMs on cuBLASLt, not the
#            narrow kernels), reusing fp8tile's peer                                    [150 s]
#   ncuwg    Nsight Compute over the wgmma kernel in bench_grouped_gemm: genos_1b's gate_up
#            forward with vec128 weight scales, then with squares (MOEC_WGMMA_VARIANT)  [150 s]
#   fp8tilewg  fp8tile with the FP8 expert GEMMs on the wgmma kernel (MOEC_FP8_GEMM=wgmma,
#            MOEC_WGMMA_VARIANT picks its variant), reading the weights' squares, reusing
#            fp8tile's peer                                                              [150 s]
#   fp8tilenr  fp8tile without the fuse-residual pass (the residual adds as separate kernels),
#            reusing fp8tile's peer                                                      [100 s]
#   fp8tileng  fp8tile with MOEC_GATHER=0 (the expert permutes write xs and dy out instead of the
#            FP8 quantizes gathering the permuted rows, the default since 2026-12-06; until then
#            fp8tilegn ran the gather as the opt-in), reusing fp8tile's peer          [100 s]
#   fp8tilesf, og2tilesf  fp8tilemb / og2tilemb with MOEC_SPLIT_FP8=0 (dg | du's and act's FP8
#            expert columns quantized from the split's bf16 pieces), then =1 (the split writes
#            them; the default), then with MOEC_SPLIT_AHEAD=1 too (SF_RUNS picks), side by side; runs
#            the peer unless fp8tile / og2tile ran (og2's peer needs more than og2tilesf's 200 s a
#            run: run og2tile first)                                                    [300 / 500 s]
#   fp8tilesq, og2tilesq  fp8tile / og2tile with MOEC_SPLIT_Q=0 (dgate|dup's rows quantize as a
#            kernel of its own, not in the split backward), reusing their peers        [100 / 150 s]
#   fp8tileaw, og2tileaw  fp8tile / og2tile with MOEC_ADAMW_OVERLAP=1 (AdamW beside the next
#            forward, not on the main stream after the backward: off by default since it gained
#            nothing on an H100, 2026-12-06), reusing their peers                        [100 / 150 s]
#   fp8tilenc  fp8tile with MOEC_COLS_VIEW=0 (attention_bwd's dq | dk | dv copied out by their
#            slices, not read in place), reusing fp8tile's peer                          [100 s]
#   fp8tileah, fp8tileal  fp8tileaw with the update's stream at the device's greatest / least
#            priority (MOEC_ADAMW_OVERLAP=high / low; default: the default priority)    [100 s each]
#   gnab     fp8tile's moec run (no peer) with MOEC_GATHER=1 (the default) and =0, twice in turn: tok/s and
#            step-1 loss of each, for the switch alone when device time is short       [200 s]
#   fp8tilecp  fp8tile with MOEC_SQUARES=0 (the expert weights kept as bf16 copies and quantized
#            each step instead of AdamW writing their squares), reusing fp8tile's peer   [100 s]
#   fp8tilembcp  fp8tilemb with MOEC_SQUARES=0 (bf16 moments, the copies quantized each step) [100 s]
#   fp8tilemb, og2tilemb  fp8tile / og2tile with adamw(moments = bf16), reusing their peers [100 / 150 s]
#   attncfg  the cuDNN attention engines: how many configs the heuristics offer for genos_1b's
#            forward and backward (MOEC_CUDNN_DEBUG), then fp8tilemb with MOEC_CUDNN_CONFIG=1
#            and 2 (the second and third that finalize; ATTN_CFGS="1 2"), reusing fp8tile's peer [250 s]
#   fp8tilepj, og2tilepj  fp8tile / og2tile with the attention projections in FP8 too (mxfp8-projections;
#            fp8tile was that until 2026-12-07, seventh session; fp8tilenp then ran the experts-only line) [100/200 s]
#   fp8tilenga, og2tilenga  fp8tile / og2tile without fuse-gemm-add (the q, k and v dgrads' adds
#            as separate kernels; fp8tilenp until 2026-12-07), reusing their peers        [100/200 s]
#   fp8tileas  fp8tile with MOEC_ACT_STORE=1 (the saved gate_up quantized in the act quantize's kernel) [100 s]
#   genosbf  genos_1b bf16 (the default pipeline), reusing the peer of fp8tile/fp8peer/genos [100 s]
#   og2bf    og2_8x1b bf16, reusing the peer of og2tile/og2fp8/og2                 [150 s]
#   og2tile  the same on og2_8x1b (+ peer unless og2fp8/og2 ran; on a fresh machine moec's
#            NVRTC compiles and the peer took 240 s together and more)           [330 s]
#   fp8prof  genos_1b mxfp8(block=128) fused with MOEC_PROFILE=kernels (runs the peer if genos or
#            fp8peer did not) [150 s]
#   stack    genos_1b mxfp8(block=128) fused, weights kept stacked and MOEC_STACK_VIEWS=0 (stacks
#            copied, gradients unstacked), side by side (reuses the peer of genos or fp8prof) [250 s]
#   ncuadamw ncukern's sections (below) for adamw_squares (f32 and bf16 moments) in bench_grouped_gemm [150 s]
#   kbench   bench_grouped_gemm's memory-bound kernel and quantize lines alone (3 repetitions;
#            MOEC_BENCH_ONLY=gemm,quantize,mlp,splitfp8,adamw,router picks sections)                    [60 s]
#   kbenchsf the split writing every FP8 operand against the split_q and two column quantizes it
#            replaces, at both models' shapes (bench_grouped_gemm's splitfp8 section, 20 reps) [60 s]
#   kbenchab kbench's lines matching KB_GREP (default adamw) from bench_grouped_gemm_old, a build
#            from before a kernel change carried beside, then from the new build                [120 s]
#   ggemm    bench/grouped_gemm.sh: expert GEMMs bf16 / fp8 vs torch._grouped_mm [150 s]
#   wgmma    test_gpu_wgmma (the device-driven FP8 grouped GEMM against the CPU), then the
#            grouped-GEMM bench with each of its variants, WGV="0 1" (needs both in the carry) [330 s]
#   tileprof genos_1b mxfp8(block=128, weight_tile=128) fused with MOEC_PROFILE=kernels (reuses
#            the peer of fp8prof/fp8peer/fp8tile/genos; compare op by op with fp8prof)      [150 s]
#   fp8wg    genos_1b mxfp8(block=128) fused: FP8 expert GEMMs on the wgmma kernel
#            (MOEC_FP8_GEMM=wgmma), then on cuBLASLt (the default), side by side (+ peer) [330 s]
#   long     genos_1b at seq 131,072, batch 1 (issue 6): moec mxfp8(block=128) fused and bf16,
#            4 steps each, then the peer at the same length (expected to run out of memory) [300 s]
# where the GPU's time goes, from Nsight Compute (ncu: per-kernel GPU time, no event gaps)
#   ncustep  genos_1b mxfp8(block=128, weight_tile=128) fused, step 5 alone under ncu: every
#            kernel's own time summed by kernel, against the unprofiled step (the GPU's idle share);
#            NCU_WIDE=1 adds each kernel's DRAM %, occupancy and registers (not yet run)     [200 s]
#   ncustepmx  the same with mxfp8(block=128)                                                  [200 s]
#   ncustepog2 ncustep on og2_8x1b                                                            [300 s]
#   ncukern  ncu's speed-of-light, memory, occupancy, warp-stall and source sections for
#            mlp_bwd_split and quantize_act in bench_grouped_gemm (genos and og2 shapes)          [120 s]
# several GPUs (issue 8; each rank a GPU of its own, NCCL; per-GPU batch 1 at seq 8192, so
# tokens/s per GPU compares with one GPU directly)
#   scale2   og2_8x1b bf16 and mxfp8(block=128): one GPU, then ep=2 and dp=2 as threads over
#            NCCL; tokens/s per GPU, step ms, peak memory (needs 2 GPUs)               [420 s]
#   scale8   og2_8x7b mxfp8(block=128) at ep=8, with and without zero, and ep=4 x dp=2 with zero
#            (ep=2 x dp=4 is predicted not to fit 141 GB even with zero: docs/parallel.md;
#            tried last, an out-of-memory there is the expected result) (needs 8 GPUs)  [560 s]
#   killrank og2_8x1b at dp=2 as two processes (moec launch, NCCL); rank 1 killed (SIGKILL)
#            after its third step: rank 0 must stop with a message naming it, within
#            MOEC_COMM_TIMEOUT (30 s here), and moec launch exit non-zero (needs 2 GPUs) [120 s]
# training
#   chr20    l0_sanity on human chr20, STEPS20 (2000) steps: bf16 (naive and fused pipelines),
#            mxfp8(block=128, weight_tile=128) as recommended (FP8 expert GEMMs), that with
#            adamw(moments = bf16), and bf16 fused with bf16 moments, side by side on the GPU;
#            final validation losses [300 s]
# The chr20 and determinism parts read $C/chr20.fa.gz if the carry has it (scripts/fetch_data.sh,
# 18 MB), else the bundled slice. Everything is written to $OUT as it runs (session.log, and the
# logs of each part under $OUT/logs), so a call cut short still brings back what it did; only
# about 8 files come back, so session.log carries every table.
#   here:  scripts/gpu_bundle.sh build --with-moec && rm -rf .dev/carry && mkdir .dev/carry &&
#          cp -r build/gpu-carry/gpu-libs .dev/carry/ && for f in moec test_gpu_kernels test_gpu_step
#          test_gpu_fused test_gpu_tiles test_gpu_narrow test_gpu_wgmma bench_grouped_gemm; do cp build/$f .dev/carry/ && strip .dev/carry/$f;
#          done && cp ../shared/peers/hf_mixtral_bench.py .dev/carry/
#          (carry .dev; with the working tree it must stay under 64 MiB: ~42 MB here)
#   there: OUT=$OUT bash bench/gpu_session.sh .dev/carry kernels steptiny genos fp8wg, then
#          WGV="0 3" OUT=$OUT bash bench/gpu_session.sh .dev/carry wgmma og2 og2fp8
set -u
C=$(cd "${1:-.dev/carry}" && pwd)
shift
OUT=${OUT:-/tmp/moec-gpu-session}
L=$OUT/logs
mkdir -p "$L"
exec > >(tee -a "$OUT/session.log") 2>&1
export LD_LIBRARY_PATH=$C/gpu-libs:/usr/local/cuda/lib64 MOEC_CACHE=${MOEC_CACHE:-/tmp/mc} NCCL_NVLS_ENABLE=0
FUSED=--passes=lower,group-linear,grouped-mlp,autodiff,fold-grad-cast,fuse-residual,fuse-gemm-add,dce
# mxfp8 as recommended since 2026-12-07 (seventh session): FP8 on the expert GEMMs, the attention
# projections in bf16 (FP8 projections measured slower on an H100) and their dgrads summed in
# the GEMMs (fuse-gemm-add). _PROJ: the projections in FP8 too (fp8tile until then);
# _NOGA: without fuse-gemm-add; _NR: without fuse-residual. The fastest line measured adds
# --set moments=bf16 (fp8tilemb, og2tilemb: 1.73x / 1.66x against fp8tile's 1.67x / 1.58x on an
# H100, 2026-12-07 eighth session; chr20 checks it).
FUSED_MX=--passes=lower,group-linear,grouped-mlp,autodiff,fold-grad-cast,mxfp8,fuse-residual,fuse-gemm-add,dce
FUSED_MX_PROJ=--passes=lower,group-linear,grouped-mlp,mxfp8-projections,autodiff,fold-grad-cast,mxfp8,fuse-residual,fuse-gemm-add,dce
FUSED_MX_NOGA=--passes=lower,group-linear,grouped-mlp,autodiff,fold-grad-cast,mxfp8,fuse-residual,dce
FUSED_MX_NR=--passes=lower,group-linear,grouped-mlp,autodiff,fold-grad-cast,mxfp8,fuse-gemm-add,dce
bench() { env MOEC=$C/moec PEER=$C/hf_mixtral_bench.py STEPS=${STEPS:-8} "$@"; }
peer_from() { mkdir -p "$2" && cp "$1"/peer_*.out "$2"/ 2>/dev/null; }
# ncu's sections for the first COUNT launches of kernels matching REGEX in bench_grouped_gemm,
# the headline lines printed, the whole report in $L/$part.txt: ncu_sections LIMIT REGEX COUNT
ncu_sections() {
  local ncu
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout "$1" "$ncu" --clock-control none -k regex:"$2" -c "$3" --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section WarpStateStats --section LaunchStats --section SourceCounters \
    "$C/bench_grouped_gemm" 1 >"$L/$part.txt" 2>&1
  echo "ncu rc $?"
  grep -E "^  moec_|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Block Limit Reg|Stall|stall|Local" \
    "$L/$part.txt" | head -120
}
# One multi-GPU training run and its line: scale_run TAG MODEL PRECISION EP DP [ARGS...] (batch =
# EP x DP: one sequence a GPU); tokens/s per GPU = the logged global tokens/s (steps 4..) / (EP x DP).
scale_run() {
  local tag=$1 model=$2 prec=$3 ep=$4 dp=$5 w=$(($4 * $5)) args=()
  shift 5
  [ "${prec%%(*}" = mxfp8 ] && args=("$FUSED_MX")
  args+=("$@")
  MOEC_COMM_TIMEOUT=120 timeout 200 "$C/moec" train "models/$model.moe" --device cuda --set "precision=$prec" \
    --set ep="$ep" --set dp="$dp" --set batch="$w" --steps "${STEPS:-8}" --set val_every=0 --val-batches 1 \
    --data data/chr20_slice.fa.gz --log "$L/$tag.jsonl" "${args[@]}" >"$L/$tag.out" 2>&1
  local rc=$? tps
  tps=$(grep '"step"' "$L/$tag.jsonl" 2>/dev/null | awk -F'"tokens_per_s":' 'NR > 3 {split($2, a, "}"); s += a[1]; n++}
    END {if (n) printf "%.0f", s / n}')
  printf '%-14s ep=%s dp=%s rc %s: %s tok/s per GPU (%s tok/s in all), %s; %s\n' "$tag" "$ep" "$dp" "$rc" \
    "$([ -n "$tps" ] && echo $((tps / w)) || echo '?')" "${tps:-?}" \
    "$(tr '\r' '\n' <"$L/$tag.out" | grep -o 'peak GPU memory: [0-9.]* [GMK]iB' | tail -1)" \
    "$(tr '\r' '\n' <"$L/$tag.out" | grep -m1 -o 'collectives between the ranks.*\|error.*' | head -1)"
}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(kernels step genos)
for part in "${parts[@]}"; do
  echo "== $part ($(date -u +%H:%M:%S))"
  case $part in
  kernels)
    timeout 150 "$C/test_gpu_kernels" >"$L/kernels.log" 2>&1; echo "rc $?"
    grep -i "fail\|algorithm cache" "$L/kernels.log" | head -12; tail -1 "$L/kernels.log"
    [ -x "$C/test_gpu_nccl" ] && timeout 60 "$C/test_gpu_nccl" 2>&1 | tail -3
    [ -x "$C/test_gpu_tiles" ] && { timeout 60 "$C/test_gpu_tiles" >"$L/tiles.log" 2>&1; echo "test_gpu_tiles rc $?"; grep -i "fail\|gemm" "$L/tiles.log" | head -6; tail -1 "$L/tiles.log"; }
    [ -x "$C/test_gpu_narrow" ] && { timeout 30 "$C/test_gpu_narrow" >"$L/narrow.log" 2>&1; echo "test_gpu_narrow rc $?"; grep -i "fail\|logits\|dx =\|dgate" "$L/narrow.log" | head -6; tail -1 "$L/narrow.log"; }
    if [ -x "$C/test_gpu_fused" ]; then
      timeout 60 "$C/test_gpu_fused" >"$L/fused.log" 2>&1; echo "test_gpu_fused rc $?"
      grep -i "fail" "$L/fused.log" | head -8; tail -1 "$L/fused.log"
    fi ;;
  narrow)
    timeout 30 "$C/test_gpu_narrow" >"$L/narrow.log" 2>&1; echo "rc $?"; cat "$L/narrow.log" ;;
  step | steptiny | steptinywg)
    only=; [ $part != step ] && only=tiny
    f8=${MOEC_FP8_GEMM:-}; [ $part = steptinywg ] && f8=wgmma
    MOEC_FP8_GEMM=$f8 MOEC_GPU_STEP_ONLY=$only timeout $([ $part = step ] && echo 300 || echo 180) "$C/test_gpu_step" >"$L/$part.log" 2>&1
    echo "rc $?"
    grep "worst loss\|fail\|between steps\|VIEW_\|step [0-9]* with" "$L/$part.log" | head -20 ;;
  parallel)
    env MOEC=$C/moec timeout 300 stdbuf -oL "$C/test_gpu_parallel" >"$L/parallel.log" 2>&1; echo "rc $?"
    grep "vs one rank\|FAIL\|SKIP\|gpu_comm\|test_gpu_parallel" "$L/parallel.log" | head -20 ;;
  cudnn)
    timeout 100 "$C/test_gpu_attention" --cudnn >"$L/cudnn.log" 2>&1; rc=$?; echo "rc $rc"
    grep -i "cudnn\|fail\|ms" "$L/cudnn.log" | head -30
    if [ $rc != 0 ]; then
      MOEC_CUDNN_DEBUG=1 timeout 45 "$C/test_gpu_attention" --cudnn >"$L/cudnn_debug.log" 2>&1
      grep -v "^ *$" "$L/cudnn_debug.log" | grep -i -B2 -A2 "error\|fail\|status" | head -60
    fi ;;
  attn)
    peer_from "$L/genos" "$L/attn"; peer_from "$L/fp8prof" "$L/attn"
    bench LOGDIR=$L/attn PEER_SKIP=1 PRECISION='mxfp8(block=128)' MOEC_ARGS=$FUSED_MX MOEC_ATTENTION=cudnn timeout 120 bash bench/run_bench.sh genos_1b
    grep -i "error\|cudnn" "$L/attn/moec_genos_1b.out" | head -5 ;;
  genos)
    bench LOGDIR=$L/genos timeout 200 bash bench/run_bench.sh genos_1b ;;
  profile)
    peer_from "$L/genos" "$L/profile"
    bench LOGDIR=$L/profile PEER_SKIP=1 MOEC_PROFILE=kernels timeout 120 bash bench/run_bench.sh genos_1b
    grep -A30 "GPU profile" "$L/profile/moec_genos_1b.out" | head -30 ;;
  fused)
    for d in fused fused_mx; do peer_from "$L/genos" "$L/$d"; peer_from "$L/fp8prof" "$L/$d"; done
    bench LOGDIR=$L/fused PEER_SKIP=1 MOEC_ARGS=$FUSED timeout 140 bash bench/run_bench.sh genos_1b
    bench LOGDIR=$L/fused_mx PEER_SKIP=1 PRECISION=mxfp8 MOEC_ARGS=$FUSED_MX timeout 160 bash bench/run_bench.sh genos_1b ;;
  og2)
    bench LOGDIR=$L/og2 timeout 240 bash bench/run_bench.sh og2_8x1b ;;
  awoff)
    peer_from "$L/genos" "$L/awoff"
    bench LOGDIR=$L/awoff PEER_SKIP=1 MOEC_ADAMW_MULTI=0 timeout 120 bash bench/run_bench.sh genos_1b ;;
  og2fused)
    peer_from "$L/og2" "$L/og2fused"; peer_from "$L/og2fp8" "$L/og2fused"
    bench LOGDIR=$L/og2fused PEER_SKIP=1 MOEC_ARGS=$FUSED timeout 240 bash bench/run_bench.sh og2_8x1b ;;
  fusedprof)
    for d in fusedprof; do peer_from "$L/genos" "$L/$d"; peer_from "$L/fp8prof" "$L/$d"; peer_from "$L/fused" "$L/$d"; done
    bench LOGDIR=$L/fusedprof PEER_SKIP=1 MOEC_ARGS=$FUSED MOEC_PROFILE=kernels timeout 150 bash bench/run_bench.sh genos_1b
    grep -A110 "GPU profile" "$L/fusedprof/moec_genos_1b.out" | grep -v "^  %" | head -80 ;;
  og2fp8)
    bench LOGDIR=$L/og2fp8 PRECISION='mxfp8(block=128)' MOEC_ARGS=$FUSED_MX timeout 240 bash bench/run_bench.sh og2_8x1b ;;
  fp8)
    peer_from "$L/genos" "$L/fp8"; peer_from "$L/genos" "$L/fp8_off"
    bench LOGDIR=$L/fp8 PEER_SKIP=1 PRECISION='mxfp8(block=128)' MOEC_ARGS=$FUSED_MX timeout 150 bash bench/run_bench.sh genos_1b
    bench LOGDIR=$L/fp8_off PEER_SKIP=1 PRECISION='mxfp8(block=128)' MOEC_ARGS=$FUSED_MX MOEC_FP8_GEMM=0 timeout 150 bash bench/run_bench.sh genos_1b ;;
  fp8tile)
    peer_from "$L/fp8peer" "$L/fp8tile"; peer_from "$L/fp8prof" "$L/fp8tile"; peer_from "$L/genos" "$L/fp8tile"
    bench LOGDIR=$L/fp8tile PEER_SKIP=1 PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS=$FUSED_MX timeout 200 bash bench/run_bench.sh genos_1b
    grep "^host" "$L/fp8tile/moec_genos_1b.out" ;;
  fp8tile2|fp8tile4)
    peer_from "$L/fp8tile" "$L/$part"
    bench LOGDIR=$L/$part PEER_SKIP=1 MOEC_GEMM_STREAMS=${part#fp8tile} PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS=$FUSED_MX timeout 150 bash bench/run_bench.sh genos_1b ;;
  fp8tilepj | og2tilepj | fp8tilenga | og2tilenga) # fp8tile / og2tile with the projections in FP8, or without fuse-gemm-add
    m=genos_1b d=fp8tile && [ ${part#og2} != $part ] && m=og2_8x1b d=og2tile
    a=$FUSED_MX_PROJ && [ ${part%nga} != $part ] && a=$FUSED_MX_NOGA
    peer_from "$L/$d" "$L/$part"
    bench LOGDIR=$L/$part PEER_SKIP=1 PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS=$a timeout 200 bash bench/run_bench.sh $m ;;
  fp8tileas) # the saved gate_up quantized in the act quantize's kernel (MOEC_ACT_STORE=1), beside fp8tile
    peer_from "$L/fp8tile" "$L/$part"
    bench LOGDIR=$L/$part PEER_SKIP=1 MOEC_ACT_STORE=1 PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS=$FUSED_MX timeout 150 bash bench/run_bench.sh genos_1b ;;
  attncfg)
    MOEC_CUDNN_DEBUG=1 timeout 100 "$C/moec" train models/genos_1b.moe --device cuda --steps 1 --set val_every=0 \
      --val-batches 1 --data data/chr20_slice.fa.gz >"$L/attncfg_dbg.out" 2>&1
    grep -E "engine configs|plan: config|refused:|graph: B" "$L/attncfg_dbg.out" | cut -c1-200 | head -30
    for n in ${ATTN_CFGS:-1 2}; do
      peer_from "$L/fp8tile" "$L/attncfg$n"
      bench LOGDIR=$L/attncfg$n PEER_SKIP=1 MOEC_CUDNN_CONFIG=$n PRECISION='mxfp8(block=128,weight_tile=128)' \
        MOEC_ARGS="$FUSED_MX --set moments=bf16" timeout 150 bash bench/run_bench.sh genos_1b
    done ;;
  fp8tilemb)
    peer_from "$L/fp8tile" "$L/$part"
    bench LOGDIR=$L/$part PEER_SKIP=1 PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS="$FUSED_MX --set moments=bf16" timeout 150 bash bench/run_bench.sh genos_1b ;;
  og2tilemb)
    peer_from "$L/og2tile" "$L/$part"
    bench LOGDIR=$L/$part PEER_SKIP=1 PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS="$FUSED_MX --set moments=bf16" timeout 200 bash bench/run_bench.sh og2_8x1b ;;
  fp8tilesf | og2tilesf) # fp8tilemb / og2tilemb with MOEC_SPLIT_FP8=0, then as is, side by side (+ peer)
    m=genos_1b d=fp8tile t=150 && [ ${part#og2} != $part ] && m=og2_8x1b d=og2tile t=200
    peer_from "$L/$d" "$L/$part"
    for sf in ${SF_RUNS:-0 1 ahead}; do # ahead: and MOEC_SPLIT_AHEAD=1
      echo "MOEC_SPLIT_FP8=$sf:"
      bench LOGDIR=$L/$part PEER_SKIP=1 MOEC_SPLIT_FP8=$([ $sf = 0 ] && echo 0 || echo 1) MOEC_SPLIT_AHEAD=$([ $sf = ahead ] && echo 1 || echo 0) \
        PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS="$FUSED_MX --set moments=bf16" timeout $t bash bench/run_bench.sh $m
      cp "$L/$part/moec_$m.out" "$L/$part/moec_${m}_sf$sf.out" 2>/dev/null
    done ;;
  fp8tilembcp)
    peer_from "$L/fp8tile" "$L/$part"
    bench LOGDIR=$L/$part PEER_SKIP=1 MOEC_SQUARES=0 PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS="$FUSED_MX --set moments=bf16" timeout 150 bash bench/run_bench.sh genos_1b ;;
  fp8tilewg)
    peer_from "$L/fp8tile" "$L/$part"
    bench LOGDIR=$L/$part PEER_SKIP=1 MOEC_FP8_GEMM=wgmma PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS=$FUSED_MX timeout 150 bash bench/run_bench.sh genos_1b ;;
  fp8tilenw)
    peer_from "$L/fp8tile" "$L/$part"
    bench LOGDIR=$L/$part PEER_SKIP=1 MOEC_NARROW_GEMM=0 PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS=$FUSED_MX timeout 150 bash bench/run_bench.sh genos_1b ;;
  fp8tilenr)
    peer_from "$L/fp8tile" "$L/$part"
    bench LOGDIR=$L/$part PEER_SKIP=1 PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS=$FUSED_MX_NR timeout 150 bash bench/run_bench.sh genos_1b ;;
  fp8tilesq | og2tilesq)
    m=genos_1b d=fp8tile && [ $part = og2tilesq ] && m=og2_8x1b d=og2tile
    peer_from "$L/$d" "$L/$part"
    bench LOGDIR=$L/$part PEER_SKIP=1 MOEC_SPLIT_Q=0 PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS=$FUSED_MX timeout 200 bash bench/run_bench.sh $m ;;
  fp8tileaw | og2tileaw | fp8tileah | fp8tileal)
    m=genos_1b d=fp8tile ov=1 && [ $part = og2tileaw ] && m=og2_8x1b d=og2tile
    [ $part = fp8tileah ] && ov=high; [ $part = fp8tileal ] && ov=low
    peer_from "$L/$d" "$L/$part"
    bench LOGDIR=$L/$part PEER_SKIP=1 MOEC_ADAMW_OVERLAP=$ov PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS=$FUSED_MX timeout 200 bash bench/run_bench.sh $m ;;
  fp8tilenc)
    peer_from "$L/fp8tile" "$L/$part"
    bench LOGDIR=$L/$part PEER_SKIP=1 MOEC_COLS_VIEW=0 PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS=$FUSED_MX timeout 150 bash bench/run_bench.sh genos_1b ;;
  fp8tileng)
    peer_from "$L/fp8tile" "$L/$part"
    bench LOGDIR=$L/$part PEER_SKIP=1 MOEC_GATHER=0 PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS=$FUSED_MX timeout 150 bash bench/run_bench.sh genos_1b ;;
  gnab)
    i=0
    for g in 1 0 1 0; do
      i=$((i + 1)) && t=gnab$i-$g
      MOEC_GATHER=$g timeout $([ $i = 1 ] && echo 120 || echo 60) "$C/moec" train models/genos_1b.moe --device cuda --set 'precision=mxfp8(block=128,weight_tile=128)' \
        --steps "${STEPS:-8}" --set val_every=0 --val-batches 1 --data data/chr20_slice.fa.gz --log "$L/$t.jsonl" $FUSED_MX \
        >"$L/$t.out" 2>&1
      echo "MOEC_GATHER=$g rc $?: $(grep '"step"' "$L/$t.jsonl" | awk -F'"tokens_per_s":' 'NR > 3 {split($2, a, "}"); s += a[1]; n++}
        END {if (n) printf "%.0f tok/s (steps 4..)", s / n}'), step 1: $(grep -m1 '"step"' "$L/$t.jsonl" | grep -o '"loss":[0-9.]*\|"grad_norm":[0-9.]*' | tr '\n' ' ')"
    done ;;
  fp8tilecp)
    peer_from "$L/fp8tile" "$L/$part"
    bench LOGDIR=$L/$part PEER_SKIP=1 MOEC_SQUARES=0 PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS=$FUSED_MX timeout 150 bash bench/run_bench.sh genos_1b ;;
  genosbf)
    for d in fp8tile fp8peer genos; do peer_from "$L/$d" "$L/genosbf"; done
    bench LOGDIR=$L/genosbf PEER_SKIP=1 timeout 150 bash bench/run_bench.sh genos_1b ;;
  og2bf)
    for d in og2tile og2fp8 og2; do peer_from "$L/$d" "$L/og2bf"; done
    bench LOGDIR=$L/og2bf PEER_SKIP=1 timeout 200 bash bench/run_bench.sh og2_8x1b ;;
  og2tile)
    peer_from "$L/og2fp8" "$L/og2tile"; peer_from "$L/og2" "$L/og2tile"
    bench LOGDIR=$L/og2tile PEER_SKIP=1 PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS=$FUSED_MX timeout 330 bash bench/run_bench.sh og2_8x1b ;;
  fp8peer)
    peer_from "$L/fp8tile" "$L/fp8peer"
    bench LOGDIR=$L/fp8peer PEER_SKIP=1 PRECISION='mxfp8(block=128)' MOEC_ARGS=$FUSED_MX timeout 200 bash bench/run_bench.sh genos_1b
    grep "^host" "$L/fp8peer/moec_genos_1b.out" ;;
  fp8prof)
    peer_from "$L/genos" "$L/fp8prof"; peer_from "$L/fp8peer" "$L/fp8prof"
    bench LOGDIR=$L/fp8prof PEER_SKIP=1 PRECISION='mxfp8(block=128)' MOEC_ARGS=$FUSED_MX MOEC_PROFILE=kernels timeout 150 bash bench/run_bench.sh genos_1b
    grep -A110 "GPU profile" "$L/fp8prof/moec_genos_1b.out" | grep -v "^  %" | head -80 ;;
  tileprof)
    for d in fp8prof fp8peer fp8tile genos; do peer_from "$L/$d" "$L/tileprof"; done
    bench LOGDIR=$L/tileprof PEER_SKIP=1 PRECISION='mxfp8(block=128,weight_tile=128)' MOEC_ARGS=$FUSED_MX MOEC_PROFILE=kernels timeout 150 bash bench/run_bench.sh genos_1b
    grep -A110 "GPU profile" "$L/tileprof/moec_genos_1b.out" | grep -v "^  %" | head -80 ;;
  fp8wg)
    peer_from "$L/genos" "$L/fp8wg"; peer_from "$L/fp8prof" "$L/fp8wg"
    bench LOGDIR=$L/fp8wg PEER_SKIP=1 PRECISION='mxfp8(block=128)' MOEC_ARGS=$FUSED_MX MOEC_FP8_GEMM=wgmma timeout 200 bash bench/run_bench.sh genos_1b
    peer_from "$L/fp8wg" "$L/fp8cub"
    bench LOGDIR=$L/fp8cub PEER_SKIP=1 PRECISION='mxfp8(block=128)' MOEC_ARGS=$FUSED_MX timeout 120 bash bench/run_bench.sh genos_1b ;;
  stack)
    for d in stack stack_off; do peer_from "$L/genos" "$L/$d"; peer_from "$L/fp8prof" "$L/$d"; done
    bench LOGDIR=$L/stack PEER_SKIP=1 PRECISION='mxfp8(block=128)' MOEC_ARGS=$FUSED_MX timeout 120 bash bench/run_bench.sh genos_1b
    bench LOGDIR=$L/stack_off PEER_SKIP=1 PRECISION='mxfp8(block=128)' MOEC_ARGS=$FUSED_MX MOEC_STACK_VIEWS=0 timeout 120 bash bench/run_bench.sh genos_1b ;;
  ncustep|ncustepmx|ncustepog2)
    prec='mxfp8(block=128,weight_tile=128)'; [ $part = ncustepmx ] && prec='mxfp8(block=128)'
    model=genos_1b lim=200; [ $part = ncustepog2 ] && model=og2_8x1b lim=300
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    metrics=gpu__time_duration.sum # NCU_WIDE=1: and each kernel's DRAM %, occupancy, registers (more replays)
    [ "${NCU_WIDE:-0}" = 1 ] && metrics=$metrics,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
    MOEC_PROFILE_STEP=5 timeout $lim "$NCU" --profile-from-start off --clock-control none --cache-control none \
      --metrics $metrics --csv --log-file "$L/$part.csv" "$C/moec" train models/$model.moe --device cuda \
      --set precision="$prec" --steps 5 --set val_every=0 --val-batches 1 --data data/chr20_slice.fa.gz \
      --log "$L/$part.jsonl" $FUSED_MX >"$L/$part.out" 2>&1; echo "ncu rc $?"
    step_ms=$(grep '"step":4,' "$L/$part.jsonl" | sed 's/.*"tokens_per_s":\([0-9.]*\).*/\1/' | awk '{printf "%.2f", 8192000 / $1}')
    echo "$model $prec: step 4 (unprofiled, ncu attached) $step_ms ms"
    python3 bench/ncu_sum.py "$L/$part.csv" $step_ms ;;
  ncukern) ncu_sections 120 'mlp_bwd_split|mxfp8_quantize_act' 8 ;;
  ncuadamw) ncu_sections 150 'adamw_squares' 4 ;;
  ncuwg) ncu_sections 150 'wg_fp8' 8 ;; # genos_1b gate_up forward, balanced: vec128 scales (4 launches), then squares (4)
  kbenchab) # the carry's bench_grouped_gemm_old (a build before a kernel change) then the new one, the lines of KB_GREP
    for b in bench_grouped_gemm_old bench_grouped_gemm; do
      echo "$b:"; timeout 60 "$C/$b" 3 2>&1 | grep '"kernel"\|"quantize"' | grep -i -- "${KB_GREP:-adamw}"
    done ;;
  kbench)
    timeout 60 "$C/bench_grouped_gemm" 3 2>&1 | grep '"kernel"\|"quantize"' ;;
  kbenchsf)
    MOEC_BENCH_ONLY=splitfp8 timeout 60 "$C/bench_grouped_gemm" 20 2>&1 | grep '"kernel"\|rror' ;;
  ggemm)
    BENCH=$C/bench_grouped_gemm timeout 150 bash bench/grouped_gemm.sh 20 "$L/ggemm" ;;
  wgmma)
    timeout 90 "$C/test_gpu_wgmma" >"$L/wgmma.log" 2>&1; echo "rc $?"
    grep -v "^  [a-z]" "$L/wgmma.log" | head -40
    for v in ${WGV:-0 1}; do
      echo "-- variant $v"
      MOEC_WGMMA_VARIANT=$v BENCH=$C/bench_grouped_gemm timeout 120 bash bench/grouped_gemm.sh 20 "$L/ggemm$v"
    done ;;
  hfshard)
    for e in 1 2; do
      timeout 25 "$C/moec" train models/tiny.moe --device cpu --set ep=$e --set batch=2 --stop-at 0 --ckpt-dir "$L/hf_ep$e" \
        >"$L/hf_ep$e.out" 2>&1 || { echo "ep=$e: rc $?"; tail -2 "$L/hf_ep$e.out"; }
    done
    ls "$L/hf_ep2/step-00000000" | tr '\n' ' '; echo
    timeout 30 python3 tests/parity/check_from_pretrained.py "$L/hf_ep1/step-00000000" "$L/hf_ep2/step-00000000" 2>&1 | tail -4 ;;
  scale2)
    for p in bf16 'mxfp8(block=128)'; do
      t=${p%%(*}
      scale_run "og2_${t}_1" og2_8x1b "$p" 1 1
      scale_run "og2_${t}_ep2" og2_8x1b "$p" 2 1
      scale_run "og2_${t}_dp2" og2_8x1b "$p" 1 2
    done ;;
  scale8)
    scale_run og2x7_ep8 og2_8x7b 'mxfp8(block=128)' 8 1
    scale_run og2x7_ep8z og2_8x7b 'mxfp8(block=128)' 8 1 --set zero=true
    scale_run og2x7_ep4dp2z og2_8x7b 'mxfp8(block=128)' 4 2 --set zero=true
    scale_run og2x7_ep2dp4z og2_8x7b 'mxfp8(block=128)' 2 4 --set zero=true ;;
  killrank)
    t0=$(date +%s)
    MOEC_COMM_TIMEOUT=30 timeout 110 "$C/moec" launch -n 2 "$C/moec" train models/og2_8x1b.moe --device cuda --set dp=2 \
      --set batch=2 --steps 40 --set val_every=0 --val-batches 1 --data data/chr20_slice.fa.gz --log "$L/kill.jsonl" \
      >"$L/killrank.out" 2>&1 &
    lp=$!
    for _ in $(seq 100); do n=$(grep -c '"step"' "$L/kill.jsonl" 2>/dev/null); [ "${n:-0}" -ge 3 ] && break; sleep 1; done
    victim=$(pgrep -f "moec train models/og2_8x1b.moe" | while read -r p; do
      tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx RANK=1 && echo "$p"; done | head -1)
    tk=$(date +%s)
    [ -n "$victim" ] && kill -9 "$victim"
    wait $lp; rc=$?
    echo "killed rank 1 (pid ${victim:-none}) after $(grep -c '"step"' "$L/kill.jsonl") steps; moec launch rc $rc," \
      "$(($(date +%s) - tk)) s after the kill ($(($(date +%s) - t0)) s in all)"
    grep -i "error\|lost\|timed out\|stopped" "$L/killrank.out" | head -6 ;;
  chr20)
    D=$C/chr20.fa.gz
    [ -f "$D" ] || D=data/chr20.fa.gz
    [ -f "$D" ] || D=data/chr20_slice.fa.gz
    echo "genome $D, ${STEPS20:-2000} steps"
    pids=()
    # the lines (precision:pipeline): bf16 on both pipelines; mxfp8 as recommended (the
    # weight-tile recipe, FP8 on the expert GEMMs: `fused`), and that with adamw(moments = bf16)
    # (`mb`); bf16 fused with bf16 moments (`bmb`) separates what the moments do alone
    W='mxfp8(block=128,weight_tile=128)'
    for run in bf16:naive bf16:fused "$W:fused" "$W:mb" bf16:bmb; do
      p=${run%:*} pipe=${run##*:} tag=${run%%(*}
      tag=${tag%%:*}_$pipe
      args=()
      [ $pipe = fused ] && args=("$FUSED")
      [ "${p%%(*}" = mxfp8 ] && args=("$FUSED_MX")
      [ $pipe = mb ] && args=("$FUSED_MX" --set moments=bf16)
      [ $pipe = bmb ] && args=("$FUSED" --set moments=bf16)
      timeout 420 "$C/moec" train models/l0_sanity.moe --device cuda --data "$D" --steps "${STEPS20:-2000}" \
        --set "precision=$p" --set val_every=250 --val-batches 64 --log "$L/chr20_$tag.jsonl" "${args[@]}" \
        >"$L/chr20_$tag.out" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}" # (a bare wait would also wait for this script's tee)
    for tag in bf16_naive bf16_fused mxfp8_fused mxfp8_mb bf16_bmb; do
      tr '\r' '\n' <"$L/chr20_$tag.out" | grep "val_loss\|error" | tail -2 | sed "s/^/$tag: /"
      # every validation on one line: only about 8 files come back, session.log always does
      echo "$tag val_loss by step: $(tr '\r' '\n' <"$L/chr20_$tag.out" | awk '/^step [0-9]+: val_loss/ {printf "%s %s ", $2, $4}')"
    done
    awk '/^done:/ {for (i = 1; i <= NF; i++) if ($i == "val_loss") v[FILENAME] = $(i + 1)}
         END {n = v[ARGV[1]]; f = v[ARGV[2]]; m = v[ARGV[3]]; b = v[ARGV[4]]; g = v[ARGV[5]]
              if (n > 0 && f > 0 && m > 0) printf "final val_loss: bf16 naive %s, bf16 fused %s, mxfp8 %s; mxfp8 vs bf16 fused %+.2f%%, vs naive %+.2f%%\n", n, f, m, 100 * (m / f - 1), 100 * (m / n - 1)
              if (f > 0 && b > 0) printf "mxfp8 with bf16 moments %s: vs bf16 fused %+.2f%%, vs naive %+.2f%%\n", b, 100 * (b / f - 1), 100 * (b / n - 1)
              if (f > 0 && g > 0) printf "bf16 fused with bf16 moments %s: vs bf16 fused %+.2f%%\n", g, 100 * (g / f - 1)}' \
      "$L/chr20_bf16_naive.out" "$L/chr20_bf16_fused.out" "$L/chr20_mxfp8_fused.out" "$L/chr20_mxfp8_mb.out" "$L/chr20_bf16_bmb.out" ;;
  long)
    for run in 'mxfp8(block=128)':$FUSED_MX bf16:; do
      p=${run%%:*} args=${run#*:} tag=${p%%(*}
      timeout 120 "$C/moec" train models/genos_1b.moe --device cuda --set seq=131072 --set batch=1 --set "precision=$p" --set val_fraction=0.1 \
        --steps 4 --set val_every=0 --val-batches 1 --data data/chr20_slice.fa.gz --log "$L/long_$tag.jsonl" $args \
        >"$L/long_$tag.out" 2>&1
      echo "$p: rc $? $(tr '\r' '\n' <"$L/long_$tag.out" | grep -E 'tok/s|peak GPU|held between|error' | tail -4 | tr '\n' ' ')"
    done
    timeout 120 python3 "$C/hf_mixtral_bench.py" --preset genos_1b --seq 131072 >"$L/long_peer.out" 2>&1
    echo "peer: rc $? $(grep -io 'out of memory[^.]*\|"tokens_per_s": *[0-9.]*' "$L/long_peer.out" | tail -1)" ;;
  determinism)
    D=$C/chr20.fa.gz
    [ -f "$D" ] || D=data/chr20_slice.fa.gz
    pids=()
    for run in det1 det2 def1 def2; do
      det=0
      [ "${run#det}" != "$run" ] && det=1
      MOEC_DETERMINISTIC=$det timeout 110 "$C/moec" train models/l0_sanity.moe --device cuda --data "$D" --steps 300 \
        --set precision=bf16 --set val_every=100 --val-batches 16 --log "$L/$run.jsonl" >"$L/$run.out" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}"
    for pair in det def; do
      a=$L/${pair}1.jsonl b=$L/${pair}2.jsonl
      strip() { sed 's/,"tokens_per_s":[0-9.e+-]*//' "$1"; }
      if [ -s "$a" ] && cmp -s <(strip "$a") <(strip "$b"); then echo "$pair: identical logs ($(wc -l <"$a") lines)"
      else echo "$pair: logs differ: $(diff <(strip "$a") <(strip "$b") | head -2 | tr '\n' ' ')"; fi
    done ;;
  *) echo "unknown part '$part' (kernels step steptiny parallel hfshard scale2 scale8 killrank cudnn attn stack genos awoff profile fused fp8 fp8prof fusedprof og2 og2fp8 og2fused ggemm chr20 determinism long)" ;;
  esac
done
echo "== done ($(date -u +%H:%M:%S))"
