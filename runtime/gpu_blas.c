/* gpu_blas.c -- cuBLASLt through dlopen. No CUDA header is included: the handful of types
 * and enum values below are those of CUDA 13.0's cublasLt.h, cublas_api.h and
 * library_types.h (cited by name). */
#include "gpu_blas.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 };             /* library_types.h cudaDataType */
enum { CUBLAS_COMPUTE_32F = 68 };                      /* cublas_api.h cublasComputeType_t */
enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };             /* cublas_api.h cublasOperation_t */
enum { DESC_TRANSA = 3, DESC_TRANSB = 4 };             /* cublasLtMatmulDescAttributes_t */
enum { LAYOUT_BATCH_COUNT = 5, LAYOUT_STRIDED_BATCH_OFFSET = 6 }; /* cublasLtMatrixLayoutAttribute_t */
enum { PREF_MAX_WORKSPACE_BYTES = 1 };                 /* cublasLtMatmulPreferenceAttributes_t */

typedef struct {
  uint64_t data[8];
} lt_algo; /* cublasLtMatmulAlgo_t */
typedef struct {
  lt_algo algo;
  size_t workspace_size;
  int state;
  float waves;
  int reserved[4];
} lt_heuristic; /* cublasLtMatmulHeuristicResult_t */

typedef int (*fn_create)(void **);
typedef int (*fn_destroy)(void *);
typedef int (*fn_desc_create)(void **, int compute, int scale_type);
typedef int (*fn_set_attr)(void *, int attr, const void *buf, size_t size);
typedef int (*fn_layout_create)(void **, int type, uint64_t rows, uint64_t cols, int64_t ld);
typedef int (*fn_pref_create)(void **);
typedef int (*fn_heuristic)(void *handle, void *desc, void *a, void *b, void *c, void *d, void *pref, int n,
                            lt_heuristic *out, int *found);
typedef int (*fn_matmul)(void *handle, void *desc, const void *alpha, const void *A, void *Adesc, const void *B,
                         void *Bdesc, const void *beta, const void *C, void *Cdesc, void *D, void *Ddesc,
                         const lt_algo *algo, void *ws, size_t ws_size, void *stream);

/* Heuristic picks, cached per problem: the same shapes recur every step. */
typedef struct {
  int64_t key[12];
  lt_algo algo;
  int used;
} algo_entry;
#define ALGO_CACHE 512

struct gpu_blas {
  gpu_ctx *g;
  void *lib, *handle;
  gpu_ptr workspace;
  size_t workspace_bytes;
  fn_destroy handle_destroy, desc_destroy, layout_destroy, pref_destroy;
  fn_desc_create desc_create;
  fn_set_attr desc_set, layout_set, pref_set;
  fn_layout_create layout_create;
  fn_pref_create pref_create;
  fn_heuristic heuristic;
  fn_matmul matmul;
  algo_entry cache[ALGO_CACHE];
};

gpu_blas *gpu_blas_new(gpu_ctx *g, char *err, size_t errlen) {
  /* the loader's path first, then the toolkit's usual folders */
  static const char *names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so",
                                "/usr/local/cuda/lib64/libcublasLt.so.13", "/usr/local/cuda/lib64/libcublasLt.so.12"};
  void *lib = NULL;
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  const char *home = getenv("CUDA_HOME");
  if (!lib && home) {
    char path[1024];
    snprintf(path, sizeof path, "%s/lib64/libcublasLt.so.13", home);
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  }
  if (!lib) {
    snprintf(err, errlen, "libcublasLt.so.13 not found (install the CUDA 13 runtime libraries); use --device cpu");
    return NULL;
  }
  gpu_blas *b = calloc(1, sizeof *b);
  if (!b) {
    dlclose(lib);
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  b->g = g;
  b->lib = lib;
  struct {
    const char *name;
    void **slot;
  } syms[] = {
      {"cublasLtDestroy", (void **)&b->handle_destroy},
      {"cublasLtMatmulDescCreate", (void **)&b->desc_create},
      {"cublasLtMatmulDescDestroy", (void **)&b->desc_destroy},
      {"cublasLtMatmulDescSetAttribute", (void **)&b->desc_set},
      {"cublasLtMatrixLayoutCreate", (void **)&b->layout_create},
      {"cublasLtMatrixLayoutDestroy", (void **)&b->layout_destroy},
      {"cublasLtMatrixLayoutSetAttribute", (void **)&b->layout_set},
      {"cublasLtMatmulPreferenceCreate", (void **)&b->pref_create},
      {"cublasLtMatmulPreferenceDestroy", (void **)&b->pref_destroy},
      {"cublasLtMatmulPreferenceSetAttribute", (void **)&b->pref_set},
      {"cublasLtMatmulAlgoGetHeuristic", (void **)&b->heuristic},
      {"cublasLtMatmul", (void **)&b->matmul},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].slot = dlsym(lib, syms[i].name);
    if (!*syms[i].slot) {
      snprintf(err, errlen, "libcublasLt has no %s (too old a CUDA runtime?); use --device cpu", syms[i].name);
      gpu_blas_free(b);
      return NULL;
    }
  }
  fn_create create = (fn_create)dlsym(lib, "cublasLtCreate");
  int st = create ? create(&b->handle) : -1;
  if (st != 0) {
    snprintf(err, errlen, "cublasLtCreate failed (status %d)", st);
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
  if (b->workspace) gpu_free(b->g, b->workspace);
  if (b->handle && b->handle_destroy) b->handle_destroy(b->handle);
  if (b->lib) dlclose(b->lib);
  free(b);
}

