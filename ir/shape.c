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

static int shape_AUX_LOSS(shape_ctx *c) {
  if (want_logits_idx(c)) return -1;
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
  if (want_matrix(c, 0, "logits") || want_index(c, 1, 1, "labels")) return -1;
  if (OPERAND(c, 0)->dims[0] != OPERAND(c, 1)->dims[0]) return fail(c, "logits and labels disagree on the token count");
  *c->out = make(DT_F32, 0, 0, 0);
  return 0;
}

static int shape_FILL(shape_ctx *c) {
  if (!is_float(c->n->type.dtype)) return fail(c, "fills float tensors only");
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
  *c->out = *OPERAND(c, 1);
  return 0;
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
  if (want_scalar(c, 0) || want_matrix(c, 1, "logits") || want_index(c, 2, 2, "idx")) return -1;
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
  if (want_scalar(c, 0) || want_matrix(c, 1, "logits") || want_index(c, 2, 1, "labels")) return -1;
  *c->out = make(DT_F32, 2, OPERAND(c, 1)->dims[0], OPERAND(c, 1)->dims[1]);
  return 0;
}

static int shape_GRAD_NORM(shape_ctx *c) {
  for (int i = 0; i < c->n->n_in; i++)
    if (OPERAND(c, i)->dtype != DT_F32) return fail(c, "gradients must be f32 (operand %d)", i);
  *c->out = make(DT_F32, 0, 0, 0);
  return 0;
}

static int shape_ADAMW(shape_ctx *c) {
  const ir_type *p = OPERAND(c, 0);
  if (c->g->nodes[c->n->in[0]].op != OP_PARAM) return fail(c, "operand 0 must be a param");
  if (!ir_type_equal(p, OPERAND(c, 1))) return fail(c, "the gradient must have the param's type");
  if (want_scalar(c, 2)) return -1;
  *c->out = *p;
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
