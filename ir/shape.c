/* shape.c -- one shape rule per op: checks operand dtypes, ranks, sizes and attributes,
 * and gives the result type. Used by the builders (ir_add) and by the verifier. */
#include <assert.h>
#include <stdarg.h>
#include <string.h>

#include "ir.h"

typedef struct {
  const ir_graph *g;
  const ir_node *n;
  ir_type *out;
  char *err;
  size_t errlen;
} shape_ctx;

#define OPERAND(c, i) (&(c)->g->nodes[(c)->n->in[i]].type)

static int fail(shape_ctx *c, const char *fmt, ...) {
  int k = snprintf(c->err, c->errlen, "%s: ", ir_ops[c->n->op].name);
  va_list ap;
  va_start(ap, fmt);
  if (k >= 0 && (size_t)k < c->errlen) vsnprintf(c->err + k, c->errlen - (size_t)k, fmt, ap);
  va_end(ap);
  return -1;
}

static int is_float(ir_dtype t) { return t == DT_F32 || t == DT_BF16; }

static ir_type make(ir_dtype dt, int rank, int64_t d0, int64_t d1) {
  ir_type t = {dt, rank, {d0, d1, 0, 0}};
  return t;
}

int ir_type_equal(const ir_type *a, const ir_type *b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return 0;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return 0;
  return 1;
}

/* Requires operand i to be a float matrix (rank 2); names it in the message. */
static int want_matrix(shape_ctx *c, int i, const char *what) {
  const ir_type *t = OPERAND(c, i);
  char buf[96];
  if (t->rank != 2 || !is_float(t->dtype))
    return fail(c, "%s (operand %d, %%%d) must be a float matrix, got %s", what, i, c->n->in[i],
                ir_type_str(c->g, t, buf, sizeof buf));
  return 0;
}

static int want_scalar(shape_ctx *c, int i);
static int want_index(shape_ctx *c, int i, int rank, const char *what) {
  const ir_type *t = OPERAND(c, i);
  char buf[96];
  if (t->rank != rank || t->dtype != DT_I32)
    return fail(c, "%s (operand %d, %%%d) must be an i32 tensor of rank %d, got %s", what, i,
                c->n->in[i], rank, ir_type_str(c->g, t, buf, sizeof buf));
  return 0;
}

static int want_attr_pos(shape_ctx *c, const char *key, int64_t *v) {
  *v = ir_get_int(c->n, key, 0);
  if (*v <= 0) return fail(c, "needs a positive attribute '%s'", key);
  return 0;
}

static int shape_INPUT(shape_ctx *c) {
  if (!ir_get_str(c->n, "name", NULL)) return fail(c, "needs a 'name' attribute");
  if (c->n->type.dtype != DT_I32 || c->n->type.rank != 1) return fail(c, "must be i32[T]");
  *c->out = c->n->type;
  return 0;
}

static int shape_PARAM(shape_ctx *c) {
  if (!ir_get_str(c->n, "name", NULL)) return fail(c, "needs a 'name' attribute");
  if (c->n->type.dtype != DT_F32 || c->n->type.rank < 1) return fail(c, "master weights are f32 tensors");
  for (int i = 0; i < c->n->type.rank; i++)
    if (c->n->type.dims[i] <= 0) return fail(c, "dimension %d must be a positive static size", i);
  *c->out = c->n->type;
  return 0;
}

static int shape_CAST(shape_ctx *c) {
  const ir_type *x = OPERAND(c, 0);
  if (!is_float(x->dtype) || !is_float(c->n->type.dtype)) return fail(c, "casts between float types only");
  *c->out = *x;
  c->out->dtype = c->n->type.dtype;
  return 0;
}

static int shape_EMBEDDING(shape_ctx *c) {
  if (want_matrix(c, 0, "table") || want_index(c, 1, 1, "tokens")) return -1;
  *c->out = make(OPERAND(c, 0)->dtype, 2, OPERAND(c, 1)->dims[0], OPERAND(c, 0)->dims[1]);
  return 0;
}

static int shape_RMSNORM(shape_ctx *c) {
  const ir_type *x = OPERAND(c, 0), *w = OPERAND(c, 1);
  if (want_matrix(c, 0, "x")) return -1;
  if (w->rank != 1 || w->dims[0] != x->dims[1] || !is_float(w->dtype))
    return fail(c, "weight must be a float vector of the row width %lld", (long long)x->dims[1]);
  if (ir_get_float(c->n, "eps", 0) <= 0) return fail(c, "needs a positive 'eps'");
  *c->out = *x;
  return 0;
}

static int shape_LINEAR(shape_ctx *c) {
  if (want_matrix(c, 0, "x") || want_matrix(c, 1, "weight")) return -1;
  const ir_type *x = OPERAND(c, 0), *w = OPERAND(c, 1);
  if (x->dims[1] != w->dims[0])
    return fail(c, "x has %lld columns but the weight has %lld rows (weights are [in, out])",
                (long long)x->dims[1], (long long)w->dims[0]);
  if (c->n->n_in == 3) {
    const ir_type *b = OPERAND(c, 2);
    if (b->rank != 1 || b->dims[0] != w->dims[1]) return fail(c, "bias must be a vector of %lld", (long long)w->dims[1]);
  }
  *c->out = make(x->dtype, 2, x->dims[0], w->dims[1]);
  return 0;
}

