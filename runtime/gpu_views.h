/* gpu_views.h -- values the GPU executor reads through their input instead of writing them
 * (docs/cuda.md, "FP8 expert GEMMs"): decided once per graph, on the IR and the FP8 plan. A
 * view's input lives until the view's last reader; views chain (a cast view of a slice window),
 * and every link of a chain lives to its reader. */
#ifndef MOEC_GPU_VIEWS_H
#define MOEC_GPU_VIEWS_H

#include <stdint.h>

#include "gpu_fp8.h"
#include "ir.h"

typedef enum {
  VIEW_NONE = 0,
  VIEW_WINDOW = 1, /* a slice_cols that writes nothing: its readers take their window of its input */
  VIEW_ALIAS = 2,  /* an mxfp8_dequantize e4m3 -> bf16 (e4m3 values are stored in bf16), or a cast to bf16
                      of a split piece stored in bf16 (VIEW_PIECE): its input's buffer */
  VIEW_CAST = 3,   /* a cast f32 -> bf16 that writes nothing: its readers (FP8-packing quantizes) read its
                      input, or that slice's window, and round to bf16 themselves */
  VIEW_SLAB = 4,   /* an unstack of whole rows (one expert's contiguous slab): a pointer into its input */
  VIEW_STRIDED = 5, /* an unstack of a column window (a gate or up part of a stacked gradient) read only by
                       adamw and grad_norm: a pointer into its input with the input's row stride */
  VIEW_PIECE = 6,  /* a slice_cols of a split grouped_mlp_bwd: a pointer to its dense piece */
  VIEW_COLS = 7,   /* a slice_cols (of a value that is no view) read only by readers that take a row
                      stride (rope, matmul): a pointer to its first column with its input's row stride
                      (dev_value.ld) -- attention_bwd's dq | dk | dv read in place */
  /* no chains past these: the stacks' storage is the parameters' persistent bf16 copies, and a
     split grouped_mlp_bwd writes its own buffer */
  VIEW_STACKED = 8,  /* a stack of casts of f32 parameters: the copies, laid out stacked (AdamW writes
                        each parameter's copy into its window), so the stack copies nothing */
  VIEW_IN_STACK = 9, /* such a cast: writes nothing (its parameter's copy is a window of the stack) */
  VIEW_SPLIT = 10,   /* a grouped_mlp_bwd (f32, (S, W)) read only through slices of its dg | du and act,
                        each only cast to bf16, and of its dp: writes its pieces apart, in one buffer:
                        dg | du (S, 2F) and act (S, F) in bf16, then dp (S) in f32 (gpu_split_offset);
                        the slices are pieces, their casts aliases. Where the GEMMs are cuBLASLt's only */
  VIEW_DECODE = 11,  /* an mxfp8_dequantize of a stored quantize (FP8_STORE: the saved gate_up) read only as
                        gate_up by split grouped_mlp_bwd's: writes nothing; they decode the packed E4M3 and
                        E8M0 codes (rt_cuda_mlp_bwd_split_mx), which live until they read them */
  VIEW_GATHER = 12, /* an expert_permute (no weights) read only by FP8-packing quantizes (the forward's xs,
                        the backward's dy): writes nothing; they read its input's rows through its perm */
  VIEW_SPLIT_Q = 13, /* the packing rows quantize (FP8_ROWS) of a split grouped_mlp_bwd's dg | du (through
                        its piece and cast): runs nothing, the split writes its E4M3 rows and codes as it
                        writes dg | du (rt_cuda_mlp_bwd_split_mx's dq); one a split, F % 128 == 0 */
  VIEW_SPLIT_FP8 = 14, /* a packing expert-columns quantize (FP8_COLS) of a split's dg | du or act (through its
                          piece and cast), where the split also quantizes dg | du's rows (VIEW_SPLIT_Q) and
                          nothing else reads either piece: runs nothing, the split writes its columns
                          (rt_cuda_mlp_bwd_split_fp8) and has no bf16 pieces at all, only dp (gpu_split_fp8);
                          the executor makes them unless MOEC_SPLIT_FP8=0 */
  VIEW_KINDS
} gpu_view;

/* Byte offset in a split grouped_mlp_bwd's buffer (S rows, ffn F) of the piece that starts at
 * column `start` of its IR value (0: dg | du, 2F: act, 3F: dp); its size in bytes when start is
 * past the end (the whole buffer). */
static inline int64_t gpu_split_offset(int64_t S, int64_t F, int64_t start) {
  return start >= 3 * F + 1 ? S * 3 * F * 2 + S * 4 : start >= 3 * F ? S * 3 * F * 2 : start >= 2 * F ? S * 2 * F * 2 : 0;
}

/* view (n_nodes) <- each node's gpu_view; last_use raised so that every link of a view chain
 * lives until the chain's readers. fp8: the graph's FP8 plan (all zero: no FP8). blas: the
 * grouped GEMMs run on cuBLASLt (not MOEC_GROUPED_GEMM=device), the only path that splits.
 * gather: make VIEW_GATHER views (else no permute's input or perm lives longer for one).
 * split_q: 1 lets splits quantize their dg | du's rows (VIEW_SPLIT_Q), 2 also their pieces'
 * expert columns (VIEW_SPLIT_FP8), 0 neither. cols_view: make VIEW_COLS views. */
void gpu_views_plan(const ir_graph *g, const gpu_fp8_plan *fp8, int blas, int gather, int split_q, int cols_view,
                    int *last_use, uint8_t *view);
/* The value a chain of views reads in the end (v itself when v is no view, or a view whose
 * storage is persistent). */
int gpu_view_root(const ir_graph *g, const uint8_t *view, int v);
/* Does split grouped_mlp_bwd G write its pieces' FP8 columns (VIEW_SPLIT_FP8)? cq <- the
 * quantizes of dg | du's and of act's columns (-1 where none). Its buffer then holds dp alone. */
int gpu_split_fp8(const ir_graph *g, const uint8_t *view, int G, int cq[2]);

#endif
