/* gpu_cudnn_attn_check.c -- a ca_graph as text (what MOEC_CUDNN_DEBUG=1 prints) and its
 * consistency check before anything reaches cuDNN; the shapes the calls accept. */
#include "gpu_cudnn_attn_int.h"

#include <stdio.h>

const char *const cda_bind_names[BIND_COUNT] = {"-",     "q",      "k",     "v",           "out",
                                            "dout",  "stats",  "dq",    "dk",          "dv",
                                            "scale", "-inf",   "one",   "softmax_sum", "dq_accum"};

static const char *dtype_name(int t) {
  switch (t) {
  case CD_DATA_FLOAT: return "f32";
  case CD_DATA_INT32: return "i32";
  case CD_DATA_BFLOAT16: return "bf16";
  case CD_DATA_BOOLEAN: return "bool";
  }
  return "?";
}

const char *cda_op_mode_name(const ca_op *o) {
  if (o->kind == OP_MATMUL) return "matmul";
  if (o->kind == OP_RESHAPE) return "reshape";
  if (o->kind == OP_REDUCTION) return o->mode == CD_REDUCE_TENSOR_MAX ? "reduce MAX" : "reduce ADD";
  switch (o->mode) {
  case CD_POINTWISE_ADD: return "pointwise ADD";
  case CD_POINTWISE_MUL: return "pointwise MUL";
  case CD_POINTWISE_DIV: return "pointwise DIV";
  case CD_POINTWISE_SUB: return "pointwise SUB";
  case CD_POINTWISE_EXP: return "pointwise EXP";
  case CD_POINTWISE_LOG: return "pointwise LOG";
  case CD_POINTWISE_IDENTITY: return "pointwise IDENTITY";
  case CD_POINTWISE_CMP_GE: return "pointwise CMP_GE";
  case CD_POINTWISE_GEN_INDEX: return "pointwise GEN_INDEX";
  case CD_POINTWISE_BINARY_SELECT: return "pointwise BINARY_SELECT";
  }
  return "pointwise ?";
}

int cda_tensor_line(const ca_tensor *t, char *buf, size_t len) {
  return snprintf(buf, len, "tensor %-20s uid %3lld %-4s dims [%lld %lld %lld %lld] strides [%lld %lld %lld %lld]%s%s%s%s",
                  t->name, (long long)t->uid, dtype_name(t->dtype), (long long)t->dim[0], (long long)t->dim[1],
                  (long long)t->dim[2], (long long)t->dim[3], (long long)t->stride[0], (long long)t->stride[1],
                  (long long)t->stride[2], (long long)t->stride[3], t->is_virtual ? " virtual" : "",
                  t->by_value ? " by-value" : "", t->bind ? " <- " : "", t->bind ? cda_bind_names[t->bind] : "");
}

int cda_op_line(const ca_graph *g, int i, char *buf, size_t len) {
  const ca_op *o = &g->op[i];
  char axis[32] = "";
  if (o->axis >= 0) snprintf(axis, sizeof axis, " axis %lld", (long long)o->axis);
  return snprintf(buf, len, "op %2d %-24s %-22s%s x=%s%s%s%s%s -> %s (compute %s)", i, o->name, cda_op_mode_name(o), axis,
                  g->t[o->x].name, o->b >= 0 ? " b=" : "", o->b >= 0 ? g->t[o->b].name : "", o->t >= 0 ? " t=" : "",
                  o->t >= 0 ? g->t[o->t].name : "", g->t[o->y].name, dtype_name(o->comp));
}

/* a broadcasts to y: every dim equal or 1 */
static int broadcasts(const ca_tensor *a, const ca_tensor *y) {
  for (int i = 0; i < 4; i++)
    if (a->dim[i] != y->dim[i] && a->dim[i] != 1) return 0;
  return 1;
}

