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
    "// y = w * (x * r); y may alias x.\n"
    "template <class TX, class TW> __device__ void rmsnorm_fwd(const TX *x, const TW *w, TX *y, i64 nt, i64 H, float eps) {\n"
    "  __shared__ double sh[32];\n"
    "  const i64 off = (i64)blockIdx.x * H;\n"
    "  double ss = 0.0;\n"
    "  for (i64 i = threadIdx.x; i < H; i += blockDim.x) {\n"
    "    double v = ld(x + off + i);\n"
    "    ss += v * v;\n"
    "  }\n"
    "  const float r = rms_scale(block_sum(ss, sh), H, eps);\n"
    "  for (i64 i = threadIdx.x; i < H; i += blockDim.x) st(y + off + i, ld(w + i) * (ld(x + off + i) * r));\n"
    "}\n"
    "\n"
    "// dx = r w dy - (r^3 / H) x sum(dy w x); dx may alias dy.\n"
    "template <class TX, class TW> __device__ void rmsnorm_bwd_x(const TX *x, const TW *w, const TX *dy, TX *dx, i64 nt, i64 H, float eps) {\n"
    "  __shared__ double sh[32];\n"
    "  const i64 off = (i64)blockIdx.x * H;\n"
    "  double ss = 0.0, dot = 0.0;\n"
    "  for (i64 i = threadIdx.x; i < H; i += blockDim.x) {\n"
    "    double xv = ld(x + off + i);\n"
    "    ss += xv * xv;\n"
    "    dot += (double)ld(dy + off + i) * ld(w + i) * xv;\n"
    "  }\n"
    "  ss = block_sum(ss, sh);\n"
    "  dot = block_sum(dot, sh);\n"
    "  const float r = rms_scale(ss, H, eps);\n"
    "  const float c = (float)(dot * r * r * r / (double)H);\n"
    "  for (i64 i = threadIdx.x; i < H; i += blockDim.x) st(dx + off + i, r * ld(w + i) * ld(dy + off + i) - c * ld(x + off + i));\n"
    "}\n"
    "\n"
    "// rstd[t] = rsqrt(mean(x[t]^2) + eps), for the weight gradient.\n"
    "template <class TX> __device__ void rmsnorm_rstd(const TX *x, float *rstd, i64 nt, i64 H, float eps) {\n"
    "  __shared__ double sh[32];\n"
    "  const i64 off = (i64)blockIdx.x * H;\n"
    "  double ss = 0.0;\n"
    "  for (i64 i = threadIdx.x; i < H; i += blockDim.x) {\n"
    "    double v = ld(x + off + i);\n"
    "    ss += v * v;\n"
    "  }\n"
    "  ss = block_sum(ss, sh);\n"
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
               "const ${X} *x, const ${W} *w, const ${X} *dy, ${X} *dx, i64 nt, i64 H, float eps",
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
