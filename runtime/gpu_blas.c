/* gpu_blas.c -- dlopen of cuBLASLt and its entry points (see gpu_blas.h). */
#include "gpu_blas.h"

#include "gpu_loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

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
