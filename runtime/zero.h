/* zero.h -- ZeRO-1 on the host: each rank keeps the AdamW moments of its shard of every
 * parameter that the step graph updates with `adamw {zero = group}` (passes/sync.c,
 * docs/parallel.md). A shard of n values over a group of G ranks is [r c, min(n, (r+1) c)),
 * c = ceil(n / G), r the rank's place in the group: rt_param's mlo and mn.
 *
 * Checkpoints: every rank writes its own shards (ckpt.h, ".shard" tensors), and a load reads
 * whole moments (assembled from any shards), then zero_shard cuts them. So a checkpoint moves
 * between zero and not, and across world sizes; no rank gathers a whole moment to write it
 * (a load still reads whole ones before cutting: docs/parallel.md). Returns 0, or -1 with a
 * message in err. */
#ifndef MOEC_ZERO_H
#define MOEC_ZERO_H

#include <stddef.h>

#include "comm.h"
#include "ir.h"
#include "params.h"

/* Every whole parameter that step shards: keep this rank's shard of m and v, free the rest. */
int zero_shard(rt_params *ps, const ir_graph *step, comm_world *w, int rank, char *err, size_t errlen);
/* Bytes of AdamW moments this rank holds, at `bytes` a value (4: f32, the host's; 2: bf16, a
 * GPU's with moments = bf16): m and v of every value held, or of every value when `whole`. */
size_t zero_moment_bytes(const rt_params *ps, size_t bytes, int whole);

#endif
