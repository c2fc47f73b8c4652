/* autodiff.c -- builds the training step: reverse-mode differentiation of the forward graph
 * (one gradient rule per op), then the optimizer: a global gradient norm and one AdamW update
 * per parameter. The result is forward + loss + backward + update in one graph. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"

typedef struct {
  ir_graph *g;
  int *grad; /* (n_fwd) value id of d(loss)/d(value), or -1 */
  int id;    /* the forward node being differentiated */
  int dy;    /* its incoming gradient */
  FILE *err;
  int failed;
} ad_ctx;

static ir_loc here(ad_ctx *c) { return c->g->nodes[c->id].loc; }
static const ir_type *type_of(ad_ctx *c, int v) { return &c->g->nodes[v].type; }

static int emit(ad_ctx *c, ir_op op, const int *in, int n_in, const ir_attr *attrs, int n_attrs) {
  int v = ir_add(c->g, op, in, n_in, attrs, n_attrs, here(c));
  if (v < 0 && !c->failed) {
    fprintf(c->err, "moec: internal error: autodiff of %%%d: %s\n", c->id, c->g->err);
    c->failed = 1;
  }
  return v;
}

static int emit_typed(ad_ctx *c, ir_op op, const int *in, int n_in, const ir_attr *attrs, int n_attrs, ir_type t) {
  int v = ir_add_typed(c->g, op, in, n_in, attrs, n_attrs, t, here(c));
  if (v < 0 && !c->failed) {
    fprintf(c->err, "moec: internal error: autodiff of %%%d: %s\n", c->id, c->g->err);
    c->failed = 1;
  }
  return v;
}

/* Adds gradient contribution d to value v, casting to v's dtype and summing with earlier ones. */
static void acc(ad_ctx *c, int v, int d) {
  if (d < 0 || c->failed) return;
  if (type_of(c, d)->dtype != type_of(c, v)->dtype) {
    ir_type t = *type_of(c, d);
    t.dtype = type_of(c, v)->dtype;
    d = emit_typed(c, OP_CAST, &d, 1, NULL, 0, t);
    if (d < 0) return;
  }
  if (c->grad[v] < 0) c->grad[v] = d;
  else c->grad[v] = emit(c, OP_ADD, (int[]){c->grad[v], d}, 2, NULL, 0);
}

/* ---- gradient rules: one per op (ops.def), called with c->id and c->dy set ---- */
#define IN(i) (c->g->nodes[c->id].in[i])
#define NODE (&c->g->nodes[c->id])

static void no_inputs(ad_ctx *c) { (void)c; }
static void not_differentiable(ad_ctx *c) {
  fprintf(c->err, "moec: internal error: autodiff reached %s (%%%d), which has no gradient rule\n",
          ir_ops[NODE->op].name, c->id);
  c->failed = 1;
}
static void grad_INPUT(ad_ctx *c) { no_inputs(c); }
static void grad_PARAM(ad_ctx *c) { no_inputs(c); }
static void grad_TOPK(ad_ctx *c) { no_inputs(c); } /* integer result: routing decisions carry no gradient */
static void grad_CAST(ad_ctx *c) { acc(c, IN(0), c->dy); }

static void grad_EMBEDDING(ad_ctx *c) {
  ir_attr rows = ir_attr_int("rows", type_of(c, IN(0))->dims[0]);
  acc(c, IN(0), emit(c, OP_EMBEDDING_BWD, (int[]){c->dy, IN(1)}, 2, &rows, 1));
}

static void grad_RMSNORM(ad_ctx *c) {
  ir_attr eps = ir_attr_float("eps", ir_get_float(NODE, "eps", 1e-5));
  acc(c, IN(0), emit(c, OP_RMSNORM_BWD_X, (int[]){c->dy, IN(0), IN(1)}, 3, &eps, 1));
  acc(c, IN(1), emit(c, OP_RMSNORM_BWD_W, (int[]){c->dy, IN(0)}, 2, &eps, 1));
}

static void grad_LINEAR(ad_ctx *c) {
  int x = IN(0), w = IN(1);
  acc(c, x, emit(c, OP_MATMUL, (int[]){c->dy, w}, 2, (ir_attr[]){ir_attr_int("trans_b", 1)}, 1));
  ir_attr wa[] = {ir_attr_int("trans_a", 1), ir_attr_str("out", type_of(c, w)->dtype == DT_F32 ? "f32" : "")};
  acc(c, w, emit(c, OP_MATMUL, (int[]){x, c->dy}, 2, wa, 2));
  if (NODE->n_in == 3) acc(c, IN(2), emit(c, OP_COLSUM, &c->dy, 1, NULL, 0));
}

