/* sync.c -- the collectives after autodiff in a data-parallel step (docs/parallel.md):
 *
 *   g_p' = all_reduce(g_p) {world}   every parameter gradient, right where it is complete
 *                                    ({dp} for expert parameters when ep > 1)
 *   out' = all_reduce(out) {world}   every graph output (the loss shares -> the global loss)
 *
 * The parallelize pass made each rank's loss its share of the global loss, so the sum of the
 * ranks' gradients is the gradient of the whole batch, and grad_norm over the summed gradients
 * is the global norm on every rank. With ep > 1 the expert gradients are summed over {dp}
 * only (each EP rank holds other experts) and grad_norm adds the EP group's expert squares.
 *
 * With zero (ZeRO-1), a parameter whose group has G > 1 ranks is updated in shards instead:
 *
 *   s_p  = reduce_scatter(g_p) {grp}    this rank's 1/G of the summed gradient
 *   n    = grad_norm(s_..) {sharded}    the squares of every shard, summed over the world
 *   p'   = adamw(p, s_p, n) {zero=grp}  updates the shard (moments for the shard only)
 *   p''  = all_gather(p') {grp}         every rank's updated shard, into every replica
 *
 * Every element is in exactly one rank's shard of its group, and the groups of different EP
 * ranks hold different experts, so the world's sum of shard squares is the one-rank norm.
 * Does nothing when world = 1. */
#include <stdlib.h>

#include "pipeline.h"
#include "rewrite.h"

/* The group that sums parameter p's gradient: {dp} for sharded experts, else {world}. */
static const char *group_of(const ir_graph *g, int p) {
  return ir_get_int(&g->nodes[p], "expert", -1) >= 0 && g->cfg.ep > 1 ? "dp" : "world";
}

/* ZeRO-1 shards parameter p's update: zero is on and p's group has more than one rank. */
static int sharded(const ir_graph *g, int p) { return g->cfg.zero && ir_group_size(g, group_of(g, p)) > 1; }

/* The reduced gradient of old value v (a parameter's gradient), emitted once: all_reduce, or
 * ZeRO's reduce_scatter. */
static int reduce(rw_ctx *r, int v, const int *param_of, int *reduced) {
  const ir_graph *g = r->old;
  if (reduced[v] < 0) {
    int p = param_of[v];
    ir_attr grp = ir_attr_str("group", group_of(g, p));
    reduced[v] = rw_emit(r, sharded(g, p) ? OP_REDUCE_SCATTER : OP_ALL_REDUCE, &r->map[v], 1, &grp, 1, g->nodes[p].loc);
    if (reduced[v] >= 0 && sharded(g, p)) ir_set_note(r->g, reduced[v], "sync: zero: this rank's shard of the summed gradient");
  }
  return reduced[v];
}

/* ZeRO-1's update of old adamw id: adamw(p, shard, n) {zero = grp}, then all_gather {grp}. */
static void adamw_zero(rw_ctx *r, int id, const int *param_of, int *reduced) {
  const ir_node *n = &r->old->nodes[id];
  int in[3] = {r->map[n->in[0]], reduce(r, n->in[1], param_of, reduced), r->map[n->in[2]]};
  ir_attr z = ir_attr_str("zero", group_of(r->old, n->in[0])), grp = ir_attr_str("group", z.s);
  int a = rw_copy_full(r, id, in, 3, &z, 1);
  if (a < 0) return;
  int gv = rw_emit(r, OP_ALL_GATHER, &a, 1, &grp, 1, n->loc);
  if (gv >= 0) ir_set_note(r->g, gv, "sync: zero: every rank's updated shard, into every replica");
}

/* ZeRO-1's norm: grad_norm(reduced..) {sharded = 1}: each element is in one rank's operands. */
static void grad_norm_zero(rw_ctx *r, int id, const int *param_of, int *reduced) {
  const ir_node *n = &r->old->nodes[id];
  int *in = malloc((size_t)n->n_in * sizeof *in);
  if (!in) abort();
  for (int j = 0; j < n->n_in; j++) in[j] = param_of[n->in[j]] >= 0 ? reduce(r, n->in[j], param_of, reduced) : r->map[n->in[j]];
  ir_attr a = ir_attr_int("sharded", 1);
  int v = rw_copy_full(r, id, in, n->n_in, &a, 1);
  if (v >= 0) ir_set_note(r->g, v, "sync: zero: sqrt(all_reduce{world}(squares of this rank's shards))");
  free(in);
}

