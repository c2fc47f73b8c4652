/* gpu_rowstats.h -- the row statistics an attention forward leaves for its backward (the
 * flash kernels' logsumexp, cuDNN's softmax stats), kept between the two in a small cache
 * keyed by the (q, k, v, out) buffers and the shape: the executor calls the backward with the
 * same, unchanged buffers it gave the forward. A backward that finds no entry gets a fresh
 * one and recomputes the statistics (a forward into scratch).
 *
 * Buffer addresses change from run to run while the pool settles, so a new entry takes a
 * stale one's buffer first (an entry not used since the last gpu_rowstats_new_run) when it
 * fits, else the least recently used slot; taking empty slots then would hold ever more
 * memory. */
#ifndef MOEC_GPU_ROWSTATS_H
#define MOEC_GPU_ROWSTATS_H

#include <stddef.h>
#include <stdint.h>

#include "gpu_loader.h"

typedef struct {
  gpu_ptr q, k, v, out;
  int64_t B, seq, nh, nkv, hd;
  int causal;
} gpu_rowstats_key;

typedef struct gpu_rowstats gpu_rowstats;

/* what names the buffers in an out-of-memory message ("attention logsumexp"). */
gpu_rowstats *gpu_rowstats_new(gpu_ctx *g, const char *what);
void gpu_rowstats_free(gpu_rowstats *c); /* the caller has synchronised the stream */
void gpu_rowstats_new_run(gpu_rowstats *c);
/* The buffer (at least bytes) of key's entry; *fresh = 1 when the entry is new (nothing
 * written in it for these buffers). 0 and err on out of memory. */
gpu_ptr gpu_rowstats_get(gpu_rowstats *c, const gpu_rowstats_key *key, size_t bytes, int *fresh, char *err,
                         size_t errlen);
/* Forgets key's entry (its statistics were never written: the forward failed). */
void gpu_rowstats_drop(gpu_rowstats *c, const gpu_rowstats_key *key);

#endif
