/* comm_test.h -- what the communicator and bootstrap tests share: a monotonic clock and a free
 * loopback TCP port; with NV defined first, each rank's deterministic data (data, idata:
 * 16 ranks x NV values, from fill()) and the reduce-scatter check (needs check.h and comm.h
 * first). Include once per test program. */
#ifndef MOEC_COMM_TEST_H
#define MOEC_COMM_TEST_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A port nothing listens on now (bound once and released; the tests use it at once). */
static inline int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bind(fd, (struct sockaddr *)&a, sizeof a);
  getsockname(fd, (struct sockaddr *)&a, &len);
  close(fd);
  return ntohs(a.sin_port);
}

#ifdef NV
static float data[16][NV];
static int32_t idata[16][NV];

static inline uint64_t rng(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

static inline void fill(void) {
  uint64_t s = 7;
  for (int r = 0; r < 16; r++)
    for (int i = 0; i < NV; i++) {
      data[r][i] = (float)((double)rng(&s) / 2147483648.0 - 1.0) * 1e3f;
      idata[r][i] = (int32_t)(rng(&s) % 1000) - 500;
    }
}

#ifdef MOEC_COMM_H
/* comm_reduce_scatter_sum of the ranks' data[..][0, n) against the serial sum in group rank
 * order, bit for bit (members: the group's world ranks), for n a multiple of the group size,
 * not one, and smaller than it (some shards empty); the padding past n must be zero. */
static inline void check_reduce_scatter(comm *c, comm_group grp, int me, const int *members) {
  const int P = comm_size(c), gr = comm_rank(c);
  const int64_t sizes[] = {NV, NV - 3, 7, P > 1 ? P - 1 : 1};
  for (int k = 0; k < 4; k++) {
    const int64_t n = sizes[k], chunk = (n + P - 1) / P;
    float out[NV];
    char err[1024];
    memset(out, 0xff, sizeof out); /* NaN: the padding must be written */
    CHECK(comm_reduce_scatter_sum(c, data[me], n, out, err, sizeof err) == 0, "reduce_scatter: %s", err);
    for (int64_t i = 0; i < chunk; i++) {
      int64_t at = (int64_t)gr * chunk + i;
      float s = 0;
      if (at < n) {
        s = data[members[0]][at];
        for (int j = 1; j < P; j++) s += data[members[j]][at];
      }
      if (memcmp(&out[i], &s, sizeof s) != 0) {
        CHECK(0, "%s reduce_scatter of %lld: rank %d value %lld: %.9g vs %.9g", comm_group_name(grp), (long long)n, me,
              (long long)i, out[i], s);
        break;
      }
    }
  }
}
#endif
#endif

#endif
