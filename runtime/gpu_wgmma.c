/* gpu_wgmma.c -- the FP8 grouped GEMM of gpu_wgmma.h: its CUDA source, the module and the
 * launches. */
#include "gpu_wgmma.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_nvrtc.h"

/* Appends t to the growing source *s; after a failed realloc *s stays NULL (and appending
 * stops), which gpu_wgmma_source reports as out of memory. */
static void append(char **s, size_t *len, size_t *cap, const char *t) {
  size_t n = strlen(t);
  if (*len && !*s) return;
  if (*len + n + 1 > *cap) {
    size_t nc = (*cap ? *cap * 2 : 16384) + n;
    char *p = realloc(*s, nc);
    if (!p) {
      free(*s);
      *s = NULL;
      *cap = 0;
      *len = 1; /* marks the failure */
      return;
    }
    *s = p;
    *cap = nc;
  }
  if (*s) {
    memcpy(*s + *len, t, n + 1);
    *len += n;
  }
}

/* The wide variant's register split (setmaxnreg). A launch of 384 threads gets 168 registers a
 * thread (65,536 / 384 rounded down to 8), 64,512 for the block; the math warpgroups' increase
 * waits for registers the producer's decrease returns, so a split past that total never
 * proceeds (48 / 232 hung the kernel until its barrier wait trapped, on the H200). 40 / 232 is
 * where ptxas spills the least (none in variant 4, 20 bytes in variant 5's epilogue).
 * gpu_wgmma_new checks the loaded kernels' register count (and 384 threads) and leaves a wide
 * variant unavailable where it differs. */
enum { WIDE_PRODUCER_REGS = 40, WIDE_MATH_REGS = 232, WIDE_LAUNCH_REGS = 65536 / 384 / 8 * 8 };
_Static_assert(WIDE_MATH_REGS * 256 + WIDE_PRODUCER_REGS * 128 <= WIDE_LAUNCH_REGS * 384,
               "the wide variant's setmaxnreg split exceeds the block's registers");
_Static_assert(WIDE_PRODUCER_REGS % 8 == 0 && WIDE_MATH_REGS % 8 == 0 && WIDE_PRODUCER_REGS >= 24 && WIDE_MATH_REGS <= 256,
               "setmaxnreg takes multiples of 8 from 24 to 256");