static int shape_ROPE(shape_ctx *c) {
  int64_t heads;
  if (want_matrix(c, 0, "x") || want_attr_pos(c, "heads", &heads)) return -1;
  const ir_type *x = OPERAND(c, 0);
  if (x->dims[1] % heads || (x->dims[1] / heads) % 2)
    return fail(c, "width %lld is not heads (%lld) x an even head size", (long long)x->dims[1], (long long)heads);
  if (ir_get_float(c->n, "theta", 0) <= 0) return fail(c, "needs a positive 'theta'");
  *c->out = *x;
  return 0;
}

static int shape_ATTENTION(shape_ctx *c) {
  int64_t nh, nkv, seq;
  if (want_matrix(c, 0, "q") || want_matrix(c, 1, "k") || want_matrix(c, 2, "v")) return -1;
  if (want_attr_pos(c, "heads", &nh) || want_attr_pos(c, "kv_heads", &nkv) || want_attr_pos(c, "seq", &seq)) return -1;
  const ir_type *q = OPERAND(c, 0), *k = OPERAND(c, 1), *v = OPERAND(c, 2);
  if (nh % nkv) return fail(c, "heads (%lld) must be a multiple of kv_heads (%lld)", (long long)nh, (long long)nkv);
  if (q->dims[1] % nh) return fail(c, "q width %lld is not a multiple of heads %lld", (long long)q->dims[1], (long long)nh);
  int64_t hd = q->dims[1] / nh;
  if (k->dims[1] != nkv * hd || !ir_type_equal(k, v))
    return fail(c, "k and v must both be [T, kv_heads*head_dim] = [T, %lld]", (long long)(nkv * hd));
  if (q->dims[0] != k->dims[0] || q->dims[0] < 0 || q->dims[0] % seq)
    return fail(c, "q, k, v need the same static token count, a multiple of seq %lld", (long long)seq);
  *c->out = *q;
  return 0;
}

static int shape_TOPK(shape_ctx *c) {
  int64_t k;
  if (want_matrix(c, 0, "logits") || want_attr_pos(c, "k", &k)) return -1;
  const ir_type *l = OPERAND(c, 0);
  if (k > l->dims[1]) return fail(c, "k = %lld is more than the %lld experts", (long long)k, (long long)l->dims[1]);
  *c->out = make(DT_I32, 2, l->dims[0], k);
  return 0;
}

/* Router ops that read (logits[T,E], idx[T,k]). */
static int want_logits_idx(shape_ctx *c) {
  if (want_matrix(c, 0, "logits") || want_index(c, 1, 2, "idx")) return -1;
  if (OPERAND(c, 0)->dtype != DT_F32) return fail(c, "router logits must be f32");
  if (OPERAND(c, 0)->dims[0] != OPERAND(c, 1)->dims[0]) return fail(c, "logits and idx disagree on the token count");
  return 0;
}

static int shape_ROUTE_WEIGHTS(shape_ctx *c) {
  if (want_logits_idx(c)) return -1;
  *c->out = make(DT_F32, 2, OPERAND(c, 1)->dims[0], OPERAND(c, 1)->dims[1]);
  return 0;
}

/* Operand i, when present: the routes per expert over all ranks, i32[E]. */
static int want_global_counts(shape_ctx *c, int i, int64_t E) {
  if (c->n->n_in <= i) return 0;
  if (want_index(c, i, 1, "counts")) return -1;
  if (OPERAND(c, i)->dims[0] != E) return fail(c, "counts has %lld entries for %lld experts", (long long)OPERAND(c, i)->dims[0], (long long)E);
  return 0;
}

static int shape_AUX_LOSS(shape_ctx *c) {
  if (want_logits_idx(c) || want_global_counts(c, 2, OPERAND(c, 0)->dims[1])) return -1;
  *c->out = make(DT_F32, 0, 0, 0);
  return 0;
}

static int shape_Z_LOSS(shape_ctx *c) {
  if (want_matrix(c, 0, "logits")) return -1;
  *c->out = make(DT_F32, 0, 0, 0);
  return 0;
}

static int shape_DISPATCH(shape_ctx *c) {
  if (want_matrix(c, 0, "x") || want_index(c, 1, 2, "idx")) return -1;
  if (ir_get_int(c->n, "expert", -1) < 0) return fail(c, "needs an 'expert' attribute >= 0");
  const ir_type *x = OPERAND(c, 0), *t = &c->n->type;
  if (t->rank != 2 || t->dims[1] != x->dims[1] || t->dtype != x->dtype)
    return fail(c, "result must be %s[rows, %lld], with its run-time row count given by the builder",
                ir_dtype_name(x->dtype), (long long)x->dims[1]);
  *c->out = *t;
  return 0;
}