static void grad_ROPE(ad_ctx *c) {
  /* rope is a rotation: its gradient is the inverse rotation */
  ir_attr a[] = {ir_attr_int("heads", ir_get_int(NODE, "heads", 0)), ir_attr_float("theta", ir_get_float(NODE, "theta", 0)),
                 ir_attr_int("seq", ir_get_int(NODE, "seq", 0)), ir_attr_int("inverse", !ir_get_int(NODE, "inverse", 0))};
  acc(c, IN(0), emit(c, OP_ROPE, &c->dy, 1, a, 4));
}

static void grad_ATTENTION(ad_ctx *c) {
  int packed = emit(c, OP_ATTENTION_BWD, (int[]){IN(0), IN(1), IN(2), c->id, c->dy}, 5, NODE->attrs, NODE->n_attrs);
  if (packed < 0) return;
  int64_t wq = type_of(c, IN(0))->dims[1], wk = type_of(c, IN(1))->dims[1];
  int64_t start[3] = {0, wq, wq + wk}, width[3] = {wq, wk, wk};
  for (int i = 0; i < 3; i++) {
    ir_attr a[] = {ir_attr_int("start", start[i]), ir_attr_int("width", width[i])};
    acc(c, IN(i), emit(c, OP_SLICE_COLS, &packed, 1, a, 2));
  }
}

static void grad_ROUTE_WEIGHTS(ad_ctx *c) {
  acc(c, IN(0), emit(c, OP_ROUTE_WEIGHTS_BWD, (int[]){c->dy, IN(0), IN(1)}, 3, NULL, 0));
}

static void grad_AUX_LOSS(ad_ctx *c) {
  int n = NODE->n_in + 1; /* the global counts, when given, go along */
  acc(c, IN(0), emit(c, OP_AUX_LOSS_BWD, (int[]){c->dy, IN(0), IN(1), n == 4 ? IN(2) : 0}, n, NODE->attrs, NODE->n_attrs));
}

static void grad_Z_LOSS(ad_ctx *c) { /* attributes (coef, global_tokens) go along */
  acc(c, IN(0), emit(c, OP_Z_LOSS_BWD, (int[]){c->dy, IN(0)}, 2, NODE->attrs, NODE->n_attrs));
}

static void grad_DISPATCH(ad_ctx *c) {
  ir_attr e = ir_attr_int("expert", ir_get_int(NODE, "expert", 0));
  acc(c, IN(0), emit(c, OP_DISPATCH_BWD, (int[]){c->dy, IN(1)}, 2, &e, 1));
}

static void grad_COMBINE(ad_ctx *c) {
  int n = NODE->n_in;
  int *in = malloc((size_t)n * sizeof *in);
  if (!in) abort();
  in[0] = c->dy;
  in[1] = IN(0);
  for (int i = 2; i < n; i++) in[i] = IN(i);
  ir_attr ex = ir_attr_int("experts", n - 2);
  acc(c, IN(1), emit(c, OP_COMBINE_BWD_W, in, n, &ex, 1));
  free(in);
  for (int e = 0; e + 2 < n; e++) {
    ir_attr a = ir_attr_int("expert", e);
    acc(c, IN(e + 2), emit_typed(c, OP_COMBINE_BWD_Y, (int[]){c->dy, IN(0), IN(1)}, 3, &a, 1, *type_of(c, IN(e + 2))));
  }
}

/* ---- experts over expert-sorted tokens ---- */
static void grad_EXPERT_COUNTS(ad_ctx *c) { no_inputs(c); } /* integer results: routing carries no gradient */
static void grad_EXPERT_SORT(ad_ctx *c) { no_inputs(c); }

static ir_attr top_k_of(ad_ctx *c) { return ir_attr_int("top_k", ir_get_int(NODE, "top_k", 1)); }

/* permute and unpermute are adjoint: each one's gradient is the other, with the same weights. */
static void grad_EXPERT_PERMUTE(ad_ctx *c) {
  ir_attr k = top_k_of(c);
  int weighted = NODE->n_in == 3;
  acc(c, IN(0), emit(c, OP_EXPERT_UNPERMUTE, (int[]){c->dy, IN(1), weighted ? IN(2) : 0}, 2 + weighted, &k, 1));
  if (weighted) acc(c, IN(2), emit(c, OP_EXPERT_WEIGHT_GRAD, (int[]){IN(0), c->dy, IN(1)}, 3, &k, 1));
}

