/* comm_tcp.c -- the communicator backend for one rank per process: a full mesh of TCP
 * sockets (bootstrap.c connects it), one stream per pair of ranks.
 *
 * Every collective is one exchange on the group: to each peer, a frame (a header naming the
 * collective, the group and its sizes, then the payload); from each peer, its frame. Sends and
 * receives go on together through poll() on non-blocking sockets, so no pair blocks on full
 * buffers. A pair's collectives come in the same order on both ends (every rank runs the same
 * sequence), so the next frame on a stream is always the next collective's.
 *
 * all_reduce_sum gathers every member's values (in chunks of 1 Mi values) and sums them in
 * group rank order, ((x_0 + x_1) + x_2) ..., the order of the thread backend: every rank gets
 * the same bits, and the same bits as the threads.
 *
 * Failure: a header that disagrees (another collective, group or size) fails with both
 * named; no progress from a peer for timeout_s fails naming the peers not heard from; a
 * closed stream names the peer that died. Any failure marks the world failed (later
 * collectives fail at once) and sends an abort frame with the message to every peer (or closes
 * the stream where a frame is half-sent), so they fail too instead of waiting. */
#include "comm_impl.h"
#include "errf.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { OP_ALL_REDUCE = 1, OP_ALL_GATHER, OP_BROADCAST, OP_BARRIER, OP_A2A_COUNTS, OP_A2A_V, OP_ABORT, OP_N };
static const char *const op_names[OP_N] = {"?", "all_reduce_sum", "all_gather", "broadcast", "barrier",
                                           "all_to_all_counts", "all_to_all_v", "abort"};
#define FRAME_MAGIC 0x6d6f6563u /* "moec" */
#define ABORT_MAX 1024
#define REDUCE_CHUNK ((int64_t)1 << 20)

typedef struct {
  uint32_t magic;
  uint16_t op, grp;
  int32_t root, dt;
  int64_t n;
  uint64_t bytes; /* the payload that follows */
} frame;

typedef struct {
  struct comm base;
  int members[]; /* (size) world ranks, ascending; allocated with the struct */
} kcomm;

typedef struct {
  struct comm_world base;
  int me;
  int *fds;   /* (n) */
  int *clean; /* (n) 1: no frame half-sent to that peer */
  int failed;
  char msg[ABORT_MAX + 64];
  kcomm *h[COMM_GROUPS];
} kworld;

#define KW(w) ((kworld *)(w))
static const comm_ops tcp_ops;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void close_fds(int *fds, int n, int me) {
  for (int j = 0; fds && j < n; j++)
    if (j != me && fds[j] >= 0) close(fds[j]), fds[j] = -1;
}

static void tcp_free(comm_world *cw) {
  kworld *w = KW(cw);
  if (w->failed && w->fds) {
    /* unread data at close would reset the stream, which can discard the abort frame this rank
     * sent: close the sending side, and read what the peers still send for a moment */
    for (int j = 0; j < w->base.n; j++)
      if (j != w->me && w->fds[j] >= 0) shutdown(w->fds[j], SHUT_WR);
    double dl = now_s() + 0.3;
    for (int j = 0; j < w->base.n; j++) {
      char buf[4096];
      while (j != w->me && w->fds[j] >= 0 && now_s() < dl) {
        struct pollfd p = {w->fds[j], POLLIN, 0};
        if (poll(&p, 1, 20) > 0 && recv(w->fds[j], buf, sizeof buf, MSG_DONTWAIT) <= 0) break;
      }
    }
  }
  close_fds(w->fds, w->base.n, w->me);
  free(w->fds);
  free(w->clean);
  for (int k = 0; k < COMM_GROUPS; k++) free(w->h[k]);
  free(w);
}

