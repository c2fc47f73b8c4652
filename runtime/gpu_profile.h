/* gpu_profile.h -- where a GPU training step spends its time, op by op (MOEC_PROFILE=1).
 *
 * One event is recorded on the stream before each IR op and one after the last; after the
 * step, the time between consecutive events is charged to the op between them. Events time
 * the GPU's own timeline, so a host synchronisation shows up as the gap it leaves, charged to
 * the op that caused it. Steps before `skip` (warm-up: NVRTC compiles, cuBLASLt heuristics)
 * are not counted. The host clock at each mark gives the time spent issuing each op.
 * gpu_profile_print writes one table: total per op kind, then the slowest
 * single ops with their source location.
 * MOEC_PROFILE=host records no events: it splits the host's time per op into moec's own work,
 * queueing GPU work (launches, cuBLASLt, cuDNN) and waiting for the GPU (gpu_host_stats), to
 * find what bounds a step whose GPU waits for the host.
 */
#ifndef MOEC_GPU_PROFILE_H
#define MOEC_GPU_PROFILE_H

#include <stdio.h>

#include "../ir/ir.h"
#include "gpu_loader.h"

typedef struct gpu_profile gpu_profile;

/* NULL (and no error) when MOEC_PROFILE is unset or 0. */
gpu_profile *gpu_profile_from_env(gpu_ctx *g, const ir_graph *graph);
/* Marks the start of op `id` (id = n_nodes marks the end of the step). */
void gpu_profile_mark(gpu_profile *p, int id);
/* After the last mark of a step: waits for the stream and adds the step's times. */
void gpu_profile_step_done(gpu_profile *p);
/* After a step that failed part way: drops its marks (and releases the kernel hook). */
void gpu_profile_step_abort(gpu_profile *p);
void gpu_profile_print(const gpu_profile *p, FILE *out);
void gpu_profile_free(gpu_profile *p);

#endif
