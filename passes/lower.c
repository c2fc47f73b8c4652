/* lower.c -- the `lower` pass: a checked .moe program (annotated AST) to the naive forward
 * graph. Every node carries the location of the expression that produced it.
 *
 * Conventions later passes rely on (T = batch * seq tokens; act = f32 when precision is
 * fp32, else bf16):
 *   - tokens and labels are input() {name="tokens"|"labels"} : i32[T]; labels are next(tokens).
 *   - parameters are param() {name, init, std, expert} : f32[...], stored [in, out], with
 *     Hugging Face Mixtral names; weights used by linear/embedding go through cast to act
 *     (norm weights and the router gate stay f32).
 *   - attention: q/k/v linears, rope(q), rope(k), attention, o linear.
 *   - router: logits = linear(f32 x, gate) : f32[T,E]; topk; route_weights; aux_loss and
 *     z_loss when their coefficients are not 0.
 *   - experts: per expert e a run-time row count n<layer>_<e> (bound T), dispatch, the body
 *     with its own parameters (expert = e), then one combine over all experts.
 *   - outputs[0] = cross entropy + every aux/z loss, outputs[1] = cross entropy.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "sema.h"

typedef struct {
  ir_graph *g;
  const sema_program *p;
  FILE *diag;
  ir_dtype act;
  int64_t T;
  int *vals;  /* (n_slots) value id of each tensor variable */
  int *vals2; /* (n_slots) route weights of a router variable */
  int tokens;
  int layer;        /* current layer, -1 outside repeat */
  int next_layer;   /* layers lowered so far */
  int expert;       /* current expert, -1 outside an experts block */
  int blocks_in_layer;
  const char *experts_pname;
  int *losses; /* aux and z nodes */
  int n_losses, cap_losses;
  int last_rw; /* route weights of the router lowered last */
  int failed;
} lower_ctx;

static ir_loc loc_of(const ast_expr *e) {
  ir_loc l = {e->span.file ? e->span.file->path : "?", e->span.line > 0 ? e->span.line : 1, e->span.col > 0 ? e->span.col : 1};
  return l;
}

static ir_type ty2(ir_dtype dt, int64_t a, int64_t b) { return (ir_type){dt, 2, {a, b, 0, 0}}; }

/* Checks a builder's result; a failure is a bug in moec, not in the user's file. */
static int ok(lower_ctx *l, int id, const ast_expr *e, const char *what) {
  if (id < 0 && !l->failed) {
    ir_loc at = loc_of(e);
    fprintf(l->diag, "%s:%d:%d: internal error: lowering %s: %s\n", at.file, at.line, at.col, what, l->g->err);
    l->failed = 1;
  }
  return id;
}

static int add(lower_ctx *l, ir_op op, const int *in, int n_in, const ir_attr *attrs, int n_attrs, const ast_expr *e) {
  for (int i = 0; i < n_in; i++)
    if (in[i] < 0) return -1;
  return ok(l, ir_add(l->g, op, in, n_in, attrs, n_attrs, loc_of(e)), e, ir_ops[op].name);
}

static int add_typed(lower_ctx *l, ir_op op, const int *in, int n_in, const ir_attr *attrs, int n_attrs, ir_type t,
                     const ast_expr *e) {
  for (int i = 0; i < n_in; i++)
    if (in[i] < 0) return -1;
  return ok(l, ir_add_typed(l->g, op, in, n_in, attrs, n_attrs, t, loc_of(e)), e, ir_ops[op].name);
}

/* The name prefix of the current scope. */
static void prefix(lower_ctx *l, char *buf, size_t n) {
  char layer[64];
  if (l->layer >= 0) snprintf(layer, sizeof layer, "model.layers.%d.", l->layer);
  else snprintf(layer, sizeof layer, "model.");
  if (l->expert >= 0) snprintf(buf, n, "%s%s.experts.%d.", layer, l->experts_pname, l->expert);
  else snprintf(buf, n, "%s", layer);
}

static int param(lower_ctx *l, const ast_expr *e, const char *suffix, ir_type t, ast_init init) {
  char pre[256], name[600];
  if (e->pabs) pre[0] = 0;
  else prefix(l, pre, sizeof pre);
  snprintf(name, sizeof name, "%s%s%s", pre, e->pname ? e->pname : "p", suffix);
  ir_attr a[4];
  int n = 0;
  a[n++] = ir_attr_str("name", name);
  a[n++] = ir_attr_str("init", init == INIT_NORMAL ? "normal" : init == INIT_ONES ? "ones" : "zeros");
  if (init == INIT_NORMAL) a[n++] = ir_attr_float("std", e->std);
  a[n++] = ir_attr_int("expert", l->expert);
  return add_typed(l, OP_PARAM, NULL, 0, a, n, t, e);
}

