/* test_gpu_bench.c -- times the generated kernels at genos_1b's shapes (seq 8192, batch 1,
 * hidden 1024, ffn 4096, 8 experts, top-2, vocab 128; bf16 activations) and prints each
 * one's time and achieved bandwidth (bytes it must move / time) against the device copy
 * ceiling (about 4.2 TB/s on an H200, DESIGN.md). Checks nothing; a first map of where the
 * memory-bound kernels stand. Skips where there is no GPU; MOEC_BENCH_REPS sets repetitions,
 * MOEC_BENCH_T the rows (8192; the optimizer's 64M parameters scale with it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu_kernels.h"
#include "runtime/gpu_kernels.h"
#include "runtime/gpu_loader.h"

const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libnvrtc\nleak:libcuda\n"; }

enum { H = 1024, F = 4096, E = 8, KK = 2, V = 128, NH = 16, HD = 64 };
static int64_t T = 8192; /* MOEC_BENCH_T: fewer rows (the CPU emulator) */

static gpu_ctx *G;
static rt_cuda *K;
static int reps = 20, failed;

static gpu_ptr buf(size_t bytes) {
  gpu_ptr p = 0;
  if (gpu_alloc(G, &p, bytes, "a benchmark buffer") != 0) {
    printf("FAIL: %s\n", gpu_error(G));
    exit(1);
  }
  gpu_memset8(G, p, 0x3c, bytes); /* bf16 / f32 patterns around 0.01..1, not zero */
  return p;
}

/* Times `call` (a statement using K): 2 warm-ups, then reps timed together. */
#define BENCH(name, bytes, call)                                                                    \
  do {                                                                                              \
    gpu_timer tm = {0};                                                                             \
    float ms = 0;                                                                                   \
    int ok_ = (call) == 0 && (call) == 0;                                                           \
    ok_ = ok_ && gpu_timer_start(G, &tm) == 0;                                                      \
    for (int r_ = 0; ok_ && r_ < reps; r_++) ok_ = (call) == 0;                                     \
    ok_ = ok_ && gpu_timer_stop(G, &tm, &ms) == 0;                                                  \
    gpu_timer_free(G, &tm);                                                                         \
    if (!ok_) {                                                                                     \
      printf("FAIL %s: %s %s\n", name, rt_cuda_error(K), gpu_error(G));                             \
      failed++;                                                                                     \
    } else {                                                                                        \
      double us = 1000.0 * ms / reps, gbs = (double)(bytes) / (us * 1e3);                          \
      printf("  %-40s %9.1f us %8.0f GB/s  %5.1f%% of 4200\n", name, us, gbs, gbs / 42.0);         \
    }                                                                                               \
  } while (0)

