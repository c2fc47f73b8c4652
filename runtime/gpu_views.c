/* gpu_views.c -- see gpu_views.h. */
#include <stdlib.h>

#include "gpu_views.h"

static int64_t cols(const ir_node *n) { return n->type.rank >= 2 ? n->type.dims[n->type.rank - 1] : 1; }

/* A reader that can take a slice_cols' window in place: a cast (copy_cols converts the window),
 * a rank-2 mxfp8_quantize along the rows that only writes values (qdq_cols) or stores them
 * packed (quantize_win), or one that only packs a GEMM operand, rows (quantize_win) or expert
 * columns (quantize_cols_experts_win): attention_bwd's dv under mxfp8-projections (with the
 * column views: MOEC_COLS_VIEW=0 copies dq, dk and dv alike). */
static int reads_window(const ir_graph *g, const gpu_fp8_plan *fp8, int cols_view, int id) {
  const ir_node *n = &g->nodes[id];
  const int k = fp8->kind[id];
  if (n->op == OP_CAST) return 1;
  if (n->op != OP_MXFP8_QUANTIZE || n->type.rank != 2) return 0;
  if (n->n_in == 1 && (k == FP8_NONE || k == FP8_STORE) && ir_get_int(n, "axis", 0) == 1) return 1;
  return cols_view && !fp8->values[id] && ((k == FP8_ROWS && n->n_in == 1) || k == FP8_COLS);
}

/* A reader that can take a cast view's input in place: a quantize that only packs (rows along
 * the last axis, or expert columns) and rounds to bf16 as it reads. */
static int reads_cast(const ir_graph *g, const gpu_fp8_plan *fp8, int id) {
  const ir_node *n = &g->nodes[id];
  int k = fp8->kind[id];
  return n->op == OP_MXFP8_QUANTIZE && !fp8->values[id] && ((k == FP8_ROWS && n->n_in == 1) || k == FP8_COLS);
}

/* The executor's storage class of an IR dtype (e4m3 values are kept in bf16). */
static int stored_bf16(ir_dtype t) { return t == DT_BF16 || t == DT_E4M3; }

/* A grouped_mlp_bwd that runs its GEMM on cuBLASLt (FP8, or bf16 / f32 operands alike), then
 * the rows kernel, which can read gate_up as a window and write the pieces apart. */
static int mlp_bwd_on_blas(const ir_graph *g, const gpu_fp8_plan *fp8, int blas, int id) {
  const ir_node *n = &g->nodes[id];
  return blas && n->op == OP_GROUPED_MLP_BWD &&
         (fp8->site[id] || stored_bf16(g->nodes[n->in[0]].type.dtype) == stored_bf16(g->nodes[n->in[2]].type.dtype));
}

static int is_output(const ir_graph *g, int v) {
  for (int i = 0; i < g->n_outputs; i++)
    if (g->outputs[i] == v) return 1;
  return 0;
}

/* A grouped_mlp_bwd G whose every reader is a slice of dg | du (0, 2F) or act (2F, F), read
 * only by casts to bf16, or of dp (3F, 1); none of them a graph output. */
static int splits(const ir_graph *g, const gpu_fp8_plan *fp8, int blas, int G) {
  const ir_node *n = &g->nodes[G];
  int64_t F = ir_get_int(n, "ffn", 0);
  if (!mlp_bwd_on_blas(g, fp8, blas, G) || n->type.dtype != DT_F32 || n->type.rank != 2 || F < 8 || F % 8 != 0 ||
      cols(n) < 3 * F + 1 || is_output(g, G))
    return 0;
  for (int s = G + 1; s < g->n_nodes; s++)
    for (int j = 0; j < g->nodes[s].n_in; j++) {
      if (g->nodes[s].in[j] != G) continue;
      const ir_node *sl = &g->nodes[s];
      int64_t start = ir_get_int(sl, "start", -1), w = cols(sl);
      if (sl->op != OP_SLICE_COLS || is_output(g, s) ||
          !((start == 0 && w == 2 * F) || (start == 2 * F && w == F) || (start == 3 * F && w == 1)))
        return 0;
      for (int c = s + 1; start < 3 * F && c < g->n_nodes; c++)
        for (int k = 0; k < g->nodes[c].n_in; k++)
          if (g->nodes[c].in[k] == s && (g->nodes[c].op != OP_CAST || g->nodes[c].type.dtype != DT_BF16 || is_output(g, c)))
            return 0;
    }
  return 1;
}

/* The one node that reads v, other than `except` (which must read it too, when not -1), or -1
 * (none, several, or v a graph output). */
