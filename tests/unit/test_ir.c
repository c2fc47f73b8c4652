/* test_ir.c -- IR builders, shape rules, verifier, printer and dce on hand-built graphs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "pipeline.h"

#include "check.h"

static ir_type ty(ir_dtype dt, int rank, int64_t a, int64_t b) { return (ir_type){dt, rank, {a, b, 0, 0}}; }

static char *print_to_string(const ir_graph *g) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ir_print(g, f);
  fclose(f);
  return buf;
}

int main(void) {
  ir_loc L = {"t.moe", 3, 5};
  ir_graph *g = ir_graph_new("t");
  ir_attr tok_name = ir_attr_str("name", "tokens"), lab_name = ir_attr_str("name", "labels");
  int tokens = ir_add_typed(g, OP_INPUT, NULL, 0, &tok_name, 1, ty(DT_I32, 1, 8, 0), L);
  int labels = ir_add_typed(g, OP_INPUT, NULL, 0, &lab_name, 1, ty(DT_I32, 1, 8, 0), L);
  ir_attr emb_attrs[] = {ir_attr_str("name", "model.embed_tokens.weight"), ir_attr_str("init", "normal"),
                         ir_attr_float("std", 0.02)};
  int table = ir_add_typed(g, OP_PARAM, NULL, 0, emb_attrs, 3, ty(DT_F32, 2, 16, 4), L);
  int x = ir_add(g, OP_EMBEDDING, (int[]){table, tokens}, 2, NULL, 0, L);
  CHECK(x >= 0, "embedding: %s", g->err);
  ir_attr wn = ir_attr_str("name", "lm_head.weight");
  int w = ir_add_typed(g, OP_PARAM, NULL, 0, &wn, 1, ty(DT_F32, 2, 4, 16), L);
  int logits = ir_add(g, OP_LINEAR, (int[]){x, w}, 2, NULL, 0, L);
  CHECK(logits >= 0 && g->nodes[logits].type.dims[0] == 8 && g->nodes[logits].type.dims[1] == 16, "linear type");
  /* shape errors are caught by the builder, with a message naming the op */
  int bad = ir_add(g, OP_LINEAR, (int[]){x, table}, 2, NULL, 0, L);
  CHECK(bad == -1 && strstr(g->err, "linear: x has 4 columns but the weight has 16 rows"), "bad linear: %s", g->err);
  CHECK(ir_add(g, OP_TOPK, (int[]){logits}, 1, (ir_attr[]){ir_attr_int("k", 17)}, 1, L) == -1 &&
            strstr(g->err, "k = 17 is more than the 16 experts"), "topk k>E: %s", g->err);
  CHECK(ir_add(g, OP_ADD, (int[]){x, 99}, 2, NULL, 0, L) == -1 && strstr(g->err, "not defined"), "undefined operand: %s", g->err);
  /* an i32 fill (a one-group GEMM's row count) holds an integer in i32's range */
  ir_graph *gf = ir_graph_new("fills");
  ir_attr half = ir_attr_float("value", 2.5), big = ir_attr_float("value", 3e9), rows = ir_attr_float("value", 8);
  CHECK(ir_add_typed(gf, OP_FILL, NULL, 0, &half, 1, ty(DT_I32, 1, 1, 0), L) == -1 && strstr(gf->err, "integer value"),
        "i32 fill of 2.5: %s", gf->err);
  CHECK(ir_add_typed(gf, OP_FILL, NULL, 0, &big, 1, ty(DT_I32, 1, 1, 0), L) == -1, "i32 fill of 3e9 accepted");
  CHECK(ir_add_typed(gf, OP_FILL, NULL, 0, &rows, 1, ty(DT_I32, 1, 1, 0), L) >= 0, "i32 fill of 8: %s", gf->err);
  ir_graph_free(gf);
  int unused = ir_add(g, OP_SILU, &x, 1, NULL, 0, L);
  int ce = ir_add(g, OP_CROSS_ENTROPY, (int[]){logits, labels}, 2, NULL, 0, L);
  CHECK(ce >= 0 && g->nodes[ce].type.rank == 0, "cross_entropy scalar");
  g->outputs[0] = ce;
  g->n_outputs = 1;

  FILE *devnull = fopen("/dev/null", "w");
  CHECK(ir_verify(g, "test", devnull) == 0, "valid graph verifies");
  char *text = print_to_string(g);
  CHECK(strstr(text, "%5 = linear(%3, %4) : f32[8,16] loc(\"t.moe\":3:5)") != NULL, "printer line:\n%s", text);
  CHECK(strstr(text, "{name=\"model.embed_tokens.weight\", init=\"normal\", std=0.0199999996}") ||
            strstr(text, "{name=\"model.embed_tokens.weight\", init=\"normal\", std=0.02}"),
        "attrs printed:\n%s", text);
  free(text);

  /* a corrupted type is reported by the verifier, naming the pass and the node */
  g->nodes[logits].type.dims[1] = 15;
  char *errs = NULL;
  size_t errlen = 0;
  FILE *ef = open_memstream(&errs, &errlen);
  int problems = ir_verify(g, "broken-pass", ef);
  fclose(ef);
  CHECK(problems >= 1 && strstr(errs, "error: IR invalid after pass broken-pass: %5 = linear(%3, %4)") &&
            strstr(errs, "result type should be f32[8,16]"),
        "verifier message:\n%s", errs);
  free(errs);
  g->nodes[logits].type.dims[1] = 16;

  /* dce drops the unused silu and keeps the rest in order */
  int before = g->n_nodes;
  CHECK(unused >= 0, "silu built");
  CHECK(pass_dce(&g, devnull) == 0 && g->n_nodes == before - 1, "dce removed one op (%d -> %d)", before, g->n_nodes);
  CHECK(ir_verify(g, "dce", devnull) == 0, "valid after dce");
  CHECK(g->nodes[g->outputs[0]].op == OP_CROSS_ENTROPY, "output renumbered");

  /* symbols print by name */
  int64_t n0 = ir_sym_new(g, "n0_1", 8);
  ir_type t = ty(DT_F32, 2, n0, 4);
  char buf[64];
  CHECK(strcmp(ir_type_str(g, &t, buf, sizeof buf), "f32[n0_1,4]") == 0, "sym type %s", buf);
  CHECK(ir_dim_bound(g, n0) == 8, "sym bound");

  /* dot export names every node */
  char *dot = NULL;
  size_t dl = 0;
  FILE *df = open_memstream(&dot, &dl);
  ir_print_dot(g, df);
  fclose(df);
  CHECK(strstr(dot, "digraph") && strstr(dot, "cross_entropy") && strstr(dot, "-> out0"), "dot:\n%s", dot);
  free(dot);
  fclose(devnull);
  ir_graph_free(g);
  if (failures) return 1;
  printf("test_ir: builders, shape rules, verifier, printer, dce, dot: ok\n");
  return 0;
}
