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
  VIEW_ALIAS = 2,  /* an mxfp8_dequantize e4m3 -> bf16 (e4m3 values are stored in bf16): its input's buffer */
  VIEW_CAST = 3,   /* a cast f32 -> bf16 that writes nothing: its readers (FP8-packing quantizes) read its
                      input, or that slice's window, and round to bf16 themselves */
  VIEW_SLAB = 4,   /* an unstack of whole rows (one expert's contiguous slab): a pointer into its input */
  VIEW_STRIDED = 5, /* an unstack of a column window (a gate or up part of a stacked gradient) read only by
                       adamw and grad_norm: a pointer into its input with the input's row stride */
  /* no chains past these two: their storage is the parameters' persistent bf16 copies */
  VIEW_STACKED = 6,  /* a stack of casts of f32 parameters: the copies, laid out stacked (AdamW writes
                        each parameter's copy into its window), so the stack copies nothing */
  VIEW_IN_STACK = 7, /* such a cast: writes nothing (its parameter's copy is a window of the stack) */
} gpu_view;

/* view (n_nodes) <- each node's gpu_view; last_use raised so that every link of a view chain
 * lives until the chain's readers. fp8: the graph's FP8 plan (all zero: no FP8). */
void gpu_views_plan(const ir_graph *g, const gpu_fp8_plan *fp8, int *last_use, uint8_t *view);
/* The value a chain of views reads in the end (v itself when v is no view, or a view whose
 * storage is persistent). */
int gpu_view_root(const ir_graph *g, const uint8_t *view, int v);

#endif