static const char body[] =
    "typedef unsigned char u8;\n"
    "typedef unsigned short u16;\n"
    "typedef unsigned int u32;\n"
    "typedef unsigned long long u64;\n"
    "typedef long long i64;\n"
    "\n"
    "// One launch's problem. mode 0 (rows): group e has counts[e] rows of A and C, K fixed;\n"
    "// mode 1 (wgrad): group e has M rows, K = its counts padded to 128 (gpu_wgmma.h); its A and B\n"
    "// are (M, K) and (N, K) blocks one after another (ld 0), or columns Poff_e.. of one (M, ld)\n"
    "// and one (N, ld) matrix. sq (rows mode, or NULL): B's scales as squares, one per 128 x 128 of\n"
    "// each weight (E, N/128, ldk = K/128 rounded up to 4), in place of sb.\n"
    "struct wg_args {\n"
    "  const u8 *a; const float *sa; const u8 *b; const float *sb; void *c;\n"
    "  const int *counts; const float *sq;\n"
    "  i64 K, M, N, ldc, ld, S; // S: the rows the counts split\n"
    "  int E, mode, c_f32;\n"
    "};\n"
    "struct __align__(64) tmap_t { u64 v[16]; }; // a CUtensorMap\n"
    "\n"
    "__device__ __forceinline__ u32 smem_u32(const void *p) { return (u32)__cvta_generic_to_shared(p); }\n"
    "// 16 bytes global -> shared; bytes 0 fills the 16 with zeros and reads nothing\n"
    "__device__ __forceinline__ void cp16(u32 dst, const void *src, int bytes) {\n"
    "  asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\\n\" ::\"r\"(dst), \"l\"(src), \"r\"(bytes) : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void cp_commit() { asm volatile(\"cp.async.commit_group;\\n\" ::: \"memory\"); }\n"
    "template <int N> __device__ __forceinline__ void cp_wait() { asm volatile(\"cp.async.wait_group %0;\\n\" ::\"n\"(N) : \"memory\"); }\n"
    "// cp.async writes through the generic proxy, wgmma reads through the async one\n"
    "__device__ __forceinline__ void fence_async_smem() { asm volatile(\"fence.proxy.async.shared::cta;\\n\" ::: \"memory\"); }\n"
    "__device__ __forceinline__ void wg_fence() { asm volatile(\"wgmma.fence.sync.aligned;\\n\" ::: \"memory\"); }\n"
    "__device__ __forceinline__ void wg_commit() { asm volatile(\"wgmma.commit_group.sync.aligned;\\n\" ::: \"memory\"); }\n"
    "__device__ __forceinline__ void wg_wait0() { asm volatile(\"wgmma.wait_group.sync.aligned 0;\\n\" ::: \"memory\"); }\n"
    "// keeps the compiler from moving reads of an accumulator across the wgmma wait\n"
    "__device__ __forceinline__ void reg_fence(float &x) { asm volatile(\"\" : \"+f\"(x)::\"memory\"); }\n"
    "\n"
    "// mbarriers (the TMA pipeline): full[s] completes when stage s's bytes land, empty[s] when\n"
    "// every math thread is done with it\n"
    "__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {\n"
    "  asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\\n\" ::\"r\"(bar), \"r\"(count) : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {\n"
    "  asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n\" ::\"r\"(bar), \"r\"(bytes) : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void mbar_arrive(u32 bar) {\n"
    "  asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%0];\\n\" ::\"r\"(bar) : \"memory\");\n"
    "}\n"
    "// waits for the phase of parity `parity` to complete, acquiring at CTA scope, or with CLUSTER\n"
    "// what other blocks of the cluster released with their arrives; a wait of ~2^35 cycles\n"
    "// (~18 s) traps, so a pipeline bug fails the launch instead of hanging the process\n"
    "template <bool CLUSTER = false> __device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {\n"
    "  long long t0 = 0;\n"
    "  for (;;) {\n"
    "    u32 done;\n"
    "    if (CLUSTER)\n"
    "      asm volatile(\"{\\n.reg .pred p;\\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\\nselp.u32 %0, 1, 0, p;\\n}\\n\"\n"
    "                   : \"=r\"(done) : \"r\"(bar), \"r\"(parity) : \"memory\");\n"
    "    else\n"
    "      asm volatile(\"{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\nselp.u32 %0, 1, 0, p;\\n}\\n\"\n"
    "                   : \"=r\"(done) : \"r\"(bar), \"r\"(parity) : \"memory\");\n"
    "    if (done) return;\n"
    "    if (t0 == 0) t0 = clock64();\n"
    "    else if (clock64() - t0 > (1ll << 35)) __trap();\n"
    "  }\n"
    "}\n"
    "__device__ __forceinline__ void tma_load_2d(u32 dst, const tmap_t *map, int x, int y, u32 bar) {\n"
    "  asm volatile(\"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\\n\"\n"
    "               ::\"r\"(dst), \"l\"((u64)map), \"r\"(x), \"r\"(y), \"r\"(bar) : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void bulk_load(u32 dst, const void *src, u32 bytes, u32 bar) {\n"
    "  asm volatile(\"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\\n\"\n"
    "               ::\"r\"(dst), \"l\"(src), \"r\"(bytes), \"r\"(bar) : \"memory\");\n"
    "}\n"
    "\n"
    "// Clusters (the multicast variant): this block's rank, a barrier's address in block `rank`,\n"
    "// an arrive there, a whole-cluster barrier, and a TMA load written into every block of mask.\n"
    "__device__ __forceinline__ u32 cluster_rank() {\n"
    "  u32 r;\n"
    "  asm volatile(\"mov.u32 %0, %%cluster_ctarank;\\n\" : \"=r\"(r));\n"
    "  return r;\n"
    "}\n"
    "__device__ __forceinline__ u32 cluster_addr(u32 local, u32 rank) {\n"
    "  u32 a;\n"
    "  asm volatile(\"mapa.shared::cluster.u32 %0, %1, %2;\\n\" : \"=r\"(a) : \"r\"(local), \"r\"(rank));\n"
    "  return a;\n"
    "}\n"
    "__device__ __forceinline__ void mbar_arrive_cluster(u32 cluster_bar) {\n"
    "  asm volatile(\"mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\\n\" ::\"r\"(cluster_bar) : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void cluster_sync() {\n"
    "  asm volatile(\"barrier.cluster.arrive.release.aligned;\\nbarrier.cluster.wait.acquire.aligned;\\n\" ::: \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void tma_load_2d_mc(u32 dst, const tmap_t *map, int x, int y, u32 bar, u16 mask) {\n"
    "  asm volatile(\"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\\n\"\n"
    "               ::\"r\"(dst), \"l\"((u64)map), \"r\"(x), \"r\"(y), \"r\"(bar), \"h\"(mask) : \"memory\");\n"
    "}\n"
    "\n"
    "// Shared-memory matrix descriptor of a K-major tile stored with the 128-byte swizzle: rows\n"
    "// of 128 bytes, 16-byte chunk c of row r at chunk c ^ (r & 7), tile 1024-byte aligned;\n"
    "// stride between 8-row groups 1024 bytes (the leading offset is unused in this form).\n"
    "__device__ __forceinline__ u64 desc_sw128(u32 addr) {\n"
    "  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ u32 bf16_bits(float f) { // round to nearest even, NaN kept quiet\n"
    "  u32 u = __float_as_uint(f);\n"
    "  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;\n"
    "  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;\n"
    "}\n"
    "\n"
    "// The groups' prefixes, computed once a block: rows (or padded tokens), scale floats, tiles.\n"
    "struct wg_table {\n"
    "  int t0[WG_MAX_E + 1], cnt[WG_MAX_E];\n"
    "  i64 pa[WG_MAX_E], ps[WG_MAX_E];\n"
    "};\n"
    "// A unit is BM rows (BM = 2 tiles for a cluster pair) by one column tile.\n"
    "__device__ void wg_prefix(const wg_args &p, int BM, int tiles_n, wg_table &tb) {\n"
    "  i64 pa = 0, ps = 0, rows = 0;\n"
    "  int t0 = 0;\n"
    "  for (int e = 0; e < p.E; e++) {\n"
    "    // counts past S (a corrupt router output) are cut at S: never a read or write out of bounds\n"
    "    int m = (int)min((i64)(p.counts[e] > 0 ? p.counts[e] : 0), p.S - rows);\n"
    "    rows += m;\n"
    "    tb.cnt[e] = m, tb.pa[e] = pa, tb.ps[e] = ps, tb.t0[e] = t0;\n"
    "    if (p.mode == 0) {\n"
    "      t0 += (m + BM - 1) / BM * tiles_n;\n"
    "      pa += m;\n"
    "      ps += ((i64)(m + 15) / 16 * 16 * (p.K / 128) + 3) / 4 * 4;\n"
    "    } else {\n"
    "      t0 += (int)((p.M + BM - 1) / BM) * tiles_n;\n"
    "      pa += (m + 127) / 128 * 128;\n"
    "    }\n"
    "  }\n"
    "  tb.t0[p.E] = t0;\n"
    "}\n"
    "\n"
    "// Tile t's group and its operands.\n"
    "struct wg_group {\n"
    "  const u8 *a, *b; const float *sa, *sb; // with squares sb is the tile's own: chunk kc's at sb[kc]\n"
    "  i64 m, k, lda, sa_ld, sb_ld, c_off, m0, n0;\n"
    "  int ax, ay, bx, by; // the tile's TMA coordinates at chunk 0: A (K byte, row), B (K byte, row)\n"
    "  int e;\n"
    "};\n"
    "__device__ __forceinline__ wg_group wg_resolve(const wg_args &p, const wg_table &tb, int t, int BM, int BN, int tiles_n) {\n"
    "  wg_group g;\n"
    "  int e = 0;\n"
    "  while (e + 1 < p.E && tb.t0[e + 1] <= t) e++;\n"
    "  const int local = t - tb.t0[e];\n"
    "  g.e = e, g.m0 = (i64)(local / tiles_n) * BM, g.n0 = (i64)(local % tiles_n) * BN;\n"
    "  if (p.mode == 0) {\n"
    "    const i64 wsb = ((p.N + 15) / 16 * 16 * (p.K / 128) + 3) / 4 * 4; // a weight's scale floats\n"
    "    g.m = tb.cnt[e], g.k = p.K, g.lda = p.K;\n"
    "    g.a = p.a + tb.pa[e] * p.K, g.sa = p.sa + tb.ps[e], g.sa_ld = (g.m + 15) / 16 * 16;\n"
    "    g.b = p.b + (i64)e * p.N * p.K, g.sb = p.sb + (i64)e * wsb, g.sb_ld = (p.N + 15) / 16 * 16;\n"
    "    if (p.sq) {\n"
    "      const i64 ldk = (p.K / 128 + 3) / 4 * 4;\n"
    "      g.sb = p.sq + ((i64)e * (p.N / 128) + g.n0 / 128) * ldk, g.sb_ld = 1;\n"
    "    }\n"
    "    g.c_off = tb.pa[e] * p.ldc;\n"
    "    g.ax = 0, g.ay = (int)(tb.pa[e] + g.m0), g.bx = 0, g.by = (int)(e * p.N + g.n0);\n"
    "  } else {\n"
    "    g.m = p.M, g.k = (tb.cnt[e] + 127) / 128 * 128;\n"
    "    if (p.ld) { // columns Poff_e.. of (M, ld) and (N, ld)\n"
    "      g.lda = p.ld, g.a = p.a + tb.pa[e], g.b = p.b + tb.pa[e];\n"
    "    } else {\n"
    "      g.lda = g.k, g.a = p.a + p.M * tb.pa[e], g.b = p.b + p.N * tb.pa[e];\n"
    "    }\n"
    "    g.sa = p.sa + p.M * (tb.pa[e] / 128), g.sa_ld = p.M;\n"
    "    g.sb = p.sb + p.N * (tb.pa[e] / 128), g.sb_ld = p.N;\n"
    "    g.c_off = (i64)e * p.M * p.N;\n"
    "    g.ax = (int)tb.pa[e], g.ay = (int)g.m0, g.bx = (int)tb.pa[e], g.by = (int)g.n0;\n"
    "  }\n"
    "  return g;\n"
    "}\n"
    "\n"
    "// This chunk's sums (tmp) times its rows' and columns' scales, into the f32 result. The\n"
    "// thread holds rows r, r + 8 of its warpgroup's 64 and columns 8j + 2(lane % 4) + {0, 1}.\n"
    "__device__ __forceinline__ void wg_promote(float *acc, const float *tmp, const float *SA, const float *SB, int r, int lane) {\n"
    "  const float s0 = SA[r], s1 = SA[r + 8];\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < 16; j++) {\n"
    "    const int c = 8 * j + 2 * (lane % 4);\n"
    "    const float b0 = SB[c], b1 = SB[c + 1];\n"
    "    acc[4 * j] = __fmaf_rn(tmp[4 * j], (s0 * b0), acc[4 * j]);\n"
    "    acc[4 * j + 1] = __fmaf_rn(tmp[4 * j + 1], (s0 * b1), acc[4 * j + 1]);\n"
    "    acc[4 * j + 2] = __fmaf_rn(tmp[4 * j + 2], (s1 * b0), acc[4 * j + 2]);\n"
    "    acc[4 * j + 3] = __fmaf_rn(tmp[4 * j + 3], (s1 * b1), acc[4 * j + 3]);\n"
    "  }\n"
    "}\n"
    "\n"
    "// The same with the chunk's one B scale of a square: one FMA an accumulator (__fmaf_rn:\n"
    "// NVRTC compiles with --fmad=false, which would leave a multiply and an add).\n"
    "__device__ __forceinline__ void wg_promote_sq(float *acc, const float *tmp, const float *SA, float sb, int r) {\n"
    "  const float s0 = SA[r] * sb, s1 = SA[r + 8] * sb;\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < 16; j++) {\n"
    "    acc[4 * j] = __fmaf_rn(tmp[4 * j], s0, acc[4 * j]);\n"
    "    acc[4 * j + 1] = __fmaf_rn(tmp[4 * j + 1], s0, acc[4 * j + 1]);\n"
    "    acc[4 * j + 2] = __fmaf_rn(tmp[4 * j + 2], s1, acc[4 * j + 2]);\n"
    "    acc[4 * j + 3] = __fmaf_rn(tmp[4 * j + 3], s1, acc[4 * j + 3]);\n"
    "  }\n"
    "}\n"
    "\n"
    "// The tile's outputs of this thread (rows r, r + 8 of the tile), only the group's own rows.\n"
    "__device__ __forceinline__ void wg_store(const wg_args &p, const wg_group &g, const float *acc, int r, int lane) {\n"
    "  const i64 row = g.m0 + r;\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < 16; j++) {\n"
    "    const i64 col = g.n0 + 8 * j + 2 * (lane % 4);\n"
    "    if (col >= p.N) continue;\n"
    "#pragma unroll\n"
    "    for (int h = 0; h < 2; h++) {\n"
    "      if (row + 8 * h >= g.m) continue;\n"
    "      const i64 o = g.c_off + (row + 8 * h) * p.ldc + col;\n"
    "      if (p.c_f32) {\n"
    "        float2 v;\n"
    "        v.x = acc[4 * j + 2 * h], v.y = acc[4 * j + 2 * h + 1];\n"
    "        *(float2 *)((float *)p.c + o) = v;\n"
    "      } else {\n"
    "        *(u32 *)((u16 *)p.c + o) = bf16_bits(acc[4 * j + 2 * h]) | (bf16_bits(acc[4 * j + 2 * h + 1]) << 16);\n"
    "      }\n"
    "    }\n"
    "  }\n"
    "}\n"
    "\n"
    "// A named barrier of one warpgroup's 128 threads: 1 or 2 (0 is __syncthreads')\n"
    "__device__ __forceinline__ void wg_bar(int id) {\n"
    "  if (id == 1) asm volatile(\"bar.sync 1, 128;\\n\" ::: \"memory\");\n"
    "  else asm volatile(\"bar.sync 2, 128;\\n\" ::: \"memory\");\n"
    "}\n"
    "// The same through shared memory (the wide variant's EPI 1, bf16 C): the warpgroup's 64 rows\n"
    "// x 256 columns go to buf (rows of 512 bytes padded to 528, so the 4-byte writes of a warp's 8\n"
    "// rows x 4 lanes fall in 32 banks), then each warp copies whole rows out with 16-byte stores:\n"
    "// 512 contiguous bytes an instruction instead of 16 bytes in each of 8 rows. bar: the\n"
    "// warpgroup's named barrier. C's rows must be 16-byte aligned (the caller checks).\n"
    "__device__ __forceinline__ void wg_store_staged(const wg_args &p, const wg_group &g, const float *acc, int halves, u8 *buf, int bar,\n"
    "                                                int wg, int lane, int tid) {\n"
    "  constexpr int LD = 528;\n"
    "  const int rl = (tid / 32 % 4) * 16 + lane / 4, q = lane % 4, wtid = tid % 128; // this thread's rows rl, rl + 8\n"
    "  const u32 base = smem_u32(buf) + rl * LD + 4 * q; // 32-bit shared addresses, constant offsets\n"
    "#pragma unroll\n"
    "  for (int h = 0; h < 2; h++) {\n"
    "    if (h >= halves) break;\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < 16; j++)\n"
    "#pragma unroll\n"
    "      for (int hh = 0; hh < 2; hh++)\n"
    "        asm volatile(\"st.shared.u32 [%0], %1;\\n\" ::\"r\"(base + (u32)(8 * hh * LD + (128 * h + 8 * j) * 2)),\n"
    "                     \"r\"(bf16_bits(acc[64 * h + 4 * j + 2 * hh]) | (bf16_bits(acc[64 * h + 4 * j + 2 * hh + 1]) << 16)) : \"memory\");\n"
    "  }\n"
    "  wg_bar(bar);\n"
    "#pragma unroll 1\n"
    "  for (int i = 0; i < 16; i++) { // 2048 chunks of 16 bytes (8 columns), a warp a row\n"
    "    const int c = wtid + 128 * i, row = c / 32, col = (c % 32) * 8;\n"
    "    const i64 grow = g.m0 + wg * 64 + row;\n"
    "    if (grow < g.m && g.n0 + col < p.N)\n"
    "      *(uint4 *)((u16 *)p.c + g.c_off + grow * p.ldc + g.n0 + col) = *(const uint4 *)(buf + row * LD + (c % 32) * 16);\n"
    "  }\n"
    "  wg_bar(bar); // buf is free again\n"
    "}\n"
    "\n"
    "// The four m64n128k32 wgmmas of one 128-byte K chunk, into a fresh tmp.\n"
    "__device__ __forceinline__ void wg_chunk(float *tmp, const u8 *a_tile, const u8 *b_tile) {\n"
    "  const u64 da = desc_sw128(smem_u32(a_tile)), db = desc_sw128(smem_u32(b_tile));\n"
    "  wg_fence();\n"
    "#pragma unroll\n"
    "  for (int kk = 0; kk < 4; kk++) wg_mma_n128(tmp, da + 2 * kk, db + 2 * kk, kk); // +32 bytes of K a step\n"
    "  wg_commit();\n"
    "  wg_wait0();\n"
    "#pragma unroll\n"
    "  for (int i = 0; i < 64; i++) reg_fence(tmp[i]);\n"
    "}\n"
    "\n"
    "// cp.async version (both modes): WG warpgroups of 64 rows each, every thread loads and\n"
    "// computes, a block barrier a chunk.\n"
    "template <int WG, int ST>\n"
    "__device__ __forceinline__ void wg_fp8_gemm(const wg_args &p) {\n"
    "  constexpr int BM = 64 * WG, BN = 128, T = 128 * WG;\n"
    "  constexpr int A_BYTES = BM * 128, B_BYTES = BN * 128;\n"
    "  constexpr int STAGE = (A_BYTES + B_BYTES + (BM + BN) * 4 + 1023) / 1024 * 1024;\n"
    "  extern __shared__ u8 smem_raw[];\n"
    "  u8 *smem = (u8 *)(((size_t)smem_raw + 1023) & ~(size_t)1023);\n"
    "  __shared__ wg_table tb;\n"
    "  const int tid = threadIdx.x, tiles_n = (int)((p.N + BN - 1) / BN);\n"
    "  if (tid == 0) wg_prefix(p, BM, tiles_n, tb);\n"
    "  __syncthreads();\n"
    "  const int wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32, r = wg * 64 + warp * 16 + lane / 4;\n"
    "  for (int t = blockIdx.x; t < tb.t0[p.E]; t += gridDim.x) {\n"
    "    const wg_group g = wg_resolve(p, tb, t, BM, BN, tiles_n);\n"
    "    const i64 m0 = g.m0, n0 = g.n0, lda = g.lda;\n"
    "    const int nk = (int)(g.k / 128);\n"
    "    // one stage: A (BM x 128 B) | B (BN x 128 B) | A scales (BM f32) | B scales (BN f32)\n"
    "    auto load = [&](int s, int kc) {\n"
    "      u8 *st = smem + s * STAGE;\n"
    "      const u8 *ga = g.a + m0 * lda + kc * 128, *gb = g.b + n0 * lda + kc * 128;\n"
    "      for (int q = tid; q < BM * 8; q += T) {\n"
    "        const int rr = q >> 3, c = q & 7;\n"
    "        const bool ok = m0 + rr < g.m;\n"
    "        cp16(smem_u32(st + rr * 128 + ((c ^ (rr & 7)) << 4)), ok ? (const void *)(ga + rr * lda + c * 16) : (const void *)p.a, ok ? 16 : 0);\n"
    "      }\n"
    "      for (int q = tid; q < BN * 8; q += T) {\n"
    "        const int rr = q >> 3, c = q & 7;\n"
    "        const bool ok = n0 + rr < p.N;\n"
    "        cp16(smem_u32(st + A_BYTES + rr * 128 + ((c ^ (rr & 7)) << 4)), ok ? (const void *)(gb + rr * lda + c * 16) : (const void *)p.b, ok ? 16 : 0);\n"
    "      }\n"
    "      for (int q = tid; q < (p.sq ? BM : BM + BN) / 4; q += T) { // squares: A's scales only\n"
    "        const bool isa = q < BM / 4;\n"
    "        const i64 i = isa ? m0 + 4 * q : n0 + 4 * (q - BM / 4);\n"
    "        const bool ok = isa ? i < g.m : i < p.N;\n"
    "        const float *src = isa ? g.sa + kc * g.sa_ld + i : g.sb + kc * g.sb_ld + i;\n"
    "        cp16(smem_u32(st + A_BYTES + B_BYTES + q * 16), ok ? (const void *)src : (const void *)p.sa, ok ? 16 : 0);\n"
    "      }\n"
    "    };\n"
    "    float acc[64], tmp[64];\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 64; i++) acc[i] = 0.f, tmp[i] = 0.f;\n"
    "#pragma unroll\n"
    "    for (int s = 0; s < ST - 1; s++) {\n"
    "      if (s < nk) load(s, s);\n"
    "      cp_commit();\n"
    "    }\n"
    "    for (int kc = 0; kc < nk; kc++) {\n"
    "      cp_wait<ST - 2>();\n"
    "      fence_async_smem();\n"
    "      __syncthreads(); // chunk kc landed for every thread; chunk kc - 1 is consumed\n"
    "      if (kc + ST - 1 < nk) load((kc + ST - 1) % ST, kc + ST - 1);\n"
    "      cp_commit();\n"
    "      const u8 *st = smem + (kc % ST) * STAGE;\n"
    "      const float sbq = p.sq ? __ldg(g.sb + kc) : 0.f;\n"
    "      wg_chunk(tmp, st + wg * 64 * 128, st + A_BYTES);\n"
    "      if (p.sq) wg_promote_sq(acc, tmp, (const float *)(st + A_BYTES + B_BYTES), sbq, r);\n"
    "      else wg_promote(acc, tmp, (const float *)(st + A_BYTES + B_BYTES), (const float *)(st + A_BYTES + B_BYTES) + BM, r, lane);\n"
    "    }\n"
    "    cp_wait<0>();\n"
    "    __syncthreads(); // the next tile's loads reuse the stages\n"
    "    wg_store(p, g, acc, r, lane);\n"
    "  }\n"
    "}\n"
    "\n"
    "// TMA version (rows mode, and wgrad on one (M, ld) matrix): warps 0-7 are two math\n"
    "// warpgroups (rows 0-63, 64-127 of a 128 x BN tile), each on its own schedule; warp 8 is the\n"
    "// producer: one thread issues every stage's TMA loads (A and B tiles, already swizzled) and\n"
    "// bulk copies (the scales), ST stages deep; empty[s] counts the math warps done with stage s.\n"
    "// MC 1: clusters of two blocks take two vertically adjacent tiles (same expert, same columns),\n"
    "// so each B tile is read from L2 once for both: each block loads its own A tile and half of\n"
    "// the shared B tile, which the TMA writes into both blocks; a stage is refilled once the math\n"
    "// warps of both blocks released it. A block whose tile lies past its expert's rows computes\n"
    "// it anyway (the pair shares the loads) and stores nothing.\n"
    "// NH 2 (wide): 128 x 256 tiles, a quarter less L2 traffic a FLOP than 128 x 128; each math\n"
    "// warpgroup does the chunk's two 128-column halves one after the other into one scratch\n"
    "// accumulator (128 result + 64 scratch floats a thread), with the registers of a whole\n"
    "// producer warpgroup (warps 8-11) handed to them by setmaxnreg (WG_PRODUCER_REGS and\n"
    "// WG_MATH_REGS a thread, which must fit in what the launch gave the block: gpu_wgmma.c).\n"
    "// EPI 1 (wide only): bf16 results leave through shared memory (wg_store_staged), 33 KiB a\n"
    "// math warpgroup after the stages, where C allows 16-byte stores (p.c and ldc; else, and for\n"
    "// f32, as EPI 0).\n"
    "template <int ST, int MC, int NH, int EPI>\n"
    "__device__ __forceinline__ void wg_fp8_tma(const tmap_t &ta, const tmap_t &tbm, const wg_args &p) {\n"
    "  constexpr int BM = 128, BN = 128 * NH, A_BYTES = BM * 128, B_BYTES = BN * 128, STAGE = A_BYTES + B_BYTES + 1024 * NH;\n"
    "  static_assert(EPI == 0 || NH == 2, \"the staged epilogue is the wide variant's\");\n"
    "  constexpr int UNIT = BM * (1 + MC); // rows a cluster takes\n"
    "  static_assert(MC == 0 || NH == 1, \"the multicast variant has 128-column tiles\");\n"
    "  extern __shared__ u8 smem_raw[];\n"
    "  u8 *smem = (u8 *)(((size_t)smem_raw + 1023) & ~(size_t)1023);\n"
    "  __shared__ wg_table tb;\n"
    "  __shared__ __align__(8) u64 full[ST], empty[ST];\n"
    "  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, tiles_n = (int)((p.N + BN - 1) / BN);\n"
    "  const u32 rank = MC ? cluster_rank() : 0, peer = rank ^ 1;\n"
    "  if (tid == 0) {\n"
    "    wg_prefix(p, UNIT, tiles_n, tb);\n"
    "    for (int s = 0; s < ST; s++) mbar_init(smem_u32(&full[s]), 1), mbar_init(smem_u32(&empty[s]), 8 * (1 + MC));\n"
    "    asm volatile(\"fence.mbarrier_init.release.cluster;\\n\" ::: \"memory\");\n"
    "  }\n"
    "  __syncthreads();\n"
    "  if (MC) cluster_sync(); // the peer's barriers exist before anything reaches them\n"
    "  const int total = tb.t0[p.E], first = blockIdx.x >> MC, step = gridDim.x >> MC;\n"
    "  // squares: a tile's second half reads the next square along N (ldk floats on)\n"
    "  const i64 sq_next = (p.K / 128 + 3) / 4 * 4;\n"
    "  if (warp >= 8) { // producer\n"
    "    if (NH == 2) asm volatile(\"setmaxnreg.dec.sync.aligned.u32 %0;\\n\" ::\"n\"(WG_PRODUCER_REGS) : \"memory\");\n"
    "    if (warp == 8 && lane == 0) {\n"
    "      int s = 0;\n"
    "      u32 ph = 0;\n"
    "      for (int t = first; t < total; t += step) {\n"
    "        wg_group g = wg_resolve(p, tb, t, UNIT, BN, tiles_n);\n"
    "        g.m0 += rank * BM, g.ay += rank * BM;\n"
    "        const u32 sa_bytes = g.m0 < g.sa_ld ? (u32)min((i64)BM, g.sa_ld - g.m0) * 4 : 0;\n"
    "        const u32 sb_bytes = p.sq ? 0 : (u32)min((i64)BN, g.sb_ld - g.n0) * 4; // squares: the math warps read theirs\n"
    "        for (int kc = 0; kc < (int)(g.k / 128); kc++) {\n"
    "          u8 *st = smem + s * STAGE;\n"
    "          const u32 bar = smem_u32(&full[s]);\n"
    "          mbar_wait<true>(smem_u32(&empty[s]), ph ^ 1);\n"
    "          mbar_expect_tx(bar, A_BYTES + B_BYTES + sa_bytes + sb_bytes);\n"
    "          tma_load_2d(smem_u32(st), &ta, g.ax + kc * 128, g.ay, bar);\n"
    "          if (MC)\n"
    "            tma_load_2d_mc(smem_u32(st + A_BYTES + rank * (B_BYTES / 2)), &tbm, g.bx + kc * 128, g.by + (int)rank * (BN / 2),\n"
    "                           bar, (u16)3);\n"
    "          else\n"
    "            tma_load_2d(smem_u32(st + A_BYTES), &tbm, g.bx + kc * 128, g.by, bar);\n"
    "          if (sa_bytes) bulk_load(smem_u32(st + A_BYTES + B_BYTES), g.sa + kc * g.sa_ld + g.m0, sa_bytes, bar);\n"
    "          if (sb_bytes) bulk_load(smem_u32(st + A_BYTES + B_BYTES + 512), g.sb + kc * g.sb_ld + g.n0, sb_bytes, bar);\n"
    "          if (++s == ST) s = 0, ph ^= 1;\n"
    "        }\n"
    "      }\n"
    "    }\n"
    "    __syncwarp();\n"
    "  } else {\n"
    "    if (NH == 2) asm volatile(\"setmaxnreg.inc.sync.aligned.u32 %0;\\n\" ::\"n\"(WG_MATH_REGS) : \"memory\");\n"
    "    const int wg = warp / 4, r = wg * 64 + (warp % 4) * 16 + lane / 4;\n"
    "    int s = 0;\n"
    "    u32 ph = 0;\n"
    "    for (int t = first; t < total; t += step) {\n"
    "      // the main loop keeps only what it reads (registers for the accumulators); the\n"
    "      // epilogue resolves the tile again\n"
    "      int nk, halves;\n"
    "      const float *sbt;\n"
    "      {\n"
    "        const wg_group g = wg_resolve(p, tb, t, UNIT, BN, tiles_n);\n"
    "        nk = (int)(g.k / 128), sbt = g.sb;\n"
    "        halves = NH == 2 && g.n0 + 128 < p.N ? 2 : 1; // a last tile of 128 columns or fewer: one\n"
    "      }\n"
    "      float acc[64 * NH], tmp[64];\n"
    "#pragma unroll\n"
    "      for (int i = 0; i < 64 * NH; i++) acc[i] = 0.f;\n"
    "#pragma unroll\n"
    "      for (int i = 0; i < 64; i++) tmp[i] = 0.f;\n"
    "      for (int kc = 0; kc < nk; kc++) {\n"
    "        const u8 *st = smem + s * STAGE;\n"
    "        float sbq[NH]; // squares: in flight across the wait and the wgmmas\n"
    "#pragma unroll\n"
    "        for (int h = 0; h < NH; h++) sbq[h] = p.sq && h < halves ? __ldg(sbt + h * sq_next + kc) : 0.f;\n"
    "        mbar_wait(smem_u32(&full[s]), ph);\n"
    "        const float *SA = (const float *)(st + A_BYTES + B_BYTES), *SB = (const float *)(st + A_BYTES + B_BYTES + 512);\n"
    "#pragma unroll\n"
    "        for (int h = 0; h < NH; h++) {\n"
    "          if (h >= halves) break;\n"
    "          wg_chunk(tmp, st + wg * 64 * 128, st + A_BYTES + h * 128 * 128);\n"
    "          if (p.sq) wg_promote_sq(acc + 64 * h, tmp, SA, sbq[h], r);\n"
    "          else wg_promote(acc + 64 * h, tmp, SA, SB + 128 * h, r, lane);\n"
    "        }\n"
    "        __syncwarp();\n"
    "        if (lane == 0) { // this warp is done with stage s (in both blocks' eyes)\n"
    "          if (MC) {\n"
    "            mbar_arrive_cluster(cluster_addr(smem_u32(&empty[s]), rank));\n"
    "            mbar_arrive_cluster(cluster_addr(smem_u32(&empty[s]), peer));\n"
    "          } else {\n"
    "            mbar_arrive(smem_u32(&empty[s]));\n"
    "          }\n"
    "        }\n"
    "        if (++s == ST) s = 0, ph ^= 1;\n"
    "      }\n"
    "      wg_group g = wg_resolve(p, tb, t, UNIT, BN, tiles_n);\n"
    "      g.m0 += rank * BM;\n"
    "      if (EPI && !p.c_f32 && p.ldc % 8 == 0 && (size_t)p.c % 16 == 0) {\n"
    "        wg_store_staged(p, g, acc, halves, smem + ST * STAGE + wg * 64 * 528, 1 + wg, wg, lane, tid);\n"
    "      } else {\n"
    "#pragma unroll\n"
    "        for (int h = 0; h < NH; h++) {\n"
    "          wg_group gh = g;\n"
    "          gh.n0 += 128 * h;\n"
    "          if (h < halves) wg_store(p, gh, acc + 64 * h, r, lane);\n"
    "        }\n"
    "      }\n"
    "    }\n"
    "  }\n"
    "  if (MC) cluster_sync(); // no block leaves while the other may still signal its barriers\n"
    "}\n";

