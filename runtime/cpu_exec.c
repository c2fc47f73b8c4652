/* cpu_exec.c -- interprets the IR node by node on the CPU. One exec function per op (the op
 * table's CPU column); run-time sizes (rows routed to each expert) are computed as it goes;
 * each value is freed after its last use. */
#include "cpu_exec.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ck_grouped.h"
#include "comm.h"
#include "cpu_ep.h"
#include "cpu_kernels.h"

typedef struct {
  float *f;       /* float values (bf16 ones are kept rounded, in fp32) */
  int32_t *i;     /* integer values */
  int64_t rows;   /* run-time leading dimension (rank >= 1) */
  int64_t numel;
  int owned;      /* freed after the last use */
} rt_value;

struct cpu_exec {
  const ir_graph *g;
  rt_params *ps;
  rt_param **param_of; /* (n_nodes) storage of each param op */
  int *last_use;       /* (n_nodes) last node that reads each value */
  rt_value *val;       /* (n_nodes) */
  const int32_t *tokens, *labels;
  int64_t step;
  double grad_norm;
  int keep_all;
  comm_world *comm;
  int rank;
  char *err;
  size_t errlen;
};

typedef struct cpu_exec ex;

static int fail(ex *x, int id, const char *fmt, ...) {
  const ir_node *n = &x->g->nodes[id];
  int k = snprintf(x->err, x->errlen, "%s:%d:%d: error: %s (%%%d): ", n->loc.file ? n->loc.file : "?", n->loc.line,
                   n->loc.col, ir_ops[n->op].name, id);
  va_list ap;
  va_start(ap, fmt);
  if (k >= 0 && (size_t)k < x->errlen) vsnprintf(x->err + k, x->errlen - (size_t)k, fmt, ap);
  va_end(ap);
  return -1;
}

static int check_ck(ex *x, int id, int rc) {
  return rc == CK_OK ? 0 : fail(x, id, "%s", ck_strerror(rc));
}

/* ---- helpers ---- */
#define N(id) (&x->g->nodes[id])
#define IN(id, k) (&x->val[N(id)->in[k]])
#define COLS(id) (N(id)->type.rank >= 2 ? N(id)->type.dims[N(id)->type.rank - 1] : 1)
#define INCOLS(id, k) COLS(N(id)->in[k])

/* Allocates the result of node id with `rows` leading rows (rank >= 1) or one value. */
static int alloc_out(ex *x, int id, int64_t rows, int zero) {
  const ir_type *t = &N(id)->type;
  int64_t numel = t->rank == 0 ? 1 : rows;
  for (int d = 1; d < t->rank; d++) numel *= t->dims[d];
  rt_value *v = &x->val[id];
  v->rows = t->rank == 0 ? 1 : rows;
  v->numel = numel;
  v->owned = 1;
  size_t bytes = (size_t)(numel ? numel : 1) * 4;
  if (t->dtype == DT_I32) v->i = zero ? calloc(1, bytes) : malloc(bytes);
  else v->f = zero ? calloc(1, bytes) : malloc(bytes);
  if (!v->i && !v->f) return fail(x, id, "out of host memory (%lld values)", (long long)numel);
  return 0;
}

/* Static leading size of a value's type, or its run-time rows. */
static int64_t rows_of(ex *x, int v) { return x->val[v].rows; }

/* The (token, slot) pairs routed to expert e: *n of them, in *rows and *slots (caller frees).
 * 0, or -1 with the message set. */
static int route_rows(ex *x, int id, const rt_value *idx, int64_t T, int64_t k, int e, int32_t **rows,
                      int32_t **slots, int64_t *n) {
  *rows = malloc((size_t)(T * k + 1) * sizeof(int32_t));
  *slots = malloc((size_t)(T * k + 1) * sizeof(int32_t));
  if (!*rows || !*slots) {
    free(*rows);
    free(*slots);
    return fail(x, id, "out of host memory");
  }
  *n = ck_route_rows(idx->i, T, k, e, *rows, *slots);
  return 0;
}

/* ---- one exec function per op ---- */
static int exec_INPUT(ex *x, int id) {
  const char *name = ir_get_str(N(id), "name", "");
  const int32_t *src = strcmp(name, "tokens") == 0 ? x->tokens : strcmp(name, "labels") == 0 ? x->labels : NULL;
  if (!src) return fail(x, id, "unknown input '%s'", name);
  x->val[id] = (rt_value){NULL, (int32_t *)src, N(id)->type.dims[0], N(id)->type.dims[0], 0};
  return 0;
}

static int exec_PARAM(ex *x, int id) {
  rt_param *p = x->param_of[id];
  x->val[id] = (rt_value){p->w, NULL, p->type.dims[0], p->numel, 0};
  return 0;
}

static int exec_CAST(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  memcpy(x->val[id].f, a->f, (size_t)a->numel * sizeof(float));
  return 0;
}

static int exec_EMBEDDING(ex *x, int id) {
  const rt_value *tab = IN(id, 0), *tok = IN(id, 1);
  int64_t H = INCOLS(id, 0);
  if (alloc_out(x, id, tok->rows, 0)) return -1;
  return check_ck(x, id, ck_embedding_fwd(tab->f, tok->i, x->val[id].f, tok->rows, tab->rows, H));
}

static int exec_RMSNORM(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  ck_rmsnorm_fwd(a->f, IN(id, 1)->f, x->val[id].f, a->rows, COLS(id), (float)ir_get_float(N(id), "eps", 1e-5));
  return 0;
}

static int exec_LINEAR(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  ck_linear_fwd(a->f, IN(id, 1)->f, N(id)->n_in == 3 ? IN(id, 2)->f : NULL, x->val[id].f, a->rows, INCOLS(id, 0),
                COLS(id));
  return 0;
}