static int shape_COMBINE(shape_ctx *c) {
  if (want_index(c, 0, 2, "idx")) return -1;
  const ir_type *idx = OPERAND(c, 0), *w = OPERAND(c, 1);
  int64_t experts = ir_get_int(c->n, "experts", 0);
  if (experts != c->n->n_in - 2) return fail(c, "experts = %lld but %d expert outputs are given", (long long)experts, c->n->n_in - 2);
  if (w->rank != 2 || w->dims[0] != idx->dims[0] || w->dims[1] != idx->dims[1] || !is_float(w->dtype))
    return fail(c, "weights must be float [T, k] like idx");
  const ir_type *y0 = OPERAND(c, 2);
  for (int i = 2; i < c->n->n_in; i++) {
    if (want_matrix(c, i, "expert output")) return -1;
    const ir_type *y = OPERAND(c, i);
    if (y->dims[1] != y0->dims[1] || y->dtype != y0->dtype)
      return fail(c, "expert outputs must share dtype and width (operand %d differs)", i);
  }
  *c->out = make(y0->dtype, 2, idx->dims[0], y0->dims[1]);
  return 0;
}


/* ---- experts over expert-sorted tokens ---- */

/* Requires operand i to be a float tensor of rank 3 (stacked expert weights [E, in, out]). */
static int want_stacked(shape_ctx *c, int i, const char *what) {
  const ir_type *t = OPERAND(c, i);
  char buf[96];
  if (t->rank != 3 || !is_float(t->dtype))
    return fail(c, "%s (operand %d, %%%d) must be a float tensor [E, in, out], got %s", what, i, c->n->in[i],
                ir_type_str(c->g, t, buf, sizeof buf));
  return 0;
}

/* Operand i: per-expert counts i32[E] (E from the stacked weight when known, else any). */
static int want_counts(shape_ctx *c, int i, int64_t E) {
  if (want_index(c, i, 1, "counts")) return -1;
  if (E > 0 && OPERAND(c, i)->dims[0] != E)
    return fail(c, "counts has %lld entries for %lld experts", (long long)OPERAND(c, i)->dims[0], (long long)E);
  return 0;
}

/* Operand i: the sorted-row permutation i32[S], S = T*k static. */
static int want_perm(shape_ctx *c, int i, int64_t S) {
  if (want_index(c, i, 1, "perm")) return -1;
  if (OPERAND(c, i)->dims[0] != S)
    return fail(c, "perm has %lld rows, expected %lld (tokens x top_k)", (long long)OPERAND(c, i)->dims[0], (long long)S);
  return 0;
}

static ir_type make3(ir_dtype dt, int64_t d0, int64_t d1, int64_t d2) {
  ir_type t = {dt, 3, {d0, d1, d2, 0}};
  return t;
}

static int shape_EXPERT_COUNTS(shape_ctx *c) {
  int64_t E;
  if (want_index(c, 0, 2, "idx") || want_attr_pos(c, "experts", &E)) return -1;
  *c->out = make(DT_I32, 1, E, 0);
  return 0;
}

static int shape_EXPERT_SORT(shape_ctx *c) {
  int64_t E;
  if (want_index(c, 0, 2, "idx") || want_attr_pos(c, "experts", &E)) return -1;
  const ir_type *idx = OPERAND(c, 0);
  if (idx->dims[0] < 0) return fail(c, "needs a static token count");
  *c->out = make(DT_I32, 1, idx->dims[0] * idx->dims[1], 0);
  return 0;
}

/* Optional routing weights w[T,k] as operand i. */
static int want_route_w(shape_ctx *c, int i, int64_t T, int64_t k) {
  const ir_type *w = OPERAND(c, i);
  if (w->rank != 2 || !is_float(w->dtype) || w->dims[0] != T || w->dims[1] != k)
    return fail(c, "weights (operand %d) must be float [%lld, %lld]", i, (long long)T, (long long)k);
  return 0;
}

/* The residual attribute (fuse-residual): 1 when set, the residual the last operand after lo..hi
 * others; 0 when absent; -1 (and the message) when inconsistent. */
static int want_residual_flag(shape_ctx *c, int lo, int hi) {
  int64_t res = ir_get_int(c->n, "residual", 0);
  if (res != 0 && res != 1) return fail(c, "residual must be 0 or 1, not %lld", (long long)res);
  const int others = c->n->n_in - (int)res;
  if (others < lo || others > hi)
    return fail(c, res ? "residual=1 needs the residual as one more operand after %d to %d"
                       : "takes %d to %d operands; one more needs residual=1", lo, hi);
  return (int)res;
}

/* Operand i, the residual added to the result: the result's type exactly. */
static int want_residual(shape_ctx *c, int i) {
  if (!ir_type_equal(OPERAND(c, i), c->out)) return fail(c, "the residual (operand %d) must have the result's type", i);
  return 0;
}

static int shape_EXPERT_PERMUTE(shape_ctx *c) {
  int64_t k;
  if (want_matrix(c, 0, "x") || want_attr_pos(c, "top_k", &k)) return -1;
  const ir_type *x = OPERAND(c, 0);
  if (x->dims[0] < 0) return fail(c, "x needs a static token count");
  if (want_perm(c, 1, x->dims[0] * k)) return -1;
  if (c->n->n_in == 3 && want_route_w(c, 2, x->dims[0], k)) return -1;
  *c->out = make(x->dtype, 2, x->dims[0] * k, x->dims[1]);
  return 0;
}

