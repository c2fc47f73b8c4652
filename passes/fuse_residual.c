/* fuse_residual.c -- residual adds folded into the op that makes one of their terms.
 *
 * The residual stream gets an add after every block, forward and backward:
 *
 *   h'  = add(h, expert_unpermute(ys, perm))         the MoE block's combine (forward)
 *   d   = add(expert_unpermute(dys, perm), d_router) the combine's gradient meets the router's
 *   dh  = add(dh', rmsnorm_bwd_x(dy, h, w))           a norm's gradient joins the stream's
 *
 * Each add reads two [T, H] tensors and writes a third, after the producer wrote one of them.
 * Folded in, the producer reads the residual and writes the sum:
 *
 *   expert_unpermute(ys, perm, h) {residual=1}       rmsnorm_bwd_x(dy, h, w, dh') {residual=1}
 *
 * The fused op rounds its own result to the result type before adding (ops.def), so the sum is
 * the add's bit for bit on every backend: the pass changes no number. It runs after mxfp8, on
 * the finished step (forward, backward and the mxfp8 ops), before fuse-gemm-add. The fused op
 * takes the producer's place where the residual exists by then, else the add's (the router's
 * gradient is made after the combine's unpermute: that unpermute's [S, H] input then lives
 * through the router's backward). A producer read by anything but the add, or a graph output,
 * stays as it is. The rewrite is fold_adds (passes/fold_add.c), shared with fuse-gemm-add. */
#include "pipeline.h"
#include "rewrite.h"

/* An op that can take a residual: one that has none yet. */
static int takes_residual(const ir_node *n) {
  if (ir_get_int(n, "residual", 0)) return 0;
  return (n->op == OP_RMSNORM_BWD_X && n->n_in == 3) || (n->op == OP_EXPERT_UNPERMUTE && n->n_in <= 3);
}

int pass_fuse_residual(ir_graph **gp, FILE *err) {
  return fold_adds(gp, "fuse-residual", takes_residual, "residual", "its result rounded first: the same bits", err);
}
