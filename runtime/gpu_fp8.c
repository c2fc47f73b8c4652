/* gpu_fp8.c -- per-expert FP8 GEMM loops over packed operands (gpu_fp8.h). */
#include "gpu_fp8.h"

#include <stdio.h>
#include <stdlib.h>

#include "gpu_kernels.h"

int gpu_fp8_grouped_gemm(gpu_blas *b, const int32_t *counts, int64_t E, int64_t N, int64_t K, gpu_ptr qa, gpu_ptr sa,
                         gpu_ptr qb, gpu_ptr sb, gpu_ptr sq, cg_dtype tc, gpu_ptr c, int64_t ldc, char *err, size_t errlen) {
  size_t cs = tc == CG_DT_BF16 ? 2 : 4;
  int64_t r0 = 0, soa = 0;
  /* One stream, in expert order, no lanes: each GEMM writes its padded row count mp, so its
     last mp - m rows land on the next expert's first rows, which that expert's GEMM then
     overwrites -- only if it runs later. (On two lanes genos_1b's loss went NaN.) */
  for (int64_t e = 0; e < E; e++) {
    int64_t m = counts[e], mp = fp8_rows(m);
    if (m > 0) {
      gpu_mat C = {tc, c + (gpu_ptr)((size_t)(r0 * ldc) * cs), ldc, 0, 0};
      /* squares: one scale per 128 x 128 of the weight (faster than 1 x 128 on the H200) */
      gpu_ptr sbe = sq ? sq + (gpu_ptr)(e * rt_cuda_tile_blk_floats(N, K) * 4)
                       : sb + (gpu_ptr)(e * fp8_scale_floats(fp8_rows(N), K) * 4);
      if (gpu_gemm_fp8_blocks(b, mp, N, K, qa + (gpu_ptr)(r0 * K), sa + (gpu_ptr)(soa * 4), qb + (gpu_ptr)(e * N * K), sbe,
                              sq != 0, &C, err, errlen) != 0)
        return -1;
    }
    r0 += m;
    soa += fp8_scale_floats(mp, K);
  }
  return 0;
}

int gpu_fp8_grouped_wgrad(gpu_blas *b, gpu_ctx *g, const int32_t *counts, int64_t E, int64_t M, int64_t N, gpu_ptr qa,
                          gpu_ptr sa, gpu_ptr qb, gpu_ptr sb, cg_dtype tc, gpu_ptr c, char *err, size_t errlen) {
  size_t cs = tc == CG_DT_BF16 ? 2 : 4;
  int64_t poff = 0;
  int rc = gpu_blas_fork(b, err, errlen); /* one expert's gradient each: disjoint */
  for (int64_t e = 0; e < E && rc == 0; e++) {
    int64_t P = ((int64_t)counts[e] + 127) / 128 * 128;
    gpu_ptr dw = c + (gpu_ptr)((size_t)(e * M * N) * cs);
    if (P == 0) { /* on g's stream: after the fork, before the join, like the lanes */
      if (gpu_memset8(g, dw, 0, (size_t)(M * N) * cs) != 0) snprintf(err, errlen, "%s", gpu_error(g)), rc = -1;
      continue;
    }
    gpu_mat C = {tc, dw, N, 0, 0};
    rc = gpu_gemm_fp8(b, M, N, P, qa + (gpu_ptr)(M * poff), sa + (gpu_ptr)(M * poff / 128 * 4), qb + (gpu_ptr)(N * poff),
                      sb + (gpu_ptr)(N * poff / 128 * 4), &C, err, errlen);
    gpu_blas_next_lane(b);
    poff += P;
  }
  return gpu_blas_join(b, rc, err, errlen);
}

/* ---- the plan ---- */
fp8_kind gpu_fp8_operand_kind(ir_op op, int k) {
  switch (op) {
  case OP_GROUPED_LINEAR: return k == 0 ? FP8_ROWS : k == 1 ? FP8_W_IN : FP8_NONE;
  case OP_GROUPED_MLP: return k == 0 ? FP8_ROWS : k == 1 || k == 2 ? FP8_W_IN : FP8_NONE;
  case OP_GROUPED_MLP_BWD: return k == 0 ? FP8_ROWS : k == 2 ? FP8_W_OUT : FP8_NONE;
  case OP_GROUPED_LINEAR_DGRAD: return k == 0 ? FP8_ROWS : k == 1 ? FP8_W_OUT : FP8_NONE;
  case OP_GROUPED_LINEAR_WGRAD: return k == 0 || k == 1 ? FP8_COLS : FP8_NONE;
  default: return FP8_NONE;
  }
}

/* The packed kind a quantize can write, from its attributes. */
static fp8_kind quant_kind(const ir_graph *g, int q) {
  const ir_node *n = &g->nodes[q];
  if (n->op != OP_MXFP8_QUANTIZE || !ir_get_int(n, "share128", 0)) return FP8_NONE;
  int rank = n->type.rank, axis = (int)ir_get_int(n, "axis", 0), counts = n->n_in == 2;
  /* cuBLASLt's FP8 GEMM wants K a multiple of 128 and the other sizes of 16 (gpu_gemm_fp8) */
  const int64_t *d = n->type.dims;
  if (rank == 2 && axis == 0 && counts) return d[1] % 16 == 0 ? FP8_COLS : FP8_NONE;
  if (counts || axis >= rank || d[axis] % 128 != 0) return FP8_NONE;
  if (rank == 2 && axis == 1) return FP8_ROWS;
  if (rank == 3 && axis == 1 && d[2] % 16 == 0) return FP8_W_IN;
  if (rank == 3 && axis == 2 && d[1] % 16 == 0) return FP8_W_OUT;
  return FP8_NONE;
}