static int shape_EXPERT_UNPERMUTE(shape_ctx *c) {
  int64_t k;
  if (want_matrix(c, 0, "ys") || want_attr_pos(c, "top_k", &k)) return -1;
  const ir_type *ys = OPERAND(c, 0);
  if (ys->dims[0] < 0 || ys->dims[0] % k) return fail(c, "ys rows must be a static multiple of top_k %lld", (long long)k);
  if (want_perm(c, 1, ys->dims[0])) return -1;
  const int res = want_residual_flag(c, 2, 3);
  if (res < 0) return -1;
  if (c->n->n_in - res == 3 && want_route_w(c, 2, ys->dims[0] / k, k)) return -1;
  *c->out = make(ys->dtype, 2, ys->dims[0] / k, ys->dims[1]);
  return res ? want_residual(c, c->n->n_in - 1) : 0;
}

static int shape_EXPERT_PROBS(shape_ctx *c) {
  if (want_matrix(c, 0, "w")) return -1;
  const ir_type *w = OPERAND(c, 0);
  if (w->dims[0] < 0) return fail(c, "w needs a static token count");
  if (want_perm(c, 1, w->dims[0] * w->dims[1])) return -1;
  *c->out = make(DT_F32, 2, w->dims[0] * w->dims[1], 1);
  return 0;
}

static int shape_STACK(shape_ctx *c) {
  int64_t E;
  if (want_attr_pos(c, "experts", &E)) return -1;
  if (c->n->n_in % E) return fail(c, "%d operands is not a multiple of experts = %lld", c->n->n_in, (long long)E);
  int64_t parts = c->n->n_in / E, cols = 0;
  const ir_type *w0 = OPERAND(c, 0);
  for (int64_t p = 0; p < parts; p++) {
    const ir_type *first = OPERAND(c, (int)(p * E));
    for (int64_t e = 0; e < E; e++) {
      int i = (int)(p * E + e);
      if (want_matrix(c, i, "weight")) return -1;
      const ir_type *w = OPERAND(c, i);
      if (!ir_type_equal(w, first) || w->dims[0] != w0->dims[0] || w->dtype != w0->dtype)
        return fail(c, "operand %d differs in type from the other weights of its part (all [in, out_p], one dtype)", i);
    }
    cols += first->dims[1];
  }
  *c->out = make3(w0->dtype, E, w0->dims[0], cols);
  return 0;
}

static int shape_GROUPED_LINEAR(shape_ctx *c) {
  if (want_matrix(c, 0, "xs") || want_stacked(c, 1, "weight")) return -1;
  const ir_type *x = OPERAND(c, 0), *w = OPERAND(c, 1);
  if (want_counts(c, 2, w->dims[0])) return -1;
  if (x->dims[1] != w->dims[1])
    return fail(c, "xs has %lld columns but the weights have %lld rows (weights are [E, in, out])", (long long)x->dims[1],
                (long long)w->dims[1]);
  if (c->n->n_in == 4) {
    const ir_type *b = OPERAND(c, 3);
    if (b->rank != 2 || !is_float(b->dtype) || b->dims[0] != w->dims[0] || b->dims[1] != w->dims[2])
      return fail(c, "bias must be float [E, out] = [%lld, %lld]", (long long)w->dims[0], (long long)w->dims[2]);
  }
  *c->out = make(x->dtype, 2, x->dims[0], w->dims[2]);
  return 0;
}

static int want_probs(shape_ctx *c, int i, int64_t S) {
  const ir_type *p = OPERAND(c, i);
  if (p->rank != 2 || p->dtype != DT_F32 || p->dims[0] != S || p->dims[1] != 1)
    return fail(c, "probs (operand %d) must be f32[%lld, 1]", i, (long long)S);
  return 0;
}

static int shape_GROUPED_MLP(shape_ctx *c) {
  int64_t F;
  if (want_matrix(c, 0, "xs") || want_stacked(c, 1, "gate_up weight") || want_stacked(c, 2, "down weight") ||
      want_attr_pos(c, "ffn", &F))
    return -1;
  const ir_type *x = OPERAND(c, 0), *wgu = OPERAND(c, 1), *wd = OPERAND(c, 2);
  int64_t E = wgu->dims[0], H = x->dims[1];
  if (wgu->dims[1] != H || wgu->dims[2] != 2 * F) return fail(c, "gate_up weight must be [E, %lld, %lld]", (long long)H, (long long)(2 * F));
  if (wd->dims[0] != E || wd->dims[1] != F || wd->dims[2] != H) return fail(c, "down weight must be [%lld, %lld, %lld]", (long long)E, (long long)F, (long long)H);
  if (want_counts(c, 3, E) || want_probs(c, 4, x->dims[0])) return -1;
  *c->out = make(x->dtype, 2, x->dims[0], H + 2 * F);
  return 0;
}

static int shape_SILU(shape_ctx *c) {
  if (!is_float(OPERAND(c, 0)->dtype)) return fail(c, "needs a float operand");
  *c->out = *OPERAND(c, 0);
  return 0;
}

/* Elementwise binary ops: same type exactly. */
static int same_types(shape_ctx *c) {
  const ir_type *a = OPERAND(c, 0), *b = OPERAND(c, 1);
  char ba[96], bb[96];
  if (!ir_type_equal(a, b) || !is_float(a->dtype))
    return fail(c, "operands must have the same float type, got %s and %s", ir_type_str(c->g, a, ba, sizeof ba),
                ir_type_str(c->g, b, bb, sizeof bb));
  *c->out = *a;
  return 0;
}
static int shape_MUL(shape_ctx *c) { return same_types(c); }
static int shape_ADD(shape_ctx *c) { return same_types(c); }