static int exec_ROPE(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  int64_t nh = ir_get_int(N(id), "heads", 1), hd = COLS(id) / nh, seq = ir_get_int(N(id), "seq", a->rows);
  double theta = ir_get_float(N(id), "theta", 1e4);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  int rc = ir_get_int(N(id), "inverse", 0) ? ck_rope_bwd(a->f, x->val[id].f, a->rows, nh, hd, seq, theta)
                                           : ck_rope_fwd(a->f, x->val[id].f, a->rows, nh, hd, seq, theta);
  return check_ck(x, id, rc);
}

typedef struct {
  int64_t B, seq, nh, nkv, hd;
  int causal;
} attn_dims;

static attn_dims attention_dims(ex *x, int id) {
  attn_dims d;
  d.seq = ir_get_int(N(id), "seq", 1);
  d.B = rows_of(x, N(id)->in[0]) / d.seq;
  d.nh = ir_get_int(N(id), "heads", 1);
  d.nkv = ir_get_int(N(id), "kv_heads", 1);
  d.hd = INCOLS(id, 0) / d.nh;
  d.causal = (int)ir_get_int(N(id), "causal", 1);
  return d;
}

static int exec_ATTENTION(ex *x, int id) {
  attn_dims d = attention_dims(x, id);
  float *lse = malloc((size_t)(d.B * d.nh * d.seq) * sizeof(float));
  if (!lse || alloc_out(x, id, IN(id, 0)->rows, 0)) {
    free(lse);
    return lse ? -1 : fail(x, id, "out of host memory");
  }
  int rc = ck_attention_fwd(IN(id, 0)->f, IN(id, 1)->f, IN(id, 2)->f, x->val[id].f, lse, d.B, d.seq, d.nh, d.nkv,
                            d.hd, d.causal);
  free(lse);
  return check_ck(x, id, rc);
}

static int exec_TOPK(ex *x, int id) {
  const rt_value *l = IN(id, 0);
  if (alloc_out(x, id, l->rows, 0)) return -1;
  return check_ck(x, id, ck_topk(l->f, x->val[id].i, l->rows, INCOLS(id, 0), COLS(id)));
}

static int exec_ROUTE_WEIGHTS(ex *x, int id) {
  const rt_value *l = IN(id, 0);
  if (alloc_out(x, id, l->rows, 0)) return -1;
  return check_ck(x, id, ck_route_weights_fwd(l->f, IN(id, 1)->i, x->val[id].f, l->rows, INCOLS(id, 0), COLS(id)));
}

static int exec_AUX_LOSS(ex *x, int id) {
  const rt_value *l = IN(id, 0);
  if (alloc_out(x, id, 1, 0)) return -1;
  if (N(id)->n_in == 3)
    return check_ck(x, id, ck_aux_loss_share_fwd(l->f, IN(id, 2)->i, x->val[id].f, l->rows, INCOLS(id, 0), INCOLS(id, 1),
                                                 (float)ir_get_float(N(id), "coef", 0)));
  return check_ck(x, id, ck_aux_loss_fwd(l->f, IN(id, 1)->i, x->val[id].f, l->rows, INCOLS(id, 0), INCOLS(id, 1),
                                         (float)ir_get_float(N(id), "coef", 0)));
}

/* z_loss's coefficient; with global_tokens (a share of the loss of all ranks), scaled so the
 * kernel's mean over the T local tokens becomes the sum over global_tokens. */
static float z_coef(ex *x, int id, int64_t T) {
  double coef = ir_get_float(N(id), "coef", 0);
  int64_t g = ir_get_int(N(id), "global_tokens", 0);
  return (float)(g > 0 ? coef * (double)T / (double)g : coef);
}

static int exec_Z_LOSS(ex *x, int id) {
  const rt_value *l = IN(id, 0);
  if (alloc_out(x, id, 1, 0)) return -1;
  ck_z_loss_fwd(l->f, x->val[id].f, l->rows, INCOLS(id, 0), z_coef(x, id, l->rows));
  return 0;
}

static int exec_DISPATCH(ex *x, int id) {
  const rt_value *a = IN(id, 0), *idx = IN(id, 1);
  int32_t *rows, *slots;
  int64_t n = 0;
  if (route_rows(x, id, idx, idx->rows, INCOLS(id, 1), (int)ir_get_int(N(id), "expert", 0), &rows, &slots, &n))
    return -1;
  int rc = alloc_out(x, id, n, 0);
  if (rc == 0) rc = check_ck(x, id, ck_dispatch_fwd(a->f, rows, x->val[id].f, a->rows, n, COLS(id)));
  free(rows);
  free(slots);
  return rc;
}

/* Pointers to the expert outputs y_0..y_{E-1}, operands first..first+E-1 of node id. */
static const float **expert_ptrs(ex *x, int id, int first, int64_t E) {
  const float **y = malloc((size_t)E * sizeof *y);
  if (!y) return NULL;
  for (int64_t e = 0; e < E; e++) y[e] = IN(id, first + (int)e)->f;
  return y;
}

static int exec_COMBINE(ex *x, int id) {
  const rt_value *idx = IN(id, 0);
  int64_t E = N(id)->n_in - 2;
  const float **y = expert_ptrs(x, id, 2, E);
  if (!y) return fail(x, id, "out of host memory");
  int rc = alloc_out(x, id, idx->rows, 0);
  if (rc == 0)
    rc = check_ck(x, id, ck_combine_fwd(idx->i, IN(id, 1)->f, y, x->val[id].f, idx->rows, INCOLS(id, 0), E, COLS(id)));
  free(y);
  return rc;
}

/* ---- experts over expert-sorted tokens ---- */
#define DIM(id, k, d) (N(N(id)->in[k])->type.dims[d])
#define OPT(id, k) (N(id)->n_in > (k) ? IN(id, k)->f : NULL)