static int lt_type(cg_dtype t) { return t == CG_DT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

/* A column-major layout (rows, cols, ld) with batching. */
static void *layout(gpu_blas *b, cg_dtype t, int64_t rows, int64_t cols, int64_t ld, int batch, int64_t stride) {
  void *l = NULL;
  if (b->layout_create(&l, lt_type(t), (uint64_t)rows, (uint64_t)cols, ld) != 0) return NULL;
  if (batch > 1) {
    int32_t n = batch;
    b->layout_set(l, LAYOUT_BATCH_COUNT, &n, sizeof n);
    b->layout_set(l, LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
  }
  return l;
}

int gpu_gemm(gpu_blas *b, int64_t m, int64_t n, int64_t k, float alpha, const gpu_mat *A, const gpu_mat *B,
             float beta, const gpu_mat *C, int batch, char *err, size_t errlen) {
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
  void *desc = NULL, *la = NULL, *lb = NULL, *lc = NULL, *pref = NULL;
  int rc = -1;
  if (b->desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != 0) goto done;
  b->desc_set(desc, DESC_TRANSA, &opa, sizeof opa);
  b->desc_set(desc, DESC_TRANSB, &opb, sizeof opb);
  la = layout(b, B->dtype, B->trans ? k : n, B->trans ? n : k, B->ld, batch, B->stride);
  lb = layout(b, A->dtype, A->trans ? m : k, A->trans ? k : m, A->ld, batch, A->stride);
  lc = layout(b, C->dtype, n, m, C->ld, batch, C->stride);
  if (!la || !lb || !lc) goto done;
  int64_t key[12] = {m, n, k, A->dtype, C->dtype, A->trans, B->trans, A->ld, B->ld, C->ld, batch, beta != 0};
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 12; i++) h = (h ^ (uint64_t)key[i]) * 1099511628211ull;
  algo_entry *e = &b->cache[h % ALGO_CACHE];
  if (!e->used || memcmp(e->key, key, sizeof key) != 0) {
    lt_heuristic res;
    int found = 0;
    if (b->pref_create(&pref) != 0) goto done;
    uint64_t ws = b->workspace_bytes;
    b->pref_set(pref, PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (b->heuristic(b->handle, desc, la, lb, lc, lc, pref, 1, &res, &found) != 0 || found < 1) {
      snprintf(err, errlen, "cuBLASLt has no algorithm for a %s GEMM (%lld x %lld x %lld, batch %d)",
               cg_dtype_name(A->dtype), (long long)m, (long long)n, (long long)k, batch);
      goto done;
    }
    memcpy(e->key, key, sizeof key);
    e->algo = res.algo;
    e->used = 1;
  }
  int st = b->matmul(b->handle, desc, &alpha, (void *)(uintptr_t)B->p, la, (void *)(uintptr_t)A->p, lb, &beta,
                     (void *)(uintptr_t)C->p, lc, (void *)(uintptr_t)C->p, lc, &e->algo,
                     (void *)(uintptr_t)b->workspace, b->workspace_bytes, gpu_stream(b->g));
  if (st != 0) {
    snprintf(err, errlen, "cublasLtMatmul failed (status %d) on %lld x %lld x %lld", st, (long long)m, (long long)n,
             (long long)k);
    goto done;
  }
  rc = 0;
done:
  if (rc != 0 && err[0] == 0) snprintf(err, errlen, "cuBLASLt setup failed");
  if (pref) b->pref_destroy(pref);
  if (la) b->layout_destroy(la);
  if (lb) b->layout_destroy(lb);
  if (lc) b->layout_destroy(lc);
  if (desc) b->desc_destroy(desc);
  return rc;
}
