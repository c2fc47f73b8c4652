/* bench_grouped_gemm.c -- the expert GEMMs of genos_1b and og2_8x1b on one GPU, as the
 * executor runs them today (cuBLASLt, one call per expert): bf16, and FP8 E4M3 with 1x128
 * block scales (gpu_gemm_fp8, the 128-shared MXFP8 operands), for the forward (xs . W),
 * dgrad (dy . W^T) and wgrad (xs^T . dy, k = the expert's rows, padded to 128 for FP8), of
 * the gate_up (K = hidden, N = 2 ffn) and down (K = ffn, N = hidden) weights; 8 experts and
 * 16,384 routed rows (seq 8192, top 2), balanced and skewed (one expert gets no rows).
 * "fp8_wgmma" is the device-driven FP8 grouped GEMM (runtime/gpu_wgmma.h: one launch for all
 * experts, counts read on the device) on the same operands, where the GPU is sm_90.
 * "fp8_blk" is cuBLASLt's FP8 with the weight's scales one per 128 x 128 block (the
 * DeepSeek-style weight recipe, gpu_gemm_fp8_blocks), fwd and dgrad only: is it faster?
 * "fp8_wgmma_blk" is the wgmma kernel reading the same squares (MOEC_WGMMA_VARIANT: which).
 * Prints one JSON line per case: GEMM time only (operands already quantized; the quantize
 * kernels are timed on their own in the "quantize" lines). TFLOP/s = 2 sum_e m_e K N / time.
 * bench/grouped_gemm.sh runs it next to torch._grouped_mm and prints the ratios.
 *   build/bench_grouped_gemm [REPS]          (skips, exit 0, without a GPU) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gpu_blas.h"
#include "runtime/gpu_kernels.h"
#include "runtime/gpu_loader.h"
#include "runtime/gpu_wgmma.h"

enum { E = 8, S = 16384 };

static const struct {
  const char *name;
  int64_t hidden, ffn;
} models[] = {{"genos_1b", 1024, 4096}, {"og2_8x1b", 2048, 4096}};

static const int64_t routings[2][E] = {
    {2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048},
    {5000, 3000, 2504, 2000, 1896, 1184, 800, 0}, /* multiples of 8 (torch._grouped_mm's wgrad needs them) */
};

static gpu_ctx *G;
static gpu_blas *BL;
static rt_cuda *KR;
static gpu_wgmma *WG;
static gpu_ptr dcounts[2]; /* i32 (E) of each routing, on the device */
static int routing_now;
static char err[1024];

/* MOEC_BENCH_ONLY=a,b,...: run only the sections named (gemm, quantize, mlp, splitfp8, adamw, router);
   unset: all of them */
static int section(const char *name) {
  const char *only = getenv("MOEC_BENCH_ONLY");
  if (!only || !*only) return 1;
  for (const char *p = only; (p = strstr(p, name)); p += strlen(name))
    if ((p == only || p[-1] == ',') && (p[strlen(name)] == ',' || !p[strlen(name)])) return 1;
  return 0;
}

static void die(const char *what) {
  fprintf(stderr, "bench_grouped_gemm: %s: %s\n", what, err[0] ? err : gpu_error(G));
  exit(1);
}

/* Events around queued work: the milliseconds between timer_start and timer_ms. */
typedef struct {
  void *e0, *e1;
} timer;
static timer timer_start(void) {
  timer t = {0, 0};
  if (gpu_event_new(G, &t.e0) || gpu_event_new(G, &t.e1) || gpu_event_record(G, t.e0)) die("events");
  return t;
}
static float timer_ms(timer t) {
  float ms = 0;
  if (gpu_event_record(G, t.e1) || gpu_event_elapsed(G, t.e0, t.e1, &ms) != 0) die("timing");
  gpu_event_free(G, t.e0), gpu_event_free(G, t.e1);
  return ms;
}

static gpu_ptr dalloc(size_t bytes) {
  gpu_ptr p = 0;
  if (gpu_alloc(G, &p, bytes, "a benchmark buffer") != 0) die("alloc");
  return p;
}

