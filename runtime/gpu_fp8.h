/* gpu_fp8.h -- the expert GEMMs in FP8 (E4M3, one f32 scale per 128 of K; cuBLASLt
 * VEC128_32F through gpu_gemm_fp8, one call per expert) on the operands the executor packs
 * from the mxfp8 pass's 128-shared quantizations (docs/cuda.md, "FP8 GEMMs"):
 *   rows      (S, K) E4M3 row-major, expert e's rows at off_e; scales per expert (K/128, m_e)
 *             from rt_cuda_mxfp8_scales_vec128 with the counts;
 *   weights   (E, N, K) E4M3, one (N, K) matrix per expert; scales per expert (K/128, N)
 *             (segments of N rows);
 *   expert columns (the weight gradient's operands): rt_cuda_mxfp8_quantize_cols_experts.
 * Scale segments start at multiples of 4 floats (fp8_scale_floats). */
#ifndef MOEC_GPU_FP8_H
#define MOEC_GPU_FP8_H

#include <stdint.h>

#include "gpu_blas.h"
#include "ir.h"

/* The packed forms of a 128-shared mxfp8_quantize, by its axis (docs/passes.md, mxfp8). */
typedef enum {
  FP8_NONE,
  FP8_ROWS,  /* (S, K) along K: E4M3 as is + E8M0 (S, K/block); per-expert f32 scales at the reader */
  FP8_W_IN,  /* (E, K, N) along K: E4M3 (E, N, K) transposed + f32 scales, segments of N rows */
  FP8_W_OUT, /* (E, N, K) along K: E4M3 as is + f32 scales, segments of N rows */
  FP8_COLS,  /* (S, C) down the rows of each expert: rt_cuda_mxfp8_quantize_cols_experts */
  FP8_STORE, /* (S, K) along K, read only by dequantizes that write values (the saved gate_up):
                kept as E4M3 + E8M0 codes (about half its bf16 values) until they expand it */
} fp8_kind;

/* Which ops run their expert GEMMs in FP8, decided once per graph. A grouped GEMM op is a
 * site when every GEMM operand is mxfp8_dequantize(q) with q a 128-shared quantize of the
 * packed kind that operand needs; q then writes its packed form (and its exact values too
 * only if some other reader needs them), and a dequantize whose readers all take FP8 writes
 * nothing. */
typedef struct {
  uint8_t *site;   /* (n_nodes) */
  uint8_t *kind;   /* (n_nodes) fp8_kind, for quantizes read by a site */
  uint8_t *values; /* (n_nodes) 1: a quantize writes its exact values as well */
  uint8_t *skip;   /* (n_nodes) 1: a dequantize writes nothing */
} gpu_fp8_plan;

/* Fills p for g (all zero when !enabled: no FP8 anywhere); a packed quantize lives until
 * the last reader of its dequantizes (last_use updated). -1: out of memory. */
int gpu_fp8_plan_new(const ir_graph *g, int enabled, int *last_use, gpu_fp8_plan *p);
void gpu_fp8_plan_free(gpu_fp8_plan *p);
/* The packed kind that input k of a node of op `op` takes in FP8, FP8_NONE if none. */
fp8_kind gpu_fp8_operand_kind(ir_op op, int k);

/* C rows of expert e (m_e, N), row stride ldc, in tc = A_e (m_e, K) . B_e (N, K)^T, where A is
 * a rows operand (qa, sa) and B a weights operand (qb, sb; or, a weight in 128 x 128 squares,
 * sq != 0: its square scales, rt_cuda_mxfp8_quantize_tiles' blk). Experts without rows are skipped.
 * Each expert runs fp8_rows(m_e) rows (whole 16-row blocks): it reads up to 15 rows past its
 * own in A and writes as many in C, which the next expert's GEMM (queued after it) then
 * overwrites; so A and C need 15 rows of slack past the last expert's. */
int gpu_fp8_grouped_gemm(gpu_blas *b, const int32_t *counts, int64_t E, int64_t N, int64_t K, gpu_ptr qa, gpu_ptr sa,
                         gpu_ptr qb, gpu_ptr sb, gpu_ptr sq, cg_dtype tc, gpu_ptr c, int64_t ldc, char *err, size_t errlen);

/* dW_e (M, N) in tc, at c + e M N = A_e (M, P_e) . B_e (N, P_e)^T over the expert's (padded)
 * rows, A and B expert-columns operands of M and N columns; zero for an expert without rows. */
int gpu_fp8_grouped_wgrad(gpu_blas *b, gpu_ctx *g, const int32_t *counts, int64_t E, int64_t M, int64_t N, gpu_ptr qa,
                          gpu_ptr sa, gpu_ptr qb, gpu_ptr sb, cg_dtype tc, gpu_ptr c, char *err, size_t errlen);

#endif
