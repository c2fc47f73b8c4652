/* gpu_flash.h -- fused causal grouped-query attention (FlashAttention-2 style), forward and
 * backward, bf16 storage, head dims 64 and 128, for gpu_attention.c. The kernels are one NVRTC
 * module (gpu_flash_source) of mma.sync m16n8k16 bf16 tensor-core code (fp32 accumulation),
 * ldmatrix and cp.async, all inline PTX, for sm_80 and later (sm_90a on Hopper). No
 * (B, nh, seq, seq) tensor exists anywhere.
 *
 * Forward: one block of W warps per (sequence, query head, 16 W query rows), 16 rows a warp,
 * Q fragments held in registers; K and V tiles of BN keys stream through shared memory by
 * cp.async, two stages; S = Q K^T and the online softmax (running max and sum, fp32, base 2)
 * stay in registers, and P, rounded to bf16, is the A operand of the P·V MMA straight from the
 * accumulators. Defaults: hd 64 W 8, BN 128, 80 KiB of shared memory, 1 block an SM; hd 128
 * W 8, BN 64, 96 KiB. Causal blocks skip the key tiles above the diagonal and run heaviest
 * first. The forward writes the row logsumexp (base 2, B x nh x seq padded) for the backward.
 *
 * Backward: fa_bwd_pre forms Dd = rowsum(dO ∘ O) (f32); the main kernel runs one block of W
 * warps per (sequence, KV head, 16 W keys), 16 keys a warp, and loops over every query head of
 * the KV group and every query tile of BQ rows at or after its keys, K and V resident in shared
 * memory, Q, dO, lse and Dd double-buffered: S^T = K Q^T and dP^T = V dO^T in registers,
 * P^T and dS^T = P^T (dP^T - Dd) rounded to bf16 as A operands of dV += P^T dO and
 * dK += dS^T Q. dK and dV of the whole group are summed in fp32 registers (no atomics); dS^T
 * also goes to shared memory for dQ = dS K, which is added into an fp32 buffer by vector
 * reductions (red.global.add.v2.f32) and then scaled and rounded into the packed gradient by
 * fa_dq_out. Defaults: hd 64 W 4 (64 keys), BQ 64, 57 KiB, 2 blocks an SM; hd 128 W 8 (128
 * keys), BQ 32, 104.5 KiB, 1 block an SM.
 *
 * Shared-memory tiles are rows of 16-byte chunks stored XOR-swizzled (gpu_flash.c), so that
 * every ldmatrix is free of bank conflicts.
 *
 * The logsumexp is kept between the forward and the backward of one step in a small cache
 * keyed by the (q, k, v, out) pointers and the shape: the executor calls the backward with
 * the same, unchanged, buffers it gave the forward. A backward with no matching forward
 * recomputes it (a forward into scratch).
 *
 * The header is C and C++: tests/emu/fa_emu_main.cpp takes the variants and their launch
 * geometry from here. */
#ifndef MOEC_GPU_FLASH_H
#define MOEC_GPU_FLASH_H

#include <stddef.h>
#include <stdint.h>

#include "gpu_loader.h"

/* Kernel variants, one kernel each in the module. The first of each head dim is the default;
 * MOEC_FLASH_FWD=i / MOEC_FLASH_BWD=i pick the i-th of that head dim instead (tests, tuning).
 *   forward:  X(hd, warps, keys per tile, min blocks per SM); 16 query rows a warp
 *   backward: X(hd, warps, query rows per tile, min blocks per SM); 16 keys a warp
 * Order from tests/unit/test_gpu_attention.c on an H200 at seq 8192, 16/8 heads, causal:
 * forward hd 64 0.604 / 0.641 / 0.620 ms, backward hd 64 2.18 / 2.30 / 2.22 ms, backward hd 128
 * 4.02 / 4.33 ms (bench/RESULTS.md). */