static int exec_EXPERT_COUNTS(ex *x, int id) {
  const rt_value *idx = IN(id, 0);
  if (alloc_out(x, id, N(id)->type.dims[0], 0)) return -1;
  return check_ck(x, id, ck_expert_counts(idx->i, idx->rows, INCOLS(id, 0), N(id)->type.dims[0], x->val[id].i));
}

static int exec_EXPERT_SORT(ex *x, int id) {
  const rt_value *idx = IN(id, 0);
  if (alloc_out(x, id, N(id)->type.dims[0], 0)) return -1;
  return check_ck(x, id, ck_expert_sort(idx->i, idx->rows, INCOLS(id, 0), ir_get_int(N(id), "experts", 0), x->val[id].i));
}

/* 1 when the op carries a residual (fuse-residual), its last operand. */
static int residual_of(ex *x, int id) { return (int)ir_get_int(N(id), "residual", 0); }

/* The folded add: the op's result rounded to its type as the op's own would be, then
 * + residual, rounded by the caller as the add's was (ops.def: the same bits). */
static void add_residual(ex *x, int id, int res) {
  if (!res) return;
  rt_value *o = &x->val[id];
  if (N(id)->type.dtype == DT_BF16) ck_round_bf16(o->f, o->numel);
  ck_add_fwd(IN(id, N(id)->n_in - 1)->f, o->f, o->f, o->numel);
}

static int exec_EXPERT_PERMUTE(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  int64_t k = ir_get_int(N(id), "top_k", 1);
  if (alloc_out(x, id, a->rows * k, 0)) return -1;
  return check_ck(x, id, ck_expert_permute(a->f, IN(id, 1)->i, OPT(id, 2), x->val[id].f, a->rows, k, COLS(id)));
}

static int exec_EXPERT_UNPERMUTE(ex *x, int id) {
  const rt_value *ys = IN(id, 0);
  int64_t k = ir_get_int(N(id), "top_k", 1);
  const int res = residual_of(x, id);
  if (alloc_out(x, id, ys->rows / k, 0)) return -1;
  if (check_ck(x, id, ck_expert_unpermute(ys->f, IN(id, 1)->i, N(id)->n_in - res > 2 ? IN(id, 2)->f : NULL, x->val[id].f,
                                          ys->rows / k, k, COLS(id))))
    return -1;
  add_residual(x, id, res);
  return 0;
}

static int exec_EXPERT_PROBS(ex *x, int id) {
  const rt_value *w = IN(id, 0);
  if (alloc_out(x, id, w->numel, 0)) return -1;
  return check_ck(x, id, ck_expert_probs(w->f, IN(id, 1)->i, x->val[id].f, w->rows, INCOLS(id, 0)));
}

static int exec_STACK(ex *x, int id) {
  /* out[e, :, part p columns] = operand p*E + e */
  const ir_type *t = &N(id)->type;
  int64_t E = t->dims[0], in = t->dims[1], C = t->dims[2], parts = N(id)->n_in / E, c0 = 0;
  if (alloc_out(x, id, E, 0)) return -1;
  for (int64_t p = 0; p < parts; p++) {
    int64_t w = DIM(id, (int)(p * E), 1);
    for (int64_t e = 0; e < E; e++) {
      const float *src = IN(id, (int)(p * E + e))->f;
      for (int64_t r = 0; r < in; r++) memcpy(x->val[id].f + (e * in + r) * C + c0, src + r * w, (size_t)w * sizeof(float));
    }
    c0 += w;
  }
  return 0;
}

static int exec_GROUPED_LINEAR(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  int64_t E = DIM(id, 1, 0), in = DIM(id, 1, 1), out = DIM(id, 1, 2);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  return check_ck(x, id, ck_grouped_linear_fwd(a->f, IN(id, 1)->f, OPT(id, 3), IN(id, 2)->i, x->val[id].f, a->rows, E, in, out));
}

static int exec_GROUPED_MLP(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  int64_t E = DIM(id, 1, 0), H = DIM(id, 0, 1), F = ir_get_int(N(id), "ffn", 0);
  ck_mlp_precision prec = {N(id)->type.dtype == DT_BF16, ir_get_int(N(id), "mx_block", 0),
                           (int)ir_get_int(N(id), "mx_share128", 0)};
  if (alloc_out(x, id, a->rows, 0)) return -1;
  return check_ck(x, id, ck_grouped_mlp_fwd(a->f, IN(id, 1)->f, IN(id, 2)->f, IN(id, 3)->i, IN(id, 4)->f, x->val[id].f,
                                            a->rows, E, H, F, prec));
}

static int exec_SILU(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  ck_silu_fwd(a->f, x->val[id].f, a->numel);
  return 0;
}

static int exec_MUL(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  ck_mul_fwd(a->f, IN(id, 1)->f, x->val[id].f, a->numel);
  return 0;
}

static int exec_ADD(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  ck_add_fwd(a->f, IN(id, 1)->f, x->val[id].f, a->numel);
  return 0;
}

static int exec_CROSS_ENTROPY(ex *x, int id) {
  const rt_value *l = IN(id, 0);
  if (alloc_out(x, id, 1, 0)) return -1;
  /* with the global label count (operand 2): this rank's share of the global mean */
  if (N(id)->n_in == 3)
    return check_ck(x, id, ck_cross_entropy_share_fwd(l->f, IN(id, 1)->i, IN(id, 2)->f[0], x->val[id].f, l->rows,
                                                      INCOLS(id, 0)));
  return check_ck(x, id, ck_cross_entropy_fwd(l->f, IN(id, 1)->i, x->val[id].f, l->rows, INCOLS(id, 0)));
}

static int exec_LABEL_COUNT(ex *x, int id) {
  const rt_value *lab = IN(id, 0);
  if (alloc_out(x, id, 1, 0)) return -1;
  x->val[id].f[0] = (float)ck_label_count(lab->i, lab->rows);
  return 0;
}