comm_world *comm_tcp_new(int ep, int dp, int rank, int *fds, double timeout_s, char *err, size_t errlen) {
  int n = ep * dp;
  if (ep < 1 || dp < 1 || rank < 0 || rank >= n) {
    snprintf(err, errlen, "comm: rank %d of ep %d x dp %d is out of range", rank, ep, dp);
    if (ep >= 1 && dp >= 1) close_fds(fds, n, rank);
    return NULL;
  }
  for (int j = 0; j < n; j++)
    if (j != rank && fds[j] < 0) {
      snprintf(err, errlen, "comm: rank %d has no connection to rank %d", rank, j);
      close_fds(fds, n, rank);
      return NULL;
    }
  kworld *w = calloc(1, sizeof *w);
  int ok = w != NULL;
  if (ok) {
    w->base = (struct comm_world){&tcp_ops, ep, dp, n, timeout_s};
    w->me = rank;
    w->fds = malloc((size_t)n * sizeof *w->fds);
    w->clean = malloc((size_t)n * sizeof *w->clean);
    ok = w->fds && w->clean;
  }
  for (int k = 0; ok && k < COMM_GROUPS; k++) {
    kcomm *h = calloc(1, sizeof *h + (size_t)n * sizeof(int));
    if (!(w->h[k] = h)) {
      ok = 0;
      break;
    }
    int me;
    int size = comm_layout(ep, dp, rank, (comm_group)k, h->members, &me);
    h->base = (struct comm){&w->base, (comm_group)k, me, size, rank};
  }
  if (!ok) {
    snprintf(err, errlen, "comm: out of host memory");
    close_fds(fds, n, rank);
    if (w) {
      w->fds = NULL;
      tcp_free(&w->base);
    }
    return NULL;
  }
  for (int j = 0; j < n; j++) {
    w->fds[j] = j == rank ? -1 : fds[j];
    w->clean[j] = 1;
    if (j == rank) continue;
    int one = 1;
    setsockopt(fds[j], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fds[j], F_SETFL, fcntl(fds[j], F_GETFL) | O_NONBLOCK);
  }
  return &w->base;
}

static comm *tcp_get(comm_world *cw, int rank, comm_group grp) {
  kworld *w = KW(cw);
  return rank == w->me ? &w->h[grp]->base : NULL;
}

/* Best effort, bounded: the abort frame to every peer whose stream is between frames; the
 * others' streams are closed (they see the end of the stream). */
static void send_aborts(kworld *w, const char *msg) {
  size_t len = strlen(msg);
  if (len > ABORT_MAX) len = ABORT_MAX;
  char buf[sizeof(frame) + ABORT_MAX];
  frame f = {FRAME_MAGIC, OP_ABORT, 0, 0, 0, 0, len};
  memcpy(buf, &f, sizeof f);
  memcpy(buf + sizeof f, msg, len);
  for (int j = 0; j < w->base.n; j++) {
    if (j == w->me || w->fds[j] < 0) continue;
    size_t off = 0, total = sizeof f + len;
    double dl = now_s() + 1.0;
    while (w->clean[j] && off < total && now_s() < dl) {
      ssize_t k = send(w->fds[j], buf + off, total - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) off += (size_t)k;
      else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        struct pollfd p = {w->fds[j], POLLOUT, 0};
        poll(&p, 1, 50);
      } else break;
    }
    if (off < total) shutdown(w->fds[j], SHUT_RDWR);
    w->clean[j] = 0; /* nothing more goes on this stream */
  }
}

static void fail(kworld *w, const char *msg) {
  if (w->failed) return;
  w->failed = 1;
  snprintf(w->msg, sizeof w->msg, "%s", msg);
  send_aborts(w, msg);
}

static void tcp_abort(comm_world *cw, int rank, const char *msg) {
  kworld *w = KW(cw);
  char m[768];
  snprintf(m, sizeof m, "rank %d stopped: %s", rank, msg);
  fail(w, m);
}


/* One peer's side of an exchange. */
typedef struct {
  const void *sbuf;
  size_t sbytes;
  int send;
  void *rbuf;
  size_t rbytes; /* what this rank expects */
  int recv;
  frame sh, rh;
  size_t soff, roff;
  char abort_msg[ABORT_MAX + 1];
} xfer;

/* Fails the world with the message and returns -1. */
static int xfail(kworld *w, const char *m, char *err, size_t errlen) {
  fail(w, m);
  return errf(err, errlen, "comm: %s", m);
}

/* The exchange of collective op on c's group: x[j] (group rank j) says what goes to and
 * comes from that peer; proto is the header this rank expects from every peer (its bytes
 * are x[j].rbytes). */
