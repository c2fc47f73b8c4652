/* fuse_gemm_add.c -- adds of a GEMM's result folded into the GEMM, as its accumulator.
 *
 * The attention block's backward sums the input's gradient over the three projections that
 * read it (autodiff accumulates a gradient with `add`):
 *
 *   dx = add(add(matmul(dv, Wv^T), matmul(dk, Wk^T)), matmul(dq, Wq^T))
 *
 * Each add reads two [T, H] tensors and writes a third after the GEMM wrote one of them.
 * Folded in, the GEMM takes the other term as its addend (cuBLASLt's C with beta = 1):
 *
 *   dx = matmul(dq, Wq^T, matmul(dk, Wk^T, matmul(dv, Wv^T) {accumulate=1}) {accumulate=1}
 *
 * Unlike fuse-residual this is not bit for bit in bf16: the GEMM's f32 sum meets the addend
 * before the one rounding to the result type, where the add rounded the product first (one
 * rounding fewer; in f32 the same bits). It runs after fuse-residual, which is exact and takes
 * the adds it can first, on the finished step. The fused GEMM takes the GEMM's place where
 * the addend exists by then, else the add's. A GEMM read by anything but the add, a graph
 * output, or one whose result type differs from the add's stays as it is. */
#include "pipeline.h"
#include "rewrite.h"

/* A GEMM that can take an addend: a matmul without one. */
static int takes_addend(const ir_node *n) { return n->op == OP_MATMUL && n->n_in == 2; }

int pass_fuse_gemm_add(ir_graph **gp, FILE *err) {
  return fold_adds(gp, "fuse-gemm-add", takes_addend, "accumulate", "one rounding: not bit for bit in bf16", err);
}
