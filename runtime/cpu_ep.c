/* cpu_ep.c -- the expert-parallel row exchange on the CPU (cpu_ep.h). */
#include "cpu_ep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errf.h"

int ep_gather_counts(comm *c, int64_t E, const int32_t *counts, int32_t *all, char *err, size_t errlen) {
  return comm_all_gather(c, counts, (size_t)E * sizeof *counts, all, err, errlen);
}

int64_t ep_seg(int64_t E, int P, const int32_t *all, int j, int i) {
  int64_t El = E / P, n = 0;
  for (int64_t e = i * El; e < (i + 1) * El; e++) n += all[j * E + e];
  return n;
}

int64_t ep_rows(int P, int me, int64_t E, const int32_t *all, int reverse) {
  int64_t n = 0;
  for (int j = 0; j < P; j++) n += reverse ? ep_seg(E, P, all, me, j) : ep_seg(E, P, all, j, me);
  return n;
}

void ep_local_counts(int P, int me, int64_t E, const int32_t *all, int32_t *out) {
  int64_t El = E / P;
  for (int64_t l = 0; l < El; l++) {
    int32_t n = 0;
    for (int j = 0; j < P; j++) n += all[j * E + me * El + l];
    out[l] = n;
  }
}

void ep_blocks(int P, int me, int64_t E, const int32_t *all, ep_block *blocks) {
  int64_t El = E / P, by_expert = 0;
  for (int64_t l = 0; l < El; l++)
    for (int j = 0; j < P; j++) {
      int64_t by_rank = 0; /* rank j's segment start, then its rows before local expert l */
      for (int i = 0; i < j; i++) by_rank += ep_seg(E, P, all, i, me);
      for (int64_t m = 0; m < l; m++) by_rank += all[j * E + me * El + m];
      int64_t n = all[j * E + me * El + l];
      blocks[l * P + j] = (ep_block){by_rank, by_expert, n};
      by_expert += n;
    }
}

/* Moves C-column rows between the by-rank and by-expert layouts (ep_blocks). */
static int regroup(int P, int me, int64_t E, const int32_t *all, const float *src, float *dst, int64_t C, int to_expert) {
  int64_t nb = E / P * P;
  ep_block *b = malloc((size_t)(nb > 0 ? nb : 1) * sizeof *b);
  if (!b) return -1;
  ep_blocks(P, me, E, all, b);
  for (int64_t i = 0; i < nb; i++) {
    size_t bytes = (size_t)(b[i].n * C) * sizeof(float);
    if (to_expert) memcpy(dst + b[i].by_expert * C, src + b[i].by_rank * C, bytes);
    else memcpy(dst + b[i].by_rank * C, src + b[i].by_expert * C, bytes);
  }
  free(b);
  return 0;
}

int ep_exchange(comm *c, int64_t E, const int32_t *all, const float *x, int64_t C, int reverse, float *out, char *err,
                size_t errlen) {
  int P = comm_size(c), me = comm_rank(c);
  size_t *sb = calloc((size_t)P, sizeof *sb), *rb = calloc((size_t)P, sizeof *rb);
  int64_t mine = ep_rows(P, me, E, all, 0);
  float *tmp = malloc((size_t)(mine * C + 1) * sizeof *tmp);
  int rc = -1;
  if (!sb || !rb || !tmp) {
    snprintf(err, errlen, "out of host memory in the EP exchange");
    goto done;
  }
  for (int j = 0; j < P; j++) {
    int64_t s = reverse ? ep_seg(E, P, all, j, me) : ep_seg(E, P, all, me, j);
    sb[j] = (size_t)(s * C) * sizeof(float);
  }
  if (comm_all_to_all_counts(c, sb, rb, err, errlen)) goto done;
  if (reverse) {
    rc = regroup(P, me, E, all, x, tmp, C, 0) ? errf(err, errlen, "out of host memory in the EP exchange")
                                               : comm_all_to_all_v(c, tmp, sb, out, rb, err, errlen);
  } else {
    rc = comm_all_to_all_v(c, x, sb, tmp, rb, err, errlen);
    if (rc == 0 && regroup(P, me, E, all, tmp, out, C, 1)) rc = errf(err, errlen, "out of host memory in the EP exchange");
  }
done:
  free(sb);
  free(rb);
  free(tmp);
  return rc;
}
