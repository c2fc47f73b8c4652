/* test_gpu_attention.c -- GPU attention (runtime/gpu_attention.h) against the CPU reference
 * ck_attention_fwd/bwd, on fresh random inputs:
 *   B = 2, seq 64 / 200 / 1024, heads 16 / kv 8 and 6 / 2, head dim 64 and 128, causal (and
 *   two non-causal cases), bf16 and f32 storage;
 * bf16 through the flash kernels (every kernel variant of gpu_flash.h at seq 1024) and through
 * the GEMM path, f32 through the path gpu_attention_fwd/bwd take (GEMM). Error = max |gpu -
 * cpu| / max |cpu| per tensor (out, dq, dk, dv); the CPU reference is fed the bf16-rounded
 * inputs. Bounds: bf16 2e-2 for out, 3e-2 for the gradients (P and dS go through bf16 MMAs
 * and every output is rounded to bf16); f32 1e-4.
 *
 * Then cuDNN's fused attention (runtime/gpu_cudnn_attn.h, as MOEC_ATTENTION=cudnn takes it)
 * where libcudnn loads, on fresh inputs: B = 2, seq 64 / 200 / 333 / 1024, heads 16 / kv 8,
 * 6 / 2 and 4 / 4, head dim 64 and 128, causal and one non-causal case, bf16, against the
 * same CPU reference with the same bounds as flash (cuDNN computes in f32 with bf16 P and dS
 * operands, as flash does), and once the backward with no cached stats. Without the library:
 * "cudnn: skipped (libcudnn not found)", and the rest still counts.
 *
 * Then the timing at seq 8192, batch 1, heads 16 / kv 8, bf16, head dim 64 and 128: forward
 * and backward, the flash kernels (each variant) and cuDNN against the GEMM path, in ms and
 * TFLOP/s with FLOPs = 4 B nh seq^2 hd / 2 forward (causal) and 2.5x that backward.
 *
 * --cudnn: only the cuDNN cases, then the timing of cuDNN against the default flash kernels
 * at hd 64 and 128 (no GEMM path, no other variant).
 * --quick: the small bf16 cases only (for compute-sanitizer). Prints "SKIP" and passes where
 * there is no CUDA driver or GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "gpu_attention.h"
#include "gpu_blas.h"
#include "gpu_cudnn_attn.h"
#include "gpu_flash.h"
#include "gpu_kernels.h"
#include "gpu_loader.h"

static int failures;
static gpu_ctx *G;
static rt_cuda *K;
static gpu_blas *BL;

#define FAIL(...)                                                                                  \
  do {                                                                                             \
    failures++;                                                                                    \
    printf("FAIL: ");                                                                              \
    printf(__VA_ARGS__);                                                                           \
    printf("\n");                                                                                  \
  } while (0)

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static double unit(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}
/* roughly normal, variance amp^2 / 4 */
static void fill(float *x, int64_t n, float amp) {
  for (int64_t i = 0; i < n; i++) x[i] = amp * (float)(unit() + unit() + unit() - 1.5);
}

typedef struct {
  int64_t B, S, nh, nkv, hd;
  int causal;
  cg_dtype dt;
} cfg;

/* One case: inputs and the CPU reference. */
typedef struct {
  cfg c;
  int64_t T, cq, ck;
  float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
} ref_case;

static void ref_free(ref_case *r) {
  free(r->q);
  free(r->k);
  free(r->v);
  free(r->dout);
  free(r->out);
  free(r->lse);
  free(r->dq);
  free(r->dk);
  free(r->dv);
}

