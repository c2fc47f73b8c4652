/* gpu_views.c -- see gpu_views.h. */
#include "gpu_views.h"

static int64_t cols(const ir_node *n) { return n->type.rank >= 2 ? n->type.dims[n->type.rank - 1] : 1; }

/* A reader that can take a slice_cols' window in place: a cast (copy_cols converts the window)
 * or a rank-2 mxfp8_quantize along the rows that only writes values (qdq_cols) or stores them
 * packed (quantize_win). */
static int reads_window(const ir_graph *g, const gpu_fp8_plan *fp8, int id) {
  const ir_node *n = &g->nodes[id];
  if (n->op == OP_CAST) return 1;
  return n->op == OP_MXFP8_QUANTIZE && n->n_in == 1 && (fp8->kind[id] == FP8_NONE || fp8->kind[id] == FP8_STORE) &&
         n->type.rank == 2 && ir_get_int(n, "axis", 0) == 1;
}

/* A reader that can take a cast view's input in place: a quantize that only packs (rows along
 * the last axis, or expert columns) and rounds to bf16 as it reads. */
static int reads_cast(const ir_graph *g, const gpu_fp8_plan *fp8, int id) {
  const ir_node *n = &g->nodes[id];
  int k = fp8->kind[id];
  return n->op == OP_MXFP8_QUANTIZE && !fp8->values[id] && ((k == FP8_ROWS && n->n_in == 1) || k == FP8_COLS);
}

/* The candidates:
 * - slice_cols read only in place (grouped_mlp_bwd's f32 pieces, cast to bf16 for the GEMMs;
 *   grouped_mlp's saved gate_up, quantized);
 * - an mxfp8_dequantize that no FP8 site skips, e4m3 -> bf16;
 * - a cast f32 -> bf16 (of grouped_mlp_bwd's pieces) read only by FP8-packing quantizes;
 * - an unstack of an expert's whole rows in the stacked dtype (the down projection's weight
 *   gradient). */
void gpu_views_plan(const ir_graph *g, const gpu_fp8_plan *fp8, int *last_use, uint8_t *view) {
  for (int id = 0; id < g->n_nodes; id++) {
    const ir_node *nd = &g->nodes[id];
    int in0 = nd->n_in ? nd->in[0] : 0;
    ir_dtype ti = g->nodes[in0].type.dtype, to = nd->type.dtype;
    view[id] = nd->op == OP_SLICE_COLS ? VIEW_WINDOW
               : nd->op == OP_MXFP8_DEQUANTIZE && !fp8->skip[id] && fp8->kind[in0] == FP8_NONE && ti == DT_E4M3 &&
                       to == DT_BF16
                   ? VIEW_ALIAS
               : nd->op == OP_CAST && g->nodes[in0].op != OP_PARAM && ti == DT_F32 && to == DT_BF16 ? VIEW_CAST
               : nd->op == OP_UNSTACK && ti == to && cols(nd) == cols(&g->nodes[in0]) ? VIEW_SLAB
                                                                                     : VIEW_NONE;
  }
  for (int i = 0; i < g->n_outputs; i++) view[g->outputs[i]] = VIEW_NONE;
  for (int id = 0; id < g->n_nodes; id++)
    for (int j = 0; j < g->nodes[id].n_in; j++) {
      int v = g->nodes[id].in[j];
      if ((view[v] == VIEW_WINDOW && !reads_window(g, fp8, id)) || (view[v] == VIEW_CAST && !reads_cast(g, fp8, id)))
        view[v] = VIEW_NONE;
    }
  /* every link of a chain lives to the reader: a link with a pointer (a slab, an alias) is read
     through the link above it, and the root holds the memory */
  for (int id = 0; id < g->n_nodes; id++)
    for (int j = 0; j < g->nodes[id].n_in; j++)
      for (int v = g->nodes[id].in[j]; view[v]; v = g->nodes[v].in[0]) {
        int src = g->nodes[v].in[0];
        if (last_use[src] < id) last_use[src] = id;
      }
}

int gpu_view_root(const ir_graph *g, const uint8_t *view, int v) {
  while (view[v]) v = g->nodes[v].in[0];
  return v;
}
