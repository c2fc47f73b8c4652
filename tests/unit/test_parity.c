/* test_parity.c -- moec's training step against PyTorch + Hugging Face transformers.
 *
 * tests/parity/tiny_ref.bin holds what MixtralForCausalLM (fp32, CPU, eager attention)
 * computed from moec's own initial weights of tests/parity/parity.moe: the loss and gradient
 * norm of n training steps on fixed tokens, a sample of step 1's logits, every gradient of
 * step 1 and every weight after the last step (format and the command that makes it:
 * tests/parity/README.md; generator: tests/parity/make_reference.py). This test loads the
 * same .moe file through the front end, builds the training step with the default pipeline,
 * initialises the parameters from the file's seed (the same weights `moec train --stop-at 0`
 * wrote for the reference), runs the same steps on the CPU executor and compares.
 *
 *   test_parity                 compare with tests/parity/tiny_ref.bin (run from the source root)
 *   test_parity --ref FILE      compare with another reference of the same model
 *   test_parity --set N=V ...   change the model or optimizer (to see that the test has teeth:
 *                               --set weight_decay=0.09 or --set rope_theta=1e4 must fail)
 * PARITY_VERBOSE=1 prints the error of every tensor.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_exec.h"
#include "gpu_exec.h"
#include "gpu_loader.h"
#include "ir.h"
#include "params.h"
#include "pipeline.h"
#include "train.h"

#if __has_include("frontend.h")
#include "frontend.h"
#define HAVE_FRONTEND 1
#else
#define HAVE_FRONTEND 0
#endif

#define MODEL_PATH "tests/parity/parity.moe"
#define REF_PATH "tests/parity/tiny_ref.bin"

#if !HAVE_FRONTEND
int main(void) {
  printf("test_parity: error: needs the front end (grammar/frontend.h) to load %s\n", MODEL_PATH);
  return 1;
}
#else

/* Tolerances; README.md ("Tolerances") says why, and what was measured. */
#define TOL_LOSS 1e-5       /* loss of every step: relative */
#define TOL_NORM 1e-5       /* gradient norm (before clipping) of every step: relative */
#define TOL_LOGITS 1e-5     /* logits sample: max|a-b| <= TOL_LOGITS * max|b| */
#define TOL_GRAD 1e-5       /* each gradient of step 1: max|a-b| <= TOL_GRAD * max|b| + TOL_ABS */
#define TOL_ABS 1e-10
#define TOL_W_MAX 0.02      /* each weight after the last step: max|a-b| <= TOL_W_MAX * lr */
#define TOL_W_RMS 2e-4      /*   and rms(a-b) <= TOL_W_RMS * lr */

#include "check.h"

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("test_parity: error: ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  exit(1);
}

/* ------------------------------------------------------------------ the model */

/* moec's layout -> HF's: transposes [in, out] into [out, in] for linear weights, including
 * the per-expert weights that group-linear stacks (pass_param_is_linear_weight). dims gets
 * the HF shape. */
static float *to_hf(const ir_graph *g, int id, const float *src, int *ndim, int64_t dims[4]) {
  const ir_type *t = &g->nodes[id].type;
  int64_t n = 1;
  for (int d = 0; d < t->rank; d++) n *= t->dims[d];
  float *out = malloc((size_t)n * sizeof(float));
  if (!out) die("out of memory");
  *ndim = t->rank;
  if (t->rank == 2 && pass_param_is_linear_weight(g, id)) {
    int64_t R = t->dims[0], C = t->dims[1]; /* (in, out) -> (out, in) */
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < C; c++) out[c * R + r] = src[r * C + c];
    dims[0] = C;
    dims[1] = R;
  } else {
    memcpy(out, src, (size_t)n * sizeof(float));
    for (int d = 0; d < t->rank; d++) dims[d] = t->dims[d];
  }
  return out;
}

static int param_node(const ir_graph *g, const char *name) {
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == OP_PARAM && strcmp(ir_get_str(&g->nodes[i], "name", ""), name) == 0) return i;
  return -1;
}

/* ------------------------------------------------------------------ reference file */

typedef struct {
  char *name;
  int ndim;
  int64_t dims[4], numel;
  float *data;
} ref_tensor;

typedef struct {
  uint32_t B, S, V, steps;
  int32_t *tokens, *labels;
  float *losses, *norms, *logits;
  int64_t logit_rows;
  uint32_t n_grads, n_final;
  ref_tensor *grads, *final;
} reference;

typedef struct {
  const unsigned char *p;
  size_t len, off;
  const char *path;
} reader;