static const struct {
  int tma, wg, st; /* tma: 0 cp.async, 1 TMA + producer warp, 2 that with B tiles multicast to a
                      2-block cluster, 3 TMA with 128 x 256 tiles and a producer warpgroup, 4 that
                      with the results staged through shared memory (TMA ones: wgrad on blocks
                      runs the first cp.async variant) */
} variants[] = {
#define V(t, w, s) {t, w, s},
    GPU_WGMMA_VARIANTS(V)
#undef V
};
enum { N_VARIANTS = sizeof variants / sizeof variants[0] };

int gpu_wgmma_n_variants(void) { return N_VARIANTS; }

static int variant_wide(int v) { return variants[v].tma >= 3; }
static int variant_bn(int v) { return variant_wide(v) ? 256 : 128; }
static unsigned variant_threads(int v) {
  return 128u * (unsigned)variants[v].wg + (variant_wide(v) ? 128u : variants[v].tma ? 32u : 0u);
}
/* dynamic shared memory of a variant (mirrors STAGE in the source, then the staged epilogue's
 * two 64 x 528-byte buffers, + 1 KiB for alignment) */
static unsigned variant_smem(int v) {
  int bm = 64 * variants[v].wg, bn = variant_bn(v), epi = variants[v].tma == 4 ? 2 * 64 * 528 : 0;
  int stage = variants[v].tma ? bm * 128 + bn * 128 + 1024 * (bn / 128) : (bm * 128 + bn * 128 + (bm + bn) * 4 + 1023) / 1024 * 1024;
  return (unsigned)(stage * variants[v].st + epi + 1024);
}
static void variant_name(int v, char *name, size_t len) {
  if (variants[v].tma == 4) snprintf(name, len, "wg_fp8_wides_s%d", variants[v].st);
  else if (variants[v].tma == 3) snprintf(name, len, "wg_fp8_wide_s%d", variants[v].st);
  else if (variants[v].tma == 2) snprintf(name, len, "wg_fp8_mc_s%d", variants[v].st);
  else if (variants[v].tma) snprintf(name, len, "wg_fp8_tma_s%d", variants[v].st);
  else snprintf(name, len, "wg_fp8_w%d_s%d", variants[v].wg, variants[v].st);
}