/* With sharded experts: grad_norm(dense.., expert..) {expert_from = k}, so the executor adds
 * the EP group's expert squares: sqrt(dense^2 + all_reduce{ep}(expert^2)), the one-rank norm. */
static void grad_norm_ep(rw_ctx *r, int id, const int *param_of, int *reduced) {
  const ir_node *n = &r->old->nodes[id];
  int *in = malloc((size_t)n->n_in * sizeof *in), k = 0;
  if (!in) abort();
  for (int pass = 0; pass < 2; pass++)
    for (int j = 0; j < n->n_in; j++) {
      int v = n->in[j], expert = param_of[v] >= 0 && ir_get_int(&r->old->nodes[param_of[v]], "expert", -1) >= 0;
      if (expert != pass) continue;
      in[k++] = param_of[v] >= 0 ? reduce(r, v, param_of, reduced) : r->map[v];
    }
  int dense = 0;
  for (int j = 0; j < n->n_in; j++)
    dense += !(param_of[n->in[j]] >= 0 && ir_get_int(&r->old->nodes[param_of[n->in[j]]], "expert", -1) >= 0);
  ir_attr a = ir_attr_int("expert_from", dense);
  int v = rw_copy_full(r, id, in, n->n_in, &a, 1);
  if (v >= 0) ir_set_note(r->g, v, "sync: sqrt(dense^2 + all_reduce{ep}(expert^2)): the norm over every expert");
  free(in);
}

int pass_sync(ir_graph **gp, FILE *err) {
  ir_graph *g = *gp;
  int64_t ep = g->cfg.ep > 0 ? g->cfg.ep : 1, dp = g->cfg.dp > 0 ? g->cfg.dp : 1;
  if (ep * dp == 1) return 0;
  int *param_of = malloc(((size_t)g->n_nodes + 1) * sizeof *param_of), *reduced = malloc(((size_t)g->n_nodes + 1) * sizeof *reduced);
  if (!param_of || !reduced) {
    free(param_of);
    free(reduced);
    fprintf(err, "moec: error: out of memory in sync\n");
    return -1;
  }
  for (int id = 0; id < g->n_nodes; id++) param_of[id] = reduced[id] = -1;
  for (int id = 0; id < g->n_nodes; id++)
    if (g->nodes[id].op == OP_ADAMW) param_of[g->nodes[id].in[1]] = g->nodes[id].in[0];
  rw_ctx r;
  if (rw_begin(&r, g, "sync", err)) {
    free(param_of);
    free(reduced);
    return -1;
  }
  for (int id = 0; id < g->n_nodes && !r.failed; id++) {
    const ir_node *n = &g->nodes[id];
    if (n->op != OP_GRAD_NORM && n->op != OP_ADAMW) {
      rw_copy(&r, id);
      /* a parameter's gradient is reduced where it is complete, not where grad_norm reads it:
         the executor can then overlap each collective with the backward still to run */
      if (param_of[id] >= 0 && !r.failed) reduce(&r, id, param_of, reduced);
      continue;
    }
    if (g->cfg.zero) {
      if (n->op == OP_GRAD_NORM) grad_norm_zero(&r, id, param_of, reduced);
      else if (sharded(g, n->in[0])) adamw_zero(&r, id, param_of, reduced);
      else rw_copy_operands(&r, id, (int[]){r.map[n->in[0]], reduce(&r, n->in[1], param_of, reduced), r.map[n->in[2]]}, 3);
      continue;
    }
    if (n->op == OP_GRAD_NORM && ep > 1) {
      grad_norm_ep(&r, id, param_of, reduced);
      continue;
    }
    int *in = malloc((size_t)n->n_in * sizeof *in);
    if (!in) abort();
    for (int j = 0; j < n->n_in; j++) {
      int v = n->in[j];
      in[j] = r.map[v];
      if (param_of[v] < 0 || (n->op == OP_ADAMW && j != 1)) continue;
      in[j] = reduce(&r, v, param_of, reduced);
    }
    rw_copy_operands(&r, id, in, n->n_in);
    free(in);
  }
  ir_attr world = ir_attr_str("group", "world");
  for (int i = 0; i < g->n_outputs && !r.failed; i++) {
    int v = g->outputs[i], nv = rw_emit(&r, OP_ALL_REDUCE, &r.map[v], 1, &world, 1, g->nodes[v].loc);
    if (nv >= 0) {
      ir_set_note(r.g, nv, "sync: the sum of every rank's share");
      r.map[v] = nv;
    }
  }
  free(param_of);
  free(reduced);
  return rw_finish(&r, gp);
}
