/* test_views_plan.c -- which values the GPU executor reads through their input instead of
 * writing them (gpu_views_plan, runtime/gpu_views.c), decided on the IR alone (no GPU):
 * - mxfp8(block = 128), tiny's fused step: grouped_mlp_bwd's f32 pieces are slice windows, cast
 *   views read by FP8-packing quantizes; the saved gate_up's slice is a window read by its
 *   quantize, which stores it packed (its dequantize expands it: no alias); without FP8 GEMMs
 *   a dequantize is an alias; the down projection's weight gradients are slabs;
 * - every view's chain lives until the view's readers, no view is a graph output, and every
 *   reader of a window or cast view is one that can read in place;
 * - the gate/up weight gradients are strided windows read by adamw and grad_norm alone; the
 *   expert weights' stacks read the parameters' persistent bf16 copies (stacked views), each of
 *   their casts writes nothing, and no AdamW of those parameters runs before the stack's last
 *   reader;
 * - without FP8 (bf16) no cast view, the other kinds still;
 * - a stack one of whose casts another op reads too (before the stack) is no stacked view;
 * - where the grouped GEMMs run on cuBLASLt, each grouped_mlp_bwd writes its pieces apart
 *   (split): its readers are all pieces, a dg | du or act piece is read only by casts, which
 *   are aliases; the saved gate_up's slice (bf16) is a window grouped_mlp_bwd reads; with the
 *   device grouped GEMMs (blas 0) neither. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gpu_views.h"

#include "check.h"
#include "tiny_step.h"

/* Counts of each view kind in g's plan (fp8 on or off, cuBLASLt grouped GEMMs or not), after
 * checking its invariants. */