/* One pass over all experts; dt: 0 bf16, 1 fp8, 2 fp8 wgmma, 3 fp8 with squares, 4 fp8 wgmma
 * with squares. kind: 0 fwd (m_e, N, K), 1 dgrad (m_e, K, N),
 * 2 wgrad (K, N, m_e). Buffers are big enough for any expert; offsets follow the routing. */
typedef struct {
  gpu_ptr a, b, c, sa, sb;
} bufs;

static void pass(const bufs *u, int dt, int kind, const int64_t *cnt, int64_t K, int64_t N) {
  int64_t off = 0;
  if (dt == 2 || dt == 4) { /* one launch: fwd (m_e, N, K), dgrad (m_e, K, N), wgrad (K, N, tokens);
                               4: the weights' scales as squares (u->sb read as their table) */
    const gpu_ptr sq = dt == 4 ? u->sb : 0;
    int rc = kind == 0   ? gpu_wgmma_fp8_rows(WG, dcounts[routing_now], E, S, N, K, u->a, u->sa, u->b, u->sb, sq,
                                              CG_DT_BF16, u->c, N, err, sizeof err)
             : kind == 1 ? gpu_wgmma_fp8_rows(WG, dcounts[routing_now], E, S, K, N, u->a, u->sa, u->b, u->sb, sq,
                                              CG_DT_BF16, u->c, K, err, sizeof err)
                         : gpu_wgmma_fp8_wgrad(WG, dcounts[routing_now], E, S, K, N, S + E * 128, u->a, u->sa, u->b, u->sb,
                                               CG_DT_BF16, u->c, err, sizeof err);
    if (rc != 0) die("wgmma fp8 gemm");
    return;
  }
  for (int e = 0; e < E; e++) {
    int64_t me = cnt[e];
    if (me == 0) continue;
    int64_t m = kind == 2 ? K : me, n = kind == 0 ? N : kind == 1 ? K : N, k = kind == 0 ? K : kind == 1 ? N : me;
    if (dt == 1 || dt == 3) {
      if (kind == 2) k = (me + 127) / 128 * 128; /* token blocks restart per expert, zero-padded */
      else m = fp8_rows(me);                   /* whole 16-row blocks (gpu_fp8.h) */
      int64_t a_off = kind == 2 ? off * K : off * k;    /* bytes into the packed operands */
      gpu_mat C = {CG_DT_BF16, u->c + (gpu_ptr)(kind == 2 ? e * K * N * 2 : off * n * 2), n, 0, 0};
      if (gpu_gemm_fp8_blocks(BL, m, n, k, u->a + (gpu_ptr)a_off, u->sa + (gpu_ptr)(off * (k / 128) * 4), u->b, u->sb,
                              dt == 3, &C, err, sizeof err) != 0)
        die("fp8 gemm");
    } else {
      /* bf16, row-major: fwd xs (me, K) . W (K, N); dgrad dy (me, N) . W^T; wgrad xs^T (K, me) . dy (me, N) */
      gpu_mat A = {CG_DT_BF16, u->a + (gpu_ptr)(off * (kind == 1 ? N : K) * 2), kind == 1 ? N : K, 0, kind == 2};
      gpu_mat B = {CG_DT_BF16, kind == 2 ? u->b + (gpu_ptr)(off * N * 2) : u->b, N, 0, kind == 1};
      gpu_mat C = {CG_DT_BF16, u->c + (gpu_ptr)(kind == 2 ? e * K * N * 2 : off * n * 2), n, 0, 0};
      if (gpu_gemm(BL, m, n, k, 1.0f, &A, &B, 0.0f, &C, 1, err, sizeof err) != 0) die("bf16 gemm");
    }
    off += me;
  }
}

