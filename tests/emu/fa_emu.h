/* fa_emu.h -- runs the flash-attention kernels of runtime/gpu_flash.c on the CPU, for CI
 * machines with no GPU (tests/unit/test_gpu_flash_emu.c compiles it with the kernel body).
 *
 * It replaces the source's device prelude (inline PTX) with a software warp: every CUDA
 * thread is a ucontext fiber, the fibers of one block run interleaved in a random order, and
 * each warp-collective instruction (ldmatrix, mma.sync m16n8k16, shfl) is a warp barrier where
 * the 32 lanes deposit their operands and each computes its own result by the PTX ISA's
 * fragment layouts. __syncthreads is a block barrier. cp.async copies either land at once or
 * only at the cp.async.wait_group that covers them (FA_EMU_DELAY=1), the two extremes a real
 * GPU may show; shared memory starts as NaN bytes, so a read of a tile that was never loaded
 * shows up in the results. Blocks run one after another. */
#ifndef FA_EMU_H
#define FA_EMU_H

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;
struct bf16 {
  u16 bits;
};

struct emu_dim3 {
  unsigned x, y, z;
};

struct emu_copy {
  void *dst;
  const void *src;
  int bytes, group;
};

struct emu_thread {
  ucontext_t ctx;
  emu_dim3 tid;
  int done;
  int groups; /* cp.async groups committed */
  std::vector<emu_copy> pending;
  std::vector<char> stack;
};

struct emu_warp {
  int count, gen;
  const void *ptr[32];
  u32 a[32][4], b[32][2];
  float f[32];
};

static emu_thread *emu_cur;
static ucontext_t emu_sched;
static emu_dim3 emu_block_idx, emu_block_dim;
static std::vector<unsigned char> emu_smem_buf;
static std::vector<emu_warp> emu_warps;
static int emu_bcount, emu_bgen, emu_nthreads;
static long emu_progress;
static int emu_delay; /* cp.async lands at wait_group */
static std::function<void()> emu_body;

#define threadIdx (emu_cur->tid)
#define blockIdx emu_block_idx
#define blockDim emu_block_dim
#define __device__
#define __global__
#define __forceinline__ inline
#define FA_KERNEL(threads, minb) extern "C" void

static inline float __uint_as_float(u32 u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline u32 __float_as_uint(float f) {
  u32 u;
  memcpy(&u, &f, 4);
  return u;
}

static void emu_yield() { swapcontext(&emu_cur->ctx, &emu_sched); }

static void emu_warp_barrier() {
  emu_warp *W = &emu_warps[emu_cur->tid.x / 32];
  int gen = W->gen;
  emu_progress++;
  if (++W->count == 32) {
    W->count = 0;
    W->gen++;
  } else {
    while (W->gen == gen) emu_yield();
  }
}

static inline unsigned char *fa_smem() { return emu_smem_buf.data(); }
static inline void fa_sync() {
  int gen = emu_bgen;
  emu_progress++;
  if (++emu_bcount == emu_nthreads) {
    emu_bcount = 0;
    emu_bgen++;
  } else {
    while (emu_bgen == gen) emu_yield();
  }
}
static inline int emu_lane() { return (int)(emu_cur->tid.x & 31); }
static inline float fa_shfl_xor(float v, int m) {
  emu_warp *W = &emu_warps[emu_cur->tid.x / 32];
  int l = emu_lane();
  W->f[l] = v;
  emu_warp_barrier();
  float r = W->f[l ^ m];
  emu_warp_barrier();
  return r;
}
static inline u16 emu_ld16(const void *row, int col) {
  u16 x;
  memcpy(&x, (const char *)row + 2 * col, 2);
  return x;
}
static inline void emu_ldsm(u32 (&r)[4], const void *p, int trans) {
  emu_warp *W = &emu_warps[emu_cur->tid.x / 32];
  int l = emu_lane();
  W->ptr[l] = p;
  emu_warp_barrier();
  for (int i = 0; i < 4; i++) {
    u16 lo, hi;
    if (!trans) { /* row l/4, columns 2(l%4), +1 */
      const void *row = W->ptr[8 * i + l / 4];
      lo = emu_ld16(row, 2 * (l % 4));
      hi = emu_ld16(row, 2 * (l % 4) + 1);
    } else { /* column l/4, rows 2(l%4), +1 */
      lo = emu_ld16(W->ptr[8 * i + 2 * (l % 4)], l / 4);
      hi = emu_ld16(W->ptr[8 * i + 2 * (l % 4) + 1], l / 4);
    }
    r[i] = (u32)lo | ((u32)hi << 16);
  }
  emu_warp_barrier();
}
static inline void fa_ldsm4(u32 (&r)[4], const void *p) { emu_ldsm(r, p, 0); }
static inline void fa_ldsm4t(u32 (&r)[4], const void *p) { emu_ldsm(r, p, 1); }
static inline float emu_bf(u32 reg, int hi) { return __uint_as_float((hi ? reg >> 16 : reg & 0xffffu) << 16); }
static inline void fa_mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  emu_warp *W = &emu_warps[emu_cur->tid.x / 32];
  int l = emu_lane();
  for (int i = 0; i < 4; i++) W->a[l][i] = a[i];
  W->b[l][0] = b0;
  W->b[l][1] = b1;
  emu_warp_barrier();
  float A[16][16], B[16][8];
  for (int L = 0; L < 32; L++) {
    int g = L / 4, t = L % 4;
    for (int e = 0; e < 2; e++) {
      A[g][2 * t + e] = emu_bf(W->a[L][0], e);
      A[g + 8][2 * t + e] = emu_bf(W->a[L][1], e);
      A[g][2 * t + 8 + e] = emu_bf(W->a[L][2], e);
      A[g + 8][2 * t + 8 + e] = emu_bf(W->a[L][3], e);
      B[2 * t + e][g] = emu_bf(W->b[L][0], e);
      B[2 * t + 8 + e][g] = emu_bf(W->b[L][1], e);
    }
  }
  int g = l / 4, t = l % 4;
  for (int e = 0; e < 4; e++) {
    int row = g + (e >> 1) * 8, col = 2 * t + (e & 1);
    float s = c[e];
    for (int kk = 0; kk < 16; kk++) s += A[row][kk] * B[kk][col];
    c[e] = s;
  }
  emu_warp_barrier();
}
static inline void emu_do_copy(const emu_copy &c) {
  memcpy(c.dst, c.src, (size_t)c.bytes);
  memset((char *)c.dst + c.bytes, 0, (size_t)(16 - c.bytes));
}
static inline void fa_cp16(void *dst, const void *src, int bytes) {
  emu_copy c = {dst, src, bytes, emu_cur->groups};
  if (emu_delay) emu_cur->pending.push_back(c);
  else emu_do_copy(c);
}
static inline void fa_commit() { emu_cur->groups++; }
template <int N> static inline void fa_wait() {
  std::vector<emu_copy> keep;
  for (const emu_copy &c : emu_cur->pending) {
    if (c.group < emu_cur->groups - N) emu_do_copy(c);
    else keep.push_back(c);
  }
  emu_cur->pending.swap(keep);
  emu_yield(); /* let the other threads run on */
}
static inline float fa_ex2(float x) { return exp2f(x); }
static inline float fa_lg2(float x) { return log2f(x); }
static inline float fa_fma(float a, float b, float c) { return fmaf(a, b, c); }
static inline u16 emu_f2bf(float v) {
  u32 u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}
