/* test_gpu_step.c -- the whole training step on the GPU against the CPU reference executor:
 * the same model, weights and batches; every parameter gradient of step 1 and the losses of
 * 20 steps, in fp32 and bf16, for tiny and l0_sanity (small sizes) and a GQA model.
 * Prints "SKIP" and passes where there is no CUDA driver or GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_exec.h"
#include "data.h"
#include "frontend.h"
#include "gpu_exec.h"
#include "gpu_loader.h"
#include "gpu_views.h"
#include "params.h"
#include "pipeline.h"

/* fused = 0: the naive per-expert step (dispatch, linears, combine); 1: the fusion passes'
 * step (expert sort/permute, grouped_mlp, grouped_linear); 2: that step with the mxfp8 pass. */
static ir_graph *load(const char *path, const moec_set *sets, int n, int fused) {
  ir_graph *g = moec_frontend_load(path, sets, n, stderr);
  pipeline_opts o = {.disable = fused == 2 ? NULL : fused ? "mxfp8" : "group-linear,grouped-mlp,mxfp8", .dump = stdout,
                     .train = 1};
  if (g && pipeline_run(&g, &o, stderr)) {
    ir_graph_free(g);
    return NULL;
  }
  return g;
}

/* Returns the number of failures. */
static int compare(const char *path, const moec_set *sets, int n_sets, int fused, double loss_tol, double grad_tol) {
  int failed = 0;
  const char *only = getenv("MOEC_GPU_STEP_ONLY"); /* e.g. "tiny": the quick half, for a short device call */
  if (only && !strstr(path, only)) {
    printf("%s: skipped (MOEC_GPU_STEP_ONLY=%s)\n", path, only);
    return 0;
  }
  ir_graph *g = load(path, sets, n_sets, fused);
  if (!g) return 1;
  char err[2048];
  data_opts dopt = {g->cfg.seq, 0, 0.01, 0, 0, 1};
  data_set *d = data_open("data/chr20_slice.fa.gz", &dopt, err, sizeof err);
  rt_params *pc = rt_params_new(g, 3), *pg = rt_params_new(g, 3);
  cpu_exec *cx = cpu_exec_new(g, pc, err, sizeof err);
  gpu_runtime *rt = gpu_runtime_new(pg, NULL, err, sizeof err);
  gpu_exec *gx = rt ? gpu_exec_new(rt, g, err, sizeof err) : NULL;
  if (!d || !cx || !gx) {
    fprintf(stderr, "%s: setup failed: %s\n", path, err);
    return 1;
  }
  int64_t T = g->cfg.batch * g->cfg.seq;
  int32_t *tok = malloc((size_t)T * 4), *lab = malloc((size_t)T * 4);
  double worst_loss = 0, worst_grad = 0;
  /* mxfp8(block = 128) on Hopper (sm_90) runs its expert GEMMs in FP8 (cuBLASLt, 1x128 block scales) */
  int fp8_sites = gpu_exec_fp8_sites(gx), want_fp8 = g->cfg.precision == PREC_MXFP8 && g->cfg.mx_block == 128 &&
                                                     gpu_info(gpu_runtime_ctx(rt))->cc_major == 9;
  if (want_fp8 && fp8_sites == 0) {
    failed++;
    fprintf(stderr, "%s: mxfp8(block = 128) on %s, yet no grouped GEMM runs in FP8\n", path, gpu_runtime_device(rt));
  }
  /* the weight-tile recipe with FP8 GEMMs keeps the expert weights as squares AdamW writes */
  const char *sq_env = getenv("MOEC_SQUARES");
  const int sq_off = sq_env && strcmp(sq_env, "0") == 0;
  int squares = gpu_exec_squares(gx);
  const int want_squares = fp8_sites && g->cfg.mx_weight_tile && !sq_off;
  if (want_squares && squares == 0) {
    failed++;
    fprintf(stderr, "%s: the weight-tile recipe with FP8 GEMMs, yet no expert weight is kept as squares\n", path);
  }
  if (sq_off && squares != 0) {
    failed++;
    fprintf(stderr, "%s: MOEC_SQUARES=0, yet %d stacks are kept as squares\n", path, squares);
  }
  if (squares) { /* a second graph on the runtime (as the validation graph is) shares them */
    gpu_exec *gx2 = gpu_exec_new(rt, g, err, sizeof err);
    int shared = gx2 ? gpu_exec_squares(gx2) : -1;
    if (shared != squares) {
      failed++;
      fprintf(stderr, "%s: a second executor keeps %d stacks as squares, the first %d%s%s\n", path, shared, squares,
              gx2 ? "" : ": ", gx2 ? "" : err);
    }
    gpu_exec_free(gx2);
  }
  size_t held_after2 = 0, held_after3 = 0;
  const char *steps_env = getenv("MOEC_GPU_STEP_STEPS"); /* fewer steps, e.g. 3 on the CPU emulator */
  const int64_t steps = steps_env && atoi(steps_env) > 0 ? atoi(steps_env) : 20;
  for (int64_t s = 1; s <= steps; s++) {
    data_train_batch(d, s - 1, g->cfg.batch, tok, lab);
    float oc[8], og[8];
    double nc, ng;
    cpu_exec_keep_all(cx, s == 1);
    gpu_exec_keep_all(gx, s == 1);
    if (cpu_exec_run(cx, tok, lab, s, oc, &nc, err, sizeof err) || gpu_exec_run(gx, tok, lab, s, og, &ng, err, sizeof err)) {
      fprintf(stderr, "%s: step %lld: %s\n", path, (long long)s, err);
      return failed + 1;
    }
    /* Bytes in use between steps (weights, moments, bf16 copies, caches sized by shape) settle
       by step 3 and then stay put: a leak, or a cache keyed by buffer address, would not. */
    size_t held = gpu_runtime_live_bytes(rt);
    if (s == 2) held_after2 = held;
    if (s == 3) held_after3 = held;
    if ((s > 3 && held != held_after3) || (s == 3 && held > held_after2 + held_after2 / 100)) {
      failed++;
      fprintf(stderr, "%s: step %lld: %zu bytes in use between steps; %zu after step 2, %zu after step 3\n", path,
              (long long)s, held, held_after2, held_after3);
    }
    if (held < (size_t)rt_params_numel(pg) * (g->cfg.moments_bf16 ? 8 : 12)) { /* the f32 weights and both moments at least */
      failed++;
      fprintf(stderr, "%s: step %lld: %zu bytes in use between steps, fewer than the weights and moments\n", path,
              (long long)s, held);
    }
    /* bytes in use by tensors (the pool's cache and rounding not counted) peak above what
       stays between steps and within what the driver gave */
    if (gpu_runtime_peak_used_bytes(rt) < held || gpu_runtime_peak_used_bytes(rt) > gpu_runtime_peak_bytes(rt)) {
      failed++;
      fprintf(stderr, "%s: step %lld: peak in use %zu bytes, not between the %zu in use between steps and the %zu reserved\n",
              path, (long long)s, gpu_runtime_peak_used_bytes(rt), held, gpu_runtime_peak_bytes(rt));
    }
    double rel = fabs((double)og[0] - oc[0]) / fabs((double)oc[0]);
    if (rel > worst_loss) worst_loss = rel;
    if (rel > loss_tol) {
      failed++;
      fprintf(stderr, "%s: step %lld: GPU loss %.7f, CPU %.7f (relative %.2g > %.2g)\n", path, (long long)s, og[0], oc[0], rel,
              loss_tol);
    }
    if (s != 1) continue;
    /* every parameter gradient of step 1: max |gpu - cpu| <= grad_tol * max |cpu| */
    for (int id = 0; id < g->n_nodes; id++) {
      if (g->nodes[id].op != OP_ADAMW) continue;
      int gid = g->nodes[id].in[1];
      int64_t n;
      const float *c = cpu_exec_value(cx, gid, &n);
      float *gv = malloc((size_t)n * 4);
      int64_t got = gpu_exec_value(gx, gid, gv, n);
      double maxd = 0, maxc = 0;
      for (int64_t i = 0; i < n && got == n; i++) {
        maxd = fmax(maxd, fabs((double)gv[i] - c[i]));
        maxc = fmax(maxc, fabs((double)c[i]));
      }
      double r = maxd / (maxc + 1e-12);
      if (r > worst_grad) worst_grad = r;
      if (got != n || r > grad_tol) {
        failed++;
        fprintf(stderr, "%s: gradient of %s: max error %.3g of max %.3g (relative %.2g > %.2g)\n", path,
                ir_get_str(&g->nodes[g->nodes[id].in[0]], "name", "?"), maxd, maxc, r, grad_tol);
      }
      free(gv);
    }
  }
  /* the squares AdamW wrote are those of the weights it left: every step's AdamW runs through
     them, so stale squares would show here (the losses alone let a stale step-1 copy pass) */
  if (squares) {
    int checked = gpu_exec_check_squares(gx, err, sizeof err);
    if (checked < 1) {
      failed++;
      fprintf(stderr, "%s: squares after %lld steps: %s\n", path, (long long)steps, checked < 0 ? err : "none checked");
    }
  }
  printf("%s [%s%s, %s%s%s]: %lld steps on %s; worst loss difference %.2g (tolerance %.2g), worst gradient %.2g (tolerance %.2g)\n",
         path, g->cfg.precision == PREC_FP32 ? "fp32" : g->cfg.precision == PREC_BF16 ? "bf16" : "mxfp8",
         g->cfg.precision == PREC_MXFP8 && g->cfg.mx_block == 128 ? g->cfg.mx_weight_tile ? "(block=128, weight_tile=128)" : "(block=128)" : "",
         fused ? "fused" : "naive",
         fp8_sites ? squares ? ", FP8 GEMMs, weights as squares" : ", FP8 GEMMs" : "",
         g->cfg.moments_bf16 ? ", bf16 moments" : "", (long long)steps, gpu_runtime_device(rt), worst_loss, loss_tol, worst_grad,
         grad_tol);
  free(tok);
  free(lab);
  gpu_exec_free(gx);
  gpu_runtime_free(rt);
  cpu_exec_free(cx);
  rt_params_free(pc);
  rt_params_free(pg);
  data_close(d);
  ir_graph_free(g);
  return failed;
}

