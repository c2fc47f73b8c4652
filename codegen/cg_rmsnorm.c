/* cg_rmsnorm.c -- RMSNorm forward, input gradient, and the weight gradient's per-row scale
 * and partial column sums (finished by the elementwise module's colsum_final). Activations
 * and weights each f32 or bf16. */
#include "cg_family.h"

static const char *const src =
    "// RMSNorm (ck_rmsnorm_fwd / _bwd): one block per row, the mean of squares in double, the\n"
    "// scale and every product in float in the CPU's order, so results match it to the last bit\n"
    "// except where the double sums round differently.\n"
    "\n"
    "__device__ __forceinline__ float rms_scale(double ss, i64 H, float eps) {\n"
    "  float var = (float)(ss / (double)H);\n"
    "  return 1.0f / sqrtf(var + eps);\n"
    "}\n"
    "\n"
    "// A row's columns as 16-byte chunks of 8 (a thread's in order) where H % 8 == 0 and every\n"
    "// row pointer is 16-byte aligned, else one at a time: f(width<N>(), i) takes [i, i + N).\n"
    "template <class F> __device__ __forceinline__ void row_loop(i64 H, bool vec, F f) {\n"
    "  const i64 n8 = vec ? H / 8 * 8 : 0;\n"
    "  for (i64 i = (i64)threadIdx.x * 8; i < n8; i += (i64)blockDim.x * 8) f(width<8>(), i);\n"
    "  for (i64 i = n8 + threadIdx.x; i < H; i += blockDim.x) f(width<1>(), i);\n"
    "}\n"
    "template <class TX> __device__ __forceinline__ double row_sumsq(const TX *x, i64 H, bool vec) {\n"
    "  double ss = 0.0;\n"
    "  row_loop(H, vec, EW_BODY {\n"
    "    EW_N;\n"
    "    float v[N];\n"
    "    ldn<N>(x + i, v);\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < N; j++) ss += (double)v[j] * (double)v[j];\n"
    "  });\n"
    "  return ss;\n"
    "}\n"
    "\n"
    "// y = w * (x * r); y may alias x (each thread writes only what it read).\n"
    "template <class TX, class TW> __device__ void rmsnorm_fwd(const TX *x, const TW *w, TX *y, i64 nt, i64 H, float eps) {\n"
    "  __shared__ double sh[32];\n"
    "  const i64 off = (i64)blockIdx.x * H;\n"
    "  const bool vec = H % 8 == 0 && aligned16(x + off) && aligned16(y + off) && aligned16(w);\n"
    "  const float r = rms_scale(block_sum(row_sumsq(x + off, H, vec), sh), H, eps);\n"
    "  row_loop(H, vec, EW_BODY {\n"
    "    EW_N;\n"
    "    float xv[N], wv[N], o[N];\n"
    "    ldn<N>(x + off + i, xv);\n"
    "    ldn<N>(w + i, wv);\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < N; j++) o[j] = wv[j] * (xv[j] * r);\n"
    "    stn<N>(y + off + i, o);\n"
    "  });\n"
    "}\n"
    "\n"
    "// dx = r w dy - (r^3 / H) x sum(dy w x) (+ res, after rounding: fuse-residual); dx may alias dy\n"
    "// or res.\n"
    "template <class TX, class TW> __device__ void rmsnorm_bwd_x(const TX *x, const TW *w, const TX *dy, const TX *res, TX *dx, i64 nt, i64 H, float eps) {\n"
    "  __shared__ double sh[32];\n"
    "  const i64 off = (i64)blockIdx.x * H;\n"
    "  const bool vec = H % 8 == 0 && aligned16(x + off) && aligned16(dy + off) && aligned16(dx + off) && aligned16(w) &&\n"
    "                   (!res || aligned16(res + off));\n"
    "  double ss = 0.0, dot = 0.0;\n"
    "  row_loop(H, vec, EW_BODY {\n"
    "    EW_N;\n"
    "    float xv[N], dv[N], wv[N];\n"
    "    ldn<N>(x + off + i, xv);\n"
    "    ldn<N>(dy + off + i, dv);\n"
    "    ldn<N>(w + i, wv);\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < N; j++) {\n"
    "      const double xd = xv[j];\n"
    "      ss += xd * xd;\n"
    "      dot += (double)dv[j] * wv[j] * xd;\n"
    "    }\n"
    "  });\n"
    "  ss = block_sum(ss, sh);\n"
    "  dot = block_sum(dot, sh);\n"
    "  const float r = rms_scale(ss, H, eps);\n"
    "  const float c = (float)(dot * r * r * r / (double)H);\n"
    "  row_loop(H, vec, EW_BODY {\n"
    "    EW_N;\n"
    "    float xv[N], dv[N], wv[N], o[N];\n"
    "    ldn<N>(x + off + i, xv);\n"
    "    ldn<N>(dy + off + i, dv);\n"
    "    ldn<N>(w + i, wv);\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < N; j++) o[j] = r * wv[j] * dv[j] - c * xv[j];\n"
    "    if (res) {\n"
    "      float rv[N];\n"
    "      ldn<N>(res + off + i, rv);\n"
    "#pragma unroll\n"
    "      for (int j = 0; j < N; j++) o[j] = rv[j] + rnd_as(dx, o[j]);\n"
    "    }\n"
    "    stn<N>(dx + off + i, o);\n"
    "  });\n"
    "}\n"
    "\n"
    "// rstd[t] = rsqrt(mean(x[t]^2) + eps), for the weight gradient.\n"
    "template <class TX> __device__ void rmsnorm_rstd(const TX *x, float *rstd, i64 nt, i64 H, float eps) {\n"
    "  __shared__ double sh[32];\n"
    "  const i64 off = (i64)blockIdx.x * H;\n"
    "  const double ss = block_sum(row_sumsq(x + off, H, H % 8 == 0 && aligned16(x + off)), sh);\n"
    "  if (threadIdx.x == 0) rstd[blockIdx.x] = rms_scale(ss, H, eps);\n"
    "}\n"
    "\n"
    "// dw term, stage 1 of a column sum (finished by colsum_final, accumulating into dw):\n"
    "// part[p, c] = sum over the rows of chunk p of dy * x * rstd, the CPU's term, in row order.\n"
    "template <class TX> __device__ void rmsnorm_bwd_w_partial(const TX *x, const TX *dy, const float *rstd, float *part, i64 nt, i64 H) {\n"
    "  const i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x, p = blockIdx.y;\n"
    "  if (c >= H) return;\n"
    "  const i64 r1 = (p + 1) * COLSUM_ROWS < nt ? (p + 1) * COLSUM_ROWS : nt;\n"
    "  float acc = 0.0f;\n"
    "  for (i64 r = p * COLSUM_ROWS; r < r1; r++) acc += ld(dy + r * H + c) * ld(x + r * H + c) * rstd[r];\n"
    "  part[p * H + c] = acc;\n"
    "}\n"
    ;