static inline u32 fa_pack(float lo, float hi) { return (u32)emu_f2bf(lo) | ((u32)emu_f2bf(hi) << 16); }
static inline void fa_red2(float *p, float a, float b) {
  p[0] += a;
  p[1] += b;
}
static inline float fa_bf2f(u16 b) { return __uint_as_float((u32)b << 16); }

static void emu_entry() {
  emu_body();
  emu_cur->done = 1;
}

/* Runs body() as a kernel of grid x block threads with smem bytes of dynamic shared memory. */
static void emu_launch(emu_dim3 grid, unsigned threads, size_t smem, std::function<void()> body, unsigned seed) {
  std::mt19937 rng(seed);
  emu_body = body;
  emu_block_dim = {threads, 1, 1};
  std::vector<emu_thread> th(threads);
  for (auto &t : th) t.stack.resize(256 * 1024);
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        emu_block_idx = {bx, by, bz};
        emu_smem_buf.assign(smem + 16, 0xff);
        emu_warps.assign((threads + 31) / 32, emu_warp());
        for (auto &w : emu_warps) w.count = w.gen = 0;
        emu_bcount = emu_bgen = 0;
        emu_nthreads = (int)threads;
        std::vector<int> order(threads);
        for (unsigned i = 0; i < threads; i++) {
          emu_thread &t = th[i];
          t.tid = {i, 0, 0};
          t.done = 0;
          t.groups = 0;
          t.pending.clear();
          getcontext(&t.ctx);
          t.ctx.uc_stack.ss_sp = t.stack.data();
          t.ctx.uc_stack.ss_size = t.stack.size();
          t.ctx.uc_link = &emu_sched;
          makecontext(&t.ctx, emu_entry, 0);
          order[i] = (int)i;
        }
        /* Warps run at different, changing speeds (a warp sits out a pass with probability
         * skip[w]), so that one warp can run far ahead of another, as on a GPU. */
        std::vector<double> skip(emu_warps.size());
        std::uniform_real_distribution<double> unit(0.0, 1.0);
        unsigned left = threads;
        long idle = 0, pass = 0;
        while (left) {
          if (pass++ % 64 == 0)
            for (auto &p : skip) p = 0.97 * unit(rng);
          std::shuffle(order.begin(), order.end(), rng);
          std::vector<char> sits(emu_warps.size());
          for (size_t w = 0; w < sits.size(); w++) sits[w] = unit(rng) < skip[w];
          long before = emu_progress;
          unsigned done_before = left;
          for (int i : order) {
            if (th[i].done || sits[(size_t)i / 32]) continue;
            emu_cur = &th[i];
            swapcontext(&emu_sched, &th[i].ctx);
            if (th[i].done) left--;
          }
          if (emu_progress == before && left == done_before) {
            if (++idle > 100000) {
              fprintf(stderr, "emu: deadlock in block (%u,%u,%u)\n", bx, by, bz);
              exit(2);
            }
          } else {
            idle = 0;
          }
        }
        for (auto &t : th)
          if (!t.pending.empty()) {
            fprintf(stderr, "emu: cp.async copies never waited for\n");
            exit(2);
          }
      }
}

#endif