int cda_check_graph(const ca_graph *g, const gpu_cudnn_shape *s, char *err, size_t errlen) {
  if (g->overflow) return snprintf(err, errlen, "graph: too many tensors or operations"), -1;
  int produced[MAX_TENSORS] = {0}, used[MAX_TENSORS] = {0}, bound[BIND_COUNT] = {0};
  for (int i = 0; i < g->nt; i++) {
    const ca_tensor *t = &g->t[i];
    for (int j = 0; j < i; j++)
      if (g->t[j].uid == t->uid)
        return snprintf(err, errlen, "graph: tensors %s and %s share uid %lld", g->t[j].name, t->name,
                        (long long)t->uid), -1;
    if (t->is_virtual != (t->bind == BIND_NONE) || (t->by_value && t->is_virtual))
      return snprintf(err, errlen, "graph: tensor %s: virtual/bound mismatch", t->name), -1;
    for (int k = 0; k < 4; k++)
      if (t->dim[k] < 1 || t->stride[k] < 1)
        return snprintf(err, errlen, "graph: tensor %s: dim/stride %d not positive", t->name, k), -1;
    if (!t->is_virtual && !t->by_value && t->stride[3] != 1 && t->stride[2] != 1) /* K^T, V^T: dim 2 */
      return snprintf(err, errlen, "graph: tensor %s: no unit stride in its last two dims", t->name), -1;
    if (t->bind != BIND_NONE) {
      if (bound[t->bind]++) return snprintf(err, errlen, "graph: buffer %s bound twice", cda_bind_names[t->bind]), -1;
    }
  }
  for (int i = 0; i < g->nop; i++) {
    const ca_op *o = &g->op[i];
    char line[512];
    cda_op_line(g, i, line, sizeof line);
    const int ins[3] = {o->x, o->b, o->t};
    for (int k = 0; k < 3; k++) {
      if (ins[k] < 0) continue;
      if (g->t[ins[k]].is_virtual && !produced[ins[k]])
        return snprintf(err, errlen, "graph: %s reads %s before it is produced", line, g->t[ins[k]].name), -1;
      used[ins[k]] = 1;
    }
    if (o->y < 0 || produced[o->y]++)
      return snprintf(err, errlen, "graph: %s: output missing or produced twice", line), -1;
    if (g->t[o->y].by_value) return snprintf(err, errlen, "graph: %s writes a by-value tensor", line), -1;
    const ca_tensor *x = &g->t[o->x], *y = &g->t[o->y];
    if (o->kind == OP_MATMUL) {
      const ca_tensor *b = &g->t[o->b];
      /* [.., m, k] x [.., k, n] -> [.., m, n]; batch dims broadcast (GQA: A or B's heads divide C's) */
      if (x->dim[3] != b->dim[2] || y->dim[2] != x->dim[2] || y->dim[3] != b->dim[3])
        return snprintf(err, errlen, "graph: %s: matmul shapes do not chain", line), -1;
      for (int k = 0; k < 2; k++)
        if (y->dim[k] % x->dim[k] || y->dim[k] % b->dim[k])
          return snprintf(err, errlen, "graph: %s: batch dim %d does not broadcast", line, k), -1;
    } else if (o->kind == OP_POINTWISE) {
      const int n_in = o->mode == CD_POINTWISE_EXP || o->mode == CD_POINTWISE_LOG || o->mode == CD_POINTWISE_IDENTITY ||
                               o->mode == CD_POINTWISE_GEN_INDEX
                           ? 1
                           : o->mode == CD_POINTWISE_BINARY_SELECT ? 3 : 2;
      if ((n_in >= 2) != (o->b >= 0) || (n_in == 3) != (o->t >= 0))
        return snprintf(err, errlen, "graph: %s: wrong number of inputs", line), -1;
      if (!broadcasts(x, y) || (o->b >= 0 && !broadcasts(&g->t[o->b], y)) || (o->t >= 0 && !broadcasts(&g->t[o->t], y)))
        return snprintf(err, errlen, "graph: %s: inputs do not broadcast to the output", line), -1;
      if (o->mode == CD_POINTWISE_GEN_INDEX && (o->axis < 0 || o->axis > 3 || y->dtype != CD_DATA_INT32))
        return snprintf(err, errlen, "graph: %s: gen_index axis/type", line), -1;
      if (o->mode == CD_POINTWISE_CMP_GE && y->dtype != CD_DATA_BOOLEAN)
        return snprintf(err, errlen, "graph: %s: comparison not boolean", line), -1;
      if (o->mode == CD_POINTWISE_BINARY_SELECT && g->t[o->t].dtype != CD_DATA_BOOLEAN)
        return snprintf(err, errlen, "graph: %s: select mask not boolean", line), -1;
    } else if (o->kind == OP_REDUCTION) {
      /* reduced dims become 1; a KV-group sum divides the head dim */
      for (int k = 0; k < 4; k++)
        if (y->dim[k] != x->dim[k] && (y->dim[k] != 1 && x->dim[k] % y->dim[k]))
          return snprintf(err, errlen, "graph: %s: reduction dim %d", line, k), -1;
    } else { /* reshape: same elements */
      if (x->dim[0] * x->dim[1] * x->dim[2] * x->dim[3] != y->dim[0] * y->dim[1] * y->dim[2] * y->dim[3])
        return snprintf(err, errlen, "graph: %s: reshape changes the element count", line), -1;
    }
  }
  for (int i = 0; i < g->nt; i++) {
    const ca_tensor *t = &g->t[i];
    if (t->is_virtual && (!produced[i] || !used[i]))
      return snprintf(err, errlen, "graph: virtual tensor %s is %s", t->name, produced[i] ? "never read" : "never produced"),
             -1;
    if (!t->is_virtual && !produced[i] && !used[i])
      return snprintf(err, errlen, "graph: tensor %s is not connected", t->name), -1;
  }
  /* the buffers each graph must bind */
  static const int fwd_binds[] = {BIND_Q, BIND_K, BIND_V, BIND_O, BIND_STATS, BIND_SCALE};
  static const int bwd_binds[] = {BIND_Q, BIND_K, BIND_V, BIND_O, BIND_DO, BIND_STATS, BIND_DQ, BIND_DK, BIND_DV,
                                  BIND_SCALE, BIND_ONE, BIND_SOFTMAX_SUM, BIND_DQ_ACCUM};
  const int bwd = bound[BIND_DO] > 0;
  const int *need = bwd ? bwd_binds : fwd_binds;
  const int n_need = bwd ? (int)(sizeof bwd_binds / sizeof *bwd_binds) : (int)(sizeof fwd_binds / sizeof *fwd_binds);
  for (int i = 0; i < n_need; i++)
    if (!bound[need[i]]) return snprintf(err, errlen, "graph: buffer %s is not bound", cda_bind_names[need[i]]), -1;
  if (s->causal != (bound[BIND_NEG_INF] > 0)) return snprintf(err, errlen, "graph: causal mask missing"), -1;
  return 0;
}

