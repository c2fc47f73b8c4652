/* gpu_kernels_tiles.c -- the launches of the weight-tile quantize and of AdamW writing the
 * squares (cg_mxfp8_tiles.c; the CPU references are ck_mxfp8_qdq_tiles and ck_adamw_step). */
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

int rt_cuda_adamw_squares(rt_cuda *k, gpu_ptr tab, int parts, int64_t E, int64_t A, int64_t B, cg_dtype gt, gpu_ptr g,
                          gpu_ptr gnorm, const rt_cuda_adamw_hp *hp, double wd, int64_t block, gpu_ptr q, gpu_ptr blk,
                          gpu_ptr qt, gpu_ptr blkt) {
  if (E < 0 || parts < 1 || A % 128 || B % 128 || block < 1 || 128 % block)
    return rtk_fail(k, "adamw_squares: %lld (%lld, %lld) weights of %d parts in 128 x 128 squares (%s)", (long long)E,
                    (long long)A, (long long)B, parts, ck_strerror(CK_ESHAPE));
  if (g % 16)
    return rtk_fail(k, "adamw_squares: the gradient is not 16-byte aligned (%s)", ck_strerror(CK_ESHAPE));
  if (E * A * B == 0) return 0;
  const rt_cuda_adamw_hp none = {.step = 1}; /* unused: no update */
  rtk_adamw_scalars s = rtk_adamw_scalars_of(g ? hp : &none);
  float decay = g ? (float)(1.0 - hp->lr * wd) : 1.0f;
  int decay_on = wd != 0.0;
  const cg_variant v = {(int)block, 1};
  char name[64];
  cg_kname(name, sizeof name, "adamw_squares", 2, gt, hp && hp->moments_bf16 ? CG_DT_BF16 : CG_DT_F32);
  return rtk_launch(k, CG_FAM_MXFP8, &v, name, (uint64_t)(E * (A / 128) * (B / 128)), 1, CG_NT_MX,
                    ARGS(&tab, &parts, &g, &A, &B, &gnorm, &s.clip, &decay, &decay_on, &s.w1, &s.b2, &s.c2, &s.neg_step,
                         &s.bc2_sqrt, &s.eps, &s.small, &q, &blk, &qt, &blkt));
}
