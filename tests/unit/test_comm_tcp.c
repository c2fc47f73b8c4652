/* test_comm_tcp.c -- the TCP communicator: EP x DP worlds of forked processes, bootstrapped
 * on localhost through the torchrun variables, run every collective on the world, EP and DP
 * groups against serial results (sums in rank order, bit for bit); then the failures: a rank
 * that never arrives times out on the others (naming it), a rank that dies makes the others
 * fail at once (naming it), comm_abort reaches the others with its message, and a size
 * mismatch fails every rank. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "check.h"
#include "comm.h"

#define NV 3000 /* > a socket buffer's worth for the 4 KiB+ frames of all_gather below */
#include "comm_test.h"

enum { NORMAL, SKIP, DEAD, ABORT, MISMATCH };

static size_t a2a_bytes(int from, int to) { return (size_t)((from * 7 + to * 3) % 5) * 4 * 500; }

/* Every collective on every group of rank `me`; CHECK failures count in this process. */
static void collectives(comm_world *w, int me) {
  for (comm_group grp = COMM_WORLD; grp < COMM_GROUPS; grp++) {
    comm *c = comm_get(w, me, grp);
    CHECK(c != NULL, "handle");
    if (!c) return;
    int P = comm_size(c), gr = comm_rank(c);
    static float buf[NV];
    static int32_t ib[NV];
    memcpy(buf, data[me], sizeof buf);
    memcpy(ib, idata[me], sizeof ib);
    char err[1024];
    CHECK(comm_all_reduce_sum(c, buf, NV, COMM_F32, err, sizeof err) == 0, "%s", err);
    CHECK(comm_all_reduce_sum(c, ib, NV, COMM_I32, err, sizeof err) == 0, "%s", err);
    int members[16];
    CHECK(comm_all_gather(c, &me, sizeof(int), members, err, sizeof err) == 0, "%s", err);
    int bad = 0;
    for (int i = 0; i < NV && !bad; i++) {
      float s = data[members[0]][i];
      int32_t is = idata[members[0]][i];
      for (int j = 1; j < P; j++) s += data[members[j]][i], is += idata[members[j]][i];
      if (memcmp(&buf[i], &s, sizeof s) != 0 || ib[i] != is) {
        CHECK(0, "%s all_reduce: rank %d value %d: %.9g vs %.9g", comm_group_name(grp), me, i, buf[i], s);
        bad = 1;
      }
    }
    for (int j = 0; j + 1 < P; j++) CHECK(members[j] < members[j + 1], "group ranks ascend");
    CHECK(members[gr] == me, "all_gather order");
    check_reduce_scatter(c, grp, me, members);
    /* a large all_gather (both directions' buffers fill: the exchange must not deadlock) */
    static float big[16 * NV];
    CHECK(comm_all_gather(c, data[me], sizeof data[me], big, err, sizeof err) == 0, "%s", err);
    for (int j = 0; j < P; j++) CHECK(memcmp(big + (size_t)j * NV, data[members[j]], sizeof data[0]) == 0, "big all_gather from %d", j);
    int64_t v = me * 100 + 1;
    CHECK(comm_broadcast(c, &v, sizeof v, P - 1, err, sizeof err) == 0, "%s", err);
    CHECK(v == members[P - 1] * 100 + 1, "broadcast: %lld", (long long)v);
    size_t sb[16], rb[16], tot = 0;
    for (int j = 0; j < P; j++) tot += sb[j] = a2a_bytes(me, members[j]);
    int32_t *send = malloc(tot + 4), *recv = malloc(16 * 5 * 4 * 500 + 4);
    size_t o = 0;
    for (int j = 0; j < P; j++)
      for (size_t b = 0; b < sb[j] / 4; b++) send[o++] = me * 1000 + members[j];
    CHECK(comm_all_to_all_counts(c, sb, rb, err, sizeof err) == 0, "%s", err);
    for (int j = 0; j < P; j++) CHECK(rb[j] == a2a_bytes(members[j], me), "counts from %d", j);
    CHECK(comm_all_to_all_v(c, send, sb, recv, rb, err, sizeof err) == 0, "%s", err);
    o = 0;
    bad = 0;
    for (int j = 0; j < P; j++)
      for (size_t b = 0; b < rb[j] / 4; b++, o++)
        if (!bad && recv[o] != members[j] * 1000 + me) {
          CHECK(0, "a2a payload from %d", j);
          bad = 1;
        }
    free(send);
    free(recv);
    CHECK(comm_barrier(c, err, sizeof err) == 0, "%s", err);
  }
}