int cda_valid_shape(const gpu_cudnn_shape *s, char *err, size_t errlen) {
  if (s->B < 1 || s->seq < 1 || s->nkv < 1 || s->nh < s->nkv || s->nh % s->nkv || s->hd < 8 || s->hd % 8) {
    snprintf(err, errlen, "cuDNN attention: unsupported shape (batch %lld, seq %lld, heads %lld, kv_heads %lld, head dim %lld)",
             (long long)s->B, (long long)s->seq, (long long)s->nh, (long long)s->nkv, (long long)s->hd);
    return -1;
  }
  return 0;
}

int gpu_cudnn_attn_graph_check(int bwd, const gpu_cudnn_shape *s, size_t version, char *err, size_t errlen) {
  (void)version;
  if (cda_valid_shape(s, err, errlen)) return -1;
  ca_graph g;
  cda_build_graph(&g, bwd, s);
  return cda_check_graph(&g, s, err, errlen);
}

int gpu_cudnn_attn_graph_dump(int bwd, const gpu_cudnn_shape *s, size_t version, char *buf, size_t len) {
  (void)version;
  ca_graph g;
  cda_build_graph(&g, bwd, s);
  size_t at = 0;
  char line[512];
  if (len) buf[0] = 0;
  for (int i = 0; i < g.nt + g.nop; i++) {
    if (i < g.nt) cda_tensor_line(&g.t[i], line, sizeof line);
    else cda_op_line(&g, i - g.nt, line, sizeof line);
    if (at < len) at += (size_t)snprintf(buf + at, len - at, "%s\n", line);
  }
  return g.nop;
}