static int ref_make(ref_case *r, cfg c) {
  memset(r, 0, sizeof *r);
  r->c = c;
  r->T = c.B * c.S;
  r->cq = c.nh * c.hd;
  r->ck = c.nkv * c.hd;
  const int64_t nq = r->T * r->cq, nk = r->T * r->ck;
  r->q = malloc((size_t)nq * 4);
  r->k = malloc((size_t)nk * 4);
  r->v = malloc((size_t)nk * 4);
  r->dout = malloc((size_t)nq * 4);
  r->out = malloc((size_t)nq * 4);
  r->lse = malloc((size_t)(c.B * c.nh * c.S) * 4);
  r->dq = malloc((size_t)nq * 4);
  r->dk = malloc((size_t)nk * 4);
  r->dv = malloc((size_t)nk * 4);
  if (!r->q || !r->k || !r->v || !r->dout || !r->out || !r->lse || !r->dq || !r->dk || !r->dv) return -1;
  fill(r->q, nq, 2.0f);
  fill(r->k, nk, 2.0f);
  fill(r->v, nk, 1.0f);
  fill(r->dout, nq, 1.0f);
  if (c.dt == CG_DT_BF16) {
    ck_round_bf16(r->q, nq);
    ck_round_bf16(r->k, nk);
    ck_round_bf16(r->v, nk);
    ck_round_bf16(r->dout, nq);
  }
  if (ck_attention_fwd(r->q, r->k, r->v, r->out, r->lse, c.B, c.S, c.nh, c.nkv, c.hd, c.causal) != CK_OK ||
      ck_attention_bwd(r->q, r->k, r->v, r->out, r->lse, r->dout, r->dq, r->dk, r->dv, c.B, c.S, c.nh, c.nkv, c.hd,
                       c.causal) != CK_OK)
    return -1;
  return 0;
}

static size_t esz(cg_dtype t) { return t == CG_DT_BF16 ? 2 : 4; }

static gpu_ptr upload(const float *x, int64_t n, cg_dtype t) {
  gpu_ptr p = 0;
  if (gpu_alloc(G, &p, (size_t)n * esz(t), "test tensor") != 0) return 0;
  if (t == CG_DT_F32) {
    gpu_upload(G, p, x, (size_t)n * 4);
  } else {
    uint16_t *b = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) b[i] = ck_float_to_bf16(x[i]);
    gpu_upload(G, p, b, (size_t)n * 2);
    free(b);
  }
  return p;
}

/* rows x cols of a (rows, ld) device matrix from column c0, as f32 */
static float *download(gpu_ptr p, int64_t rows, int64_t ld, int64_t c0, int64_t cols, cg_dtype t) {
  const size_t e = esz(t);
  unsigned char *raw = malloc((size_t)(rows * ld) * e);
  float *x = malloc((size_t)(rows * cols) * 4);
  if (!raw || !x || gpu_download(G, raw, p, (size_t)(rows * ld) * e) != 0) {
    free(raw);
    free(x);
    return NULL;
  }
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      const int64_t i = r * ld + c0 + c;
      if (t == CG_DT_F32) memcpy(&x[r * cols + c], raw + 4 * i, 4);
      else {
        uint16_t b;
        memcpy(&b, raw + 2 * i, 2);
        x[r * cols + c] = ck_bf16_to_float(b);
      }
    }
  free(raw);
  return x;
}

/* max |a - b| / max |b|; NaN or a missing array counts as infinite */
static double rel(const float *a, const float *b, int64_t n) {
  if (!a) return INFINITY;
  double md = 0, mb = 0;
  for (int64_t i = 0; i < n; i++) {
    const double d = fabs((double)a[i] - b[i]);
    if (!(d <= md)) md = isnan(d) ? INFINITY : d;
    mb = fmax(mb, fabs((double)b[i]));
  }
  return md / (mb + 1e-30);
}

enum { PATH_DEFAULT, PATH_GEMM };

/* Runs fwd and bwd on the GPU; err[0..3] = out, dq, dk, dv. With recompute, also runs the
 * backward once more with a copy of out (no cached logsumexp) and checks it agrees. */