#define GPU_FLASH_FWD_VARIANTS(X) X(64, 8, 128, 1) X(64, 8, 64, 2) X(64, 4, 128, 2) X(128, 8, 64, 1)
#define GPU_FLASH_BWD_VARIANTS(X) X(64, 4, 64, 2) X(64, 8, 64, 1) X(64, 4, 32, 2) X(128, 8, 32, 1) X(128, 4, 32, 2)

typedef struct {
  int hd, warps, bq, bn, minb; /* bq = 16 warps */
  unsigned smem;               /* dynamic shared memory, bytes */
} gpu_flash_fwd_geom;
typedef struct {
  int hd, warps, bq, minb, bn; /* bn = 16 warps */
  unsigned smem;
} gpu_flash_bwd_geom;

enum { GPU_FLASH_PAD = 128 }; /* lse and Dd rows are padded to a multiple of this */

static inline gpu_flash_fwd_geom gpu_flash_fwd_geometry(int hd, int warps, int bn, int minb) {
  gpu_flash_fwd_geom g = {hd, warps, 16 * warps, bn, minb, (unsigned)((16 * warps + 4 * bn) * hd * 2)};
  return g;
}
static inline gpu_flash_bwd_geom gpu_flash_bwd_geometry(int hd, int warps, int bq, int minb) {
  const int bn = 16 * warps;
  gpu_flash_bwd_geom g = {hd, warps, bq, minb, bn, (unsigned)((2 * bn * hd + 4 * bq * hd + bn * bq) * 2 + 16 * bq)};
  return g;
}

#ifndef __cplusplus
typedef struct gpu_flash gpu_flash;

/* Compiles (NVRTC for arch, cached like every moec kernel) and loads the module. NULL with a
 * message on failure; NULL with err "" when arch is older than sm_80 (no bf16 mma.sync), where
 * the caller falls back to another attention. */
gpu_flash *gpu_flash_new(gpu_ctx *g, const char *arch, const char *cache_dir, char *err, size_t errlen);
void gpu_flash_free(gpu_flash *f);

/* A run of a graph begins: cached logsumexps of earlier runs are the first to be replaced. */
void gpu_flash_new_run(gpu_flash *f);
/* 1 when f has kernels for head dim hd (64 or 128, and the device's shared memory fits them). */
int gpu_flash_supports(const gpu_flash *f, int64_t hd);
/* The kernel in use for hd, forward (bwd 0) or backward: e.g. "fa_fwd_d64_w8_n64_m2". */
int gpu_flash_variant(const gpu_flash *f, int64_t hd, int bwd, char *name, size_t len);

/* Shapes: q/out/dout (B*seq, nh*hd), k/v (B*seq, nkv*hd), packed (B*seq, (nh + 2 nkv) hd),
 * all bf16, 16-byte aligned, hd supported, nh a multiple of nkv. The forward also leaves the
 * logsumexp (B, nh, seq padded to GPU_FLASH_PAD) f32 in the cache; the backward writes all of
 * packed: dq | dk | dv. */
int gpu_flash_fwd(gpu_flash *f, int64_t B, int64_t seq, int64_t nh, int64_t nkv, int64_t hd, int causal, gpu_ptr q,
                  gpu_ptr k, gpu_ptr v, gpu_ptr out, char *err, size_t errlen);
int gpu_flash_bwd(gpu_flash *f, int64_t B, int64_t seq, int64_t nh, int64_t nkv, int64_t hd, int causal, gpu_ptr q,
                  gpu_ptr k, gpu_ptr v, gpu_ptr out, gpu_ptr dout, gpu_ptr packed, char *err, size_t errlen);

/* The NVRTC source: the device prelude (inline PTX) followed by the body and one entry point
 * per variant. The body with its entry points, without the prelude, is what tests/emu
 * compiles on the CPU behind its own prelude. */
const char *gpu_flash_source(void);
const char *gpu_flash_body(void);
#endif

#endif
