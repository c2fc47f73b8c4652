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
/* Rows that rank j sends to rank i in the forward exchange: j's rows of i's experts. */
int64_t ep_seg(int64_t E, int P, const int32_t *all, int j, int i);
/* The regrouping between the by-rank layout (segment j = rank j's rows of my experts, each
 * sorted by local expert) and the by-expert one (local expert l's rows of rank 0, then 1, ...):
 * block l * P + j (local expert l, source rank j) is n rows at row by_rank of the one and row
 * by_expert of the other. blocks has E/P * P entries. */
typedef struct {
  int64_t by_rank, by_expert, n;
} ep_block;
void ep_blocks(int P, int me, int64_t E, const int32_t *all, ep_block *blocks);
/* out (E/P) <- rows of each local expert summed over the EP group, in rank order. */
void ep_local_counts(int P, int me, int64_t E, const int32_t *all, int32_t *out);

#endif