static void check_plan(const char *precision, int fp8_on, int blas, int gather, int split_q, int cols_view,
                       int counts[VIEW_KINDS]) {
  ir_graph *g = tiny_step(precision);
  int *last = tiny_last_uses(g, 1), *orig = tiny_last_uses(g, 1);
  gpu_fp8_plan p;
  CHECK(gpu_fp8_plan_new(g, fp8_on, last, &p) == 0, "fp8 plan");
  for (int id = 0; id < g->n_nodes; id++) orig[id] = last[id]; /* as the FP8 plan leaves them */
  uint8_t *view = calloc((size_t)g->n_nodes + 1, 1);
  gpu_views_plan(g, &p, blas, gather, split_q, cols_view, last, view);
  /* an expert permute's input and perm live past the permute only for a gather, and then to
     its last quantize exactly */
  for (int id = 0; id < g->n_nodes; id++) {
    const ir_node *n = &g->nodes[id];
    if (n->op != OP_EXPERT_PERMUTE) continue;
    CHECK(gather || view[id] != VIEW_GATHER, "%%%d gathers with the gather off", id);
    for (int j = 0; j < 2; j++) {
      const int v = n->in[j], want = view[id] == VIEW_GATHER && last[id] > orig[v] ? last[id] : orig[v];
      CHECK(last[v] == want, "%%%d's operand %%%d lives to %%%d, want %%%d (gather %s)", id, v, last[v], want,
            view[id] == VIEW_GATHER ? "on" : "off");
    }
  }
  memset(counts, 0, VIEW_KINDS * sizeof *counts);
  for (int id = 0; id < g->n_nodes; id++) counts[view[id]]++;
  for (int i = 0; i < g->n_outputs; i++) CHECK(!view[g->outputs[i]], "output %%%d is a view", g->outputs[i]);
  for (int id = 0; id < g->n_nodes; id++) {
    const ir_node *n = &g->nodes[id];
    for (int j = 0; j < n->n_in; j++) {
      int v = n->in[j];
      if (view[v] == VIEW_CAST)
        CHECK(n->op == OP_MXFP8_QUANTIZE && p.kind[id] != FP8_NONE && !p.values[id],
              "%%%d (%s) reads the cast view %%%d but packs nothing", id, ir_ops[n->op].name, v);
      if (view[v] == VIEW_WINDOW)
        CHECK(n->op == OP_CAST || (n->op == OP_MXFP8_QUANTIZE && (p.kind[id] == FP8_NONE || p.kind[id] == FP8_STORE)) ||
                  (n->op == OP_MXFP8_QUANTIZE && !p.values[id] &&
                   ((p.kind[id] == FP8_ROWS && n->n_in == 1) || p.kind[id] == FP8_COLS)) ||
                  (n->op == OP_GROUPED_MLP_BWD && j == 1 && blas) || (n->op == OP_EXPERT_UNPERMUTE && j == 0),
              "%%%d (%s) reads the window %%%d", id, ir_ops[n->op].name, v);
      if (view[v] == VIEW_SPLIT) CHECK(view[id] == VIEW_PIECE, "%%%d (%s) reads the split %%%d", id, ir_ops[n->op].name, v);
      if (view[v] == VIEW_PIECE && ir_get_int(&g->nodes[v], "start", 0) < 3 * ir_get_int(&g->nodes[g->nodes[v].in[0]], "ffn", 0))
        CHECK(n->op == OP_CAST && n->type.dtype == DT_BF16 && view[id] == VIEW_ALIAS,
              "%%%d (%s) reads the bf16 piece %%%d but is no alias cast", id, ir_ops[n->op].name, v);
      if (view[v] == VIEW_STRIDED)
        CHECK(n->op == OP_GRAD_NORM || (n->op == OP_ADAMW && j == 1), "%%%d (%s) reads the strided gradient %%%d", id,
              ir_ops[n->op].name, v);
      if (view[v] == VIEW_IN_STACK)
        CHECK(n->op == OP_STACK && view[id] == VIEW_STACKED, "%%%d (%s) reads the stacked cast %%%d", id,
              ir_ops[n->op].name, v);
      if (view[v] == VIEW_STACKED)
        for (int k = 0; k < g->nodes[v].n_in; k++) {
          int par = g->nodes[g->nodes[v].in[k]].in[0];
          for (int a = 0; a < id; a++)
            CHECK(!(g->nodes[a].op == OP_ADAMW && g->nodes[a].in[0] == par),
                  "%%%d reads the stacked %%%d after %%%d updated its parameter %%%d", id, v, a, par);
        }
      for (int u = v; view[u] && view[u] < VIEW_STACKED; u = g->nodes[u].in[0])
        CHECK(last[g->nodes[u].in[0]] >= id, "%%%d reads view %%%d, whose link %%%d is freed after %%%d", id, v,
              g->nodes[u].in[0], last[g->nodes[u].in[0]]);
    }
    if (view[id] == VIEW_ALIAS) CHECK(!p.skip[id], "%%%d: a skipped dequantize made an alias", id);
    if (view[id] == VIEW_GATHER) {
      CHECK(n->op == OP_EXPERT_PERMUTE && n->n_in == 2, "%%%d (%s) gathers, but is no unweighted expert_permute", id,
            ir_ops[n->op].name);
      for (int r = id + 1; r < g->n_nodes; r++)
        for (int j = 0; j < g->nodes[r].n_in; j++)
          if (g->nodes[r].in[j] == id) {
            CHECK(g->nodes[r].op == OP_MXFP8_QUANTIZE && j == 0 && !p.values[r] &&
                      (p.kind[r] == FP8_ROWS || p.kind[r] == FP8_COLS),
                  "%%%d (%s) reads the gathered %%%d but packs nothing", r, ir_ops[g->nodes[r].op].name, id);
            CHECK(last[n->in[0]] >= r && last[n->in[1]] >= r, "%%%d gathers through %%%d, whose input or perm is freed first",
                  r, id);
          }
    }
    if (view[id] == VIEW_SPLIT_Q) { /* the rows quantize of a split's dg | du, one a split */
      const int c = n->in[0], pc = c ? g->nodes[c].in[0] : 0, G = gpu_view_root(g, view, c);
      CHECK(n->op == OP_MXFP8_QUANTIZE && p.kind[id] == FP8_ROWS && !p.values[id] && view[c] == VIEW_ALIAS &&
                view[pc] == VIEW_PIECE && ir_get_int(&g->nodes[pc], "start", -1) == 0 && view[G] == VIEW_SPLIT,
            "%%%d (%s) is quantized by a split, but is no packing rows quantize of a split's dg | du", id, ir_ops[n->op].name);
      for (int o = G + 1; o < id; o++)
        CHECK(view[o] != VIEW_SPLIT_Q || gpu_view_root(g, view, g->nodes[o].in[0]) != G,
              "split %%%d quantizes both %%%d and %%%d", G, o, id);
    }
    if (view[id] == VIEW_SPLIT_FP8) { /* a columns quantize of a split's dg | du or act, whose piece only it and the
                                         split's rows quantize read */
      const int c = n->in[0], pc = c ? g->nodes[c].in[0] : 0, G = gpu_view_root(g, view, c);
      CHECK(n->op == OP_MXFP8_QUANTIZE && p.kind[id] == FP8_COLS && !p.values[id] && view[c] == VIEW_ALIAS &&
                view[pc] == VIEW_PIECE && view[G] == VIEW_SPLIT && n->in[1] == g->nodes[G].in[3],
            "%%%d (%s) is quantized by a split, but is no packing columns quantize of a split's piece", id, ir_ops[n->op].name);
      int both[2];
      CHECK(gpu_split_fp8(g, view, G, both) && (both[0] == id || both[1] == id), "split %%%d does not name %%%d", G, id);
      for (int r = pc + 1; r < g->n_nodes; r++)
        for (int j = 0; j < g->nodes[r].n_in; j++) {
          const int v = g->nodes[r].in[j];
          CHECK(!(v == pc && r != c) && !(v == c && r != id && view[r] != VIEW_SPLIT_Q),
                "%%%d reads %%%d, a piece the split %%%d never writes", r, v, G);
        }
    }
    if (view[id] == VIEW_COLS) { /* a slice of a plain value, read only by rope (its x) and matmuls, to its last one */
      CHECK(cols_view && n->op == OP_SLICE_COLS && view[n->in[0]] == VIEW_NONE,
            "%%%d (%s) is a column view, but no slice of a plain value", id, ir_ops[n->op].name);
      for (int r = id + 1; r < g->n_nodes; r++)
        for (int j = 0; j < g->nodes[r].n_in; j++)
          if (g->nodes[r].in[j] == id) {
            CHECK((g->nodes[r].op == OP_ROPE && j == 0) || g->nodes[r].op == OP_MATMUL,
                  "%%%d (%s) reads the column view %%%d but takes no row stride", r, ir_ops[g->nodes[r].op].name, id);
            CHECK(last[n->in[0]] >= r, "%%%d reads the column view %%%d, whose input is freed first", r, id);
          }
    }
    if (view[id] == VIEW_STACKED)
      for (int j = 0; j < n->n_in; j++)
        CHECK(view[n->in[j]] == VIEW_IN_STACK && g->nodes[g->nodes[n->in[j]].in[0]].op == OP_PARAM,
              "stacked %%%d: operand %%%d is not a parameter's cast in the stack", id, n->in[j]);
    if (n->op == OP_MXFP8_DEQUANTIZE && p.kind[n->in[0]] == FP8_STORE)
      CHECK(!view[id] || view[id] == VIEW_DECODE, "%%%d expands the stored %%%d, yet is a view", id, n->in[0]);
    if (view[id] == VIEW_DECODE) {
      CHECK(n->op == OP_MXFP8_DEQUANTIZE && p.kind[n->in[0]] == FP8_STORE, "%%%d decodes, but reads no stored quantize", id);
      for (int r = id + 1; r < g->n_nodes; r++)
        for (int j = 0; j < g->nodes[r].n_in; j++)
          if (g->nodes[r].in[j] == id) {
            CHECK(g->nodes[r].op == OP_GROUPED_MLP_BWD && j == 1 && view[r] == VIEW_SPLIT,
                  "%%%d (%s) reads the decoded %%%d but is no split grouped_mlp_bwd", r, ir_ops[g->nodes[r].op].name, id);
            CHECK(last[n->in[0]] >= r, "%%%d decodes %%%d, which is freed after %%%d", r, n->in[0], last[n->in[0]]);
          }
    }
  }
  if (!blas) CHECK(!counts[VIEW_SPLIT] && !counts[VIEW_PIECE], "%s: a split without cuBLASLt", precision);
  printf("%-18s fp8 %s blas %d: %d windows, %d aliases, %d cast views, %d slabs, %d strided, %d stacked (%d casts), "
         "%d split (%d pieces, %d + %d quantized by them), %d decoded, %d gathered, %d column views\n",
         precision, fp8_on ? "on " : "off", blas, counts[VIEW_WINDOW], counts[VIEW_ALIAS], counts[VIEW_CAST], counts[VIEW_SLAB],
         counts[VIEW_STRIDED], counts[VIEW_STACKED], counts[VIEW_IN_STACK], counts[VIEW_SPLIT], counts[VIEW_PIECE],
         counts[VIEW_SPLIT_Q], counts[VIEW_SPLIT_FP8], counts[VIEW_DECODE], counts[VIEW_GATHER], counts[VIEW_COLS]);
  free(view);
  free(last);
  free(orig);
  gpu_fp8_plan_free(&p);
  ir_graph_free(g);
}

