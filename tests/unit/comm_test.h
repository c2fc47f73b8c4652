/* comm_test.h -- what the communicator and bootstrap tests share: a monotonic clock and a free
 * loopback TCP port; with NV defined first, each rank's deterministic data (data, idata:
 * 16 ranks x NV values, from fill()). Include once per test program. */
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
#endif

#endif
