/* bootstrap.c -- the torchrun environment, and the TCP mesh between the ranks (bootstrap.h). */
#include "bootstrap.h"
#include "errf.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BOOT_MAGIC 0x6d6f6562u /* "moeb" */
#define WORLD_MAX 65536


/* An integer in [lo, hi] from variable name; -1 with a message when not. */
static int env_int(const char *name, const char *v, long lo, long hi, int *out, char *err, size_t errlen) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    return errf(err, errlen, "%s=%s: expected an integer from %ld to %ld", name, v, lo, hi);
  *out = (int)x;
  return 0;
}

int boot_env_read(boot_env *e, char *err, size_t errlen) {
  memset(e, 0, sizeof *e);
  const char *ws = getenv("WORLD_SIZE"), *rk = getenv("RANK"), *lr = getenv("LOCAL_RANK");
  const char *ma = getenv("MASTER_ADDR"), *mp = getenv("MASTER_PORT"), *bt = getenv("MOEC_BOOT_TIMEOUT");
  if (!ws || !*ws) {
    if (rk && *rk && strcmp(rk, "0") != 0)
      return errf(err, errlen, "RANK=%s is set but WORLD_SIZE is not (set both, as torchrun and moec launch do)", rk);
    return 0;
  }
  if (env_int("WORLD_SIZE", ws, 1, WORLD_MAX, &e->world, err, errlen)) return -1;
  if (!rk || !*rk) {
    if (e->world == 1) return 0;
    return errf(err, errlen, "WORLD_SIZE=%s is set but RANK is not (each process needs its rank, 0 to %d)", ws, e->world - 1);
  }
  char *end;
  errno = 0;
  long r = strtol(rk, &end, 10);
  if (errno || end == rk || *end || r < 0) return errf(err, errlen, "RANK=%s: expected a non-negative integer", rk);
  if (r >= e->world)
    return errf(err, errlen, "RANK=%s is not below WORLD_SIZE=%s (the ranks are 0 to %d)", rk, ws, e->world - 1);
  e->rank = (int)r;
  if (e->world == 1) return 0;
  if (lr && *lr && env_int("LOCAL_RANK", lr, 0, WORLD_MAX - 1, &e->local_rank, err, errlen)) return -1;
  if (!ma || !*ma)
    return errf(err, errlen, "MASTER_ADDR is not set (the host of rank 0, e.g. 127.0.0.1; torchrun and moec launch set it)");
  if (strlen(ma) >= sizeof e->master_addr) return errf(err, errlen, "MASTER_ADDR is too long (%zu characters)", strlen(ma));
  snprintf(e->master_addr, sizeof e->master_addr, "%s", ma);
  if (!mp || !*mp) return errf(err, errlen, "MASTER_PORT is not set (the port rank 0 listens on, e.g. 29500)");
  if (env_int("MASTER_PORT", mp, 1, 65535, &e->master_port, err, errlen)) return -1;
  e->timeout_s = 300;
  if (bt && *bt) {
    e->timeout_s = strtod(bt, &end);
    if (end == bt || *end || !(e->timeout_s > 0))
      return errf(err, errlen, "MOEC_BOOT_TIMEOUT=%s: expected a positive number of seconds", bt);
  }
  return 1;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits for fd to be ready for ev until the deadline: 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short ev, double deadline) {
  for (;;) {
    double left = deadline - now_s();
    if (left <= 0) return 0;
    struct pollfd p = {fd, ev, 0};
    int r = poll(&p, 1, (int)(left * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r > 0) return 1;
  }
}

/* 0, or -1 (errno; ETIMEDOUT on the deadline, EPIPE on a closed stream). */
static int io_all(int fd, void *buf, size_t n, int writing, double deadline) {
  char *p = buf;
  while (n) {
    int w = wait_fd(fd, writing ? POLLOUT : POLLIN, deadline);
    if (w <= 0) {
      if (w == 0) errno = ETIMEDOUT;
      return -1;
    }
    ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = EPIPE;
      return -1;
    }
    p += k, n -= (size_t)k;
  }
  return 0;
}

static int listen_on(uint16_t port, uint16_t *bound, int backlog) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(port);
  socklen_t len = sizeof a;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, backlog) || getsockname(fd, (struct sockaddr *)&a, &len)) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  *bound = ntohs(a.sin_port);
  return fd;
}