static ir_type ty2(ir_dtype dt, int64_t a, int64_t b) {
  ir_type t;
  memset(&t, 0, sizeof t);
  t.dtype = dt, t.rank = 2, t.dims[0] = a, t.dims[1] = b;
  return t;
}

/* Two experts' weights, cast and stacked; in the second graph expert 0's cast also feeds a
 * silu ahead of the stack (as a naive graph might), so its value must exist. */
static void check_shared_cast(void) {
  for (int shared = 0; shared <= 1; shared++) {
    ir_loc L = {"t.moe", 1, 1};
    ir_graph *g = ir_graph_new("t");
    int cast[2];
    for (int e = 0; e < 2; e++) {
      char name[32];
      snprintf(name, sizeof name, "w%d", e);
      ir_attr a[] = {ir_attr_str("name", name), ir_attr_str("init", "normal"), ir_attr_float("std", 0.02),
                     ir_attr_int("expert", e)};
      int w = ir_add_typed(g, OP_PARAM, NULL, 0, a, 4, ty2(DT_F32, 8, 16), L);
      cast[e] = ir_add_typed(g, OP_CAST, &w, 1, NULL, 0, ty2(DT_BF16, 8, 16), L);
    }
    int other = shared ? ir_add(g, OP_SILU, &cast[0], 1, NULL, 0, L) : -1;
    int st = ir_add(g, OP_STACK, cast, 2, (ir_attr[]){ir_attr_int("experts", 2)}, 1, L);
    int out = ir_add(g, OP_SILU, &st, 1, NULL, 0, L);
    CHECK(st >= 0 && out >= 0 && (!shared || other >= 0), "building the stack graph: %s", g->err);
    g->outputs[g->n_outputs++] = out;
    if (shared) g->outputs[g->n_outputs++] = other;
    int *last = tiny_last_uses(g, 1);
    gpu_fp8_plan p;
    CHECK(gpu_fp8_plan_new(g, 0, last, &p) == 0, "fp8 plan");
    uint8_t *view = calloc((size_t)g->n_nodes + 1, 1);
    gpu_views_plan(g, &p, 1, 1, 1, 1, last, view);
    CHECK(view[st] == (shared ? VIEW_NONE : VIEW_STACKED), "stack with %s cast: view %d", shared ? "a shared" : "private",
          view[st]);
    CHECK(view[cast[0]] == (shared ? VIEW_NONE : VIEW_IN_STACK), "expert 0's cast (%s): view %d",
          shared ? "also read by silu" : "read by the stack only", view[cast[0]]);
    free(view);
    free(last);
    gpu_fp8_plan_free(&p);
    ir_graph_free(g);
  }
  printf("a stack of private casts is a stacked view; with a cast read elsewhere too, none\n");
}