static int exec_ALL_REDUCE(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  const char *gs = ir_get_str(N(id), "group", "world");
  comm_group grp = comm_group_named(gs);
  if (!x->comm) return fail(x, id, "a collective, but this executor has no communicator (run it through moec train)");
  int is_int = N(id)->type.dtype == DT_I32;
  if (alloc_out(x, id, a->rows, 0)) return -1;
  void *buf = is_int ? (void *)x->val[id].i : (void *)x->val[id].f;
  memcpy(buf, is_int ? (const void *)a->i : (const void *)a->f, (size_t)a->numel * 4);
  char m[512];
  if (comm_all_reduce_sum(comm_get(x->comm, x->rank, grp), buf, a->numel, is_int ? COMM_I32 : COMM_F32, m, sizeof m))
    return fail(x, id, "%s", m);
  return 0;
}

/* A ZeRO collective's group, checked against the graph's shard length (chunk values, when >= 0)
 * of a tensor of n; NULL after fail(). */
static comm *zero_comm(ex *x, int id, int64_t n, int64_t chunk) {
  if (!x->comm) {
    fail(x, id, "a collective, but this executor has no communicator (run it through moec train)");
    return NULL;
  }
  const char *gs = ir_get_str(N(id), "group", "world");
  comm *c = comm_get(x->comm, x->rank, comm_group_named(gs));
  if (chunk >= 0 && ir_shard_len(n, comm_size(c)) != chunk) {
    fail(x, id, "the graph cuts %lld values in shards of %lld, but the %s group has %d ranks", (long long)n,
         (long long)chunk, gs, comm_size(c));
    return NULL;
  }
  return c;
}

static int exec_REDUCE_SCATTER(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  comm *c = zero_comm(x, id, a->numel, N(id)->type.dims[0]);
  if (!c || alloc_out(x, id, N(id)->type.dims[0], 0)) return -1;
  char m[512];
  if (comm_reduce_scatter_sum(c, a->f, a->numel, x->val[id].f, m, sizeof m)) return fail(x, id, "%s", m);
  return 0;
}

/* In place: the updated parameter's shards from every rank of the group. */
static int exec_ALL_GATHER(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  const int64_t n = a->numel;
  comm *c = zero_comm(x, id, n, -1);
  if (!c) return -1;
  const int64_t part = ir_shard_len(n, comm_size(c)), lo = (int64_t)comm_rank(c) * part;
  const int64_t mine = ir_shard_count(n, comm_size(c), comm_rank(c));
  float *send = calloc((size_t)part + 1, sizeof *send), *all = malloc(((size_t)part * (size_t)comm_size(c) + 1) * sizeof *all);
  char m[512];
  int rc = !send || !all ? fail(x, id, "out of host memory") : 0;
  if (rc == 0) {
    memcpy(send, a->f + lo, (size_t)mine * sizeof *send);
    if (comm_all_gather(c, send, (size_t)part * sizeof *send, all, m, sizeof m)) rc = fail(x, id, "%s", m);
    else memcpy(a->f, all, (size_t)n * sizeof *all);
  }
  free(send);
  free(all);
  x->val[id] = (rt_value){a->f, NULL, a->rows, n, 0};
  return rc;
}

/* The EP group's counts (P x E) for an EP op; checks that the graph was built for this rank. */
static int32_t *ep_counts_all(ex *x, int id, comm **c) {
  if (!x->comm) {
    fail(x, id, "a collective, but this executor has no communicator (run it through moec train)");
    return NULL;
  }
  *c = comm_get(x->comm, x->rank, COMM_EP);
  int64_t E = ir_get_int(N(id), "experts", 0);
  if (comm_rank(*c) != ir_get_int(N(id), "ep_rank", -1) || comm_size(*c) != ir_get_int(N(id), "ep", 0)) {
    fail(x, id, "the graph is EP rank %lld of %lld, but this is EP rank %d of %d", (long long)ir_get_int(N(id), "ep_rank", -1),
         (long long)ir_get_int(N(id), "ep", 0), comm_rank(*c), comm_size(*c));
    return NULL;
  }
  int32_t *all = malloc((size_t)(E * comm_size(*c)) * sizeof *all);
  char m[512];
  if (!all) fail(x, id, "out of host memory");
  else if (ep_gather_counts(*c, E, IN(id, 1 - (N(id)->n_in == 1))->i, all, m, sizeof m)) {
    fail(x, id, "%s", m);
    free(all);
    all = NULL;
  }
  return all;
}

static int exec_EP_ALL_TO_ALL(ex *x, int id) {
  comm *c;
  int32_t *all = ep_counts_all(x, id, &c);
  if (!all) return -1;
  int64_t E = ir_get_int(N(id), "experts", 0);
  int rev = (int)ir_get_int(N(id), "reverse", 0);
  int rc = alloc_out(x, id, ep_rows(comm_size(c), comm_rank(c), E, all, rev), 0);
  char m[512];
  if (rc == 0 && ep_exchange(c, E, all, IN(id, 0)->f, COLS(id), rev, x->val[id].f, m, sizeof m)) rc = fail(x, id, "%s", m);
  free(all);
  return rc;
}

static int exec_EP_LOCAL_COUNTS(ex *x, int id) {
  comm *c;
  int32_t *all = ep_counts_all(x, id, &c);
  if (!all) return -1;
  int rc = alloc_out(x, id, N(id)->type.dims[0], 0);
  if (rc == 0) ep_local_counts(comm_size(c), comm_rank(c), ir_get_int(N(id), "experts", 0), all, x->val[id].i);
  free(all);
  return rc;
}

static int exec_FILL(ex *x, int id) {
  const ir_type *t = &N(id)->type;
  if (alloc_out(x, id, t->rank ? t->dims[0] : 1, 0)) return -1;
  double v = ir_get_float(N(id), "value", 0);
  if (t->dtype == DT_I32)
    for (int64_t i = 0; i < x->val[id].numel; i++) x->val[id].i[i] = (int32_t)v;
  else
    for (int64_t i = 0; i < x->val[id].numel; i++) x->val[id].f[i] = (float)v;
  return 0;
}

