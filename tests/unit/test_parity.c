/* test_parity.c -- moec's training step against PyTorch + Hugging Face transformers.
 *
 * tests/parity/tiny_ref.bin holds what MixtralForCausalLM (fp32, CPU, eager attention) computed
 * from moec's own initial weights: the loss and gradient norm of n training steps on fixed
 * tokens, a sample of step 1's logits, every gradient of step 1 and every weight after the
 * last step (format: tests/parity/README.md; generator: tests/parity/make_reference.py).
 * This test builds the same model, initialises it from the same seed, runs the same steps on
 * the CPU executor and compares.
 *
 *   test_parity                 compare with tests/parity/tiny_ref.bin (run from the source root)
 *   test_parity --ref FILE      compare with another reference
 *   test_parity --export DIR    write the initial weights as DIR/model.safetensors (HF names
 *                               and layouts, f32) and DIR/config.json, for make_reference.py
 *
 * Tolerances (why they are what they are: README.md, "Tolerances").
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cpu_exec.h"
#include "ir.h"
#include "params.h"
#include "pipeline.h"

#define REF_PATH "tests/parity/tiny_ref.bin"

/* loss of every step: relative */
#define TOL_LOSS 1e-4
/* gradient norm of every step: relative */
#define TOL_NORM 1e-4
/* logits sample and each gradient of step 1: max|a-b| <= TOL_REL * max|b| + TOL_ABS */
#define TOL_LOGITS 1e-4
#define TOL_GRAD_REL 1e-3
#define TOL_ABS 1e-6
/* weights after the last step: max|a-b| <= TOL_W_LR * lr (see README) */
#define TOL_W_LR 0.05

static int failures;
#define CHECK(cond, ...)                               \
  do {                                                 \
    if (!(cond)) {                                     \
      failures++;                                      \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);      \
      printf(__VA_ARGS__);                             \
      printf("\n");                                    \
    }                                                  \
  } while (0)

static void die(const char *fmt, const char *a, const char *b) {
  printf("test_parity: error: ");
  printf(fmt, a, b);
  printf("\n");
  exit(1);
}

/* ------------------------------------------------------------------ the model */

/* The parity model: small enough that the reference file stays near 1 MB, with grouped-query
 * attention (kv_heads < heads) and more experts than top_k so that routing matters. */
static void parity_config(moec_config *c) {
  memset(c, 0, sizeof *c);
  c->vocab = 256;
  c->hidden = 64;
  c->layers = 2;
  c->seq = 32;
  c->heads = 4;
  c->kv_heads = 2;
  c->head_dim = 16;
  c->experts = 4;
  c->top_k = 2;
  c->ffn = 64;
  c->norm_eps = 1e-5;
  c->rope_theta = 5e5;
  c->aux_loss = 0;
  c->z_loss = 0;
  c->batch = 2;
  c->steps = 3;
  c->seed = 1;
  c->lr = 1e-3;
  c->min_lr = 1e-3;
  c->beta1 = 0.9;
  c->beta2 = 0.95;
  c->adam_eps = 1e-8;
  c->weight_decay = 0.1;
  c->clip = 1.0;
  c->warmup = 0;
  c->schedule = SCHED_CONSTANT;
  c->precision = PREC_FP32;
  c->ep = c->dp = 1;
}

typedef struct {
  ir_graph *g;
  ir_loc loc;
  int ok;
} gb;

static int add(gb *b, ir_op op, const int *in, int n_in, const ir_attr *a, int na) {
  int v = ir_add(b->g, op, in, n_in, a, na, b->loc);
  if (v < 0 && b->ok) {
    printf("test_parity: building the graph: %s\n", b->g->err);
    b->ok = 0;
  }
  return v;
}

static int add_typed(gb *b, ir_op op, const int *in, int n_in, const ir_attr *a, int na, ir_type t) {
  int v = ir_add_typed(b->g, op, in, n_in, a, na, t, b->loc);
  if (v < 0 && b->ok) {
    printf("test_parity: building the graph: %s\n", b->g->err);
    b->ok = 0;
  }
  return v;
}

static ir_type mat(ir_dtype dt, int64_t r, int64_t c) { return (ir_type){dt, 2, {r, c, 0, 0}}; }

