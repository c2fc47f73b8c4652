/* parallelize.c -- turns the single-device forward graph into one rank's graph of an
 * EP x DP world (docs/parallel.md). Each rank runs the lowered graph on its share of the
 * global batch (the driver lowers at batch / world); this pass makes every loss a share of the
 * whole batch's loss, so the shares of all ranks sum to it exactly (in math):
 *
 *   cross_entropy(l, lab)  -> cross_entropy(l, lab, all_reduce(label_count(lab)) {world})
 *                             sum over local labels / labels of all ranks
 *   aux_loss(l, idx)       -> aux_loss(l, idx, all_reduce(expert_counts(idx)) {world})
 *                             routed fractions f_e over all ranks; local probabilities / all tokens
 *   z_loss(l) {coef}       -> z_loss(l) {coef, global_tokens = T * world}
 *
 * Autodiff then differentiates the shares; the sync pass sums the gradients and the outputs.
 * Expert parallelism (experts sharded, dispatch/combine as all-to-all) is not done yet: with
 * ep > 1 the pass leaves the graph single-device and `moec train` refuses to run it. Does
 * nothing when world = 1. */
#include <inttypes.h>

#include "pipeline.h"
#include "rewrite.h"

int pass_parallelize(ir_graph **gp, FILE *err) {
  ir_graph *g = *gp;
  int64_t ep = g->cfg.ep > 0 ? g->cfg.ep : 1, dp = g->cfg.dp > 0 ? g->cfg.dp : 1, world = ep * dp;
  if (world == 1) return 0;
  if (ep > 1) return 0; /* expert parallelism: not yet; moec train refuses ep > 1 (docs/parallel.md) */
  rw_ctx r;
  if (rw_begin(&r, g, "parallelize", err)) return -1;
  ir_attr world_grp = ir_attr_str("group", "world");
  char note[128];
  snprintf(note, sizeof note, "parallelize: this rank's share of the loss over %" PRId64 " ranks", world);
  for (int id = 0; id < g->n_nodes && !r.failed; id++) {
    const ir_node *n = &g->nodes[id];
    int nid;
    if (n->op == OP_CROSS_ENTROPY && n->n_in == 2) {
      int lab = r.map[n->in[1]];
      int cnt = rw_emit(&r, OP_LABEL_COUNT, &lab, 1, NULL, 0, n->loc);
      int tot = rw_emit(&r, OP_ALL_REDUCE, &cnt, 1, &world_grp, 1, n->loc);
      nid = rw_copy_operands(&r, id, (int[]){r.map[n->in[0]], lab, tot}, 3);
    } else if (n->op == OP_AUX_LOSS && n->n_in == 2) {
      int idx = r.map[n->in[1]];
      ir_attr e = ir_attr_int("experts", g->nodes[n->in[0]].type.dims[1]);
      int cnt = rw_emit(&r, OP_EXPERT_COUNTS, &idx, 1, &e, 1, n->loc);
      int tot = rw_emit(&r, OP_ALL_REDUCE, &cnt, 1, &world_grp, 1, n->loc);
      nid = rw_copy_operands(&r, id, (int[]){r.map[n->in[0]], idx, tot}, 3);
    } else if (n->op == OP_Z_LOSS) {
      ir_attr gt = ir_attr_int("global_tokens", g->nodes[n->in[0]].type.dims[0] * world);
      nid = rw_copy_attrs(&r, id, &gt, 1);
    } else {
      rw_copy(&r, id);
      continue;
    }
    if (nid >= 0) ir_set_note(r.g, nid, note);
  }
  return rw_finish(&r, gp);
}