static int shape_CROSS_ENTROPY(shape_ctx *c) {
  if (want_matrix(c, 0, "logits") || want_index(c, 1, 1, "labels") || (c->n->n_in == 3 && want_scalar(c, 2))) return -1;
  if (OPERAND(c, 0)->dims[0] != OPERAND(c, 1)->dims[0]) return fail(c, "logits and labels disagree on the token count");
  *c->out = make(DT_F32, 0, 0, 0);
  return 0;
}

static int shape_FILL(shape_ctx *c) {
  if (!is_float(c->n->type.dtype) && c->n->type.dtype != DT_I32) return fail(c, "fills float or i32 tensors only");
  double v = ir_get_float(c->n, "value", 0);
  if (c->n->type.dtype == DT_I32 && !(v >= INT32_MIN && v <= INT32_MAX && v == (double)(int32_t)v))
    return fail(c, "an i32 fill needs an integer value in i32's range, got %g", v);
  for (int i = 0; i < c->n->type.rank; i++)
    if (c->n->type.dims[i] < 0) return fail(c, "needs static sizes");
  *c->out = c->n->type;
  return 0;
}

static int shape_MATMUL(shape_ctx *c) {
  if (want_matrix(c, 0, "a") || want_matrix(c, 1, "b")) return -1;
  const ir_type *a = OPERAND(c, 0), *b = OPERAND(c, 1);
  int ta = (int)ir_get_int(c->n, "trans_a", 0), tb = (int)ir_get_int(c->n, "trans_b", 0);
  int64_t m = a->dims[ta], k = a->dims[!ta], k2 = b->dims[tb], n = b->dims[!tb];
  if (k != k2) return fail(c, "inner sizes differ (%lld vs %lld)", (long long)k, (long long)k2);
  const char *out = ir_get_str(c->n, "out", "");
  *c->out = make(strcmp(out, "f32") == 0 ? DT_F32 : a->dtype, 2, m, n);
  const int acc = ir_get_int(c->n, "accumulate", 0) != 0;
  if (acc != (c->n->n_in == 3)) return fail(c, "an addend c goes with accumulate=1, and accumulate=1 with an addend");
  if (acc && !ir_type_equal(OPERAND(c, 2), c->out)) return fail(c, "the addend c must have the result's type");
  return 0;
}

static int shape_COLSUM(shape_ctx *c) {
  if (want_matrix(c, 0, "x")) return -1;
  *c->out = make(DT_F32, 1, OPERAND(c, 0)->dims[1], 0);
  return 0;
}

static int shape_EMBEDDING_BWD(shape_ctx *c) {
  int64_t rows;
  if (want_matrix(c, 0, "dy") || want_index(c, 1, 1, "tokens") || want_attr_pos(c, "rows", &rows)) return -1;
  *c->out = make(DT_F32, 2, rows, OPERAND(c, 0)->dims[1]);
  return 0;
}

static int shape_RMSNORM_BWD_X(shape_ctx *c) {
  if (want_matrix(c, 0, "dy") || want_matrix(c, 1, "x")) return -1;
  if (OPERAND(c, 0)->dims[1] != OPERAND(c, 1)->dims[1]) return fail(c, "dy and x widths differ");
  const int res = want_residual_flag(c, 3, 3);
  if (res < 0) return -1;
  *c->out = *OPERAND(c, 1);
  return res ? want_residual(c, 3) : 0;
}

static int shape_RMSNORM_BWD_W(shape_ctx *c) {
  if (want_matrix(c, 0, "dy") || want_matrix(c, 1, "x")) return -1;
  *c->out = make(DT_F32, 1, OPERAND(c, 1)->dims[1], 0);
  return 0;
}

static int shape_ATTENTION_BWD(shape_ctx *c) {
  if (shape_ATTENTION(c)) return -1; /* q, k, v and the attributes, as forward */
  const ir_type *q = OPERAND(c, 0), *k = OPERAND(c, 1);
  if (!ir_type_equal(OPERAND(c, 3), q) || !ir_type_equal(OPERAND(c, 4), q)) return fail(c, "out and dout must be like q");
  *c->out = make(q->dtype, 2, q->dims[0], q->dims[1] + 2 * k->dims[1]);
  return 0;
}

static int shape_SLICE_COLS(shape_ctx *c) {
  if (want_matrix(c, 0, "x")) return -1;
  int64_t start = ir_get_int(c->n, "start", -1), width = ir_get_int(c->n, "width", 0);
  if (start < 0 || width <= 0 || start + width > OPERAND(c, 0)->dims[1]) return fail(c, "columns out of range");
  *c->out = make(OPERAND(c, 0)->dtype, 2, OPERAND(c, 0)->dims[0], width);
  return 0;
}

static int shape_SILU_BWD(shape_ctx *c) { return same_types(c); }

static int shape_ROUTE_WEIGHTS_BWD(shape_ctx *c) {
  if (want_matrix(c, 0, "dw")) return -1;
  shape_ctx rest = *c;
  ir_node shifted = *c->n;
  shifted.in = c->n->in + 1;
  shifted.n_in = 2;
  rest.n = &shifted;
  if (want_logits_idx(&rest)) return -1;
  *c->out = *OPERAND(c, 1);
  return 0;
}

