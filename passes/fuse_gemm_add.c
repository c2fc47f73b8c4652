/* fuse_gemm_add.c -- adds of a GEMM's result folded into the GEMM, as its accumulator.
 *
 * The attention block's backward sums the input's gradient over the three projections that
 * read it (autodiff accumulates a gradient with `add`):
 *
 *   dx = add(add(matmul(dv, Wv^T), matmul(dk, Wk^T)), matmul(dq, Wq^T))
 *
 * Each add reads two [T, H] tensors and writes a third after the GEMM wrote one of them.
 * Folded in, the GEMM takes the other term as its addend (cuBLASLt's C with beta = 1):
 *
 *   dx = matmul(dq, Wq^T, matmul(dk, Wk^T, matmul(dv, Wv^T) {accumulate=1}) {accumulate=1}
 *
 * Unlike fuse-residual this is not bit for bit in bf16: the GEMM's f32 sum meets the addend
 * before the one rounding to the result type, where the add rounded the product first (one
 * rounding fewer; in f32 the same bits). It runs after fuse-residual, which is exact and takes
 * the adds it can first, on the finished step. The fused GEMM takes the GEMM's place where
 * the addend exists by then, else the add's. A GEMM read by anything but the add, a graph
 * output, or one whose result type differs from the add's stays as it is. */
#include <stdlib.h>

#include "pipeline.h"
#include "rewrite.h"

/* A GEMM that can take an addend: a matmul without one. */
static int takes_addend(const ir_node *n) { return n->op == OP_MATMUL && n->n_in == 2; }

/* The operand of add a (0 or 1) whose GEMM absorbs the other, or -1. */
static int absorbed_side(const ir_graph *g, const ir_uses *u, int a) {
  const ir_node *n = &g->nodes[a];
  if (n->op != OP_ADD || n->in[0] == n->in[1]) return -1;
  for (int s = 1; s >= 0; s--) { /* the second term first: autodiff accumulates grad + new */
    const int b = n->in[s], other = n->in[1 - s];
    const ir_node *p = &g->nodes[b];
    if (takes_addend(p) && uses_count(u, b) == 1 && !u->out[b] && ir_type_equal(&p->type, &n->type) &&
        ir_type_equal(&g->nodes[other].type, &n->type))
      return s;
  }
  return -1;
}

int pass_fuse_gemm_add(ir_graph **gp, FILE *err) {
  ir_graph *g = *gp;
  ir_uses u;
  int *side = malloc(((size_t)g->n_nodes + 1) * sizeof *side); /* (n_nodes) the GEMM's operand of an add, or -1 */
  int *moved = calloc((size_t)g->n_nodes + 1, sizeof *moved);   /* (n_nodes) a folded GEMM: its add's id + 1 */
  if (!side || !moved || uses_build(g, &u)) {
    free(side);
    free(moved);
    fprintf(err, "moec: error: out of memory in fuse-gemm-add\n");
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
  if (rw_begin(&r, g, "fuse-gemm-add", err)) {
    free(side);
    free(moved);
    return -1;
  }
  for (int id = 0; id < g->n_nodes && !r.failed; id++) {
    int a_id = id; /* the add to fold at this place */
    if (moved[id]) {
      a_id = moved[id] - 1;
      if (r.map[g->nodes[a_id].in[1 - side[a_id]]] < 0) continue; /* its addend comes later: fold at the add */
    } else if (side[id] >= 0) {
      if (r.map[id] >= 0) continue; /* folded at its GEMM's place */
    } else {
      rw_copy(&r, id);
      continue;
    }
    const ir_node *a = &g->nodes[a_id];
    const int gemm = a->in[side[a_id]];
    const int in[3] = {r.map[g->nodes[gemm].in[0]], r.map[g->nodes[gemm].in[1]], r.map[a->in[1 - side[a_id]]]};
    const ir_attr acc = ir_attr_int("accumulate", 1);
    int f = rw_copy_full(&r, gemm, in, 3, &acc, 1);
    if (f < 0) break;
    char note[128];
    snprintf(note, sizeof note, "fuse-gemm-add: with the add at %d:%d (one rounding: not bit for bit in bf16)", a->loc.line,
             a->loc.col);
    ir_set_note(r.g, f, note);
    r.map[a_id] = f;
  }
  free(side);
  free(moved);
  return rw_finish(&r, gp);
}
