#!/usr/bin/env bash
# Runs moec's GPU tests on a machine with an NVIDIA GPU, from a build made elsewhere (the GPU
# machine need not have flex, bison, cmake or the CPU libraries: see scripts/gpu_bundle.sh).
#
#   scripts/gpu_check.sh [DIR]     (default: build/gpu-carry if it exists, else build)
#
# On the build machine first:  cmake -S . -B build && make -C build -j && scripts/gpu_bundle.sh build
# then carry build/gpu-carry (the GPU test binaries and, in gpu-libs/, their CPU libraries).
#
# Reports the environment (GPU, driver, toolkit, NVRTC), then runs each GPU test with a time
# limit and reports PASS / FAIL / SKIP for each. On a GPU machine a SKIP counts as a failure
# (the test did not use the GPU). With compute-sanitizer present, test_gpu_kernels also runs
# once under memcheck (MOEC_MEMCHECK=0 skips that). Exit status 0 only when all passed.
#
# Logs: gpu_check.log (the environment, every test's output, the summary) and kernels.tar.gz
# (the generated sources and NVRTC logs) in $OUT when it is set (two files: the device tool
# brings back at most eight), else in BUILD_DIR/gpu_check/ with one log per test besides.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
default=$root/build
[ -d "$root/build/gpu-carry" ] && default=$root/build/gpu-carry
build=$(cd "${1:-$default}" 2>/dev/null && pwd) || { echo "gpu_check: no folder '${1:-$default}'" >&2; exit 2; }
logdir=${OUT:-$build/gpu_check}
mkdir -p "$logdir"
summary=$logdir/gpu_check.log
: >"$summary"
say() { echo "$@" | tee -a "$summary"; }
work=$(mktemp -d /tmp/moec_gpu_check.XXXXXX)
trap 'rm -rf "$work"' EXIT

say "== moec gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
say "build: $build"
[ -d "$root/.git" ] && say "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"

# ---- the environment ----
say "-- GPU and driver"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1 | tee -a "$summary"
else
  say "nvidia-smi: not found"
fi
say "libcuda: $(ldconfig -p 2>/dev/null | grep -m1 'libcuda.so.1 ' | sed 's/.*=> //' || true)"
say "-- CUDA toolkit"
for c in nvcc compute-sanitizer; do
  if command -v $c >/dev/null; then say "$c: $(command -v $c)"; else say "$c: not on PATH"; fi
done
command -v nvcc >/dev/null && nvcc --version 2>&1 | tail -1 | tee -a "$summary"

# NVRTC: the runtime tries libnvrtc.so.13/.12 by the loader's path, then $CUDA_HOME/lib64,
# $CUDA_PATH/lib64, /usr/local/cuda/lib64. If none has it, look in the usual other places.
find_nvrtc() {
  ldconfig -p 2>/dev/null | grep -qE 'libnvrtc\.so\.1[23] ' && return 0
  local d
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    [ -n "$d" ] && ls "$d"/lib64/libnvrtc.so.1[23] >/dev/null 2>&1 && return 0
  done
  local f
  f=$(find /usr/local /opt /usr/lib -maxdepth 7 -name 'libnvrtc.so.1[23]' 2>/dev/null | head -1)
  if [ -n "$f" ]; then
    export MOEC_LIBNVRTC=$f
    say "NVRTC found outside the loader's path: MOEC_LIBNVRTC=$f"
    return 0
  fi
  return 1
}
if [ -n "${MOEC_LIBNVRTC:-}" ]; then say "NVRTC: MOEC_LIBNVRTC=$MOEC_LIBNVRTC (given)"
elif find_nvrtc; then say "NVRTC: $(ldconfig -p 2>/dev/null | grep -m1 -E 'libnvrtc\.so\.1[23] ' | sed 's/.*=> //')${MOEC_LIBNVRTC:-}"
else say "NVRTC: not found (the GPU tests will fail: moec compiles its kernels with NVRTC)"; fi

if [ -d "$build/gpu-libs" ]; then
  export LD_LIBRARY_PATH="$build/gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  say "carried libraries: $(ls "$build/gpu-libs" | tr '\n' ' ')"
fi
export MOEC_CACHE=$work/cache        # a fresh kernel cache: every module compiles here
export MOEC_DUMP_DIR=$work/kernels   # sources and NVRTC logs, archived below
export NCCL_NVLS_ENABLE=0            # (no NVLink multicast, on shared hosts)

# ---- the tests ----
tests=(test_gpu_loader test_gpu_nvrtc_compile test_gpu_kernels)
for t in "$build"/test_gpu_*; do # any other GPU test, after the known ones
  n=$(basename "$t")
  [[ " ${tests[*]} " == *" $n "* ]] || tests+=("$n")
done
declare -A result=() secs=()
fails=0
run_one() { # name, limit in seconds, command...
  local name=$1 limit=$2
  shift 2
  local log=$work/$name.log t0 rc
  say "-- $name"
  if ldd "$1" 2>/dev/null | grep -q 'not found'; then
    ldd "$1" | grep 'not found' | tee -a "$summary"
    say "$name: MISSING LIBRARIES (run scripts/gpu_bundle.sh on the build machine and carry build/gpu-libs)"
    result[$name]=MISSING-LIBS
    fails=$((fails + 1))
    return
  fi
  t0=$(date +%s)
  (cd "$root" && timeout "$limit" "$@") >"$log" 2>&1
  rc=$?
  secs[$name]=$(($(date +%s) - t0))
  cat "$log" >>"$summary"
  if [ $rc -eq 124 ]; then result[$name]="FAIL (timed out after ${limit}s)"
  elif [ $rc -ne 0 ]; then result[$name]="FAIL (exit $rc)"
  elif grep -q '^SKIP' "$log"; then result[$name]="SKIP: $(grep -m1 '^SKIP' "$log")"
  else result[$name]=PASS; fi
  [ "${result[$name]}" = PASS ] || fails=$((fails + 1))
  tail -3 "$log"
  say "$name: ${result[$name]} (${secs[$name]} s)"
  [ -n "${OUT:-}" ] || cp "$log" "$logdir/"
}
for t in "${tests[@]}"; do
  if [ ! -x "$build/$t" ]; then
    say "-- $t: NOT BUILT"
    result[$t]="FAIL (not built)"
    fails=$((fails + 1))
    continue
  fi
  run_one "$t" 300 "$build/$t"
done
if [ "${MOEC_MEMCHECK:-1}" != 0 ] && command -v compute-sanitizer >/dev/null && [ -x "$build/test_gpu_kernels" ]; then
  tests+=(memcheck_test_gpu_kernels)
  MOEC_CACHE=$work/cache run_one memcheck_test_gpu_kernels 420 \
    compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 "$build/test_gpu_kernels"
fi

[ -d "$work/kernels" ] && tar -czf "$logdir/kernels.tar.gz" -C "$work" kernels 2>/dev/null
say "== summary"
for t in "${tests[@]}"; do say "$(printf '  %-28s %s' "$t" "${result[$t]:-?}")"; done
if [ $fails -eq 0 ]; then say "gpu_check: all ${#tests[@]} passed"; else say "gpu_check: $fails of ${#tests[@]} did not pass"; fi
[ $fails -eq 0 ]
