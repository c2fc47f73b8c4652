#!/usr/bin/env bash
# Runs every test: installs the build dependencies, builds, runs the suite with ctest and the
# GPU tests on the CPU emulator, builds the main job's Release binary and trains two steps
# with it, then builds again with AddressSanitizer + UndefinedBehaviorSanitizer and runs the
# suite again. GPU tests skip (and say so) on a machine without a GPU; the emulator runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
# each phase's wall time on stdout, so that a CI run shows where its time goes (90-minute limit)
t_start=$(date +%s) t_phase=$(date +%s)
phase() { echo "test.sh: $1 took $(($(date +%s) - t_phase)) s ($(($(date +%s) - t_start)) s in all)"; t_phase=$(date +%s); }
bash scripts/deps.sh
phase "dependencies"
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$jobs"
phase "the build"
ctest --test-dir build --output-on-failure -j "$jobs"
phase "ctest"
# the GPU kernels, the GPU executor's training step and its data/expert parallelism (ZeRO,
# checkpoints and resumes included; ranks as threads on the one emulated GPU) against the CPU,
# without a GPU: the CPU emulator (scripts/cuda_emu: the generated kernels as host code behind
# stand-in libcuda and libcublasLt), where NVRTC is installed (it still compiles every module)
# (tiny only, 2 steps a comparison and 3 a parallel run: these two tests are most of CI's time,
# 26 and 14 minutes at 3 steps each on 2026-12-07; the real GPU runs them longer)
if ls /usr/local/cuda/lib64/libnvrtc.so* >/dev/null 2>&1 || ldconfig -p | grep -q libnvrtc; then
  MOEC="$PWD/build/moec" MOEC_TEST_RUN_TIMEOUT=900 MOEC_GPU_STEP_ONLY=tiny MOEC_GPU_STEP_STEPS=2 MOEC_GPU_PARALLEL_STEPS=3 \
    bash scripts/cuda_emu/run.sh build test_gpu_kernels test_gpu_fused test_gpu_tiles test_gpu_narrow test_gpu_step \
    test_gpu_parallel
else
  echo "cuda emulator: skipped (NVRTC is not installed)"
fi
phase "the emulated GPU tests"
# the main job's build (scripts/train_tiny.sh: Release, where -O3 raises warnings that -O2 does
# not, and -Werror makes them errors), then two of its training steps
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j "$jobs" --target moec
build-release/moec train models/tiny.moe --device cpu --steps 2 --set val_every=0 --val-batches 1 --seed 7 >/dev/null
phase "the main job's build and two steps"
if [ "${MOEC_SKIP_SANITIZE:-0}" != 1 ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMOEC_SANITIZE=ON >/dev/null
  cmake --build build-asan -j "$jobs"
  phase "the sanitizer build"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs"
  phase "ctest under the sanitizers"
fi
echo "moec: all tests passed"
