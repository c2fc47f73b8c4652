/* gpu_wgmma.c -- the FP8 grouped GEMM of gpu_wgmma.h: its CUDA source, the module and the
 * launches. */
#include "gpu_wgmma.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_nvrtc.h"

/* wgmma m64n128k32 e4m3 x e4m3 -> f32: 64 accumulator registers a thread, written out by
 * wg_prelude since inline PTX names each one. */
static void append(char **s, size_t *len, size_t *cap, const char *t) {
  size_t n = strlen(t);
  if (*len + n + 1 > *cap) {
    size_t nc = (*cap ? *cap * 2 : 16384) + n;
    char *p = realloc(*s, nc);
    if (!p) {
      free(*s);
      *s = NULL;
      *cap = 0;
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

static const char body[] =
    "typedef unsigned char u8;\n"
    "typedef unsigned short u16;\n"
    "typedef unsigned int u32;\n"
    "typedef unsigned long long u64;\n"
    "typedef long long i64;\n"
    "\n"
    "// One launch's problem. mode 0 (rows): group e has counts[e] rows of A and C, K fixed;\n"
    "// mode 1 (wgrad): group e has M rows, K = its counts padded to 128 (gpu_wgmma.h).\n"
    "struct wg_args {\n"
    "  const u8 *a; const float *sa; const u8 *b; const float *sb; void *c;\n"
    "  const int *counts;\n"
    "  i64 K, M, N, ldc;\n"
    "  int E, mode, c_f32;\n"
    "};\n"
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
    "// Group e's operands, from the per-group prefixes the block computed.\n"
    "struct wg_group {\n"
    "  const u8 *a, *b; const float *sa, *sb; i64 m, k, sa_ld, sb_ld, c_row0; i64 c_off;\n"
    "};\n"
    "\n"
    "template <int WG, int ST>\n"
    "__device__ __forceinline__ void wg_fp8_gemm(const wg_args &p) {\n"
    "  constexpr int BM = 64 * WG, BN = 128, T = 128 * WG;\n"
    "  constexpr int A_BYTES = BM * 128, B_BYTES = BN * 128;\n"
    "  constexpr int STAGE = (A_BYTES + B_BYTES + (BM + BN) * 4 + 1023) / 1024 * 1024;\n"
    "  extern __shared__ u8 smem_raw[];\n"
    "  u8 *smem = (u8 *)(((size_t)smem_raw + 1023) & ~(size_t)1023);\n"
    "  __shared__ int s_t0[WG_MAX_E + 1];\n"
    "  __shared__ i64 s_pa[WG_MAX_E], s_ps[WG_MAX_E];\n"
    "  __shared__ int s_cnt[WG_MAX_E];\n"
    "  const int tid = threadIdx.x, E = p.E;\n"
    "  const int tiles_n = (int)((p.N + BN - 1) / BN);\n"
    "  if (tid == 0) { // per-group prefixes: rows (or padded tokens), scale floats, tiles\n"
    "    i64 pa = 0, ps = 0;\n"
    "    int t0 = 0;\n"
    "    for (int e = 0; e < E; e++) {\n"
    "      int m = p.counts[e] > 0 ? p.counts[e] : 0;\n"
    "      s_cnt[e] = m, s_pa[e] = pa, s_ps[e] = ps, s_t0[e] = t0;\n"
    "      if (p.mode == 0) {\n"
    "        t0 += (m + BM - 1) / BM * tiles_n;\n"
    "        pa += m;\n"
    "        ps += ((i64)(m + 15) / 16 * 16 * (p.K / 128) + 3) / 4 * 4;\n"
    "      } else {\n"
    "        t0 += (int)((p.M + BM - 1) / BM) * tiles_n;\n"
    "        pa += (m + 127) / 128 * 128;\n"
    "      }\n"
    "    }\n"
    "    s_t0[E] = t0;\n"
    "  }\n"
    "  __syncthreads();\n"
    "  const int total = s_t0[E];\n"
    "  const int wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;\n"
    "  const i64 wsb = ((p.N + 15) / 16 * 16 * (p.K / 128) + 3) / 4 * 4; // a weight's scale floats (rows mode)\n"
    "  for (int t = blockIdx.x; t < total; t += gridDim.x) {\n"
    "    int e = 0;\n"
    "    while (e + 1 < E && s_t0[e + 1] <= t) e++;\n"
    "    const int local = t - s_t0[e], mt = local / tiles_n, nt = local % tiles_n;\n"
    "    wg_group g;\n"
    "    if (p.mode == 0) {\n"
    "      g.m = s_cnt[e], g.k = p.K;\n"
    "      g.a = p.a + s_pa[e] * p.K, g.sa = p.sa + s_ps[e], g.sa_ld = (g.m + 15) / 16 * 16;\n"
    "      g.b = p.b + (i64)e * p.N * p.K, g.sb = p.sb + (i64)e * wsb, g.sb_ld = (p.N + 15) / 16 * 16;\n"
    "      g.c_off = s_pa[e] * p.ldc;\n"
    "    } else {\n"
    "      g.m = p.M, g.k = (s_cnt[e] + 127) / 128 * 128;\n"
    "      g.a = p.a + p.M * s_pa[e], g.sa = p.sa + p.M * (s_pa[e] / 128), g.sa_ld = p.M;\n"
    "      g.b = p.b + p.N * s_pa[e], g.sb = p.sb + p.N * (s_pa[e] / 128), g.sb_ld = p.N;\n"
    "      g.c_off = (i64)e * p.M * p.N;\n"
    "    }\n"
    "    const i64 m0 = (i64)mt * BM, n0 = (i64)nt * BN, lda = g.k;\n"
    "    const int nk = (int)(g.k / 128);\n"
    "    // one stage: A (BM x 128 B) | B (BN x 128 B) | A scales (BM f32) | B scales (BN f32)\n"
    "    auto load = [&](int s, int kc) {\n"
    "      u8 *st = smem + s * STAGE;\n"
    "      const u8 *ga = g.a + m0 * lda + kc * 128, *gb = g.b + n0 * lda + kc * 128;\n"
    "      for (int q = tid; q < BM * 8; q += T) {\n"
    "        const int r = q >> 3, c = q & 7;\n"
    "        const bool ok = m0 + r < g.m;\n"
    "        cp16(smem_u32(st + r * 128 + ((c ^ (r & 7)) << 4)), ok ? (const void *)(ga + r * lda + c * 16) : (const void *)p.a, ok ? 16 : 0);\n"
    "      }\n"
    "      for (int q = tid; q < BN * 8; q += T) {\n"
    "        const int r = q >> 3, c = q & 7;\n"
    "        const bool ok = n0 + r < p.N;\n"
    "        cp16(smem_u32(st + A_BYTES + r * 128 + ((c ^ (r & 7)) << 4)), ok ? (const void *)(gb + r * lda + c * 16) : (const void *)p.b, ok ? 16 : 0);\n"
    "      }\n"
    "      for (int q = tid; q < (BM + BN) / 4; q += T) {\n"
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
    "      const u64 da = desc_sw128(smem_u32(st + wg * 64 * 128)), db = desc_sw128(smem_u32(st + A_BYTES));\n"
    "      wg_fence();\n"
    "#pragma unroll\n"
    "      for (int kk = 0; kk < 4; kk++) wg_mma_n128(tmp, da + 2 * kk, db + 2 * kk, kk); // +32 bytes of K a step\n"
    "      wg_commit();\n"
    "      wg_wait0();\n"
    "#pragma unroll\n"
    "      for (int i = 0; i < 64; i++) reg_fence(tmp[i]);\n"
    "      // promote: this chunk's sums times its rows' and columns' scales, into f32\n"
    "      const float *SA = (const float *)(st + A_BYTES + B_BYTES), *SB = SA + BM;\n"
    "      const int r = wg * 64 + warp * 16 + lane / 4;\n"
    "      const float s0 = SA[r], s1 = SA[r + 8];\n"
    "#pragma unroll\n"
    "      for (int j = 0; j < 16; j++) {\n"
    "        const int c = 8 * j + 2 * (lane % 4);\n"
    "        const float b0 = SB[c], b1 = SB[c + 1];\n"
    "        acc[4 * j] += tmp[4 * j] * (s0 * b0);\n"
    "        acc[4 * j + 1] += tmp[4 * j + 1] * (s0 * b1);\n"
    "        acc[4 * j + 2] += tmp[4 * j + 2] * (s1 * b0);\n"
    "        acc[4 * j + 3] += tmp[4 * j + 3] * (s1 * b1);\n"
    "      }\n"
    "    }\n"
    "    cp_wait<0>();\n"
    "    __syncthreads(); // the next tile's loads reuse the stages\n"
    "    // store: thread holds rows r, r + 8 and columns 8j + 2(lane % 4) + {0, 1}\n"
    "    const i64 row = m0 + wg * 64 + warp * 16 + lane / 4;\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < 16; j++) {\n"
    "      const i64 col = n0 + 8 * j + 2 * (lane % 4);\n"
    "      if (col >= p.N) continue;\n"
    "#pragma unroll\n"
    "      for (int h = 0; h < 2; h++) {\n"
    "        if (row + 8 * h >= g.m) continue;\n"
    "        const i64 o = g.c_off + (row + 8 * h) * p.ldc + col;\n"
    "        if (p.c_f32) {\n"
    "          float2 v; v.x = acc[4 * j + 2 * h]; v.y = acc[4 * j + 2 * h + 1];\n"
    "          *(float2 *)((float *)p.c + o) = v;\n"
    "        } else {\n"
    "          *(u32 *)((u16 *)p.c + o) = bf16_bits(acc[4 * j + 2 * h]) | (bf16_bits(acc[4 * j + 2 * h + 1]) << 16);\n"
    "        }\n"
    "      }\n"
    "    }\n"
    "  }\n"
    "}\n";

/* the stage size and dynamic shared memory of a variant (mirrors STAGE in the source) */
static unsigned variant_smem(int wg, int st) {
  int bm = 64 * wg, bn = 128, stage = (bm * 128 + bn * 128 + (bm + bn) * 4 + 1023) / 1024 * 1024;
  return (unsigned)(stage * st + 1024);
}

static const struct {
  int wg, st;
} variants[] = {
#define V(w, s) {w, s},
    GPU_WGMMA_VARIANTS(V)
#undef V
};
enum { N_VARIANTS = sizeof variants / sizeof variants[0] };

int gpu_wgmma_n_variants(void) { return N_VARIANTS; }

const char *gpu_wgmma_source(void) {
  static char *src;
  if (src) return src;
  char *s = NULL, line[160];
  size_t len = 0, cap = 0;
  snprintf(line, sizeof line, "#define WG_MAX_E %d\n", GPU_WGMMA_MAX_E);
  append(&s, &len, &cap, line);
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
    snprintf(line, sizeof line,
             "extern \"C\" __global__ void __launch_bounds__(%d, 1) wg_fp8_w%d_s%d(const wg_args p) { wg_fp8_gemm<%d, %d>(p); }\n",
             128 * variants[v].wg, variants[v].wg, variants[v].st, variants[v].wg, variants[v].st);
    append(&s, &len, &cap, line);
  }
  return src = s;
}

struct gpu_wgmma {
  gpu_ctx *g;
  void *module;
  void *fn[N_VARIANTS];
  int blocks_per_sm[N_VARIANTS];
  int variant;
};

/* the kernel's parameter block, laid out as struct wg_args in the source */
typedef struct {
  gpu_ptr a, sa, b, sb, c, counts;
  int64_t K, M, N, ldc;
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
  for (int v = 0; rc == 0 && v < N_VARIANTS; v++) {
    char name[64];
    snprintf(name, sizeof name, "wg_fp8_w%d_s%d", variants[v].wg, variants[v].st);
    unsigned smem = variant_smem(variants[v].wg, variants[v].st);
    rc = gpu_function(g, w->module, name, &w->fn[v]);
    if (rc == 0 && (int)smem > optin) {
      w->fn[v] = NULL; /* does not fit this device */
      continue;
    }
    if (rc == 0) rc = gpu_set_max_smem(g, w->fn[v], (int)smem);
    /* blocks an SM: shared memory (plus the group table's ~3 KiB and 1 KiB the system keeps
       a block) and 64 K registers (ptxas: ~220 a thread) */
    int by_smem = (int)(228 * 1024 / (smem + 4096)), by_regs = 65536 / (128 * variants[v].wg * 224);
    w->blocks_per_sm[v] = by_smem < by_regs ? by_smem : by_regs;
    if (w->blocks_per_sm[v] < 1) w->blocks_per_sm[v] = 1;
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
  if (v < 0 || v >= N_VARIANTS || !w->fn[v]) v = 0;
  w->variant = v;
}

static int launch(gpu_wgmma *w, wg_args *a, int64_t tiles_bound, char *err, size_t errlen) {
  const int v = w->variant;
  if (!w->fn[v]) {
    snprintf(err, errlen, "wgmma grouped GEMM: variant %d does not fit this device's shared memory", v);
    return -1;
  }
  if (a->E < 1 || a->E > GPU_WGMMA_MAX_E) {
    snprintf(err, errlen, "wgmma grouped GEMM: %d experts (1 to %d supported); use the cuBLASLt path (MOEC_FP8_GEMM=cublas)",
             (int)a->E, GPU_WGMMA_MAX_E);
    return -1;
  }
  int64_t slots = (int64_t)gpu_info(w->g)->sm_count * w->blocks_per_sm[v];
  unsigned grid[3] = {(unsigned)(tiles_bound < slots ? (tiles_bound > 0 ? tiles_bound : 1) : slots), 1, 1},
           block[3] = {128u * (unsigned)variants[v].wg, 1, 1};
  void *args[] = {a};
  if (gpu_launch(w->g, w->fn[v], "wgmma_fp8", grid, block, variant_smem(variants[v].wg, variants[v].st), args) != 0) {
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
                       gpu_ptr sa, gpu_ptr qb, gpu_ptr sb, cg_dtype tc, gpu_ptr c, int64_t ldc, char *err,
                       size_t errlen) {
  if (check_dims("K", K, 128, err, errlen) || check_dims("N", N, 16, err, errlen) ||
      check_dims("ldc", ldc, 2, err, errlen))
    return -1;
  if (S == 0) return 0;
  wg_args a = {qa, sa, qb, sb, c, counts, K, 0, N, ldc, (int32_t)E, 0, tc == CG_DT_F32, 0};
  const int64_t bm = 64 * variants[w->variant].wg, tiles = (S / bm + E) * ((N + 127) / 128);
  return launch(w, &a, tiles, err, errlen);
}

int gpu_wgmma_fp8_wgrad(gpu_wgmma *w, gpu_ptr counts, int64_t E, int64_t M, int64_t N, gpu_ptr qa, gpu_ptr sa,
                        gpu_ptr qb, gpu_ptr sb, cg_dtype tc, gpu_ptr c, char *err, size_t errlen) {
  if (check_dims("M", M, 16, err, errlen) || check_dims("N", N, 16, err, errlen)) return -1;
  wg_args a = {qa, sa, qb, sb, c, counts, 0, M, N, N, (int32_t)E, 1, tc == CG_DT_F32, 0};
  const int64_t bm = 64 * variants[w->variant].wg, tiles = E * ((M + bm - 1) / bm) * ((N + 127) / 128);
  return launch(w, &a, tiles, err, errlen);
}