static int want_scalar(shape_ctx *c, int i) {
  if (OPERAND(c, i)->rank != 0 || OPERAND(c, i)->dtype != DT_F32) return fail(c, "operand %d must be an f32 scalar", i);
  return 0;
}

static int shape_AUX_LOSS_BWD(shape_ctx *c) {
  if (want_scalar(c, 0) || want_matrix(c, 1, "logits") || want_index(c, 2, 2, "idx") ||
      want_global_counts(c, 3, OPERAND(c, 1)->dims[1]))
    return -1;
  *c->out = *OPERAND(c, 1);
  return 0;
}

static int shape_Z_LOSS_BWD(shape_ctx *c) {
  if (want_scalar(c, 0) || want_matrix(c, 1, "logits")) return -1;
  *c->out = *OPERAND(c, 1);
  return 0;
}

static int shape_DISPATCH_BWD(shape_ctx *c) {
  if (want_matrix(c, 0, "dxe") || want_index(c, 1, 2, "idx")) return -1;
  *c->out = make(OPERAND(c, 0)->dtype, 2, OPERAND(c, 1)->dims[0], OPERAND(c, 0)->dims[1]);
  return 0;
}

static int shape_COMBINE_BWD_Y(shape_ctx *c) {
  if (want_matrix(c, 0, "dout") || want_index(c, 1, 2, "idx")) return -1;
  const ir_type *t = &c->n->type, *d = OPERAND(c, 0);
  if (t->rank != 2 || t->dims[1] != d->dims[1] || t->dtype != d->dtype)
    return fail(c, "result must be [rows, %lld] with the expert's run-time row count", (long long)d->dims[1]);
  *c->out = *t;
  return 0;
}

static int shape_COMBINE_BWD_W(shape_ctx *c) {
  if (want_matrix(c, 0, "dout") || want_index(c, 1, 2, "idx")) return -1;
  if (ir_get_int(c->n, "experts", 0) != c->n->n_in - 2) return fail(c, "experts attribute disagrees with the operand count");
  *c->out = make(DT_F32, 2, OPERAND(c, 1)->dims[0], OPERAND(c, 1)->dims[1]);
  return 0;
}

static int shape_CROSS_ENTROPY_BWD(shape_ctx *c) {
  if (want_scalar(c, 0) || want_matrix(c, 1, "logits") || want_index(c, 2, 1, "labels") || (c->n->n_in == 4 && want_scalar(c, 3)))
    return -1;
  *c->out = make(DT_F32, 2, OPERAND(c, 1)->dims[0], OPERAND(c, 1)->dims[1]);
  return 0;
}


static int shape_PAD_COLS(shape_ctx *c) {
  if (want_matrix(c, 0, "dy")) return -1;
  int64_t start = ir_get_int(c->n, "start", -1), cols = ir_get_int(c->n, "cols", 0);
  if (start < 0 || start + OPERAND(c, 0)->dims[1] > cols) return fail(c, "columns out of range");
  *c->out = make(OPERAND(c, 0)->dtype, 2, OPERAND(c, 0)->dims[0], cols);
  return 0;
}

static int shape_UNSTACK(shape_ctx *c) {
  if (want_stacked(c, 0, "dw")) return -1;
  const ir_type *d = OPERAND(c, 0);
  int64_t e = ir_get_int(c->n, "expert", -1), start = ir_get_int(c->n, "start", -1), width = ir_get_int(c->n, "width", 0);
  if (e < 0 || e >= d->dims[0]) return fail(c, "expert %lld out of range", (long long)e);
  if (start < 0 || width <= 0 || start + width > d->dims[2]) return fail(c, "columns out of range");
  *c->out = make(d->dtype, 2, d->dims[1], width);
  return 0;
}

static int shape_GROUPED_LINEAR_DGRAD(shape_ctx *c) {
  if (want_matrix(c, 0, "dy") || want_stacked(c, 1, "weight")) return -1;
  const ir_type *dy = OPERAND(c, 0), *w = OPERAND(c, 1);
  if (want_counts(c, 2, w->dims[0])) return -1;
  if (dy->dims[1] != w->dims[2]) return fail(c, "dy has %lld columns, the weights %lld outputs", (long long)dy->dims[1], (long long)w->dims[2]);
  *c->out = make(dy->dtype, 2, dy->dims[0], w->dims[1]);
  return 0;
}

static int shape_GROUPED_LINEAR_WGRAD(shape_ctx *c) {
  if (want_matrix(c, 0, "xs") || want_matrix(c, 1, "dy") || want_counts(c, 2, 0)) return -1;
  const ir_type *x = OPERAND(c, 0), *dy = OPERAND(c, 1);
  if (x->dims[0] != dy->dims[0]) return fail(c, "xs and dy disagree on the row count");
  const char *out = ir_get_str(c->n, "out", "");
  *c->out = make3(strcmp(out, "f32") == 0 ? DT_F32 : x->dtype, OPERAND(c, 2)->dims[0], x->dims[1], dy->dims[1]);
  return 0;
}

static int shape_GROUPED_COLSUM(shape_ctx *c) {
  if (want_matrix(c, 0, "dy") || want_counts(c, 1, 0)) return -1;
  *c->out = make(DT_F32, 2, OPERAND(c, 1)->dims[0], OPERAND(c, 0)->dims[1]);
  return 0;
}

