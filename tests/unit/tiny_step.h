/* tiny_step.h -- what the plan tests share (test_fp8_plan, test_views_plan): tiny's training
 * step at a precision, through the default pipeline, and each value's last use as the GPU
 * executor computes it before planning. Include once per test program. */
#ifndef MOEC_TINY_STEP_H
#define MOEC_TINY_STEP_H

#include <stdio.h>
#include <stdlib.h>

#include "frontend.h"
#include "pipeline.h"

static ir_graph *tiny_step(const char *precision) {
  const moec_set sets[] = {{"hidden", "128"}, {"ffn", "256"}, {"seq", "16"}, {"batch", "2"}, {"precision", precision}};
  ir_graph *g = moec_frontend_load("models/tiny.moe", sets, 5, stderr);
  pipeline_opts o = {.train = 1};
  if (!g || pipeline_run(&g, &o, stderr) != 0) {
    printf("cannot build the %s step of models/tiny.moe\n", precision);
    exit(1);
  }
  return g;
}

/* (n_nodes + 1) last reader of each value (itself when none); outputs live to the end when
 * outputs_live. */
static int *tiny_last_uses(const ir_graph *g, int outputs_live) {
  int *last = malloc(((size_t)g->n_nodes + 1) * sizeof *last);
  if (!last) exit(1);
  for (int id = 0; id < g->n_nodes; id++) {
    last[id] = id;
    for (int j = 0; j < g->nodes[id].n_in; j++) last[g->nodes[id].in[j]] = id;
  }
  for (int i = 0; outputs_live && i < g->n_outputs; i++) last[g->outputs[i]] = g->n_nodes;
  return last;
}

#endif
