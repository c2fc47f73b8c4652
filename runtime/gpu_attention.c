/* gpu_attention.c -- the choice between cuDNN's fused attention (gpu_cudnn_attn.c), the flash
 * kernels (gpu_flash.c) and attention from cuBLASLt GEMMs and three small NVRTC kernels. In the latter, query head h = j*group + r
 * reads KV head j; for each r, one strided-batched GEMM covers every j. */
#include "gpu_attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_cudnn_attn.h"
#include "gpu_flash.h"
#include "gpu_nvrtc.h"

static const char *source =
    "typedef long long i64;\n"
    "#define INFINITY __int_as_float(0x7f800000)\n"
    "typedef unsigned int u32;\n"
    "struct bf16 { unsigned short bits; };\n"
    "__device__ __forceinline__ float ldv(const float *p) { return *p; }\n"
    "__device__ __forceinline__ float ldv(const bf16 *p) { return __uint_as_float((u32)p->bits << 16); }\n"
    "__device__ __forceinline__ void stv(float *p, float v) { *p = v; }\n"
    "// round to nearest even, NaN kept quiet (ck_float_to_bf16)\n"
    "__device__ __forceinline__ void stv(bf16 *p, float v) {\n"
    "  u32 u = __float_as_uint(v);\n"
    "  if ((u & 0x7fffffffu) > 0x7f800000u) { p->bits = (unsigned short)((u >> 16) | 0x40); return; }\n"
    "  u += 0x7fffu + ((u >> 16) & 1u);\n"
    "  p->bits = (unsigned short)(u >> 16);\n"
    "}\n"
    "__device__ float block_reduce(float v, bool is_max) {\n"
    "  __shared__ float part[32];\n"
    "  for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(0xffffffffu, v, o); v = is_max ? fmaxf(v, w) : v + w; }\n"
    "  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;\n"
    "  __syncthreads();\n"
    "  if (lane == 0) part[warp] = v;\n"
    "  __syncthreads();\n"
    "  v = lane < nw ? part[lane] : (is_max ? -INFINITY : 0.0f);\n"
    "  for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(0xffffffffu, v, o); v = is_max ? fmaxf(v, w) : v + w; }\n"
    "  return v;\n"
    "}\n"
    "// one block per score row r (head r / S, query r % S): P = softmax over the visible keys\n"
    "template <typename T> __device__ void softmax_fwd(const float *s, T *p, float *lse, i64 S, int causal) {\n"
    "  i64 r = blockIdx.x, q = r % S, n = causal ? q + 1 : S;\n"
    "  const float *row = s + r * S;\n"
    "  float m = -INFINITY;\n"
    "  for (i64 c = threadIdx.x; c < n; c += blockDim.x) m = fmaxf(m, row[c]);\n"
    "  m = block_reduce(m, true);\n"
    "  float sum = 0.0f;\n"
    "  for (i64 c = threadIdx.x; c < n; c += blockDim.x) sum += __expf(row[c] - m);\n"
    "  sum = block_reduce(sum, false);\n"
    "  float inv = 1.0f / sum;\n"
    "  for (i64 c = threadIdx.x; c < S; c += blockDim.x) stv(p + r * S + c, c < n ? __expf(row[c] - m) * inv : 0.0f);\n"
    "  if (threadIdx.x == 0) lse[r] = m + __logf(sum);\n"
    "}\n"
    "// D[h*S + q] = sum_c dout[q, h, c] * out[q, h, c]\n"
    "template <typename T> __device__ void rowdot(const T *dout, const T *out, float *D, i64 S, i64 nh, i64 hd) {\n"
    "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= nh * S) return;\n"
    "  i64 h = i / S, q = i % S;\n"
    "  const T *a = dout + q * nh * hd + h * hd, *b = out + q * nh * hd + h * hd;\n"
    "  float acc = 0.0f;\n"
    "  for (i64 c = 0; c < hd; c++) acc += ldv(a + c) * ldv(b + c);\n"
    "  D[i] = acc;\n"
    "}\n"
    "// dS = P * (dP - D[row]) in place of P; zero above the diagonal\n"
    "template <typename T> __device__ void softmax_bwd(T *p, const float *dp, const float *D, i64 rows, i64 S, int causal) {\n"
    "  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= rows * S) return;\n"
    "  i64 r = i / S, c = i % S, q = r % S;\n"
    "  float v = (causal && c > q) ? 0.0f : ldv(p + i) * (dp[i] - D[r]);\n"
    "  stv(p + i, v);\n"
    "}\n"
    "#define INST(T, N) \\\n"
    "  extern \"C\" __global__ void attn_softmax_fwd_##N(const float *s, T *p, float *lse, i64 S, int causal) { softmax_fwd<T>(s, p, lse, S, causal); } \\\n"
    "  extern \"C\" __global__ void attn_rowdot_##N(const T *dout, const T *out, float *D, i64 S, i64 nh, i64 hd) { rowdot<T>(dout, out, D, S, nh, hd); } \\\n"
    "  extern \"C\" __global__ void attn_softmax_bwd_##N(T *p, const float *dp, const float *D, i64 rows, i64 S, int causal) { softmax_bwd<T>(p, dp, D, rows, S, causal); }\n"
    "INST(float, f32)\n"
    "INST(bf16, bf16)\n";

