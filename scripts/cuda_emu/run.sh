#!/usr/bin/env bash
# Runs test_gpu_kernels on the CPU emulator: the generated kernels compiled as host C++,
# behind a stand-in libcuda (emu_driver.cpp) and a stand-in libcublasLt (emu_cublaslt.cpp:
# the GEMMs moec runs, computed on the CPU). NVRTC still compiles every module for real
# (the runtime needs its cubins). Catches logic errors in kernels, launchers and the GPU
# executor without a GPU; timing, memory ordering and device math are not modelled (see
# emu_driver.cpp). Attention runs its GEMM path (MOEC_ATTENTION=gemm unless set): the flash
# kernels are inline PTX, which the emulator cannot run (tests/emu runs them instead).
#   scripts/cuda_emu/run.sh [BUILD_DIR] [TEST...]   (default: build test_gpu_kernels; needs g++, libnvrtc)
# e.g. MOEC_BENCH_T=64 scripts/cuda_emu/run.sh build test_gpu_bench
#      MOEC_GPU_STEP_ONLY=tiny MOEC_GPU_STEP_STEPS=3 scripts/cuda_emu/run.sh build test_gpu_step
# MOEC_EMU_SANITIZE=1 builds the emulated kernels with AddressSanitizer, a stand-in for
# compute-sanitizer's memcheck (out-of-bounds "device" accesses are host heap overflows).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$root/build
if [ $# -gt 0 ] && [ -d "$1" ]; then build=$1; shift; fi
build=$(cd "$build" && pwd)
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(test_gpu_kernels)
out=$build/cuda_emu
mkdir -p "$out/src"
cxxflags=(-O1 -g -std=c++17 -fPIC -ffp-contract=off -Wno-unknown-pragmas -I"$here")
ldflags=()
if [ "${MOEC_EMU_SANITIZE:-0}" = 1 ]; then
  cxxflags+=(-fsanitize=address -fno-omit-frame-pointer)
  ldflags+=(-fsanitize=address)
fi
cc -std=c11 -O1 -I"$root" -I"$root/ir" -I"$root/runtime" "$here/gen_sources.c" "$build/libmoec_core.a" \
  -o "$out/gen_sources" -lm -ldl -lpthread
mods=$("$out/gen_sources" "$out/src")
g++ "${cxxflags[@]/-O1/-O2}" -shared -Wl,-soname,libcuda_emu.so "$here/emu_driver.cpp" -o "$out/libcuda_emu.so" -ldl "${ldflags[@]}"
# the GEMMs are the emulated step's heaviest part: optimised, vectorised, and linked to the
# driver for its allocation table (the same instance the runtime loads)
g++ "${cxxflags[@]/-O1/-O3}" -march=native -Wall -shared "$here/emu_cublaslt.cpp" -o "$out/libcublaslt_emu.so" \
  -L"$out" -l:libcuda_emu.so -Wl,-rpath,'$ORIGIN' -lpthread "${ldflags[@]}" &
pids=($!)
for m in $mods; do
  rm -f "$out/libemu_$m.so" # a module that fails to compile must not leave its last build behind
  g++ "${cxxflags[@]}" -Wall -Wno-unused-function -shared -x c++ "$out/src/$m.cu" -o "$out/libemu_$m.so" \
    -L"$out" -l:libcuda_emu.so -Wl,-rpath,'$ORIGIN' "${ldflags[@]}" &
  pids+=($!)
done
for p in "${pids[@]}"; do
  wait "$p" || { echo "cuda_emu: a module failed to compile (above)" >&2; kill "${pids[@]}" 2>/dev/null; exit 1; }
done
echo "cuda_emu: built $(echo $mods | wc -w) modules into $out"
env=(MOEC_LIBCUDA="$out/libcuda_emu.so" MOEC_LIBCUBLASLT="$out/libcublaslt_emu.so" MOEC_ATTENTION="${MOEC_ATTENTION:-gemm}")
if [ "${MOEC_EMU_SANITIZE:-0}" = 1 ]; then
  env+=(LD_PRELOAD="$(g++ -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0:detect_stack_use_after_return=0)
fi
cd "$root"
for t in "${tests[@]}"; do
  t0=$(date +%s)
  env "${env[@]}" "$build/$t"
  echo "cuda_emu: $t took $(($(date +%s) - t0)) s" # (CI's time goes mostly here: see scripts/test.sh)
done
