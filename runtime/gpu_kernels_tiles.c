/* gpu_kernels_tiles.c -- the launch of the weight-tile quantize (cg_mxfp8_tiles.c; the CPU
 * reference is ck_mxfp8_qdq_tiles). */
#include "cpu_kernels.h"
#include "gpu_kernels_int.h"

#define ARGS(...) ((void *[]){__VA_ARGS__})

int64_t rt_cuda_tile_blk_floats(int64_t N, int64_t K) { return N / 128 * ((K / 128 + 3) / 4 * 4); }

int rt_cuda_mxfp8_quantize_tiles(rt_cuda *k, cg_dtype t, gpu_ptr x, int round_bf16, int64_t E, int64_t A, int64_t B,
                                 int64_t block, int transpose, gpu_ptr q, gpu_ptr codes, gpu_ptr blk) {
  if (E < 0 || A % 128 || B % 128 || block < 1 || 128 % block)
    return rtk_fail(k, "mxfp8_quantize_tiles: %lld (%lld, %lld) weights in 128 x 128 squares, blocks of %lld (%s)",
                    (long long)E, (long long)A, (long long)B, (long long)block, ck_strerror(CK_ESHAPE));
  if (x % 16)
    return rtk_fail(k, "mxfp8_quantize_tiles: the weight is not 16-byte aligned (%s)", ck_strerror(CK_ESHAPE));
  if (E * A * B == 0) return 0;
  const cg_variant v = {(int)block, 1};
  int64_t seg = transpose ? rt_cuda_tile_blk_floats(B, A) : rt_cuda_tile_blk_floats(A, B);
  int rb = round_bf16 != 0, tr = transpose != 0;
  char name[64];
  cg_kname(name, sizeof name, "mxfp8_quantize_tiles", 1, t);
  return rtk_launch(k, CG_FAM_MXFP8, &v, name, (uint64_t)(E * (A / 128) * (B / 128)), 1, CG_NT_MX,
                    ARGS(&x, &A, &B, &rb, &tr, &seg, &q, &codes, &blk));
}