/* A weight as the GEMM or the lookup uses it: cast to the compute type. */
static int use_w(lower_ctx *l, int w, const ast_expr *e) {
  if (w < 0 || l->act == DT_F32) return w;
  ir_type t = l->g->nodes[w].type;
  t.dtype = l->act;
  return add_typed(l, OP_CAST, &w, 1, NULL, 0, t, e);
}

static int lw(lower_ctx *l, const ast_expr *e);
static int lower_block(lower_ctx *l, const ast_block *b);

static int linear_w(lower_ctx *l, const ast_expr *e, int x, const char *suffix, int64_t in, int64_t out) {
  int w = use_w(l, param(l, e, suffix, ty2(DT_F32, in, out), e->init), e);
  return add(l, OP_LINEAR, (int[]){x, w}, 2, NULL, 0, e);
}

static int lower_attention(lower_ctx *l, const ast_expr *e) {
  int64_t nh = e->n[0], nkv = e->n[1], hd = e->n[2], H = e->n[3];
  int x = lw(l, e->opnd[0]);
  int q = linear_w(l, e, x, ".q_proj.weight", H, nh * hd);
  int k = linear_w(l, e, x, ".k_proj.weight", H, nkv * hd);
  int v = linear_w(l, e, x, ".v_proj.weight", H, nkv * hd);
  int64_t seq = l->p->cfg.seq;
  ir_attr rq[] = {ir_attr_int("heads", nh), ir_attr_float("theta", e->x[0]), ir_attr_int("seq", seq)};
  ir_attr rk[] = {ir_attr_int("heads", nkv), ir_attr_float("theta", e->x[0]), ir_attr_int("seq", seq)};
  q = add(l, OP_ROPE, &q, 1, rq, 3, e);
  k = add(l, OP_ROPE, &k, 1, rk, 3, e);
  ir_attr aa[] = {ir_attr_int("heads", nh), ir_attr_int("kv_heads", nkv), ir_attr_int("seq", seq), ir_attr_int("causal", 1)};
  int a = add(l, OP_ATTENTION, (int[]){q, k, v}, 3, aa, 4, e);
  return linear_w(l, e, a, ".o_proj.weight", nh * hd, H);
}

static int lower_router(lower_ctx *l, const ast_expr *e) {
  int64_t E = e->n[0], k = e->n[1], H = e->n[2];
  int x = lw(l, e->opnd[0]);
  if (x >= 0 && l->g->nodes[x].type.dtype != DT_F32) {
    ir_type t = l->g->nodes[x].type;
    t.dtype = DT_F32;
    x = add_typed(l, OP_CAST, &x, 1, NULL, 0, t, e);
  }
  int w = param(l, e, ".gate.weight", ty2(DT_F32, H, E), e->init);
  int logits = add(l, OP_LINEAR, (int[]){x, w}, 2, NULL, 0, e);
  ir_attr ka = ir_attr_int("k", k);
  int idx = add(l, OP_TOPK, &logits, 1, &ka, 1, e);
  l->last_rw = add(l, OP_ROUTE_WEIGHTS, (int[]){logits, idx}, 2, NULL, 0, e);
  int extra[2], n_extra = 0;
  if (e->x[0] > 0) {
    ir_attr aa[] = {ir_attr_float("coef", e->x[0]), ir_attr_int("experts", E)};
    extra[n_extra++] = add(l, OP_AUX_LOSS, (int[]){logits, idx}, 2, aa, 2, e);
  }
  if (e->x[1] > 0) {
    ir_attr za = ir_attr_float("coef", e->x[1]);
    extra[n_extra++] = add(l, OP_Z_LOSS, &logits, 1, &za, 1, e);
  }
  for (int i = 0; i < n_extra; i++) {
    if (l->n_losses == l->cap_losses) {
      l->cap_losses = l->cap_losses ? 2 * l->cap_losses : 16;
      l->losses = realloc(l->losses, (size_t)l->cap_losses * sizeof *l->losses);
      if (!l->losses) exit(1);
    }
    l->losses[l->n_losses++] = extra[i];
  }
  return idx;
}

/* A router operand: (idx, route weights). */
static int router_of(lower_ctx *l, const ast_expr *r, int *rw) {
  if (r->kind == EX_NAME && r->slot >= 0) {
    *rw = l->vals2[r->slot];
    return l->vals[r->slot];
  }
  int idx = lw(l, r);
  *rw = l->last_rw;
  return idx;
}