int main(void) {
  int c[VIEW_KINDS];
  check_shared_cast();
  /* with the device grouped GEMMs (blas 0): no split, no gate_up window */
  check_plan("mxfp8(block=128)", 1, 0, 1, 2, 1, c);
  /* the saved gate_up is stored packed (FP8_STORE): its dequantize expands it, no alias */
  CHECK(c[VIEW_WINDOW] > 0 && c[VIEW_ALIAS] == 0 && c[VIEW_CAST] > 0 && c[VIEW_SLAB] > 0,
        "mxfp8(block=128) with FP8: windows, cast views and slabs, no alias");
  /* tiny: 2 layers x (gate_up, down) stacks of 4 experts and the 4 attention projections'
     one-group stacks (mxfp8-projections); 2 x 8 gate/up gradient windows */
  CHECK(c[VIEW_STACKED] == 4 + 2 * 4 && c[VIEW_IN_STACK] == 4 * 4 + 2 * 4 + 2 * 4 && c[VIEW_STRIDED] == 2 * 8,
        "mxfp8(block=128): %d stacked weights of %d casts, %d strided gradients; want 12, 32, 16", c[VIEW_STACKED],
        c[VIEW_IN_STACK], c[VIEW_STRIDED]);
  check_plan("mxfp8(block=128)", 0, 0, 1, 2, 1, c);
  CHECK(c[VIEW_CAST] == 0 && c[VIEW_ALIAS] > 0, "without FP8 GEMMs: no cast view, dequantize aliases");
  check_plan("bf16", 0, 0, 1, 2, 1, c);
  CHECK(c[VIEW_CAST] == 0 && c[VIEW_ALIAS] == 0 && c[VIEW_WINDOW] > 0 && c[VIEW_SLAB] > 0 && c[VIEW_STACKED] == 4 &&
            c[VIEW_STRIDED] == 16,
        "bf16: windows, slabs, strided gradients and stacked weights only");
  /* on cuBLASLt (the default): tiny's 2 grouped_mlp_bwd split, 3 pieces each, the casts of
     dg | du and act aliases; in bf16 the saved gate_up's slices are windows */
  check_plan("bf16", 0, 1, 1, 2, 1, c);
  CHECK(c[VIEW_SPLIT] == 2 && c[VIEW_PIECE] == 2 * 3 && c[VIEW_ALIAS] == 2 * 2 && c[VIEW_CAST] == 0 && c[VIEW_WINDOW] >= 2,
        "bf16 on cuBLASLt: 2 splits of 3 pieces, 4 alias casts, gate_up windows");
  check_plan("mxfp8(block=128)", 1, 1, 1, 2, 1, c);
  CHECK(c[VIEW_SPLIT] == 2 && c[VIEW_PIECE] == 2 * 3 && c[VIEW_CAST] == 0 && c[VIEW_ALIAS] == 2 * 2,
        "mxfp8(block=128) with FP8 on cuBLASLt: the pieces' casts (cast views before) are aliases");
  /* and the stored gate_up of each layer is decoded by its split backward, never expanded */
  CHECK(c[VIEW_DECODE] == 2, "mxfp8(block=128) with FP8 on cuBLASLt: %d decoded gate_ups, want 2", c[VIEW_DECODE]);
  /* each layer's xs (forward) and dy (backward) permutes, read only by their FP8 row and column quantizes */
  CHECK(c[VIEW_GATHER] == 2 * 2, "mxfp8(block=128) with FP8 on cuBLASLt: %d gathered permutes, want 4", c[VIEW_GATHER]);
  /* each layer's MoE output y (a slice of grouped_mlp's output) read in place by expert_unpermute,
     and its dv (a slice of attention_bwd's output) by the v projection's FP8 row and column quantizes */
  CHECK(c[VIEW_WINDOW] == 2 + 2 + 2, "mxfp8(block=128) with FP8 on cuBLASLt: %d windows, want 6 (gate_up, y, dv)",
        c[VIEW_WINDOW]);
  /* and each split quantizes its dg | du for the dgrad GEMM itself */
  CHECK(c[VIEW_SPLIT_Q] == 2, "mxfp8(block=128) with FP8 on cuBLASLt: %d rows quantizes made by splits, want 2", c[VIEW_SPLIT_Q]);
  /* and the expert columns of its dg | du and act (the wgrad GEMMs' operands), so it has no bf16 piece */
  CHECK(c[VIEW_SPLIT_FP8] == 2 * 2, "mxfp8(block=128) with FP8 on cuBLASLt: %d columns quantizes made by splits, want 4",
        c[VIEW_SPLIT_FP8]);
  /* and each layer's dq and dk (slices of attention_bwd's output) read in place by the inverse
     ropes (dv, read only by FP8 quantizes, is a window above) */
  CHECK(c[VIEW_COLS] == 2 * 2, "mxfp8(block=128) with FP8 on cuBLASLt: %d column views, want 4 (dq, dk)", c[VIEW_COLS]);
  check_plan("mxfp8(block=128)", 1, 1, 1, 2, 0, c); /* MOEC_COLS_VIEW=0 */
  CHECK(c[VIEW_COLS] == 0 && c[VIEW_WINDOW] == 2 + 2, "the column views off: %d, want 0, and the windows but dv's: %d",
        c[VIEW_COLS], c[VIEW_WINDOW]);
  check_plan("mxfp8(block=128)", 1, 1, 1, 1, 1, c); /* MOEC_SPLIT_FP8=0: the rows quantizes only */
  CHECK(c[VIEW_SPLIT_Q] == 2 && c[VIEW_SPLIT_FP8] == 0, "MOEC_SPLIT_FP8=0: %d rows and %d columns quantizes made by splits, want 2, 0",
        c[VIEW_SPLIT_Q], c[VIEW_SPLIT_FP8]);
  check_plan("mxfp8(block=128)", 1, 1, 0, 0, 1, c); /* MOEC_GATHER=0 MOEC_SPLIT_Q=0: no such views, no longer lives */
  CHECK(c[VIEW_GATHER] == 0 && c[VIEW_SPLIT_Q] == 0 && c[VIEW_SPLIT_FP8] == 0 && c[VIEW_SPLIT] == 2,
        "the gather and split quantize off: %d gathered permutes, %d quantized by splits, want 0", c[VIEW_GATHER],
        c[VIEW_SPLIT_Q]);
  check_plan("mxfp8(block=128)", 0, 1, 1, 2, 1, c);
  CHECK(c[VIEW_GATHER] == 0 && c[VIEW_SPLIT_Q] == 0,
        "without FP8 GEMMs (quantizes that write values): %d gathered permutes, %d quantized by splits, want 0",
        c[VIEW_GATHER], c[VIEW_SPLIT_Q]);
  if (failures) {
    printf("test_views_plan: %d failures\n", failures);
    return 1;
  }
  printf("test_views_plan: ok\n");
  return 0;
}