/* One deterministic run (MOEC_DETERMINISTIC: no cuDNN attention, no GEMM tuning) of STEPS
 * steps of the mxfp8 pipeline on a fresh runtime with rt_params_new's weights, `env`=on (NULL: 0): its
 * losses, gradient norms, the views of kind `view` its graph has, the launches of its last
 * AdamW queued beside the next forward, and its weights and moments (*out, downloaded at the
 * end). Returns the number of failures. */
enum { STEPS = 3, ACT_STORES = -2 /* run_exact's view: count gpu_exec_act_stores instead */ };
typedef struct {
  float loss[STEPS];
  double norm[STEPS];
  int views, launches;
  rt_params *ps;
} exact_run;

static int run_exact(const char *path, const moec_set *sets, int n_sets, const char *env, const char *on, int view,
                     const char *what, exact_run *out) {
  char err[2048];
  int failed = 0;
  setenv("MOEC_DETERMINISTIC", "1", 1);
  setenv(env, on ? on : "0", 1);
  ir_graph *g = load(path, sets, n_sets, 2);
  data_opts dopt = {g ? g->cfg.seq : 1, 0, 0.01, 0, 0, 1};
  data_set *d = g ? data_open("data/chr20_slice.fa.gz", &dopt, err, sizeof err) : NULL;
  rt_params *pg = g ? rt_params_new(g, 3) : NULL;
  gpu_runtime *rt = pg ? gpu_runtime_new(pg, NULL, err, sizeof err) : NULL;
  gpu_exec *gx = rt ? gpu_exec_new(rt, g, err, sizeof err) : NULL;
  if (!d || !gx) {
    fprintf(stderr, "%s: %s check setup failed: %s\n", path, what, err);
    failed++;
  } else {
    out->views = view == ACT_STORES ? gpu_exec_act_stores(gx) : view >= 0 ? gpu_exec_views(gx, view) : 0;
    int64_t T = g->cfg.batch * g->cfg.seq;
    int32_t *tok = malloc((size_t)T * 4), *lab = malloc((size_t)T * 4);
    for (int s = 1; s <= STEPS && !failed; s++) {
      float o[8];
      data_train_batch(d, s - 1, g->cfg.batch, tok, lab);
      if (gpu_exec_run(gx, tok, lab, s, o, &out->norm[s - 1], err, sizeof err)) {
        fprintf(stderr, "%s: %s %s, step %d: %s\n", path, what, on ? "on" : "off", s, err);
        failed++;
      }
      out->loss[s - 1] = o[0];
    }
    out->launches = gpu_runtime_update_launches(rt);
    if (!failed && gpu_runtime_download(rt, pg, err, sizeof err)) { /* waits for the update in flight */
      fprintf(stderr, "%s: %s download: %s\n", path, what, err);
      failed++;
    }
    free(tok);
    free(lab);
  }
  gpu_exec_free(gx);
  gpu_runtime_free(rt);
  data_close(d);
  ir_graph_free(g);
  unsetenv(env);
  unsetenv("MOEC_DETERMINISTIC");
  out->ps = pg;
  return failed;
}