static int shape_GROUPED_MLP_BWD(shape_ctx *c) {
  int64_t F;
  if (want_matrix(c, 0, "dy") || want_matrix(c, 1, "gate_up") || want_stacked(c, 2, "down weight") ||
      want_attr_pos(c, "ffn", &F))
    return -1;
  const ir_type *dy = OPERAND(c, 0), *gu = OPERAND(c, 1), *wd = OPERAND(c, 2);
  if (gu->dims[0] != dy->dims[0] || gu->dims[1] != 2 * F) return fail(c, "gate_up must be [rows of dy, %lld]", (long long)(2 * F));
  if (wd->dims[1] != F || wd->dims[2] != dy->dims[1]) return fail(c, "down weight must be [E, %lld, %lld]", (long long)F, (long long)dy->dims[1]);
  if (want_counts(c, 3, wd->dims[0]) || want_probs(c, 4, dy->dims[0])) return -1;
  *c->out = make(DT_F32, 2, dy->dims[0], ir_mlp_bwd_width(F));
  return 0;
}

static int shape_EXPERT_WEIGHT_GRAD(shape_ctx *c) {
  int64_t k;
  if (want_matrix(c, 0, "a") || want_matrix(c, 1, "b") || want_attr_pos(c, "top_k", &k)) return -1;
  const ir_type *a = OPERAND(c, 0), *b = OPERAND(c, 1);
  if (a->dims[0] < 0 || b->dims[0] != a->dims[0] * k || a->dims[1] != b->dims[1])
    return fail(c, "a must be [T, H] and b [T*top_k, H]");
  if (want_perm(c, 2, b->dims[0])) return -1;
  *c->out = make(DT_F32, 2, a->dims[0], k);
  return 0;
}

static int shape_EXPERT_PROBS_BWD(shape_ctx *c) {
  int64_t k;
  if (want_matrix(c, 0, "dp") || want_attr_pos(c, "top_k", &k)) return -1;
  const ir_type *dp = OPERAND(c, 0);
  if (dp->dims[1] != 1 || dp->dims[0] < 0 || dp->dims[0] % k) return fail(c, "dp must be [T*top_k, 1]");
  if (want_perm(c, 1, dp->dims[0])) return -1;
  *c->out = make(DT_F32, 2, dp->dims[0] / k, k);
  return 0;
}

static int shape_MXFP8_QUANTIZE(shape_ctx *c) {
  const ir_type *x = OPERAND(c, 0);
  char buf[96];
  if (x->rank < 1 || !is_float(x->dtype))
    return fail(c, "x must be a float tensor, got %s", ir_type_str(c->g, x, buf, sizeof buf));
  int64_t block, axis = ir_get_int(c->n, "axis", -1), share = ir_get_int(c->n, "share128", 0);
  if (want_attr_pos(c, "block", &block)) return -1;
  if (axis < 0 || axis >= x->rank) return fail(c, "axis %lld is not a dimension of x", (long long)axis);
  if (share != 0 && share != 1) return fail(c, "share128 must be 0 or 1");
  if (share && 128 % block) return fail(c, "share128 needs a block that divides 128");
  const int64_t tile = ir_get_int(c->n, "tile", 0);
  if (tile != 0 && tile != 128) return fail(c, "tile must be 0 or 128, got %lld", (long long)tile);
  if (tile && (x->rank != 3 || c->n->n_in != 1 || !share || x->dims[1] % tile || x->dims[2] % tile))
    return fail(c, "tile = %lld squares need a weight (E, in, out) with in and out multiples of it, and share128 = 1",
                (long long)tile);
  if (c->n->n_in == 2) {
    if (want_counts(c, 1, 0)) return -1;
    if (axis != 0) return fail(c, "blocks that restart at each expert's rows run along axis 0");
  }
  *c->out = *x;
  c->out->dtype = DT_E4M3;
  return 0;
}

static int shape_MXFP8_DEQUANTIZE(shape_ctx *c) {
  if (OPERAND(c, 0)->dtype != DT_E4M3) return fail(c, "dequantizes e4m3 (MX) values only");
  if (!is_float(c->n->type.dtype)) return fail(c, "the result must be f32 or bf16");
  *c->out = *OPERAND(c, 0);
  c->out->dtype = c->n->type.dtype;
  return 0;
}

static int shape_GRAD_NORM(shape_ctx *c) {
  for (int i = 0; i < c->n->n_in; i++)
    if (!is_float(OPERAND(c, i)->dtype)) return fail(c, "gradients must be f32 or bf16 (operand %d)", i);
  *c->out = make(DT_F32, 0, 0, 0);
  return 0;
}

/* A collective's group attribute: its size in the graph's world, or -1 with a message. */
static int64_t want_group(shape_ctx *c) {
  const char *grp = ir_get_str(c->n, "group", "");
  int64_t size = ir_group_size(c->g, grp);
  if (size <= 0) fail(c, "group must be world, ep or dp, got '%s'", grp);
  return size > 0 ? size : -1;
}