static int is_site(const ir_graph *g, int id) {
  const ir_node *n = &g->nodes[id];
  int operands = 0;
  if (n->op == OP_GROUPED_LINEAR && n->n_in > 3) return 0; /* a bias */
  if (n->op == OP_GROUPED_MLP && !ir_get_int(n, "mx_share128", 0)) return 0;
  for (int k = 0; k < n->n_in; k++) {
    fp8_kind want = gpu_fp8_operand_kind(n->op, k);
    if (want == FP8_NONE) continue;
    const ir_node *d = &g->nodes[n->in[k]];
    if (d->op != OP_MXFP8_DEQUANTIZE || quant_kind(g, d->in[0]) != want) return 0;
    operands++;
  }
  return operands > 0;
}

int gpu_fp8_plan_new(const ir_graph *g, int enabled, int *last_use, gpu_fp8_plan *p) {
  size_t n = (size_t)g->n_nodes + 1;
  p->site = calloc(n, 1), p->kind = calloc(n, 1), p->values = calloc(n, 1), p->skip = calloc(n, 1);
  if (!p->site || !p->kind || !p->values || !p->skip) return -1;
  for (int id = 0; id < g->n_nodes; id++) {
    p->values[id] = 1;
    p->site[id] = enabled && is_site(g, id);
    p->skip[id] = g->nodes[id].op == OP_MXFP8_DEQUANTIZE && enabled; /* cleared below by a reader that needs values */
  }
  for (int i = 0; i < g->n_outputs; i++) p->skip[g->outputs[i]] = 0;
  for (int id = 0; id < g->n_nodes; id++) {
    const ir_node *n = &g->nodes[id];
    for (int k = 0; k < n->n_in; k++) {
      int v = n->in[k];
      if (g->nodes[v].op != OP_MXFP8_DEQUANTIZE) continue;
      if (p->site[id] && gpu_fp8_operand_kind(n->op, k) != FP8_NONE)
        p->kind[g->nodes[v].in[0]] = (uint8_t)gpu_fp8_operand_kind(n->op, k);
      else
        p->skip[v] = 0;
    }
  }
  /* a quantize writes its values unless every reader is a skipped dequantize */
  for (int id = 0; id < g->n_nodes; id++) {
    if (g->nodes[id].op == OP_MXFP8_QUANTIZE) p->values[id] = !p->kind[id];
    if (g->nodes[id].op == OP_MXFP8_DEQUANTIZE && !p->skip[id]) p->values[g->nodes[id].in[0]] = 1;
  }
  for (int id = 0; id < g->n_nodes; id++) {
    const ir_node *n = &g->nodes[id];
    for (int k = 0; k < n->n_in; k++)
      if (g->nodes[n->in[k]].op == OP_MXFP8_QUANTIZE && n->op != OP_MXFP8_DEQUANTIZE) p->values[n->in[k]] = 1;
  }
  for (int i = 0; i < g->n_outputs; i++)
    if (g->nodes[g->outputs[i]].op == OP_MXFP8_QUANTIZE) p->values[g->outputs[i]] = 1;
  /* values kept between a quantize and its dequantizes only (the saved gate_up, forward to
     backward): stored packed, each dequantize expanding it when it runs */
  uint8_t *only_deq = calloc(n, 1);
  if (!only_deq) return -1;
  for (int id = 0; id < g->n_nodes; id++) only_deq[id] = g->nodes[id].op == OP_MXFP8_QUANTIZE;
  for (int id = 0; id < g->n_nodes; id++)
    for (int k = 0; k < g->nodes[id].n_in; k++)
      if (g->nodes[id].op != OP_MXFP8_DEQUANTIZE || p->skip[id]) only_deq[g->nodes[id].in[k]] = 0;
  for (int i = 0; i < g->n_outputs; i++) only_deq[g->outputs[i]] = 0;
  for (int id = 0; enabled && id < g->n_nodes; id++) {
    const ir_node *q = &g->nodes[id];
    int64_t group = ir_get_int(q, "share128", 0) ? 128 : ir_get_int(q, "block", 32);
    if (only_deq[id] && p->kind[id] == FP8_NONE && q->n_in == 1 && q->type.rank == 2 && ir_get_int(q, "axis", 0) == 1 &&
        q->type.dims[1] % group == 0)
      p->kind[id] = FP8_STORE, p->values[id] = 0;
  }
  free(only_deq);
  /* a packed quantize lives as long as the readers of its dequantizes (the sites read its
     packed form, whether or not the dequantize also writes values for another reader) */
  for (int id = 0; id < g->n_nodes; id++)
    if (g->nodes[id].op == OP_MXFP8_DEQUANTIZE && p->kind[g->nodes[id].in[0]] != FP8_NONE &&
        p->kind[g->nodes[id].in[0]] != FP8_STORE) {
      int q = g->nodes[id].in[0];
      if (last_use[id] > last_use[q]) last_use[q] = last_use[id];
    }
  return 0;
}

void gpu_fp8_plan_free(gpu_fp8_plan *p) {
  free(p->site), free(p->kind), free(p->values), free(p->skip);
  p->site = p->kind = p->values = p->skip = NULL;
}