static int lower_experts(lower_ctx *l, const ast_expr *e) {
  int64_t E = e->n[0];
  int x = l->vals[e->opnd[0]->slot], rw;
  int idx = router_of(l, e->opnd[1], &rw);
  if (x < 0 || idx < 0 || rw < 0) return -1;
  int64_t H = l->g->nodes[x].type.dims[1];
  int *ys = malloc((size_t)(E + 2) * sizeof *ys);
  if (!ys) exit(1);
  ys[0] = idx;
  ys[1] = rw;
  const char *saved = l->experts_pname;
  l->experts_pname = e->pname;
  int block = l->blocks_in_layer++;
  for (int64_t ex = 0; ex < E && !l->failed; ex++) {
    char sym[64];
    if (l->layer < 0) snprintf(sym, sizeof sym, "n%d_%" PRId64, block, ex);
    else if (block == 0) snprintf(sym, sizeof sym, "n%d_%" PRId64, l->layer, ex);
    else snprintf(sym, sizeof sym, "n%db%d_%" PRId64, l->layer, block, ex);
    int64_t rows = ir_sym_new(l->g, sym, l->T);
    ir_attr da = ir_attr_int("expert", ex);
    ir_type t = l->g->nodes[x].type;
    t.dims[0] = rows;
    t.dims[1] = H;
    l->vals[e->slot] = add_typed(l, OP_DISPATCH, (int[]){x, idx}, 2, &da, 1, t, e);
    l->expert = (int)ex;
    ys[2 + ex] = lower_block(l, e->block);
    l->expert = -1;
  }
  l->experts_pname = saved;
  int y = -1;
  if (!l->failed) {
    ir_attr ca = ir_attr_int("experts", E);
    y = add(l, OP_COMBINE, ys, (int)E + 2, &ca, 1, e);
  }
  free(ys);
  return y;
}

static int lower_call(lower_ctx *l, const ast_expr *e) {
  switch (e->bi) {
  case BI_EMBEDDING: {
    if (l->tokens < 0) {
      ir_attr na = ir_attr_str("name", "tokens");
      l->tokens = add_typed(l, OP_INPUT, NULL, 0, &na, 1, (ir_type){DT_I32, 1, {l->T, 0, 0, 0}}, e);
    }
    int table = use_w(l, param(l, e, ".weight", ty2(DT_F32, e->n[0], e->n[1]), e->init), e);
    return add(l, OP_EMBEDDING, (int[]){table, l->tokens}, 2, NULL, 0, e);
  }
  case BI_RMSNORM: {
    int x = lw(l, e->opnd[0]);
    int w = param(l, e, ".weight", (ir_type){DT_F32, 1, {e->n[0], 0, 0, 0}}, e->init);
    ir_attr ea = ir_attr_float("eps", e->x[0]);
    return add(l, OP_RMSNORM, (int[]){x, w}, 2, &ea, 1, e);
  }
  case BI_LINEAR: {
    int x = lw(l, e->opnd[0]), w;
    if (e->opnd[1]) w = use_w(l, lw(l, e->opnd[1]), e);
    else w = use_w(l, param(l, e, ".weight", ty2(DT_F32, e->n[0], e->n[1]), e->init), e);
    if (!e->bias) return add(l, OP_LINEAR, (int[]){x, w}, 2, NULL, 0, e);
    int b = use_w(l, param(l, e, ".bias", (ir_type){DT_F32, 1, {e->n[1], 0, 0, 0}}, INIT_ZEROS), e);
    return add(l, OP_LINEAR, (int[]){x, w, b}, 3, NULL, 0, e);
  }
  case BI_ATTENTION: return lower_attention(l, e);
  case BI_ROUTER: return lower_router(l, e);
  case BI_EXPERTS: return lower_experts(l, e);
  case BI_SILU: {
    int x = lw(l, e->opnd[0]);
    return add(l, OP_SILU, &x, 1, NULL, 0, e);
  }
  case BI_NEXT: {
    ir_attr na = ir_attr_str("name", "labels");
    return add_typed(l, OP_INPUT, NULL, 0, &na, 1, (ir_type){DT_I32, 1, {l->T, 0, 0, 0}}, e);
  }
  case BI_CROSS_ENTROPY: {
    int logits = lw(l, e->opnd[0]);
    int labels = lw(l, e->opnd[1]);
    return add(l, OP_CROSS_ENTROPY, (int[]){logits, labels}, 2, NULL, 0, e);
  }
  case BI_PARAM: {
    ir_type t = {DT_F32, (int)e->n[0], {e->n[1], e->n[2], 0, 0}};
    return param(l, e, "", t, e->init);
  }
  default: break;
  }
  fprintf(l->diag, "moec: internal error: lowering: call '%s' was not checked\n", e->s ? e->s : "?");
  l->failed = 1;
  return -1;
}