static const void *take(reader *r, size_t n) {
  if (r->len - r->off < n) die("%s: truncated reference file", r->path);
  const void *p = r->p + r->off;
  r->off += n;
  return p;
}
static uint32_t take_u32(reader *r) {
  const unsigned char *b = take(r, 4);
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
/* n little-endian 4-byte values (i32 or f32) into a new array */
static void *take_array(reader *r, size_t n) {
  void *out = malloc(n * 4 + 4);
  if (!out) die("out of memory");
  memcpy(out, take(r, n * 4), n * 4); /* little-endian hosts only */
  return out;
}

static ref_tensor *take_tensors(reader *r, uint32_t *count) {
  *count = take_u32(r);
  ref_tensor *ts = calloc(*count + 1u, sizeof *ts);
  for (uint32_t i = 0; i < *count; i++) {
    uint32_t nl = take_u32(r);
    ts[i].name = calloc(nl + 1u, 1);
    memcpy(ts[i].name, take(r, nl), nl);
    ts[i].ndim = (int)take_u32(r);
    if (ts[i].ndim < 1 || ts[i].ndim > 4) die("%s: tensor %s has a bad rank", r->path, ts[i].name);
    ts[i].numel = 1;
    for (int d = 0; d < ts[i].ndim; d++) ts[i].numel *= ts[i].dims[d] = take_u32(r);
    ts[i].data = take_array(r, (size_t)ts[i].numel);
  }
  return ts;
}

static reference read_reference(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) die("cannot open %s: %s (run from the source root; see tests/parity/README.md)", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)n);
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) die("cannot read %s", path);
  fclose(f);
  reader r = {buf, (size_t)n, 0, path};
  reference ref;
  if (memcmp(take(&r, 8), "MOECREF\0", 8) != 0) die("%s: not a moec parity reference", path);
  if (take_u32(&r) != 1) die("%s: unknown version (this test reads version 1)", path);
  ref.B = take_u32(&r);
  ref.S = take_u32(&r);
  ref.V = take_u32(&r);
  ref.steps = take_u32(&r);
  size_t T = (size_t)ref.B * ref.S;
  ref.tokens = take_array(&r, T);
  ref.labels = take_array(&r, T);
  ref.losses = take_array(&r, ref.steps);
  ref.norms = take_array(&r, ref.steps);
  ref.logit_rows = T < 4 ? (int64_t)T : 4;
  ref.logits = take_array(&r, (size_t)ref.logit_rows * ref.V);
  ref.grads = take_tensors(&r, &ref.n_grads);
  ref.final = take_tensors(&r, &ref.n_final);
  if (r.off != r.len) die("%s: trailing bytes", path);
  free(buf);
  return ref;
}

static void free_tensors(ref_tensor *ts, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    free(ts[i].name);
    free(ts[i].data);
  }
  free(ts);
}

static void free_reference(reference *r) {
  free(r->tokens);
  free(r->labels);
  free(r->losses);
  free(r->norms);
  free(r->logits);
  free_tensors(r->grads, r->n_grads);
  free_tensors(r->final, r->n_final);
}

static const ref_tensor *find_tensor(const ref_tensor *ts, uint32_t n, const char *name) {
  for (uint32_t i = 0; i < n; i++)
    if (strcmp(ts[i].name, name) == 0) return &ts[i];
  return NULL;
}

/* ------------------------------------------------------------------ comparison */

typedef struct {
  double err, ref, rms; /* max |a-b|, max |b|, sqrt(mean((a-b)^2)) */
} diff;

static diff compare(const float *a, const float *b, int64_t n) {
  diff d = {0, 0, 0};
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]);
    if (!(e <= d.err)) d.err = e; /* NaN sticks */
    if (fabs(b[i]) > d.ref) d.ref = fabs(b[i]);
    d.rms += e * e;
  }
  d.rms = n ? sqrt(d.rms / (double)n) : 0;
  return d;
}

/* Compares moec's value of param node id (moec layout) with HF's tensor r. */
static diff compare_param(const ir_graph *g, int id, const float *moec, const ref_tensor *r, const char *what) {
  int nd;
  int64_t dims[4];
  float *hf = to_hf(g, id, moec, &nd, dims);
  diff d = {INFINITY, 0, INFINITY};
  int same = nd == r->ndim;
  for (int i = 0; same && i < nd; i++) same = dims[i] == r->dims[i];
  CHECK(same, "%s %s: moec's shape differs from the reference's", what, r->name);
  if (same) d = compare(hf, r->data, r->numel);
  free(hf);
  return d;
}

/* The executor under test: the CPU reference, or (--device cuda) the GPU. */
static cpu_exec *cx;
static gpu_runtime *grt;
static gpu_exec *gx;
static float *gbuf; /* host copy of a GPU value */