static int exchange(kcomm *c, int op, frame proto, xfer *x, char *err, size_t errlen) {
  kworld *w = KW(c->base.w);
  const char *on = op_names[op], *gn = comm_group_name(c->base.grp);
  if (w->failed) return errf(err, errlen, "comm: %s: %s", on, w->msg);
  int P = c->base.size, me = c->base.rank;
  proto.magic = FRAME_MAGIC, proto.op = (uint16_t)op, proto.grp = (uint16_t)c->base.grp;
  for (int j = 0; j < P; j++) {
    x[j].sh = proto;
    x[j].sh.bytes = x[j].sbytes;
    x[j].soff = x[j].roff = 0;
    if (j == me) x[j].send = x[j].recv = 0;
  }
  struct pollfd *pf = malloc((size_t)P * sizeof *pf);
  int *who = malloc((size_t)P * sizeof *who);
  if (!pf || !who) {
    free(pf), free(who);
    return xfail(w, "out of host memory", err, errlen);
  }
  double timeout = w->base.timeout_s > 0 ? w->base.timeout_s : 3600, last = now_s();
  char m[768];
  int rc = 0;
  for (;;) {
    int k = 0;
    for (int j = 0; j < P; j++) {
      short ev = (short)((x[j].send ? POLLOUT : 0) | (x[j].recv ? POLLIN : 0));
      if (!ev) continue;
      pf[k] = (struct pollfd){w->fds[c->members[j]], ev, 0};
      who[k++] = j;
    }
    if (k == 0) break;
    double left = last + timeout - now_s();
    int pr = left > 0 ? poll(pf, (nfds_t)k, (int)(left * 1000) + 1) : 0;
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) {
      snprintf(m, sizeof m, "world rank %d: poll failed in %s: %s", c->base.world_rank, on, strerror(errno));
      rc = xfail(w, m, err, errlen);
      break;
    }
    if (pr == 0 && now_s() >= last + timeout) {
      int n = snprintf(m, sizeof m, "world rank %d timed out after %g s in %s on the %s group waiting for world rank(s)",
                       c->base.world_rank, timeout, on, gn);
      for (int i = 0; i < k && n > 0 && (size_t)n < sizeof m; i++)
        n += snprintf(m + n, sizeof m - (size_t)n, " %d", c->members[who[i]]);
      if (n > 0 && (size_t)n < sizeof m) snprintf(m + n, sizeof m - (size_t)n, " (never arrived)");
      rc = xfail(w, m, err, errlen);
      break;
    }
    for (int i = 0; i < k && rc == 0; i++) {
      int j = who[i], peer = c->members[j], fd = pf[i].fd;
      xfer *t = &x[j];
      if (t->recv && (pf[i].revents & (POLLIN | POLLHUP | POLLERR))) {
        int in_header = t->roff < sizeof(frame);
        int aborting = !in_header && t->rh.op == OP_ABORT;
        char *dst = in_header ? (char *)&t->rh + t->roff
                              : (aborting ? t->abort_msg : (char *)t->rbuf) + (t->roff - sizeof(frame));
        size_t want = in_header ? sizeof(frame) - t->roff : sizeof(frame) + t->rh.bytes - t->roff;
        ssize_t got = recv(fd, dst, want, MSG_DONTWAIT);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          snprintf(m, sizeof m, "world rank %d lost world rank %d in %s on the %s group: %s (it exited or crashed)",
                   c->base.world_rank, peer, on, gn, got == 0 ? "the connection closed" : strerror(errno));
          rc = xfail(w, m, err, errlen);
          break;
        }
        if (got < 0) continue;
        last = now_s();
        t->roff += (size_t)got;
        if (in_header && t->roff == sizeof(frame)) {
          const frame *h = &t->rh;
          if (h->magic != FRAME_MAGIC || h->op == 0 || h->op >= OP_N || h->grp >= COMM_GROUPS) {
            snprintf(m, sizeof m, "world rank %d got a garbled frame from world rank %d in %s", c->base.world_rank, peer, on);
            rc = xfail(w, m, err, errlen);
          } else if (h->op == OP_ABORT) {
            if (h->bytes > ABORT_MAX) t->rh.bytes = 0;
          } else if (h->op != proto.op || h->grp != proto.grp || h->n != proto.n || h->dt != proto.dt ||
                     h->root != proto.root) {
            snprintf(m, sizeof m, "world rank %d called %s(n=%lld) on the %s group while world rank %d called %s(n=%lld) on the %s group",
                     peer, op_names[h->op], (long long)h->n, comm_group_name((comm_group)h->grp), c->base.world_rank, on,
                     (long long)proto.n, gn);
            rc = xfail(w, m, err, errlen);
          } else if (h->bytes != t->rbytes) {
            if (op == OP_A2A_V)
              snprintf(m, sizeof m, "all_to_all_v: world rank %d sends %llu bytes to world rank %d, which expects %zu", peer,
                       (unsigned long long)h->bytes, c->base.world_rank, t->rbytes);
            else
              snprintf(m, sizeof m, "%s on the %s group: world rank %d sends %llu bytes, world rank %d expects %zu", on, gn,
                       peer, (unsigned long long)h->bytes, c->base.world_rank, t->rbytes);
            rc = xfail(w, m, err, errlen);
          }
        }
        if (rc == 0 && t->roff >= sizeof(frame) && t->roff == sizeof(frame) + t->rh.bytes) {
          if (t->rh.op == OP_ABORT) {
            t->abort_msg[t->rh.bytes] = 0;
            w->failed = 1; /* the peer already told everyone */
            memcpy(w->msg, t->abort_msg, t->rh.bytes + 1);
            rc = errf(err, errlen, "comm: %s: %s", on, w->msg);
            send_aborts(w, w->msg);
            break;
          }
          t->recv = 0;
        }
      }
      if (rc == 0 && t->send && (pf[i].revents & (POLLOUT | POLLERR | POLLHUP))) {
        size_t total = sizeof(frame) + t->sbytes;
        const char *src = t->soff < sizeof(frame) ? (const char *)&t->sh + t->soff
                                                  : (const char *)t->sbuf + (t->soff - sizeof(frame));
        size_t want = t->soff < sizeof(frame) ? sizeof(frame) - t->soff : total - t->soff;
        ssize_t put = send(fd, src, want, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (put < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (put <= 0) {
          /* the peer is gone; its stream may still hold why (an abort frame): read that first */
          int e = put == 0 ? EPIPE : errno;
          t->send = 0;
          w->clean[peer] = 0;
          if (t->recv) continue;
          snprintf(m, sizeof m, "world rank %d lost world rank %d in %s on the %s group: %s (it exited or crashed)",
                   c->base.world_rank, peer, on, gn, strerror(e));
          rc = xfail(w, m, err, errlen);
          break;
        }
        last = now_s();
        t->soff += (size_t)put;
        w->clean[peer] = t->soff == total;
        if (t->soff == total) t->send = 0;
      }
    }
    if (rc) break;
  }
  free(pf);
  free(who);
  return rc;
}

