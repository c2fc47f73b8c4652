/* gpu_test.h -- what the GPU kernel tests share: the device and kernel objects, device
 * buffers from host arrays and back, the error-flag check, and the comparison of a GPU result
 * with the CPU reference (bit-exact or with a tolerance). Include once per test program. */
#ifndef MOEC_GPU_TEST_H
#define MOEC_GPU_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ck_test.h"
#include "runtime/gpu_kernels.h"
#include "runtime/gpu_loader.h"

const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libnvrtc\nleak:libcuda\n"; }

static gpu_ctx *G;
static rt_cuda *K;

/* ---- device buffers ---- */
static gpu_ptr live[256];
static int n_live;

static gpu_ptr dmalloc(size_t bytes) {
  gpu_ptr p = 0;
  if (gpu_alloc(G, &p, bytes ? bytes : 4, "a test buffer") != 0 || n_live == 256) {
    printf("FAIL: %s\n", gpu_error(G));
    exit(1);
  }
  return live[n_live++] = p;
}
static void dfree_all(void) {
  while (n_live) gpu_free(G, live[--n_live]);
}
static size_t dts(cg_dtype t) { return t == CG_DT_BF16 ? 2 : 4; }

static void upload(gpu_ptr p, const void *x, size_t bytes) {
  if (gpu_upload(G, p, x, bytes) != 0) {
    printf("FAIL: upload: %s\n", gpu_error(G));
    exit(1);
  }
}
static void download(void *x, gpu_ptr p, size_t bytes) {
  if (gpu_download(G, x, p, bytes) != 0) {
    printf("FAIL: download (a kernel failed?): %s\n", gpu_error(G));
    exit(1);
  }
}
/* float values stored as t (bf16: rounded to nearest even on the way) */
static gpu_ptr up_f(const float *x, int64_t n, cg_dtype t) {
  gpu_ptr p = dmalloc((size_t)n * dts(t));
  if (t == CG_DT_F32) {
    upload(p, x, (size_t)n * 4);
  } else {
    uint16_t *b = malloc((size_t)(n ? n : 1) * 2);
    for (int64_t i = 0; i < n; i++) b[i] = ck_float_to_bf16(x[i]);
    upload(p, b, (size_t)n * 2);
    free(b);
  }
  return p;
}
static void get_f(float *x, gpu_ptr p, int64_t n, cg_dtype t) {
  if (t == CG_DT_F32) {
    download(x, p, (size_t)n * 4);
    return;
  }
  uint16_t *b = malloc((size_t)(n ? n : 1) * 2);
  download(b, p, (size_t)n * 2);
  for (int64_t i = 0; i < n; i++) x[i] = ck_bf16_to_float(b[i]);
  free(b);
}
__attribute__((unused)) static gpu_ptr up_raw(const void *x, size_t bytes) {
  gpu_ptr p = dmalloc(bytes);
  upload(p, x, bytes);
  return p;
}

/* Random values in [lo, hi), never zero, representable in t. */
static float *rnd(int64_t n, float lo, float hi, cg_dtype t) {
  float *x = falloc(n);
  fill(x, n, lo, hi);
  if (t == CG_DT_BF16) ck_round_bf16(x, n);
  return x;
}
static float *dup(const float *x, int64_t n) {
  float *y = falloc(n);
  memcpy(y, x, (size_t)n * sizeof(float));
  return y;
}