/* The losses and gradient norms of runs r[1] (on) and r[0] (off) the same bits; with weights,
 * their weights and moments too. 0 when so. */
static int same_bits(const char *path, const char *what, const char *env, const exact_run *r, int weights) {
  for (int s = 0; s < STEPS; s++)
    if (memcmp(&r[0].loss[s], &r[1].loss[s], sizeof(float)) || memcmp(&r[0].norm[s], &r[1].norm[s], sizeof(double))) {
      fprintf(stderr, "%s: step %d with %s: loss %.9g, grad norm %.12g; %s=0: %.9g, %.12g\n", path, s + 1, what,
              r[1].loss[s], r[1].norm[s], env, r[0].loss[s], r[0].norm[s]);
      return 1;
    }
  for (int i = 0; weights && i < r[0].ps->n; i++) {
    const rt_param *a = &r[0].ps->p[i], *b = &r[1].ps->p[i];
    if (memcmp(a->w, b->w, (size_t)a->numel * 4) || memcmp(a->m, b->m, (size_t)a->mn * 4) ||
        memcmp(a->v, b->v, (size_t)a->mn * 4)) {
      fprintf(stderr, "%s: with %s, %s's weights or moments after %d steps differ from %s=0's\n", path, what, a->name,
              STEPS, env);
      return 1;
    }
  }
  return 0;
}

