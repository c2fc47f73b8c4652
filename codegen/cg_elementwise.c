/* cg_elementwise.c -- elementwise kernels (ck_silu_*, ck_mul_*, ck_add_*), casts (bf16 by
 * round to nearest even), fill, slice_cols and two-stage column sums, for f32 and bf16. */
#include "cg_family.h"

static const char *const src =
    "// Elementwise ops (ck_dense.c), casts, fills, column slices and column sums.\n"
    "// Grid-stride loops; y may alias an input, as on the CPU.\n"
    "\n"
    "template <class TI, class TO> __device__ void cast(const TI *x, TO *y, i64 n) {\n"
    "  ew_loop(n, aligned16(x) && aligned16(y), EW_BODY {\n"
    "    EW_N;\n"
    "    float v[N];\n"
    "    ldn<N>(x + i, v);\n"
    "    stn<N>(y + i, v);\n"
    "  });\n"
    "}\n"
    "\n"
    "// sigmoid without overflow: exp of a non-positive argument only (ck_dense.c's sigmoidf).\n"
    "__device__ __forceinline__ float sigmoid(float x) {\n"
    "  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));\n"
    "  float e = expf(x);\n"
    "  return e / (1.0f + e);\n"
    "}\n"
    "\n"
    "template <class T> __device__ void silu_fwd(const T *x, T *y, i64 n) {\n"
    "  ew_loop(n, aligned16(x) && aligned16(y), EW_BODY {\n"
    "    EW_N;\n"
    "    float v[N];\n"
    "    ldn<N>(x + i, v);\n"
    "    for (int j = 0; j < N; j++) v[j] *= sigmoid(v[j]);\n"
    "    stn<N>(y + i, v);\n"
    "  });\n"
    "}\n"
    "\n"
    "// d/dx x s(x) = s (1 + x (1 - s))\n"
    "template <class T> __device__ void silu_bwd(const T *x, const T *dy, T *dx, i64 n) {\n"
    "  ew_loop(n, aligned16(x) && aligned16(dy) && aligned16(dx), EW_BODY {\n"
    "    EW_N;\n"
    "    float v[N], g[N];\n"
    "    ldn<N>(x + i, v);\n"
    "    ldn<N>(dy + i, g);\n"
    "    for (int j = 0; j < N; j++) {\n"
    "      const float s = sigmoid(v[j]);\n"
    "      g[j] = g[j] * s * (1.0f + v[j] * (1.0f - s));\n"
    "    }\n"
    "    stn<N>(dx + i, g);\n"
    "  });\n"
    "}\n"
    "\n"
    "template <class T> __device__ void mul_fwd(const T *a, const T *b, T *y, i64 n) {\n"
    "  ew_loop(n, aligned16(a) && aligned16(b) && aligned16(y), EW_BODY {\n"
    "    EW_N;\n"
    "    float u[N], v[N];\n"
    "    ldn<N>(a + i, u);\n"
    "    ldn<N>(b + i, v);\n"
    "    for (int j = 0; j < N; j++) u[j] *= v[j];\n"
    "    stn<N>(y + i, u);\n"
    "  });\n"
    "}\n"
    "\n"
    "// da, db may be NULL; all reads come before the writes (da/db may alias dy).\n"
    "template <class T> __device__ void mul_bwd(const T *a, const T *b, const T *dy, T *da, T *db, i64 n) {\n"
    "  ew_loop(n, aligned16(a) && aligned16(b) && aligned16(dy) && aligned16(da) && aligned16(db), EW_BODY {\n"
    "    EW_N;\n"
    "    float g[N], u[N], v[N], o[N];\n"
    "    ldn<N>(dy + i, g);\n"
    "    ldn<N>(a + i, u);\n"
    "    ldn<N>(b + i, v);\n"
    "    if (da) {\n"
    "      for (int j = 0; j < N; j++) o[j] = g[j] * v[j];\n"
    "      stn<N>(da + i, o);\n"
    "    }\n"
    "    if (db) {\n"
    "      for (int j = 0; j < N; j++) o[j] = g[j] * u[j];\n"
    "      stn<N>(db + i, o);\n"
    "    }\n"
    "  });\n"
    "}\n"
    "\n"
    "template <class T> __device__ void add_fwd(const T *a, const T *b, T *y, i64 n) {\n"
    "  ew_loop(n, aligned16(a) && aligned16(b) && aligned16(y), EW_BODY {\n"
    "    EW_N;\n"
    "    float u[N], v[N];\n"
    "    ldn<N>(a + i, u);\n"
    "    ldn<N>(b + i, v);\n"
    "    for (int j = 0; j < N; j++) u[j] += v[j];\n"
    "    stn<N>(y + i, u);\n"
    "  });\n"
    "}\n"
    "\n"
    "template <class T> __device__ void add_bwd(const T *dy, T *da, T *db, i64 n) {\n"
    "  GRID_LOOP(i, n) {\n"
    "    T g = dy[i];\n"
    "    if (da && da != dy) da[i] = g;\n"
    "    if (db && db != dy) db[i] = g;\n"
    "  }\n"
    "}\n"
    "\n"
    "template <class T> __device__ void fill(T *y, i64 n, float v) {\n"
    "  GRID_LOOP(i, n) st(y + i, v);\n"
    "}\n"
    "\n"
    "// y[r, :] = x[r, start : start + w]\n"
    "template <class T> __device__ void slice_cols(const T *x, T *y, i64 rows, i64 W, i64 start, i64 w) {\n"
    "  // 16-byte chunks (e values) when every row start is 16-byte aligned\n"
    "  constexpr i64 e = 16 / sizeof(T);\n"
    "  const bool vec = w % e == 0 && W % e == 0 && start % e == 0 && aligned16(x) && aligned16(y);\n"
    "  const i64 q = vec ? w / e : w; // chunks per row\n"
    "  GRID_LOOP(i, rows * q) {\n"
    "    const i64 r = i / q, c = i - r * q;\n"
    "    if (vec) *(u32x4 *)(y + r * w + c * e) = *(const u32x4 *)(x + r * W + start + c * e);\n"
    "    else y[i] = x[r * W + start + c];\n"
    "  }\n"
    "}\n"
    "\n"
    "// Column sums in two deterministic stages. Stage 1, grid (ceil(M/NT_EW), P):\n"
    "// part[p, c] = sum of x[r, c] over the COLSUM_ROWS rows of chunk p, in row order.\n"
    "template <class T> __device__ void colsum_partial(const T *x, float *part, i64 N, i64 M) {\n"
    "  const i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x, p = blockIdx.y;\n"
    "  if (c >= M) return;\n"
    "  const i64 r1 = (p + 1) * COLSUM_ROWS < N ? (p + 1) * COLSUM_ROWS : N;\n"
    "  float acc = 0.0f;\n"
    "  for (i64 r = p * COLSUM_ROWS; r < r1; r++) acc += ld(x + r * M + c);\n"
    "  part[p * M + c] = acc;\n"
    "}\n"
    "\n"
    "// Stage 2: out[c] = (accumulate ? out[c] : 0) + sum_p part[p, c], chunks in order.\n"
    "__device__ void colsum_final(const float *part, float *out, i64 P, i64 M, int accumulate) {\n"
    "  GRID_LOOP(c, M) {\n"
    "    float acc = accumulate ? out[c] : 0.0f;\n"
    "    // (unrolled: eight loads in flight ahead of the adds, in the same order; a thread a\n"
    "    // column leaves most SMs idle, so each thread's latency is the kernel's)\n"
    "#pragma unroll 8\n"
    "    for (i64 p = 0; p < P; p++) acc += part[p * M + c];\n"
    "    out[c] = acc;\n"
    "  }\n"
    "}\n"
    ;