static void grad_EXPERT_UNPERMUTE(ad_ctx *c) {
  ir_attr k = top_k_of(c);
  int weighted = NODE->n_in == 3;
  acc(c, IN(0), emit(c, OP_EXPERT_PERMUTE, (int[]){c->dy, IN(1), weighted ? IN(2) : 0}, 2 + weighted, &k, 1));
  if (weighted) acc(c, IN(2), emit(c, OP_EXPERT_WEIGHT_GRAD, (int[]){c->dy, IN(0), IN(1)}, 3, &k, 1));
}

static void grad_EXPERT_PROBS(ad_ctx *c) {
  ir_attr k = ir_attr_int("top_k", type_of(c, IN(0))->dims[1]);
  acc(c, IN(0), emit(c, OP_EXPERT_PROBS_BWD, (int[]){c->dy, IN(1)}, 2, &k, 1));
}

static void grad_STACK(ad_ctx *c) {
  int64_t E = ir_get_int(NODE, "experts", 1), parts = NODE->n_in / E, start = 0;
  for (int64_t p = 0; p < parts; p++) {
    int64_t width = type_of(c, IN((int)(p * E)))->dims[1];
    for (int64_t e = 0; e < E; e++) {
      ir_attr a[] = {ir_attr_int("expert", e), ir_attr_int("start", start), ir_attr_int("width", width)};
      acc(c, IN((int)(p * E + e)), emit(c, OP_UNSTACK, &c->dy, 1, a, 3));
    }
    start += width;
  }
}

/* dgrad: a grouped GEMM over the same groups; wgrad: one GEMM per group, K = its row count. */
static void grad_GROUPED_LINEAR(ad_ctx *c) {
  int xs = IN(0), w = IN(1), counts = IN(2);
  acc(c, xs, emit(c, OP_GROUPED_LINEAR_DGRAD, (int[]){c->dy, w, counts}, 3, NULL, 0));
  ir_attr out = ir_attr_str("out", type_of(c, w)->dtype == DT_F32 ? "f32" : "");
  acc(c, w, emit(c, OP_GROUPED_LINEAR_WGRAD, (int[]){xs, c->dy, counts}, 3, &out, 1));
  if (NODE->n_in == 4) acc(c, IN(3), emit(c, OP_GROUPED_COLSUM, (int[]){c->dy, counts}, 2, NULL, 0));
}

static int slice(ad_ctx *c, int v, int64_t start, int64_t width) {
  ir_attr a[] = {ir_attr_int("start", start), ir_attr_int("width", width)};
  return emit(c, OP_SLICE_COLS, &v, 1, a, 2);
}

/* v in dtype dt (a cast when it differs). */
static int as_dtype(ad_ctx *c, int v, ir_dtype dt) {
  if (v < 0 || type_of(c, v)->dtype == dt) return v;
  ir_type t = *type_of(c, v);
  t.dtype = dt;
  return emit_typed(c, OP_CAST, &v, 1, NULL, 0, t);
}

/* grouped_mlp's result is y | gate_up; the gate_up columns are what the backward keeps. Its
 * backward recomputes SwiGLU from them: grouped_mlp_bwd gives d gate_up | act | d prob, then
 * the three remaining GEMMs are plain grouped ones. */