void cg_emit_rmsnorm(cg_buf *b, const cg_variant *v, int emu) {
  (void)v;
  cg_puts(b, src);
  const char *kv[9];
  for (int x = 0; x < CG_DT_COUNT; x++) {
    for (int w = 0; w < CG_DT_COUNT; w++) {
      cg_dtype_kv(kv, (cg_dtype)x, (cg_dtype)w);
      cg_entry(b, CG_NT_ROW, "moec_rmsnorm_fwd_${x}_${w}",
               "const ${X} *x, const ${W} *w, ${X} *y, i64 nt, i64 H, float eps", "rmsnorm_fwd<${X}, ${W}>", kv, emu);
      cg_entry(b, CG_NT_ROW, "moec_rmsnorm_bwd_x_${x}_${w}",
               "const ${X} *x, const ${W} *w, const ${X} *dy, const ${X} *res, ${X} *dx, i64 nt, i64 H, float eps",
               "rmsnorm_bwd_x<${X}, ${W}>", kv, emu);
    }
    cg_dtype_kv(kv, (cg_dtype)x, (cg_dtype)x);
    cg_entry(b, CG_NT_ROW, "moec_rmsnorm_rstd_${x}", "const ${X} *x, float *rstd, i64 nt, i64 H, float eps",
             "rmsnorm_rstd<${X}>", kv, emu);
    cg_entry(b, CG_NT_EW, "moec_rmsnorm_bwd_w_partial_${x}",
             "const ${X} *x, const ${X} *dy, const float *rstd, float *part, i64 nt, i64 H",
             "rmsnorm_bwd_w_partial<${X}>", kv, emu);
  }
}