static int run_case(gpu_attention *a, const ref_case *r, int path, int recompute, double err[4]) {
  const cfg *c = &r->c;
  const gpu_attn_dims d = {c->B, c->S, c->nh, c->nkv, c->hd, c->causal, c->dt};
  const int64_t W = r->cq + 2 * r->ck;
  char msg[1024] = "";
  gpu_ptr q = upload(r->q, r->T * r->cq, c->dt), k = upload(r->k, r->T * r->ck, c->dt), v = upload(r->v, r->T * r->ck, c->dt);
  gpu_ptr dout = upload(r->dout, r->T * r->cq, c->dt), out = 0, out2 = 0, packed = 0, packed2 = 0;
  int rc = !q || !k || !v || !dout || gpu_alloc(G, &out, (size_t)(r->T * r->cq) * esz(c->dt), "test out") ||
           gpu_alloc(G, &packed, (size_t)(r->T * W) * esz(c->dt), "test packed") ||
           gpu_memset8(G, packed, 0xff, (size_t)(r->T * W) * esz(c->dt)); /* NaN: every element must be written */
  if (!rc)
    rc = path == PATH_GEMM ? gpu_attention_fwd_gemm(a, &d, q, k, v, out, msg, sizeof msg)
                           : gpu_attention_fwd(a, &d, q, k, v, out, msg, sizeof msg);
  if (!rc)
    rc = path == PATH_GEMM ? gpu_attention_bwd_gemm(a, &d, q, k, v, out, dout, packed, msg, sizeof msg)
                           : gpu_attention_bwd(a, &d, q, k, v, out, dout, packed, msg, sizeof msg);
  if (!rc) rc = gpu_sync(G);
  for (int i = 0; i < 4; i++) err[i] = INFINITY;
  if (rc) {
    FAIL("B=%lld S=%lld: %s %s", (long long)c->B, (long long)c->S, msg, gpu_error(G));
  } else {
    float *o = download(out, r->T, r->cq, 0, r->cq, c->dt);
    float *dq = download(packed, r->T, W, 0, r->cq, c->dt), *dk = download(packed, r->T, W, r->cq, r->ck, c->dt);
    float *dv = download(packed, r->T, W, r->cq + r->ck, r->ck, c->dt);
    err[0] = rel(o, r->out, r->T * r->cq);
    err[1] = rel(dq, r->dq, r->T * r->cq);
    err[2] = rel(dk, r->dk, r->T * r->ck);
    err[3] = rel(dv, r->dv, r->T * r->ck);
    if (recompute) {
      rc = gpu_alloc(G, &out2, (size_t)(r->T * r->cq) * esz(c->dt), "test out copy") ||
           gpu_alloc(G, &packed2, (size_t)(r->T * W) * esz(c->dt), "test packed 2") ||
           gpu_copy(G, out2, out, (size_t)(r->T * r->cq) * esz(c->dt)) ||
           gpu_attention_bwd(a, &d, q, k, v, out2, dout, packed2, msg, sizeof msg) || gpu_sync(G);
      float *p1 = download(packed, r->T, W, 0, W, c->dt), *p2 = rc ? NULL : download(packed2, r->T, W, 0, W, c->dt);
      const double e = rel(p2, p1, r->T * W);
      printf("  backward with no cached logsumexp (recomputed): max difference / max %.2e\n", e);
      if (rc || e > 1e-2) FAIL("backward with a recomputed logsumexp differs: %.2e %s", e, msg);
      free(p1);
      free(p2);
    }
    free(o);
    free(dq);
    free(dk);
    free(dv);
  }
  gpu_free(G, q);
  gpu_free(G, k);
  gpu_free(G, v);
  gpu_free(G, dout);
  gpu_free(G, out);
  gpu_free(G, out2);
  gpu_free(G, packed);
  gpu_free(G, packed2);
  return rc;
}

static gpu_attention *make_attention(const char *fwd_variant, const char *bwd_variant, const char *mode) {
  if (fwd_variant) setenv("MOEC_FLASH_FWD", fwd_variant, 1);
  if (bwd_variant) setenv("MOEC_FLASH_BWD", bwd_variant, 1);
  if (mode) setenv("MOEC_ATTENTION", mode, 1);
  char err[4096];
  gpu_attention *a = gpu_attention_new(K, BL, err, sizeof err);
  unsetenv("MOEC_FLASH_FWD");
  unsetenv("MOEC_FLASH_BWD");
  unsetenv("MOEC_ATTENTION");
  if (!a) FAIL("gpu_attention_new: %s", err);
  return a;
}