const char *gpu_wgmma_source(void) {
  static char *src;
  if (src) return src;
  char *s = NULL, line[512];
  size_t len = 0, cap = 0;
  snprintf(line, sizeof line, "#define WG_MAX_E %d\n#define WG_PRODUCER_REGS %d\n#define WG_MATH_REGS %d\n", GPU_WGMMA_MAX_E,
           WIDE_PRODUCER_REGS, WIDE_MATH_REGS);
  append(&s, &len, &cap, line);
  /* wgmma m64n128k32 e4m3 x e4m3 -> f32 keeps 64 accumulators a thread; inline PTX names each */
  append(&s, &len, &cap, "__device__ __forceinline__ void wg_mma_n128(float *d, unsigned long long da, unsigned long long db, int scale_d) {\n"
                         "  asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %66, 0;\\n\"\n"
                         "    \"wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {");
  for (int i = 0; i < 64; i++) {
    snprintf(line, sizeof line, "%s%%%d", i ? "," : "", i);
    append(&s, &len, &cap, line);
  }
  append(&s, &len, &cap, "}, %64, %65, p, 1, 1;\\n}\\n\"\n    : ");
  for (int i = 0; i < 64; i++) {
    snprintf(line, sizeof line, "%s\"+f\"(d[%d])", i ? ", " : "", i);
    append(&s, &len, &cap, line);
  }
  append(&s, &len, &cap, "\n    : \"l\"(da), \"l\"(db), \"r\"(scale_d));\n}\n");
  append(&s, &len, &cap, body);
  for (int v = 0; v < N_VARIANTS; v++) {
    char name[64];
    variant_name(v, name, sizeof name);
    if (variants[v].tma)
      snprintf(line, sizeof line,
               "extern \"C\" __global__ void %s__launch_bounds__(%u, 1) %s(const __grid_constant__ tmap_t ta, "
               "const __grid_constant__ tmap_t tb, const wg_args p) { wg_fp8_tma<%d, %d, %d, %d>(ta, tb, p); }\n",
               variants[v].tma == 2 ? "__cluster_dims__(2, 1, 1) " : "", variant_threads(v), name, variants[v].st,
               variants[v].tma == 2, variant_bn(v) / 128, variants[v].tma == 4);
    else
      snprintf(line, sizeof line, "extern \"C\" __global__ void __launch_bounds__(%u, 1) %s(const wg_args p) { wg_fp8_gemm<%d, %d>(p); }\n",
               variant_threads(v), name, variants[v].wg, variants[v].st);
    append(&s, &len, &cap, line);
  }
  return src = s;
}

