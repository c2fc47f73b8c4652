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
 *
 * Expert parallelism (ep > 1; this graph is EP rank cfg.ep_rank's): the rank owns experts
 * [lo, hi) = ep_rank * E/ep + [0, E/ep). Over the fused experts (group-linear + grouped-mlp):
 *   params of other ranks' experts      -> dropped (never instantiated here), and their casts
 *   stack(w_0 .. w_{E-1})               -> stack(w_lo .. w_{hi-1})
 *   grouped_mlp(xs, wgu, wd, counts, p) -> grouped_mlp(ep_all_to_all(xs, counts), wgu', wd',
 *                                            ep_local_counts(counts), ep_all_to_all(p, counts))
 *   expert_unpermute(slice(mlp), perm)  -> expert_unpermute(ep_all_to_all(slice(mlp), counts) {reverse}, perm)
 * The naive experts (dispatch/combine, or grouped_linear left unfused) are refused with a
 * message. Does nothing when world = 1. */
#include <inttypes.h>
#include <stdlib.h>

#include "pipeline.h"
#include "rewrite.h"

/* The EP attributes of an exchange. */
static int ep_attrs(ir_attr *a, int64_t E, int64_t ep, int64_t rank, int reverse, int64_t rows) {
  a[0] = ir_attr_int("experts", E);
  a[1] = ir_attr_int("ep", ep);
  a[2] = ir_attr_int("ep_rank", rank);
  a[3] = ir_attr_int("reverse", reverse);
  a[4] = ir_attr_int("rows", rows);
  return reverse ? 5 : 4;
}

/* The EP rewrite of node id (ep > 1); 1 when it handled the node, 0 when it is a plain copy. */
static int ep_rewrite(rw_ctx *r, int id, int64_t ep, int64_t rank) {
  const ir_graph *g = r->old;
  const ir_node *n = &g->nodes[id];
  int64_t E = g->cfg.experts, El = E / ep, lo = rank * El;
  ir_attr a[5];
  if (n->op == OP_DISPATCH || n->op == OP_COMBINE || n->op == OP_GROUPED_LINEAR) {
    fprintf(r->err, "%s:%d:%d: error: expert parallelism (ep = %lld) needs the fused experts (the group-linear and "
                    "grouped-mlp passes), but this block still has a %s; do not disable those passes with ep > 1\n",
            n->loc.file ? n->loc.file : "?", n->loc.line, n->loc.col, (long long)ep, ir_ops[n->op].name);
    r->failed = 1;
    return 1;
  }
  if (n->op == OP_PARAM) {
    int64_t e = ir_get_int(n, "expert", -1);
    return e >= 0 && (e < lo || e >= lo + El); /* another rank's expert: not copied */
  }
  if (n->op == OP_CAST && g->nodes[n->in[0]].op == OP_PARAM && r->map[n->in[0]] < 0)
    return 1; /* the compute copy (bf16) of another rank's expert: dropped with it */
  if (n->op == OP_STACK) {
    int64_t P = n->n_in / E;
    int *in = malloc((size_t)(P * El) * sizeof *in);
    if (!in) abort();
    for (int64_t p = 0; p < P; p++)
      for (int64_t l = 0; l < El; l++) in[p * El + l] = r->map[n->in[p * E + lo + l]];
    ir_attr ex = ir_attr_int("experts", El);
    r->map[id] = rw_emit(r, OP_STACK, in, (int)(P * El), &ex, 1, n->loc);
    free(in);
    return 1;
  }
  if (n->op == OP_GROUPED_MLP) {
    int xs = r->map[n->in[0]], counts = r->map[n->in[3]], probs = r->map[n->in[4]];
    int64_t S = g->nodes[n->in[0]].type.dims[0];
    char sym[32];
    snprintf(sym, sizeof sym, "ep_rows%d", id);
    int64_t R = ir_sym_new(r->g, sym, S * ep);
    int na = ep_attrs(a, E, ep, rank, 0, 0);
    ir_type tx = {g->nodes[n->in[0]].type.dtype, 2, {R, g->nodes[n->in[0]].type.dims[1], 0, 0}};
    ir_type tp = {DT_F32, 2, {R, 1, 0, 0}};
    int xr = rw_emit_typed(r, OP_EP_ALL_TO_ALL, (int[]){xs, counts}, 2, a, na, tx, n->loc);
    int pr = rw_emit_typed(r, OP_EP_ALL_TO_ALL, (int[]){probs, counts}, 2, a, na, tp, n->loc);
    int lc = rw_emit(r, OP_EP_LOCAL_COUNTS, &counts, 1, a, 3, n->loc);
    if (xr >= 0) ir_set_note(r->g, xr, "parallelize: the rows of this rank's experts from every EP rank");
    r->map[id] = rw_emit(r, OP_GROUPED_MLP, (int[]){xr, r->map[n->in[1]], r->map[n->in[2]], lc, pr}, 5, n->attrs, n->n_attrs, n->loc);
    return 1;
  }
  if (n->op == OP_SLICE_COLS && g->nodes[n->in[0]].op == OP_GROUPED_MLP) {
    r->map[id] = rw_emit(r, OP_SLICE_COLS, &r->map[n->in[0]], 1, n->attrs, n->n_attrs, n->loc);
    return 1;
  }
  if (n->op == OP_EXPERT_UNPERMUTE && g->nodes[n->in[0]].op == OP_SLICE_COLS &&
      g->nodes[g->nodes[n->in[0]].in[0]].op == OP_GROUPED_MLP) {
    const ir_node *mlp = &g->nodes[g->nodes[n->in[0]].in[0]];
    int na = ep_attrs(a, E, ep, rank, 1, n->type.dims[0] * ir_get_int(n, "top_k", 1));
    int back = rw_emit(r, OP_EP_ALL_TO_ALL, (int[]){r->map[n->in[0]], r->map[mlp->in[3]]}, 2, a, na, n->loc);
    if (back >= 0) ir_set_note(r->g, back, "parallelize: the expert outputs back to the ranks that sent the rows");
    int in[3] = {back, r->map[n->in[1]], n->n_in == 3 ? r->map[n->in[2]] : 0};
    rw_copy_operands(r, id, in, n->n_in);
    return 1;
  }
  return 0;
}

int pass_parallelize(ir_graph **gp, FILE *err) {
  ir_graph *g = *gp;
  int64_t ep = g->cfg.ep > 0 ? g->cfg.ep : 1, dp = g->cfg.dp > 0 ? g->cfg.dp : 1, world = ep * dp;
  if (world == 1) return 0;
  int64_t rank = g->cfg.ep_rank;
  if (ep > 1 && (g->cfg.experts % ep || rank < 0 || rank >= ep)) {
    fprintf(err, "moec: error: parallelize: experts = %lld, ep = %lld, ep_rank = %lld: experts must be a multiple of ep\n",
            (long long)g->cfg.experts, (long long)ep, (long long)rank);
    return -1;
  }
  rw_ctx r;
  if (rw_begin(&r, g, "parallelize", err)) return -1;
  ir_attr world_grp = ir_attr_str("group", "world");
  char note[128];
  snprintf(note, sizeof note, "parallelize: this rank's share of the loss over %" PRId64 " ranks", world);
  for (int id = 0; id < g->n_nodes && !r.failed; id++) {
    const ir_node *n = &g->nodes[id];
    int nid;
    if (ep > 1 && ep_rewrite(&r, id, ep, rank)) continue;
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
