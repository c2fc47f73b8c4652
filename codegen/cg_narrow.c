/* cg_narrow.c -- f32 GEMMs with a narrow output: C (m, n) = op(A) (m, k) . op(B) (k, n) with
 * n <= CG_NARROW, every such f32 GEMM of the executor (rt_cuda_narrow_ok). They were made for
 * the router's logits (T, H) . (H, E) and the gate's gradient (T, H)^T . (T, E), which cuBLASLt
 * runs as SIMT sgemm tiles: 0.048 and 0.035 ms a call at genos_1b's shapes on an H200, against
 * 0.024 and 0.027 here (bench/RESULTS.md). Each is one read of the wide operand. (The third,
 * dx = dlogits . w^T, k = E, was slower here than on cuBLASLt and stays there.) Every sum is
 * taken in a fixed order, so results repeat run to run. */
#include <stdio.h>

#include "cg_family.h"

static const char *const src =
    "// Narrow f32 GEMMs (cg_narrow.c). op(A)[i, p] = ta ? a[p lda + i] : a[i lda + p], op(B)\n"
    "// likewise with tb; C rows ldc apart. fmaf throughout (NVRTC's --fmad=false leaves it fused).\n"
    "// NWT, the kernels' template parameter: their most columns, 8 or 16 (cg_kernels.h's CG_NARROW)\n"
    "constexpr int NK_ROWS = 32;   // narrow_n: rows a block (8 warps, 4 rows a warp)\n"
    "constexpr int NK_CHUNK = 256; // narrow_n: K staged a chunk at a time (NK_CHUNK x NWT floats)\n"
    "constexpr int NT_ROWS = 128;  // narrow_tn: K rows a partial sum\n"
    "struct alignas(16) f32x4 {\n"
    "  float v[4];\n"
    "};\n"
    "__device__ __forceinline__ float opb(const float *b, i64 ldb, int tb, i64 p, i64 j) { return tb ? b[j * ldb + p] : b[p * ldb + j]; }\n"
    "\n"
    "// n <= NWT, ta = 0: a warp takes 4 rows of C, its lanes 4 consecutive p of each at a time\n"
    "// (16-byte loads where k, lda and a allow), op(B) staged transposed in shared memory (bt[j]\n"
    "// [p], conflict-free for those lanes); each lane's sums run over p in order, then the warp's\n"
    "// butterfly. Grid: ceil(m / NK_ROWS) blocks.\n"
    "template <int NWT>\n"
    "__device__ void narrow_n(const float *a, i64 lda, const float *b, i64 ldb, int tb, float *c, i64 ldc, i64 m, i64 n, i64 k) {\n"
    "  __shared__ f32x4 bt4[NWT * NK_CHUNK / 4]; // 16-byte aligned\n"
    "  float *bt = bt4[0].v;\n"
    "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
    "  const i64 i0 = (i64)blockIdx.x * NK_ROWS + warp * 4;\n"
    "  const bool vec = k % 4 == 0 && lda % 4 == 0 && aligned16(a);\n"
    "  float acc[4][NWT];\n"
    "#pragma unroll\n"
    "  for (int r = 0; r < 4; r++)\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < NWT; j++) acc[r][j] = 0.0f;\n"
    "  for (i64 c0 = 0; c0 < k; c0 += NK_CHUNK) {\n"
    "    const i64 kc = k - c0 < NK_CHUNK ? k - c0 : NK_CHUNK;\n"
    "    __syncthreads(); // the last chunk's readers are done\n"
    "    for (int j = 0; j < n; j++) // (no index divisions: a 64-bit one is ~100 instructions)\n"
    "      for (int p = threadIdx.x; p < kc; p += blockDim.x) bt[j * NK_CHUNK + p] = opb(b, ldb, tb, c0 + p, j);\n"
    "    __syncthreads();\n"
    "    if (vec) {\n"
    "      for (i64 p = lane * 4; p < kc; p += 128) {\n"
    "        f32x4 x[4];\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < 4; r++) {\n"
    "          const i64 i = i0 + r < m ? i0 + r : m - 1; // past the end: a real row, not stored\n"
    "          x[r] = *(const f32x4 *)(a + i * lda + c0 + p);\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NWT; j++) {\n"
    "          if (j >= n) break;\n"
    "          const f32x4 w = *(const f32x4 *)(bt + j * NK_CHUNK + p);\n"
    "#pragma unroll\n"
    "          for (int r = 0; r < 4; r++)\n"
    "#pragma unroll\n"
    "            for (int q = 0; q < 4; q++) acc[r][j] = fmaf(x[r].v[q], w.v[q], acc[r][j]);\n"
    "        }\n"
    "      }\n"
    "    } else {\n"
    "      for (i64 p = lane; p < kc; p += 32) {\n"
    "        float x[4];\n"
    "#pragma unroll\n"
    "        for (int r = 0; r < 4; r++) x[r] = a[(i0 + r < m ? i0 + r : m - 1) * lda + c0 + p];\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NWT; j++) {\n"
    "          if (j >= n) break;\n"
    "          const float w = bt[j * NK_CHUNK + p];\n"
    "#pragma unroll\n"
    "          for (int r = 0; r < 4; r++) acc[r][j] = fmaf(x[r], w, acc[r][j]);\n"
    "        }\n"
    "      }\n"
    "    }\n"
    "  }\n"
    "#pragma unroll\n"
    "  for (int r = 0; r < 4; r++)\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < NWT; j++) {\n"
    "      if (j >= n) break;\n"
    "      const float s = warp_sum(acc[r][j]);\n"
    "      if (lane == j && i0 + r < m) c[(i0 + r) * ldc + j] = s;\n"
    "    }\n"
    "}\n"
    "\n"
    "// n <= NWT, ta = 1 (a reduction over op(A)'s long side): stage 1, part[P][i][j] = the sum\n"
    "// over rows p in [P NT_ROWS, (P + 1) NT_ROWS) of a[p lda + i] op(B)[p, j], a thread per\n"
    "// column i (a warp reads 32 consecutive floats of a row); grid (ceil(m / blockDim), P).\n"
    "template <int NWT>\n"
    "__device__ void narrow_tn_partial(const float *a, i64 lda, const float *b, i64 ldb, int tb, float *part, i64 m, i64 n, i64 k) {\n"
    "  __shared__ float bs[NT_ROWS * NWT];\n"
    "  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x, p0 = (i64)blockIdx.y * NT_ROWS;\n"
    "  const i64 rows = k - p0 < NT_ROWS ? k - p0 : NT_ROWS;\n"
    "  for (int e = threadIdx.x; e < (int)(rows * n); e += blockDim.x) { // < NT_ROWS x NWT: 32-bit\n"
    "    const int r = e / (int)n, j = e % (int)n;\n"
    "    bs[r * NWT + j] = opb(b, ldb, tb, p0 + r, j);\n"
    "  }\n"
    "  __syncthreads();\n"
    "  if (i >= m) return;\n"
    "  float acc[NWT];\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < NWT; j++) acc[j] = 0.0f;\n"
    "  for (i64 r0 = 0; r0 < rows; r0 += 16) {\n"
    "    float x[16]; // 16 loads in flight before the sums\n"
    "#pragma unroll\n"
    "    for (int q = 0; q < 16; q++) x[q] = r0 + q < rows ? a[(p0 + r0 + q) * lda + i] : 0.0f;\n"
    "#pragma unroll\n"
    "    for (int q = 0; q < 16; q++) {\n"
    "      if (r0 + q >= rows) break;\n"
    "#pragma unroll\n"
    "      for (int j = 0; j < NWT; j++)\n"
    "        if (j < n) acc[j] = fmaf(x[q], bs[(r0 + q) * NWT + j], acc[j]);\n"
    "    }\n"
    "  }\n"
    "  float *o = part + ((i64)blockIdx.y * m + i) * n;\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < NWT; j++)\n"
    "    if (j < n) o[j] = acc[j];\n"
    "}\n"
    "// Stage 2: c[i, j] = sum over the P partials in order.\n"
    "__device__ void narrow_tn_final(const float *part, float *c, i64 ldc, i64 m, i64 n, i64 P) {\n"
    "  GRID_LOOP(e, m * n) {\n"
    "    float s = 0.0f;\n"
    "#pragma unroll 8\n"
    "    for (i64 q = 0; q < P; q++) s += part[q * m * n + e];\n"
    "    c[e / n * ldc + e % n] = s;\n"
    "  }\n"
    "}\n";