struct gpu_wgmma {
  gpu_ctx *g;
  void *module;
  void *fn[N_VARIANTS];
  int blocks_per_sm[N_VARIANTS];
  int variant, cp_variant; /* the chosen one; the first cp.async one (wgrad under a TMA choice) */
};

/* the kernel's parameter block, laid out as struct wg_args in the source */
typedef struct {
  gpu_ptr a, sa, b, sb, c, counts, sq;
  int64_t K, M, N, ldc, ld, S;
  int32_t E, mode, c_f32, pad_;
} wg_args;

gpu_wgmma *gpu_wgmma_new(gpu_ctx *g, const char *arch, const char *cache_dir, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!arch || strcmp(arch, "sm_90a") != 0) return NULL; /* wgmma is sm_90a only: not an error */
  const char *src = gpu_wgmma_source();
  gpu_wgmma *w = calloc(1, sizeof *w);
  if (!src || !w) {
    free(w);
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  w->g = g;
  gpu_nvrtc_opts o = {.arch = arch, .cache_dir = cache_dir};
  gpu_nvrtc_out out;
  if (gpu_nvrtc_compile("wgmma_fp8", src, &o, &out, err, errlen) != 0) {
    free(w);
    return NULL;
  }
  int rc = gpu_module_load(g, out.image, &w->module, "wgmma_fp8");
  gpu_nvrtc_out_free(&out);
  const int optin = gpu_info(g)->smem_optin;
  w->cp_variant = -1;
  for (int v = 0; rc == 0 && v < N_VARIANTS; v++) {
    char name[64];
    variant_name(v, name, sizeof name);
    unsigned smem = variant_smem(v);
    rc = gpu_function(g, w->module, name, &w->fn[v]);
    if (rc == 0 && (int)smem > optin) {
      w->fn[v] = NULL; /* does not fit this device */
      continue;
    }
    if (rc == 0 && variants[v].tma >= 3) { /* setmaxnreg: the split assumes the launch's registers */
      int regs = 0;
      rc = gpu_function_regs(g, w->fn[v], &regs);
      if (rc == 0 && (regs != WIDE_LAUNCH_REGS || variant_threads(v) != 384)) {
        w->fn[v] = NULL; /* the producer's decrease would not cover the math warps' increase: a hang */
        continue;
      }
    }
    if (rc == 0) rc = gpu_set_max_smem(g, w->fn[v], (int)smem);
    /* blocks an SM: shared memory (plus the group table's ~3 KiB and 1 KiB the system keeps
       a block) and 64 K registers, at 224 a thread (the cp.async variants use ~220, the TMA
       ones 168); shared memory is the tighter bound for every variant today */
    int by_smem = (int)(228 * 1024 / (smem + 4096)), by_regs = 65536 / ((int)variant_threads(v) * 224);
    w->blocks_per_sm[v] = by_smem < by_regs ? by_smem : by_regs;
    if (w->blocks_per_sm[v] < 1) w->blocks_per_sm[v] = 1;
    if (!variants[v].tma && w->cp_variant < 0) w->cp_variant = v;
  }
  if (rc == 0 && w->cp_variant < 0) {
    gpu_wgmma_free(w);
    snprintf(err, errlen, "wgmma grouped GEMM: no cp.async variant fits this device's shared memory");
    return NULL;
  }
  if (rc != 0) {
    snprintf(err, errlen, "%s", gpu_error(g));
    gpu_wgmma_free(w);
    return NULL;
  }
  const char *env = getenv("MOEC_WGMMA_VARIANT");
  gpu_wgmma_set_variant(w, env && *env ? atoi(env) : 0);
  return w;
}