const char *gpu_attention_source(void) { return source; }

struct gpu_attention {
  rt_cuda *k;
  gpu_ctx *g;
  gpu_blas *blas;
  void *module;
  void *fn[3][2]; /* softmax_fwd, rowdot, softmax_bwd x (f32, bf16) */
  gpu_ptr scores, p, lse, D;
  size_t cap_scores, cap_p, cap_lse, cap_D;
  gpu_flash *flash; /* NULL: gemm only (MOEC_ATTENTION=gemm, or a device older than sm_80) */
  gpu_cudnn_attn *cudnn; /* MOEC_ATTENTION=cudnn with the library loaded; else NULL */
};

gpu_attention *gpu_attention_new(rt_cuda *k, gpu_blas *b, char *err, size_t errlen) {
  gpu_attention *a = calloc(1, sizeof *a);
  if (!a) {
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  a->k = k;
  a->g = rt_cuda_gpu(k);
  a->blas = b;
  gpu_nvrtc_opts o;
  memset(&o, 0, sizeof o);
  o.arch = rt_cuda_arch(k);
  gpu_nvrtc_out out;
  if (gpu_nvrtc_compile("attention", source, &o, &out, err, errlen) != 0) {
    free(a);
    return NULL;
  }
  int rc = gpu_module_load(a->g, out.image, &a->module, "attention");
  gpu_nvrtc_out_free(&out);
  static const char *names[3] = {"attn_softmax_fwd", "attn_rowdot", "attn_softmax_bwd"};
  for (int i = 0; rc == 0 && i < 3; i++)
    for (int t = 0; rc == 0 && t < 2; t++) {
      char name[64];
      snprintf(name, sizeof name, "%s_%s", names[i], t ? "bf16" : "f32");
      rc = gpu_function(a->g, a->module, name, &a->fn[i][t]);
    }
  if (rc != 0) {
    snprintf(err, errlen, "%s", gpu_error(a->g));
    gpu_attention_free(a);
    return NULL;
  }
  const char *env = getenv("MOEC_ATTENTION");
  if (env && *env && strcmp(env, "gemm") != 0 && strcmp(env, "flash") != 0 && strcmp(env, "cudnn") != 0) {
    snprintf(err, errlen, "MOEC_ATTENTION=%s: expected flash, cudnn or gemm", env);
    gpu_attention_free(a);
    return NULL;
  }
  /* cuDNN's fused attention is the default (2.0-2.9x the flash kernels on an H200,
   * bench/RESULTS.md): without the library, or when it cannot make a handle, the default falls
   * back to flash (a named failure when cudnn was asked for). Never under MOEC_DETERMINISTIC=1,
   * even when asked for: its backward need not be deterministic. */
  const int asked_cudnn = env && strcmp(env, "cudnn") == 0;
  if ((asked_cudnn || !env || !*env) && !gpu_deterministic()) {
    a->cudnn = gpu_cudnn_attn_new(a->g, err, errlen);
    if (!a->cudnn && err[0] && asked_cudnn) { /* present but unusable: say so rather than run something else */
      gpu_attention_free(a);
      return NULL;
    }
    err[0] = '\0';
  }
  /* deterministic runs keep the flash forward's speed out: its backward adds dq atomically.
   * With cudnn, flash stays the path for what cuDNN does not take. */
  int want_flash = env && *env && strcmp(env, "cudnn") != 0 ? strcmp(env, "flash") == 0 : !gpu_deterministic();
  if (want_flash) {
    a->flash = gpu_flash_new(a->g, o.arch, NULL, err, errlen);
    if (!a->flash && err[0]) { /* a compile or load failure, not an old device */
      gpu_attention_free(a);
      return NULL;
    }
  }
  return a;
}

void gpu_attention_free(gpu_attention *a) {
  if (!a) return;
  gpu_free(a->g, a->scores);
  gpu_free(a->g, a->p);
  gpu_free(a->g, a->lse);
  gpu_free(a->g, a->D);
  gpu_flash_free(a->flash);
  gpu_cudnn_attn_free(a->cudnn);
  if (a->module) gpu_module_unload(a->g, a->module);
  free(a);
}

static int grow(gpu_attention *a, gpu_ptr *p, size_t *cap, size_t bytes, const char *what, char *err, size_t errlen) {
  if (*cap >= bytes) return 0;
  gpu_free(a->g, *p);
  *p = 0;
  *cap = 0;
  if (gpu_alloc(a->g, p, bytes, what) != 0) {
    snprintf(err, errlen, "%s", gpu_error(a->g));
    return -1;
  }
  *cap = bytes;
  return 0;
}

static size_t esize(cg_dtype t) { return t == CG_DT_BF16 ? 2 : 4; }

static int scratch(gpu_attention *a, const gpu_attn_dims *d, char *err, size_t errlen) {
  size_t ss = (size_t)(d->nh * d->seq * d->seq);
  size_t rows = (size_t)(d->nh * d->seq);
  return grow(a, &a->scores, &a->cap_scores, ss * 4, "attention scores", err, errlen) ||
         grow(a, &a->p, &a->cap_p, ss * esize(d->dt), "attention probabilities", err, errlen) ||
         grow(a, &a->lse, &a->cap_lse, rows * 4, "attention row statistics", err, errlen) ||
         grow(a, &a->D, &a->cap_D, rows * 4, "attention row statistics", err, errlen);
}

/* One strided-batched GEMM per query-head offset r within a KV group. */
typedef struct {
  gpu_ptr p;
  cg_dtype dt;
  int64_t ld, stride_j, off_r; /* elements */
  int trans;
} head_mat;

static int per_group(gpu_attention *a, const gpu_attn_dims *d, int64_t m, int64_t n, int64_t kk, float alpha,
                     head_mat A, head_mat B, head_mat C, int accumulate_over_r, char *err, size_t errlen) {
  int64_t group = d->nh / d->nkv;
  for (int64_t r = 0; r < group; r++) {
    gpu_mat ma = {A.dt, A.p + (gpu_ptr)(r * A.off_r) * esize(A.dt), A.ld, A.stride_j, A.trans};
    gpu_mat mb = {B.dt, B.p + (gpu_ptr)(r * B.off_r) * esize(B.dt), B.ld, B.stride_j, B.trans};
    gpu_mat mc = {C.dt, C.p + (gpu_ptr)(r * C.off_r) * esize(C.dt), C.ld, C.stride_j, 0};
    float beta = accumulate_over_r && r > 0 ? 1.0f : 0.0f;
    if (gpu_gemm(a->blas, m, n, kk, alpha, &ma, &mb, beta, &mc, (int)d->nkv, err, errlen)) return -1;
  }
  return 0;
}

static int launch(gpu_attention *a, int which, cg_dtype t, uint64_t blocks, void **args, char *err, size_t errlen) {
  unsigned grid[3] = {(unsigned)blocks, 1, 1}, block[3] = {256, 1, 1};
  if (blocks == 0) return 0;
  if (gpu_launch(a->g, a->fn[which][t == CG_DT_BF16], "attention", grid, block, 0, args) != 0) {
    snprintf(err, errlen, "%s", gpu_error(a->g));
    return -1;
  }
  return 0;
}

/* scores (nh, S, S) f32 = q k^T / sqrt(hd) for sequence b, then P and lse by the softmax. */
static int scores_and_p(gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, char *err, size_t errlen) {
  int64_t S = d->seq, nh = d->nh, nkv = d->nkv, hd = d->hd, group = nh / nkv;
  float scale = (float)(1.0 / sqrt((double)hd));
  head_mat A = {q, d->dt, nh * hd, group * hd, hd, 0};
  head_mat B = {k, d->dt, nkv * hd, hd, 0, 1};
  head_mat C = {a->scores, CG_DT_F32, S, group * S * S, S * S, 0};
  if (per_group(a, d, S, S, hd, scale, A, B, C, 0, err, errlen)) return -1;
  int causal = d->causal;
  void *args[] = {&a->scores, &a->p, &a->lse, &S, &causal};
  return launch(a, 0, d->dt, (uint64_t)(nh * S), args, err, errlen);
}

int gpu_attention_fwd_gemm(gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out,
                           char *err, size_t errlen) {
  if (d->nh % d->nkv) {
    snprintf(err, errlen, "attention: heads %lld not a multiple of kv_heads %lld", (long long)d->nh, (long long)d->nkv);
    return -1;
  }
  if (scratch(a, d, err, errlen)) return -1;
  int64_t S = d->seq, nh = d->nh, nkv = d->nkv, hd = d->hd, group = nh / nkv;
  size_t e = esize(d->dt);
  for (int64_t b = 0; b < d->B; b++) {
    gpu_ptr qb = q + (gpu_ptr)(b * S * nh * hd * e), kb = k + (gpu_ptr)(b * S * nkv * hd * e);
    gpu_ptr vb = v + (gpu_ptr)(b * S * nkv * hd * e), ob = out + (gpu_ptr)(b * S * nh * hd * e);
    if (scores_and_p(a, d, qb, kb, err, errlen)) return -1;
    head_mat A = {a->p, d->dt, S, group * S * S, S * S, 0};
    head_mat B = {vb, d->dt, nkv * hd, hd, 0, 0};
    head_mat C = {ob, d->dt, nh * hd, group * hd, hd, 0};
    if (per_group(a, d, S, hd, S, 1.0f, A, B, C, 0, err, errlen)) return -1;
  }
  return 0;
}

int gpu_attention_bwd_gemm(gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out,
                           gpu_ptr dout, gpu_ptr packed, char *err, size_t errlen) {
  if (d->nh % d->nkv) {
    snprintf(err, errlen, "attention: heads %lld not a multiple of kv_heads %lld", (long long)d->nh, (long long)d->nkv);
    return -1;
  }
  if (scratch(a, d, err, errlen)) return -1;
  int64_t S = d->seq, nh = d->nh, nkv = d->nkv, hd = d->hd, group = nh / nkv;
  int64_t cq = nh * hd, ck = nkv * hd, W = cq + 2 * ck;
  float scale = (float)(1.0 / sqrt((double)hd));
  size_t e = esize(d->dt);
  for (int64_t b = 0; b < d->B; b++) {
    gpu_ptr qb = q + (gpu_ptr)(b * S * cq * e), kb = k + (gpu_ptr)(b * S * ck * e), vb = v + (gpu_ptr)(b * S * ck * e);
    gpu_ptr ob = out + (gpu_ptr)(b * S * cq * e), db = dout + (gpu_ptr)(b * S * cq * e);
    gpu_ptr pk = packed + (gpu_ptr)(b * S * W * e);
    if (scores_and_p(a, d, qb, kb, err, errlen)) return -1;
    /* dV_j = sum over the group's heads of P_h^T dO_h */
    head_mat P = {a->p, d->dt, S, group * S * S, S * S, 1};
    head_mat dO = {db, d->dt, cq, group * hd, hd, 0};
    head_mat dV = {pk + (gpu_ptr)((cq + ck) * e), d->dt, W, hd, 0, 0};
    if (per_group(a, d, S, hd, S, 1.0f, P, dO, dV, 1, err, errlen)) return -1;
    /* dP_h = dO_h V_j^T into the scores buffer; D = rowsum(dO * O); dS = P (dP - D) in place of P */
    head_mat Vt = {vb, d->dt, ck, hd, 0, 1};
    head_mat dP = {a->scores, CG_DT_F32, S, group * S * S, S * S, 0};
    if (per_group(a, d, S, S, hd, 1.0f, dO, Vt, dP, 0, err, errlen)) return -1;
    void *rd_args[] = {&db, &ob, &a->D, &S, &nh, &hd};
    if (launch(a, 1, d->dt, (uint64_t)((nh * S + 255) / 256), rd_args, err, errlen)) return -1;
    int64_t rows = nh * S;
    int causal = d->causal;
    void *sb_args[] = {&a->p, &a->scores, &a->D, &rows, &S, &causal};
    if (launch(a, 2, d->dt, (uint64_t)((rows * S + 255) / 256), sb_args, err, errlen)) return -1;
    /* dQ_h = scale dS_h K_j; dK_j = scale sum over the group of dS_h^T Q_h */
    head_mat dS = {a->p, d->dt, S, group * S * S, S * S, 0};
    head_mat K = {kb, d->dt, ck, hd, 0, 0};
    head_mat dQ = {pk, d->dt, W, group * hd, hd, 0};
    if (per_group(a, d, S, hd, S, scale, dS, K, dQ, 0, err, errlen)) return -1;
    head_mat dSt = {a->p, d->dt, S, group * S * S, S * S, 1};
    head_mat Q = {qb, d->dt, cq, group * hd, hd, 0};
    head_mat dK = {pk + (gpu_ptr)(cq * e), d->dt, W, hd, 0, 0};
    if (per_group(a, d, S, hd, S, scale, dSt, Q, dK, 1, err, errlen)) return -1;
  }
  return 0;
}

int gpu_attention_uses_flash(const gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v,
                             gpu_ptr out) {
  /* the forward and the backward decide alike: dout and packed come from the same allocator */
  return a->flash && d->dt == CG_DT_BF16 && gpu_flash_supports(a->flash, d->hd) && d->nkv >= 1 &&
         d->nh % d->nkv == 0 && ((q | k | v | out) & 15) == 0;
}

int gpu_attention_uses_cudnn(const gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v,
                             gpu_ptr out) {
  return a->cudnn && d->dt == CG_DT_BF16 && gpu_cudnn_attn_supports(a->cudnn, d->hd) && d->nkv >= 1 &&
         d->nh % d->nkv == 0 && d->B >= 1 && d->seq >= 1 && ((q | k | v | out) & 15) == 0;
}

static gpu_cudnn_shape cudnn_shape(const gpu_attn_dims *d) {
  gpu_cudnn_shape s = {d->B, d->seq, d->nh, d->nkv, d->hd, d->causal != 0};
  return s;
}

int gpu_attention_fwd(gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out, char *err,
                      size_t errlen) {
  if (gpu_attention_uses_cudnn(a, d, q, k, v, out)) {
    const gpu_cudnn_shape s = cudnn_shape(d);
    return gpu_cudnn_attn_fwd_cached(a->cudnn, &s, q, k, v, out, err, errlen);
  }
  if (gpu_attention_uses_flash(a, d, q, k, v, out))
    return gpu_flash_fwd(a->flash, d->B, d->seq, d->nh, d->nkv, d->hd, d->causal, q, k, v, out, err, errlen);
  return gpu_attention_fwd_gemm(a, d, q, k, v, out, err, errlen);
}

int gpu_attention_bwd(gpu_attention *a, const gpu_attn_dims *d, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out,
                      gpu_ptr dout, gpu_ptr packed, char *err, size_t errlen) {
  if (gpu_attention_uses_cudnn(a, d, q, k, v, out) && ((dout | packed) & 15) == 0) {
    const gpu_cudnn_shape s = cudnn_shape(d);
    return gpu_cudnn_attn_bwd_cached(a->cudnn, &s, q, k, v, out, dout, packed, err, errlen);
  }
  if (gpu_attention_uses_flash(a, d, q, k, v, out) && ((dout | packed) & 15) == 0)
    return gpu_flash_bwd(a->flash, d->B, d->seq, d->nh, d->nkv, d->hd, d->causal, q, k, v, out, dout, packed, err,
                         errlen);
  return gpu_attention_bwd_gemm(a, d, q, k, v, out, dout, packed, err, errlen);
}

void gpu_attention_new_run(gpu_attention *a) {
  gpu_flash_new_run(a->flash);
  gpu_cudnn_attn_new_run(a->cudnn);
}

int gpu_attention_flash_variant(const gpu_attention *a, int64_t hd, int bwd, char *name, size_t len) {
  return a->flash ? gpu_flash_variant(a->flash, hd, bwd, name, len) : -1;
}
