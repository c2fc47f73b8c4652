/* emu_cuda.h -- lets the generated kernel sources (codegen/, emitted with emu = 1) compile as
 * host C++ for the CPU emulator: CUDA's keywords become plain C++, the thread indices are
 * globals the emulator's scheduler sets before it resumes a thread, and barriers, shuffles
 * and match_any / ballot call into the scheduler (emu_driver.cpp). Blocks run one at a time, so
 * __shared__ arrays are function-local statics and atomics are plain read-modify-writes
 * (threads switch only at barriers). Development tool only: never built by CMake. */
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#define MOEC_EMU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__

struct emu_uint3 {
  unsigned x, y, z;
};
extern "C" {
extern emu_uint3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;
void emu_syncthreads(void);
void emu_warp_exchange(uint64_t mine, uint64_t *all); /* all[32] = every lane's value */
}
#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim
#define __syncthreads() emu_syncthreads()

using std::cos;
using std::exp;
using std::fabs;
using std::log;
using std::pow;
using std::sin;
using std::sqrt;

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __expf(float x) { return expf(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __logf(float x) { return logf(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }

template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  (void)mask;
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  uint64_t mine = 0, all[32];
  std::memcpy(&mine, &v, sizeof v);
  emu_warp_exchange(mine, all);
  T r;
  std::memcpy(&r, &all[(threadIdx.x & 31) ^ (unsigned)lane_mask], sizeof r);
  return r;
}

inline unsigned __match_any_sync(unsigned mask, int v) {
  (void)mask;
  uint64_t all[32];
  emu_warp_exchange((uint64_t)(uint32_t)v, all);
  unsigned m = 0;
  for (int l = 0; l < 32; l++)
    if ((uint32_t)all[l] == (uint32_t)v) m |= 1u << l;
  return m;
}

inline unsigned __ballot_sync(unsigned mask, int pred) {
  (void)mask;
  uint64_t all[32];
  emu_warp_exchange((uint64_t)(pred != 0), all);
  unsigned m = 0;
  for (int l = 0; l < 32; l++)
    if (all[l]) m |= 1u << l;
  return m;
}
inline int __ffs(int x) { return __builtin_ffs(x); }

inline int atomicAdd(int *p, int v) { int o = *p; *p = o + v; return o; }
inline int atomicCAS(int *p, int cmp, int v) { int o = *p; if (o == cmp) *p = v; return o; }

/* The trampoline of a kernel written without the generator's (runtime sources of their own,
 * gen_sources.c): emu_call(kernel, args) unpacks cuLaunchKernel's argument array. */
template <class... P, size_t... I> inline void emu_call_(void (*f)(P...), void **a, std::index_sequence<I...>) {
  f(*(P *)a[I]...);
}
template <class... P> inline void emu_call(void (*f)(P...), void **a) { emu_call_(f, a, std::index_sequence_for<P...>{}); }
