/* cpu_ep.h -- the expert-parallel row exchange on the CPU (the ep_all_to_all and
 * ep_local_counts ops; docs/parallel.md). P ranks in the EP group, E experts, rank j owns the
 * E/P experts [j*E/P, (j+1)*E/P). all holds every EP rank's counts (P x E, comm_all_gather). */
#ifndef MOEC_CPU_EP_H
#define MOEC_CPU_EP_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"

/* all (P*E) <- the counts of every rank of the EP group, in rank order. */
int ep_gather_counts(comm *c, int64_t E, const int32_t *counts, int32_t *all, char *err, size_t errlen);
/* Rows this rank holds after the forward exchange (reverse = 0: rows of its experts from every
 * rank) or after the reverse one (reverse = 1: its own sorted rows). */
int64_t ep_rows(int P, int me, int64_t E, const int32_t *all, int reverse);
/* The exchange of C-column float rows. Forward: x is this rank's expert-sorted rows; out gets
 * the rows of its experts grouped by local expert, then by source rank. Reverse: the other way. */
int ep_exchange(comm *c, int64_t E, const int32_t *all, const float *x, int64_t C, int reverse, float *out, char *err,
                size_t errlen);
/* out (E/P) <- rows of each local expert summed over the EP group, in rank order. */
void ep_local_counts(int P, int me, int64_t E, const int32_t *all, int32_t *out);

#endif