static void report(const ref_case *r, const char *what, const double e[4], double tol_out, double tol_grad) {
  const cfg *c = &r->c;
  const int ok = e[0] <= tol_out && e[1] <= tol_grad && e[2] <= tol_grad && e[3] <= tol_grad;
  printf("%s %-4s B=%lld S=%-4lld nh=%-2lld nkv=%lld hd=%-3lld %s %-28s out %.2e dq %.2e dk %.2e dv %.2e\n",
         ok ? "ok  " : "FAIL", c->dt == CG_DT_BF16 ? "bf16" : "f32", (long long)c->B, (long long)c->S, (long long)c->nh,
         (long long)c->nkv, (long long)c->hd, c->causal ? "causal" : "full  ", what, e[0], e[1], e[2], e[3]);
  if (!ok) failures++;
}

static double tol_out(cg_dtype t) { return t == CG_DT_BF16 ? 2e-2 : 1e-4; }
static double tol_grad(cg_dtype t) { return t == CG_DT_BF16 ? 3e-2 : 1e-4; }

/* ---- timing ---- */
static double time_ms(gpu_attention *a, const gpu_attn_dims *d, int bwd, int gemm, gpu_ptr q, gpu_ptr k, gpu_ptr v,
                      gpu_ptr out, gpu_ptr dout, gpu_ptr packed, int warm, int iters) {
  char msg[1024];
  gpu_timer t = {0};
  float ms = 0;
  for (int i = 0; i < warm + iters; i++) {
    if (i == warm && gpu_timer_start(G, &t) != 0) break;
    int rc = !bwd ? (gemm ? gpu_attention_fwd_gemm(a, d, q, k, v, out, msg, sizeof msg)
                          : gpu_attention_fwd(a, d, q, k, v, out, msg, sizeof msg))
                  : (gemm ? gpu_attention_bwd_gemm(a, d, q, k, v, out, dout, packed, msg, sizeof msg)
                          : gpu_attention_bwd(a, d, q, k, v, out, dout, packed, msg, sizeof msg));
    if (rc) {
      FAIL("timing: %s", msg);
      gpu_timer_free(G, &t);
      return NAN;
    }
  }
  if (gpu_timer_stop(G, &t, &ms) != 0) {
    FAIL("timing: %s", gpu_error(G));
    ms = NAN;
  }
  gpu_timer_free(G, &t);
  return ms / iters;
}

static int have_cudnn; /* libcudnn loads and a handle was made */