static int sole_reader(const ir_graph *g, int v, int except) {
  int found = -1, saw_except = except < 0;
  if (is_output(g, v)) return -1;
  for (int id = v + 1; id < g->n_nodes; id++)
    for (int j = 0; j < g->nodes[id].n_in; j++) {
      if (g->nodes[id].in[j] != v) continue;
      if (id == except) {
        saw_except = 1;
        continue;
      }
      if (found >= 0 && found != id) return -1;
      found = id;
    }
  return saw_except ? found : -1;
}

static int only_read_by_grads(const ir_graph *g, int v) {
  for (int id = v + 1; id < g->n_nodes; id++)
    for (int j = 0; j < g->nodes[id].n_in; j++)
      if (g->nodes[id].in[j] == v && !(g->nodes[id].op == OP_GRAD_NORM || (g->nodes[id].op == OP_ADAMW && j == 1)))
        return 0;
  return 1;
}

/* A stack whose every operand is a cast f32 -> bf16 of a parameter (distinct ones), read by
 * the stack alone, and whose readers all run before any AdamW updates one of those parameters
 * (AdamW rewrites the copies in place). */
static int stack_of_param_casts(const ir_graph *g, const int *last_use, int s) {
  const ir_node *st = &g->nodes[s];
  if (st->type.dtype != DT_BF16 || st->type.rank != 3 || st->n_in < 1) return 0;
  for (int j = 0; j < st->n_in; j++) {
    int c = st->in[j];
    const ir_node *cn = &g->nodes[c];
    if (cn->op != OP_CAST || cn->type.dtype != DT_BF16 || g->nodes[cn->in[0]].op != OP_PARAM ||
        g->nodes[cn->in[0]].type.dtype != DT_F32 || last_use[c] != s)
      return 0;
    for (int k = 0; k < j; k++)
      if (g->nodes[st->in[k]].in[0] == cn->in[0]) return 0;
    for (int id = c + 1; id < g->n_nodes; id++) /* any reader of c besides the stack */
      for (int k = 0; k < g->nodes[id].n_in; k++) {
        if (g->nodes[id].in[k] == c && id != s) return 0;
        if (g->nodes[id].op == OP_ADAMW && k == 0 && g->nodes[id].in[0] == cn->in[0] && id <= last_use[s]) return 0;
      }
  }
  return 1;
}

/* The candidates:
 * - slice_cols read only in place (grouped_mlp_bwd's f32 pieces, cast to bf16 for the GEMMs;
 *   grouped_mlp's saved gate_up, quantized), or only by readers that take a row stride
 *   (attention_bwd's dq | dk | dv: rope and the v projection's GEMMs);
 * - an mxfp8_dequantize that no FP8 site skips, e4m3 -> bf16;
 * - a cast f32 -> bf16 (of grouped_mlp_bwd's pieces) read only by FP8-packing quantizes;
 * - an unstack of an expert's whole rows in the stacked dtype (the down projection's weight
 *   gradient), or of a column window read only by the optimizer (gate and up);
 * - a stack of parameter casts (the expert weights), and those casts;
 * - a grouped_mlp_bwd read through slices and casts to bf16: its pieces written apart (split),
 *   which replaces its slices' windows and casts (gpu_views.h). */
