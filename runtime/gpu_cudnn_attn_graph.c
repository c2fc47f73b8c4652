/* gpu_cudnn_attn_graph.c -- the forward and backward attention graphs as plain data (ca_graph:
 * tensors and operations), built with no library at all: the same sequence of operations
 * cudnn-frontend's CompositeSDPANode and CompositeSDPABackwardNode emit for bf16 causal GQA
 * training without dropout or bias; and each buffer's 4-d view (gpu_cudnn_attn_views). */
#include "gpu_cudnn_attn_int.h"

#include <string.h>

static int add_tensor(ca_graph *g, const char *name, int64_t uid, int dtype, int is_virtual, int by_value, int bind,
                      const int64_t dim[4], const int64_t stride[4]) {
  if (g->nt >= MAX_TENSORS) {
    g->overflow = 1;
    return 0;
  }
  ca_tensor *t = &g->t[g->nt];
  t->name = name;
  t->uid = uid;
  memcpy(t->dim, dim, sizeof t->dim);
  memcpy(t->stride, stride, sizeof t->stride);
  t->dtype = dtype;
  t->is_virtual = is_virtual;
  t->by_value = by_value;
  t->bind = bind;
  return g->nt++;
}

static int virt(ca_graph *g, const char *name, int dtype, const int64_t dim[4], const int64_t stride[4]) {
  return add_tensor(g, name, 100 + g->nt, dtype, 1, 0, BIND_NONE, dim, stride);
}

/* A by-value f32 scalar: dims and strides [1, 1, 1, 1], as the frontend expands them. */
static int scalar(ca_graph *g, const char *name, int64_t uid, int bind) {
  static const int64_t one[4] = {1, 1, 1, 1};
  return add_tensor(g, name, uid, CD_DATA_FLOAT, 0, 1, bind, one, one);
}

static int view_tensor(ca_graph *g, const char *name, int64_t uid, int dtype, int bind, const gpu_cudnn_view *v,
                       int transpose23) {
  int64_t dim[4], stride[4];
  memcpy(dim, v->dim, sizeof dim);
  memcpy(stride, v->stride, sizeof stride);
  if (transpose23) {
    int64_t t = dim[2];
    dim[2] = dim[3], dim[3] = t;
    t = stride[2];
    stride[2] = stride[3], stride[3] = t;
  }
  return add_tensor(g, name, uid, dtype, 0, 0, bind, dim, stride);
}

static void add_op(ca_graph *g, int kind, const char *name, int mode, int comp, int64_t axis, int x, int b, int t,
                   int y) {
  if (g->nop >= MAX_OPS) {
    g->overflow = 1;
    return;
  }
  ca_op o = {kind, name, mode, comp, axis, x, b, t, y};
  g->op[g->nop++] = o;
}

static void pw(ca_graph *g, const char *name, int mode, int x, int b, int y) {
  add_op(g, OP_POINTWISE, name, mode, CD_DATA_FLOAT, -1, x, b, -1, y);
}
static void mm(ca_graph *g, const char *name, int a, int b, int c) {
  add_op(g, OP_MATMUL, name, 0, CD_DATA_FLOAT, -1, a, b, -1, c);
}
static void red(ca_graph *g, const char *name, int op, int x, int y) {
  add_op(g, OP_REDUCTION, name, op, CD_DATA_FLOAT, -1, x, -1, -1, y);
}

/* out (a K or V gradient) = a b; with grouped KV heads (gqa) the product is taken per query
 * head into a virtual tensor (dims fd, strides fs) and summed over each group into out. */
static void kv_grad(ca_graph *g, int gqa, const char *mm_name, int a, int b, const char *per_head, const int64_t fd[4],
                    const int64_t fs[4], const char *red_name, int out) {
  if (!gqa) {
    mm(g, mm_name, a, b, out);
    return;
  }
  const int f = virt(g, per_head, CD_DATA_BFLOAT16, fd, fs);
  mm(g, mm_name, a, b, f);
  red(g, red_name, CD_REDUCE_TENSOR_ADD, f, out);
}
static void reshape(ca_graph *g, const char *name, int x, int y) {
  add_op(g, OP_RESHAPE, name, 0, CD_DATA_FLOAT, -1, x, -1, -1, y);
}