static int param(gb *b, const char *name, int64_t r, int64_t c, int ones) {
  ir_attr a[] = {ir_attr_str("name", name), ir_attr_str("init", ones ? "ones" : "normal"),
                 ir_attr_float("std", 0.02)};
  ir_type t = c ? mat(DT_F32, r, c) : (ir_type){DT_F32, 1, {r, 0, 0, 0}};
  return add_typed(b, OP_PARAM, NULL, 0, a, 3, t);
}

static int linear(gb *b, int x, const char *name, int64_t in, int64_t out) {
  int w = param(b, name, in, out, 0);
  return add(b, OP_LINEAR, (int[]){x, w}, 2, NULL, 0);
}

/* The forward graph of a Mixtral decoder, as lowering writes it: fp32 everywhere, weights
 * of linear layers stored [in, out]. */
static ir_graph *build_forward(const moec_config *c) {
  gb b = {ir_graph_new("parity"), {"parity", 1, 1}, 1};
  if (!b.g) return NULL;
  b.g->cfg = *c;
  const int64_t T = c->batch * c->seq, H = c->hidden, hd = c->head_dim, E = c->experts;
  char nm[160];
  int tok = add_typed(&b, OP_INPUT, NULL, 0, (ir_attr[]){ir_attr_str("name", "tokens")}, 1,
                      (ir_type){DT_I32, 1, {T, 0, 0, 0}});
  int lab = add_typed(&b, OP_INPUT, NULL, 0, (ir_attr[]){ir_attr_str("name", "labels")}, 1,
                      (ir_type){DT_I32, 1, {T, 0, 0, 0}});
  int table = param(&b, "model.embed_tokens.weight", c->vocab, H, 0);
  int x = add(&b, OP_EMBEDDING, (int[]){table, tok}, 2, NULL, 0);
  ir_attr eps = ir_attr_float("eps", c->norm_eps);
  for (int64_t l = 0; l < c->layers && b.ok; l++) {
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
    int w = param(&b, NAME("model.layers.%lld.input_layernorm.weight", (long long)l), H, 0, 1);
    int h = add(&b, OP_RMSNORM, (int[]){x, w}, 2, &eps, 1);
    int q = linear(&b, h, NAME("model.layers.%lld.self_attn.q_proj.weight", (long long)l), H, c->heads * hd);
    int k = linear(&b, h, NAME("model.layers.%lld.self_attn.k_proj.weight", (long long)l), H, c->kv_heads * hd);
    int v = linear(&b, h, NAME("model.layers.%lld.self_attn.v_proj.weight", (long long)l), H, c->kv_heads * hd);
    ir_attr rq[] = {ir_attr_int("heads", c->heads), ir_attr_float("theta", c->rope_theta), ir_attr_int("seq", c->seq)};
    ir_attr rk[] = {ir_attr_int("heads", c->kv_heads), ir_attr_float("theta", c->rope_theta), ir_attr_int("seq", c->seq)};
    q = add(&b, OP_ROPE, &q, 1, rq, 3);
    k = add(&b, OP_ROPE, &k, 1, rk, 3);
    ir_attr at[] = {ir_attr_int("heads", c->heads), ir_attr_int("kv_heads", c->kv_heads), ir_attr_int("seq", c->seq),
                    ir_attr_int("causal", 1)};
    int a = add(&b, OP_ATTENTION, (int[]){q, k, v}, 3, at, 4);
    a = linear(&b, a, NAME("model.layers.%lld.self_attn.o_proj.weight", (long long)l), c->heads * hd, H);
    x = add(&b, OP_ADD, (int[]){x, a}, 2, NULL, 0);
    w = param(&b, NAME("model.layers.%lld.post_attention_layernorm.weight", (long long)l), H, 0, 1);
    h = add(&b, OP_RMSNORM, (int[]){x, w}, 2, &eps, 1);
    int rl = linear(&b, h, NAME("model.layers.%lld.block_sparse_moe.gate.weight", (long long)l), H, E);
    int idx = add(&b, OP_TOPK, &rl, 1, (ir_attr[]){ir_attr_int("k", c->top_k)}, 1);
    int rw = add(&b, OP_ROUTE_WEIGHTS, (int[]){rl, idx}, 2, NULL, 0);
    int comb[2 + 64] = {idx, rw};
    for (int64_t e = 0; e < E && b.ok; e++) {
      int64_t n = ir_sym_new(b.g, NAME("n%lld_%lld", (long long)l, (long long)e), T);
      int xe = add_typed(&b, OP_DISPATCH, (int[]){h, idx}, 2, (ir_attr[]){ir_attr_int("expert", e)}, 1,
                         mat(DT_F32, n, H));
      const char *pre = "model.layers.%lld.block_sparse_moe.experts.%lld.%s.weight";
      int gt = linear(&b, xe, NAME(pre, (long long)l, (long long)e, "w1"), H, c->ffn);
      int up = linear(&b, xe, NAME(pre, (long long)l, (long long)e, "w3"), H, c->ffn);
      gt = add(&b, OP_SILU, &gt, 1, NULL, 0);
      int act = add(&b, OP_MUL, (int[]){gt, up}, 2, NULL, 0);
      comb[2 + e] = linear(&b, act, NAME(pre, (long long)l, (long long)e, "w2"), c->ffn, H);
    }
    int moe = add(&b, OP_COMBINE, comb, (int)(2 + E), (ir_attr[]){ir_attr_int("experts", E)}, 1);
    x = add(&b, OP_ADD, (int[]){x, moe}, 2, NULL, 0);
#undef NAME
  }
  int w = param(&b, "model.norm.weight", H, 0, 1);
  x = add(&b, OP_RMSNORM, (int[]){x, w}, 2, &eps, 1);
  int logits = linear(&b, x, "lm_head.weight", H, c->vocab);
  int loss = add(&b, OP_CROSS_ENTROPY, (int[]){logits, lab}, 2, NULL, 0);
  if (!b.ok) {
    ir_graph_free(b.g);
    return NULL;
  }
  b.g->outputs[0] = loss;
  b.g->n_outputs = 1;
  return b.g;
}

