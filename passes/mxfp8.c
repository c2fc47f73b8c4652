/* mxfp8.c -- the mxfp8 pass: MXFP8 quantize ops where the precision recipe says, when the
 * graph's precision is mxfp8 (it changes nothing for fp32 and bf16).
 *
 * Representation. `q = mxfp8_quantize(x [, counts]) {block, axis, share128, role}` is an MX
 * tensor, dtype e4m3: E4M3 elements plus one E8M0 scale per block of 32 elements along `axis`
 * (share128 = 1 for mxfp8(block = 128): the four scales of each 128 are the 128's). With
 * counts the blocks run down the rows of each expert group and restart at its first row.
 * With the weight-tile recipe (mxfp8(block = 128, weight_tile = 128)) an expert weight's
 * quantize has {tile = 128}: one scale per 128 x 128 square of each (in, out) matrix, from the
 * square's amax, the same values whichever axis it is quantized along (still valid MXFP8 both
 * ways); cuBLASLt runs such a weight with 128 x 128 block scales, faster than 1 x 128.
 * `mxfp8_dequantize(q)` gives the exact values back in the source dtype: a GEMM reads it (on
 * Hopper the dequantize lives in the GEMM's main loop, or feeds FP8 MMAs with per-128 scales),
 * and it is emitted right before its reader, while the quantize comes right after the value
 * it quantizes, so a value saved for the backward lives as e4m3 (half of bf16) in between.
 * A weight (a parameter, its bf16 cast, or a stack of those: the GPU keeps them between steps)
 * is quantized right before its first reader instead: the backward's orientation of a weight
 * is not kept through the forward, it is made when the backward needs it.
 *
 * What is quantized (each orientation quantized from the high-precision value, never from
 * another quantized copy), on the operands of every grouped GEMM (the experts', and the attention
 * projections' one-group ones from mxfp8-projections):
 *   grouped_linear(xs, w)          xs row blocks (axis 1), w along in (axis 1 of [E,in,out])
 *   grouped_linear_dgrad(dy, w)    dy row blocks, w along out (axis 2)
 *   grouped_linear_wgrad(xs, dy)   both column blocks within each expert (axis 0 + counts)
 *   grouped_mlp(xs, w_gu, w_down)  xs, w_gu along H, w_down along F; the activation inside
 *                                  is quantized by the op itself (mx_block, mx_share128)
 *   grouped_mlp_bwd(dy, gate_up, w_down)  dy row blocks, the saved gate_up row blocks, w_down
 *                                  along H
 *   and on the naive per-expert GEMMs (when group-linear did not run): linear(x, w) and the
 *   matmuls of its backward, when a row count is an expert's run-time one.
 * Activations saved for the backward: every forward value computed from the expert-sorted (or
 * dispatched) rows that a backward op reads is stored quantized (row blocks) unless a GEMM
 * rule above already quantizes it for that reader. The router, embedding, norms, the attention
 * op itself, lm_head and the loss are untouched.
 */
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "rewrite.h"

typedef struct {
  int src, axis, counts; /* counts: old id, or -1 */
  char role[48];
  int after;  /* emit right after this old node */
  int q;      /* new id of the quantize */
} qkey;

typedef struct {
  const ir_graph *g;
  qkey *keys;
  int n_keys, cap_keys;
  int *req;   /* (total operands) key of each operand, -1 */
  int *first; /* (n_nodes + 1) index of node i's first operand in req */
  char *region;
  int *slot;  /* (n_nodes) the old node after which each node is emitted (itself, or earlier) */
  int bwd_start;
  int failed;
} plan;

#define NODE(id) (&p->g->nodes[id])

static int expert_rows(const ir_graph *g, int v) { return g->nodes[v].type.rank >= 1 && g->nodes[v].type.dims[0] < 0; }

/* The GEMM rule for operand j of node id: 1 with *axis, *counts (-1 if none), *role. */
static int gemm_rule(const plan *p, int id, int j, int *axis, int *counts, const char **role) {
  const ir_node *n = NODE(id);
  *counts = -1;
  switch (n->op) {
  case OP_GROUPED_LINEAR:
    if (j > 1) return 0;
    *axis = 1, *role = "fwd";
    return 1;
  case OP_GROUPED_LINEAR_DGRAD:
    if (j > 1) return 0;
    *axis = j == 0 ? 1 : 2, *role = "dgrad";
    return 1;
  case OP_GROUPED_LINEAR_WGRAD:
    if (j > 1) return 0;
    *axis = 0, *counts = n->in[2], *role = "wgrad";
    return 1;
  case OP_GROUPED_MLP:
    if (j > 2) return 0;
    *axis = 1, *role = "fwd";
    return 1;
  case OP_GROUPED_MLP_BWD:
    if (j > 2) return 0;
    *axis = j == 2 ? 2 : 1, *role = j == 1 ? "saved" : "dgrad";
    return 1;
  case OP_LINEAR: /* a naive expert GEMM: x[n_e, in] . w[in, out] */
    if (j > 1 || !expert_rows(p->g, n->in[0])) return 0;
    *axis = j == 0 ? 1 : 0, *role = "fwd";
    return 1;
  case OP_MATMUL: { /* its backward: reduction dim of a is 0 when trans_a, of b is 1 when trans_b */
    if (!expert_rows(p->g, n->in[0]) && !expert_rows(p->g, n->in[1])) return 0;
    int ta = (int)ir_get_int(n, "trans_a", 0), tb = (int)ir_get_int(n, "trans_b", 0);
    *axis = j == 0 ? !ta : tb;
    *role = ta ? "wgrad" : "dgrad";
    return 1;
  }
  default: return 0;
  }
}