/* Runs a launch, reporting its error. */
#define RUN(call)                                                                                   \
  do {                                                                                              \
    if ((call) != 0) CHECK(0, "%s: %s", #call, rt_cuda_error(K));                                  \
  } while (0)

/* After a test: the stream drained, no error flag unless expected. */
static void expect_flag(const char *what, int want) {
  int ck = 0;
  if (rt_cuda_check(K, &ck) != 0) {
    CHECK(0, "%s: %s", what, rt_cuda_error(K));
    return;
  }
  CHECK(ck == want, "%s: device error flag %d (%s), want %d", what, ck, ck_strerror(ck), want);
}

/* got (from the GPU, stored as t) against want (the CPU's fp32 result). rtol < 0: bit for bit,
 * except that any NaN matches any NaN: CUDA's arithmetic returns the canonical NaN 0x7fffffff
 * where glibc keeps 0x7fc00000 (seen on the H200 for AdamW with a NaN gradient norm), and
 * fp32 NaN payloads carry no meaning here. */
__attribute__((unused)) static void cmp(const char *what, const float *got, const float *want_in, int64_t n, cg_dtype t, double rtol,
                double atol) {
  float *want = dup(want_in, n);
  if (t == CG_DT_BF16) ck_round_bf16(want, n);
  char name[96];
  snprintf(name, sizeof name, "%s [%s]", what, cg_dtype_name(t));
  if (rtol < 0) {
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
      if (memcmp(&got[i], &want[i], sizeof(float)) != 0 && !(isnan(got[i]) && isnan(want[i]))) bad = i;
    CHECK(bad < 0, "%s: element %lld got %.9g (0x%08x) want %.9g (0x%08x)", name, (long long)bad,
          bad >= 0 ? got[bad] : 0.0, bad >= 0 ? *(const uint32_t *)&got[bad] : 0u, bad >= 0 ? want[bad] : 0.0,
          bad >= 0 ? *(const uint32_t *)&want[bad] : 0u);
    printf("  %-44s %6lld values, bit-exact\n", name, (long long)n);
  } else {
    double *wd = to_double(want, n);
    check_close(name, got, wd, n, rtol + (t == CG_DT_BF16 ? 0x1p-7 : 0.0), atol);
    free(wd);
  }
  free(want);
}
/* want (m, n) = x (m, k) . w (n, k)^T, summed in double: the exact product of exact values. */
static inline void gemm_nt_ref(const float *x, const float *w, int64_t m, int64_t n, int64_t k, float *want) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double acc = 0;
      for (int64_t l = 0; l < k; l++) acc += (double)x[i * k + l] * w[j * k + l];
      want[i * n + j] = (float)acc;
    }
}
__attribute__((unused)) static double maxabs(const float *x, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
  return m;
}

/* Seeds the random inputs (MOEC_TEST_SEED repeats a run), opens GPU 0 into G and builds the
 * kernels into K (no disk cache unless MOEC_TEST_CACHE names one). Returns 0 ready, 1 when
 * there is no driver or GPU (the test SKIPs: it prints why), -1 when a GPU is present but
 * unusable (the test fails). */
static int gpu_test_start(uint64_t *seed) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* a log that survives a crash */
  const char *seed_env = getenv("MOEC_TEST_SEED");
  *seed = seed_env ? strtoull(seed_env, NULL, 0) : (uint64_t)time(NULL);
  ck_rng_state = *seed;
  char err[2048] = "";
  int ndev = 0;
  if (gpu_driver_load(err, sizeof err) != 0 || gpu_device_count(&ndev, err, sizeof err) != 0 || ndev == 0) {
    printf("SKIP: no CUDA driver/GPU (%s)\n", ndev == 0 && !err[0] ? "the driver sees no GPU" : err);
    return 1;
  }
  if (!(G = gpu_open(0, err, sizeof err))) {
    printf("FAIL: a GPU is present but cannot be opened: %s\n", err);
    return -1;
  }
  const char *cache = getenv("MOEC_TEST_CACHE");
  rt_cuda_opts o = {.cache_dir = cache ? cache : "", .dump_dir = getenv("MOEC_DUMP_DIR")};
  if (!(K = rt_cuda_new(G, &o, err, sizeof err))) {
    printf("FAIL: a GPU is present but its kernels cannot be built: %s\n", err);
    gpu_close(G);
    return -1;
  }
  return 0;
}

#endif
