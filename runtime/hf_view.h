/* hf_view.h -- a rank's parameters as a checkpoint sees them (ckpt.h): Hugging Face names and
 * layouts, moec's [in, out] linear weights as [out, in].
 *  - For a save, every tensor is fetched when the writer reaches it (ckpt_param.fetch): from the
 *    host copies, transposing a linear weight on the fly, or straight from the GPU runtime, one
 *    tensor at a time; no copy of the whole model is made.
 *  - For a load, every tensor is stored as the loader reads it (ckpt_param.store): into the host
 *    copies, or straight to the GPU runtime (a ZeRO rank's moments cut to its shard on the
 *    way), one tensor at a time. */
#ifndef MOEC_HF_VIEW_H
#define MOEC_HF_VIEW_H

#include "ckpt.h"
#include "gpu_exec.h"
#include "ir.h"
#include "params.h"

/* The parameters a rank writes or reads: a graph's, or with experts_only its experts alone (an
 * EP rank other than 0 writes its experts; rank 0 the dense parameters too), or with
 * shards_only none whole (a ZeRO rank outside DP group 0 writes only its moment shards). */
typedef struct {
  const ir_graph *g;
  rt_params *ps;
  int experts_only, shards_only;
} ckpt_part;

typedef struct hf_src hf_src;
typedef struct {
  ckpt_param *cp; /* (n) */
  hf_src *src;    /* (n) */
  int n;
} hf_view;

/* A save's view of part: fetched from rt when not NULL, else from the host copies; the moments
 * whole, or a ZeRO-sharded parameter's shard (ckpt_param.shard_n). -1 when out of memory or a
 * parameter is missing from part's store. */
int hf_view_for_save(const ckpt_part *part, gpu_runtime *rt, hf_view *v);
/* The same for the optimizer part: part's parameters and every ZeRO-sharded one of the graph. */
int hf_view_for_save_moments(const ckpt_part *part, gpu_runtime *rt, hf_view *v);
/* A load's view of part: stored into rt when not NULL, else into the host copies. */
int hf_view_for_load(const ckpt_part *part, gpu_runtime *rt, hf_view *v);
void hf_view_free(hf_view *v);
/* The contents for ckpt_save / ckpt_load / ckpt_parts_write: g's config, v's parameters. */
ckpt_contents hf_view_contents(const ir_graph *g, const hf_view *v);

#endif
