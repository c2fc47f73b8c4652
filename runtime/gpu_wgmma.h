/* gpu_wgmma.h -- device-driven grouped GEMM in FP8 on Hopper (sm_90a): wgmma tensor-core
 * instructions, one launch for all experts of a layer, the per-expert row counts read from
 * device memory (no host synchronisation, so the launch can be captured in a CUDA graph).
 *
 * Operands are the packed forms gpu_fp8.h describes for cuBLASLt (E4M3, one f32 scale per
 * 128 of K on both sides), so the two paths are interchangeable:
 *   rows mode   C_e (m_e, N) = A_e (m_e, K) . B_e (N, K)^T   (forward and dgrad)
 *               A (S, K) row-major, expert e's rows at the sum of the earlier counts; its scales
 *               (K/128, fp8_rows(m_e)) at the sum of fp8_scale_floats(fp8_rows(m), K) before it;
 *               B (E, N, K), scales (K/128, fp8_rows(N)) a segment of fp8_scale_floats(...) per
 *               expert; C rows at the same offsets as A's, row stride ldc.
 *   wgrad mode  C_e (M, N) = A_e (M, P_e) . B_e (N, P_e)^T, P_e = 128 ceil(m_e / 128) (the
 *               expert's tokens, zero-padded), A_e at M Poff_e (or columns Poff_e.. of one
 *               (M, ld) matrix), scales (P_e/128, M) at M Poff_e / 128
 *               (rt_cuda_mxfp8_quantize_cols_experts); C_e at e M N, dense; an expert
 *               without rows gets zeros.
 * Unlike cuBLASLt's path, C is written only for the expert's own rows (no 16-row slack).
 *
 * The kernel (gpu_wgmma.c): a persistent grid walks tiles of BM x BN outputs (BM = 64 per
 * warpgroup, BN = 128, or 256 in the wide variant) across experts; K streams through shared
 * memory in 128-byte chunks (one scale block), ST stages, by TMA or cp.async, in wgmma's
 * 128-byte-swizzled K-major form; each chunk is four m64n128k32 wgmmas (a 128-column half) into
 * a fresh accumulator, which is then scaled by its rows' and columns' scales (or its square's
 * one) and added to the f32 result (the promotion every 128 of K that
 * DESIGN.md asks of FP8 on Hopper, since its FP8 tensor-core sums keep fewer bits than f32). */
#ifndef MOEC_GPU_WGMMA_H
#define MOEC_GPU_WGMMA_H

#include <stddef.h>
#include <stdint.h>

#include "codegen/cg_kernels.h"
#include "gpu_loader.h"

typedef struct gpu_wgmma gpu_wgmma;

/* The variants: X(tma, warpgroups, stages). tma 1: TMA loads by a producer warp, the two
 * math warpgroups on their own schedules; tma 2: the same in clusters of two blocks on
 * vertically adjacent tiles, each B tile read once and multicast to both (a quarter less L2
 * traffic); tma 3: 128 x 256 tiles (a quarter less L2 traffic than 128 x 128), the two math
 * warpgroups given a producer warpgroup's registers (setmaxnreg); tma 0: every thread loads by
 * cp.async, one block barrier a chunk; tma 4: tma 3 with its results written through shared
 * memory, 16-byte stores of whole rows (3 stages, to make room). A TMA variant
 * runs wgrad on the blocks layout (ld 0) with the first cp.async variant. Variant 3, the
 * multicast one, ran at about half variant 0's speed on the H200 (bench/RESULTS.md); variant 4
 * and 5 are the wide ones. 0 stays the default. */
#define GPU_WGMMA_VARIANTS(X) X(1, 2, 5) X(0, 2, 4) X(0, 1, 4) X(2, 2, 5) X(3, 2, 4) X(4, 2, 3)
enum { GPU_WGMMA_MAX_E = 128 };

/* The module's CUDA source (self-contained: no headers). */
const char *gpu_wgmma_source(void);

/* NULL with err "" where wgmma is unavailable (a device other than sm_90, or a toolkit that
 * cannot target sm_90a): the caller keeps cuBLASLt. NULL with a message on a real failure. */
gpu_wgmma *gpu_wgmma_new(gpu_ctx *g, const char *arch, const char *cache_dir, char *err, size_t errlen);
void gpu_wgmma_free(gpu_wgmma *w);
/* Which variant runs (index into GPU_WGMMA_VARIANTS; MOEC_WGMMA_VARIANT sets the default); one
 * that this device cannot run (shared memory, or a wide variant not compiled to the registers
 * its setmaxnreg split assumes) falls back to variant 0. */
void gpu_wgmma_set_variant(gpu_wgmma *w, int v);
int gpu_wgmma_n_variants(void);

/* rows mode; counts i32 (E) on the device summing to S (the rows of A and C; counts past S are
 * cut there, so a corrupt count never reads or writes out of bounds). tc: bf16 or f32. K a
 * multiple of 128, N of 16. sq, or 0: B's scales as squares (the weight-tile recipe), one per
 * 128 x 128 of each weight, rt_cuda_tile_blk_floats(N, K) an expert laid out as
 * rt_cuda_mxfp8_quantize_tiles writes them (N then a multiple of 128; sb unused): the
 * promotion is then one scale product an accumulator. 0, or -1 with the reason. */
int gpu_wgmma_fp8_rows(gpu_wgmma *w, gpu_ptr counts, int64_t E, int64_t S, int64_t N, int64_t K, gpu_ptr qa,
                       gpu_ptr sa, gpu_ptr qb, gpu_ptr sb, gpu_ptr sq, cg_dtype tc, gpu_ptr c, int64_t ldc, char *err,
                       size_t errlen);
/* wgrad mode; M and N multiples of 16. ld 0: A_e and B_e are (M, P_e) and (N, P_e) blocks one
 * after another (at M Poff_e and N Poff_e); ld > 0 (a multiple of 128, at least the sum of the
 * P_e): columns Poff_e.. of one (M, ld) and one (N, ld) matrix, which the TMA variant reads. */
int gpu_wgmma_fp8_wgrad(gpu_wgmma *w, gpu_ptr counts, int64_t E, int64_t S, int64_t M, int64_t N, int64_t ld,
                        gpu_ptr qa, gpu_ptr sa, gpu_ptr qb, gpu_ptr sb, cg_dtype tc, gpu_ptr c, char *err, size_t errlen);

#endif
