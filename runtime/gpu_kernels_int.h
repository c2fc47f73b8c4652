/* gpu_kernels_int.h -- internal to gpu_kernels*.c: the rt_cuda object and the helpers the
 * launch functions share. */
#ifndef MOEC_GPU_KERNELS_INT_H
#define MOEC_GPU_KERNELS_INT_H

#include "gpu_kernels.h"

enum { RTK_MAX_MODS = 32, RTK_FN_SLOTS = 1024 };

struct rt_cuda {
  gpu_ctx *g;
  char arch[16];
  char *dump_dir, *cache_dir; /* copies of the options (NULL: none / default) */
  struct {
    char name[64];
    void *mod;
  } mods[RTK_MAX_MODS];
  int n_mods;
  struct {
    char key[128]; /* "module/kernel"; "" = empty slot */
    void *fn;
    unsigned smem_max; /* the dynamic shared memory it was allowed (over 48 KiB; rtk_launch_smem) */
  } fns[RTK_FN_SLOTS];
  gpu_ptr err_flag;   /* i32 (), the device error flag */
  gpu_ptr ws;         /* scratch for partial sums, grown on demand */
  size_t ws_cap;
  struct {
    gpu_ptr cs;       /* f32 (P, half, 2), the rope table last built */
    int64_t P, half, hd;
    double theta;
  } rope;
  char err[4096];
};

int rtk_fail(rt_cuda *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Launches kernel `name` of the family's module (variant v, or none): grid (gx, gy), `threads`
 * per block; args as for cuLaunchKernel. Compiles and loads the module on first use. */
int rtk_launch(rt_cuda *k, cg_family f, const cg_variant *v, const char *name, uint64_t gx, uint64_t gy,
               unsigned threads, void **args);
/* The same with `smem` bytes of dynamic shared memory a block (over 48 KiB: allowed first). */
int rtk_launch_smem(rt_cuda *k, cg_family f, const cg_variant *v, const char *name, uint64_t gx, uint64_t gy,
                    unsigned threads, unsigned smem, void **args);
/* The same with a grid.z (a third grid dimension; the family's default variant). */
int rtk_launch3(rt_cuda *k, cg_family f, const char *name, uint64_t gx, uint64_t gy, uint64_t gz, unsigned threads,
                void **args);
/* Scratch of at least `bytes`, valid until the next call (kernels queued before the next
 * call that grows it have finished: growing waits for the stream). */
int rtk_scratch(rt_cuda *k, size_t bytes, gpu_ptr *p);
static inline uint64_t rtk_blocks(int64_t n, int64_t per) { return n <= 0 ? 0 : (uint64_t)((n + per - 1) / per); }
/* Blocks of CG_NT_EW threads for an ew_loop kernel over n values (a thread per 8). */
static inline uint64_t rtk_vec_blocks(int64_t n) { return rtk_blocks((n + 7) / 8, CG_NT_EW); }
/* Threads for a one-block-per-row kernel whose bulk takes 16-byte chunks of 8 columns: a chunk
 * each (whole warps, at most CG_NT_ROW), so that no lane idles on short rows and more rows run
 * at once; CG_NT_ROW where the row is not taken by chunks (vec 0). */
static inline unsigned rtk_row_threads(int64_t cols, int vec) {
  int64_t t = ((cols + 7) / 8 + 31) / 32 * 32;
  return !vec || t >= CG_NT_ROW ? CG_NT_ROW : t < 32 ? 32 : (unsigned)t;
}
/* The scalars of one AdamW step exactly as ck_adamw_step forms them (the decay is each
 * parameter's own): the optimizer's kernels' arguments. */
typedef struct {
  float w1, b2, c2, neg_step, bc2_sqrt, eps, clip;
  int small;
} rtk_adamw_scalars;
rtk_adamw_scalars rtk_adamw_scalars_of(const rt_cuda_adamw_hp *hp);
static inline size_t rtk_align(size_t b) { return (b + 255) & ~(size_t)255; }

#endif
