#!/usr/bin/env bash
# Packs what the GPU machine needs from a build made here into BUILD/gpu-carry: the GPU test
# binaries (and moec with --with-moec) and, in gpu-carry/gpu-libs, the shared libraries they
# need that the GPU machine's image may lack (OpenBLAS, gfortran, htslib, ...; never the C
# runtime, never CUDA's own). Carry only that folder (the whole build folder is larger than
# the device tool takes), then there:  scripts/gpu_check.sh build/gpu-carry
#   scripts/gpu_bundle.sh [BUILD_DIR] [--with-moec]      (default BUILD_DIR: build)
# About 40 MB, OpenBLAS most of it (test_gpu_step trains on the CPU too, and needs its speed).
# MOEC_BUNDLE_SMALL_BLAS=1 stands the reference BLAS (libblas.so.3, 0.5 MB, the same cblas_*
# symbols, about 9x slower) in for it, when only kernel tests are to run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=build
with_moec=0
for a in "$@"; do
  case "$a" in
  --with-moec) with_moec=1 ;;
  -h | --help) sed -n '2,10p' "$0"; exit 0 ;;
  *) build=$a ;;
  esac
done
build=$(cd "$build" 2>/dev/null && pwd) || { echo "gpu_bundle: no build folder '$build' (build first)" >&2; exit 1; }
bins=("$build"/test_gpu_* "$build"/bench_*)
[ "$with_moec" = 1 ] && bins+=("$build/moec")
for b in "${bins[@]}"; do [ -x "$b" ] || { echo "gpu_bundle: $b is missing (build first)" >&2; exit 1; }; done
carry=$build/gpu-carry
out=$carry/gpu-libs
rm -rf "$carry"
mkdir -p "$out"
cp "${bins[@]}" "$carry/"
small_blas=/usr/lib/x86_64-linux-gnu/blas/libblas.so.3
declare -A seen=()
for b in "${bins[@]}"; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue # the vdso and the dynamic loader itself
    case "$name" in
    linux-vdso* | ld-linux* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libgcc_s.so.*) continue ;;
    libcuda.so* | libnvrtc* | libcublas* | libcudart* | libcudnn* | libnccl*) continue ;;
    esac
    [ -n "${seen[$name]:-}" ] && continue
    seen[$name]=1
    if [ "$path" = "not" ]; then echo "gpu_bundle: $b needs $name, which is not installed here" >&2; exit 1; fi
    if [ "$name" = libopenblas.so.0 ] && [ "${MOEC_BUNDLE_SMALL_BLAS:-0}" = 1 ] && [ -e "$small_blas" ]; then
      cp -L "$small_blas" "$out/$name"
      echo "  $name <- $small_blas (reference BLAS stand-in)"
    else
      cp -L "$path" "$out/$name"
      echo "  $name <- $path"
    fi
  done < <(ldd "$b")
done
# OpenBLAS's own dependencies (gfortran, quadmath) are not needed by the stand-in (grep reads
# all of ldd's output: grep -q could leave early, ldd die of SIGPIPE, and pipefail drop them)
if [ -e "$out/libopenblas.so.0" ] && ! ldd "$out/libopenblas.so.0" | grep gfortran >/dev/null; then
  rm -f "$out/libgfortran.so.5" "$out/libquadmath.so.0"
fi
echo "gpu_bundle: ${#bins[@]} binaries and $(ls "$out" | wc -l) libraries, $(du -sh "$carry" | cut -f1), in $carry"