static void timing(int64_t hd, int cudnn_only) {
  const int64_t B = 1, S = 8192, nh = 16, nkv = 8, T = B * S;
  const gpu_attn_dims d = {B, S, nh, nkv, hd, 1, CG_DT_BF16};
  const double fl_fwd = 4.0 * B * nh * (double)S * S * hd / 2, fl_bwd = 2.5 * fl_fwd;
  float *x = malloc((size_t)(T * nh * hd) * 4);
  fill(x, T * nh * hd, 2.0f);
  gpu_ptr q = upload(x, T * nh * hd, CG_DT_BF16), k = upload(x, T * nkv * hd, CG_DT_BF16);
  fill(x, T * nh * hd, 1.0f);
  gpu_ptr v = upload(x, T * nkv * hd, CG_DT_BF16), dout = upload(x, T * nh * hd, CG_DT_BF16), out = 0, packed = 0;
  free(x);
  if (!q || !k || !v || !dout || gpu_alloc(G, &out, (size_t)(T * nh * hd) * 2, "timing out") ||
      gpu_alloc(G, &packed, (size_t)(T * (nh + 2 * nkv) * hd) * 2, "timing packed")) {
    FAIL("timing: %s", gpu_error(G));
    return;
  }
  printf("timing: B=%lld seq=%lld heads %lld / kv %lld, hd %lld, causal, bf16; FLOPs fwd %.1f G, bwd %.1f G\n", (long long)B,
         (long long)S, (long long)nh, (long long)nkv, (long long)hd, fl_fwd * 1e-9, fl_bwd * 1e-9);
  double gf = NAN, gb = NAN;
  if (!cudnn_only) {
    gpu_attention *a = make_attention(NULL, NULL, "flash");
    if (!a) return;
    gf = time_ms(a, &d, 0, 1, q, k, v, out, dout, packed, 1, 3);
    gb = time_ms(a, &d, 1, 1, q, k, v, out, dout, packed, 1, 3);
    printf("  gemm  (old)  fwd %8.3f ms %6.1f TFLOP/s   bwd %8.3f ms %6.1f TFLOP/s\n", gf, fl_fwd / gf * 1e-9, gb,
           fl_bwd / gb * 1e-9);
    gpu_attention_free(a); /* frees the 6.4 GiB of scores */
  }
  double best_f = INFINITY, best_b = INFINITY, def_f = NAN, def_b = NAN;
  for (int vi = 0; vi < (cudnn_only ? 1 : 8); vi++) {
    char s[16], fname[64] = "", bname[64] = "";
    snprintf(s, sizeof s, "%d", vi);
    gpu_attention *av = make_attention(s, s, "flash"); /* cuDNN is the default where it loads */
    if (!av) break;
    /* a variant index past the list falls back to the default: stop when the names repeat */
    gpu_attention_flash_variant(av, hd, 0, fname, sizeof fname);
    gpu_attention_flash_variant(av, hd, 1, bname, sizeof bname);
    static char seen_f[8][64], seen_b[8][64];
    int new_f = 1, new_b = 1;
    for (int j = 0; j < vi; j++) {
      new_f &= strcmp(seen_f[j], fname) != 0;
      new_b &= strcmp(seen_b[j], bname) != 0;
    }
    snprintf(seen_f[vi], 64, "%s", fname);
    snprintf(seen_b[vi], 64, "%s", bname);
    if (new_f) {
      double f = time_ms(av, &d, 0, 0, q, k, v, out, dout, packed, 2, 10);
      printf("  flash fwd %-24s %8.3f ms %6.1f TFLOP/s (%.1fx the gemm path)%s\n", fname, f, fl_fwd / f * 1e-9, gf / f,
             vi == 0 ? "  [default]" : "");
      best_f = fmin(best_f, f);
      if (vi == 0) def_f = f;
    }
    if (new_b) {
      /* the forward first, so that the backward finds its logsumexp */
      time_ms(av, &d, 0, 0, q, k, v, out, dout, packed, 0, 1);
      double b = time_ms(av, &d, 1, 0, q, k, v, out, dout, packed, 2, 10);
      printf("  flash bwd %-24s %8.3f ms %6.1f TFLOP/s (%.1fx the gemm path)%s\n", bname, b, fl_bwd / b * 1e-9, gb / b,
             vi == 0 ? "  [default]" : "");
      best_b = fmin(best_b, b);
      if (vi == 0) def_b = b;
    }
    gpu_attention_free(av);
    if (!new_f && !new_b) break;
  }
  printf("  best: fwd %.3f ms (%.1f TFLOP/s), bwd %.3f ms (%.1f TFLOP/s), fwd+bwd %.1fx the gemm path\n", best_f,
         fl_fwd / best_f * 1e-9, best_b, fl_bwd / best_b * 1e-9, (gf + gb) / (best_f + best_b));
  if (have_cudnn) {
    gpu_attention *ac = make_attention(NULL, NULL, "cudnn");
    if (ac && gpu_attention_uses_cudnn(ac, &d, q, k, v, out)) {
      double f = time_ms(ac, &d, 0, 0, q, k, v, out, dout, packed, 2, 10);
      time_ms(ac, &d, 0, 0, q, k, v, out, dout, packed, 0, 1); /* the stats for the backward */
      double b = time_ms(ac, &d, 1, 0, q, k, v, out, dout, packed, 2, 10);
      printf("  cudnn fwd %-24s %8.3f ms %6.1f TFLOP/s (%.2fx the default flash kernel)\n", "", f, fl_fwd / f * 1e-9,
             def_f / f);
      printf("  cudnn bwd %-24s %8.3f ms %6.1f TFLOP/s (%.2fx the default flash kernel)\n", "", b, fl_bwd / b * 1e-9,
             def_b / b);
    } else if (ac) {
      FAIL("timing: MOEC_ATTENTION=cudnn does not take cuDNN at hd %lld", (long long)hd);
    }
    gpu_attention_free(ac);
  }
  gpu_free(G, q);
  gpu_free(G, k);
  gpu_free(G, v);
  gpu_free(G, dout);
  gpu_free(G, out);
  gpu_free(G, packed);
}