static double time_ms(const bufs *u, int dt, int kind, const int64_t *cnt, int64_t K, int64_t N, int reps) {
  void *e0, *e1;
  if (gpu_event_new(G, &e0) || gpu_event_new(G, &e1)) die("event");
  for (int r = 0; r < 3; r++) pass(u, dt, kind, cnt, K, N); /* tuning and warm-up */
  gpu_event_record(G, e0);
  for (int r = 0; r < reps; r++) pass(u, dt, kind, cnt, K, N);
  gpu_event_record(G, e1);
  float ms = 0;
  if (gpu_event_elapsed(G, e0, e1, &ms) != 0) die("timing");
  gpu_event_free(G, e0);
  gpu_event_free(G, e1);
  return ms / reps;
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 20, ndev = 0;
  if (gpu_driver_load(err, sizeof err) != 0 || gpu_device_count(&ndev, err, sizeof err) != 0 || ndev == 0) {
    printf("SKIP: no CUDA driver/GPU (%s)\n", err[0] ? err : "the driver sees no GPU");
    return 0;
  }
  if (!(G = gpu_open(0, err, sizeof err))) die("open");
  rt_cuda_opts o = {.cache_dir = getenv("MOEC_CACHE") ? getenv("MOEC_CACHE") : ""};
  if (!(KR = rt_cuda_new(G, &o, err, sizeof err))) die("kernels");
  if (!(BL = gpu_blas_new(G, err, sizeof err))) die("cuBLASLt");
  const int64_t maxk = 8192, maxn = 8192;
  bufs u = {dalloc((size_t)(S + E * 128) * maxk * 2), dalloc((size_t)(S + E * 128) * maxn * 2),
            dalloc((size_t)E * maxk * maxn * 2 > (size_t)S * maxn * 2 ? (size_t)E * maxk * maxn * 2 : (size_t)S * maxn * 2),
            dalloc((size_t)(S + E * 128) * maxk / 128 * 4 * 4), dalloc((size_t)(S + E * 128) * maxn / 128 * 4 * 4)};
  /* operands: small random-ish bytes are enough for timing (E4M3 0x30 = 0.5, bf16 0x3f00 = 0.5); scales 1 */
  if (gpu_memset32(G, u.a, 0x3f003f00u, (S + E * 128) * maxk / 2) || gpu_memset32(G, u.b, 0x3f003f00u, (S + E * 128) * maxn / 2) ||
      gpu_memset32(G, u.sa, 0x3f800000u, (S + E * 128) * maxk / 128 * 4) ||
      gpu_memset32(G, u.sb, 0x3f800000u, (S + E * 128) * maxn / 128 * 4))
    die("fill");
  /* the wgmma path where the device has it (MOEC_WGMMA_VARIANT picks its variant) */
  WG = gpu_wgmma_new(G, gpu_info(G)->arch, getenv("MOEC_CACHE") ? getenv("MOEC_CACHE") : "", err, sizeof err);
  if (!WG && err[0]) die("wgmma module");
  err[0] = 0;
  for (int r = 0; r < 2; r++) {
    int32_t c32[E];
    for (int e = 0; e < E; e++) c32[e] = (int32_t)routings[r][e];
    dcounts[r] = dalloc(sizeof c32);
    if (gpu_upload(G, dcounts[r], c32, sizeof c32) != 0) die("upload");
  }
  static const char *const kinds[3] = {"fwd", "dgrad", "wgrad"}, *const dts[5] = {"bf16", "fp8", "fp8_wgmma", "fp8_blk",
                                                                                                     "fp8_wgmma_blk"};
  for (size_t mi = 0; mi < (section("gemm") ? sizeof models / sizeof models[0] : 0); mi++)
    for (int w = 0; w < 2; w++) { /* gate_up, down */
      int64_t K = w == 0 ? models[mi].hidden : models[mi].ffn, N = w == 0 ? 2 * models[mi].ffn : models[mi].hidden;
      for (int r = 0; r < 2; r++)
        for (int kind = 0; kind < 3; kind++)
          for (int dt = 0; dt < 5; dt++) {
            /* fp8_blk, fp8_wgmma_blk: the weight's scales in 128 x 128 blocks, fwd and dgrad
               only (wgrad's operands are both activations) */
            if (((dt == 2 || dt == 4) && !WG) || ((dt == 3 || dt == 4) && kind == 2)) continue;
            routing_now = r;
            double ms = time_ms(&u, dt, kind, routings[r], K, N, reps);
            printf("{\"model\":\"%s\",\"weight\":\"%s\",\"K\":%lld,\"N\":%lld,\"routing\":\"%s\",\"pass\":\"%s\","
                   "\"dtype\":\"%s\",\"ms\":%.4f,\"tflops\":%.1f}\n",
                   models[mi].name, w == 0 ? "gate_up" : "down", (long long)K, (long long)N, r ? "skewed" : "balanced",
                   kinds[kind], dts[dt], ms, 2.0 * S * K * N / (ms * 1e9));
          }
    }
  /* the 128-shared quantize of one forward operand (S, K) bf16 -> e4m3 + scales, + the f32 scales */
  for (size_t mi = 0; mi < (section("quantize") ? sizeof models / sizeof models[0] : 0); mi++) {
    int64_t K = models[mi].hidden;
    void *e0, *e1;
    gpu_event_new(G, &e0), gpu_event_new(G, &e1);
    if (rt_cuda_mxfp8_quantize(KR, CG_DT_BF16, u.b, S, K, 32, 1, u.a, u.c) || /* warm-up: compile and load */
        rt_cuda_mxfp8_scales_vec128(KR, u.c, S, K, 32, 0, 0, 0, u.sa))
      die(rt_cuda_error(KR));
    gpu_event_record(G, e0);
    for (int i = 0; i < reps; i++)
      if (rt_cuda_mxfp8_quantize(KR, CG_DT_BF16, u.b, S, K, 32, 1, u.a, u.c) ||
          rt_cuda_mxfp8_scales_vec128(KR, u.c, S, K, 32, 0, 0, 0, u.sa))
        die(rt_cuda_error(KR));
    gpu_event_record(G, e1);
    float ms = 0;
    if (gpu_event_elapsed(G, e0, e1, &ms) != 0) die("timing");
    printf("{\"model\":\"%s\",\"quantize\":\"(%d, %lld) bf16\",\"ms\":%.4f,\"GB_per_s\":%.0f}\n", models[mi].name, S,
           (long long)K, ms / reps, (double)S * K * (2 + 1 + 1.0 / 32) / (ms / reps * 1e6));
  }
  /* the GroupedMLP's memory-bound kernels at each model's shapes (S rows, F = ffn), bytes
     moved / time: the split backward from the stored MXFP8 gate_up, the activation quantize,
     the gate_up weight's square quantize (E, H, 2F) transposed, the split quantizing its dgate|dup
     for the dgrad GEMM too (VIEW_SPLIT_Q), and that rows quantize alone (what the fused split
     saves). Bytes an element of F: split 12 (dact f32 4, gate|up E4M3 2, dgate|dup bf16 4, act
     bf16 2), act quantize 5 (gate|up bf16 4, E4M3 1); the square quantize 3 an element of the
     weight (bf16 in, E4M3 out); the fused split 14 (dgate|dup E4M3 2 more); the rows quantize 6
     (dgate|dup bf16 4 in, E4M3 2 out); the act quantize and the saved gate_up's rows quantize
     (grouped_mlp's forward) apart 11 (the second reads gate|up again: 4 in, 2 out), from one read
     of gate|up 7 */
  const gpu_ptr MB = (gpu_ptr)1 << 20;
  /* the split's E8M0 codes (u.b past gate_up's S x 2F E4M3 bytes): 127, scale 1, as a trained
     gate_up's are (~110-140), so the split takes the pairwise decode the step takes; u.b's bf16
     fill read as codes is 0 and 0x3f, and code 0 sent half the lanes down the per-byte path */
  if (gpu_memset32(G, u.b + (gpu_ptr)S * 2 * maxn, 0x7f7f7f7fu, (size_t)S * 2 * maxn / 32 / 4)) die("fill");
  for (size_t mi = 0; mi < (section("mlp") ? sizeof models / sizeof models[0] : 0); mi++) {
    int64_t F = models[mi].ffn, H = models[mi].hidden;
    gpu_ptr out = u.c, act = u.c + 2 * (gpu_ptr)(S * F) * 2, dp = act + (gpu_ptr)(S * F) * 2 + MB;
    /* dgate|dup's MXFP8 rows (S, 2F) and codes: blocks of 32 sharing 128, as mxfp8(block=128)'s */
    const gpu_ptr dq = u.c + 512 * MB, dsc = u.c + 700 * MB;
    /* the forward's gate_up as the step has it: the (S, 2F) window at column H of grouped_mlp's
       (S, H + 2F) output, bf16 0.5 (not u.a, which the quantize section overwrites), read by the
       act quantize and by the saved gate_up's quantize through the window (quantize_win, as
       fp8_pack runs it) */
    const int64_t W = H + 2 * F;
    const gpu_ptr gw = dalloc((size_t)(S * W) * 2), gwin = gw + (gpu_ptr)H * 2;
    if (gpu_memset32(G, gw, 0x3f003f00u, (size_t)(S * W) / 2)) die("fill");
    static const char *const names[] = {"mlp_bwd_split (MXFP8 gate_up)", "mxfp8_quantize_act", "mxfp8_quantize_tiles (E, H, 2F)^T",
                                        "mlp_bwd_split_q (+ dgate|dup rows quantized)", "mxfp8_quantize dgate|dup rows (unfused)",
                                        "quantize_act, then gate_up's quantize (apart)", "quantize_act_store (both, one read)"};
    static const double bytes_per_f[] = {4 + 2 + 2 * 2 + 2, 4 + 1, 0, 4 + 2 + 2 * 2 + 2 + 2, 4 + 2, 4 + 1 + 4 + 2, 4 + 1 + 2};
    for (int kn = 0; kn < 7; kn++) {
      double bytes = kn == 2 ? (double)E * H * 2 * F * 3 : (double)S * F * bytes_per_f[kn];
      for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        const timer tm = timer_start();
        int rc = kn == 0 || kn == 3
                     ? rt_cuda_mlp_bwd_split_mx(KR, CG_DT_BF16, u.a, 0, 2 * F, u.b, u.b + (gpu_ptr)S * 2 * maxn, 32, u.sa, out,
                                                act, dp, S, F, kn == 3 ? dq : 0, kn == 3 ? dsc : 0, kn == 3 ? 32 : 0)
                 : kn == 1 ? rt_cuda_mxfp8_quantize_act(KR, CG_DT_BF16, u.a, 2 * F, u.sa, S, F, 32, 1, u.c, u.c + 200 * MB)
                 : kn == 2 ? rt_cuda_mxfp8_quantize_tiles(KR, CG_DT_BF16, u.a, 0, E, H, 2 * F, 32, 1, u.c, u.c + 200 * MB,
                                                          u.c + 300 * MB)
                 : kn == 4 ? rt_cuda_mxfp8_quantize(KR, CG_DT_BF16, out, S, 2 * F, 32, 1, dq, dsc)
                 : kn == 5 ? rt_cuda_mxfp8_quantize_act(KR, CG_DT_BF16, gwin, W, u.sa, S, F, 32, 1, u.c, u.c + 200 * MB) ||
                                 rt_cuda_mxfp8_quantize_win(KR, CG_DT_BF16, gw, W, H, 0, S, 2 * F, 32, 1, dq, dsc, 0, 1, 0)
                           : rt_cuda_mxfp8_quantize_act_store(KR, CG_DT_BF16, gwin, W, u.sa, S, F, 32, 1, u.c, u.c + 200 * MB,
                                                              dq, dsc);
        if (rc) die(rt_cuda_error(KR));
        const float ms = timer_ms(tm);
        if (r == reps - 1) /* the last, warm */
          printf("{\"model\":\"%s\",\"kernel\":\"%s\",\"ms\":%.4f,\"GB_per_s\":%.0f}\n", models[mi].name, names[kn], ms,
                 bytes / (ms * 1e6));
      }
    }
    gpu_free(G, gw);
  }
  /* the split backward writing every FP8 operand (VIEW_SPLIT_FP8: dgate|dup's rows, dgate|dup's
     and act's expert columns, no bf16 piece) against what it replaces: the split quantizing its
     rows (VIEW_SPLIT_Q), then the column quantizes of its bf16 dgate|dup and act. Balanced
     routing. Bytes an element of F: fused 12 (dact f32 4, gate|up E4M3 2, rows 2, columns 3,
     dp's partials 1: written and read), apart 23 (the split_q's 14, then 4 + 2 and 2 + 1) */
  for (size_t mi = 0; mi < (section("splitfp8") ? sizeof models / sizeof models[0] : 0); mi++) {
    const int64_t F = models[mi].ffn, colb = S + 128 * E, units = S / 128 + E;
    const gpu_ptr out = u.c, act = out + (gpu_ptr)(S * 2 * F) * 2, dp = act + (gpu_ptr)(S * F) * 2;
    const gpu_ptr dq = dalloc((size_t)(S * 2 * F)), dsc = dalloc((size_t)(S * 2 * F / 32)),
                  qgu = dalloc((size_t)(2 * F * colb)), sgu = dalloc((size_t)(2 * F * units) * 4),
                  qa = dalloc((size_t)(F * colb)), sa = dalloc((size_t)(F * units) * 4), dpc = dalloc((size_t)(S * F / 8) * 4);
    const gpu_ptr gq = u.b, gsc = u.b + (gpu_ptr)S * 2 * maxn;
    rt_split_fp8 o = {dq, dsc, 32, qgu, sgu, qa, sa, 0, dpc, 0};
    static const char *const names[] = {"split_fp8 (rows + columns, no bf16)", "split_q, then 2 column quantizes",
                                        "split_fp8, the next wave's rows to L2 (ahead = SMs)"};
    for (int kn = 0; kn < 3; kn++)
      for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        const timer tm = timer_start();
        o.ahead = kn == 2 ? gpu_info(G)->sm_count : 0;
        int rc = kn != 1 ? rt_cuda_mlp_bwd_split_fp8(KR, CG_DT_BF16, u.a, 0, 2 * F, gq, gsc, 32, u.sa, dcounts[0], E, dp, S, F, &o)
                         : rt_cuda_mlp_bwd_split_mx(KR, CG_DT_BF16, u.a, 0, 2 * F, gq, gsc, 32, u.sa, out, act, dp, S, F, dq, dsc,
                                                    32) ||
                               rt_cuda_mxfp8_quantize_cols_experts_win(KR, CG_DT_BF16, out, 2 * F, 0, 0, S, 2 * F, dcounts[0], E, 0,
                                                                       qgu, sgu, 0, 1, 0) ||
                               rt_cuda_mxfp8_quantize_cols_experts_win(KR, CG_DT_BF16, act, F, 0, 0, S, F, dcounts[0], E, 0, qa,
                                                                       sa, 0, 1, 0);
        if (rc) die(rt_cuda_error(KR));
        const float ms = timer_ms(tm);
        if (r == reps - 1)
          printf("{\"model\":\"%s\",\"kernel\":\"%s\",\"ms\":%.4f,\"GB_per_s\":%.0f}\n", models[mi].name, names[kn], ms,
                 (double)S * F * (kn == 1 ? 23 : 12) / (ms * 1e6));
      }
    gpu_free(G, dq), gpu_free(G, dsc), gpu_free(G, qgu), gpu_free(G, sgu), gpu_free(G, qa), gpu_free(G, sa), gpu_free(G, dpc);
  }
  /* the optimizer step of a gate_up weight stack (E, H, 2F) under the weight-tile recipe: AdamW
     writing the bf16 copies then both square quantizes (the copies path, MOEC_SQUARES=0) against
     AdamW writing both orientations' squares (rt_cuda_adamw_squares), with f32 and bf16 moments.
     Bytes an element: copies 28 + 6 (g bf16 2, w m v read 12 written 12, copy 2; the quantizes read
     the copy twice and write 2), squares 28 (bf16 moments 20). */
  for (size_t mi = 0; mi < (section("adamw") ? sizeof models / sizeof models[0] : 0); mi++) {
    const int64_t H = models[mi].hidden, C = 2 * models[mi].ffn, n = H * C, N = E * n;
    rt_cuda_adamw_hp hp = {1e-4, 0.9, 0.95, 1e-8, 0.1, 5, 1.0, 0};
    gpu_ptr w, m, v, gr, wb, q0, q1, b0, b1, cd, tab;
    if (gpu_alloc(G, &w, (size_t)N * 4, "w") || gpu_alloc(G, &m, (size_t)N * 4, "m") || gpu_alloc(G, &v, (size_t)N * 4, "v") ||
        gpu_alloc(G, &gr, (size_t)N * 2, "g") || gpu_alloc(G, &wb, (size_t)N * 2, "wb") || gpu_alloc(G, &q0, (size_t)N, "q") ||
        gpu_alloc(G, &q1, (size_t)N, "q") || gpu_alloc(G, &b0, (size_t)N / 4096, "blk") ||
        gpu_alloc(G, &b1, (size_t)N / 4096, "blk") || gpu_alloc(G, &cd, (size_t)N / 32, "codes") ||
        gpu_alloc(G, &tab, (size_t)E * sizeof(rt_cuda_sq_param), "tab"))
      die(gpu_error(G));
    /* small finite values everywhere (v >= 0): the bytes of u.b's random bf16 rows */
    if (gpu_memset8(G, w, 0x3c, (size_t)N * 4) || gpu_memset8(G, m, 0x3c, (size_t)N * 4) ||
        gpu_memset8(G, v, 0x3c, (size_t)N * 4) || gpu_memset8(G, gr, 0x3c, (size_t)N * 2))
      die(gpu_error(G));
    rt_cuda_sq_param th[8];
    rt_cuda_adamw_tensor t[8];
    for (int64_t e = 0; e < E; e++) {
      gpu_ptr o4 = (gpu_ptr)(e * n * 4), o2 = (gpu_ptr)(e * n * 2);
      th[e] = (rt_cuda_sq_param){w + o4, m + o4, v + o4, 0, C};
      t[e] = (rt_cuda_adamw_tensor){w + o4, gr + o2, m + o4, v + o4, wb + o2, n, 0.1, {0, 0, 0, 0}};
    }
    if (gpu_upload(G, tab, th, sizeof th)) die(gpu_error(G));
    for (int kn = 0; kn < 5; kn++) {
      hp.moments_bf16 = kn == 2 || kn == 4; /* the moments' buffers, f32-sized, read as bf16 */
      for (int64_t e = 0; e < E; e++) t[e].wb = kn >= 3 ? 0 : wb + (gpu_ptr)(e * n * 2);
      for (int r = -1; r < reps; r++) {
        const timer tm = timer_start();
        int rc = kn >= 3 ? rt_cuda_adamw_multi(KR, CG_DT_BF16, t, (int)E, 0, &hp)
               : kn == 0 ? rt_cuda_adamw_multi(KR, CG_DT_BF16, t, (int)E, 0, &hp) ||
                               rt_cuda_mxfp8_quantize_tiles(KR, CG_DT_BF16, wb, 0, E, H, C, 32, 0, q0, cd, b0) ||
                               rt_cuda_mxfp8_quantize_tiles(KR, CG_DT_BF16, wb, 0, E, H, C, 32, 1, q1, cd, b1)
                         : rt_cuda_adamw_squares(KR, tab, 1, E, H, C, CG_DT_BF16, gr, 0, &hp, 0.1, 32, q0, b0, q1, b1);
        if (rc) die(rt_cuda_error(KR));
        const float ms = timer_ms(tm);
        if (r == reps - 1)
          printf("{\"model\":\"%s\",\"kernel\":\"%s\",\"ms\":%.4f,\"GB_per_s\":%.0f}\n", models[mi].name,
                 kn == 0   ? "adamw + bf16 copy, quantize_tiles x2 (E, H, 2F)"
                 : kn == 1 ? "adamw_squares (E, H, 2F)"
                 : kn == 2 ? "adamw_squares, bf16 moments (E, H, 2F)"
                 : kn == 3 ? "adamw alone (E, H, 2F)"
                           : "adamw alone, bf16 moments (E, H, 2F)",
                 ms, (double)N * (kn == 0 ? 34 : kn == 1 ? 28 : kn == 2 ? 20 : kn == 3 ? 26 : 18) / (ms * 1e6));
      }
    }
    gpu_ptr all[] = {w, m, v, gr, wb, q0, q1, b0, b1, cd, tab};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gpu_free(G, all[i]);
  }
  /* the router's three f32 GEMMs at seq 8192 (T tokens, E experts): the narrow kernels
     (rt_cuda_narrow_gemm, the executor's path) against cuBLASLt (MOEC_NARROW_GEMM=0). Bytes:
     the wide operand (T, H) f32 read or written, plus the narrow one */
  for (size_t mi = 0; mi < (section("router") ? sizeof models / sizeof models[0] : 0); mi++) {
    const int64_t T = 8192, H = models[mi].hidden;
    gpu_ptr x, dx, w, lg, dw;
    if (gpu_alloc(G, &x, (size_t)(T * H) * 4, "x") || gpu_alloc(G, &dx, (size_t)(T * H) * 4, "dx") ||
        gpu_alloc(G, &w, (size_t)(H * E) * 4, "w") || gpu_alloc(G, &lg, (size_t)(T * E) * 4, "logits") ||
        gpu_alloc(G, &dw, (size_t)(H * E) * 4, "dw") || gpu_memset8(G, x, 0x3c, (size_t)(T * H) * 4) ||
        gpu_memset8(G, w, 0x3c, (size_t)(H * E) * 4) || gpu_memset8(G, lg, 0x3c, (size_t)(T * E) * 4))
      die(gpu_error(G));
    /* (m, n, k, a, lda, ta, b, ldb, tb, c, ldc): logits = x . w, dx = dlogits . w^T, dw = x^T . dlogits */
    const struct {
      const char *what;
      int64_t m, n, k;
      gpu_ptr a;
      int64_t lda;
      int ta;
      gpu_ptr b;
      int64_t ldb;
      int tb;
      gpu_ptr c;
      int64_t ldc;
    } g3[3] = {{"router logits x . w", T, E, H, x, H, 0, w, E, 0, lg, E},
               {"router dx = dlogits . w^T", T, H, E, lg, E, 0, w, E, 1, dx, H},
               {"router dw = x^T . dlogits", H, E, T, x, H, 1, lg, E, 0, dw, E}};
    for (int gi = 0; gi < 3; gi++)
      for (int lib = 0; lib < 2; lib++) {
        if (lib == 0 && !rt_cuda_narrow_ok(g3[gi].m, g3[gi].n, g3[gi].k)) continue; /* dx: cuBLASLt's in the step */
        float ms = 0;
        for (int r = -1; r < reps; r++) {
          void *e0, *e1;
          gpu_event_new(G, &e0), gpu_event_new(G, &e1);
          gpu_event_record(G, e0);
          int rc;
          if (lib == 0) {
            rc = rt_cuda_narrow_gemm(KR, g3[gi].m, g3[gi].n, g3[gi].k, g3[gi].a, g3[gi].lda, g3[gi].ta, g3[gi].b, g3[gi].ldb,
                                     g3[gi].tb, g3[gi].c, g3[gi].ldc);
            if (rc) die(rt_cuda_error(KR));
          } else {
            gpu_mat A = {CG_DT_F32, g3[gi].a, g3[gi].lda, 0, g3[gi].ta}, B = {CG_DT_F32, g3[gi].b, g3[gi].ldb, 0, g3[gi].tb};
            gpu_mat Cm = {CG_DT_F32, g3[gi].c, g3[gi].ldc, 0, 0};
            char e[512];
            if (gpu_gemm(BL, g3[gi].m, g3[gi].n, g3[gi].k, 1.0f, &A, &B, 0.0f, &Cm, 1, e, sizeof e)) die(e);
          }
          gpu_event_record(G, e1);
          if (gpu_event_elapsed(G, e0, e1, &ms) != 0) die("timing");
          gpu_event_free(G, e0), gpu_event_free(G, e1);
        }
        printf("{\"model\":\"%s\",\"kernel\":\"%s\",\"by\":\"%s\",\"ms\":%.4f,\"GB_per_s\":%.0f}\n", models[mi].name,
               g3[gi].what, lib ? "cuBLASLt" : "narrow", ms, (double)(T * H + T * E) * 4 / (ms * 1e6));
      }
    gpu_ptr all[] = {x, dx, w, lg, dw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gpu_free(G, all[i]);
  }
  gpu_wgmma_free(WG);
  gpu_blas_free(BL);
  rt_cuda_free(KR);
  gpu_close(G);
  return 0;
}
