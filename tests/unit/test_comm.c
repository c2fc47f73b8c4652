/* test_comm.c -- the in-process communicator: every collective (and comm.c's reduce-scatter over
 * them) on the world, EP and DP groups
 * of an EP x DP world of threads, against serial results (sums in rank order, bit for bit);
 * a rank that never arrives makes the others fail with a message, not hang. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm.h"

#define NV 1000
#include "comm_test.h"

typedef struct {
  comm_world *w;
  int rank, skip_barrier;
  int rc_timeout;
  char err[512];
} targ;

/* bytes rank `from` sends to rank `to` in the all-to-all test */
static size_t a2a_bytes(int from, int to) { return (size_t)((from * 7 + to * 3) % 5) * 4; }

static void *rank_main(void *p) {
  targ *a = p;
  int ep = 0, dp = 0, W = comm_world_size(a->w);
  for (comm_group grp = COMM_WORLD; grp < COMM_GROUPS; grp++) {
    comm *c = comm_get(a->w, a->rank, grp);
    int P = comm_size(c), me = comm_rank(c);
    if (grp == COMM_EP) ep = P;
    if (grp == COMM_DP) dp = P;
    (void)ep, (void)dp;
    /* all_reduce f32 and i32 against the serial sum in group rank order */
    float buf[NV];
    int32_t ib[NV];
    memcpy(buf, data[a->rank], sizeof buf);
    memcpy(ib, idata[a->rank], sizeof ib);
    char err[512];
    CHECK(comm_all_reduce_sum(c, buf, NV, COMM_F32, err, sizeof err) == 0, "%s", err);
    CHECK(comm_all_reduce_sum(c, ib, NV, COMM_I32, err, sizeof err) == 0, "%s", err);
    int members[16];
    CHECK(comm_all_gather(c, &a->rank, sizeof(int), members, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < NV; i++) {
      float s = data[members[0]][i];
      int32_t is = idata[members[0]][i];
      for (int j = 1; j < P; j++) s += data[members[j]][i], is += idata[members[j]][i];
      if (buf[i] != s || ib[i] != is) {
        CHECK(0, "%s all_reduce: rank %d value %d: %g vs %g", comm_group_name(grp), a->rank, i, buf[i], s);
        break;
      }
    }
    for (int j = 0; j + 1 < P; j++) CHECK(members[j] < members[j + 1], "group ranks ascend");
    CHECK(members[me] == a->rank, "all_gather order");
    check_reduce_scatter(c, grp, a->rank, members);
    /* broadcast from the last group rank */
    int64_t v = a->rank * 100 + 1;
    CHECK(comm_broadcast(c, &v, sizeof v, P - 1, err, sizeof err) == 0, "%s", err);
    CHECK(v == members[P - 1] * 100 + 1, "broadcast: %lld", (long long)v);
    /* all_to_all_v: counts first, then the data; segment from j holds j's world rank and me */
    size_t sb[16], rb[16], tot = 0;
    for (int j = 0; j < P; j++) tot += sb[j] = a2a_bytes(a->rank, members[j]);
    int32_t *send = malloc(tot + 4), *recv = malloc(64 * 16 + 4);
    size_t o = 0;
    for (int j = 0; j < P; j++)
      for (size_t b = 0; b < sb[j] / 4; b++) send[o++] = a->rank * 1000 + members[j];
    CHECK(comm_all_to_all_counts(c, sb, rb, err, sizeof err) == 0, "%s", err);
    for (int j = 0; j < P; j++) CHECK(rb[j] == a2a_bytes(members[j], a->rank), "counts from %d", j);
    CHECK(comm_all_to_all_v(c, send, sb, recv, rb, err, sizeof err) == 0, "%s", err);
    o = 0;
    for (int j = 0; j < P; j++)
      for (size_t b = 0; b < rb[j] / 4; b++, o++) CHECK(recv[o] == members[j] * 1000 + a->rank, "a2a payload");
    free(send);
    free(recv);
    CHECK(comm_barrier(c, err, sizeof err) == 0, "%s", err);
  }
  /* the timeout: one rank skips the barrier; the others fail, naming it */
  if (a->skip_barrier < W) {
    if (a->rank != a->skip_barrier) a->rc_timeout = comm_barrier(comm_get(a->w, a->rank, COMM_WORLD), a->err, sizeof a->err);
  }
  return NULL;
}

static void run(int ep, int dp, int skip) {
  comm_world *w = comm_world_new(ep, dp, 0.3);
  CHECK(w != NULL, "world");
  int W = ep * dp;
  pthread_t th[16];
  targ a[16];
  for (int r = 0; r < W; r++) {
    a[r] = (targ){w, r, skip, 0, ""};
    pthread_create(&th[r], NULL, rank_main, &a[r]);
  }
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
  if (skip < W)
    for (int r = 0; r < W; r++) {
      if (r == skip) continue;
      CHECK(a[r].rc_timeout == -1, "rank %d: barrier without rank %d succeeded", r, skip);
      char want[32];
      snprintf(want, sizeof want, " %d (never arrived)", skip);
      CHECK(strstr(a[r].err, "timed out") && strstr(a[r].err, want), "rank %d: message: %s", r, a[r].err);
    }
  comm_world_free(w);
}

int main(void) {
  fill();
  run(1, 1, 99);
  run(2, 1, 99);
  run(1, 3, 99);
  run(2, 2, 99);
  run(4, 2, 99);
  run(2, 2, 3); /* rank 3 never reaches the last barrier */
  /* layout: rank = dp_index * EP + ep_index */
  comm_world *w = comm_world_new(2, 3, 1);
  comm *c = comm_get(w, 5, COMM_EP), *d = comm_get(w, 5, COMM_DP);
  CHECK(comm_rank(c) == 1 && comm_size(c) == 2 && comm_rank(d) == 2 && comm_size(d) == 3, "rank layout");
  comm_world_free(w);
  if (!failures) printf("comm: all collectives match the serial results; a missing rank times out\n");
  return failures != 0;
}
