/* memplan.c -- the liveness walk behind the predicted peak memory. Run-time sizes (rows routed
 * to an expert) count at their bound, so the prediction is an upper bound for the values. */
#include "memplan.h"

#include <stdlib.h>
#include <string.h>

static int64_t dtype_bytes(ir_dtype t) {
  switch (t) {
    case DT_BF16: return 2;
    case DT_E4M3:
    case DT_E8M0: return 1;
    default: return 4;
  }
}

/* Scratch an op holds only while it runs. Attention in bf16 with head dim 64 or 128 runs the
 * GPU's flash kernels (runtime/gpu_flash.c): the logsumexp rows (fwd), and in the backward an
 * f32 dq accumulator, the row statistics and the recomputed output (T x C each, T = rows);
 * otherwise attention materializes the scores and probabilities, one sequence at a time. */
static int64_t scratch_bytes(const ir_graph *g, const ir_node *n) {
  if (n->op != OP_ATTENTION && n->op != OP_ATTENTION_BWD) return 0;
  const ir_type *q = &g->nodes[n->in[0]].type;
  int64_t nh = ir_get_int(n, "heads", 1), seq = ir_get_int(n, "seq", 1), C = q->rank >= 2 ? q->dims[q->rank - 1] : 1;
  int64_t T = ir_type_numel_bound(g, q) / (C > 0 ? C : 1), hd = nh > 0 ? C / nh : 0;
  int64_t es = dtype_bytes(q->dtype);
  if (q->dtype == DT_BF16 && (hd == 64 || hd == 128))
    return n->op == OP_ATTENTION ? T * nh * 4 : T * C * (4 + 2) + 2 * T * nh * 4;
  return nh * seq * seq * (4 + es) + 2 * nh * seq * 4;
}

void memplan_estimate(const ir_graph *g, memplan *out) {
  memset(out, 0, sizeof *out);
  int n = g->n_nodes;
  int *last = malloc((size_t)(n + 1) * sizeof *last);
  if (!last) return;
  for (int id = 0; id < n; id++) {
    last[id] = id;
    for (int j = 0; j < g->nodes[id].n_in; j++) last[g->nodes[id].in[j]] = id;
  }
  for (int i = 0; i < g->n_outputs; i++) last[g->outputs[i]] = n;
  int64_t live = 0;
  for (int id = 0; id < n; id++) {
    const ir_node *nd = &g->nodes[id];
    int64_t bytes = ir_type_numel_bound(g, &nd->type) * dtype_bytes(nd->type.dtype);
    if (nd->op == OP_PARAM) {
      out->params += bytes;
      continue;
    }
    if (ir_is_weight(g, id)) { /* a bf16 copy (or a stack of them): kept between steps */
      if (nd->op == OP_CAST) out->copies += bytes;
      continue;
    }
    /* AdamW's m and v of what it updates (a ZeRO shard: its gradient operand's values): f32, or
       half with adamw(moments = bf16) */
    if (nd->op == OP_ADAMW) out->optimizer += ir_type_numel_bound(g, &g->nodes[nd->in[1]].type) * (g->cfg.moments_bf16 ? 4 : 8);
    if (nd->op == OP_ADAMW || nd->op == OP_ALL_GATHER) continue; /* update their parameter in place */
    live += bytes;
    int64_t now = live + scratch_bytes(g, nd);
    if (now > out->activations) {
      out->activations = now;
      out->peak_at = id;
    }
    for (int j = 0; j < nd->n_in; j++) {
      int v = nd->in[j];
      const ir_node *src = &g->nodes[v];
      if (last[v] != id || ir_is_weight(g, v) || src->op == OP_ADAMW) continue;
      int dup = 0; /* an operand listed twice is freed once */
      for (int k = 0; k < j; k++) dup |= nd->in[k] == v;
      if (!dup) live -= ir_type_numel_bound(g, &src->type) * dtype_bytes(src->type.dtype);
    }
  }
  out->total = out->params + out->optimizer + out->copies + out->activations;
  free(last);
}