static int exec_MATMUL(ex *x, int id) {
  const rt_value *a = IN(id, 0), *b = IN(id, 1);
  int ta = (int)ir_get_int(N(id), "trans_a", 0), tb = (int)ir_get_int(N(id), "trans_b", 0);
  int64_t ar = a->rows, ac = INCOLS(id, 0), br = b->rows, bc = INCOLS(id, 1);
  int64_t m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
  if ((tb ? bc : br) != k) return fail(x, id, "inner sizes differ at run time (%lld vs %lld)", (long long)k, (long long)(tb ? bc : br));
  if (alloc_out(x, id, m, 0)) return -1;
  ck_matmul(a->f, b->f, x->val[id].f, m, k, n, ta, tb, 0.0f);
  if (N(id)->n_in == 3) /* fuse-gemm-add's addend: product + c in f32, rounded once by the caller */
    ck_add_fwd(x->val[id].f, IN(id, 2)->f, x->val[id].f, x->val[id].numel);
  return 0;
}

static int exec_COLSUM(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  int64_t M = INCOLS(id, 0);
  if (alloc_out(x, id, M, 1)) return -1;
  for (int64_t r = 0; r < a->rows; r++)
    for (int64_t c = 0; c < M; c++) x->val[id].f[c] += a->f[r * M + c];
  return 0;
}

static int exec_EMBEDDING_BWD(ex *x, int id) {
  const rt_value *dy = IN(id, 0), *tok = IN(id, 1);
  int64_t V = N(id)->type.dims[0];
  if (alloc_out(x, id, V, 1)) return -1;
  return check_ck(x, id, ck_embedding_bwd(tok->i, dy->f, x->val[id].f, tok->rows, V, COLS(id)));
}

static int exec_RMSNORM_BWD_X(ex *x, int id) {
  const rt_value *dy = IN(id, 0), *a = IN(id, 1);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  ck_rmsnorm_bwd(a->f, IN(id, 2)->f, dy->f, x->val[id].f, NULL, a->rows, COLS(id), (float)ir_get_float(N(id), "eps", 1e-5));
  add_residual(x, id, residual_of(x, id));
  return 0;
}

static int exec_RMSNORM_BWD_W(ex *x, int id) {
  /* dw = sum_t dy * x * rstd(x) does not depend on w; the kernel computes it alongside dx,
   * so call it with unit weights and a scratch dx. */
  const rt_value *dy = IN(id, 0), *a = IN(id, 1);
  int64_t H = INCOLS(id, 1);
  float *ones = malloc((size_t)H * sizeof(float)), *dx = malloc((size_t)a->numel * sizeof(float));
  int rc = (!ones || !dx) ? fail(x, id, "out of host memory") : alloc_out(x, id, H, 1);
  if (rc == 0) {
    for (int64_t i = 0; i < H; i++) ones[i] = 1.0f;
    ck_rmsnorm_bwd(a->f, ones, dy->f, dx, x->val[id].f, a->rows, H, (float)ir_get_float(N(id), "eps", 1e-5));
  }
  free(ones);
  free(dx);
  return rc;
}

static int exec_ATTENTION_BWD(ex *x, int id) {
  attn_dims d = attention_dims(x, id);
  int64_t T = IN(id, 0)->rows, cq = d.nh * d.hd, ck = d.nkv * d.hd, W = cq + 2 * ck;
  /* the forward's logsumexp is recomputed here rather than kept alive through the step */
  float *lse = malloc((size_t)(d.B * d.nh * d.seq) * sizeof(float));
  float *scratch = malloc((size_t)(T * (cq + W)) * sizeof(float));
  int rc = (!lse || !scratch) ? fail(x, id, "out of host memory") : alloc_out(x, id, T, 0);
  if (rc == 0)
    rc = check_ck(x, id, ck_attention_fwd(IN(id, 0)->f, IN(id, 1)->f, IN(id, 2)->f, scratch, lse, d.B, d.seq, d.nh,
                                          d.nkv, d.hd, d.causal));
  float *dq = scratch + T * cq, *dk = dq + T * cq, *dv = dk + T * ck;
  if (rc == 0)
    rc = check_ck(x, id, ck_attention_bwd(IN(id, 0)->f, IN(id, 1)->f, IN(id, 2)->f, IN(id, 3)->f, lse, IN(id, 4)->f, dq,
                                          dk, dv, d.B, d.seq, d.nh, d.nkv, d.hd, d.causal));
  if (rc == 0) {
    float *out = x->val[id].f; /* (T, cq | ck | ck) */
    for (int64_t t = 0; t < T; t++) {
      memcpy(out + t * W, dq + t * cq, (size_t)cq * sizeof(float));
      memcpy(out + t * W + cq, dk + t * ck, (size_t)ck * sizeof(float));
      memcpy(out + t * W + cq + ck, dv + t * ck, (size_t)ck * sizeof(float));
    }
  }
  free(lse);
  free(scratch);
  return rc;
}

static int exec_SLICE_COLS(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  int64_t W = INCOLS(id, 0), start = ir_get_int(N(id), "start", 0), w = COLS(id);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  for (int64_t r = 0; r < a->rows; r++) memcpy(x->val[id].f + r * w, a->f + r * W + start, (size_t)w * sizeof(float));
  return 0;
}

static int exec_SILU_BWD(ex *x, int id) {
  const rt_value *dy = IN(id, 0);
  if (alloc_out(x, id, dy->rows, 0)) return -1;
  ck_silu_bwd(IN(id, 1)->f, dy->f, x->val[id].f, dy->numel);
  return 0;
}