/* reader: the node asking (ids ascend, so the first call comes from the first reader) */
static int key_for(plan *p, int src, int axis, int counts, const char *role, int reader) {
  for (int k = 0; k < p->n_keys; k++) {
    qkey *q = &p->keys[k];
    if (q->src == src && q->axis == axis && q->counts == counts) {
      if (!strstr(q->role, role) && strlen(q->role) + strlen(role) + 2 < sizeof q->role) {
        strcat(q->role, "+");
        strcat(q->role, role);
      }
      return k;
    }
  }
  if (p->n_keys == p->cap_keys) {
    p->cap_keys = p->cap_keys ? 2 * p->cap_keys : 64;
    qkey *nk = realloc(p->keys, (size_t)p->cap_keys * sizeof *nk);
    if (!nk) {
      p->failed = 1;
      return -1;
    }
    p->keys = nk;
  }
  qkey *q = &p->keys[p->n_keys];
  memset(q, 0, sizeof *q);
  q->src = src, q->axis = axis, q->counts = counts, q->q = -1;
  q->after = counts >= 0 && p->slot[counts] > p->slot[src] ? p->slot[counts] : p->slot[src];
  if (counts < 0 && ir_is_weight(p->g, src) && p->slot[reader] == reader) /* right before the reader */
    for (int x = reader - 1; x > q->after; x--)
      if (p->slot[x] == x) {
        q->after = x;
        break;
      }
  snprintf(q->role, sizeof q->role, "%s", role);
  return p->n_keys++;
}

static int make_plan(plan *p, const ir_graph *g) {
  memset(p, 0, sizeof *p);
  p->g = g;
  int n = g->n_nodes, total = 0;
  p->first = malloc(((size_t)n + 1) * sizeof *p->first);
  p->region = calloc((size_t)n + 1, 1);
  p->slot = malloc(((size_t)n + 1) * sizeof *p->slot);
  if (!p->first || !p->region || !p->slot) return -1;
  for (int i = 0; i < n; i++) p->slot[i] = i;
  for (int i = 0; i < n; i++) {
    p->first[i] = total;
    total += g->nodes[i].n_in;
  }
  p->first[n] = total;
  p->req = malloc(((size_t)total + 1) * sizeof *p->req);
  if (!p->req) return -1;
  for (int i = 0; i < total; i++) p->req[i] = -1;
  /* the backward starts at the loss seed, the fill autodiff marks {seed = 1} (other fills, such
     as mxfp8-projections' row counts, sit in the forward) */
  p->bwd_start = n;
  for (int i = 0; i < n && p->bwd_start == n; i++)
    if (g->nodes[i].op == OP_FILL && ir_get_int(&g->nodes[i], "seed", 0)) p->bwd_start = i;
  /* forward values computed from the experts' rows (not past the combine) */
  for (int i = 0; i < p->bwd_start; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->type.dtype == DT_I32 || nd->op == OP_EXPERT_UNPERMUTE || nd->op == OP_COMBINE) continue;
    int r = nd->op == OP_EXPERT_PERMUTE || nd->op == OP_DISPATCH;
    for (int j = 0; j < nd->n_in && !r; j++) r = p->region[nd->in[j]];
    p->region[i] = (char)r;
  }
  /* a backward slice of a saved value (grouped_mlp's gate_up) is taken in the forward, so that
   * what the backward keeps is the slice, quantized */
  for (int i = p->bwd_start; i < n; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->op == OP_SLICE_COLS && nd->in[0] < p->bwd_start && p->region[nd->in[0]]) {
      p->slot[i] = nd->in[0];
      p->region[i] = 1;
    }
  }
  for (int id = 0; id < n && !p->failed; id++) {
    const ir_node *nd = &g->nodes[id];
    for (int j = 0; j < nd->n_in; j++) {
      int axis, counts;
      const char *role;
      int v = nd->in[j];
      if (gemm_rule(p, id, j, &axis, &counts, &role)) {
        p->req[p->first[id] + j] = key_for(p, v, axis, counts, role, id);
      } else if (p->slot[id] >= p->bwd_start && p->slot[v] < p->bwd_start && p->region[v] && g->nodes[v].type.rank >= 1) {
        p->req[p->first[id] + j] = key_for(p, v, g->nodes[v].type.rank - 1, -1, "saved", id);
      }
    }
  }
  return p->failed ? -1 : 0;
}