/* cuDNN's fused attention through gpu_attention (MOEC_ATTENTION=cudnn), against the CPU. */
static void cudnn_cases(int quick) {
  char err[1024] = "";
  gpu_cudnn_attn *probe = gpu_cudnn_attn_new(G, err, sizeof err);
  if (!probe) {
    if (err[0]) FAIL("cudnn: %s", err);
    else printf("cudnn: skipped (libcudnn not found)\n");
    return;
  }
  printf("cudnn: cuDNN %zu\n", gpu_cudnn_attn_version(probe));
  gpu_cudnn_attn_free(probe);
  if (gpu_deterministic()) {
    printf("cudnn: skipped (MOEC_DETERMINISTIC=1 never takes cuDNN)\n");
    return;
  }
  gpu_attention *a = make_attention(NULL, NULL, "cudnn");
  if (!a) return;
  have_cudnn = 1;
  static const cfg cases[] = {
      {2, 64, 4, 4, 64, 1, CG_DT_BF16},    {2, 200, 16, 8, 64, 1, CG_DT_BF16}, {2, 200, 6, 2, 128, 1, CG_DT_BF16},
      {2, 333, 16, 8, 128, 1, CG_DT_BF16}, {2, 200, 16, 8, 64, 0, CG_DT_BF16}, {2, 1024, 16, 8, 64, 1, CG_DT_BF16},
      {2, 1024, 6, 2, 128, 1, CG_DT_BF16},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const cfg c = cases[i];
    if (quick && c.S > 200) continue;
    ref_case r;
    if (ref_make(&r, c) != 0) {
      FAIL("CPU reference failed");
      ref_free(&r);
      continue;
    }
    const gpu_attn_dims d = {c.B, c.S, c.nh, c.nkv, c.hd, c.causal, c.dt};
    if (!gpu_attention_uses_cudnn(a, &d, 0, 0, 0, 0)) FAIL("MOEC_ATTENTION=cudnn does not take cuDNN at hd %lld", (long long)c.hd);
    double e[4];
    run_case(a, &r, PATH_DEFAULT, i == 2, e);
    report(&r, "cudnn", e, tol_out(c.dt), tol_grad(c.dt));
    ref_free(&r);
  }
  gpu_attention_free(a);
}