/* Is param node id the weight of a linear layer (stored [in, out], HF [out, in])? */
static int is_linear_weight(const ir_graph *g, int id) {
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == OP_LINEAR && g->nodes[i].in[1] == id) return 1;
  return 0;
}

static int param_node(const ir_graph *g, const char *name) {
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == OP_PARAM && strcmp(ir_get_str(&g->nodes[i], "name", ""), name) == 0) return i;
  return -1;
}

/* moec's layout -> HF's: transposes [in, out] into [out, in] for linear weights. dims gets
 * the HF shape. */
static float *to_hf(const ir_graph *g, int id, const float *src, int *ndim, int64_t dims[4]) {
  const ir_type *t = &g->nodes[id].type;
  int64_t n = 1;
  for (int d = 0; d < t->rank; d++) n *= t->dims[d];
  float *out = malloc((size_t)n * sizeof(float));
  if (!out) die("out of memory%s%s", "", "");
  *ndim = t->rank;
  if (t->rank == 2 && is_linear_weight(g, id)) {
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

/* ------------------------------------------------------------------ --export */

static int export_weights(const ir_graph *g, rt_params *ps, const char *dir) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) die("cannot create %s: %s", dir, strerror(errno));
  char path[4096];
  /* safetensors: u64 header length, JSON header (padded with spaces to 8 bytes), f32 data */
  size_t cap = 1 << 16, len = 0;
  char *hdr = malloc(cap);
  uint64_t off = 0;
  len += (size_t)snprintf(hdr + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
  for (int i = 0; i < ps->n; i++) {
    int id = param_node(g, ps->p[i].name);
    int nd;
    int64_t dims[4];
    free(to_hf(g, id, ps->p[i].w, &nd, dims));
    len += (size_t)snprintf(hdr + len, cap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", ps->p[i].name);
    for (int d = 0; d < nd; d++) len += (size_t)snprintf(hdr + len, cap - len, "%s%lld", d ? "," : "", (long long)dims[d]);
    uint64_t bytes = (uint64_t)ps->p[i].numel * 4;
    len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                            (unsigned long long)(off + bytes));
    off += bytes;
    if (len + 512 > cap) die("safetensors header too long%s%s", "", "");
  }
  len += (size_t)snprintf(hdr + len, cap - len, "}");
  while (len % 8) hdr[len++] = ' ';
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  FILE *f = fopen(path, "wb");
  if (!f) die("cannot write %s: %s", path, strerror(errno));
  uint64_t hl = len;
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = (unsigned char)(hl >> (8 * i));
  fwrite(le, 1, 8, f);
  fwrite(hdr, 1, len, f);
  for (int i = 0; i < ps->n; i++) {
    int nd;
    int64_t dims[4];
    float *w = to_hf(g, param_node(g, ps->p[i].name), ps->p[i].w, &nd, dims);
    fwrite(w, sizeof(float), (size_t)ps->p[i].numel, f); /* little-endian hosts only */
    free(w);
  }
  if (fclose(f) != 0) die("cannot write %s: %s", path, strerror(errno));
  free(hdr);

  const moec_config *c = &g->cfg;
  snprintf(path, sizeof path, "%s/config.json", dir);
  f = fopen(path, "w");
  if (!f) die("cannot write %s: %s", path, strerror(errno));
  fprintf(f,
          "{\n  \"architectures\": [\"MixtralForCausalLM\"],\n  \"attention_dropout\": 0.0,\n"
          "  \"bos_token_id\": null,\n  \"eos_token_id\": null,\n  \"head_dim\": %lld,\n"
          "  \"hidden_act\": \"silu\",\n  \"hidden_size\": %lld,\n  \"initializer_range\": 0.02,\n"
          "  \"intermediate_size\": %lld,\n  \"max_position_embeddings\": %lld,\n"
          "  \"model_type\": \"mixtral\",\n  \"num_attention_heads\": %lld,\n"
          "  \"num_experts_per_tok\": %lld,\n  \"num_hidden_layers\": %lld,\n"
          "  \"num_key_value_heads\": %lld,\n  \"num_local_experts\": %lld,\n"
          "  \"output_router_logits\": false,\n  \"pad_token_id\": null,\n  \"rms_norm_eps\": %.17e,\n"
          "  \"rope_theta\": %.17e,\n  \"router_aux_loss_coef\": %.17e,\n  \"router_jitter_noise\": 0.0,\n"
          "  \"sliding_window\": null,\n  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"float32\",\n"
          "  \"use_cache\": false,\n  \"vocab_size\": %lld\n}\n",
          (long long)c->head_dim, (long long)c->hidden, (long long)c->ffn, (long long)c->seq, (long long)c->heads,
          (long long)c->top_k, (long long)c->layers, (long long)c->kv_heads, (long long)c->experts, c->norm_eps,
          c->rope_theta, c->aux_loss, (long long)c->vocab);
  if (fclose(f) != 0) die("cannot write %s: %s", path, strerror(errno));
  printf("test_parity: wrote %s/model.safetensors (%d tensors) and config.json\n", dir, ps->n);
  return 0;
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
  if (r->len - r->off < n) die("%s: truncated reference file%s", r->path, "");
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
  if (!out) die("out of memory%s%s", "", "");
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
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) die("cannot read %s%s", path, "");
  fclose(f);
  reader r = {buf, (size_t)n, 0, path};
  reference ref;
  if (memcmp(take(&r, 8), "MOECREF\0", 8) != 0) die("%s: not a moec parity reference%s", path, "");
  if (take_u32(&r) != 1) die("%s: unknown version (this test reads version 1)%s", path, "");
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
  if (r.off != r.len) die("%s: trailing bytes%s", path, "");
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

int main(int argc, char **argv) {
  const char *ref_path = REF_PATH, *export_dir = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--ref") == 0 && i + 1 < argc) ref_path = argv[++i];
    else if (strcmp(argv[i], "--export") == 0 && i + 1 < argc) export_dir = argv[++i];
    else die("usage: test_parity [--ref FILE] [--export DIR]%s%s", "", "");
  }
  moec_config cfg;
  parity_config(&cfg);
  ir_graph *g = build_forward(&cfg);
  if (!g) die("cannot build the parity model%s%s", "", "");
  pipeline_opts opts = {0};
  opts.train = 1;
  if (pipeline_run(&g, &opts, stdout) != 0) die("the training pipeline failed%s%s", "", "");
  rt_params *ps = rt_params_new(g, (uint64_t)g->cfg.seed);
  if (!ps) die("out of memory%s%s", "", "");
  if (export_dir) {
    int rc = export_weights(g, ps, export_dir);
    rt_params_free(ps);
    ir_graph_free(g);
    return rc;
  }

  reference ref = read_reference(ref_path);
  const moec_config *c = &g->cfg;
  if (ref.B != c->batch || ref.S != c->seq || ref.V != c->vocab)
    die("%s was made for another model or batch; regenerate it (tests/parity/README.md)%s", ref_path, "");
  if (ref.n_grads != (uint32_t)ps->n || ref.n_final != (uint32_t)ps->n)
    printf("note: the reference has %u gradients and %u weights, moec %d parameters\n", ref.n_grads, ref.n_final,
           ps->n);

  char err[1024] = "";
  cpu_exec *x = cpu_exec_new(g, ps, err, sizeof err);
  if (!x) die("cpu_exec_new: %s%s", err, "");
  int ce = -1;
  for (int i = 0; i < g->n_nodes && ce < 0; i++)
    if (g->nodes[i].op == OP_CROSS_ENTROPY) ce = i;
  const int logits_id = g->nodes[ce].in[0];

  for (uint32_t s = 1; s <= ref.steps; s++) {
    float out[8] = {0};
    double norm = 0;
    cpu_exec_keep_all(x, s == 1);
    if (cpu_exec_run(x, ref.tokens, ref.labels, s, out, &norm, err, sizeof err) != 0)
      die("step failed: %s%s", err, "");
    double lerr = fabs(out[0] - ref.losses[s - 1]) / fabs(ref.losses[s - 1]);
    double nerr = fabs(norm - ref.norms[s - 1]) / fabs(ref.norms[s - 1]);
    printf("step %u: loss %.7f (HF %.7f, rel err %.1e)  grad_norm %.7f (HF %.7f, rel err %.1e)\n", s, out[0],
           ref.losses[s - 1], lerr, norm, ref.norms[s - 1], nerr);
    CHECK(lerr <= TOL_LOSS, "step %u: loss %.8g vs HF %.8g", s, out[0], ref.losses[s - 1]);
    CHECK(nerr <= TOL_NORM, "step %u: grad norm %.8g vs HF %.8g", s, norm, ref.norms[s - 1]);
    if (s != 1) continue;

    int64_t n;
    const float *lg = cpu_exec_value(x, logits_id, &n);
    CHECK(lg && n >= ref.logit_rows * ref.V, "logits not kept");
    if (lg) {
      diff d = compare(lg, ref.logits, ref.logit_rows * ref.V);
      printf("logits sample: max err %.2e, max |HF| %.3g (rel %.1e)\n", d.err, d.ref, d.err / d.ref);
      CHECK(d.err <= TOL_LOGITS * d.ref + TOL_ABS, "logits: max err %.3g (max |HF| %.3g)", d.err, d.ref);
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
      const float *gv = cpu_exec_value(x, nd->in[1], &n);
      if (!r || !gv) continue;
      seen++;
      diff d = compare_param(g, nd->in[0], gv, r, "gradient");
      double rel = d.err / (d.ref > 0 ? d.ref : 1);
      if (getenv("PARITY_VERBOSE")) printf("  grad %-60s max err %.2e  max|HF| %.2e  rel %.1e\n", name, d.err, d.ref, rel);
      if (rel > worst || rel != rel) worst = rel, worst_name = name;
      CHECK(d.err <= TOL_GRAD_REL * d.ref + TOL_ABS, "gradient of %s: max err %.3g, max |HF| %.3g", name, d.err,
            d.ref);
    }
    printf("gradients of step 1: %d tensors, worst max err / max |HF| = %.1e (%s)\n", seen, worst, worst_name);
    CHECK(seen == (int)ref.n_grads, "compared %d gradients, the reference has %u", seen, ref.n_grads);
  }

  double worst = 0;
  const char *worst_name = "";
  int seen = 0;
  for (int i = 0; i < ps->n; i++) {
    const ref_tensor *r = find_tensor(ref.final, ref.n_final, ps->p[i].name);
    CHECK(r, "weight %s is not in the reference", ps->p[i].name);
    if (!r) continue;
    seen++;
    diff d = compare_param(g, param_node(g, ps->p[i].name), ps->p[i].w, r, "weight");
    if (getenv("PARITY_VERBOSE")) printf("  weight %-60s max err %.2e (%.3f lr) rms %.2e (%.1e lr)\n", r->name, d.err, d.err / c->lr, d.rms, d.rms / c->lr);
    if (d.err > worst || d.err != d.err) worst = d.err, worst_name = r->name;
    CHECK(d.err <= TOL_W_LR * c->lr, "weight %s after %u steps: max err %.3g (%.3g lr)", r->name, ref.steps, d.err,
          d.err / c->lr);
  }
  printf("weights after %u steps: %d tensors, worst max err %.2e = %.3f lr (%s)\n", ref.steps, seen, worst,
         worst / c->lr, worst_name);
  CHECK(seen == (int)ref.n_final, "compared %d weights, the reference has %u", seen, ref.n_final);

  cpu_exec_free(x);
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