static int shape_ADAMW(shape_ctx *c) {
  const ir_type *p = OPERAND(c, 0);
  if (c->g->nodes[c->n->in[0]].op != OP_PARAM) return fail(c, "operand 0 must be a param");
  ir_type gt = *OPERAND(c, 1);
  if (gt.dtype == DT_BF16) gt.dtype = p->dtype; /* fold-grad-cast: a bf16 gradient of an f32 param */
  const char *zero = ir_get_str(c->n, "zero", NULL);
  if (zero) { /* ZeRO-1: the gradient is this rank's shard */
    int64_t size = ir_group_size(c->g, zero), n = ir_type_numel_bound(c->g, p);
    if (size <= 0) return fail(c, "zero must name a group (world, ep or dp), got '%s'", zero);
    ir_type want = make(p->dtype, 1, ir_shard_len(n, size), 0);
    if (!ir_type_equal(&want, &gt)) return fail(c, "with zero = %s the gradient must be the param's shard, f32[%lld]", zero,
                                                (long long)want.dims[0]);
  } else if (!ir_type_equal(p, &gt)) {
    return fail(c, "the gradient must have the param's shape, in f32 or bf16");
  }
  if (want_scalar(c, 2)) return -1;
  *c->out = *p;
  return 0;
}

static int shape_LABEL_COUNT(shape_ctx *c) {
  if (want_index(c, 0, 1, "labels")) return -1;
  *c->out = make(DT_F32, 0, 0, 0);
  return 0;
}

static int shape_ALL_REDUCE(shape_ctx *c) {
  const char *grp = ir_get_str(c->n, "group", "");
  if (strcmp(grp, "world") && strcmp(grp, "ep") && strcmp(grp, "dp")) return fail(c, "group must be world, ep or dp, got '%s'", grp);
  const ir_type *x = OPERAND(c, 0);
  if (x->dtype != DT_F32 && x->dtype != DT_I32) return fail(c, "sums f32 or i32 values");
  for (int d = 0; d < x->rank; d++)
    if (x->dims[d] < 0) return fail(c, "needs static sizes (every rank sums the same number of values)");
  *c->out = *x;
  return 0;
}

static int shape_REDUCE_SCATTER(shape_ctx *c) {
  int64_t size = want_group(c);
  if (size < 0) return -1;
  const ir_type *x = OPERAND(c, 0);
  if (x->dtype != DT_F32) return fail(c, "sums f32 values");
  for (int d = 0; d < x->rank; d++)
    if (x->dims[d] < 0) return fail(c, "needs static sizes (every rank cuts the same shards)");
  *c->out = make(DT_F32, 1, ir_shard_len(ir_type_numel_bound(c->g, x), size), 0);
  return 0;
}

static int shape_ALL_GATHER(shape_ctx *c) {
  if (want_group(c) < 0) return -1;
  if (c->g->nodes[c->n->in[0]].op != OP_ADAMW) return fail(c, "gathers the parameter an adamw updated (operand 0)");
  *c->out = *OPERAND(c, 0);
  return 0;
}

/* The EP collectives: experts and ep attributes, counts i32[E]. */
static int want_ep(shape_ctx *c, int i, int64_t *E, int64_t *ep) {
  if (want_attr_pos(c, "experts", E) || want_attr_pos(c, "ep", ep)) return -1;
  if (*E % *ep) return fail(c, "experts = %lld is not a multiple of ep = %lld", (long long)*E, (long long)*ep);
  int64_t r = ir_get_int(c->n, "ep_rank", -1);
  if (r < 0 || r >= *ep) return fail(c, "needs an 'ep_rank' attribute in [0, ep)");
  return want_counts(c, i, *E);
}

static int shape_EP_ALL_TO_ALL(shape_ctx *c) {
  int64_t E, ep;
  if (want_matrix(c, 0, "x") || want_ep(c, 1, &E, &ep)) return -1;
  const ir_type *x = OPERAND(c, 0), *t = &c->n->type;
  if (ir_get_int(c->n, "reverse", 0)) {
    int64_t rows;
    if (want_attr_pos(c, "rows", &rows)) return -1;
    *c->out = make(x->dtype, 2, rows, x->dims[1]);
    return 0;
  }
  if (t->rank != 2 || t->dims[1] != x->dims[1] || t->dtype != x->dtype)
    return fail(c, "result must be %s[rows, %lld], with its run-time row count given by the builder", ir_dtype_name(x->dtype),
                (long long)x->dims[1]);
  *c->out = *t;
  return 0;
}

static int shape_EP_LOCAL_COUNTS(shape_ctx *c) {
  int64_t E, ep;
  if (want_ep(c, 0, &E, &ep)) return -1;
  *c->out = make(DT_I32, 1, E / ep, 0);
  return 0;
}

typedef int (*shape_fn)(shape_ctx *);
static const shape_fn shape_rules[] = {
#define OP(id, name, min_in, max_in, cg) [OP_##id] = shape_##id,
#include "ops.def"
#undef OP
};
static_assert(sizeof shape_rules / sizeof shape_rules[0] == OP_COUNT, "one shape rule per op");

int ir_infer_type(const ir_graph *g, const ir_node *n, ir_type *out, char *err, size_t errlen) {
  shape_ctx c = {g, n, out, err, errlen};
  ir_type result;
  memset(&result, 0, sizeof result);
  c.out = &result;
  if (shape_rules[n->op](&c) != 0) return -1;
  *out = result;
  return 0;
}
