/* fold_add.c -- the rewrite fuse-residual and fuse-gemm-add share: an add folded into the op
 * that makes one of its terms, which takes the other term as a last operand and attribute=1.
 *
 *   s = add(r, p(x...))   =>   s = p(x..., r) {attribute=1}
 *
 * The folded op takes p's place where r exists by then, else the add's. p must be read by the
 * add alone, no graph output, and of the add's type, as r must be. */
#include <stdlib.h>

#include "rewrite.h"

/* The operand of add a (0 or 1) whose producer absorbs the other, or -1. */
static int absorbed_side(const ir_graph *g, const ir_uses *u, int a, fold_taker takes) {
  const ir_node *n = &g->nodes[a];
  if (n->op != OP_ADD || n->in[0] == n->in[1]) return -1;
  for (int s = 1; s >= 0; s--) { /* the second term first: autodiff accumulates grad + new */
    const int b = n->in[s], other = n->in[1 - s];
    const ir_node *p = &g->nodes[b];
    if (takes(p) && uses_count(u, b) == 1 && !u->out[b] && ir_type_equal(&p->type, &n->type) &&
        ir_type_equal(&g->nodes[other].type, &n->type))
      return s;
  }
  return -1;
}

int fold_adds(ir_graph **gp, const char *pass, fold_taker takes, const char *attribute, const char *how, FILE *err) {
  ir_graph *g = *gp;
  ir_uses u;
  int *side = malloc(((size_t)g->n_nodes + 1) * sizeof *side); /* (n_nodes) the absorbing operand of an add, or -1 */
  int *moved = calloc((size_t)g->n_nodes + 1, sizeof *moved);   /* (n_nodes) a folded producer: its add's id + 1 */
  if (!side || !moved || uses_build(g, &u)) {
    free(side);
    free(moved);
    fprintf(err, "moec: error: out of memory in %s\n", pass);
    return -1;
  }
  int n_fused = 0;
  for (int id = 0; id < g->n_nodes; id++) {
    side[id] = absorbed_side(g, &u, id, takes);
    if (side[id] >= 0) moved[g->nodes[id].in[side[id]]] = id + 1, n_fused++;
  }
  uses_free(&u);
  rw_ctx r;
  if (n_fused == 0 || rw_begin(&r, g, pass, err)) {
    free(side);
    free(moved);
    return n_fused == 0 ? 0 : -1;
  }
  for (int id = 0; id < g->n_nodes && !r.failed; id++) {
    int a_id = id; /* the add to fold at this place */
    if (moved[id]) {
      a_id = moved[id] - 1;
      if (g->nodes[a_id].in[1 - side[a_id]] > id) continue; /* its other term comes later: at the add */
    } else if (side[id] >= 0) {
      if (r.map[id] >= 0) continue; /* folded at its producer's place */
    } else {
      rw_copy(&r, id);
      continue;
    }
    const ir_node *a = &g->nodes[a_id], *p = &g->nodes[a->in[side[a_id]]];
    int *in = malloc(((size_t)p->n_in + 1) * sizeof *in); /* (n_in + 1) p's operands, then the other term */
    if (!in) {
      fprintf(err, "moec: error: out of memory in %s\n", pass);
      r.failed = 1;
      break;
    }
    for (int j = 0; j < p->n_in; j++) in[j] = r.map[p->in[j]];
    in[p->n_in] = r.map[a->in[1 - side[a_id]]];
    const ir_attr flag = ir_attr_int(attribute, 1);
    int f = rw_copy_full(&r, a->in[side[a_id]], in, p->n_in + 1, &flag, 1);
    free(in);
    if (f < 0) break;
    char note[160];
    snprintf(note, sizeof note, "%s: with the add at %d:%d (%s)", pass, a->loc.line, a->loc.col, how);
    ir_set_note(r.g, f, note);
    r.map[a_id] = f;
  }
  free(side);
  free(moved);
  return rw_finish(&r, gp);
}