/* A view that changes no bit, on with `env`=1 and off with `env`=0 (VIEW_GATHER: MOEC_GATHER,
 * VIEW_SPLIT_Q: MOEC_SPLIT_Q, VIEW_SPLIT_FP8: MOEC_SPLIT_FP8, VIEW_COLS: MOEC_COLS_VIEW, the act quantize's gate_up store:
 * MOEC_ACT_STORE): deterministic runs with it and without give the same losses and gradient
 * norms, and the first one has such views. (compare() checks gradients in step 1 only, which
 * keeps every value and so makes none of these views.) */
static int view_exact(const char *path, const moec_set *sets, int n_sets, const char *env, int view, const char *what) {
  const char *only = getenv("MOEC_GPU_STEP_ONLY");
  if (only && !strstr(path, only)) return 0;
  exact_run r[2];
  memset(r, 0, sizeof r);
  int failed = run_exact(path, sets, n_sets, env, "1", view, what, &r[1]);
  if (!failed) failed = run_exact(path, sets, n_sets, env, NULL, view, what, &r[0]);
  if (!failed && (r[1].views == 0 || r[0].views != 0)) {
    fprintf(stderr, "%s: %d %s views with %s=1 (want some), %d with %s=0 (want 0)\n", path, r[1].views, what, env, r[0].views,
            env);
    failed = 1;
  }
  if (!failed && !(failed = same_bits(path, what, env, r, 0)))
    printf("%s: %s (%d views): %d deterministic steps, losses and grad norms bit for bit those of %s=0\n", path, what,
           r[1].views, STEPS, env);
  rt_params_free(r[0].ps), rt_params_free(r[1].ps);
  return failed;
}

/* AdamW beside the next forward (MOEC_ADAMW_OVERLAP=mode: 1, high or low; off by default):
 * deterministic runs with it and without give the same losses, gradient norms, weights and
 * moments, bit for bit, and the first one queued its update in more than one launch. Its
 * update is slowed (MOEC_ADAMW_DELAY: 4 GiB of writes first on its stream, ~1 ms on an H200,
 * far longer than the host takes to start the next step), so a forward that read a weight
 * before its update, or reused a gradient's memory the update still reads, would change bits
 * on a GPU. (The CPU emulator runs every stream in the order queued: there the check is of the
 * launches and the holds' bookkeeping only.) */