void gpu_wgmma_free(gpu_wgmma *w) {
  if (!w) return;
  if (w->module) gpu_module_unload(w->g, w->module);
  free(w);
}

void gpu_wgmma_set_variant(gpu_wgmma *w, int v) {
  if (v < 0 || v >= N_VARIANTS || !w->fn[v]) v = w->fn[0] ? 0 : w->cp_variant;
  w->variant = v;
}

/* v's kernel over tiles_bound tiles at most: a persistent grid of the blocks that fit (pairs of
 * blocks for the multicast variant, whose units are two tiles; tiles_bound then counts units) */
static int launch(gpu_wgmma *w, int v, void **args, int64_t tiles_bound, int E, char *err, size_t errlen) {
  if (E < 1 || E > GPU_WGMMA_MAX_E) {
    snprintf(err, errlen, "wgmma grouped GEMM: %d experts (1 to %d supported); without MOEC_FP8_GEMM=wgmma they run on cuBLASLt",
             E, GPU_WGMMA_MAX_E);
    return -1;
  }
  int64_t slots = (int64_t)gpu_info(w->g)->sm_count * w->blocks_per_sm[v];
  if (tiles_bound < 1) tiles_bound = 1;
  if (variants[v].tma == 2) slots /= 2;
  unsigned grid[3] = {(unsigned)(tiles_bound < slots ? tiles_bound : slots) * (variants[v].tma == 2 ? 2u : 1u), 1, 1},
           block[3] = {variant_threads(v), 1, 1};
  if (gpu_launch(w->g, w->fn[v], "wgmma_fp8", grid, block, variant_smem(v), args) != 0) {
    snprintf(err, errlen, "%s", gpu_error(w->g));
    return -1;
  }
  return 0;
}

