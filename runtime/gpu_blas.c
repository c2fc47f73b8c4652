/* gpu_blas.c -- dlopen of cuBLASLt and its entry points (see gpu_blas.h), and the row-major
 * GEMMs on top. The enum values below are those of CUDA 13.0's cublasLt.h, cublas_api.h and
 * library_types.h (cited by name). */
#include "gpu_blas.h"
#include "hash.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gpu_blas_api api;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int ok;
static char load_err[1024];

static void load(void) {
  static const char *const names[] = {"libcublasLt.so.13", "libcublasLt.so.12"};
  char tried[768], path[512];
  void *h = gpu_dlopen_lib("MOEC_LIBCUBLASLT", names, 2, path, sizeof path, tried, sizeof tried);
  if (!h) {
    snprintf(load_err, sizeof load_err, "libcublasLt not found (tried %s); install cuBLAS, or set CUDA_HOME or MOEC_LIBCUBLASLT", tried);
    return;
  }
  static const struct {
    void **slot;
    const char *sym;
  } syms[] = {
      {(void **)&api.GetVersion, "cublasLtGetVersion"},
      {(void **)&api.Create, "cublasLtCreate"},
      {(void **)&api.Destroy, "cublasLtDestroy"},
      {(void **)&api.MatmulDescCreate, "cublasLtMatmulDescCreate"},
      {(void **)&api.MatmulDescDestroy, "cublasLtMatmulDescDestroy"},
      {(void **)&api.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute"},
      {(void **)&api.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate"},
      {(void **)&api.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy"},
      {(void **)&api.MatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute"},
      {(void **)&api.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate"},
      {(void **)&api.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy"},
      {(void **)&api.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute"},
      {(void **)&api.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic"},
      {(void **)&api.Matmul, "cublasLtMatmul"},
      {(void **)&api.GetStatusString, "cublasLtGetStatusString"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
    if (!(*syms[i].slot = dlsym(h, syms[i].sym))) {
      snprintf(load_err, sizeof load_err, "%s lacks %s (cuBLAS too old: moec needs CUDA 12.0 or newer)", path, syms[i].sym);
      return;
    }
  ok = 1;
}

const gpu_blas_api *gpu_blas_load(char *err, size_t errlen) {
  pthread_once(&once, load);
  if (!ok && err) snprintf(err, errlen, "%s", load_err);
  return ok ? &api : NULL;
}

enum { CUDA_R_32F = 0, CUDA_R_16BF = 14, CUDA_R_8F_E4M3 = 28 }; /* library_types.h cudaDataType */
enum { CUBLAS_COMPUTE_32F = 68 };                      /* cublas_api.h cublasComputeType_t */
enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };             /* cublas_api.h cublasOperation_t */
enum { DESC_TRANSA = 3, DESC_TRANSB = 4 };             /* cublasLtMatmulDescAttributes_t */
enum { DESC_A_SCALE_POINTER = 17, DESC_B_SCALE_POINTER = 18, DESC_FAST_ACCUM = 25, DESC_A_SCALE_MODE = 31,
       DESC_B_SCALE_MODE = 32 };
enum { MATRIX_SCALE_VEC128_32F = 4, MATRIX_SCALE_BLK128x128_32F = 5 }; /* cublasLtMatmulMatrixScale_t */
enum { LAYOUT_BATCH_COUNT = 5, LAYOUT_STRIDED_BATCH_OFFSET = 6 }; /* cublasLtMatrixLayoutAttribute_t */
enum { PREF_MAX_WORKSPACE_BYTES = 1 };                 /* cublasLtMatmulPreferenceAttributes_t */

/* Heuristic picks, cached per problem: the same shapes recur every step. */
typedef struct {
  int64_t key[12];
  gpu_blas_algo algo;
  int used;
} algo_entry;
#define ALGO_CACHE 512

enum { LANES_MAX = 4 };

struct gpu_blas {
  gpu_ctx *g;
  const gpu_blas_api *api;
  void *handle;
  gpu_ptr workspace;
  size_t workspace_bytes;
  algo_entry cache[ALGO_CACHE];
  long queries;
  /* Lanes (gpu_blas_fork): extra streams, each with its own workspace (two GEMMs in flight
   * must not share one), made on the first fork. lane: where the next call goes, -1 = g's
   * own stream (outside a fork, or lanes == 1). */
  int lanes, lane, lanes_made;
  void *lane_stream[LANES_MAX], *lane_done[LANES_MAX], *forked;
  gpu_ptr lane_ws[LANES_MAX];
};

long gpu_blas_queries(const gpu_blas *b) { return b->queries; }

gpu_blas *gpu_blas_new(gpu_ctx *g, char *err, size_t errlen) {
  const gpu_blas_api *api = gpu_blas_load(err, errlen);
  if (!api) return NULL;
  gpu_blas *b = calloc(1, sizeof *b);
  if (!b) {
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  b->g = g;
  b->api = api;
  b->lane = -1;
  const char *ls = getenv("MOEC_GEMM_STREAMS");
  b->lanes = ls && *ls ? atoi(ls) : 1; /* off by default: no gain measured yet (bench/RESULTS.md) */
  b->lanes = b->lanes < 1 ? 1 : b->lanes > LANES_MAX ? LANES_MAX : b->lanes;
  int st = api->Create(&b->handle);
  if (st != 0) {
    snprintf(err, errlen, "cublasLtCreate failed: %s", api->GetStatusString(st));
    gpu_blas_free(b);
    return NULL;
  }
  b->workspace_bytes = (size_t)32 << 20;
  if (gpu_alloc(g, &b->workspace, b->workspace_bytes, "the cuBLASLt workspace") != 0) {
    snprintf(err, errlen, "%s", gpu_error(g));
    gpu_blas_free(b);
    return NULL;
  }
  return b;
}

void gpu_blas_free(gpu_blas *b) {
  if (!b) return;
  for (int i = 0; i < LANES_MAX; i++) {
    if (b->lane_ws[i]) gpu_free(b->g, b->lane_ws[i]);
    if (b->lane_done[i]) gpu_event_free(b->g, b->lane_done[i]);
    gpu_stream_free(b->g, b->lane_stream[i]);
  }
  if (b->forked) gpu_event_free(b->g, b->forked);
  if (b->workspace) gpu_free(b->g, b->workspace);
  if (b->handle) b->api->Destroy(b->handle);
  free(b);
}

static int64_t pow2_at_least(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

static int lt_type(cg_dtype t) { return t == CG_DT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

/* A column-major layout (rows, cols, ld) with batching. */
static void *layout(gpu_blas *b, cg_dtype t, int64_t rows, int64_t cols, int64_t ld, int batch, int64_t stride) {
  void *l = NULL;
  if (b->api->MatrixLayoutCreate(&l, lt_type(t), (uint64_t)rows, (uint64_t)cols, ld) != 0) return NULL;
  if (batch > 1) {
    int32_t n = batch;
    b->api->MatrixLayoutSetAttribute(l, LAYOUT_BATCH_COUNT, &n, sizeof n);
    b->api->MatrixLayoutSetAttribute(l, LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
  }
  return l;
}

/* MOEC_GEMM_TUNE (default 1; 0 under MOEC_DETERMINISTIC): time the heuristic's candidates on
 * the first call of a shape class and keep the fastest; 0 keeps the heuristic's first choice. MOEC_GEMM_LOG=1 prints
 * each tuned shape (stderr). */
static int env_int(const char *name, int dflt) {
  const char *e = getenv(name);
  return e && *e ? atoi(e) : dflt;
}

enum { TUNE_CANDIDATES = 8, TUNE_REPS = 3 };

typedef struct {
  void *desc, *la, *lb, *lc;
  const void *a, *b; /* cuBLASLt's first and second operands (our B and A) */
  void *c;            /* D, the result */
  const void *c_in;   /* C, the addend read with beta: c itself (in place) or another buffer */
  float alpha, beta;
} lt_call;

static int run_algo(gpu_blas *b, const lt_call *c, const gpu_blas_algo *algo) {
  const double t0 = gpu_clock_s();
  const int l = b->lane;
  int st = b->api->Matmul(b->handle, c->desc, &c->alpha, c->a, c->la, c->b, c->lb, &c->beta, c->c_in, c->lc, c->c, c->lc,
                          algo, (void *)(uintptr_t)(l >= 0 ? b->lane_ws[l] : b->workspace), b->workspace_bytes,
                          l >= 0 ? b->lane_stream[l] : gpu_stream(b->g));
  gpu_note_issue(b->g, t0);
  return st;
}

/* Mean GPU time (ms) of TUNE_REPS back-to-back runs of algo; -1 when it refuses or fails. The
 * events bracket only these runs: whatever the stream held before completes first. */
static float time_algo(gpu_blas *b, const lt_call *c, const gpu_blas_algo *algo, void *ev0, void *ev1) {
  /* run_cached puts a call that needed choosing on g's stream, where these events are */
  if (run_algo(b, c, algo) != 0) return -1;
  if (gpu_event_record(b->g, ev0) != 0) return -1;
  for (int r = 0; r < TUNE_REPS; r++)
    if (run_algo(b, c, algo) != 0) return -1;
  float ms = -1;
  if (gpu_event_record(b->g, ev1) != 0 || gpu_event_elapsed(b->g, ev0, ev1, &ms) != 0) return -1;
  return ms / TUNE_REPS;
}

/* The algorithm for this problem into cache entry e under key: the heuristic's first, or with
 * tuning (only where beta == 0 or C is not D, so that trial runs leave C as the real call will) the fastest
 * of its candidates measured on the call's own operands. */
static int pick_algo(gpu_blas *b, const lt_call *c, algo_entry *e, const int64_t *key, size_t key_bytes,
                     const int64_t mnk[3]) {
  void *pref = NULL;
  gpu_blas_heuristic res[TUNE_CANDIDATES];
  int found = 0, tune = env_int("MOEC_GEMM_TUNE", !gpu_deterministic()) && (c->beta == 0.0f || c->c_in != c->c);
  if (b->api->MatmulPreferenceCreate(&pref) != 0) return -1;
  uint64_t ws = b->workspace_bytes;
  b->api->MatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  b->queries++;
  int st = b->api->MatmulAlgoGetHeuristic(b->handle, c->desc, c->la, c->lb, c->lc, c->lc, pref,
                                          tune ? TUNE_CANDIDATES : 1, res, &found);
  b->api->MatmulPreferenceDestroy(pref);
  if (st != 0 || found < 1) return -1;
  int best = 0;
  if (tune && found > 1) {
    void *ev0 = NULL, *ev1 = NULL;
    float best_ms = -1, first_ms = -1;
    if (gpu_event_new(b->g, &ev0) == 0 && gpu_event_new(b->g, &ev1) == 0)
      for (int i = 0; i < found; i++) {
        float ms = time_algo(b, c, &res[i].algo, ev0, ev1);
        if (i == 0) first_ms = ms;
        if (ms > 0 && (best_ms < 0 || ms < best_ms)) best_ms = ms, best = i;
      }
    gpu_event_free(b->g, ev0);
    gpu_event_free(b->g, ev1);
    if (env_int("MOEC_GEMM_LOG", 0) && best_ms > 0)
      fprintf(stderr, "gemm tune %lld x %lld x %lld (ops %s%s): first %.1f us, best #%d of %d %.1f us, %.0f TFLOP/s\n",
              (long long)mnk[0], (long long)mnk[1], (long long)mnk[2], key[5] ? "T" : "N", key[6] ? "T" : "N",
              first_ms * 1e3, best, found, best_ms * 1e3,
              2.0 * (double)mnk[0] * (double)mnk[1] * (double)mnk[2] * (double)(key[10] > 1 ? key[10] : 1) / (best_ms * 1e9));
  }
  memcpy(e->key, key, key_bytes);
  e->algo = res[best].algo;
  e->used = 1;
  return 0;
}

/* The cache slot for key: its own entry, else the first free one of its probe sequence, else
 * (table full) its home slot, to be overwritten. The sizes in a key are mostly powers of two,
 * whose low bits are all zero, hence the final mix: FNV alone sent most shapes of a step to
 * a few slots, and every call re-queried the heuristic. */
static algo_entry *cache_slot(gpu_blas *b, const int64_t *key, size_t key_bytes) {
  uint64_t h = HASH_FNV_INIT;
  for (size_t i = 0; i < key_bytes / sizeof *key; i++) h = hash_fnv(h, (uint64_t)key[i]);
  size_t home = hash_mix64(h) % ALGO_CACHE;
  for (size_t j = 0; j < ALGO_CACHE; j++) {
    algo_entry *e = &b->cache[(home + j) % ALGO_CACHE];
    if (!e->used || memcmp(e->key, key, key_bytes) == 0) return e;
  }
  return &b->cache[home];
}

/* Runs call with the cached algorithm of its class key (12 values), choosing it first when
 * absent; a cached algorithm that refuses this exact size is replaced once. */
static int run_cached(gpu_blas *b, const lt_call *call, const int64_t key[12], const int64_t mnk[3], int batch,
                      const char *what, char *err, size_t errlen) {
  const size_t kb = 12 * sizeof *key;
  algo_entry *e = cache_slot(b, key, kb);
  int st = -1;
  const int lane = b->lane;
  for (int attempt = 0; attempt < 2 && st != 0; attempt++) {
    if (attempt == 1 || !e->used || memcmp(e->key, key, kb) != 0) {
      /* choosing times candidates on g's stream (its events are there), and this call, which
         writes the same C, follows them there rather than racing them on a lane */
      b->lane = -1;
      if (pick_algo(b, call, e, key, kb, mnk) != 0) {
        b->lane = lane;
        snprintf(err, errlen, "cuBLASLt has no algorithm for a %s (%lld x %lld x %lld, batch %d)", what,
                 (long long)mnk[0], (long long)mnk[1], (long long)mnk[2], batch);
        return -1;
      }
    }
    gpu_note_work(b->g, what);
    st = run_algo(b, call, &e->algo);
  }
  b->lane = lane;
  if (st != 0) {
    snprintf(err, errlen, "cublasLtMatmul failed (status %d: %s) on a %s, %lld x %lld x %lld", st,
             b->api->GetStatusString(st), what, (long long)mnk[0], (long long)mnk[1], (long long)mnk[2]);
    return -1;
  }
  return 0;
}

/* Frees a call's descriptors; rc, with `what` as the message when it failed without one. */
static int finish(gpu_blas *b, int rc, void *desc, void *la, void *lb, void *lc, const char *what, char *err,
                  size_t errlen) {
  if (rc != 0 && err[0] == 0) snprintf(err, errlen, "%s", what);
  if (la) b->api->MatrixLayoutDestroy(la);
  if (lb) b->api->MatrixLayoutDestroy(lb);
  if (lc) b->api->MatrixLayoutDestroy(lc);
  if (desc) b->api->MatmulDescDestroy(desc);
  return rc;
}

/* D = alpha op(A) op(B) + beta C_in, where C_in is D's buffer or another of D's layout. */
static int gemm_into(gpu_blas *b, int64_t m, int64_t n, int64_t k, float alpha, const gpu_mat *A, const gpu_mat *B,
                     float beta, gpu_ptr c_in, const gpu_mat *C, int batch, char *err, size_t errlen) {
  err[0] = 0;
  if (m == 0 || n == 0) return 0;
  if (A->dtype != B->dtype || (C->dtype != CG_DT_F32 && C->dtype != A->dtype)) {
    snprintf(err, errlen, "gemm: operand dtypes %s x %s -> %s are not supported", cg_dtype_name(A->dtype),
             cg_dtype_name(B->dtype), cg_dtype_name(C->dtype));
    return -1;
  }
  /* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's first operand
   * is our B, its second our A, and its (M, N) are our (n, m). A row-major (r, c) buffer with
   * leading dimension ld is a column-major (c, r) matrix. */
  int opa = B->trans ? CUBLAS_OP_T : CUBLAS_OP_N, opb = A->trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  void *desc = NULL, *la = NULL, *lb = NULL, *lc = NULL;
  int rc = -1;
  if (b->api->MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != 0) goto done;
  b->api->MatmulDescSetAttribute(desc, DESC_TRANSA, &opa, sizeof opa);
  b->api->MatmulDescSetAttribute(desc, DESC_TRANSB, &opb, sizeof opb);
  la = layout(b, B->dtype, B->trans ? k : n, B->trans ? n : k, B->ld, batch, B->stride);
  lb = layout(b, A->dtype, A->trans ? m : k, A->trans ? k : m, A->ld, batch, A->stride);
  lc = layout(b, C->dtype, n, m, C->ld, batch, C->stride);
  if (!la || !lb || !lc) goto done;
  /* The algorithm is chosen once per shape class: expert GEMMs change their row count m (and
   * wgrad its k) every step, and a heuristic query costs more host time than launching the
   * GEMM. m and k are bucketed to the next power of two; should a cached algorithm refuse
   * another size of its class, the exact size is queried and the call retried (below). */
  int64_t key[12] = {pow2_at_least(m), n,     pow2_at_least(k), A->dtype, C->dtype, A->trans,
                     B->trans,         A->ld, B->ld,            C->ld,    batch,    beta != 0};
  lt_call call = {desc, la, lb, lc, (const void *)(uintptr_t)B->p, (const void *)(uintptr_t)A->p,
                  (void *)(uintptr_t)C->p, (const void *)(uintptr_t)c_in, alpha, beta};
  const int64_t mnk[3] = {m, n, k};
  char what[64];
  snprintf(what, sizeof what, "%s GEMM", cg_dtype_name(A->dtype));
  if (run_cached(b, &call, key, mnk, batch, what, err, errlen) != 0) goto done;
  rc = 0;
done:
  return finish(b, rc, desc, la, lb, lc, "cuBLASLt setup failed", err, errlen);
}

int gpu_gemm(gpu_blas *b, int64_t m, int64_t n, int64_t k, float alpha, const gpu_mat *A, const gpu_mat *B,
             float beta, const gpu_mat *C, int batch, char *err, size_t errlen) {
  return gemm_into(b, m, n, k, alpha, A, B, beta, C->p, C, batch, err, errlen);
}

int gpu_gemm_add(gpu_blas *b, int64_t m, int64_t n, int64_t k, const gpu_mat *A, const gpu_mat *B, gpu_ptr addend,
                 const gpu_mat *C, char *err, size_t errlen) {
  return gemm_into(b, m, n, k, 1.0f, A, B, 1.0f, addend, C, 1, err, errlen);
}

int gpu_gemm_fp8(gpu_blas *b, int64_t m, int64_t n, int64_t k, gpu_ptr A, gpu_ptr sa, gpu_ptr B, gpu_ptr sb,
                 const gpu_mat *C, char *err, size_t errlen) {
  return gpu_gemm_fp8_blocks(b, m, n, k, A, sa, B, sb, 0, C, err, errlen);
}

int gpu_gemm_fp8_blocks(gpu_blas *b, int64_t m, int64_t n, int64_t k, gpu_ptr A, gpu_ptr sa, gpu_ptr B, gpu_ptr sb,
                        int b_blocks, const gpu_mat *C, char *err, size_t errlen) {
  err[0] = 0;
  if (m == 0 || n == 0) return 0;
  if (k % 128 != 0 || m % 16 != 0 || n % 16 != 0 || C->trans || C->stride) {
    snprintf(err, errlen, "fp8 gemm: %lld x %lld x %lld: k must be a multiple of 128, m and n of 16 (and C plain)",
             (long long)m, (long long)n, (long long)k);
    return -1;
  }
  /* Row-major C (m, n) = A B^T is column-major C^T (n, m) = B'^T A' with B' = B^T (k, n) and
   * A' = A^T (k, m) column-major, ld k: cuBLASLt's "TN", the one FP8 layout Hopper runs. Its
   * first operand is our B, so its A scales are sb. */
  int opa = CUBLAS_OP_T, opb = CUBLAS_OP_N, mode = MATRIX_SCALE_VEC128_32F,
      mode_b = b_blocks ? MATRIX_SCALE_BLK128x128_32F : MATRIX_SCALE_VEC128_32F;
  int8_t fast = 0; /* block scaling promotes every 128 of k; fast accumulation is refused */
  void *desc = NULL, *la = NULL, *lb = NULL, *lc = NULL;
  int rc = -1;
  const void *psa = (const void *)(uintptr_t)sb, *psb = (const void *)(uintptr_t)sa;
  if (b->api->MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != 0) goto done;
  if (b->api->MatmulDescSetAttribute(desc, DESC_TRANSA, &opa, sizeof opa) ||
      b->api->MatmulDescSetAttribute(desc, DESC_TRANSB, &opb, sizeof opb) ||
      b->api->MatmulDescSetAttribute(desc, DESC_FAST_ACCUM, &fast, sizeof fast) ||
      b->api->MatmulDescSetAttribute(desc, DESC_A_SCALE_MODE, &mode_b, sizeof mode_b) ||
      b->api->MatmulDescSetAttribute(desc, DESC_B_SCALE_MODE, &mode, sizeof mode) ||
      b->api->MatmulDescSetAttribute(desc, DESC_A_SCALE_POINTER, &psa, sizeof psa) ||
      b->api->MatmulDescSetAttribute(desc, DESC_B_SCALE_POINTER, &psb, sizeof psb)) {
    snprintf(err, errlen, "fp8 gemm: this cuBLASLt takes no 1x128 block scales (cuBLAS 12.9 or newer, Hopper)");
    goto done;
  }
  if (b->api->MatrixLayoutCreate(&la, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)n, k) != 0 ||
      b->api->MatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)m, k) != 0 ||
      !(lc = layout(b, C->dtype, n, m, C->ld, 1, 0)))
    goto done;
  {
    /* k bucketed too: the weight gradient's k is an expert's padded row count, new every step */
    int64_t kb = pow2_at_least(k),
            key[12] = {pow2_at_least(m), n, kb, 1000 /* fp8 */, C->dtype, b_blocks, 1, kb, kb, C->ld, 1, 0};
    lt_call call = {desc, la, lb, lc, (const void *)(uintptr_t)B, (const void *)(uintptr_t)A, (void *)(uintptr_t)C->p,
                    (const void *)(uintptr_t)C->p, 1.0f, 0.0f};
    const int64_t mnk[3] = {m, n, k};
    if (run_cached(b, &call, key, mnk, 1, b_blocks ? "fp8 GEMM with 1x128 x 128x128 block scales" : "fp8 GEMM with 1x128 block scales",
                   err, errlen) != 0)
      goto done;
  }
  rc = 0;
done:
  return finish(b, rc, desc, la, lb, lc, "cuBLASLt setup failed (fp8 gemm)", err, errlen);
}

/* ---- lanes: independent GEMMs on several streams ---- */
int gpu_blas_fork(gpu_blas *b, char *err, size_t errlen) {
  if (b->lanes <= 1 || b->lane >= 0) return 0;
  if (!b->lanes_made) {
    for (int i = 0; i < b->lanes; i++)
      if (gpu_stream_new(b->g, &b->lane_stream[i]) != 0 || gpu_event_new(b->g, &b->lane_done[i]) != 0 ||
          gpu_alloc(b->g, &b->lane_ws[i], b->workspace_bytes, "a cuBLASLt workspace (MOEC_GEMM_STREAMS)") != 0)
        goto fail;
    if (gpu_event_new(b->g, &b->forked) != 0) goto fail;
    b->lanes_made = 1;
  }
  if (gpu_event_record(b->g, b->forked) != 0) goto fail;
  for (int i = 0; i < b->lanes; i++)
    if (gpu_stream_wait(b->g, b->lane_stream[i], b->forked) != 0) goto fail;
  b->lane = 0;
  return 0;
fail:
  /* lanes are an optimisation: without their streams or workspaces (out of memory), say so
     once and go on with one stream */
  if (!b->lanes_made) {
    fprintf(stderr, "moec: warning: MOEC_GEMM_STREAMS=%d: %s; the expert GEMMs run on one stream\n", b->lanes,
            gpu_error(b->g));
    b->lanes = 1;
    return 0;
  }
  snprintf(err, errlen, "%s", gpu_error(b->g));
  return -1;
}

void gpu_blas_next_lane(gpu_blas *b) {
  if (b->lane >= 0) b->lane = (b->lane + 1) % b->lanes;
}

int gpu_blas_join(gpu_blas *b, int rc, char *err, size_t errlen) {
  if (b->lane < 0) return rc;
  b->lane = -1;
  for (int i = 0; i < b->lanes; i++)
    if (gpu_event_record_on(b->g, b->lane_done[i], b->lane_stream[i]) != 0 ||
        gpu_stream_wait(b->g, NULL, b->lane_done[i]) != 0) {
      if (rc == 0) snprintf(err, errlen, "%s", gpu_error(b->g)); /* the first failure's message stays */
      return -1;
    }
  return rc;
}