static int child(int ep, int dp, int me, int port, int mode, double timeout) {
  alarm(50); /* never hang the suite */
  failures = 0;
  char v[32];
  snprintf(v, sizeof v, "%d", me);
  setenv("RANK", v, 1);
  setenv("LOCAL_RANK", v, 1);
  snprintf(v, sizeof v, "%d", ep * dp);
  setenv("WORLD_SIZE", v, 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  snprintf(v, sizeof v, "%d", port);
  setenv("MASTER_PORT", v, 1);
  setenv("MOEC_BOOT_TIMEOUT", "20", 1);
  boot_env e;
  char err[1024] = "";
  int fds[16] = {-1};
  char blob[BOOT_BLOB_MAX];
  size_t blen = 0;
  if (ep * dp > 1) { /* one process is not a multi-process world: no bootstrap */
    CHECK(boot_env_read(&e, err, sizeof err) == 1, "env: %s", err);
    if (boot_mesh(&e, "id", 2, blob, &blen, fds, err, sizeof err)) {
      CHECK(0, "rank %d: %s", me, err);
      return 1;
    }
    CHECK(blen == 2 && memcmp(blob, "id", 2) == 0, "rank %d: the blob", me);
  }
  comm_world *w = comm_tcp_new(ep, dp, me, fds, timeout, err, sizeof err);
  CHECK(w != NULL, "%s", err);
  if (!w) return 1;
  CHECK(strcmp(comm_world_backend(w), "tcp") == 0 && (ep * dp == 1 || comm_get(w, (me + 1) % (ep * dp), COMM_WORLD) == NULL),
        "one rank's handles");
  collectives(w, me);
  int W = ep * dp, last = W - 1;
  comm *c = comm_get(w, me, COMM_WORLD);
  double t0 = now_s();
  int rc = 0;
  char want[64];
  switch (mode) {
  case SKIP: /* the last rank never reaches the barrier (stays alive) */
    if (me == last) {
      usleep(3000 * 1000);
      break;
    }
    rc = comm_barrier(c, err, sizeof err);
    snprintf(want, sizeof want, " %d (never arrived)", last);
    CHECK(rc == -1 && strstr(err, "timed out") && strstr(err, want), "rank %d: timeout message: %s", me, err);
    CHECK(now_s() - t0 < timeout + 5, "rank %d: the timeout took %.1f s", me, now_s() - t0);
    break;
  case DEAD: /* the last rank exits before the barrier */
    if (me == last) _exit(failures != 0);
    rc = comm_barrier(c, err, sizeof err);
    snprintf(want, sizeof want, "lost world rank %d", last);
    CHECK(rc == -1 && strstr(err, want), "rank %d: dead-peer message: %s", me, err);
    CHECK(now_s() - t0 < 5, "rank %d: noticing the dead rank took %.1f s", me, now_s() - t0);
    break;
  case ABORT:
    if (me == 0) {
      comm_abort(w, 0, "boom");
      break;
    }
    rc = comm_barrier(c, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "rank 0 stopped: boom"), "rank %d: abort message: %s", me, err);
    CHECK(now_s() - t0 < 5, "rank %d: the abort took %.1f s", me, now_s() - t0);
    break;
  case MISMATCH: {
    float x[11] = {0};
    rc = comm_all_reduce_sum(c, x, me == 1 ? 11 : 10, COMM_F32, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "n=11") && strstr(err, "n=10"), "rank %d: mismatch message: %s", me, err);
    /* and the world stays failed */
    CHECK(comm_barrier(c, err, sizeof err) == -1, "rank %d: a barrier after the failure succeeded", me);
    break;
  }
  default:
    break;
  }
  if (rc && getenv("VERBOSE")) fprintf(stderr, "rank %d (mode %d): %s\n", me, mode, err);
  comm_world_free(w);
  return failures != 0;
}

static void run(int ep, int dp, int mode, double timeout) {
  int W = ep * dp, port = free_port();
  pid_t pid[16];
  for (int r = 0; r < W; r++) {
    fflush(stdout), fflush(stderr);
    pid[r] = fork();
    if (pid[r] == 0) _exit(child(ep, dp, r, port, mode, timeout));
  }
  for (int r = 0; r < W; r++) {
    int st = 0;
    waitpid(pid[r], &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "ep %d x dp %d mode %d: rank %d failed (status %d)", ep, dp, mode, r, st);
  }
}

int main(void) {
  fill();
  if (getenv("ONLY")) {
    run(1, 2, NORMAL, 10);
    return failures != 0;
  }
  run(1, 1, NORMAL, 10);
  run(1, 2, NORMAL, 10);
  run(2, 1, NORMAL, 10);
  run(1, 3, NORMAL, 10);
  run(2, 2, NORMAL, 10);
  run(2, 2, SKIP, 0.5);
  run(2, 2, DEAD, 30);
  run(1, 3, ABORT, 30);
  run(1, 3, MISMATCH, 30);
  if (!failures)
    printf("comm_tcp: all collectives match the serial results over processes; timeout, dead peer, abort and "
           "mismatch fail with messages\n");
  return failures != 0;
}
