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
 * the add's bit for bit on every backend: the pass changes no number. It runs last before dce,
 * on the finished step (forward, backward and the mxfp8 ops). The fused op takes the producer's
 * place where the residual exists by then, else the add's (the router's gradient is made after
 * the combine's unpermute: that unpermute's [S, H] input then lives through the router's
 * backward). A producer read by anything but the add, or a graph output, stays as it is. */
#include <stdlib.h>

#include "pipeline.h"
#include "rewrite.h"

/* An op that can take a residual: one that has none yet. */
static int takes_residual(const ir_node *n) {
  if (ir_get_int(n, "residual", 0)) return 0;
  return (n->op == OP_RMSNORM_BWD_X && n->n_in == 3) || (n->op == OP_EXPERT_UNPERMUTE && n->n_in <= 3);
}

/* The operand of add a (0 or 1) whose producer absorbs it, or -1. */
static int absorbed_side(const ir_graph *g, const ir_uses *u, int a) {
  const ir_node *n = &g->nodes[a];
  if (n->op != OP_ADD || n->in[0] == n->in[1]) return -1;
  for (int s = 1; s >= 0; s--) { /* the second term first: autodiff accumulates grad + new */
    const int b = n->in[s], res = n->in[1 - s];
    const ir_node *p = &g->nodes[b];
    if (takes_residual(p) && uses_count(u, b) == 1 && !u->out[b] && ir_type_equal(&p->type, &n->type) &&
        ir_type_equal(&g->nodes[res].type, &n->type))
      return s;
  }
  return -1;
}

int pass_fuse_residual(ir_graph **gp, FILE *err) {
  ir_graph *g = *gp;
  ir_uses u;
  int *side = malloc(((size_t)g->n_nodes + 1) * sizeof *side); /* (n_nodes) the absorbed operand of an add, or -1 */
  int *moved = calloc((size_t)g->n_nodes + 1, sizeof *moved);   /* (n_nodes) a folded producer: its add's id + 1 */
  if (!side || !moved || uses_build(g, &u)) {
    free(side);
    free(moved);
    fprintf(err, "moec: error: out of memory in fuse-residual\n");
    return -1;
  }
  int n_fused = 0;
  for (int id = 0; id < g->n_nodes; id++) {
    side[id] = absorbed_side(g, &u, id);
    if (side[id] >= 0) moved[g->nodes[id].in[side[id]]] = id + 1, n_fused++;
  }
  uses_free(&u);
  if (n_fused == 0) {
    free(side);
    free(moved);
    return 0;
  }
  rw_ctx r;
  if (rw_begin(&r, g, "fuse-residual", err)) {
    free(side);
    free(moved);
    return -1;
  }
  for (int id = 0; id < g->n_nodes && !r.failed; id++) {
    int a_id = id; /* the add to fold at this place */
    if (moved[id]) {
      a_id = moved[id] - 1;
      if (g->nodes[a_id].in[1 - side[a_id]] > id) continue; /* its residual comes later: at the add */
    } else if (side[id] >= 0) {
      if (r.map[id] >= 0) continue; /* folded at its producer's place */
    } else {
      rw_copy(&r, id);
      continue;
    }
    const ir_node *a = &g->nodes[a_id], *p = &g->nodes[a->in[side[a_id]]];
    int in[5], n_attrs = p->n_attrs;
    for (int j = 0; j < p->n_in; j++) in[j] = r.map[p->in[j]];
    in[p->n_in] = r.map[a->in[1 - side[a_id]]];
    ir_attr *attrs = malloc(((size_t)n_attrs + 1) * sizeof *attrs);
    if (!attrs) {
      fprintf(err, "moec: error: out of memory in fuse-residual\n");
      r.failed = 1;
      break;
    }
    for (int j = 0; j < n_attrs; j++) attrs[j] = p->attrs[j];
    attrs[n_attrs] = ir_attr_int("residual", 1);
    int f = rw_emit(&r, p->op, in, p->n_in + 1, attrs, n_attrs + 1, p->loc);
    free(attrs);
    if (f < 0) break;
    char note[128];
    snprintf(note, sizeof note, "fuse-residual: with the add at %d:%d (its result rounded first: the same bits)", a->loc.line,
             a->loc.col);
    ir_set_note(r.g, f, note);
    r.map[a_id] = f;
  }
  free(side);
  free(moved);
  return rw_finish(&r, gp);
}