static int exec_ROUTE_WEIGHTS_BWD(ex *x, int id) {
  const rt_value *l = IN(id, 1);
  if (alloc_out(x, id, l->rows, 0)) return -1;
  return check_ck(x, id, ck_route_weights_bwd(l->f, IN(id, 2)->i, IN(id, 0)->f, x->val[id].f, l->rows, COLS(id),
                                              INCOLS(id, 2)));
}

static int exec_AUX_LOSS_BWD(ex *x, int id) {
  const rt_value *l = IN(id, 1);
  if (alloc_out(x, id, l->rows, 1)) return -1;
  if (N(id)->n_in == 4)
    return check_ck(x, id, ck_aux_loss_share_bwd(l->f, IN(id, 3)->i, IN(id, 0)->f[0], x->val[id].f, l->rows, COLS(id),
                                                 INCOLS(id, 2), (float)ir_get_float(N(id), "coef", 0)));
  return check_ck(x, id, ck_aux_loss_bwd(l->f, IN(id, 2)->i, IN(id, 0)->f[0], x->val[id].f, l->rows, COLS(id),
                                         INCOLS(id, 2), (float)ir_get_float(N(id), "coef", 0)));
}

static int exec_Z_LOSS_BWD(ex *x, int id) {
  const rt_value *l = IN(id, 1);
  if (alloc_out(x, id, l->rows, 1)) return -1;
  ck_z_loss_bwd(l->f, IN(id, 0)->f[0], x->val[id].f, l->rows, COLS(id), z_coef(x, id, l->rows));
  return 0;
}

static int exec_DISPATCH_BWD(ex *x, int id) {
  const rt_value *dxe = IN(id, 0), *idx = IN(id, 1);
  int32_t *rows, *slots;
  int64_t n = 0;
  if (route_rows(x, id, idx, idx->rows, INCOLS(id, 1), (int)ir_get_int(N(id), "expert", 0), &rows, &slots, &n))
    return -1;
  int rc = n != dxe->rows ? fail(x, id, "expert gradient has %lld rows, routing gives %lld", (long long)dxe->rows, (long long)n)
                          : alloc_out(x, id, idx->rows, 1);
  if (rc == 0) rc = check_ck(x, id, ck_dispatch_bwd(dxe->f, rows, x->val[id].f, idx->rows, n, COLS(id)));
  free(rows);
  free(slots);
  return rc;
}

static int exec_COMBINE_BWD_Y(ex *x, int id) {
  /* dy_e[r] = w[t, j] * dout[t] for the (t, j) pairs routed to expert e */
  const rt_value *dout = IN(id, 0), *idx = IN(id, 1), *w = IN(id, 2);
  int64_t k = INCOLS(id, 1), H = COLS(id);
  int32_t *rows, *slots;
  int64_t n;
  if (route_rows(x, id, idx, idx->rows, k, (int)ir_get_int(N(id), "expert", 0), &rows, &slots, &n)) return -1;
  int rc = alloc_out(x, id, n, 0);
  for (int64_t r = 0; rc == 0 && r < n; r++) {
    float s = w->f[(int64_t)rows[r] * k + slots[r]];
    const float *src = dout->f + (int64_t)rows[r] * H;
    float *dst = x->val[id].f + r * H;
    for (int64_t c = 0; c < H; c++) dst[c] = s * src[c];
  }
  free(rows);
  free(slots);
  return rc;
}

static int exec_COMBINE_BWD_W(ex *x, int id) {
  const rt_value *dout = IN(id, 0), *idx = IN(id, 1);
  int64_t E = N(id)->n_in - 2, T = idx->rows, k = INCOLS(id, 1), H = INCOLS(id, 0);
  const float **y = expert_ptrs(x, id, 2, E);
  float **dy = calloc((size_t)E, sizeof *dy);
  float *w_ones = malloc((size_t)(T * k) * sizeof(float));
  int rc = (!y || !dy || !w_ones) ? fail(x, id, "out of host memory") : alloc_out(x, id, T, 0);
  for (int64_t e = 0; rc == 0 && e < E; e++)
    if (!(dy[e] = malloc((size_t)(IN(id, 2 + (int)e)->numel + 1) * sizeof(float)))) rc = fail(x, id, "out of host memory");
  if (rc == 0) {
    /* the weights do not enter dw; the kernel also writes the expert gradients, unused here */
    for (int64_t i = 0; i < T * k; i++) w_ones[i] = 1.0f;
    rc = check_ck(x, id, ck_combine_bwd(idx->i, w_ones, y, dout->f, dy, x->val[id].f, T, k, E, H));
  }
  for (int64_t e = 0; dy && e < E; e++) free(dy[e]);
  free(dy);
  free(y);
  free(w_ones);
  return rc;
}

static int exec_CROSS_ENTROPY_BWD(ex *x, int id) {
  const rt_value *l = IN(id, 1);
  if (alloc_out(x, id, l->rows, 0)) return -1;
  if (N(id)->n_in == 4)
    return check_ck(x, id, ck_cross_entropy_share_bwd(l->f, IN(id, 2)->i, IN(id, 3)->f[0], IN(id, 0)->f[0], x->val[id].f,
                                                      l->rows, COLS(id)));
  return check_ck(x, id, ck_cross_entropy_bwd(l->f, IN(id, 2)->i, IN(id, 0)->f[0], x->val[id].f, l->rows, COLS(id)));
}

static int exec_PAD_COLS(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  int64_t w = INCOLS(id, 0), start = ir_get_int(N(id), "start", 0), W = COLS(id);
  if (alloc_out(x, id, a->rows, 1)) return -1;
  for (int64_t r = 0; r < a->rows; r++) memcpy(x->val[id].f + r * W + start, a->f + r * w, (size_t)w * sizeof(float));
  return 0;
}