int main(int argc, char **argv) {
  const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  const int cudnn_only = argc > 1 && strcmp(argv[1], "--cudnn") == 0;
  char err[4096];
  int n = 0;
  if (gpu_driver_load(err, sizeof err) != 0 || gpu_device_count(&n, err, sizeof err) != 0 || n == 0) {
    printf("SKIP: no CUDA driver or GPU here (%s); GPU attention is tested on the H200\n", n == 0 && !err[0] ? "no device" : err);
    return 0;
  }
  if (!(G = gpu_open(0, err, sizeof err)) || !(K = rt_cuda_new(G, NULL, err, sizeof err)) ||
      !(BL = gpu_blas_new(G, err, sizeof err))) {
    printf("FAIL: setup: %s\n", err);
    return 1;
  }
  printf("device: %s (%s), %d SMs\n", gpu_info(G)->name, rt_cuda_arch(K), gpu_info(G)->sm_count);
  if (cudnn_only) {
    cudnn_cases(0);
    if (have_cudnn) {
      timing(64, 1);
      timing(128, 1);
    }
    gpu_blas_free(BL);
    rt_cuda_free(K);
    gpu_close(G);
    printf("test_gpu_attention --cudnn: %d failures\n", failures);
    return failures ? 1 : 0;
  }
  gpu_attention *a = make_attention(NULL, NULL, "flash");
  if (!a) return 1;
  static const int64_t seqs[] = {64, 200, 1024}, heads[][2] = {{16, 8}, {6, 2}}, hds[] = {64, 128};
  ref_case keep[4]; /* seq 1024 bf16 cases, for the variants */
  int n_keep = 0;
  for (int dt = 0; dt < 2; dt++)
    for (int si = 0; si < 3; si++)
      for (int hi = 0; hi < 2; hi++)
        for (int di = 0; di < 2; di++) {
          const cfg c = {2, seqs[si], heads[hi][0], heads[hi][1], hds[di], 1, dt ? CG_DT_F32 : CG_DT_BF16};
          if (quick && (c.dt != CG_DT_BF16 || c.S > 200)) continue;
          ref_case r;
          if (ref_make(&r, c) != 0) {
            FAIL("CPU reference failed");
            ref_free(&r);
            continue;
          }
          double e[4];
          const gpu_attn_dims d = {c.B, c.S, c.nh, c.nkv, c.hd, c.causal, c.dt};
          int fl = gpu_attention_uses_flash(a, &d, 0, 0, 0, 0);
          if (c.dt == CG_DT_BF16 && !fl) FAIL("bf16 hd %lld does not take the flash kernels", (long long)c.hd);
          run_case(a, &r, PATH_DEFAULT, c.dt == CG_DT_BF16 && si == 1 && hi == 1, e);
          report(&r, fl ? "flash" : "gemm", e, tol_out(c.dt), tol_grad(c.dt));
          if (c.dt == CG_DT_BF16 && !quick) {
            run_case(a, &r, PATH_GEMM, 0, e);
            report(&r, "gemm", e, tol_out(c.dt), tol_grad(c.dt));
          }
          if (c.dt == CG_DT_BF16 && c.S == 1024 && n_keep < 4) keep[n_keep++] = r;
          else ref_free(&r);
        }
  /* non-causal */
  for (int di = 0; di < 2; di++) {
    const cfg c = {2, 200, 16, 8, hds[di], 0, CG_DT_BF16};
    ref_case r;
    double e[4];
    if (ref_make(&r, c) == 0) {
      run_case(a, &r, PATH_DEFAULT, 0, e);
      report(&r, "flash", e, tol_out(c.dt), tol_grad(c.dt));
    }
    ref_free(&r);
  }
  char dname[2][2][64] = {{"", ""}, {"", ""}}; /* default kernels: [hd 64, 128][fwd, bwd] */
  for (int h = 0; h < 2; h++)
    for (int b = 0; b < 2; b++) gpu_attention_flash_variant(a, hds[h], b, dname[h][b], sizeof dname[h][b]);
  gpu_attention_free(a);
  /* every other kernel variant, on the seq-1024 cases */
  for (int vi = 1; vi < 8 && !quick; vi++) {
    char s[16];
    snprintf(s, sizeof s, "%d", vi);
    gpu_attention *av = make_attention(s, s, "flash"); /* cuDNN is the default where it loads */
    if (!av) break;
    int any = 0;
    for (int i = 0; i < n_keep; i++) {
      char fname[64] = "", bname[64] = "", what[160];
      const int h = keep[i].c.hd == 128;
      gpu_attention_flash_variant(av, keep[i].c.hd, 0, fname, sizeof fname);
      gpu_attention_flash_variant(av, keep[i].c.hd, 1, bname, sizeof bname);
      if (strcmp(fname, dname[h][0]) == 0 && strcmp(bname, dname[h][1]) == 0) continue; /* past this hd's list */
      any = 1;
      double e[4];
      run_case(av, &keep[i], PATH_DEFAULT, 0, e);
      snprintf(what, sizeof what, "%s+%s", fname + 3, bname + 3);
      report(&keep[i], what, e, tol_out(CG_DT_BF16), tol_grad(CG_DT_BF16));
    }
    gpu_attention_free(av);
    if (!any) break;
  }
  for (int i = 0; i < n_keep; i++) ref_free(&keep[i]);
  cudnn_cases(quick);
  if (!quick) {
    timing(64, cudnn_only);
    timing(128, cudnn_only);
  }
  gpu_blas_free(BL);
  rt_cuda_free(K);
  gpu_close(G);
  printf("test_gpu_attention: %d failures\n", failures);
  return failures ? 1 : 0;
}