static int overlap_exact(const char *path, const moec_set *sets, int n_sets, const char *mode) {
  const char *only = getenv("MOEC_GPU_STEP_ONLY"), *env = "MOEC_ADAMW_OVERLAP", *what = "AdamW overlapped";
  if (only && !strstr(path, only)) return 0;
  exact_run r[2];
  memset(r, 0, sizeof r);
  setenv("MOEC_ADAMW_DELAY", "4096", 1);
  int failed = run_exact(path, sets, n_sets, env, mode, -1, what, &r[1]);
  unsetenv("MOEC_ADAMW_DELAY");
  if (!failed) failed = run_exact(path, sets, n_sets, env, NULL, -1, what, &r[0]);
  if (!failed && (r[1].launches < 2 || r[0].launches != 0)) {
    fprintf(stderr, "%s: the update beside the forward made %d launches (want 2 or more), %d with %s=0 (want 0)\n", path,
            r[1].launches, r[0].launches, env);
    failed = 1;
  }
  if (!failed && !(failed = same_bits(path, what, env, r, 1)))
    printf("%s: %s (%s=%s, %d launches, each step's update slowed by 4 GiB of writes): %d deterministic steps, losses, "
           "grad norms, weights and moments bit for bit those of %s=0\n", path, what, env, mode, r[1].launches, STEPS, env);
  rt_params_free(r[0].ps), rt_params_free(r[1].ps);
  return failed;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* each configuration's line survives a run cut short */
  setvbuf(stderr, NULL, _IOLBF, 0);
  char err[512];
  int n = 0;
  if (gpu_driver_load(err, sizeof err) != 0 || gpu_device_count(&n, err, sizeof err) != 0 || n == 0) {
    printf("SKIP: no CUDA driver or GPU here (%s); the GPU step is tested on the H200\n", n == 0 && !err[0] ? "no device" : err);
    return 0;
  }
  const moec_set tiny32[] = {{"seq", "128"}, {"batch", "4"}, {"precision", "fp32"}};
  const moec_set tiny16[] = {{"seq", "128"}, {"batch", "4"}, {"precision", "bf16"}};
  const moec_set gqa[] = {{"seq", "64"}, {"batch", "2"}, {"heads", "8"}, {"kv_heads", "2"}, {"experts", "6"},
                          {"top_k", "3"}, {"precision", "fp32"}};
  /* l0_sanity at its own lr (1e-3) with batch 2 is chaotic within 20 steps: bf16 and fp32 runs
   * on the CPU alone part by 6% by step 16. At lr 2e-4 the trajectory is smooth, so a 1e-2
   * bound on the GPU-vs-CPU difference tests the executor, not the chaos. */
  const moec_set l0[] = {{"seq", "256"}, {"batch", "2"}, {"precision", "bf16"}, {"lr", "2e-4"}};
  /* fp32: cuBLASLt and the kernels sum in other orders than BLAS; bf16: each rounding of an
   * activation differs by an ulp of 2^-8, and routing can flip on near-ties */
  /* mxfp8 (the fused pipeline with the mxfp8 pass): the GPU keeps e4m3 values as the exact
   * values they encode, as the CPU does; a bf16 ulp of difference before a quantization can
   * move an element to the next E4M3 value, hence the bf16 bounds and no tighter */
  const moec_set tiny8[] = {{"seq", "128"}, {"batch", "4"}, {"precision", "mxfp8"}};
  const moec_set l08[] = {{"seq", "256"}, {"batch", "2"}, {"precision", "mxfp8"}, {"lr", "2e-4"}};
  /* mxfp8(block = 128): the same values, the expert GEMMs in FP8 on Hopper (fp32 sums of exact
   * products, in another order and with the tensor cores' reduced-precision partial sums) */
  const moec_set tiny8x[] = {{"seq", "128"}, {"batch", "4"}, {"precision", "mxfp8(block=128)"}};
  const moec_set l08x[] = {{"seq", "256"}, {"batch", "2"}, {"precision", "mxfp8(block=128)"}, {"lr", "2e-4"}};
  /* the weight-tile recipe: expert weights in 128 x 128 squares (cuBLASLt's square scales) */
  const moec_set tiny8t[] = {{"seq", "128"}, {"batch", "4"}, {"precision", "mxfp8(block=128, weight_tile=128)"}};
  /* ... with adamw(moments = bf16): the CPU rounds m and v after each update as the GPU stores them */
  const moec_set tiny8tm[] = {{"seq", "128"}, {"batch", "4"}, {"precision", "mxfp8(block=128, weight_tile=128)"}, {"moments", "bf16"}};
  int failed = compare("models/tiny.moe", tiny8t, 3, 2, 1e-2, 1e-1) + compare("models/tiny.moe", tiny8tm, 4, 2, 1e-2, 1e-1) + compare("models/tiny.moe", tiny8x, 3, 2, 1e-2, 1e-1) + compare("models/l0_sanity.moe", l08x, 4, 2, 1e-2, 1e-1) +
               compare("models/tiny.moe", tiny8, 3, 2, 1e-2, 1e-1) + compare("models/l0_sanity.moe", l08, 4, 2, 1e-2, 1e-1);
  for (int fused = 0; fused <= 1; fused++)
    failed += compare("models/tiny.moe", tiny32, 3, fused, 1e-4, 1e-3) + compare("models/tiny.moe", gqa, 7, fused, 1e-4, 1e-3) +
              compare("models/tiny.moe", tiny16, 3, fused, 1e-2, 1e-1) + compare("models/l0_sanity.moe", l0, 4, fused, 1e-2, 1e-1);
  /* bf16 moments with the bf16 copies instead of squares (both AdamW kernels' moment types), and
     the router's f32 GEMMs on cuBLASLt, not the narrow kernels: the switches that keep the
     older paths for side-by-side timing */
  setenv("MOEC_SQUARES", "0", 1), setenv("MOEC_NARROW_GEMM", "0", 1);
  printf("with MOEC_SQUARES=0, MOEC_NARROW_GEMM=0:\n");
  failed += compare("models/tiny.moe", tiny8tm, 4, 2, 1e-2, 1e-1);
  unsetenv("MOEC_SQUARES"), unsetenv("MOEC_NARROW_GEMM");
  /* the disjoint expert GEMMs (FP8 weight gradients, bf16 fused experts) on two lanes
     (MOEC_GEMM_STREAMS, read when the runtime makes its cuBLASLt handle) */
  setenv("MOEC_GEMM_STREAMS", "2", 1);
  printf("with MOEC_GEMM_STREAMS=2:\n");
  failed += compare("models/tiny.moe", tiny8x, 3, 2, 1e-2, 1e-1) + compare("models/tiny.moe", tiny16, 3, 1, 1e-2, 1e-1);
  unsetenv("MOEC_GEMM_STREAMS");
  /* the FP8 quantizes gathering the permuted rows (VIEW_GATHER), and the split backward
     quantizing its dg | du (VIEW_SPLIT_Q), each against its switch off */
  failed += view_exact("models/tiny.moe", tiny8t, 3, "MOEC_GATHER", VIEW_GATHER, "VIEW_GATHER");
  failed += view_exact("models/tiny.moe", tiny8t, 3, "MOEC_SPLIT_Q", VIEW_SPLIT_Q, "VIEW_SPLIT_Q");
  /* and writing its pieces' FP8 expert columns too, no bf16 piece (VIEW_SPLIT_FP8) */
  failed += view_exact("models/tiny.moe", tiny8t, 3, "MOEC_SPLIT_FP8", VIEW_SPLIT_FP8, "VIEW_SPLIT_FP8");
  /* attention_bwd's dq | dk read in place by the inverse ropes (VIEW_COLS), and dv by the v
     projection's FP8 quantizes (a window; MOEC_COLS_VIEW=0 copies it too) */
  failed += view_exact("models/tiny.moe", tiny8t, 3, "MOEC_COLS_VIEW", VIEW_COLS, "VIEW_COLS");
  /* grouped_mlp's saved gate_up quantized from its act quantize's loads (MOEC_ACT_STORE=1, off by
     default) */
  failed += view_exact("models/tiny.moe", tiny8t, 3, "MOEC_ACT_STORE", ACT_STORES, "the saved gate_up stored by the act quantize");
  /* the update beside the next forward: with the squares (a launch a stack), and with bf16
     moments and copies (chunks of rt_cuda_adamw_multi) */
  failed += overlap_exact("models/tiny.moe", tiny8t, 3, "1");
  setenv("MOEC_SQUARES", "0", 1);
  failed += overlap_exact("models/tiny.moe", tiny8tm, 4, "high");
  unsetenv("MOEC_SQUARES");
  if (failed) {
    fprintf(stderr, "test_gpu_step: %d failures\n", failed);
    return 1;
  }
  printf("test_gpu_step: GPU training steps match the CPU reference\n");
  return 0;
}