static int exec_UNSTACK(ex *x, int id) {
  int64_t in = DIM(id, 0, 1), C = DIM(id, 0, 2), e = ir_get_int(N(id), "expert", 0), start = ir_get_int(N(id), "start", 0);
  int64_t w = COLS(id);
  if (alloc_out(x, id, in, 0)) return -1;
  for (int64_t r = 0; r < in; r++)
    memcpy(x->val[id].f + r * w, IN(id, 0)->f + (e * in + r) * C + start, (size_t)w * sizeof(float));
  return 0;
}

static int exec_GROUPED_LINEAR_DGRAD(ex *x, int id) {
  const rt_value *dy = IN(id, 0);
  int64_t E = DIM(id, 1, 0), in = DIM(id, 1, 1), out = DIM(id, 1, 2);
  if (alloc_out(x, id, dy->rows, 0)) return -1;
  return check_ck(x, id, ck_grouped_linear_dgrad(dy->f, IN(id, 1)->f, IN(id, 2)->i, x->val[id].f, dy->rows, E, in, out));
}

static int exec_GROUPED_LINEAR_WGRAD(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  const ir_type *t = &N(id)->type;
  if (alloc_out(x, id, t->dims[0], 0)) return -1;
  return check_ck(x, id, ck_grouped_linear_wgrad(a->f, IN(id, 1)->f, IN(id, 2)->i, x->val[id].f, a->rows, t->dims[0],
                                                 t->dims[1], t->dims[2]));
}

static int exec_GROUPED_COLSUM(ex *x, int id) {
  const rt_value *dy = IN(id, 0);
  int64_t E = N(id)->type.dims[0];
  if (alloc_out(x, id, E, 0)) return -1;
  return check_ck(x, id, ck_grouped_colsum(dy->f, IN(id, 1)->i, x->val[id].f, dy->rows, E, COLS(id)));
}

static int exec_GROUPED_MLP_BWD(ex *x, int id) {
  const rt_value *dy = IN(id, 0);
  int64_t E = DIM(id, 2, 0), H = INCOLS(id, 0), F = ir_get_int(N(id), "ffn", 0);
  if (alloc_out(x, id, dy->rows, 0)) return -1;
  return check_ck(x, id, ck_grouped_mlp_bwd(dy->f, IN(id, 1)->f, IN(id, 2)->f, IN(id, 3)->i, IN(id, 4)->f, x->val[id].f,
                                            dy->rows, E, H, F, COLS(id)));
}

static int exec_EXPERT_WEIGHT_GRAD(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  return check_ck(x, id, ck_expert_weight_grad(a->f, IN(id, 1)->f, IN(id, 2)->i, x->val[id].f, a->rows, COLS(id),
                                               INCOLS(id, 0)));
}

static int exec_EXPERT_PROBS_BWD(ex *x, int id) {
  int64_t k = COLS(id), T = IN(id, 0)->rows / k;
  if (alloc_out(x, id, T, 0)) return -1;
  return check_ck(x, id, ck_expert_probs_bwd(IN(id, 0)->f, IN(id, 1)->i, x->val[id].f, T, k));
}

/* The CPU keeps an MX tensor as the exact values its E4M3 elements and E8M0 scales encode. */
static int exec_MXFP8_QUANTIZE(ex *x, int id) {
  const rt_value *a = IN(id, 0);
  const ir_type *t = &N(id)->type;
  int64_t dims[IR_MAX_RANK];
  for (int d = 0; d < t->rank; d++) dims[d] = t->dims[d];
  dims[0] = a->rows;
  if (alloc_out(x, id, a->rows, 0)) return -1;
  const int64_t tile = ir_get_int(N(id), "tile", 0);
  if (tile) /* an expert weight (E, in, out) in tile x tile squares: any axis gives these values */
    return check_ck(x, id, ck_mxfp8_qdq_tiles(a->f, x->val[id].f, dims[0], dims[1], dims[2], tile));
  const int32_t *counts = N(id)->n_in == 2 ? IN(id, 1)->i : NULL;
  int64_t E = N(id)->n_in == 2 ? DIM(id, 1, 0) : 0;
  return check_ck(x, id, ck_mxfp8_qdq(a->f, x->val[id].f, t->rank, dims, (int)ir_get_int(N(id), "axis", 0),
                                      ir_get_int(N(id), "block", 32), (int)ir_get_int(N(id), "share128", 0), counts, E));
}

static int exec_MXFP8_DEQUANTIZE(ex *x, int id) { return exec_CAST(x, id); }

/* ZeRO: this rank's shards hold d^2 of the squares; every rank's, summed in world rank order
 * (in double, as ck_grad_norm sums), is the whole gradient's. */
static int grad_norm_shards(ex *x, int id, double d) {
  if (!x->comm) return fail(x, id, "sharded gradients, but this executor has no communicator");
  double s = 0;
  char m[512];
  if (comm_sum_f64(comm_get(x->comm, x->rank, COMM_WORLD), d * d, &s, m, sizeof m)) return fail(x, id, "%s", m);
  x->grad_norm = sqrt(s);
  return 0;
}

static int exec_GRAD_NORM(ex *x, int id) {
  int n = N(id)->n_in;
  const float **bufs = malloc((size_t)n * sizeof *bufs);
  int64_t *sizes = malloc((size_t)n * sizeof *sizes);
  int rc = (!bufs || !sizes) ? fail(x, id, "out of host memory") : alloc_out(x, id, 1, 0);
  if (rc == 0) {
    for (int i = 0; i < n; i++) {
      bufs[i] = IN(id, i)->f;
      sizes[i] = IN(id, i)->numel;
    }
    /* with sharded experts (operands from expert_from on): sqrt(dense^2 + sum over EP of expert^2) */
    int k = (int)ir_get_int(N(id), "expert_from", n);
    double d = ck_grad_norm(bufs, sizes, k);
    x->grad_norm = d;
    if (ir_get_int(N(id), "sharded", 0)) rc = grad_norm_shards(x, id, d);
    else if (k < n) {
      float e2 = (float)pow(ck_grad_norm(bufs + k, sizes + k, n - k), 2);
      char m[512];
      if (!x->comm) rc = fail(x, id, "sharded experts, but this executor has no communicator");
      else if (comm_all_reduce_sum(comm_get(x->comm, x->rank, COMM_EP), &e2, 1, COMM_F32, m, sizeof m)) rc = fail(x, id, "%s", m);
      x->grad_norm = sqrt(d * d + (double)e2);
    }
    x->val[id].f[0] = (float)x->grad_norm;
  }
  free(bufs);
  free(sizes);
  return rc;
}

