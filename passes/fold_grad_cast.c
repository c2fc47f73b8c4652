/* fold_grad_cast.c -- the optimizer reads bf16 gradients where they are made in bf16.
 *
 * In a bf16 step the weight gradient comes out of a bf16 GEMM and autodiff's rule for the
 * forward cast(w_f32 -> bf16) widens it again: g_f32 = cast(g_bf16), read by grad_norm and
 * adamw. Widening is exact, so
 *
 *   adamw(p, cast(g), n)  =>  adamw(p, g, n)        grad_norm(.., cast(g), ..) => grad_norm(.., g, ..)
 *
 * computes the same update and norm bit for bit while the step no longer writes and rereads
 * an f32 copy of every gradient (6 bytes a parameter) and the optimizer reads 2 bytes instead
 * of 4. The casts left without readers go in dce. Runs after sync (an all_reduce'd gradient is
 * f32 and is left alone). */
#include "pipeline.h"

static int is_widening_cast(const ir_graph *g, int v) {
  const ir_node *c = &g->nodes[v];
  return c->op == OP_CAST && c->type.dtype == DT_F32 && g->nodes[c->in[0]].type.dtype == DT_BF16;
}

int pass_fold_grad_cast(ir_graph **gp, FILE *err) {
  ir_graph *g = *gp;
  (void)err;
  for (int id = 0; id < g->n_nodes; id++) {
    ir_node *n = &g->nodes[id];
    if (n->op != OP_ADAMW && n->op != OP_GRAD_NORM) continue;
    for (int j = n->op == OP_ADAMW ? 1 : 0; j < (n->op == OP_ADAMW ? 2 : n->n_in); j++)
      if (is_widening_cast(g, n->in[j])) n->in[j] = g->nodes[n->in[j]].in[0];
  }
  return 0;
}