static int lw(lower_ctx *l, const ast_expr *e) {
  if (l->failed || !e) return -1;
  switch (e->kind) {
  case EX_NAME:
    if (e->ty == TY_TOKENS) {
      fprintf(l->diag, "moec: internal error: lowering: bare tokens\n");
      l->failed = 1;
      return -1;
    }
    return e->slot >= 0 ? l->vals[e->slot] : -1;
  case EX_BIN: {
    int a = lw(l, e->a), b = lw(l, e->b);
    return add(l, e->op == '+' ? OP_ADD : OP_MUL, (int[]){a, b}, 2, NULL, 0, e);
  }
  case EX_CALL: return lower_call(l, e);
  default: break;
  }
  fprintf(l->diag, "moec: internal error: lowering: unexpected expression\n");
  l->failed = 1;
  return -1;
}

/* Lowers a block's statements; returns the value of a final expression statement. */
static int lower_block(lower_ctx *l, const ast_block *b) {
  int result = -1;
  for (int i = 0; i < b->n && !l->failed; i++) {
    const ast_stmt *st = b->v[i];
    switch (st->kind) {
    case ST_ASSIGN:
      if (st->is_const || st->slot < 0) break;
      l->vals[st->slot] = lw(l, st->value);
      if (st->value->ty == TY_ROUTER || (st->value->kind == EX_NAME && st->value->ty == TY_ROUTER))
        l->vals2[st->slot] = st->value->kind == EX_NAME ? l->vals2[st->value->slot] : l->last_rw;
      break;
    case ST_EXPR: result = lw(l, st->value); break;
    case ST_REPEAT:
      for (int64_t k = 0; k < st->value->n[0] && !l->failed; k++) {
        int saved = l->layer, saved_blocks = l->blocks_in_layer;
        l->layer = l->next_layer++;
        l->blocks_in_layer = 0;
        lower_block(l, st->body);
        l->layer = saved;
        l->blocks_in_layer = saved_blocks;
      }
      break;
    default: break;
    }
  }
  return result;
}

ir_graph *lower_program(const sema_program *p, FILE *diag) {
  lower_ctx l;
  memset(&l, 0, sizeof l);
  l.p = p;
  l.diag = diag;
  l.g = ir_graph_new(p->model_name);
  l.g->cfg = p->cfg;
  l.act = p->cfg.precision == PREC_FP32 ? DT_F32 : DT_BF16;
  l.T = p->cfg.batch * p->cfg.seq;
  l.tokens = -1;
  l.layer = -1;
  l.expert = -1;
  l.last_rw = -1;
  size_t ns = (size_t)(p->n_slots > 0 ? p->n_slots : 1);
  l.vals = malloc(ns * sizeof *l.vals);
  l.vals2 = malloc(ns * sizeof *l.vals2);
  if (!l.vals || !l.vals2) exit(1);
  for (size_t i = 0; i < ns; i++) l.vals[i] = l.vals2[i] = -1;
  lower_block(&l, p->model->body);
  int ce = p->loss_slot >= 0 ? l.vals[p->loss_slot] : -1;
  if (!l.failed && ce < 0) {
    fprintf(diag, "moec: internal error: lowering: the model has no loss value\n");
    l.failed = 1;
  }
  if (!l.failed) {
    int total = ce;
    const ast_expr *at = NULL;
    for (int i = 0; i < p->model->body->n; i++) {
      const ast_stmt *st = p->model->body->v[i];
      if (st->kind == ST_ASSIGN && st->slot == p->loss_slot) at = st->value;
    }
    for (int i = 0; i < l.n_losses && !l.failed && at; i++) total = add(&l, OP_ADD, (int[]){total, l.losses[i]}, 2, NULL, 0, at);
    l.g->outputs[0] = total;
    l.g->outputs[1] = ce;
    l.g->n_outputs = 2;
  }
  free(l.vals);
  free(l.vals2);
  free(l.losses);
  if (!l.failed && ir_verify(l.g, "lower", diag) != 0) {
    fprintf(diag, "moec: internal error: the lowered graph does not verify\n");
    l.failed = 1;
  }
  if (l.failed) {
    ir_graph_free(l.g);
    return NULL;
  }
  return l.g;
}