static void grad_GROUPED_MLP(ad_ctx *c) {
  int xs = IN(0), wgu = IN(1), wd = IN(2), counts = IN(3), probs = IN(4);
  int64_t H = type_of(c, xs)->dims[1], F = ir_get_int(NODE, "ffn", 0);
  ir_dtype act = type_of(c, xs)->dtype;
  const ir_node *d = &c->g->nodes[c->dy];
  int dy, dgu_direct = -1;
  if (d->op == OP_PAD_COLS && ir_get_int(d, "start", -1) == 0 && type_of(c, d->in[0])->dims[1] == H) {
    dy = d->in[0]; /* only y is read downstream (the usual case): no gradient enters gate_up directly */
  } else {
    dy = slice(c, c->dy, 0, H);
    dgu_direct = slice(c, c->dy, H, 2 * F);
  }
  int gu = slice(c, c->id, H, 2 * F);
  ir_attr fa = ir_attr_int("ffn", F);
  int bw = emit(c, OP_GROUPED_MLP_BWD, (int[]){dy, gu, wd, counts, probs}, 5, &fa, 1);
  if (bw < 0) return;
  int dgu = as_dtype(c, slice(c, bw, 0, 2 * F), act);
  if (dgu_direct >= 0) dgu = emit(c, OP_ADD, (int[]){dgu, dgu_direct}, 2, NULL, 0);
  int a = as_dtype(c, slice(c, bw, 2 * F, F), act);
  int dp = slice(c, bw, 3 * F, 1);
  acc(c, xs, emit(c, OP_GROUPED_LINEAR_DGRAD, (int[]){dgu, wgu, counts}, 3, NULL, 0));
  ir_attr out = ir_attr_str("out", type_of(c, wgu)->dtype == DT_F32 ? "f32" : "");
  acc(c, wgu, emit(c, OP_GROUPED_LINEAR_WGRAD, (int[]){xs, dgu, counts}, 3, &out, 1));
  acc(c, wd, emit(c, OP_GROUPED_LINEAR_WGRAD, (int[]){a, dy, counts}, 3, &out, 1));
  acc(c, probs, dp);
}

/* slice_cols in the forward (the gate and up halves of a merged GEMM): the gradient goes back
 * into its columns. */
static void grad_SLICE_COLS(ad_ctx *c) {
  ir_attr a[] = {ir_attr_int("start", ir_get_int(NODE, "start", 0)), ir_attr_int("cols", type_of(c, IN(0))->dims[1])};
  acc(c, IN(0), emit(c, OP_PAD_COLS, &c->dy, 1, a, 2));
}

static void grad_SILU(ad_ctx *c) { acc(c, IN(0), emit(c, OP_SILU_BWD, (int[]){c->dy, IN(0)}, 2, NULL, 0)); }

static void grad_MUL(ad_ctx *c) {
  int a = IN(0), b = IN(1);
  acc(c, a, emit(c, OP_MUL, (int[]){c->dy, b}, 2, NULL, 0));
  acc(c, b, emit(c, OP_MUL, (int[]){c->dy, a}, 2, NULL, 0));
}

static void grad_ADD(ad_ctx *c) {
  acc(c, IN(0), c->dy);
  acc(c, IN(1), c->dy);
}

static void grad_CROSS_ENTROPY(ad_ctx *c) {
  int n = NODE->n_in + 1; /* the global label count, when given, goes along */
  acc(c, IN(0), emit(c, OP_CROSS_ENTROPY_BWD, (int[]){c->dy, IN(0), IN(1), n == 4 ? IN(2) : 0}, n, NULL, 0));
}

static void grad_LABEL_COUNT(ad_ctx *c) { no_inputs(c); }

/* y = sum over the group of x_r, read by every rank: d x_r = the sum of every rank's dy. */
static void grad_ALL_REDUCE(ad_ctx *c) {
  if (type_of(c, IN(0))->dtype != DT_F32) return;
  acc(c, IN(0), emit(c, OP_ALL_REDUCE, &c->dy, 1, NODE->attrs, NODE->n_attrs));
}

/* The EP exchange is a permutation of rows across ranks: its gradient is the reverse exchange
 * with the same counts (forward <-> reverse). */
static void grad_EP_ALL_TO_ALL(ad_ctx *c) {
  int rev = (int)ir_get_int(NODE, "reverse", 0);
  ir_attr a[] = {ir_attr_int("experts", ir_get_int(NODE, "experts", 0)), ir_attr_int("ep", ir_get_int(NODE, "ep", 0)),
                 ir_attr_int("ep_rank", ir_get_int(NODE, "ep_rank", -1)), ir_attr_int("reverse", !rev),
                 ir_attr_int("rows", type_of(c, IN(0))->dims[0])};
  int in[] = {c->dy, IN(1)};
  acc(c, IN(0), rev ? emit_typed(c, OP_EP_ALL_TO_ALL, in, 2, a, 4, *type_of(c, IN(0))) : emit(c, OP_EP_ALL_TO_ALL, in, 2, a, 5));
}
static void grad_EP_LOCAL_COUNTS(ad_ctx *c) { no_inputs(c); }