static int check_dims(const char *what, int64_t x, int64_t mult, char *err, size_t errlen) {
  if (x > 0 && x % mult == 0) return 0;
  snprintf(err, errlen, "wgmma grouped GEMM: %s = %lld is not a positive multiple of %lld", what, (long long)x,
           (long long)mult);
  return -1;
}

int gpu_wgmma_fp8_rows(gpu_wgmma *w, gpu_ptr counts, int64_t E, int64_t S, int64_t N, int64_t K, gpu_ptr qa,
                       gpu_ptr sa, gpu_ptr qb, gpu_ptr sb, gpu_ptr sq, cg_dtype tc, gpu_ptr c, int64_t ldc, char *err,
                       size_t errlen) {
  if (check_dims("K", K, 128, err, errlen) || check_dims(sq ? "N (weights as squares)" : "N", N, sq ? 128 : 16, err, errlen) ||
      check_dims("ldc", ldc, 2, err, errlen))
    return -1;
  if (S == 0) return 0;
  wg_args a = {qa, sa, qb, sq ? 0 : sb, c, counts, sq, K, 0, N, ldc, 0, S, (int32_t)E, 0, tc == CG_DT_F32, 0};
  const int v = w->variant;
  const int64_t bm = 64 * variants[v].wg * (variants[v].tma == 2 ? 2 : 1), bn = variant_bn(v),
                tiles = (S / bm + E) * ((N + bn - 1) / bn);
  if (!variants[v].tma) {
    void *args[] = {&a};
    return launch(w, v, args, tiles, (int)E, err, errlen);
  }
  /* TMA boxes of 128 bytes of K by 128 rows: A (S, K) (rows past S read as zeros), B (E N, K)
     (by 64 rows, a half tile, for the multicast variant; 256 for the wide one) */
  _Alignas(64) unsigned char ta[128], tb[128];
  if (gpu_tensor_map_u8_2d(w->g, ta, qa, (uint64_t)S, (uint64_t)K, 128, 128) != 0 ||
      gpu_tensor_map_u8_2d(w->g, tb, qb, (uint64_t)(E * N), (uint64_t)K, 128,
                           variants[v].tma == 2 ? 64 : (unsigned)variant_bn(v)) != 0) {
    snprintf(err, errlen, "wgmma grouped GEMM: %s", gpu_error(w->g));
    return -1;
  }
  void *args[] = {ta, tb, &a};
  return launch(w, v, args, tiles, (int)E, err, errlen);
}

