/* test_memplan.c -- the predicted memory of a graph: weights, AdamW moments, the bf16 weight
 * copies (kept between steps, a stack of them no activation) and the activation peak of the
 * liveness walk, checked against sizes computed independently. */
#include <stdio.h>

#include "frontend.h"
#include "memplan.h"
#include "params.h"
#include "pipeline.h"

#include "check.h"

static int64_t bytes_of(const ir_graph *g, int id) {
  const ir_type *t = &g->nodes[id].type;
  return ir_type_numel_bound(g, t) * (t->dtype == DT_BF16 ? 2 : t->dtype == DT_E4M3 || t->dtype == DT_E8M0 ? 1 : 4);
}

int main(void) {
  const moec_set sets[] = {{"precision", "bf16"}};
  for (int train = 0; train <= 1; train++) {
    ir_graph *g = moec_frontend_load("models/tiny.moe", sets, 1, stderr);
    pipeline_opts o = {.dump = stdout, .train = train};
    if (!g || pipeline_run(&g, &o, stderr)) return 1;
    memplan mp;
    memplan_estimate(g, &mp);
    rt_params *ps = rt_params_new(g, 1);
    int64_t largest = 0, sum = 0, copies = 0, stacks = 0;
    for (int id = 0; id < g->n_nodes; id++) {
      const ir_node *n = &g->nodes[id];
      if (n->op == OP_PARAM || n->op == OP_ADAMW) continue;
      if (n->op == OP_CAST && g->nodes[n->in[0]].op == OP_PARAM) {
        copies += bytes_of(g, id);
        continue;
      }
      if (n->op == OP_STACK && g->nodes[g->nodes[n->in[0]].in[0]].op == OP_PARAM) {
        stacks++;
        continue;
      }
      int64_t b = bytes_of(g, id);
      sum += b;
      if (b > largest) largest = b;
    }
    CHECK(mp.params == rt_params_numel(ps) * 4, "weights %lld bytes, params hold %lld values", (long long)mp.params,
          (long long)rt_params_numel(ps));
    CHECK(mp.optimizer == (train ? 2 * mp.params : 0), "AdamW moments %lld (train %d)", (long long)mp.optimizer, train);
    CHECK(mp.activations >= largest && mp.activations <= sum + (int64_t)1e9, "activation peak %lld outside [%lld, %lld]",
          (long long)mp.activations, (long long)largest, (long long)sum);
    /* freeing after the last use must beat keeping everything alive */
    CHECK(mp.activations < sum, "the liveness walk frees nothing (%lld of %lld)", (long long)mp.activations, (long long)sum);
    CHECK(mp.copies == copies && copies > 0, "bf16 copies %lld bytes, the casts of parameters make %lld",
          (long long)mp.copies, (long long)copies);
    CHECK(stacks > 0, "tiny's default pipeline stacks its expert weights");
    CHECK(mp.total == mp.params + mp.optimizer + mp.copies + mp.activations, "total");
    printf("tiny %s: weights %lld, moments %lld, activation peak %lld of %lld bytes made\n", train ? "step" : "forward",
           (long long)mp.params, (long long)mp.optimizer, (long long)mp.activations, (long long)sum);
    rt_params_free(ps);
    ir_graph_free(g);
  }
  return failures ? 1 : 0;
}
