/* cg_grouped.c -- the expert ops over expert-sorted rows (ck_grouped.h) on the device: the
 * permutation from route's sort, permute / unpermute, the routing weights' gradient, the
 * probabilities, column copies (stack, unstack, pad_cols), the grouped GEMMs (forward, dgrad,
 * wgrad with K = an expert's rows) and the fused GroupedMLP's elementwise halves. Every kernel
 * reads the per-expert counts on the device: grids are sized by static upper bounds, so the
 * host never waits. The GEMMs are simple tiled kernels (GT x GT tiles through shared memory,
 * fp32 accumulation, one output per thread): correct first, the wgmma version comes later. */
#include "cg_family.h"

static const char *const src =
    "// perm[pos[i]] = i: route_fill's pos is where pair i went, so this is ck_expert_sort's perm.\n"
    "__device__ void perm_from_pos(const int *pos, int *perm, i64 np, int *err) {\n"
    "  GRID_LOOP(i, np) {\n"
    "    const int p = pos[i];\n"
    "    if (p >= 0 && p < np) perm[p] = (int)i;\n"
    "    else raise_err(err, CK_EINDEX);\n"
    "  }\n"
    "}\n"
    "\n"
    "// inv[perm[r]] = r (the sorted row of each pair).\n"
    "__device__ void perm_invert(const int *perm, int *inv, i64 np, int *err) {\n"
    "  GRID_LOOP(r, np) {\n"
    "    const int p = perm[r];\n"
    "    if (p >= 0 && p < np) inv[p] = (int)r;\n"
    "    else raise_err(err, CK_EINDEX);\n"
    "  }\n"
    "}\n"
    "\n"
    "// xs[r] = (w[perm[r]] *) x[perm[r] / k]; one block per sorted row.\n"
    "template <class T, class TW> __device__ void expert_permute(const T *x, const int *perm, const TW *w, T *xs, i64 nt, i64 k, i64 H, int *err) {\n"
    "  const i64 r = blockIdx.x;\n"
    "  if (r >= nt * k) return;\n"
    "  const i64 p = perm[r];\n"
    "  if (p < 0 || p >= nt * k) {\n"
    "    if (threadIdx.x == 0) raise_err(err, CK_EINDEX);\n"
    "    return;\n"
    "  }\n"
    "  const T *src = x + (p / k) * H;\n"
    "  if (w) {\n"
    "    const float s = ld(w + p);\n"
    "    for (i64 c = threadIdx.x; c < H; c += blockDim.x) st(xs + r * H + c, s * ld(src + c));\n"
    "  } else {\n"
    "    for (i64 c = threadIdx.x; c < H; c += blockDim.x) st(xs + r * H + c, ld(src + c));\n"
    "  }\n"
    "}\n"
    "\n"
    "// out[t] = sum_j (w[t, j] *) ys[inv[t*k + j]], j in order from 0 (ck_expert_unpermute).\n"
    "template <class T, class TW> __device__ void expert_unpermute(const T *ys, const int *inv, const TW *w, T *out, i64 nt, i64 k, i64 H, int *err) {\n"
    "  const i64 t = blockIdx.x;\n"
    "  if (t >= nt) return;\n"
    "  for (i64 j = 0; j < k; j++)\n"
    "    if (inv[t * k + j] < 0 || inv[t * k + j] >= nt * k) {\n"
    "      if (threadIdx.x == 0) raise_err(err, CK_EINDEX);\n"
    "      return;\n"
    "    }\n"
    "  for (i64 c = threadIdx.x; c < H; c += blockDim.x) {\n"
    "    float acc = 0.0f;\n"
    "    for (i64 j = 0; j < k; j++) {\n"
    "      const float y = ld(ys + (i64)inv[t * k + j] * H + c);\n"
    "      if (w) acc += ld(w + t * k + j) * y;\n"
    "      else acc += y;\n"
    "    }\n"
    "    st(out + t * H + c, acc);\n"
    "  }\n"
    "}\n"
    "\n"
    "// dw[perm[r]] = dot(a[perm[r] / k], b[r]) in double; one block per sorted row.\n"
    "template <class TA, class TB> __device__ void expert_weight_grad(const TA *a, const TB *b, const int *perm, float *dw, i64 nt, i64 k, i64 H, int *err) {\n"
    "  __shared__ double sh[32];\n"
    "  const i64 r = blockIdx.x;\n"
    "  if (r >= nt * k) return;\n"
    "  const i64 p = perm[r];\n"
    "  if (p < 0 || p >= nt * k) {\n"
    "    if (threadIdx.x == 0) raise_err(err, CK_EINDEX);\n"
    "    return;\n"
    "  }\n"
    "  double d = 0.0;\n"
    "  for (i64 c = threadIdx.x; c < H; c += blockDim.x) d += (double)ld(a + (p / k) * H + c) * ld(b + r * H + c);\n"
    "  d = block_sum(d, sh);\n"
    "  if (threadIdx.x == 0) dw[p] = (float)d;\n"
    "}\n"
    "\n"
    "// p[r] = w[perm[r]] (dir 0) or dw[perm[r]] = dp[r] (dir 1).\n"
    "__device__ void expert_probs(const float *src, const int *perm, float *dst, i64 np, int dir, int *err) {\n"
    "  GRID_LOOP(r, np) {\n"
    "    const int p = perm[r];\n"
    "    if (p < 0 || p >= np) raise_err(err, CK_EINDEX);\n"
    "    else if (dir == 0) dst[r] = src[p];\n"
    "    else dst[p] = src[r];\n"
    "  }\n"
    "}\n"
    "\n"
    "// y[r, start + c] = x[r, c] for c < w; y has W columns (stack, unstack, pad_cols). With\n"
    "// ldx = W and start as the source column it slices instead (sx = 1).\n"
    "template <class TX, class TY> __device__ void copy_cols(const TX *x, TY *y, i64 rows, i64 w, i64 ldx, i64 sx, i64 ldy, i64 sy) {\n"
    "  // chunks of 8 columns when every row start of x and y is 16-byte aligned\n"
    "  const bool vec = w % 8 == 0 && (ldx * sizeof(TX)) % 16 == 0 && (sx * sizeof(TX)) % 16 == 0 &&\n"
    "                  (ldy * sizeof(TY)) % 16 == 0 && (sy * sizeof(TY)) % 16 == 0 && aligned16(x) && aligned16(y);\n"
    "  const i64 q = vec ? w / 8 : w; // chunks per row\n"
    "  GRID_LOOP(i, rows * q) {\n"
    "    const i64 r = i / q, c = i - r * q;\n"
    "    if (vec) {\n"
    "      float v[8];\n"
    "      ld8(x + r * ldx + sx + c * 8, v);\n"
    "      st8(y + r * ldy + sy + c * 8, v);\n"
    "    } else {\n"
    "      st(y + r * ldy + sy + c, ld(x + r * ldx + sx + c));\n"
    "    }\n"
    "  }\n"
    "}\n"
    "\n"
    "// The group of blockIdx.z: its first row and row count from counts, summed here (E is\n"
    "// small). 0 when the counts are valid.\n"
    "__device__ __forceinline__ int group_of(const int *counts, i64 S, i64 *off, i64 *n) {\n"
    "  const i64 e = blockIdx.z;\n"
    "  i64 o = 0;\n"
    "  for (i64 q = 0; q < e; q++) o += counts[q];\n"
    "  *off = o;\n"
    "  *n = counts[e];\n"
    "  return (*n < 0 || o < 0 || o + *n > S) ? -1 : 0;\n"
    "}\n"
    "\n"
    "// C[rows of e] = A[rows of e] . op(B[e]): A (S, K) with row stride lda, B[e] (K, N) row-major\n"
    "// (tb = 0) or (N, K) (tb = 1: dgrad's w^T), C with row stride ldc. Grid (N/GT, S/GT, E): the\n"
    "// row tiles past the group's count return at once. fp32 accumulation.\n"
    "template <class TA, class TB, class TC> __device__ void ggemm_rows(const TA *a, i64 lda, const TB *b, int tb, const int *counts, TC *c, i64 ldc, i64 S, i64 N, i64 K, int *err) {\n"
    "  __shared__ float As[GT][GT + 1], Bs[GT][GT + 1];\n"
    "  i64 off, n;\n"
    "  if (group_of(counts, S, &off, &n)) {\n"
    "    if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) raise_err(err, CK_EINDEX);\n"
    "    return;\n"
    "  }\n"
    "  const i64 r0 = (i64)blockIdx.y * GT, c0 = (i64)blockIdx.x * GT;\n"
    "  if (r0 >= n) return;\n"
    "  const int tx = threadIdx.x % GT, ty = threadIdx.x / GT;\n"
    "  const i64 r = r0 + ty, col = c0 + tx;\n"
    "  const TB *be = b + (i64)blockIdx.z * K * N;\n"
    "  float acc = 0.0f;\n"
    "  for (i64 k0 = 0; k0 < K; k0 += GT) {\n"
    "    As[ty][tx] = (r < n && k0 + tx < K) ? ld(a + (off + r) * lda + k0 + tx) : 0.0f;\n"
    "    const i64 kk = k0 + ty;\n"
    "    Bs[ty][tx] = (kk < K && col < N) ? ld(tb ? be + col * K + kk : be + kk * N + col) : 0.0f;\n"
    "    __syncthreads();\n"
    "    for (int q = 0; q < GT; q++) acc += As[ty][q] * Bs[q][tx];\n"
    "    __syncthreads();\n"
    "  }\n"
    "  if (r < n && col < N) st(c + (off + r) * ldc + col, acc);\n"
    "}\n"
    "\n"
    "// C[e] (M, N) = A[rows of e]^T . B[rows of e]: K = the group's row count (zero when it has\n"
    "// none). A (S, M) stride lda, B (S, N) stride ldb. Grid (N/GT, M/GT, E).\n"
    "template <class TA, class TB, class TC> __device__ void ggemm_wgrad(const TA *a, i64 lda, const TB *b, i64 ldb, const int *counts, TC *c, i64 S, i64 M, i64 N, int *err) {\n"
    "  __shared__ float As[GT][GT + 1], Bs[GT][GT + 1];\n"
    "  i64 off, n;\n"
    "  if (group_of(counts, S, &off, &n)) {\n"
    "    if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) raise_err(err, CK_EINDEX);\n"
    "    return;\n"
    "  }\n"
    "  const i64 i0 = (i64)blockIdx.y * GT, c0 = (i64)blockIdx.x * GT;\n"
    "  const int tx = threadIdx.x % GT, ty = threadIdx.x / GT;\n"
    "  float acc = 0.0f;\n"
    "  for (i64 k0 = 0; k0 < n; k0 += GT) {\n"
    "    const i64 kr = k0 + ty;\n"
    "    As[ty][tx] = (kr < n && i0 + tx < M) ? ld(a + (off + kr) * lda + i0 + tx) : 0.0f;\n"
    "    Bs[ty][tx] = (kr < n && c0 + tx < N) ? ld(b + (off + kr) * ldb + c0 + tx) : 0.0f;\n"
    "    __syncthreads();\n"
    "    for (int q = 0; q < GT; q++) acc += As[q][ty] * Bs[q][tx];\n"
    "    __syncthreads();\n"
    "  }\n"
    "  if (i0 + ty < M && c0 + tx < N) st(c + (i64)blockIdx.z * M * N + (i0 + ty) * N + c0 + tx, acc);\n"
    "}\n"
    "\n"
    "// db[e, c] = sum of dy[r, c] over the rows of e, in row order (ck_grouped_colsum's order).\n"
    "// Grid (N/NT_EW, 1, E), a thread per column.\n"
    "template <class T> __device__ void grouped_colsum(const T *dy, const int *counts, float *db, i64 S, i64 N, int *err) {\n"
    "  i64 off, n;\n"
    "  if (group_of(counts, S, &off, &n)) {\n"
    "    if (threadIdx.x == 0 && blockIdx.x == 0) raise_err(err, CK_EINDEX);\n"
    "    return;\n"
    "  }\n"
    "  const i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (c >= N) return;\n"
    "  float s = 0.0f;\n"
    "  for (i64 r = off; r < off + n; r++) s += ld(dy + r * N + c);\n"
    "  db[(i64)blockIdx.z * N + c] = s;\n"
    "}\n"
    "\n"
    "// ck_dense.c's sigmoidf.\n"
    "__device__ __forceinline__ float sigm(float x) {\n"
    "  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));\n"
    "  float e = expf(x);\n"
    "  return e / (1.0f + e);\n"
    "}\n"
    "\n"
    "// act[r, c] = p[r] * (silu(g) * u), (g | u) = gu[r] (row stride ldg): the GroupedMLP's\n"
    "// activation, in the CPU's order.\n"
    "template <class T> __device__ void mlp_act(const T *gu, i64 ldg, const float *p, T *act, i64 S, i64 F) {\n"
    "  GRID_LOOP(i, S * F) {\n"
    "    const i64 r = i / F, c = i % F;\n"
    "    const float g = ld(gu + r * ldg + c), u = ld(gu + r * ldg + F + c);\n"
    "    const float s = g * sigm(g);\n"
    "    st(act + i, p[r] * (s * u));\n"
    "  }\n"
    "}\n"
    "\n"
    "// ck_grouped_mlp_bwd after its GEMM: out[r] = dg | du | act | dp from dact (f32), the saved\n"
    "// gate_up and p. One block per row; dp summed in double.\n"
    "template <class TG, class TO> __device__ void mlp_bwd_rows(const float *dact, const TG *gu, const float *p, TO *out, i64 S, i64 F) {\n"
    "  __shared__ double sh[32];\n"
    "  const i64 r = blockIdx.x;\n"
    "  if (r >= S) return;\n"
    "  const i64 W = 3 * F + 1;\n"
    "  const float pr = p[r];\n"
    "  double dp = 0.0;\n"
    "  for (i64 c = threadIdx.x; c < F; c += blockDim.x) {\n"
    "    const float g = ld(gu + r * 2 * F + c), u = ld(gu + r * 2 * F + F + c), d = dact[r * F + c];\n"
    "    const float sg = sigm(g), s = g * sg, a = s * u;\n"
    "    dp += (double)d * a;\n"
    "    float da = pr * d;\n"
    "    st(out + r * W + F + c, da * s);\n"
    "    st(out + r * W + 2 * F + c, pr * a);\n"
    "    da *= u;\n"
    "    st(out + r * W + c, da * sg * (1.0f + g * (1.0f - sg)));\n"
    "  }\n"
    "  dp = block_sum(dp, sh);\n"
    "  if (threadIdx.x == 0) st(out + r * W + 3 * F, (float)dp);\n"
    "}\n";