static xfer *xfers(kcomm *c) { return calloc((size_t)c->base.size, sizeof(xfer)); }

static int oom(kcomm *c, const char *op, char *err, size_t errlen) {
  char m[128];
  snprintf(m, sizeof m, "%s: out of host memory", op);
  return xfail(KW(c->base.w), m, err, errlen);
}

static int tcp_all_reduce_sum(comm *cc, void *buf, int64_t n, comm_dtype dt, char *err, size_t errlen) {
  kcomm *c = (kcomm *)cc;
  int P = c->base.size, me = c->base.rank;
  int64_t chunk = n < REDUCE_CHUNK ? (n > 0 ? n : 1) : REDUCE_CHUNK;
  xfer *x = xfers(c);
  char *tmp = malloc((size_t)P * (size_t)chunk * 4);
  if (!x || !tmp) {
    free(x), free(tmp);
    return oom(c, "all_reduce_sum", err, errlen);
  }
  int rc = 0;
  int64_t off = 0;
  do {
    int64_t m = n - off < chunk ? n - off : chunk;
    if (m < 0) m = 0;
    size_t bytes = (size_t)m * 4;
    char *src = (char *)buf + (size_t)off * 4;
    for (int j = 0; j < P; j++)
      x[j] = (xfer){.sbuf = src, .sbytes = bytes, .send = 1, .rbuf = tmp + (size_t)j * bytes, .rbytes = bytes, .recv = 1};
    if (bytes) memcpy(tmp + (size_t)me * bytes, src, bytes);
    rc = exchange(c, OP_ALL_REDUCE, (frame){.n = n, .dt = dt}, x, err, errlen);
    if (rc) break;
    /* in rank order: acc = x_0, then acc += x_1, ... (into this rank's buffer) */
    if (m > 0) {
      memcpy(src, tmp, bytes);
      for (int j = 1; j < P; j++) {
        if (dt == COMM_F32) {
          float *a = (float *)src;
          const float *v = (const float *)(tmp + (size_t)j * bytes);
          for (int64_t i = 0; i < m; i++) a[i] += v[i];
        } else {
          int32_t *a = (int32_t *)src;
          const int32_t *v = (const int32_t *)(tmp + (size_t)j * bytes);
          for (int64_t i = 0; i < m; i++) a[i] += v[i];
        }
      }
    }
    off += m;
  } while (off < n);
  free(x);
  free(tmp);
  return rc;
}