void cg_emit_narrow(cg_buf *b, const cg_variant *v, int emu) {
  (void)v;
  cg_puts(b, src);
  const char *kv[9];
  cg_dtype_kv(kv, CG_DT_F32, CG_DT_F32);
  for (int w = 8; w <= CG_NARROW; w *= 2) { /* the columns: 8 (the router's experts) or 16 */
    char name[64], impl[64], name2[64], impl2[64];
    snprintf(name, sizeof name, "moec_narrow_n_%d", w), snprintf(impl, sizeof impl, "narrow_n<%d>", w);
    snprintf(name2, sizeof name2, "moec_narrow_tn_partial_%d", w), snprintf(impl2, sizeof impl2, "narrow_tn_partial<%d>", w);
    cg_entry(b, CG_NT_EW, name, "const float *a, i64 lda, const float *b, i64 ldb, int tb, float *c, i64 ldc, i64 m, i64 n, i64 k",
             impl, kv, emu);
    cg_entry(b, CG_NT_EW, name2, "const float *a, i64 lda, const float *b, i64 ldb, int tb, float *part, i64 m, i64 n, i64 k",
             impl2, kv, emu);
  }
  cg_entry(b, CG_NT_EW, "moec_narrow_tn_final", "const float *part, float *c, i64 ldc, i64 m, i64 n, i64 P",
           "narrow_tn_final", kv, emu);
}