int main(void) {
  char err[1024];
  if (getenv("MOEC_BENCH_REPS")) reps = atoi(getenv("MOEC_BENCH_REPS"));
  if (getenv("MOEC_BENCH_T")) T = atoll(getenv("MOEC_BENCH_T"));
  int n = 0;
  if (gpu_device_count(&n, err, sizeof err) != 0 || n == 0) {
    printf("SKIP: no CUDA driver/GPU (%s)\n", n == 0 && !err[0] ? "the driver sees no GPU" : err);
    return 0;
  }
  if (!(G = gpu_open(0, err, sizeof err)) || !(K = rt_cuda_new(G, &(rt_cuda_opts){0}, err, sizeof err))) {
    printf("FAIL: %s\n", err);
    return 1;
  }
  printf("genos_1b shapes (T=%lld) on %s (%s), %d reps; bytes = what each kernel must read and write\n", (long long)T,
         gpu_info(G)->name, rt_cuda_arch(K), reps);
  const cg_dtype B = CG_DT_BF16, F32 = CG_DT_F32;
  const int64_t th = (int64_t)T * H, tf = (int64_t)T * KK * F, np = (int64_t)T * KK;
  gpu_ptr x = buf(th * 4), y = buf(th * 4), w = buf(H * 4), dw = buf(H * 4);
  gpu_ptr a = buf(tf * 2), b = buf(tf * 2), c = buf(tf * 2);
  BENCH("rmsnorm fwd (T,H) bf16", th * 4, rt_cuda_rmsnorm_fwd(K, B, F32, x, w, y, T, H, 1e-5f));
  BENCH("rmsnorm bwd dx+dw (T,H) bf16", th * 2 * 5, rt_cuda_rmsnorm_bwd(K, B, F32, x, w, y, 0, a, dw, T, H, 1e-5f));
  BENCH("rope fwd q (T,16x64) bf16", th * 4, rt_cuda_rope_fwd(K, B, x, NH * HD, y, T, NH, HD, T, 5e7));
  BENCH("silu fwd (2T,F) bf16", tf * 4, rt_cuda_silu_fwd(K, B, a, b, tf));
  BENCH("mul fwd (2T,F) bf16", tf * 6, rt_cuda_mul_fwd(K, B, a, b, c, tf));
  BENCH("silu bwd (2T,F) bf16", tf * 6, rt_cuda_silu_bwd(K, B, a, b, c, tf));
  BENCH("cast f32->bf16 (32M)", tf / 2 * 6, rt_cuda_cast(K, F32, a, B, c, tf / 2));

  gpu_ptr logits = buf((int64_t)T * E * 4), idx = buf(np * 4), rw = buf(np * 4), drw = buf(np * 4), sc = buf(64);
  gpu_memset32(G, logits, 0, (size_t)T * E);
  BENCH("topk (T,E=8)", T * E * 4 + np * 4, rt_cuda_topk(K, logits, idx, T, E, KK));
  BENCH("route weights fwd", T * E * 4 + np * 8, rt_cuda_route_weights_fwd(K, logits, idx, rw, T, E, KK));
  BENCH("aux loss fwd", T * E * 4 + np * 4, rt_cuda_aux_loss_fwd(K, logits, idx, sc, T, E, KK, 1e-3f));
  rt_cuda_routing r = {buf(np * 4), buf(np * 4), buf(np * 4), buf(E * 4), buf((E + 1) * 4)};
  BENCH("route (permutation, T*k pairs)", np * 16, rt_cuda_route(K, idx, T, KK, E, &r));
  gpu_ptr xe = buf(np * H * 2);
  BENCH("dispatch fwd all experts (2T,H) bf16", np * H * 4, rt_cuda_dispatch_fwd(K, B, x, r.rows, r.offsets, -1, xe, T, np, H));
  BENCH("combine fwd (T,H) bf16", np * H * 2 + th * 2, rt_cuda_combine_fwd(K, B, F32, r.pos, rw, xe, y, T, KK, H));
  BENCH("combine bwd dy+dw bf16", np * H * 4 + th * 2, rt_cuda_combine_bwd(K, B, F32, r.pos, rw, xe, y, xe, drw, T, KK, H));
  BENCH("dispatch bwd all experts bf16", np * H * 2 + th * 4, rt_cuda_dispatch_bwd_all(K, B, xe, r.pos, x, T, KK, H));

  gpu_ptr tok = buf(T * 4), tab = buf(V * H * 4), dtab = buf(V * H * 4);
  gpu_memset32(G, tok, 65, T); /* 'A' */
  BENCH("embedding fwd (T,H) bf16", th * 4, rt_cuda_embedding_fwd(K, B, tab, tok, y, T, V, H));
  BENCH("embedding bwd (T,H) bf16 -> f32 (V,H)", th * 2, rt_cuda_embedding_bwd(K, B, tok, y, dtab, T, V, H));
  gpu_ptr cel = buf((int64_t)T * V * 4), dcel = buf((int64_t)T * V * 4), one = buf(4);
  gpu_memset32(G, one, 0x3f800000u, 1);
  BENCH("cross-entropy fwd (T,V) bf16", (int64_t)T * V * 2, rt_cuda_cross_entropy_fwd(K, B, cel, tok, sc, T, V));
  BENCH("cross-entropy bwd (T,V) bf16", (int64_t)T * V * 6, rt_cuda_cross_entropy_bwd(K, B, cel, tok, one, dcel, T, V));

  const int64_t np_ = (64 << 20) / 8192 * T; /* 64M parameters at T = 8192 */
  gpu_ptr p = buf(np_ * 4), g = buf(np_ * 4), m = buf(np_ * 4), v = buf(np_ * 4), nrm = buf(4);
  gpu_memset32(G, v, 0x3c000000u, (size_t)np_);
  rt_cuda_adamw_hp hp = {3e-4, 0.9, 0.95, 1e-8, 0.1, 10, 1.0, 0};
  const cg_dtype f32 = CG_DT_F32;
  gpu_ptr wb = buf(np_ * 2);
  BENCH("grad norm (64M f32)", np_ * 4, rt_cuda_grad_norm(K, &g, &f32, &np_, 1, nrm));
  BENCH("adamw (64M f32)", np_ * 28, rt_cuda_adamw_step(K, p, CG_DT_F32, g, m, v, 0, np_, nrm, &hp));
  BENCH("adamw (64M, bf16 grads, bf16 copy out)", np_ * 28, rt_cuda_adamw_step(K, p, CG_DT_BF16, g, m, v, wb, np_, nrm, &hp));

  gpu_ptr q = buf(tf), s = buf(tf / 32);
  BENCH("mxfp8 quantize (2T,F) bf16, block 32", tf * 3 + tf / 32, rt_cuda_mxfp8_quantize(K, B, a, np, F, 32, 0, q, s));
  BENCH("mxfp8 quantize (2T,F) bf16, 128-shared", tf * 3 + tf / 32, rt_cuda_mxfp8_quantize(K, B, a, np, F, 32, 1, q, s));
  BENCH("mxfp8 quantize columns (2T,F) bf16", tf * 3 + tf / 32, rt_cuda_mxfp8_quantize_cols(K, B, a, np, F, 32, 0, q, s));
  BENCH("mxfp8 dequantize (2T,F) -> bf16", tf * 3 + tf / 32, rt_cuda_mxfp8_dequantize(K, B, q, s, np, F, 32, b));

  int ck = 0;
  if (rt_cuda_check(K, &ck) != 0) printf("FAIL: %s\n", rt_cuda_error(K)), failed++;
  char mem[32];
  printf("peak GPU memory: %s\n", gpu_fmt_bytes(gpu_peak_bytes(G), mem, sizeof mem));
  rt_cuda_free(K);
  gpu_close(G);
  printf("test_gpu_bench: %s\n", failed ? "FAILED" : "done");
  return failed ? 1 : 0;
}