int gpu_wgmma_fp8_wgrad(gpu_wgmma *w, gpu_ptr counts, int64_t E, int64_t S, int64_t M, int64_t N, int64_t ld,
                        gpu_ptr qa, gpu_ptr sa, gpu_ptr qb, gpu_ptr sb, cg_dtype tc, gpu_ptr c, char *err, size_t errlen) {
  if (check_dims("M", M, 16, err, errlen) || check_dims("N", N, 16, err, errlen) ||
      (ld && check_dims("ld", ld, 128, err, errlen)))
    return -1;
  wg_args a = {qa, sa, qb, sb, c, counts, 0, 0, M, N, N, ld, S, (int32_t)E, 1, tc == CG_DT_F32, 0};
  const int v = variants[w->variant].tma && !ld ? w->cp_variant : w->variant;
  const int64_t bm = 64 * variants[v].wg * (variants[v].tma == 2 ? 2 : 1), bn = variant_bn(v),
                tiles = E * ((M + bm - 1) / bm) * ((N + bn - 1) / bn);
  if (!variants[v].tma) {
    void *args[] = {&a};
    return launch(w, v, args, tiles, (int)E, err, errlen);
  }
  _Alignas(64) unsigned char ta[128], tb[128];
  if (gpu_tensor_map_u8_2d(w->g, ta, qa, (uint64_t)M, (uint64_t)ld, 128, 128) != 0 ||
      gpu_tensor_map_u8_2d(w->g, tb, qb, (uint64_t)N, (uint64_t)ld, 128,
                           variants[v].tma == 2 ? 64 : (unsigned)variant_bn(v)) != 0) {
    snprintf(err, errlen, "wgmma grouped GEMM: %s", gpu_error(w->g));
    return -1;
  }
  void *args[] = {ta, tb, &a};
  return launch(w, v, args, tiles, (int)E, err, errlen);
}