/* Connects to addr:port, retrying refused connections until the deadline. */
static int connect_retry(struct in_addr addr, uint16_t port, double deadline) {
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr = addr;
    a.sin_port = htons(port);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
    int e = errno;
    close(fd);
    if (now_s() >= deadline) {
      errno = e;
      return -1;
    }
    if (e != ECONNREFUSED && e != ETIMEDOUT && e != ENETUNREACH && e != EHOSTUNREACH && e != EINTR && e != ECONNRESET) {
      errno = e;
      return -1;
    }
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

static int accept_until(int lfd, double deadline) {
  for (;;) {
    int w = wait_fd(lfd, POLLIN, deadline);
    if (w <= 0) {
      if (w == 0) errno = ETIMEDOUT;
      return -1;
    }
    int fd = accept(lfd, NULL, NULL);
    if (fd >= 0 || (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN)) return fd;
  }
}

typedef struct {
  uint32_t magic;
  int32_t rank, world;
  uint32_t port; /* the sender's listening port */
} hello;

typedef struct {
  uint32_t ip; /* network order */
  uint32_t port;
} peer_addr;

static void close_all(int *fds, int n) {
  for (int j = 0; j < n; j++)
    if (fds[j] >= 0) close(fds[j]), fds[j] = -1;
}

int boot_mesh(const boot_env *e, const void *blob, size_t blob_len, void *blob_out, size_t *blob_out_len, int *fds,
              char *err, size_t errlen) {
  int n = e->world, me = e->rank, lfd = -1, rc = -1;
  double deadline = now_s() + e->timeout_s;
  for (int j = 0; j < n; j++) fds[j] = -1;
  peer_addr *tab = calloc((size_t)n, sizeof *tab);
  if (!tab) return errf(err, errlen, "bootstrap: out of host memory");
  uint32_t blen = 0;
  char where[64];
  snprintf(where, sizeof where, "bootstrap (rank %d of %d)", me, n);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  int gai = getaddrinfo(e->master_addr, NULL, &hints, &res);
  if (gai || !res) {
    errf(err, errlen, "%s: MASTER_ADDR=%s: %s", where, e->master_addr, gai ? gai_strerror(gai) : "no IPv4 address");
    goto out;
  }
  struct in_addr master = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  uint16_t my_port = 0;
  if (me == 0) {
    if (blob_len > BOOT_BLOB_MAX) {
      errf(err, errlen, "%s: the blob is %zu bytes, more than %d", where, blob_len, BOOT_BLOB_MAX);
      goto out;
    }
    blen = (uint32_t)blob_len;
    if ((lfd = listen_on((uint16_t)e->master_port, &my_port, n + 16)) < 0) {
      errf(err, errlen, "%s: cannot listen on MASTER_PORT=%d: %s", where, e->master_port, strerror(errno));
      goto out;
    }
    for (int got = 0; got < n - 1; got++) {
      int fd = accept_until(lfd, deadline);
      if (fd < 0) {
        int k = errf(err, errlen, "%s: only %d of the other %d ranks connected to port %d within %.0f s; missing rank(s):", where, got,
                     n - 1, e->master_port, e->timeout_s);
        (void)k;
        size_t L = strlen(err);
        for (int j = 1; j < n && L + 8 < errlen; j++)
          if (fds[j] < 0) L += (size_t)snprintf(err + L, errlen - L, " %d", j);
        goto out;
      }
      hello h;
      struct sockaddr_in pa;
      socklen_t pl = sizeof pa;
      if (io_all(fd, &h, sizeof h, 0, deadline) || getpeername(fd, (struct sockaddr *)&pa, &pl)) {
        errf(err, errlen, "%s: a rank connected but did not say its rank: %s", where, strerror(errno));
        close(fd);
        goto out;
      }
      if (h.magic != BOOT_MAGIC) {
        errf(err, errlen, "%s: something that is not a moec rank connected to MASTER_PORT=%d", where, e->master_port);
        close(fd);
        goto out;
      }
      if (h.world != n || h.rank <= 0 || h.rank >= n || fds[h.rank] >= 0) {
        errf(err, errlen, "%s: a process with RANK=%d WORLD_SIZE=%d connected, but rank 0 has WORLD_SIZE=%d%s", where, h.rank,
             h.world, n, h.rank > 0 && h.rank < n && fds[h.rank] >= 0 ? " and already has that rank" : "");
        close(fd);
        goto out;
      }
      fds[h.rank] = fd;
      tab[h.rank] = (peer_addr){pa.sin_addr.s_addr, h.port};
    }
    for (int j = 1; j < n; j++) {
      uint32_t hdr[2] = {BOOT_MAGIC, blen};
      if (io_all(fds[j], hdr, sizeof hdr, 1, deadline) || io_all(fds[j], tab, (size_t)n * sizeof *tab, 1, deadline) ||
          (blen && io_all(fds[j], (void *)blob, blen, 1, deadline))) {
        errf(err, errlen, "%s: sending the address table to rank %d: %s", where, j, strerror(errno));
        goto out;
      }
    }
    if (blen) memcpy(blob_out, blob, blen);
    close(lfd), lfd = -1;
  } else {
    if ((lfd = listen_on(0, &my_port, n + 16)) < 0) {
      errf(err, errlen, "%s: cannot open a listening socket: %s", where, strerror(errno));
      goto out;
    }
    if ((fds[0] = connect_retry(master, (uint16_t)e->master_port, deadline)) < 0) {
      errf(err, errlen, "%s: cannot connect to rank 0 at MASTER_ADDR=%s MASTER_PORT=%d within %.0f s: %s (is rank 0 running?)",
           where, e->master_addr, e->master_port, e->timeout_s, strerror(errno));
      goto out;
    }
    hello h = {BOOT_MAGIC, me, n, my_port};
    uint32_t hdr[2];
    if (io_all(fds[0], &h, sizeof h, 1, deadline) || io_all(fds[0], hdr, sizeof hdr, 0, deadline)) {
      errf(err, errlen, "%s: rank 0 at %s:%d did not answer: %s (it refused this rank, or exited; see its error)", where,
           e->master_addr, e->master_port, strerror(errno));
      goto out;
    }
    if (hdr[0] != BOOT_MAGIC || hdr[1] > BOOT_BLOB_MAX) {
      errf(err, errlen, "%s: MASTER_ADDR=%s MASTER_PORT=%d is not a moec rank 0", where, e->master_addr, e->master_port);
      goto out;
    }
    blen = hdr[1];
    if (io_all(fds[0], tab, (size_t)n * sizeof *tab, 0, deadline) || (blen && io_all(fds[0], blob_out, blen, 0, deadline))) {
      errf(err, errlen, "%s: reading the address table from rank 0: %s", where, strerror(errno));
      goto out;
    }
    /* the mesh: connect to the ranks below (their listeners are up: they said hello first) */
    for (int j = 1; j < me; j++) {
      struct in_addr a = {tab[j].ip};
      if ((fds[j] = connect_retry(a, (uint16_t)tab[j].port, deadline)) < 0) {
        errf(err, errlen, "%s: cannot connect to rank %d at %s:%u: %s", where, j, inet_ntoa(a), tab[j].port, strerror(errno));
        goto out;
      }
      hello hj = {BOOT_MAGIC, me, n, 0};
      if (io_all(fds[j], &hj, sizeof hj, 1, deadline)) {
        errf(err, errlen, "%s: greeting rank %d: %s", where, j, strerror(errno));
        goto out;
      }
    }
    for (int k = me + 1; k < n; k++) {
      int fd = accept_until(lfd, deadline);
      hello hj;
      if (fd < 0 || io_all(fd, &hj, sizeof hj, 0, deadline)) {
        errf(err, errlen, "%s: waiting for the ranks above it to connect: %s", where, strerror(errno));
        if (fd >= 0) close(fd);
        goto out;
      }
      if (hj.magic != BOOT_MAGIC || hj.world != n || hj.rank <= me || hj.rank >= n || fds[hj.rank] >= 0) {
        errf(err, errlen, "%s: an unexpected connection (rank %d of %d) on its mesh port", where, hj.rank, hj.world);
        close(fd);
        goto out;
      }
      fds[hj.rank] = fd;
    }
    close(lfd), lfd = -1;
  }
  *blob_out_len = blen;
  rc = 0;
out:
  if (lfd >= 0) close(lfd);
  if (rc) close_all(fds, n);
  free(tab);
  return rc;
}