void gpu_views_plan(const ir_graph *g, const gpu_fp8_plan *fp8, int blas, int gather, int split_q, int cols_view,
                    int *last_use, uint8_t *view) {
  uint8_t *not_cols = calloc((size_t)g->n_nodes + 1, 1); /* a slice with a reader that takes no row stride */
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
               : nd->op == OP_UNSTACK && ti == to && only_read_by_grads(g, id)    ? VIEW_STRIDED
               : nd->op == OP_STACK && stack_of_param_casts(g, last_use, id)      ? VIEW_STACKED
                                                                                   : VIEW_NONE;
    if (view[id] == VIEW_STACKED)
      for (int j = 0; j < nd->n_in; j++) view[nd->in[j]] = VIEW_IN_STACK;
  }
  for (int i = 0; i < g->n_outputs; i++) view[g->outputs[i]] = VIEW_NONE;
  for (int id = 0; id < g->n_nodes; id++) /* a cast whose stack is no view (an output) writes its value */
    if (view[id] == VIEW_IN_STACK && view[last_use[id]] != VIEW_STACKED) view[id] = VIEW_NONE;
  for (int id = 0; id < g->n_nodes; id++)
    for (int j = 0; j < g->nodes[id].n_in; j++) {
      int v = g->nodes[id].in[j];
      /* grouped_mlp_bwd reads its saved gate_up (input 1) with a row stride, expert_unpermute its
         rows (input 0: grouped_mlp's y) */
      int window_ok = reads_window(g, fp8, cols_view, id) || (j == 1 && mlp_bwd_on_blas(g, fp8, blas, id)) ||
                      (j == 0 && g->nodes[id].op == OP_EXPERT_UNPERMUTE);
      /* rope (input 0) and matmul (its operands, not fuse-gemm-add's addend) take a row stride (VIEW_COLS) */
      const int op = g->nodes[id].op, cols_ok = (op == OP_ROPE && j == 0) || (op == OP_MATMUL && j < 2);
      if ((view[v] == VIEW_WINDOW || view[v] == VIEW_COLS) && !cols_ok && not_cols) not_cols[v] = 1;
      if (view[v] == VIEW_WINDOW && !window_ok) view[v] = VIEW_COLS; /* (decided below) */
      if (view[v] == VIEW_CAST && !reads_cast(g, fp8, id)) view[v] = VIEW_NONE;
    }
  for (int G = 0; G < g->n_nodes; G++) {
    if (!splits(g, fp8, blas, G)) continue;
    view[G] = VIEW_SPLIT;
    const int64_t F = ir_get_int(&g->nodes[G], "ffn", 0);
    for (int s = G + 1; s < g->n_nodes; s++) {
      if (!g->nodes[s].n_in || g->nodes[s].in[0] != G) continue;
      view[s] = VIEW_PIECE;
      for (int c = s + 1; ir_get_int(&g->nodes[s], "start", 0) < 3 * F && c < g->n_nodes; c++)
        if (g->nodes[c].n_in && g->nodes[c].in[0] == s) view[c] = VIEW_ALIAS; /* a cast to bf16 (splits) */
    }
  }
  /* a column view reads a plain value (the splits above decided theirs), at a 16-byte aligned
     first column and row stride (cuBLASLt's operands, rope's 16-byte loads) */
  for (int id = 0; id < g->n_nodes; id++) {
    if (view[id] != VIEW_COLS) continue;
    const int64_t es = stored_bf16(g->nodes[id].type.dtype) ? 2 : 4, in = g->nodes[id].in[0];
    if (!cols_view || !not_cols || not_cols[id] || view[in] != VIEW_NONE || ir_get_int(&g->nodes[id], "start", 0) * es % 16 ||
        cols(&g->nodes[in]) * es % 16)
      view[id] = VIEW_NONE;
  }
  free(not_cols);
  /* a split's dg | du quantized for its dgrad GEMM by the split itself: the first rows quantize
     that packs only, in blocks dividing the 128 that the kernel's half-warps cover */
  for (int G = 0; split_q && G < g->n_nodes; G++) {
    if (view[G] != VIEW_SPLIT || ir_get_int(&g->nodes[G], "ffn", 0) % 128) continue;
    for (int q = G + 1, done = 0; q < g->n_nodes && !done; q++) {
      const ir_node *qn = &g->nodes[q];
      const int64_t block = ir_get_int(qn, "block", 32);
      if (qn->op != OP_MXFP8_QUANTIZE || fp8->kind[q] != FP8_ROWS || fp8->values[q] || qn->n_in != 1 ||
          view[qn->in[0]] != VIEW_ALIAS || g->nodes[qn->in[0]].in[0] <= G || view[g->nodes[qn->in[0]].in[0]] != VIEW_PIECE ||
          g->nodes[g->nodes[qn->in[0]].in[0]].in[0] != G || ir_get_int(&g->nodes[g->nodes[qn->in[0]].in[0]], "start", -1) != 0 ||
          block < 8 || block > 128 || 128 % block || is_output(g, q))
        continue;
      view[q] = VIEW_SPLIT_Q;
      done = 1;
    }
  }
  /* a split whose dg | du and act no one reads but its rows quantize (above) and their expert
     columns quantizes: it writes those columns too, and no bf16 piece (VIEW_SPLIT_FP8) */
  for (int G = 0; split_q > 1 && G < g->n_nodes; G++) {
    if (view[G] != VIEW_SPLIT) continue;
    int rq = -1, cq[2] = {-1, -1}, ok = 1;
    for (int q = G + 1; q < g->n_nodes && rq < 0; q++)
      if (view[q] == VIEW_SPLIT_Q && gpu_view_root(g, view, g->nodes[q].in[0]) == G) rq = q;
    for (int s = G + 1; rq >= 0 && ok && s < g->n_nodes; s++) {
      if (view[s] != VIEW_PIECE || g->nodes[s].in[0] != G) continue;
      const int64_t start = ir_get_int(&g->nodes[s], "start", -1), F = ir_get_int(&g->nodes[G], "ffn", 0);
      if (start == 3 * F) continue; /* dp */
      const int k = start == 2 * F, c = sole_reader(g, s, -1), q = c >= 0 ? sole_reader(g, c, k ? -1 : rq) : -1;
      const ir_node *qn = q >= 0 ? &g->nodes[q] : NULL;
      ok = cq[k] < 0 && c >= 0 && view[c] == VIEW_ALIAS && qn && qn->op == OP_MXFP8_QUANTIZE && fp8->kind[q] == FP8_COLS &&
           !fp8->values[q] && qn->n_in == 2 && qn->in[0] == c && qn->in[1] == g->nodes[G].in[3] && !is_output(g, q);
      cq[k] = q;
    }
    if (rq >= 0 && ok && cq[0] >= 0 && cq[1] >= 0) view[cq[0]] = view[cq[1]] = VIEW_SPLIT_FP8;
  }
  /* the stored gate_up, read only by split backwards, which decode it themselves */
  for (int id = 0; id < g->n_nodes; id++) {
    const ir_node *nd = &g->nodes[id];
    if (nd->op != OP_MXFP8_DEQUANTIZE || fp8->kind[nd->in[0]] != FP8_STORE || is_output(g, id)) continue;
    int readers = 0, ok = 1;
    for (int r = id + 1; r < g->n_nodes && ok; r++)
      for (int j = 0; j < g->nodes[r].n_in; j++)
        if (g->nodes[r].in[j] == id) {
          readers++;
          ok &= g->nodes[r].op == OP_GROUPED_MLP_BWD && j == 1 && view[r] == VIEW_SPLIT;
        }
    if (!ok || !readers) continue;
    view[id] = VIEW_DECODE;
    if (last_use[nd->in[0]] < last_use[id]) last_use[nd->in[0]] = last_use[id];
  }
  /* the expert-sorted rows that only FP8-packing quantizes read: gathered by them from the
     permute's input, which (with the perm) then lives until they have */
  for (int id = 0; gather && id < g->n_nodes; id++) {
    const ir_node *nd = &g->nodes[id];
    if (nd->op != OP_EXPERT_PERMUTE || nd->n_in != 2 || is_output(g, id) || view[nd->in[0]] ||
        stored_bf16(g->nodes[nd->in[0]].type.dtype) != stored_bf16(nd->type.dtype))
      continue;
    int readers = 0, ok = 1;
    for (int r = id + 1; r < g->n_nodes && ok; r++)
      for (int j = 0; j < g->nodes[r].n_in; j++)
        if (g->nodes[r].in[j] == id) {
          readers++;
          ok &= j == 0 && reads_cast(g, fp8, r);
        }
    if (!ok || !readers) continue;
    view[id] = VIEW_GATHER;
    for (int j = 0; j < 2; j++)
      if (last_use[nd->in[j]] < last_use[id]) last_use[nd->in[j]] = last_use[id];
  }
  /* every link of a chain lives to the reader: a link with a pointer (a slab, an alias) is read
     through the link above it, and the root holds the memory */
  for (int id = 0; id < g->n_nodes; id++)
    for (int j = 0; j < g->nodes[id].n_in; j++)
      for (int v = g->nodes[id].in[j]; view[v] && view[v] < VIEW_STACKED; v = g->nodes[v].in[0]) {
        int src = g->nodes[v].in[0];
        if (last_use[src] < id) last_use[src] = id;
      }
}

int gpu_view_root(const ir_graph *g, const uint8_t *view, int v) {
  while (view[v] && view[v] < VIEW_STACKED) v = g->nodes[v].in[0];
  return v;
}

int gpu_split_fp8(const ir_graph *g, const uint8_t *view, int G, int cq[2]) {
  cq[0] = cq[1] = -1;
  const int64_t F = ir_get_int(&g->nodes[G], "ffn", 0);
  for (int q = G + 1; q < g->n_nodes; q++) {
    if (view[q] != VIEW_SPLIT_FP8 || gpu_view_root(g, view, g->nodes[q].in[0]) != G) continue;
    const int piece = g->nodes[g->nodes[q].in[0]].in[0]; /* quantize <- cast <- piece */
    cq[ir_get_int(&g->nodes[piece], "start", 0) == 2 * F] = q;
  }
  return cq[0] >= 0 && cq[1] >= 0;
}