void gpu_cudnn_attn_views(const gpu_cudnn_shape *s, gpu_cudnn_view v[GPU_CUDNN_NVIEWS]) {
  const int64_t B = s->B, S = s->seq, nh = s->nh, nkv = s->nkv, d = s->hd, W = (nh + 2 * nkv) * d;
  const gpu_cudnn_view q = {{B, nh, S, d}, {S * nh * d, d, nh * d, 1}, 0};
  const gpu_cudnn_view kv = {{B, nkv, S, d}, {S * nkv * d, d, nkv * d, 1}, 0};
  const gpu_cudnn_view st = {{B, nh, S, 1}, {nh * S, S, 1, 1}, 0};
  const gpu_cudnn_view dq = {{B, nh, S, d}, {S * W, d, W, 1}, 0};
  const gpu_cudnn_view dk = {{B, nkv, S, d}, {S * W, d, W, 1}, nh * d};
  const gpu_cudnn_view dv = {{B, nkv, S, d}, {S * W, d, W, 1}, (nh + nkv) * d};
  v[GPU_CUDNN_Q] = q;
  v[GPU_CUDNN_K] = kv;
  v[GPU_CUDNN_V] = kv;
  v[GPU_CUDNN_O] = q;
  v[GPU_CUDNN_DO] = q;
  v[GPU_CUDNN_STATS] = st;
  v[GPU_CUDNN_DQ] = dq;
  v[GPU_CUDNN_DK] = dk;
  v[GPU_CUDNN_DV] = dv;
}

/* The causal mask on scores x: keep (row >= col), else -inf (cudnn-frontend's diagonal band
 * mask with right bound 0, top-left aligned). Returns the masked scores. */
static int causal_mask(ca_graph *g, int x, int neg_inf) {
  const ca_tensor *s = &g->t[x];
  int64_t dim[4], stride[4];
  memcpy(dim, s->dim, sizeof dim);
  memcpy(stride, s->stride, sizeof stride);
  const int row = virt(g, "row_index", CD_DATA_INT32, dim, stride);
  add_op(g, OP_POINTWISE, "gen_row_index", CD_POINTWISE_GEN_INDEX, CD_DATA_FLOAT, 2, x, -1, -1, row);
  const int col = virt(g, "col_index", CD_DATA_INT32, dim, stride);
  add_op(g, OP_POINTWISE, "gen_col_index", CD_POINTWISE_GEN_INDEX, CD_DATA_FLOAT, 3, x, -1, -1, col);
  const int keep = virt(g, "row>=col", CD_DATA_BOOLEAN, dim, stride);
  add_op(g, OP_POINTWISE, "row>=col", CD_POINTWISE_CMP_GE, CD_DATA_BOOLEAN, -1, row, col, -1, keep);
  const int y = virt(g, "masked_scores", CD_DATA_FLOAT, dim, stride);
  add_op(g, OP_POINTWISE, "binary_select", CD_POINTWISE_BINARY_SELECT, CD_DATA_FLOAT, -1, x, neg_inf, keep, y);
  return y;
}

/* UIDs of the bound tensors; virtual ones count from 100. */
enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV, UID_SCALE, UID_NEG_INF, UID_ONE,
       UID_SOFTMAX_SUM, UID_DQ_ACCUM };

/* Forward, training (stats written):
 *   S = Q K^T (f32) ; S1 = S * scale ; [causal mask] ; M = rowmax ; E = exp(S - M) ; Z = rowsum E
 *   Stats = M + log Z ; P = E / Z (bf16) ; O = P V */