static const char *const names[] = {"f32", "bf16"};
static const char *const ctypes[] = {"float", "bf16"};

void cg_emit_grouped(cg_buf *b, const cg_variant *v, int emu) {
  (void)v;
  cg_printf(b, "enum { GT = %d };\n", CG_GT);
  cg_puts(b, src);
  const char *kv[13];
  cg_dtype_kv(kv, CG_DT_F32, CG_DT_F32);
  cg_entry(b, CG_NT_EW, "moec_perm_from_pos", "const int *pos, int *perm, i64 np, int *err", "perm_from_pos", kv, emu);
  cg_entry(b, CG_NT_EW, "moec_perm_invert", "const int *perm, int *inv, i64 np, int *err", "perm_invert", kv, emu);
  cg_entry(b, CG_NT_EW, "moec_expert_probs", "const float *src, const int *perm, float *dst, i64 np, int dir, int *err",
           "expert_probs", kv, emu);
  for (int x = 0; x < CG_DT_COUNT; x++) {
    cg_dtype_kv(kv, (cg_dtype)x, (cg_dtype)x);
    cg_entry(b, CG_NT_RED, "moec_grouped_colsum_${x}", "const ${X} *dy, const int *counts, float *db, i64 S, i64 N, int *err",
             "grouped_colsum<${X}>", kv, emu);
    cg_entry(b, CG_NT_EW, "moec_mlp_act_${x}", "const ${X} *gu, i64 ldg, const float *p, ${X} *act, i64 S, i64 F",
             "mlp_act<${X}>", kv, emu);
    for (int w = 0; w < CG_DT_COUNT; w++) {
      cg_dtype_kv(kv, (cg_dtype)x, (cg_dtype)w);
      cg_entry(b, CG_NT_ROW, "moec_expert_permute_${x}_${w}",
               "const ${X} *x, const int *perm, const ${W} *w, ${X} *xs, i64 nt, i64 k, i64 H, int *err",
               "expert_permute<${X}, ${W}>", kv, emu);
      cg_entry(b, CG_NT_ROW, "moec_expert_unpermute_${x}_${w}",
               "const ${X} *ys, const int *inv, const ${W} *w, ${X} *out, i64 nt, i64 k, i64 H, int *err",
               "expert_unpermute<${X}, ${W}>", kv, emu);
      cg_entry(b, CG_NT_ROW, "moec_expert_weight_grad_${x}_${w}",
               "const ${X} *a, const ${W} *b, const int *perm, float *dw, i64 nt, i64 k, i64 H, int *err",
               "expert_weight_grad<${X}, ${W}>", kv, emu);
      cg_entry(b, CG_NT_EW, "moec_copy_cols_${x}_${w}",
               "const ${X} *x, ${W} *y, i64 rows, i64 w, i64 ldx, i64 sx, i64 ldy, i64 sy", "copy_cols<${X}, ${W}>", kv,
               emu);
      cg_entry(b, CG_NT_ROW, "moec_mlp_bwd_rows_${x}_${w}",
               "const float *dact, const ${X} *gu, const float *p, ${W} *out, i64 S, i64 F", "mlp_bwd_rows<${X}, ${W}>",
               kv, emu);
      for (int c = 0; c < CG_DT_COUNT; c++) {
        const char *k3[] = {"X", ctypes[x], "x", names[x], "W", ctypes[w], "w", names[w], "C", ctypes[c], "c", names[c], NULL};
        cg_entry(b, CG_GT * CG_GT, "moec_ggemm_rows_${x}_${w}_${c}",
                 "const ${X} *a, i64 lda, const ${W} *b, int tb, const int *counts, ${C} *c, i64 ldc, i64 S, i64 N, i64 K, "
                 "int *err",
                 "ggemm_rows<${X}, ${W}, ${C}>", k3, emu);
        cg_entry(b, CG_GT * CG_GT, "moec_ggemm_wgrad_${x}_${w}_${c}",
                 "const ${X} *a, i64 lda, const ${W} *b, i64 ldb, const int *counts, ${C} *c, i64 S, i64 M, i64 N, int *err",
                 "ggemm_wgrad<${X}, ${W}, ${C}>", k3, emu);
      }
    }
  }
}
