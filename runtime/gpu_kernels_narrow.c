/* gpu_kernels_narrow.c -- launches of the narrow f32 GEMMs (codegen/cg_narrow.c). */
#include <stdio.h>

#include "gpu_kernels_int.h"

#define ARGS(...) ((void *[]){__VA_ARGS__})

enum { NK_ROWS = 32, NT_ROWS = 128 }; /* cg_narrow.c's block shapes */

/* Past NT_MAX_K rows of reduction the partial sums' scratch (k / NT_ROWS x m x n floats) would
 * be a large share of the operand (and grid y holds them): those go to cuBLASLt. */
enum { NT_MAX_K = NT_ROWS * 1024 };
int rt_cuda_narrow_ok(int64_t m, int64_t n, int64_t k) { return m > 0 && n > 0 && k > 0 && n <= CG_NARROW && k <= NT_MAX_K; }

int rt_cuda_narrow_gemm(rt_cuda *k, int64_t m, int64_t n, int64_t kk, gpu_ptr a, int64_t lda, int ta, gpu_ptr b,
                        int64_t ldb, int tb, gpu_ptr c, int64_t ldc) {
  if (!rt_cuda_narrow_ok(m, n, kk))
    return rtk_fail(k, "narrow gemm: %lld x %lld x %lld: n is not at most %d, or k is past the partial sums' scratch", (long long)m,
                    (long long)n, (long long)kk, CG_NARROW);
  const char *w = n <= 8 ? "8" : "16";
  char name[64];
  if (!ta) {
    snprintf(name, sizeof name, "moec_narrow_n_%s", w);
    return rtk_launch(k, CG_FAM_NARROW, NULL, name, rtk_blocks(m, NK_ROWS), 1, CG_NT_EW,
                      ARGS(&a, &lda, &b, &ldb, &tb, &c, &ldc, &m, &n, &kk));
  }
  /* a reduction over op(a)'s long side: partial sums of NT_ROWS rows, then their sum in order */
  int64_t P = (kk + NT_ROWS - 1) / NT_ROWS;
  gpu_ptr part = 0;
  if (rtk_scratch(k, (size_t)(P * m * n) * sizeof(float), &part) != 0) return -1;
  snprintf(name, sizeof name, "moec_narrow_tn_partial_%s", w);
  if (rtk_launch(k, CG_FAM_NARROW, NULL, name, rtk_blocks(m, CG_NT_EW), (uint64_t)P, CG_NT_EW,
                 ARGS(&a, &lda, &b, &ldb, &tb, &part, &m, &n, &kk)) != 0)
    return -1;
  uint64_t fb = rtk_blocks(m * n, CG_NT_EW);
  return rtk_launch(k, CG_FAM_NARROW, NULL, "moec_narrow_tn_final", fb > 65535 ? 65535 : fb, 1, CG_NT_EW,
                    ARGS(&part, &c, &ldc, &m, &n, &P));
}