static int exec_ADAMW(ex *x, int id) {
  const moec_config *c = &x->g->cfg;
  rt_param *p = x->param_of[N(id)->in[0]];
  double lr = ck_lr_at(x->step, c->steps, c->warmup, c->lr, c->min_lr, c->schedule);
  float scale = c->clip > 0 ? ck_clip_coef(x->grad_norm, c->clip) : 1.0f;
  /* with zero: operand 1 is this rank's shard of the gradient, and p holds that shard's moments */
  const int sharded = ir_get_str(N(id), "zero", NULL) != NULL;
  if (sharded != (p->zero_group >= 0))
    return fail(x, id, "%s: the graph %s the update, but the moments are %s (zero_shard)", p->name,
                sharded ? "shards" : "does not shard", p->zero_group >= 0 ? "sharded" : "whole");
  ck_adamw_step(p->w + p->mlo, IN(id, 1)->f, p->m, p->v, p->mn, x->step, scale, lr, c->beta1, c->beta2, c->adam_eps,
                ir_get_float(N(id), "weight_decay", 0));
  if (c->moments_bf16) { /* stored in bf16 after the update, which used them unrounded (the GPU's order) */
    ck_round_bf16(p->m, p->mn);
    ck_round_bf16(p->v, p->mn);
  }
  x->val[id] = (rt_value){p->w, NULL, p->type.dims[0], p->numel, 0};
  return 0;
}

typedef int (*exec_fn)(ex *, int);
static const exec_fn exec_table[] = {
#define OP(id, name, min_in, max_in, cg) [OP_##id] = exec_##id,
#include "ops.def"
#undef OP
};
static_assert(sizeof exec_table / sizeof exec_table[0] == OP_COUNT, "one CPU exec function per op");

cpu_exec *cpu_exec_new(const ir_graph *g, rt_params *ps, char *err, size_t errlen) {
  ex *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  x->g = g;
  x->ps = ps;
  size_t n = (size_t)g->n_nodes + 1;
  x->param_of = calloc(n, sizeof *x->param_of);
  x->last_use = malloc(n * sizeof *x->last_use);
  x->val = calloc(n, sizeof *x->val);
  if (!x->param_of || !x->last_use || !x->val) {
    cpu_exec_free(x);
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  for (int id = 0; id < g->n_nodes; id++) {
    x->last_use[id] = id;
    const ir_node *nd = &g->nodes[id];
    for (int j = 0; j < nd->n_in; j++) x->last_use[nd->in[j]] = id;
    if (nd->op == OP_PARAM) {
      const char *name = ir_get_str(nd, "name", "");
      x->param_of[id] = rt_params_find(ps, name);
      if (!x->param_of[id] || x->param_of[id]->numel != ir_type_numel_bound(g, &nd->type)) {
        snprintf(err, errlen, "parameter '%s' is missing or has another shape in the parameter store", name);
        cpu_exec_free(x);
        return NULL;
      }
    }
  }
  for (int i = 0; i < g->n_outputs; i++) x->last_use[g->outputs[i]] = g->n_nodes;
  return x;
}

static void release(rt_value *v) {
  if (v->owned) {
    free(v->f);
    free(v->i);
  }
  memset(v, 0, sizeof *v);
}

void cpu_exec_free(cpu_exec *x) {
  if (!x) return;
  if (x->val)
    for (int i = 0; i < x->g->n_nodes; i++) release(&x->val[i]);
  free(x->param_of);
  free(x->last_use);
  free(x->val);
  free(x);
}

void cpu_exec_set_comm(cpu_exec *x, comm_world *w, int rank) {
  x->comm = w;
  x->rank = rank;
}

void cpu_exec_keep_all(cpu_exec *x, int keep_all) { x->keep_all = keep_all; }

const float *cpu_exec_value(const cpu_exec *x, int id, int64_t *numel) {
  if (id < 0 || id >= x->g->n_nodes) return NULL;
  if (numel) *numel = x->val[id].numel;
  return x->val[id].f;
}

int cpu_exec_run(cpu_exec *x, const int32_t *tokens, const int32_t *labels, int64_t step, float *outputs,
                 double *grad_norm, char *err, size_t errlen) {
  const ir_graph *g = x->g;
  x->tokens = tokens;
  x->labels = labels;
  x->step = step;
  x->err = err;
  x->errlen = errlen;
  x->grad_norm = 0;
  for (int i = 0; i < g->n_nodes; i++) release(&x->val[i]);
  int rc = 0;
  for (int id = 0; id < g->n_nodes && rc == 0; id++) {
    rc = exec_table[g->nodes[id].op](x, id);
    if (rc == 0 && g->nodes[id].type.dtype == DT_BF16 && x->val[id].owned)
      ck_round_bf16(x->val[id].f, x->val[id].numel);
    if (!x->keep_all)
      for (int j = 0; j < g->nodes[id].n_in; j++) {
        int v = g->nodes[id].in[j];
        if (x->last_use[v] == id) release(&x->val[v]);
      }
  }
  for (int i = 0; rc == 0 && i < g->n_outputs; i++) outputs[i] = x->val[g->outputs[i]].f[0];
  if (grad_norm) *grad_norm = x->grad_norm;
  if (!x->keep_all)
    for (int i = 0; i < g->n_nodes; i++) release(&x->val[i]);
  return rc;
}