/* Backward and optimizer ops are never differentiated again. */
#define NOT_DIFF(ID) static void grad_##ID(ad_ctx *c) { not_differentiable(c); }
NOT_DIFF(FILL) NOT_DIFF(MATMUL) NOT_DIFF(COLSUM) NOT_DIFF(EMBEDDING_BWD) NOT_DIFF(RMSNORM_BWD_X)
NOT_DIFF(RMSNORM_BWD_W) NOT_DIFF(ATTENTION_BWD) NOT_DIFF(SILU_BWD)
NOT_DIFF(ROUTE_WEIGHTS_BWD) NOT_DIFF(AUX_LOSS_BWD) NOT_DIFF(Z_LOSS_BWD) NOT_DIFF(DISPATCH_BWD)
NOT_DIFF(COMBINE_BWD_Y) NOT_DIFF(COMBINE_BWD_W) NOT_DIFF(CROSS_ENTROPY_BWD) NOT_DIFF(GRAD_NORM) NOT_DIFF(ADAMW)
NOT_DIFF(PAD_COLS) NOT_DIFF(UNSTACK) NOT_DIFF(GROUPED_LINEAR_DGRAD) NOT_DIFF(GROUPED_LINEAR_WGRAD) NOT_DIFF(GROUPED_COLSUM)
NOT_DIFF(GROUPED_MLP_BWD) NOT_DIFF(EXPERT_WEIGHT_GRAD) NOT_DIFF(EXPERT_PROBS_BWD)
/* ZeRO's collectives come after autodiff (sync), on the optimizer's side */
NOT_DIFF(REDUCE_SCATTER) NOT_DIFF(ALL_GATHER)
/* mxfp8 runs after autodiff: quantization is never differentiated */
NOT_DIFF(MXFP8_QUANTIZE) NOT_DIFF(MXFP8_DEQUANTIZE)

typedef void (*grad_fn)(ad_ctx *);
static const grad_fn grad_rules[] = {
#define OP(id, name, min_in, max_in, cg) [OP_##id] = grad_##id,
#include "ops.def"
#undef OP
};
static_assert(sizeof grad_rules / sizeof grad_rules[0] == OP_COUNT, "one gradient rule per op");

int pass_autodiff(ir_graph **gp, FILE *err) {
  ir_graph *g = *gp;
  int n_fwd = g->n_nodes;
  if (g->n_outputs < 1) {
    fprintf(err, "moec: internal error: autodiff needs a loss output\n");
    return -1;
  }
  ad_ctx c = {g, malloc((size_t)n_fwd * sizeof(int)), g->outputs[0], -1, err, 0};
  if (!c.grad) abort();
  for (int i = 0; i < n_fwd; i++) c.grad[i] = -1;
  /* seed: d(loss)/d(loss) = 1, marked (passes find the backward's start by it) */
  ir_attr one[] = {ir_attr_float("value", 1.0), ir_attr_int("seed", 1)};
  c.grad[g->outputs[0]] = emit_typed(&c, OP_FILL, NULL, 0, one, 2, g->nodes[g->outputs[0]].type);
  for (int id = n_fwd - 1; id >= 0 && !c.failed; id--) {
    if (c.grad[id] < 0) continue;
    c.id = id;
    c.dy = c.grad[id];
    grad_rules[g->nodes[id].op](&c);
  }
  /* optimizer: global gradient norm, then AdamW on every parameter that has a gradient */
  int n_params = 0;
  int *gr = malloc(((size_t)n_fwd + 1) * sizeof *gr), *pr = malloc(((size_t)n_fwd + 1) * sizeof *pr);
  if (!gr || !pr) abort();
  for (int id = 0; id < n_fwd; id++)
    if (g->nodes[id].op == OP_PARAM && c.grad[id] >= 0) {
      pr[n_params] = id;
      gr[n_params++] = c.grad[id];
    }
  if (!c.failed && n_params > 0) {
    c.id = g->outputs[0];
    int norm = emit(&c, OP_GRAD_NORM, gr, n_params, NULL, 0);
    for (int i = 0; i < n_params && !c.failed; i++) {
      c.id = pr[i];
      /* decoupled weight decay, except on norm weights (vectors) */
      double wd = g->nodes[pr[i]].type.rank >= 2 ? g->cfg.weight_decay : 0.0;
      ir_attr a = ir_attr_float("weight_decay", wd);
      emit(&c, OP_ADAMW, (int[]){pr[i], gr[i], norm}, 3, &a, 1);
    }
  }
  free(gr);
  free(pr);
  free(c.grad);
  return c.failed ? -1 : 0;
}