static void build_fwd(ca_graph *g, const gpu_cudnn_shape *s) {
  gpu_cudnn_view v[GPU_CUDNN_NVIEWS];
  gpu_cudnn_attn_views(s, v);
  const int64_t b = s->B, h = s->nh, sq = s->seq, skv = s->seq;
  const int64_t sd[4] = {b, h, sq, skv}, ss[4] = {h * sq * skv, sq * skv, skv, 1};
  const int64_t rd[4] = {b, h, sq, 1}, rs[4] = {h * sq, sq, 1, 1};
  const int Q = view_tensor(g, "Q", UID_Q, CD_DATA_BFLOAT16, BIND_Q, &v[GPU_CUDNN_Q], 0);
  const int KT = view_tensor(g, "K^T", UID_K, CD_DATA_BFLOAT16, BIND_K, &v[GPU_CUDNN_K], 1);
  const int V = view_tensor(g, "V", UID_V, CD_DATA_BFLOAT16, BIND_V, &v[GPU_CUDNN_V], 0);
  const int scale = scalar(g, "attn_scale", UID_SCALE, BIND_SCALE);
  const int S = virt(g, "S", CD_DATA_FLOAT, sd, ss);
  mm(g, "bmm1 Q.K^T", Q, KT, S);
  int last = virt(g, "S*scale", CD_DATA_FLOAT, sd, ss);
  pw(g, "attn_scale", CD_POINTWISE_MUL, S, scale, last);
  if (s->causal) last = causal_mask(g, last, scalar(g, "neg_inf", UID_NEG_INF, BIND_NEG_INF));
  const int M = virt(g, "rowmax", CD_DATA_FLOAT, rd, rs);
  red(g, "max", CD_REDUCE_TENSOR_MAX, last, M);
  const int sub = virt(g, "S-M", CD_DATA_FLOAT, sd, ss);
  pw(g, "sub", CD_POINTWISE_SUB, last, M, sub);
  const int E = virt(g, "exp(S-M)", CD_DATA_FLOAT, sd, ss);
  pw(g, "exp", CD_POINTWISE_EXP, sub, -1, E);
  const int Z = virt(g, "rowsum", CD_DATA_FLOAT, rd, rs);
  red(g, "sum", CD_REDUCE_TENSOR_ADD, E, Z);
  const int L = virt(g, "log(rowsum)", CD_DATA_FLOAT, rd, rs);
  pw(g, "log", CD_POINTWISE_LOG, Z, -1, L);
  const int stats = view_tensor(g, "Stats", UID_STATS, CD_DATA_FLOAT, BIND_STATS, &v[GPU_CUDNN_STATS], 0);
  pw(g, "add (stats)", CD_POINTWISE_ADD, M, L, stats);
  const int P = virt(g, "P", CD_DATA_BFLOAT16, sd, ss);
  pw(g, "div", CD_POINTWISE_DIV, E, Z, P);
  const int O = view_tensor(g, "O", UID_O, CD_DATA_BFLOAT16, BIND_O, &v[GPU_CUDNN_O], 0);
  mm(g, "bmm2 P.V", P, V, O);
}

/* Backward (no dropout), as CompositeSDPABackwardNode:
 *   softmax_sum = rowsum(dO * O) * 1 (f32, in memory)
 *   P = exp(Q K^T * scale - Stats) [causal mask before exp] ; dV = P^T dO (summed over a KV group)
 *   dS = (dO V^T - softmax_sum) * P * scale ; dK = dS^T Q (summed over a group)
 *   dQ_accum = dS K (f32, in memory) ; dQ = identity(dQ_accum) */
