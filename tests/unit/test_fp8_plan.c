/* test_fp8_plan.c -- which ops of an mxfp8 training step run their expert GEMMs in FP8 on the
 * GPU (gpu_fp8_plan, runtime/gpu_fp8.c), decided on the IR alone (no GPU needed):
 * - mxfp8(block = 128): every grouped GEMM op is an FP8 site; the quantizes they read write
 *   the packed form, and the exact values only where another reader needs them; the saved
 *   gate_up, read elementwise by grouped_mlp_bwd through its dequantize, is stored packed
 *   (FP8_STORE) for the dequantize to expand; a dequantize read only by sites writes
 *   nothing, and its quantize lives until the site's last use;
 * - mxfp8 block 32 (true MX, no 128-shared scales), or FP8 disabled: no site, nothing skipped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gpu_fp8.h"

#include "check.h"
#include "tiny_step.h"

static void test_block128(void) {
  ir_graph *g = tiny_step("mxfp8(block=128)");
  int *last = tiny_last_uses(g, 0), *before = tiny_last_uses(g, 0);
  gpu_fp8_plan p;
  CHECK(gpu_fp8_plan_new(g, 1, last, &p) == 0, "plan");
  int sites = 0, grouped = 0, skipped = 0, saved_store = 0, saved = 0, fwd_values = 0;
  for (int id = 0; id < g->n_nodes; id++) {
    const ir_node *n = &g->nodes[id];
    int is_grouped = n->op == OP_GROUPED_MLP || n->op == OP_GROUPED_MLP_BWD || n->op == OP_GROUPED_LINEAR_DGRAD ||
                     n->op == OP_GROUPED_LINEAR_WGRAD || n->op == OP_GROUPED_LINEAR;
    grouped += is_grouped;
    sites += p.site[id];
    CHECK(!p.site[id] || is_grouped, "%%%d (%s) is an FP8 site", id, ir_ops[n->op].name);
    for (int k = 0; p.site[id] && k < n->n_in; k++) /* the packed operands outlive the site */
      if (gpu_fp8_operand_kind(n->op, k) != FP8_NONE) {
        int q = g->nodes[n->in[k]].in[0];
        CHECK(p.kind[q] == gpu_fp8_operand_kind(n->op, k), "%%%d: operand %d's quantize %%%d packs kind %d", id, k, q, p.kind[q]);
        CHECK(last[q] >= id, "%%%d reads the packed %%%d, freed after %%%d", id, q, last[q]);
      }
    if (n->op == OP_MXFP8_DEQUANTIZE && p.skip[id]) {
      skipped++;
      int q = n->in[0];
      CHECK(p.kind[q] != FP8_NONE, "%%%d skipped, but its quantize %%%d writes no packed form", id, q);
      CHECK(last[q] >= before[id], "quantize %%%d is freed (after %%%d) before the reader of %%%d (%%%d)", q, last[q], id,
            before[id]);
    }
    if (n->op == OP_MXFP8_QUANTIZE && p.kind[id] != FP8_NONE && last[id] < g->n_nodes) {
      /* the executor frees a value at its last use only where that node reads it, directly or
         through a dequantize of it (gpu_exec_run) */
      const ir_node *u = &g->nodes[last[id]];
      int reads = 0;
      for (int k = 0; k < u->n_in; k++)
        reads |= u->in[k] == id || (g->nodes[u->in[k]].op == OP_MXFP8_DEQUANTIZE && g->nodes[u->in[k]].in[0] == id);
      CHECK(reads, "packed %%%d's last use %%%d (%s) does not read it: it would never be freed", id, last[id],
            ir_ops[u->op].name);
    }
    if (n->op == OP_MXFP8_QUANTIZE) {
      const char *role = ir_get_str(n, "role", "");
      if (strstr(role, "saved")) saved++, saved_store += p.kind[id] == FP8_STORE && !p.values[id];
      else fwd_values += p.values[id];
      CHECK(p.values[id] || p.kind[id] != FP8_NONE, "quantize %%%d writes neither values nor a packed form", id);
    }
  }
  CHECK(grouped > 0 && sites == grouped, "%d of %d grouped GEMM ops run in FP8", sites, grouped);
  CHECK(saved > 0 && saved_store == saved, "%d of %d saved quantizes stored packed (their dequantize expands them)",
        saved_store, saved);
  CHECK(fwd_values == 0, "%d GEMM-only quantizes also write their exact values", fwd_values);
  /* per layer 12 MXFP8 operands of the experts' GEMMs and 4 x 6 of the attention projections'
     (forward, dgrad, wgrad); the saved gate_up's dequantize feeds grouped_mlp_bwd's elementwise part */
  CHECK(skipped == 2 * (12 + 24) - saved, "%d dequantizes skipped, want %d", skipped, 2 * (12 + 24) - saved);
  printf("mxfp8(block=128): %d FP8 sites, %d dequantizes skipped, %d saved values stored packed\n", sites, skipped,
         saved_store);
  gpu_fp8_plan_free(&p);
  /* disabled */
  CHECK(gpu_fp8_plan_new(g, 0, last, &p) == 0, "plan");
  int any = 0;
  for (int id = 0; id < g->n_nodes; id++) any += p.site[id] + p.skip[id] + (p.kind[id] != 0) + !p.values[id];
  CHECK(any == 0, "FP8 disabled, yet %d marks", any);
  gpu_fp8_plan_free(&p);
  free(last), free(before);
  ir_graph_free(g);
}

static void test_block32(void) {
  ir_graph *g = tiny_step("mxfp8");
  int *last = tiny_last_uses(g, 0);
  gpu_fp8_plan p;
  CHECK(gpu_fp8_plan_new(g, 1, last, &p) == 0, "plan");
  int any = 0;
  for (int id = 0; id < g->n_nodes; id++) any += p.site[id] + p.skip[id];
  CHECK(any == 0, "block 32: %d FP8 sites or skips (only 128-shared scales run as FP8 on Hopper)", any);
  printf("mxfp8 block 32: no FP8 sites (true MX blocks stay on the bf16 GEMMs)\n");
  gpu_fp8_plan_free(&p);
  free(last);
  ir_graph_free(g);
}

int main(void) {
  test_block128();
  test_block32();
  if (failures) {
    printf("test_fp8_plan: %d failures\n", failures);
    return 1;
  }
  printf("test_fp8_plan: ok\n");
  return 0;
}
