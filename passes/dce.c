/* dce.c -- dead code elimination: drops every op whose result reaches no graph output, and
 * renumbers the survivors densely, keeping their order. */
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"

int pass_dce(ir_graph **gp, FILE *err) {
  ir_graph *g = *gp;
  (void)err;
  char *live = calloc((size_t)g->n_nodes + 1, 1);
  int *renum = malloc(((size_t)g->n_nodes + 1) * sizeof *renum);
  if (!live || !renum) {
    free(live);
    free(renum);
    fprintf(err, "moec: error: out of memory in dce\n");
    return -1;
  }
  for (int i = 0; i < g->n_outputs; i++) live[g->outputs[i]] = 1;
  for (int id = 0; id < g->n_nodes; id++)
    if (ir_op_has_effect(g->nodes[id].op)) live[id] = 1;
  for (int id = g->n_nodes - 1; id >= 0; id--)
    if (live[id])
      for (int j = 0; j < g->nodes[id].n_in; j++) live[g->nodes[id].in[j]] = 1;
  int k = 0;
  for (int id = 0; id < g->n_nodes; id++) {
    if (!live[id]) continue;
    ir_node n = g->nodes[id];
    for (int j = 0; j < n.n_in; j++) n.in[j] = renum[n.in[j]];
    renum[id] = k;
    g->nodes[k++] = n;
  }
  g->n_nodes = k;
  for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = renum[g->outputs[i]];
  free(live);
  free(renum);
  return 0;
}
