/* mxfp8_projections.c -- the mxfp8-projections pass: with precision mxfp8, the attention's
 * projections (q, k, v and o) become one-group grouped GEMMs, so that the mxfp8 pass quantizes
 * their operands (DESIGN.md: every GEMM but the router's and lm_head's) and the GPU runs them,
 * forward and backward, on the expert GEMMs' FP8 path (cuBLASLt, 128-shared scales). Nothing
 * changes for fp32 and bf16.
 *
 *   y = linear(x, cast(w))                    x[S, in], w[in, out]
 *   =>
 *   counts = fill() {value = S}  : i32[1]     one per row count, shared by the projections
 *   y = grouped_linear(x, stack(cast(w)) {experts = 1}, counts)
 *
 * The same product (one expert holding every row); autodiff then gives it the grouped dgrad
 * and wgrad, which the mxfp8 pass quantizes as the experts' (x's row and column blocks shared
 * by q, k and v). The parameters and their names are unchanged.
 *
 * A projection is a bias-free linear of a bf16 cast of a 2-D parameter, on static rows, that
 * feeds an attention op (directly, or through one rope) or reads one (o). The router (f32)
 * and lm_head (no attention next to it) are left alone. Runs after parallelize (the
 * projections are replicated, not sharded across experts) and before autodiff. */
#include <stdlib.h>

#include "pipeline.h"
#include "rewrite.h"

static int feeds_attention(const ir_graph *g, const ir_uses *u, int v, int depth) {
  for (int k = u->start[v]; k < u->start[v + 1]; k++) {
    const ir_node *r = &g->nodes[u->list[k]];
    if (r->op == OP_ATTENTION) return 1;
    if (r->op == OP_ROPE && depth == 0 && feeds_attention(g, u, u->list[k], 1)) return 1;
  }
  return 0;
}

static int is_projection(const ir_graph *g, const ir_uses *u, int id) {
  const ir_node *n = &g->nodes[id];
  if (n->op != OP_LINEAR || n->n_in != 2) return 0;
  const ir_node *x = &g->nodes[n->in[0]], *w = &g->nodes[n->in[1]];
  if (x->type.rank != 2 || x->type.dims[0] <= 0 || x->type.dtype != DT_BF16) return 0;
  if (w->op != OP_CAST || w->type.dtype != DT_BF16 || g->nodes[w->in[0]].op != OP_PARAM || w->type.rank != 2) return 0;
  return x->op == OP_ATTENTION || feeds_attention(g, u, id, 0);
}

int pass_mxfp8_projections(ir_graph **gp, FILE *err) {
  ir_graph *g = *gp;
  if (g->cfg.precision != PREC_MXFP8) return 0;
  ir_uses u;
  if (uses_build(g, &u)) {
    fprintf(err, "moec: error: out of memory in pass mxfp8-projections\n");
    return -1;
  }
  int found = 0;
  for (int id = 0; id < g->n_nodes && !found; id++) found = is_projection(g, &u, id);
  if (!found) {
    uses_free(&u);
    return 0;
  }
  rw_ctx r;
  if (rw_begin(&r, g, "mxfp8-projections", err)) {
    uses_free(&u);
    return -1;
  }
  int counts = -1; /* the new fill, and the row count it holds */
  int64_t counts_rows = 0;
  ir_attr one = ir_attr_int("experts", 1);
  for (int id = 0; id < g->n_nodes && !r.failed; id++) {
    if (!is_projection(g, &u, id)) {
      rw_copy(&r, id);
      continue;
    }
    const ir_node *n = &g->nodes[id];
    int64_t S = g->nodes[n->in[0]].type.dims[0];
    if (counts < 0 || counts_rows != S) {
      ir_type t = {.dtype = DT_I32, .rank = 1, .dims = {1}};
      ir_attr v = ir_attr_float("value", (double)S);
      counts = rw_emit_typed(&r, OP_FILL, NULL, 0, &v, 1, t, n->loc);
      counts_rows = S;
    }
    int w = rw_emit(&r, OP_STACK, &r.map[n->in[1]], 1, &one, 1, n->loc);
    int y = rw_emit(&r, OP_GROUPED_LINEAR, (int[]){r.map[n->in[0]], w, counts}, 3, NULL, 0, n->loc);
    r.map[id] = y;
    if (y >= 0) ir_set_note(r.g, y, "mxfp8-projections: an attention projection as a one-group grouped GEMM (FP8 with the experts')");
  }
  uses_free(&u);
  return rw_finish(&r, gp);
}