static int run_step(const int32_t *tok, const int32_t *lab, int64_t s, float *out, double *norm, char *err, size_t len) {
  if (gx) {
    gpu_exec_keep_all(gx, s == 1);
    return gpu_exec_run(gx, tok, lab, s, out, norm, err, len);
  }
  cpu_exec_keep_all(cx, s == 1);
  return cpu_exec_run(cx, tok, lab, s, out, norm, err, len);
}

static const float *value(int id, int64_t *n) {
  if (!gx) return cpu_exec_value(cx, id, n);
  if (!gbuf) gbuf = malloc(((size_t)1 << 24) * sizeof(float)); /* the parity model's largest value fits */
  *n = gbuf ? gpu_exec_value(gx, id, gbuf, (int64_t)1 << 24) : 0;
  return *n ? gbuf : NULL;
}

int main(int argc, char **argv) {
  const char *ref_path = REF_PATH;
  int cuda = 0;
  moec_set sets[16] = {{0}};
  int n_sets = 0;
  for (int i = 1; i < argc; i++) {
    char *eq = i + 1 < argc ? strchr(argv[i + 1], '=') : NULL;
    if (strcmp(argv[i], "--ref") == 0 && i + 1 < argc) {
      ref_path = argv[++i];
    } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc && strcmp(argv[i + 1], "cuda") == 0) {
      cuda = 1;
      i++;
    } else if (strcmp(argv[i], "--set") == 0 && eq && n_sets < 16) {
      *eq = 0;
      sets[n_sets++] = (moec_set){argv[i + 1], eq + 1};
      i++;
    } else {
      die("usage: test_parity [--ref FILE] [--device cuda] [--set NAME=VALUE]...");
    }
  }
  ir_graph *g = moec_frontend_load(MODEL_PATH, sets, n_sets, stdout);
  if (!g) die("cannot load %s (run from the source root)", MODEL_PATH);
  pipeline_opts opts = {0};
  opts.train = 1;
  if (cuda) {
    char derr[512] = "";
    int n_gpus = 0;
    if (gpu_driver_load(derr, sizeof derr) != 0 || gpu_device_count(&n_gpus, derr, sizeof derr) != 0 || n_gpus == 0) {
      printf("SKIP: --device cuda: no CUDA driver or GPU here (%s)\n", derr[0] ? derr : "no device");
      ir_graph_free(g);
      return 0;
    }
    opts.disable = "group-linear,grouped-mlp,mxfp8"; /* their ops have no GPU kernels yet */
  }
  if (pipeline_run(&g, &opts, stdout) != 0) die("the training pipeline failed");
  const moec_config *c = &g->cfg;
  /* what the reference assumes (make_reference.py has no router losses, no schedule) */
  if (c->precision != PREC_FP32 || c->aux_loss != 0 || c->z_loss != 0 || c->schedule != SCHED_CONSTANT ||
      c->warmup != 0)
    die("%s must be fp32, without router losses, with a constant learning rate", MODEL_PATH);
  rt_params *ps = rt_params_new(g, (uint64_t)c->seed);
  if (!ps) die("out of memory");

  reference ref = read_reference(ref_path);
  if (ref.B != c->batch || ref.S != c->seq || ref.V != c->vocab)
    die("%s was made for another model or batch; regenerate it (tests/parity/README.md)", ref_path);
  if (ref.n_grads != (uint32_t)ps->n || ref.n_final != (uint32_t)ps->n)
    printf("note: the reference has %u gradients and %u weights, moec %d parameters\n", ref.n_grads, ref.n_final,
           ps->n);

  char err[1024] = "";
  if (cuda) {
    if (!(grt = gpu_runtime_new(ps, NULL, err, sizeof err)) || !(gx = gpu_exec_new(grt, g, err, sizeof err)))
      die("--device cuda: %s", err);
    printf("executor: %s\n", gpu_runtime_device(grt));
  } else if (!(cx = cpu_exec_new(g, ps, err, sizeof err))) {
    die("cpu_exec_new: %s", err);
  }
  int ce = -1;
  for (int i = 0; i < g->n_nodes && ce < 0; i++)
    if (g->nodes[i].op == OP_CROSS_ENTROPY) ce = i;
  if (ce < 0) die("%s has no cross_entropy", MODEL_PATH);
  const int logits_id = g->nodes[ce].in[0];

  for (uint32_t s = 1; s <= ref.steps; s++) {
    float out[8] = {0};
    double norm = 0;
    if (run_step(ref.tokens, ref.labels, s, out, &norm, err, sizeof err) != 0)
      die("step failed: %s", err);
    double lerr = fabs(out[0] - ref.losses[s - 1]) / fabs(ref.losses[s - 1]);
    double nerr = fabs(norm - ref.norms[s - 1]) / fabs(ref.norms[s - 1]);
    printf("step %u: loss %.7f (HF %.7f, rel err %.1e)  grad_norm %.7f (HF %.7f, rel err %.1e)\n", s, out[0],
           ref.losses[s - 1], lerr, norm, ref.norms[s - 1], nerr);
    CHECK(lerr <= TOL_LOSS, "step %u: loss %.8g vs HF %.8g", s, out[0], ref.losses[s - 1]);
    CHECK(nerr <= TOL_NORM, "step %u: grad norm %.8g vs HF %.8g", s, norm, ref.norms[s - 1]);
    if (s != 1) continue;

    int64_t n;
    const float *lg = value(logits_id, &n);
    CHECK(lg && n >= ref.logit_rows * ref.V, "logits not kept");
    if (lg) {
      diff d = compare(lg, ref.logits, ref.logit_rows * ref.V);
      printf("logits sample: max err %.2e, max |HF| %.3g (rel %.1e)\n", d.err, d.ref, d.err / d.ref);
      CHECK(d.err <= TOL_LOGITS * d.ref, "logits: max err %.3g (max |HF| %.3g)", d.err, d.ref);
    }
    double worst = 0;
    const char *worst_name = "";
    int seen = 0;
    for (int i = 0; i < g->n_nodes; i++) {
      const ir_node *nd = &g->nodes[i];
      if (nd->op != OP_ADAMW) continue;
      const char *name = ir_get_str(&g->nodes[nd->in[0]], "name", "?");
      const ref_tensor *r = find_tensor(ref.grads, ref.n_grads, name);
      CHECK(r, "gradient of %s is not in the reference", name);
      const float *gv = value(nd->in[1], &n);
      if (!r || !gv) continue;
      seen++;
      diff d = compare_param(g, nd->in[0], gv, r, "gradient");
      double rel = d.err / (d.ref > 0 ? d.ref : 1);
      if (getenv("PARITY_VERBOSE")) printf("  grad %-60s max err %.2e  max|HF| %.2e  rel %.1e\n", name, d.err, d.ref, rel);
      if (rel > worst || rel != rel) worst = rel, worst_name = name;
      CHECK(d.err <= TOL_GRAD * d.ref + TOL_ABS, "gradient of %s: max err %.3g, max |HF| %.3g", name, d.err,
            d.ref);
    }
    printf("gradients of step 1: %d tensors, worst max err / max |HF| = %.1e (%s)\n", seen, worst, worst_name);
    CHECK(seen == (int)ref.n_grads, "compared %d gradients, the reference has %u", seen, ref.n_grads);
  }

  if (gx && gpu_runtime_download(grt, ps, err, sizeof err) != 0) die("download: %s", err);
  double worst = 0, worst_rms = 0;
  const char *worst_name = "", *worst_rms_name = "";
  int seen = 0;
  for (int i = 0; i < ps->n; i++) {
    const ref_tensor *r = find_tensor(ref.final, ref.n_final, ps->p[i].name);
    CHECK(r, "weight %s is not in the reference", ps->p[i].name);
    if (!r) continue;
    seen++;
    diff d = compare_param(g, param_node(g, ps->p[i].name), ps->p[i].w, r, "weight");
    if (getenv("PARITY_VERBOSE")) printf("  weight %-60s max err %.2e (%.3f lr) rms %.2e (%.1e lr)\n", r->name, d.err, d.err / c->lr, d.rms, d.rms / c->lr);
    if (d.err > worst || d.err != d.err) worst = d.err, worst_name = r->name;
    if (d.rms > worst_rms || d.rms != d.rms) worst_rms = d.rms, worst_rms_name = r->name;
    CHECK(d.err <= TOL_W_MAX * c->lr && d.rms <= TOL_W_RMS * c->lr,
          "weight %s after %u steps: max err %.3g (%.3g lr), rms err %.3g (%.3g lr)", r->name, ref.steps, d.err,
          d.err / c->lr, d.rms, d.rms / c->lr);
  }
  printf("weights after %u steps: %d tensors, worst max err %.2e = %.1e lr (%s), worst rms err %.1e lr (%s)\n",
         ref.steps, seen, worst, worst / c->lr, worst_name, worst_rms / c->lr, worst_rms_name);
  CHECK(seen == (int)ref.n_final, "compared %d weights, the reference has %u", seen, ref.n_final);

  cpu_exec_free(cx);
  gpu_exec_free(gx);
  gpu_runtime_free(grt);
  free(gbuf);
  free_reference(&ref);
  rt_params_free(ps);
  ir_graph_free(g);
  if (failures) {
    printf("test_parity: %d check(s) failed\n", failures);
    return 1;
  }
  printf("test_parity: moec matches Hugging Face MixtralForCausalLM: ok\n");
  return 0;
}
#endif