void cg_emit_elementwise(cg_buf *b, const cg_variant *v, int emu) {
  (void)v;
  cg_puts(b, src);
  const char *kv[9];
  for (int x = 0; x < CG_DT_COUNT; x++) {
    for (int y = 0; y < CG_DT_COUNT; y++) {
      cg_dtype_kv(kv, (cg_dtype)x, (cg_dtype)y);
      cg_entry(b, CG_NT_EW, "moec_cast_${x}_${w}", "const ${X} *x, ${W} *y, i64 n", "cast<${X}, ${W}>", kv, emu);
    }
  }
  for (int x = 0; x < CG_DT_COUNT; x++) {
    cg_dtype_kv(kv, (cg_dtype)x, (cg_dtype)x);
    cg_entry(b, CG_NT_EW, "moec_silu_fwd_${x}", "const ${X} *x, ${X} *y, i64 n", "silu_fwd<${X}>", kv, emu);
    cg_entry(b, CG_NT_EW, "moec_silu_bwd_${x}", "const ${X} *x, const ${X} *dy, ${X} *dx, i64 n", "silu_bwd<${X}>", kv, emu);
    cg_entry(b, CG_NT_EW, "moec_mul_fwd_${x}", "const ${X} *a, const ${X} *b, ${X} *y, i64 n", "mul_fwd<${X}>", kv, emu);
    cg_entry(b, CG_NT_EW, "moec_mul_bwd_${x}", "const ${X} *a, const ${X} *b, const ${X} *dy, ${X} *da, ${X} *db, i64 n",
             "mul_bwd<${X}>", kv, emu);
    cg_entry(b, CG_NT_EW, "moec_add_fwd_${x}", "const ${X} *a, const ${X} *b, ${X} *y, i64 n", "add_fwd<${X}>", kv, emu);
    cg_entry(b, CG_NT_EW, "moec_add_bwd_${x}", "const ${X} *dy, ${X} *da, ${X} *db, i64 n", "add_bwd<${X}>", kv, emu);
    cg_entry(b, CG_NT_EW, "moec_fill_${x}", "${X} *y, i64 n, float value", "fill<${X}>", kv, emu);
    cg_entry(b, CG_NT_EW, "moec_slice_cols_${x}", "const ${X} *x, ${X} *y, i64 rows, i64 W, i64 start, i64 w",
             "slice_cols<${X}>", kv, emu);
    cg_entry(b, CG_NT_EW, "moec_colsum_partial_${x}", "const ${X} *x, float *part, i64 N, i64 M", "colsum_partial<${X}>",
             kv, emu);
  }
  cg_entry(b, CG_NT_EW, "moec_colsum_final", "const float *part, float *out, i64 P, i64 M, int accumulate",
           "colsum_final", kv, emu);
}