static void plan_free(plan *p) {
  free(p->keys);
  free(p->req);
  free(p->first);
  free(p->region);
  free(p->slot);
}

/* Copies old node id, reading dequantized values where the plan says. */
static void emit_node(rw_ctx *r, const plan *p, int id, int64_t block, int share) {
  const ir_node *n = NODE(id);
  int stack_in[16], *in = n->n_in <= 16 ? stack_in : malloc((size_t)n->n_in * sizeof *in), any = 0;
  if (!in) {
    r->failed = 1;
    return;
  }
  for (int j = 0; j < n->n_in; j++) {
    int k = p->req[p->first[id] + j];
    in[j] = r->map[n->in[j]];
    if (k < 0) continue;
    any = 1;
    ir_type t = r->g->nodes[in[j]].type;
    in[j] = rw_emit_typed(r, OP_MXFP8_DEQUANTIZE, &p->keys[k].q, 1, NULL, 0, t, n->loc);
  }
  ir_attr mx[] = {ir_attr_int("mx_block", block), ir_attr_int("mx_share128", share)};
  int n_mx = n->op == OP_GROUPED_MLP ? 2 : 0;
  if (any || n_mx) rw_copy_full(r, id, in, n->n_in, mx, n_mx);
  else rw_copy(r, id);
  if (in != stack_in) free(in);
}

int pass_mxfp8(ir_graph **gp, FILE *err) {
  ir_graph *g = *gp;
  if (g->cfg.precision != PREC_MXFP8) return 0;
  const int64_t block = 32;
  const int share = g->cfg.mx_block == 128;
  plan pl;
  plan *p = &pl;
  if (make_plan(p, g)) {
    plan_free(p);
    fprintf(err, "moec: error: out of memory in pass mxfp8\n");
    return -1;
  }
  char *has_q = calloc((size_t)g->n_nodes + 1, 1);
  rw_ctx r;
  if (!has_q || rw_begin(&r, g, "mxfp8", err)) {
    free(has_q);
    plan_free(p);
    return -1;
  }
  for (int k = 0; k < p->n_keys; k++) has_q[p->keys[k].after] = 1;
  /* hoisted[at]: the first node moved to right after `at`; next_hoisted chains the others */
  int *hoisted = malloc(((size_t)g->n_nodes + 1) * sizeof *hoisted), *next_hoisted = malloc(((size_t)g->n_nodes + 1) * sizeof *next_hoisted);
  if (!hoisted || !next_hoisted) r.failed = 1;
  for (int i = 0; !r.failed && i < g->n_nodes; i++) hoisted[i] = next_hoisted[i] = -1;
  for (int i = g->n_nodes - 1; !r.failed && i >= 0; i--)
    if (p->slot[i] != i) {
      next_hoisted[i] = hoisted[p->slot[i]];
      hoisted[p->slot[i]] = i;
    }
  for (int at = 0; at < g->n_nodes && !r.failed; at++) {
    if (p->slot[at] != at) continue; /* emitted earlier, after the value it slices */
    emit_node(&r, p, at, block, share);
    for (int id = hoisted[at]; id >= 0 && !r.failed; id = next_hoisted[id]) emit_node(&r, p, id, block, share);
    if (!has_q[at]) continue;
    for (int k = 0; k < p->n_keys; k++) {
      qkey *q = &p->keys[k];
      if (q->after != at) continue;
      /* an expert weight (E, in, out) under the weight-tile recipe: 128 x 128 squares */
      const ir_type *st = &NODE(q->src)->type;
      const int64_t wt = g->cfg.mx_weight_tile; /* sides not multiples of the tile keep 1 x 128 */
      const int tile = wt && share && q->counts < 0 && st->rank == 3 && st->dims[1] % wt == 0 && st->dims[2] % wt == 0;
      /* the fifth attribute, tile, is passed only for a tiled weight */
      ir_attr a[] = {ir_attr_int("block", block), ir_attr_int("axis", q->axis), ir_attr_int("share128", share),
                     ir_attr_str("role", q->role), ir_attr_int("tile", wt)};
      int qin[2] = {r.map[q->src], q->counts >= 0 ? r.map[q->counts] : -1};
      q->q = rw_emit(&r, OP_MXFP8_QUANTIZE, qin, q->counts >= 0 ? 2 : 1, a, tile ? 5 : 4, NODE(q->src)->loc);
    }
  }
  free(has_q);
  free(hoisted);
  free(next_hoisted);
  plan_free(p);
  return rw_finish(&r, gp);
}
