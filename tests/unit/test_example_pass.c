/* test_example_pass.c -- the example of docs/passes.md ("Adding a pass"): a pass that folds a
 * multiply by one, and its test. Kept here, compiled and run, so that the walkthrough stays
 * true; a real pass lives in passes/NAME.c and gets a row in passes/pipeline.c. */
#include <stdio.h>
#include <string.h>

#include "pipeline.h"
#include "rewrite.h"

/* ---- the pass (docs/passes.md, step 2) ---- */

/* 1 when v is fill {value = 1} (a constant one of any shape). */
static int is_one(const ir_graph *g, int v) {
  return g->nodes[v].op == OP_FILL && ir_get_float(&g->nodes[v], "value", 0) == 1.0;
}

/* mul(x, 1) and mul(1, x) -> x, when the types agree (mul's shape rule makes them equal). */
int pass_fold_mul_one(ir_graph **gp, FILE *err) {
  ir_graph *g = *gp;
  rw_ctx r;
  if (rw_begin(&r, g, "fold-mul-one", err)) return -1;
  for (int id = 0; id < g->n_nodes && !r.failed; id++) {
    const ir_node *n = &g->nodes[id];
    if (n->op == OP_MUL && is_one(g, n->in[1])) r.map[id] = r.map[n->in[0]];      /* x * 1 */
    else if (n->op == OP_MUL && is_one(g, n->in[0])) r.map[id] = r.map[n->in[1]]; /* 1 * x */
    else rw_copy(&r, id);
  }
  return rw_finish(&r, gp); /* the fill, now unused, is left for dce */
}

/* ---- its test (step 4) ---- */

#include "check.h"

static int count(const ir_graph *g, ir_op op) {
  int k = 0;
  for (int i = 0; i < g->n_nodes; i++) k += g->nodes[i].op == op;
  return k;
}

int main(void) {
  /* w f32[1]; a = w * 1; b = 1 * a; c = b * 2; the "loss" is grad_norm(c), an f32 scalar */
  ir_loc L = {"example.moe", 1, 1};
  ir_graph *g = ir_graph_new("example");
  ir_attr wn[] = {ir_attr_str("name", "w")};
  ir_type vec = {DT_F32, 1, {1, 0, 0, 0}};
  int w = ir_add_typed(g, OP_PARAM, NULL, 0, wn, 1, vec, L);
  ir_attr one = ir_attr_float("value", 1.0), two = ir_attr_float("value", 2.0);
  int c1 = ir_add_typed(g, OP_FILL, NULL, 0, &one, 1, vec, L);
  int c2 = ir_add_typed(g, OP_FILL, NULL, 0, &two, 1, vec, L);
  int a = ir_add(g, OP_MUL, (int[]){w, c1}, 2, NULL, 0, L);
  int b = ir_add(g, OP_MUL, (int[]){c1, a}, 2, NULL, 0, L);
  int c = ir_add(g, OP_MUL, (int[]){b, c2}, 2, NULL, 0, L); /* a multiply by two stays */
  int s = ir_add(g, OP_GRAD_NORM, &c, 1, NULL, 0, L);       /* any f32 scalar will do as the "loss" */
  g->outputs[0] = s;
  g->n_outputs = 1;
  CHECK(ir_verify(g, "build", stdout) == 0, "the test graph is invalid");

  /* run it through the pass manager, with dce after it, as the pipeline would */
  const pass_info table[] = {{"fold-mul-one", pass_fold_mul_one, "mul(x, 1) -> x", 1, 0},
                             {"dce", pass_dce, "remove dead ops", 1, 0}};
  pipeline_opts o = {.dump = stdout};
  CHECK(pipeline_run_table(&g, table, 2, &o, stdout) == 0, "pipeline");
  CHECK(count(g, OP_MUL) == 1, "expected the multiply by two only, found %d muls", count(g, OP_MUL));
  const ir_node *mul = &g->nodes[g->nodes[g->outputs[0]].in[0]];
  CHECK(mul->op == OP_MUL && g->nodes[mul->in[0]].op == OP_PARAM && g->nodes[mul->in[1]].op == OP_FILL &&
            ir_get_float(&g->nodes[mul->in[1]], "value", 0) == 2.0,
        "the loss should read w * 2");
  CHECK(count(g, OP_FILL) == 1, "the fill of one should be gone (dce)");
  ir_graph_free(g);
  if (failures) return 1;
  printf("test_example_pass: fold-mul-one folds x*1 and 1*x, keeps x*2\n");
  return 0;
}