static void build_bwd(ca_graph *g, const gpu_cudnn_shape *s) {
  gpu_cudnn_view v[GPU_CUDNN_NVIEWS];
  gpu_cudnn_attn_views(s, v);
  const int64_t b = s->B, h = s->nh, hk = s->nkv, sq = s->seq, skv = s->seq, d = s->hd;
  const int gqa = h != hk;
  const int64_t sd[4] = {b, h, sq, skv}, ss[4] = {h * sq * skv, sq * skv, skv, 1};
  const int64_t td[4] = {b, h, skv, sq}, ts[4] = {h * sq * skv, sq * skv, 1, skv}; /* the same memory, transposed */
  const int64_t rd[4] = {b, h, sq, 1}, rs[4] = {h * sq, sq, 1, 1};
  const int Q = view_tensor(g, "Q", UID_Q, CD_DATA_BFLOAT16, BIND_Q, &v[GPU_CUDNN_Q], 0);
  const int KT = view_tensor(g, "K^T", UID_K, CD_DATA_BFLOAT16, BIND_K, &v[GPU_CUDNN_K], 1);
  const int VT = view_tensor(g, "V^T", UID_V, CD_DATA_BFLOAT16, BIND_V, &v[GPU_CUDNN_V], 1);
  const int O = view_tensor(g, "O", UID_O, CD_DATA_BFLOAT16, BIND_O, &v[GPU_CUDNN_O], 0);
  const int dO = view_tensor(g, "dO", UID_DO, CD_DATA_BFLOAT16, BIND_DO, &v[GPU_CUDNN_DO], 0);
  const int stats = view_tensor(g, "Stats", UID_STATS, CD_DATA_FLOAT, BIND_STATS, &v[GPU_CUDNN_STATS], 0);
  const int scale = scalar(g, "attn_scale", UID_SCALE, BIND_SCALE);
  const int one = scalar(g, "one", UID_ONE, BIND_ONE);

  /* dO * O -> rowsum -> softmax_sum; the frontend's strides for the virtual product */
  const int64_t pd[4] = {b, h, sq, d}, ps[4] = {h * sq * d, sq * d, h * d, 1};
  const int dOO = virt(g, "dO*O", CD_DATA_FLOAT, pd, ps);
  pw(g, "mul_dO_O", CD_POINTWISE_MUL, dO, O, dOO);
  const int rsum = virt(g, "rowsum(dO*O)", CD_DATA_FLOAT, rd, rs);
  red(g, "reduce_dO_O", CD_REDUCE_TENSOR_ADD, dOO, rsum);
  const int ssum = add_tensor(g, "softmax_sum", UID_SOFTMAX_SUM, CD_DATA_FLOAT, 0, 0, BIND_SOFTMAX_SUM, rd, rs);
  pw(g, "scale_dropout_inv", CD_POINTWISE_MUL, rsum, one, ssum);

  /* P = exp(S * scale - Stats), masked */
  const int S = virt(g, "S", CD_DATA_FLOAT, sd, ss);
  mm(g, "matmul_Q_KT", Q, KT, S);
  const int S1 = virt(g, "S*scale", CD_DATA_FLOAT, sd, ss);
  pw(g, "mul_s_attn_scale", CD_POINTWISE_MUL, S, scale, S1);
  int last = virt(g, "S-stats", CD_DATA_FLOAT, sd, ss);
  pw(g, "sub_s_m", CD_POINTWISE_SUB, S1, stats, last);
  if (s->causal) last = causal_mask(g, last, scalar(g, "neg_inf", UID_NEG_INF, BIND_NEG_INF));
  const int P = virt(g, "P", CD_DATA_FLOAT, sd, ss);
  pw(g, "exp_s", CD_POINTWISE_EXP, last, -1, P);

  /* dV = P^T dO */
  const int Pt = virt(g, "P^T", CD_DATA_BFLOAT16, td, ts);
  reshape(g, "reshape_p", P, Pt);
  const int dV = view_tensor(g, "dV", UID_DV, CD_DATA_BFLOAT16, BIND_DV, &v[GPU_CUDNN_DV], 0);
  const int64_t fd[4] = {b, h, skv, d}, fs[4] = {h * skv * d, skv * d, d, 1}; /* per query head, before the group sum */
  kv_grad(g, gqa, "matmul_pT_dO", Pt, dO, "dV per query head", fd, fs, "red_dV_head", dV);

  /* dS = (dO V^T - softmax_sum) * P * scale */
  const int dP = virt(g, "dP", CD_DATA_FLOAT, sd, ss);
  mm(g, "matmul_dO_VT", dO, VT, dP);
  const int d1 = virt(g, "dP-softmax_sum", CD_DATA_FLOAT, sd, ss);
  pw(g, "sub_dP_softmax_sum", CD_POINTWISE_SUB, dP, ssum, d1);
  const int d2 = virt(g, "(dP-softmax_sum)*P", CD_DATA_FLOAT, sd, ss);
  pw(g, "mul_dP_exp_s", CD_POINTWISE_MUL, d1, P, d2);
  const int dS = virt(g, "dS", CD_DATA_FLOAT, sd, ss);
  pw(g, "mul_dS_attn_scale", CD_POINTWISE_MUL, d2, scale, dS);

  /* dK = dS^T Q */
  const int dSt = virt(g, "dS^T", CD_DATA_BFLOAT16, td, ts);
  reshape(g, "reshape_dS", dS, dSt);
  const int dK = view_tensor(g, "dK", UID_DK, CD_DATA_BFLOAT16, BIND_DK, &v[GPU_CUDNN_DK], 0);
  kv_grad(g, gqa, "matmul_dST_Q", dSt, Q, "dK per query head", fd, fs, "red_dK_head", dK);

  /* dQ = dS K, through an f32 accumulator in memory. The frontend leaves the reshaped K's
   * type unset, so it takes the intermediate type (f32); so do we. */
  const int K = virt(g, "K", CD_DATA_FLOAT, v[GPU_CUDNN_K].dim, v[GPU_CUDNN_K].stride);
  reshape(g, "reshape_k", KT, K);
  const int64_t ad[4] = {b, h, sq, d}, as[4] = {h * sq * d, sq * d, d, 1};
  const int acc = add_tensor(g, "dQ_accum", UID_DQ_ACCUM, CD_DATA_FLOAT, 0, 0, BIND_DQ_ACCUM, ad, as);
  mm(g, "matmul_dS_K", dS, K, acc);
  const int dQ = view_tensor(g, "dQ", UID_DQ, CD_DATA_BFLOAT16, BIND_DQ, &v[GPU_CUDNN_DQ], 0);
  pw(g, "identity_dQ", CD_POINTWISE_IDENTITY, acc, -1, dQ);
}

void cda_build_graph(ca_graph *g, int bwd, const gpu_cudnn_shape *s) {
  memset(g, 0, sizeof *g);
  if (bwd) build_bwd(g, s);
  else build_fwd(g, s);
}
