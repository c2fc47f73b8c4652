/* test_ckpt_layout.c -- after group-linear the expert weights reach their GEMMs through `stack`;
 * the checkpoint writer must still see them as linear weights (stored [in, out], written in
 * Hugging Face's [out, in]). Every rank-2 parameter of the default training step is a linear
 * weight for train.c exactly when it is one in the naive step. */
#include <stdio.h>
#include <string.h>

#include "frontend.h"
#include "pipeline.h"
#include "train.h"

static ir_graph *step(const char *passes) {
  const moec_set sets[] = {{"hidden", "32"}, {"ffn", "48"}, {"seq", "16"}, {"batch", "2"}};
  ir_graph *g = moec_frontend_load("models/tiny.moe", sets, 4, stderr);
  pipeline_opts o = {.passes = passes, .dump = stdout, .train = 1};
  if (!g || pipeline_run(&g, &o, stderr)) return NULL;
  return g;
}

static int is_linear(const ir_graph *g, const char *name) {
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == OP_PARAM && strcmp(ir_get_str(&g->nodes[i], "name", ""), name) == 0)
      return train_param_is_linear_weight(g, i);
  return -1;
}

int main(void) {
  ir_graph *naive = step("autodiff,dce"), *fused = step(NULL);
  if (!naive || !fused) return 1;
  int failures = 0, n = 0;
  for (int i = 0; i < naive->n_nodes; i++) {
    const ir_node *p = &naive->nodes[i];
    if (p->op != OP_PARAM || p->type.rank != 2) continue;
    const char *name = ir_get_str(p, "name", "");
    int a = train_param_is_linear_weight(naive, i), b = is_linear(fused, name);
    n++;
    if (a != b) {
      printf("FAIL: %s: linear weight %d in the naive step, %d after the fusion passes\n", name, a, b);
      failures++;
    }
  }
  printf("test_ckpt_layout: %d rank-2 parameters, %d laid out differently\n", n, failures);
  ir_graph_free(naive);
  ir_graph_free(fused);
  return failures != 0;
}
