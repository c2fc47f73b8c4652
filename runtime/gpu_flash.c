/* gpu_flash.c -- fused attention kernels (gpu_flash.h): the NVRTC source, its variants, the
 * launches, and the logsumexp cache between a forward and its backward.
 *
 * The source is self-contained CUDA C++: its own bf16 struct, and every tensor-core, ldmatrix
 * and cp.async instruction as inline PTX (NVRTC has no mma.h and moec passes no include
 * path). The prelude holds those primitives; the body, the kernels, is written against them
 * only, so tests/emu can run the same body on a CPU behind a software prelude.
 *
 * Tiles in shared memory are rows of 16-byte chunks, chunk c of row r stored at c ^ (r & 7)
 * (an XOR swizzle; fa_sw in the body): the eight row addresses of an ldmatrix hit eight
 * different bank groups.
 *
 * tests/unit/test_gpu_flash_compile.c compiles the module for sm_80/sm_90/sm_90a,
 * tests/unit/test_gpu_flash_emu.c runs the body on the CPU (tests/emu), and
 * tests/unit/test_gpu_attention.c checks and times it on a GPU. */
#include "gpu_flash.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_nvrtc.h"
#include "gpu_rowstats.h"

/* The two literals below are the kernel source. */
/* BEGIN prelude */
static const char prelude[] =
    "// ---- device primitives: inline PTX, no CUDA headers ----\n"
    "typedef unsigned int u32;\n"
    "typedef unsigned short u16;\n"
    "typedef long long i64;\n"
    "#define INFINITY __int_as_float(0x7f800000)\n"
    "struct bf16 { u16 bits; };\n"
    "extern __shared__ __attribute__((aligned(128))) unsigned char fa_smem_[];\n"
    "__device__ __forceinline__ unsigned char *fa_smem() { return fa_smem_; }\n"
    "__device__ __forceinline__ u32 fa_saddr(const void *p) {\n"
    "  u32 r;\n"
    "  asm(\"{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\" : \"=r\"(r) : \"l\"(p));\n"
    "  return r;\n"
    "}\n"
    "__device__ __forceinline__ void fa_sync() { __syncthreads(); }\n"
    "__device__ __forceinline__ float fa_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }\n"
    "// four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i\n"
    "__device__ __forceinline__ void fa_ldsm4(u32 (&r)[4], const void *p) {\n"
    "  asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\\n\"\n"
    "               : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(fa_saddr(p)));\n"
    "}\n"
    "__device__ __forceinline__ void fa_ldsm4t(u32 (&r)[4], const void *p) {\n"
    "  asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\\n\"\n"
    "               : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(fa_saddr(p)));\n"
    "}\n"
    "// c (16x8 f32) += a (16x16 bf16, row) * b (16x8 bf16, col)\n"
    "__device__ __forceinline__ void fa_mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {\n"
    "  asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\\n\"\n"
    "               : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3])\n"
    "               : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b0), \"r\"(b1));\n"
    "}\n"
    "// 16 bytes global -> shared, asynchronously; bytes < 16 zero-fill the rest (0: nothing is read)\n"
    "__device__ __forceinline__ void fa_cp16(void *dst, const void *src, int bytes) {\n"
    "  asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\\n\" ::\"r\"(fa_saddr(dst)), \"l\"(src), \"r\"(bytes) : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void fa_commit() { asm volatile(\"cp.async.commit_group;\\n\" ::: \"memory\"); }\n"
    "template <int N> __device__ __forceinline__ void fa_wait() { asm volatile(\"cp.async.wait_group %0;\\n\" ::\"n\"(N) : \"memory\"); }\n"
    "__device__ __forceinline__ float fa_ex2(float x) {\n"
    "  float y;\n"
    "  asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x));\n"
    "  return y;\n"
    "}\n"
    "__device__ __forceinline__ float fa_lg2(float x) {\n"
    "  float y;\n"
    "  asm(\"lg2.approx.ftz.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x));\n"
    "  return y;\n"
    "}\n"
    "__device__ __forceinline__ float fa_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }\n"
    "// two floats to bf16 (round to nearest even), lo in bits 0..15\n"
    "__device__ __forceinline__ u32 fa_pack(float lo, float hi) {\n"
    "  u32 r;\n"
    "  asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(r) : \"f\"(hi), \"f\"(lo));\n"
    "  return r;\n"
    "}\n"
    "// p[0] += a, p[1] += b (p 8-byte aligned), no return value\n"
    "__device__ __forceinline__ void fa_red2(float *p, float a, float b) {\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "  asm volatile(\"red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\\n\" ::\"l\"(p), \"f\"(a), \"f\"(b) : \"memory\");\n"
    "#else\n"
    "  asm volatile(\"red.relaxed.gpu.global.add.f32 [%0], %1;\\n\" ::\"l\"(p), \"f\"(a) : \"memory\");\n"
    "  asm volatile(\"red.relaxed.gpu.global.add.f32 [%0], %1;\\n\" ::\"l\"(p + 1), \"f\"(b) : \"memory\");\n"
    "#endif\n"
    "}\n"
    "__device__ __forceinline__ float fa_bf2f(u16 b) { return __uint_as_float((u32)b << 16); }\n"
    "#define FA_KERNEL(threads, minb) extern \"C\" __global__ void __launch_bounds__(threads, minb)\n";
/* END prelude */

/* BEGIN body */
static const char body[] =
    "// ---- tiles in shared memory ----\n"
    "// A tile is rows of CPR 16-byte chunks (8 bf16 each; CPR a power of two). Chunk c of row r\n"
    "// is stored at chunk c ^ (r & 7), or for short rows (8 / CPR rows to a 128-byte line)\n"
    "// c ^ ((r / (8 / CPR)) & (CPR - 1)), so that the 8 row addresses of one ldmatrix (same\n"
    "// chunk, consecutive rows) fall in 8 different 16-byte bank groups.\n"
    "template <int CPR> __device__ __forceinline__ int fa_sw(int r, int c) {\n"
    "  return r * CPR + (CPR >= 8 ? (c ^ (r & 7)) : (c ^ ((r / (8 / CPR)) & (CPR - 1))));\n"
    "}\n"
    "// rows [0, R) x D of a tile from g (row stride ld), by cp.async; rows >= valid are zero\n"
    "template <int R, int D, int NT> __device__ __forceinline__ void fa_load(bf16 *s, const bf16 *g, i64 ld, int valid) {\n"
    "  constexpr int CPR = D / 8, N = R * CPR / NT;\n"
    "  static_assert(R * CPR % NT == 0, \"tile size\");\n"
    "#pragma unroll\n"
    "  for (int i = 0; i < N; i++) {\n"
    "    const int c = (int)threadIdx.x + i * NT, r = c / CPR, ch = c % CPR;\n"
    "    const bool ok = r < valid;\n"
    "    fa_cp16(s + fa_sw<CPR>(r, ch) * 8, ok ? g + (i64)r * ld + ch * 8 : g, ok ? 16 : 0);\n"
    "  }\n"
    "}\n"
    "template <int N, int NT> __device__ __forceinline__ void fa_load_f(float *s, const float *g) {\n"
    "  for (int c = (int)threadIdx.x; c < N / 4; c += NT) fa_cp16(s + c * 4, g + c * 4, 16);\n"
    "}\n"
    "\n"
    "// ---- forward ----\n"
    "// One block of NW warps per (sequence, query head, 16 NW query rows); warp w owns rows\n"
    "// 16w..16w+15 and keeps their Q fragments in registers. K and V tiles of BN keys stream\n"
    "// through a two-stage cp.async pipeline. Online softmax: the running row max m is kept in\n"
    "// raw scores (q.k), and P = 2^(s sl2 - m sl2), sl2 = log2(e) / sqrt(hd), one FFMA and one\n"
    "// ex2 an element; P goes to bf16 in registers and straight into the P V MMA. The row\n"
    "// logsumexp is written for the backward in base 2 of the scaled scores,\n"
    "// lse2 = log2 sum_j 2^(s_j sl2) (= lse / ln 2), rows padded to Sp.\n"
    "template <int D, int NW, int BN>\n"
    "__device__ __forceinline__ void fa_fwd(const bf16 *__restrict__ q, const bf16 *__restrict__ k,\n"
    "                                       const bf16 *__restrict__ v, bf16 *__restrict__ o, float *__restrict__ lse,\n"
    "                                       int S, int Sp, int nh, int nkv, int causal, float sl2) {\n"
    "  constexpr int BQ = 16 * NW, NT = 32 * NW, CPR = D / 8;\n"
    "  bf16 *sQ = (bf16 *)fa_smem(), *sK = sQ + BQ * D, *sV = sK + 2 * BN * D;\n"
    "  const int nqt = (S + BQ - 1) / BQ;\n"
    "  const int h = (int)blockIdx.x % nh, b = (int)blockIdx.x / nh;\n"
    "  const int qt = causal ? nqt - 1 - (int)blockIdx.y : (int)blockIdx.y; /* heaviest tiles first */\n"
    "  const int kvh = h / (nh / nkv), q0 = qt * BQ;\n"
    "  const i64 ldq = (i64)nh * D, ldk = (i64)nkv * D;\n"
    "  const bf16 *K = k + (i64)b * S * ldk + kvh * D, *V = v + (i64)b * S * ldk + kvh * D;\n"
    "  const int kend = causal && q0 + BQ < S ? q0 + BQ : S;\n"
    "  const int nkt = (kend + BN - 1) / BN;\n"
    "  fa_load<BQ, D, NT>(sQ, q + ((i64)b * S + q0) * ldq + h * D, ldq, S - q0);\n"
    "  fa_load<BN, D, NT>(sK, K, ldk, S);\n"
    "  fa_load<BN, D, NT>(sV, V, ldk, S);\n"
    "  fa_commit();\n"
    "  const int lane = (int)threadIdx.x & 31, w = (int)threadIdx.x >> 5, g = lane >> 2, t = lane & 3;\n"
    "  const int mi = lane >> 3, lr = lane & 7;\n"
    "  const int r0 = q0 + w * 16 + g; /* this thread's rows: r0, r0 + 8 */\n"
    "  u32 qf[D / 16][4];\n"
    "  float acc[D / 8][4];\n"
    "#pragma unroll\n"
    "  for (int i = 0; i < D / 8; i++)\n"
    "#pragma unroll\n"
    "    for (int e = 0; e < 4; e++) acc[i][e] = 0.f;\n"
    "  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};\n"
    "  for (int j = 0; j < nkt; j++) {\n"
    "    const int st = j & 1;\n"
    "    if (j + 1 < nkt) {\n"
    "      const i64 off = (i64)(j + 1) * BN * ldk;\n"
    "      fa_load<BN, D, NT>(sK + (st ^ 1) * BN * D, K + off, ldk, S - (j + 1) * BN);\n"
    "      fa_load<BN, D, NT>(sV + (st ^ 1) * BN * D, V + off, ldk, S - (j + 1) * BN);\n"
    "      fa_commit();\n"
    "      fa_wait<1>();\n"
    "    } else {\n"
    "      fa_wait<0>();\n"
    "    }\n"
    "    fa_sync();\n"
    "    if (j == 0) {\n"
    "#pragma unroll\n"
    "      for (int kk = 0; kk < D / 16; kk++) fa_ldsm4(qf[kk], sQ + fa_sw<CPR>(w * 16 + (mi & 1) * 8 + lr, 2 * kk + (mi >> 1)) * 8);\n"
    "    }\n"
    "    const bf16 *tK = sK + st * BN * D, *tV = sV + st * BN * D;\n"
    "    float s[BN / 8][4];\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < BN / 8; i++)\n"
    "#pragma unroll\n"
    "      for (int e = 0; e < 4; e++) s[i][e] = 0.f;\n"
    "#pragma unroll\n"
    "    for (int kk = 0; kk < D / 16; kk++) {\n"
    "#pragma unroll\n"
    "      for (int np = 0; np < BN / 16; np++) {\n"
    "        u32 kb[4];\n"
    "        fa_ldsm4(kb, tK + fa_sw<CPR>(np * 16 + (mi >> 1) * 8 + lr, 2 * kk + (mi & 1)) * 8);\n"
    "        fa_mma(s[2 * np], qf[kk], kb[0], kb[1]);\n"
    "        fa_mma(s[2 * np + 1], qf[kk], kb[2], kb[3]);\n"
    "      }\n"
    "    }\n"
    "    const int k0 = j * BN;\n"
    "    const bool mask = k0 + BN > S || (causal && k0 + BN - 1 > q0 + w * 16);\n"
    "    if (mask) {\n"
    "#pragma unroll\n"
    "      for (int nt = 0; nt < BN / 8; nt++)\n"
    "#pragma unroll\n"
    "        for (int e = 0; e < 4; e++) {\n"
    "          const int c = k0 + nt * 8 + 2 * t + (e & 1), r = r0 + (e >> 1) * 8;\n"
    "          if (c >= S || (causal && c > r)) s[nt][e] = -INFINITY;\n"
    "        }\n"
    "    }\n"
    "    float mx[2] = {m[0], m[1]};\n"
    "#pragma unroll\n"
    "    for (int nt = 0; nt < BN / 8; nt++)\n"
    "#pragma unroll\n"
    "      for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);\n"
    "    float alpha[2], nmu[2];\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 2; i++) {\n"
    "      mx[i] = fmaxf(mx[i], fa_shfl_xor(mx[i], 1));\n"
    "      mx[i] = fmaxf(mx[i], fa_shfl_xor(mx[i], 2));\n"
    "      nmu[i] = mx[i] == -INFINITY ? 0.f : -mx[i] * sl2; /* a row with nothing visible yet: P = 0 */\n"
    "      alpha[i] = fa_ex2(fa_fma(m[i], sl2, nmu[i]));\n"
    "      m[i] = mx[i];\n"
    "      l[i] *= alpha[i];\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int nt = 0; nt < BN / 8; nt++)\n"
    "#pragma unroll\n"
    "      for (int e = 0; e < 4; e++) {\n"
    "        const float p = fa_ex2(fa_fma(s[nt][e], sl2, nmu[e >> 1]));\n"
    "        s[nt][e] = p;\n"
    "        l[e >> 1] += p;\n"
    "      }\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < D / 8; i++)\n"
    "#pragma unroll\n"
    "      for (int e = 0; e < 4; e++) acc[i][e] *= alpha[e >> 1];\n"
    "#pragma unroll\n"
    "    for (int kk = 0; kk < BN / 16; kk++) {\n"
    "      const u32 pa[4] = {fa_pack(s[2 * kk][0], s[2 * kk][1]), fa_pack(s[2 * kk][2], s[2 * kk][3]),\n"
    "                         fa_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), fa_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};\n"
    "#pragma unroll\n"
    "      for (int dp = 0; dp < D / 16; dp++) {\n"
    "        u32 vb[4];\n"
    "        fa_ldsm4t(vb, tV + fa_sw<CPR>(kk * 16 + (mi & 1) * 8 + lr, 2 * dp + (mi >> 1)) * 8);\n"
    "        fa_mma(acc[2 * dp], pa, vb[0], vb[1]);\n"
    "        fa_mma(acc[2 * dp + 1], pa, vb[2], vb[3]);\n"
    "      }\n"
    "    }\n"
    "    fa_sync();\n"
    "  }\n"
    "  bf16 *O = o + (i64)b * S * ldq + h * D;\n"
    "#pragma unroll\n"
    "  for (int i = 0; i < 2; i++) {\n"
    "    l[i] += fa_shfl_xor(l[i], 1);\n"
    "    l[i] += fa_shfl_xor(l[i], 2);\n"
    "    const int r = r0 + 8 * i;\n"
    "    if (r < S) {\n"
    "      const float inv = 1.0f / l[i];\n"
    "      u32 *orow = (u32 *)(O + (i64)r * ldq);\n"
    "#pragma unroll\n"
    "      for (int dt = 0; dt < D / 8; dt++) orow[dt * 4 + t] = fa_pack(acc[dt][2 * i] * inv, acc[dt][2 * i + 1] * inv);\n"
    "      if (t == 0) lse[((i64)b * nh + h) * Sp + r] = fa_fma(m[i], sl2, fa_lg2(l[i]));\n"
    "    }\n"
    "  }\n"
    "}\n"
    "\n"
    "// ---- backward ----\n"
    "// Dd[b, h, q] = sum_c dO[q, h, c] O[q, h, c]; one warp per (b, h, q) row, q < Sp. Rows\n"
    "// q >= S get Dd = 0 and lse = 0 (the padding the main kernel reads, masked there).\n"
    "template <int D>\n"
    "__device__ __forceinline__ void fa_bwd_pre(const bf16 *__restrict__ o, const bf16 *__restrict__ dout,\n"
    "                                           float *__restrict__ Dd, float *__restrict__ lse, int S, int Sp, int nh,\n"
    "                                           i64 rows) {\n"
    "  const i64 row = (i64)blockIdx.x * 8 + ((int)threadIdx.x >> 5);\n"
    "  if (row >= rows) return;\n"
    "  const int lane = (int)threadIdx.x & 31;\n"
    "  const i64 bh = row / Sp;\n"
    "  const int qi = (int)(row % Sp), h = (int)(bh % nh);\n"
    "  const i64 b = bh / nh;\n"
    "  float acc = 0.f;\n"
    "  if (qi < S) {\n"
    "    const i64 off = (b * S + qi) * nh * D + (i64)h * D;\n"
    "    const u32 *po = (const u32 *)(o + off), *pd = (const u32 *)(dout + off);\n"
    "#pragma unroll\n"
    "    for (int c = lane; c < D / 2; c += 32) {\n"
    "      const u32 a = po[c], d = pd[c];\n"
    "      acc = fa_fma(fa_bf2f((u16)(a & 0xffffu)), fa_bf2f((u16)(d & 0xffffu)), acc);\n"
    "      acc = fa_fma(fa_bf2f((u16)(a >> 16)), fa_bf2f((u16)(d >> 16)), acc);\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int m = 16; m > 0; m >>= 1) acc += fa_shfl_xor(acc, m);\n"
    "  } else if (lane == 0) {\n"
    "    lse[row] = 0.f;\n"
    "  }\n"
    "  if (lane == 0) Dd[row] = acc;\n"
    "}\n"
    "\n"
    "// One block of NW warps per (sequence, KV head, 16 NW keys); warp w owns keys 16w..16w+15 and\n"
    "// accumulates their dK and dV in registers over every query head of the group and every\n"
    "// query tile of BQ rows at or after the keys (causal). Per tile, with S^T = K Q^T:\n"
    "//   P^T = 2^(S^T sl2 - lse2),  dP^T = V dO^T,  dS^T = P^T (dP^T - Dd)\n"
    "//   dV += P^T dO,  dK += dS^T Q\n"
    "// P^T and dS^T are rounded to bf16 in registers, in the A-operand layout, straight from the\n"
    "// accumulators (dS^T from the rounded P^T). dS^T also goes to shared memory for dQ (BQ x hd)\n"
    "// += dS K, added into an f32 buffer with vector reductions (one 16-row m-tile and NPW 8-column\n"
    "// d-tiles a warp). Q, dO, lse and Dd tiles stream through a two-stage cp.async pipeline; two\n"
    "// barriers an iteration (before dQ reads dS^T; before the next tile overwrites it).\n"
    "template <int D, int NW, int BQ>\n"
    "__device__ __forceinline__ void fa_bwd(const bf16 *__restrict__ q, const bf16 *__restrict__ k,\n"
    "                                       const bf16 *__restrict__ v, const bf16 *__restrict__ dout,\n"
    "                                       const float *__restrict__ lse, const float *__restrict__ Dd,\n"
    "                                       float *__restrict__ dqa, bf16 *__restrict__ packed, int S, int Sp, int nh,\n"
    "                                       int nkv, int causal, float scale, float sl2) {\n"
    "  constexpr int BN = 16 * NW, NT = 32 * NW, CPR = D / 8, QPR = BQ / 8;\n"
    "  constexpr int MT = BQ / 16, WPM = NW / MT, NPW = (D / 8) / WPM;\n"
    "  static_assert(NW % MT == 0 && NPW % 2 == 0 && NPW >= 2, \"dQ split\");\n"
    "  bf16 *sK = (bf16 *)fa_smem(), *sV = sK + BN * D, *sQ = sV + BN * D, *sO = sQ + 2 * BQ * D, *sS = sO + 2 * BQ * D;\n"
    "  float *sL = (float *)(sS + BN * BQ), *sD = sL + 2 * BQ;\n"
    "  const int kvh = (int)blockIdx.x % nkv, b = (int)blockIdx.x / nkv, k0 = (int)blockIdx.y * BN, group = nh / nkv;\n"
    "  const i64 ldq = (i64)nh * D, ldk = (i64)nkv * D, W = (i64)(nh + 2 * nkv) * D;\n"
    "  const bf16 *Qb = q + (i64)b * S * ldq, *Ob = dout + (i64)b * S * ldq;\n"
    "  fa_load<BN, D, NT>(sK, k + ((i64)b * S + k0) * ldk + kvh * D, ldk, S - k0);\n"
    "  fa_load<BN, D, NT>(sV, v + ((i64)b * S + k0) * ldk + kvh * D, ldk, S - k0);\n"
    "  const int i0 = causal ? k0 / BQ : 0, nqt = (S + BQ - 1) / BQ, nqi = nqt - i0, total = group * nqi;\n"
    "  {\n"
    "    const int h = kvh * group;\n"
    "    const int qq = i0 * BQ;\n"
    "    fa_load<BQ, D, NT>(sQ, Qb + (i64)qq * ldq + h * D, ldq, S - qq);\n"
    "    fa_load<BQ, D, NT>(sO, Ob + (i64)qq * ldq + h * D, ldq, S - qq);\n"
    "    const i64 lo = ((i64)b * nh + h) * Sp + qq;\n"
    "    fa_load_f<BQ, NT>(sL, lse + lo);\n"
    "    fa_load_f<BQ, NT>(sD, Dd + lo);\n"
    "  }\n"
    "  fa_commit();\n"
    "  const int lane = (int)threadIdx.x & 31, w = (int)threadIdx.x >> 5, g = lane >> 2, t = lane & 3;\n"
    "  const int mi = lane >> 3, lr = lane & 7;\n"
    "  const int kr0 = k0 + w * 16 + g; /* this thread's keys: kr0, kr0 + 8 */\n"
    "  const int mt = w % MT, dn0 = (w / MT) * NPW; /* dQ: m-tile and first d-tile of this warp */\n"
    "  float dk[D / 8][4], dv[D / 8][4];\n"
    "#pragma unroll\n"
    "  for (int i = 0; i < D / 8; i++)\n"
    "#pragma unroll\n"
    "    for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0.f;\n"
    "  for (int it = 0; it < total; it++) {\n"
    "    const int st = it & 1;\n"
    "    if (it + 1 < total) {\n"
    "      const int h = kvh * group + (it + 1) / nqi, qq = (i0 + (it + 1) % nqi) * BQ;\n"
    "      fa_load<BQ, D, NT>(sQ + (st ^ 1) * BQ * D, Qb + (i64)qq * ldq + h * D, ldq, S - qq);\n"
    "      fa_load<BQ, D, NT>(sO + (st ^ 1) * BQ * D, Ob + (i64)qq * ldq + h * D, ldq, S - qq);\n"
    "      const i64 lo = ((i64)b * nh + h) * Sp + qq;\n"
    "      fa_load_f<BQ, NT>(sL + (st ^ 1) * BQ, lse + lo);\n"
    "      fa_load_f<BQ, NT>(sD + (st ^ 1) * BQ, Dd + lo);\n"
    "      fa_commit();\n"
    "      fa_wait<1>();\n"
    "    } else {\n"
    "      fa_wait<0>();\n"
    "    }\n"
    "    fa_sync();\n"
    "    const int h = kvh * group + it / nqi, q0 = (i0 + it % nqi) * BQ;\n"
    "    const bf16 *tQ = sQ + st * BQ * D, *tO = sO + st * BQ * D;\n"
    "    const float *tL = sL + st * BQ, *tD = sD + st * BQ;\n"
    "    /* S^T = K Q^T, then P^T, kept as bf16 A operands (16 keys x 16 queries each) */\n"
    "    u32 pa[BQ / 16][4];\n"
    "    {\n"
    "      float sT[BQ / 8][4];\n"
    "#pragma unroll\n"
    "      for (int i = 0; i < BQ / 8; i++)\n"
    "#pragma unroll\n"
    "        for (int e = 0; e < 4; e++) sT[i][e] = 0.f;\n"
    "#pragma unroll\n"
    "      for (int kk = 0; kk < D / 16; kk++) {\n"
    "        u32 ka[4];\n"
    "        fa_ldsm4(ka, sK + fa_sw<CPR>(w * 16 + (mi & 1) * 8 + lr, 2 * kk + (mi >> 1)) * 8);\n"
    "#pragma unroll\n"
    "        for (int np = 0; np < BQ / 16; np++) {\n"
    "          u32 qb[4];\n"
    "          fa_ldsm4(qb, tQ + fa_sw<CPR>(np * 16 + (mi >> 1) * 8 + lr, 2 * kk + (mi & 1)) * 8);\n"
    "          fa_mma(sT[2 * np], ka, qb[0], qb[1]);\n"
    "          fa_mma(sT[2 * np + 1], ka, qb[2], qb[3]);\n"
    "        }\n"
    "      }\n"
    "      const bool mask = k0 + w * 16 + 16 > S || q0 + BQ > S || (causal && k0 + w * 16 + 15 > q0);\n"
    "#pragma unroll\n"
    "      for (int nt = 0; nt < BQ / 8; nt++)\n"
    "#pragma unroll\n"
    "        for (int e = 0; e < 4; e++) {\n"
    "          const int qc = nt * 8 + 2 * t + (e & 1), kr = kr0 + (e >> 1) * 8;\n"
    "          float p = fa_ex2(fa_fma(sT[nt][e], sl2, -tL[qc]));\n"
    "          if (mask && (kr >= S || q0 + qc >= S || (causal && kr > q0 + qc))) p = 0.f;\n"
    "          sT[nt][e] = p;\n"
    "        }\n"
    "#pragma unroll\n"
    "      for (int kk = 0; kk < BQ / 16; kk++) {\n"
    "        pa[kk][0] = fa_pack(sT[2 * kk][0], sT[2 * kk][1]);\n"
    "        pa[kk][1] = fa_pack(sT[2 * kk][2], sT[2 * kk][3]);\n"
    "        pa[kk][2] = fa_pack(sT[2 * kk + 1][0], sT[2 * kk + 1][1]);\n"
    "        pa[kk][3] = fa_pack(sT[2 * kk + 1][2], sT[2 * kk + 1][3]);\n"
    "      }\n"
    "    }\n"
    "    /* dV += P^T dO */\n"
    "#pragma unroll\n"
    "    for (int kk = 0; kk < BQ / 16; kk++)\n"
    "#pragma unroll\n"
    "      for (int dpi = 0; dpi < D / 16; dpi++) {\n"
    "        u32 ob[4];\n"
    "        fa_ldsm4t(ob, tO + fa_sw<CPR>(kk * 16 + (mi & 1) * 8 + lr, 2 * dpi + (mi >> 1)) * 8);\n"
    "        fa_mma(dv[2 * dpi], pa[kk], ob[0], ob[1]);\n"
    "        fa_mma(dv[2 * dpi + 1], pa[kk], ob[2], ob[3]);\n"
    "      }\n"
    "    /* dP^T = V dO^T; dS^T = P^T (dP^T - Dd) (zero wherever P is: padded rows have dO = 0,\n"
    "       Dd = 0), as bf16 A operands and, for dQ, in shared memory */\n"
    "    u32 da[BQ / 16][4];\n"
    "    {\n"
    "      float dp[BQ / 8][4];\n"
    "#pragma unroll\n"
    "      for (int i = 0; i < BQ / 8; i++)\n"
    "#pragma unroll\n"
    "        for (int e = 0; e < 4; e++) dp[i][e] = 0.f;\n"
    "#pragma unroll\n"
    "      for (int kk = 0; kk < D / 16; kk++) {\n"
    "        u32 va[4];\n"
    "        fa_ldsm4(va, sV + fa_sw<CPR>(w * 16 + (mi & 1) * 8 + lr, 2 * kk + (mi >> 1)) * 8);\n"
    "#pragma unroll\n"
    "        for (int np = 0; np < BQ / 16; np++) {\n"
    "          u32 ob[4];\n"
    "          fa_ldsm4(ob, tO + fa_sw<CPR>(np * 16 + (mi >> 1) * 8 + lr, 2 * kk + (mi & 1)) * 8);\n"
    "          fa_mma(dp[2 * np], va, ob[0], ob[1]);\n"
    "          fa_mma(dp[2 * np + 1], va, ob[2], ob[3]);\n"
    "        }\n"
    "      }\n"
    "#pragma unroll\n"
    "      for (int nt = 0; nt < BQ / 8; nt++)\n"
    "#pragma unroll\n"
    "        for (int e = 0; e < 4; e++) {\n"
    "          const u32 pr = pa[nt >> 1][(nt & 1) * 2 + (e >> 1)];\n"
    "          const float p = fa_bf2f((u16)(e & 1 ? pr >> 16 : pr & 0xffffu));\n"
    "          dp[nt][e] = p * (dp[nt][e] - tD[nt * 8 + 2 * t + (e & 1)]);\n"
    "        }\n"
    "#pragma unroll\n"
    "      for (int kk = 0; kk < BQ / 16; kk++) {\n"
    "        da[kk][0] = fa_pack(dp[2 * kk][0], dp[2 * kk][1]);\n"
    "        da[kk][1] = fa_pack(dp[2 * kk][2], dp[2 * kk][3]);\n"
    "        da[kk][2] = fa_pack(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);\n"
    "        da[kk][3] = fa_pack(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);\n"
    "        /* rows w*16 + g (+8), columns 16kk + 2t (+8) */\n"
    "        *((u32 *)(sS + fa_sw<QPR>(w * 16 + g, 2 * kk) * 8) + t) = da[kk][0];\n"
    "        *((u32 *)(sS + fa_sw<QPR>(w * 16 + g + 8, 2 * kk) * 8) + t) = da[kk][1];\n"
    "        *((u32 *)(sS + fa_sw<QPR>(w * 16 + g, 2 * kk + 1) * 8) + t) = da[kk][2];\n"
    "        *((u32 *)(sS + fa_sw<QPR>(w * 16 + g + 8, 2 * kk + 1) * 8) + t) = da[kk][3];\n"
    "      }\n"
    "    }\n"
    "    /* dK += dS^T Q */\n"
    "#pragma unroll\n"
    "    for (int kk = 0; kk < BQ / 16; kk++)\n"
    "#pragma unroll\n"
    "      for (int dpi = 0; dpi < D / 16; dpi++) {\n"
    "        u32 qb[4];\n"
    "        fa_ldsm4t(qb, tQ + fa_sw<CPR>(kk * 16 + (mi & 1) * 8 + lr, 2 * dpi + (mi >> 1)) * 8);\n"
    "        fa_mma(dk[2 * dpi], da[kk], qb[0], qb[1]);\n"
    "        fa_mma(dk[2 * dpi + 1], da[kk], qb[2], qb[3]);\n"
    "      }\n"
    "    fa_sync();\n"
    "    /* dQ rows q0 + 16mt.., d-tiles dn0 .. dn0 + NPW - 1 */\n"
    "    float dq[NPW][4];\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < NPW; i++)\n"
    "#pragma unroll\n"
    "      for (int e = 0; e < 4; e++) dq[i][e] = 0.f;\n"
    "#pragma unroll\n"
    "    for (int kk = 0; kk < BN / 16; kk++) {\n"
    "      u32 sa[4];\n"
    "      fa_ldsm4t(sa, sS + fa_sw<QPR>(kk * 16 + (mi >> 1) * 8 + lr, 2 * mt + (mi & 1)) * 8);\n"
    "#pragma unroll\n"
    "      for (int j = 0; j < NPW / 2; j++) {\n"
    "        u32 kb[4];\n"
    "        fa_ldsm4t(kb, sK + fa_sw<CPR>(kk * 16 + (mi & 1) * 8 + lr, dn0 + 2 * j + (mi >> 1)) * 8);\n"
    "        fa_mma(dq[2 * j], sa, kb[0], kb[1]);\n"
    "        fa_mma(dq[2 * j + 1], sa, kb[2], kb[3]);\n"
    "      }\n"
    "    }\n"
    "    float *dQ = dqa + (i64)b * S * ldq + h * D;\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 2; i++) {\n"
    "      const int r = q0 + mt * 16 + g + 8 * i;\n"
    "      if (r < S) {\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NPW; j++) fa_red2(dQ + (i64)r * ldq + (dn0 + j) * 8 + 2 * t, dq[j][2 * i], dq[j][2 * i + 1]);\n"
    "      }\n"
    "    }\n"
    "  }\n"
    "#pragma unroll\n"
    "  for (int i = 0; i < 2; i++) {\n"
    "    const int kr = kr0 + 8 * i;\n"
    "    if (kr < S) {\n"
    "      u32 *dkrow = (u32 *)(packed + ((i64)b * S + kr) * W + (i64)nh * D + kvh * D);\n"
    "      u32 *dvrow = dkrow + nkv * D / 2;\n"
    "#pragma unroll\n"
    "      for (int dt = 0; dt < D / 8; dt++) {\n"
    "        dkrow[dt * 4 + t] = fa_pack(dk[dt][2 * i] * scale, dk[dt][2 * i + 1] * scale);\n"
    "        dvrow[dt * 4 + t] = fa_pack(dv[dt][2 * i], dv[dt][2 * i + 1]);\n"
    "      }\n"
    "    }\n"
    "  }\n"
    "}\n"
    "\n"
    "// dq (packed columns 0 .. C-1, row stride W) = scale * acc (T, C) f32\n"
    "FA_KERNEL(256, 1) fa_dq_out(const float *__restrict__ acc, bf16 *__restrict__ packed, i64 T, int C, i64 W, float scale) {\n"
    "  const i64 i = (i64)blockIdx.x * 256 + (int)threadIdx.x; /* pair index */\n"
    "  if (i >= T * C / 2) return;\n"
    "  const i64 r = i * 2 / C;\n"
    "  const int c = (int)(i * 2 % C);\n"
    "  *(u32 *)(packed + r * W + c) = fa_pack(acc[2 * i] * scale, acc[2 * i + 1] * scale);\n"
    "}\n"
    "\n"
    "FA_KERNEL(256, 1) fa_bwd_pre_d64(const bf16 *o, const bf16 *dout, float *Dd, float *lse, int S, int Sp, int nh, i64 rows) {\n"
    "  fa_bwd_pre<64>(o, dout, Dd, lse, S, Sp, nh, rows);\n"
    "}\n"
    "FA_KERNEL(256, 1) fa_bwd_pre_d128(const bf16 *o, const bf16 *dout, float *Dd, float *lse, int S, int Sp, int nh, i64 rows) {\n"
    "  fa_bwd_pre<128>(o, dout, Dd, lse, S, Sp, nh, rows);\n"
    "}\n";
/* END body */

/* ---- variants ---- */
typedef struct {
  int hd, warps, bn, minb;
} fwd_variant;
typedef struct {
  int hd, warps, bq, minb;
} bwd_variant;

#define FWD_V(hd, w, bn, mb) {hd, w, bn, mb},
#define BWD_V(hd, w, bq, mb) {hd, w, bq, mb},
static const fwd_variant fwd_variants[] = {GPU_FLASH_FWD_VARIANTS(FWD_V)};
static const bwd_variant bwd_variants[] = {GPU_FLASH_BWD_VARIANTS(BWD_V)};
#undef FWD_V
#undef BWD_V
enum { N_FWD = sizeof fwd_variants / sizeof fwd_variants[0], N_BWD = sizeof bwd_variants / sizeof bwd_variants[0] };

static void fwd_name(char *buf, size_t n, const fwd_variant *v) {
  snprintf(buf, n, "fa_fwd_d%d_w%d_n%d_m%d", v->hd, v->warps, v->bn, v->minb);
}
static void bwd_name(char *buf, size_t n, const bwd_variant *v) {
  snprintf(buf, n, "fa_bwd_d%d_w%d_q%d_m%d", v->hd, v->warps, v->bq, v->minb);
}

/* body + one entry point per variant; prelude + that. Built once. */
static char *body_text, *source_text;
static pthread_once_t text_once = PTHREAD_ONCE_INIT;

static void append(char **buf, size_t *len, size_t *cap, const char *s) {
  size_t n = strlen(s);
  if (!*buf) return;
  if (*len + n + 1 > *cap) {
    size_t c = *cap * 2 + n + 1;
    char *b = realloc(*buf, c);
    if (!b) {
      free(*buf);
      *buf = NULL;
      return;
    }
    *buf = b;
    *cap = c;
  }
  memcpy(*buf + *len, s, n + 1);
  *len += n;
}

static void build_text(void) {
  size_t len = 0, cap = sizeof body + 8192;
  char *b = malloc(cap), line[1024], name[64];
  if (b) b[0] = 0;
  append(&b, &len, &cap, body);
  append(&b, &len, &cap, "\n// ---- entry points, one per variant (gpu_flash.h) ----\n");
  for (int i = 0; i < N_FWD; i++) {
    const fwd_variant *v = &fwd_variants[i];
    fwd_name(name, sizeof name, v);
    snprintf(line, sizeof line,
             "FA_KERNEL(%d, %d) %s(const bf16 *q, const bf16 *k, const bf16 *v, bf16 *o, float *lse, int S, int Sp,\n"
             "    int nh, int nkv, int causal, float sl2) {\n"
             "  fa_fwd<%d, %d, %d>(q, k, v, o, lse, S, Sp, nh, nkv, causal, sl2);\n}\n",
             32 * v->warps, v->minb, name, v->hd, v->warps, v->bn);
    append(&b, &len, &cap, line);
  }
  for (int i = 0; i < N_BWD; i++) {
    const bwd_variant *v = &bwd_variants[i];
    bwd_name(name, sizeof name, v);
    snprintf(line, sizeof line,
             "FA_KERNEL(%d, %d) %s(const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout, const float *lse,\n"
             "    const float *Dd, float *dqa, bf16 *packed, int S, int Sp, int nh, int nkv, int causal, float scale,\n"
             "    float sl2) {\n"
             "  fa_bwd<%d, %d, %d>(q, k, v, dout, lse, Dd, dqa, packed, S, Sp, nh, nkv, causal, scale, sl2);\n}\n",
             32 * v->warps, v->minb, name, v->hd, v->warps, v->bq);
    append(&b, &len, &cap, line);
  }
  body_text = b;
  if (!b) return;
  size_t n = sizeof prelude + len + 2;
  source_text = malloc(n);
  if (source_text) snprintf(source_text, n, "%s\n%s", prelude, b);
}

const char *gpu_flash_body(void) {
  pthread_once(&text_once, build_text);
  return body_text;
}
const char *gpu_flash_source(void) {
  pthread_once(&text_once, build_text);
  return source_text;
}

struct gpu_flash {
  gpu_ctx *g;
  void *module;
  void *fwd_fn[N_FWD], *bwd_fn[N_BWD], *pre_fn[2], *dq_fn;
  int fwd_sel[2], bwd_sel[2]; /* the variant in use for hd 64, 128; -1: none fits */
  gpu_rowstats *lse; /* f32 (B, nh, Sp): log2 of sum_j 2^(s_j log2(e) / sqrt(hd)), i.e. lse / ln 2 */
  gpu_ptr Dd, dqa, out_scratch;
  size_t cap_Dd, cap_dqa, cap_out;
};

static int hd_index(int64_t hd) { return hd == 64 ? 0 : hd == 128 ? 1 : -1; }

/* The i-th variant of head dim hd, i from the environment variable env (none, or an i past the
 * list: the first), or -1 when hd has none. */
static int pick(const char *env, int hd, int is_fwd) {
  const char *s = getenv(env);
  int want = s && *s ? atoi(s) : 0, seen = 0;
  for (int round = 0; round < 2; round++, want = 0) {
    seen = 0;
    for (int i = 0; i < (is_fwd ? N_FWD : N_BWD); i++)
      if ((is_fwd ? fwd_variants[i].hd : bwd_variants[i].hd) == hd && seen++ == want) return i;
  }
  return -1;
}

gpu_flash *gpu_flash_new(gpu_ctx *g, const char *arch, const char *cache_dir, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  const char *digits = arch ? arch + strcspn(arch, "0123456789") : "";
  if (atoi(digits) < 80) return NULL; /* mma.sync bf16 needs sm_80: not an error, the caller falls back */
  const char *src = gpu_flash_source();
  gpu_flash *f = calloc(1, sizeof *f);
  if (!src || !f) {
    free(f);
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  f->g = g;
  if (!(f->lse = gpu_rowstats_new(g, "attention logsumexp"))) {
    free(f);
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  gpu_nvrtc_opts o;
  memset(&o, 0, sizeof o);
  o.arch = arch;
  o.cache_dir = cache_dir;
  gpu_nvrtc_out out;
  if (gpu_nvrtc_compile("flash_attention", src, &o, &out, err, errlen) != 0) {
    gpu_rowstats_free(f->lse);
    free(f);
    return NULL;
  }
  int rc = gpu_module_load(g, out.image, &f->module, "flash_attention");
  gpu_nvrtc_out_free(&out);
  char name[64];
  const int optin = gpu_info(g)->smem_optin;
  for (int i = 0; rc == 0 && i < N_FWD; i++) {
    const fwd_variant *v = &fwd_variants[i];
    gpu_flash_fwd_geom geo = gpu_flash_fwd_geometry(v->hd, v->warps, v->bn, v->minb);
    fwd_name(name, sizeof name, v);
    rc = gpu_function(g, f->module, name, &f->fwd_fn[i]);
    if (rc == 0 && (int)geo.smem <= optin) rc = gpu_set_max_smem(g, f->fwd_fn[i], (int)geo.smem);
  }
  for (int i = 0; rc == 0 && i < N_BWD; i++) {
    const bwd_variant *v = &bwd_variants[i];
    gpu_flash_bwd_geom geo = gpu_flash_bwd_geometry(v->hd, v->warps, v->bq, v->minb);
    bwd_name(name, sizeof name, v);
    rc = gpu_function(g, f->module, name, &f->bwd_fn[i]);
    if (rc == 0 && (int)geo.smem <= optin) rc = gpu_set_max_smem(g, f->bwd_fn[i], (int)geo.smem);
  }
  if (rc == 0) rc = gpu_function(g, f->module, "fa_bwd_pre_d64", &f->pre_fn[0]);
  if (rc == 0) rc = gpu_function(g, f->module, "fa_bwd_pre_d128", &f->pre_fn[1]);
  if (rc == 0) rc = gpu_function(g, f->module, "fa_dq_out", &f->dq_fn);
  if (rc != 0) {
    snprintf(err, errlen, "%s", gpu_error(g));
    gpu_flash_free(f);
    return NULL;
  }
  for (int h = 0; h < 2; h++) {
    const int hd = h ? 128 : 64;
    f->fwd_sel[h] = pick("MOEC_FLASH_FWD", hd, 1);
    f->bwd_sel[h] = pick("MOEC_FLASH_BWD", hd, 0);
    /* a device with too little shared memory (sm_86: 99 KiB) takes no kernel of this hd */
    if (f->fwd_sel[h] >= 0) {
      const fwd_variant *v = &fwd_variants[f->fwd_sel[h]];
      if ((int)gpu_flash_fwd_geometry(v->hd, v->warps, v->bn, v->minb).smem > optin) f->fwd_sel[h] = -1;
    }
    if (f->bwd_sel[h] >= 0) {
      const bwd_variant *v = &bwd_variants[f->bwd_sel[h]];
      if ((int)gpu_flash_bwd_geometry(v->hd, v->warps, v->bq, v->minb).smem > optin) f->bwd_sel[h] = -1;
    }
  }
  return f;
}

void gpu_flash_free(gpu_flash *f) {
  if (!f) return;
  gpu_sync(f->g);
  gpu_rowstats_free(f->lse);
  gpu_free(f->g, f->Dd);
  gpu_free(f->g, f->dqa);
  gpu_free(f->g, f->out_scratch);
  if (f->module) gpu_module_unload(f->g, f->module);
  free(f);
}

void gpu_flash_new_run(gpu_flash *f) {
  if (f) gpu_rowstats_new_run(f->lse);
}

int gpu_flash_supports(const gpu_flash *f, int64_t hd) {
  const int h = hd_index(hd);
  return f && h >= 0 && f->fwd_sel[h] >= 0 && f->bwd_sel[h] >= 0;
}

/* Grows a device buffer; waits for the stream first, since queued kernels may use the old one. */
static int grow(gpu_flash *f, gpu_ptr *p, size_t *cap, size_t bytes, const char *what, char *err, size_t errlen) {
  if (*cap >= bytes) return 0;
  if (*p && gpu_sync(f->g) != 0) {
    snprintf(err, errlen, "%s", gpu_error(f->g));
    return -1;
  }
  gpu_free(f->g, *p);
  *p = 0;
  *cap = 0;
  if (gpu_alloc(f->g, p, bytes, what) != 0) {
    snprintf(err, errlen, "%s", gpu_error(f->g));
    return -1;
  }
  *cap = bytes;
  return 0;
}

typedef struct {
  int64_t B, seq, nh, nkv, hd;
  int causal;
} shape;

static int64_t padded(int64_t seq) { return (seq + GPU_FLASH_PAD - 1) / GPU_FLASH_PAD * GPU_FLASH_PAD; }

/* The logsumexp buffer of this call's (buffers, shape); *fresh when no forward wrote it. */
static gpu_ptr lse_get(gpu_flash *f, const shape *s, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out, int *fresh,
                       char *err, size_t errlen) {
  const gpu_rowstats_key key = {q, k, v, out, s->B, s->seq, s->nh, s->nkv, s->hd, s->causal};
  return gpu_rowstats_get(f->lse, &key, (size_t)(s->B * s->nh * padded(s->seq)) * 4, fresh, err, errlen);
}

/* Forgets it again: its forward failed, nothing valid is in it. */
static void lse_drop(gpu_flash *f, const shape *s, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out) {
  const gpu_rowstats_key key = {q, k, v, out, s->B, s->seq, s->nh, s->nkv, s->hd, s->causal};
  gpu_rowstats_drop(f->lse, &key);
}

static int launch(gpu_flash *f, void *fn, const char *name, unsigned gx, unsigned gy, unsigned threads, unsigned smem,
                  void **args, char *err, size_t errlen) {
  const unsigned grid[3] = {gx, gy, 1}, block[3] = {threads, 1, 1};
  if (gx == 0 || gy == 0) return 0;
  if (gpu_launch(f->g, fn, name, grid, block, smem, args) != 0) {
    snprintf(err, errlen, "%s", gpu_error(f->g));
    return -1;
  }
  return 0;
}

static int check(const gpu_flash *f, const shape *s, char *err, size_t errlen) {
  if (!gpu_flash_supports(f, s->hd) || s->nkv < 1 || s->nh % s->nkv != 0 || s->seq < 0 || s->B < 0) {
    snprintf(err, errlen, "flash attention: unsupported shape (heads %lld, kv_heads %lld, head dim %lld)",
             (long long)s->nh, (long long)s->nkv, (long long)s->hd);
    return -1;
  }
  /* grid x = B*heads, grid y = tiles of >= 64 rows; every row index fits an int */
  if (s->B * s->nh > 0x7fffffff || s->seq > 65535 * 64 || s->B * padded(s->seq) * s->nh > 0x7fffffff) {
    snprintf(err, errlen, "flash attention: batch %lld x seq %lld x heads %lld is too large", (long long)s->B,
             (long long)s->seq, (long long)s->nh);
    return -1;
  }
  return 0;
}

static int run_fwd(gpu_flash *f, const shape *s, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out, gpu_ptr lse, char *err,
                   size_t errlen) {
  const int vi = f->fwd_sel[hd_index(s->hd)];
  const fwd_variant *fv = &fwd_variants[vi];
  const gpu_flash_fwd_geom geo = gpu_flash_fwd_geometry(fv->hd, fv->warps, fv->bn, fv->minb);
  int S = (int)s->seq, Sp = (int)padded(s->seq), nh = (int)s->nh, nkv = (int)s->nkv, causal = s->causal;
  float sl2 = (float)(1.4426950408889634 / sqrt((double)s->hd));
  void *args[] = {&q, &k, &v, &out, &lse, &S, &Sp, &nh, &nkv, &causal, &sl2};
  return launch(f, f->fwd_fn[vi], "flash attention forward", (unsigned)(s->B * s->nh), (unsigned)((S + geo.bq - 1) / geo.bq),
                (unsigned)(32 * geo.warps), geo.smem, args, err, errlen);
}

int gpu_flash_fwd(gpu_flash *f, int64_t B, int64_t seq, int64_t nh, int64_t nkv, int64_t hd, int causal, gpu_ptr q,
                  gpu_ptr k, gpu_ptr v, gpu_ptr out, char *err, size_t errlen) {
  const shape s = {B, seq, nh, nkv, hd, causal != 0};
  if (check(f, &s, err, errlen)) return -1;
  if (B == 0 || seq == 0) return 0;
  int fresh;
  gpu_ptr lse = lse_get(f, &s, q, k, v, out, &fresh, err, errlen);
  if (!lse) return -1;
  if (run_fwd(f, &s, q, k, v, out, lse, err, errlen) == 0) return 0;
  lse_drop(f, &s, q, k, v, out);
  return -1;
}

int gpu_flash_bwd(gpu_flash *f, int64_t B, int64_t seq, int64_t nh, int64_t nkv, int64_t hd, int causal, gpu_ptr q,
                  gpu_ptr k, gpu_ptr v, gpu_ptr out, gpu_ptr dout, gpu_ptr packed, char *err, size_t errlen) {
  const shape s = {B, seq, nh, nkv, hd, causal != 0};
  if (check(f, &s, err, errlen)) return -1;
  if (B == 0 || seq == 0) return 0;
  const int64_t T = B * seq, Sp64 = padded(seq), C = nh * hd;
  int fresh;
  gpu_ptr lse = lse_get(f, &s, q, k, v, out, &fresh, err, errlen);
  if (!lse) return -1;
  if (fresh) { /* no forward of these buffers to take the logsumexp from: recompute it */
    if (grow(f, &f->out_scratch, &f->cap_out, (size_t)(T * C) * 2, "attention output (recomputed)", err, errlen) ||
        run_fwd(f, &s, q, k, v, f->out_scratch, lse, err, errlen)) {
      lse_drop(f, &s, q, k, v, out);
      return -1;
    }
  }
  if (grow(f, &f->Dd, &f->cap_Dd, (size_t)(B * nh * Sp64) * 4, "attention row statistics", err, errlen) ||
      grow(f, &f->dqa, &f->cap_dqa, (size_t)(T * C) * 4, "attention dq accumulator", err, errlen))
    return -1;
  if (gpu_memset32(f->g, f->dqa, 0, (size_t)(T * C)) != 0) {
    snprintf(err, errlen, "%s", gpu_error(f->g));
    return -1;
  }
  const int h = hd_index(hd), vi = f->bwd_sel[h];
  const bwd_variant *bv = &bwd_variants[vi];
  const gpu_flash_bwd_geom geo = gpu_flash_bwd_geometry(bv->hd, bv->warps, bv->bq, bv->minb);
  int S = (int)seq, Sp = (int)Sp64, nhi = (int)nh, nkvi = (int)nkv, c = s.causal;
  int64_t rows = B * nh * Sp64, W = (nh + 2 * nkv) * hd;
  gpu_ptr Dd = f->Dd, dqa = f->dqa;
  void *pre_args[] = {&out, &dout, &Dd, &lse, &S, &Sp, &nhi, &rows};
  if (launch(f, f->pre_fn[h], "flash attention backward (dO.O)", (unsigned)((rows + 7) / 8), 1, 256, 0, pre_args, err,
             errlen))
    return -1;
  float scale = (float)(1.0 / sqrt((double)hd)), sl2 = (float)(1.4426950408889634 / sqrt((double)hd));
  void *args[] = {&q, &k, &v, &dout, &lse, &Dd, &dqa, &packed, &S, &Sp, &nhi, &nkvi, &c, &scale, &sl2};
  if (launch(f, f->bwd_fn[vi], "flash attention backward", (unsigned)(B * nkv), (unsigned)((S + geo.bn - 1) / geo.bn),
             32 * (unsigned)geo.warps, geo.smem, args, err, errlen))
    return -1;
  int Ci = (int)C;
  int64_t Tl = T;
  void *dq_args[] = {&dqa, &packed, &Tl, &Ci, &W, &scale};
  const int64_t pairs = T * C / 2;
  if (pairs / 256 + 1 > 0x7fffffff) {
    snprintf(err, errlen, "flash attention: %lld x %lld is too large", (long long)T, (long long)C);
    return -1;
  }
  return launch(f, f->dq_fn, "flash attention backward (dq)", (unsigned)((pairs + 255) / 256), 1, 256, 0, dq_args, err,
                errlen);
}

int gpu_flash_variant(const gpu_flash *f, int64_t hd, int bwd, char *name, size_t len) {
  const int h = hd_index(hd);
  if (!f || h < 0) return -1;
  const int vi = bwd ? f->bwd_sel[h] : f->fwd_sel[h];
  if (vi < 0) return -1;
  if (bwd) bwd_name(name, len, &bwd_variants[vi]);
  else fwd_name(name, len, &fwd_variants[vi]);
  return 0;
}