static int tcp_all_gather(comm *cc, const void *send, size_t bytes, void *recv, char *err, size_t errlen) {
  kcomm *c = (kcomm *)cc;
  int P = c->base.size, me = c->base.rank;
  xfer *x = xfers(c);
  if (!x) return oom(c, "all_gather", err, errlen);
  for (int j = 0; j < P; j++)
    x[j] = (xfer){.sbuf = send, .sbytes = bytes, .send = 1, .rbuf = (char *)recv + (size_t)j * bytes, .rbytes = bytes, .recv = 1};
  int rc = exchange(c, OP_ALL_GATHER, (frame){.n = (int64_t)bytes}, x, err, errlen);
  if (rc == 0 && bytes) memmove((char *)recv + (size_t)me * bytes, send, bytes);
  free(x);
  return rc;
}

static int tcp_broadcast(comm *cc, void *buf, size_t bytes, int root, char *err, size_t errlen) {
  kcomm *c = (kcomm *)cc;
  int P = c->base.size, me = c->base.rank;
  if (root < 0 || root >= P) return errf(err, errlen, "comm: broadcast: root out of range");
  xfer *x = xfers(c);
  if (!x) return oom(c, "broadcast", err, errlen);
  for (int j = 0; j < P; j++)
    x[j] = (xfer){.sbuf = buf, .sbytes = bytes, .send = me == root, .rbuf = buf, .rbytes = bytes, .recv = j == root};
  int rc = exchange(c, OP_BROADCAST, (frame){.n = (int64_t)bytes, .root = root}, x, err, errlen);
  free(x);
  return rc;
}

static int tcp_barrier(comm *cc, char *err, size_t errlen) {
  kcomm *c = (kcomm *)cc;
  xfer *x = xfers(c);
  if (!x) return oom(c, "barrier", err, errlen);
  for (int j = 0; j < c->base.size; j++) x[j] = (xfer){.send = 1, .recv = 1};
  int rc = exchange(c, OP_BARRIER, (frame){0}, x, err, errlen);
  free(x);
  return rc;
}

static int tcp_all_to_all_counts(comm *cc, const size_t *send_bytes, size_t *recv_bytes, char *err, size_t errlen) {
  kcomm *c = (kcomm *)cc;
  int P = c->base.size, me = c->base.rank;
  xfer *x = xfers(c);
  uint64_t *s = malloc((size_t)P * sizeof *s), *r = malloc((size_t)P * sizeof *r);
  if (!x || !s || !r) {
    free(x), free(s), free(r);
    return oom(c, "all_to_all_counts", err, errlen);
  }
  for (int j = 0; j < P; j++) {
    s[j] = send_bytes[j];
    x[j] = (xfer){.sbuf = &s[j], .sbytes = 8, .send = 1, .rbuf = &r[j], .rbytes = 8, .recv = 1};
  }
  int rc = exchange(c, OP_A2A_COUNTS, (frame){0}, x, err, errlen);
  r[me] = s[me];
  for (int j = 0; rc == 0 && j < P; j++) recv_bytes[j] = (size_t)r[j];
  free(x), free(s), free(r);
  return rc;
}

static int tcp_all_to_all_v(comm *cc, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes,
                            char *err, size_t errlen) {
  kcomm *c = (kcomm *)cc;
  int P = c->base.size, me = c->base.rank;
  if (send_bytes[me] != recv_bytes[me]) {
    char m[256];
    snprintf(m, sizeof m, "all_to_all_v: world rank %d sends %zu bytes to itself but expects %zu", c->base.world_rank,
             send_bytes[me], recv_bytes[me]);
    return xfail(KW(c->base.w), m, err, errlen);
  }
  xfer *x = xfers(c);
  if (!x) return oom(c, "all_to_all_v", err, errlen);
  size_t so = 0, ro = 0, self_s = 0, self_r = 0;
  for (int j = 0; j < P; j++) {
    x[j] = (xfer){.sbuf = (const char *)send + so, .sbytes = send_bytes[j], .send = 1, .rbuf = (char *)recv + ro,
                  .rbytes = recv_bytes[j], .recv = 1};
    if (j == me) self_s = so, self_r = ro;
    so += send_bytes[j], ro += recv_bytes[j];
  }
  int rc = exchange(c, OP_A2A_V, (frame){0}, x, err, errlen);
  if (rc == 0 && recv_bytes[me]) memmove((char *)recv + self_r, (const char *)send + self_s, recv_bytes[me]);
  free(x);
  return rc;
}

static const comm_ops tcp_ops = {"tcp", tcp_free, tcp_get, tcp_abort, tcp_all_reduce_sum, tcp_all_gather,
                                 tcp_broadcast, tcp_barrier, tcp_all_to_all_counts, tcp_all_to_all_v};
