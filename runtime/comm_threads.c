/* comm_threads.c -- the in-process communicator backend (ranks are threads). Every collective is two
 * rendezvous of the group: ranks post their buffers and meet (entry), each computes its own
 * result from everyone's buffers into private memory, they meet again (exit: nobody's buffer
 * is read any more), and each writes its result. The entry fails fast on an aborted world and
 * on the timeout; the exit only waits (every rank past the entry reaches it). */
#include "comm_impl.h"
#include "errf.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  const char *op; /* the collective each rank called, checked to agree */
  const void *send;
  const size_t *counts, *recv_counts;
  int64_t n;
  int dt, root;
} slot;

typedef struct {
  int size;
  int *members; /* (size) world ranks, ascending */
  int count;    /* arrived at the current rendezvous */
  uint64_t gen;
  int *arrived; /* (size) */
  slot *slots;  /* (size) */
} group_state;

typedef struct {
  struct comm base; /* w, grp, rank, size, world_rank */
  group_state *g;
} tcomm;

typedef struct {
  struct comm_world base; /* ops, ep, dp, n, timeout_s */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int failed;
  char msg[512];
  group_state *groups; /* world (1), EP (dp of them), DP (ep of them) */
  int n_groups;
  tcomm *handles; /* (n * COMM_GROUPS) */
} tworld;

#define TW(w) ((tworld *)(w))
#define TC(c) ((tcomm *)(c))
static const comm_ops threads_ops;

static int group_init(group_state *g, int size) {
  g->size = size;
  g->members = calloc((size_t)size, sizeof *g->members);
  g->arrived = calloc((size_t)size, sizeof *g->arrived);
  g->slots = calloc((size_t)size, sizeof *g->slots);
  return g->members && g->arrived && g->slots ? 0 : -1;
}

static void threads_free(comm_world *cw);

comm_world *comm_threads_new(int ep, int dp, double timeout_s) {
  if (ep < 1 || dp < 1) return NULL;
  tworld *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->base = (struct comm_world){&threads_ops, ep, dp, ep * dp, timeout_s};
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->n_groups = 1 + dp + ep;
  w->groups = calloc((size_t)w->n_groups, sizeof *w->groups);
  w->handles = calloc((size_t)w->base.n * COMM_GROUPS, sizeof *w->handles);
  int ok = w->groups && w->handles && group_init(&w->groups[0], w->base.n) == 0;
  for (int d = 0; ok && d < dp; d++) ok = group_init(&w->groups[1 + d], ep) == 0;
  for (int e = 0; ok && e < ep; e++) ok = group_init(&w->groups[1 + dp + e], dp) == 0;
  if (!ok) {
    threads_free(&w->base);
    return NULL;
  }
  for (int r = 0; r < w->base.n; r++) {
    int e = r % ep, d = r / ep;
    group_state *gs[COMM_GROUPS] = {&w->groups[0], &w->groups[1 + d], &w->groups[1 + dp + e]};
    int in_group[COMM_GROUPS] = {r, e, d};
    for (int k = 0; k < COMM_GROUPS; k++) {
      gs[k]->members[in_group[k]] = r;
      w->handles[r * COMM_GROUPS + k] = (tcomm){{&w->base, (comm_group)k, in_group[k], gs[k]->size, r}, gs[k]};
    }
  }
  return &w->base;
}

static void threads_free(comm_world *cw) {
  tworld *w = TW(cw);
  for (int i = 0; w->groups && i < w->n_groups; i++) {
    free(w->groups[i].members);
    free(w->groups[i].arrived);
    free(w->groups[i].slots);
  }
  free(w->groups);
  free(w->handles);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}

static comm *threads_get(comm_world *w, int rank, comm_group grp) { return &TW(w)->handles[rank * COMM_GROUPS + grp].base; }

static void fail_locked(tworld *w, const char *msg) {
  if (!w->failed) {
    w->failed = 1;
    snprintf(w->msg, sizeof w->msg, "%s", msg);
  }
  pthread_cond_broadcast(&w->cv);
}

static void threads_abort(comm_world *cw, int rank, const char *msg) {
  tworld *w = TW(cw);
  char m[512];
  snprintf(m, sizeof m, "rank %d stopped: %s", rank, msg);
  pthread_mutex_lock(&w->mu);
  fail_locked(w, m);
  pthread_mutex_unlock(&w->mu);
}


/* Meets the group. fail_fast: return -1 when the world has failed or the wait times out. */
static int rendezvous(tcomm *tc, const char *op, int fail_fast, char *err, size_t errlen) {
  tworld *w = TW(tc->base.w);
  group_state *g = tc->g;
  comm *c = &tc->base;
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  double t = (double)dl.tv_sec + 1e-9 * (double)dl.tv_nsec + (w->base.timeout_s > 0 ? w->base.timeout_s : 3600);
  dl.tv_sec = (time_t)t;
  dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
  pthread_mutex_lock(&w->mu);
  if (fail_fast && w->failed) {
    pthread_mutex_unlock(&w->mu);
    return errf(err, errlen, "comm: %s: %s", op, w->msg);
  }
  uint64_t gen = g->gen;
  g->arrived[c->rank] = 1;
  if (++g->count == g->size) {
    g->count = 0;
    memset(g->arrived, 0, (size_t)g->size * sizeof *g->arrived);
    g->gen++;
    pthread_cond_broadcast(&w->cv);
  }
  while (g->gen == gen && !(fail_fast && w->failed)) {
    int rc = pthread_cond_timedwait(&w->cv, &w->mu, &dl);
    if (rc == ETIMEDOUT && g->gen == gen && fail_fast) {
      char m[512];
      int k = snprintf(m, sizeof m, "world rank %d timed out after %.0f s in %s on the %s group waiting for world rank(s)",
                       c->world_rank, w->base.timeout_s, op, comm_group_name(c->grp));
      for (int i = 0; i < g->size && k > 0 && (size_t)k < sizeof m; i++)
        if (!g->arrived[i]) k += snprintf(m + k, sizeof m - (size_t)k, " %d", g->members[i]);
      if (k > 0 && (size_t)k < sizeof m) snprintf(m + k, sizeof m - (size_t)k, " (never arrived)");
      fail_locked(w, m);
    }
  }
  int ok = g->gen != gen;
  if (!ok) {
    /* leave the rendezvous: the others must not count this rank as arrived */
    g->arrived[c->rank] = 0;
    g->count--;
  }
  pthread_mutex_unlock(&w->mu);
  return ok ? 0 : errf(err, errlen, "comm: %s: %s", op, w->msg);
}

/* Entry: post the slot, meet, and check every rank called the same collective alike. */
static int enter(tcomm *tc, slot s, char *err, size_t errlen) {
  comm *c = &tc->base;
  tc->g->slots[c->rank] = s;
  if (rendezvous(tc, s.op, 1, err, errlen)) return -1;
  for (int j = 0; j < tc->g->size; j++) {
    const slot *o = &tc->g->slots[j];
    if (strcmp(o->op, s.op) != 0 || o->n != s.n || o->dt != s.dt || o->root != s.root) {
      char m[256];
      snprintf(m, sizeof m, "world rank %d called %s(n=%lld) while world rank %d called %s(n=%lld) on the %s group",
               tc->g->members[j], o->op, (long long)o->n, c->world_rank, s.op, (long long)s.n, comm_group_name(c->grp));
      rendezvous(tc, s.op, 0, NULL, 0);
      threads_abort(c->w, c->world_rank, m);
      return errf(err, errlen, "comm: %s", m);
    }
  }
  return 0;
}

static int leave(tcomm *c, const char *op, char *err, size_t errlen) { return rendezvous(c, op, 0, err, errlen); }

static int threads_all_reduce_sum(comm *cc, void *buf, int64_t n, comm_dtype dt, char *err, size_t errlen) {
  tcomm *c = TC(cc);
  if (enter(c, (slot){"all_reduce_sum", buf, NULL, NULL, n, dt, 0}, err, errlen)) return -1;
  size_t bytes = (size_t)(n > 0 ? n : 1) * 4;
  void *acc = malloc(bytes);
  if (acc && n > 0) {
    /* in rank order: acc = x_0, then acc += x_1, ... */
    memcpy(acc, c->g->slots[0].send, (size_t)n * 4);
    for (int j = 1; j < c->g->size; j++) {
      if (dt == COMM_F32) {
        float *a = acc;
        const float *x = c->g->slots[j].send;
        for (int64_t i = 0; i < n; i++) a[i] += x[i];
      } else {
        int32_t *a = acc;
        const int32_t *x = c->g->slots[j].send;
        for (int64_t i = 0; i < n; i++) a[i] += x[i];
      }
    }
  }
  int rc = leave(c, "all_reduce_sum", err, errlen);
  if (!acc) return errf(err, errlen, "comm: all_reduce_sum: out of host memory");
  if (rc == 0 && n > 0) memcpy(buf, acc, (size_t)n * 4);
  free(acc);
  return rc;
}

static int threads_all_gather(comm *cc, const void *send, size_t bytes, void *recv, char *err, size_t errlen) {
  tcomm *c = TC(cc);
  if (enter(c, (slot){"all_gather", send, NULL, NULL, (int64_t)bytes, 0, 0}, err, errlen)) return -1;
  for (int j = 0; bytes && j < c->g->size; j++) memcpy((char *)recv + (size_t)j * bytes, c->g->slots[j].send, bytes);
  return leave(c, "all_gather", err, errlen);
}

static int threads_broadcast(comm *cc, void *buf, size_t bytes, int root, char *err, size_t errlen) {
  tcomm *c = TC(cc);
  if (root < 0 || root >= c->g->size) return errf(err, errlen, "comm: broadcast: root out of range");
  if (enter(c, (slot){"broadcast", buf, NULL, NULL, (int64_t)bytes, 0, root}, err, errlen)) return -1;
  void *tmp = malloc(bytes ? bytes : 1);
  if (tmp && bytes) memcpy(tmp, c->g->slots[root].send, bytes);
  int rc = leave(c, "broadcast", err, errlen);
  if (!tmp) return errf(err, errlen, "comm: broadcast: out of host memory");
  if (rc == 0 && bytes && c->base.rank != root) memcpy(buf, tmp, bytes);
  free(tmp);
  return rc;
}

static int threads_barrier(comm *cc, char *err, size_t errlen) {
  tcomm *c = TC(cc);
  if (enter(c, (slot){"barrier", NULL, NULL, NULL, 0, 0, 0}, err, errlen)) return -1;
  return leave(c, "barrier", err, errlen);
}

static int threads_all_to_all_counts(comm *cc, const size_t *send_bytes, size_t *recv_bytes, char *err, size_t errlen) {
  tcomm *c = TC(cc);
  if (enter(c, (slot){"all_to_all_counts", NULL, send_bytes, NULL, 0, 0, 0}, err, errlen)) return -1;
  int P = c->g->size;
  size_t *tmp = malloc((size_t)P * sizeof *tmp);
  for (int j = 0; tmp && j < P; j++) tmp[j] = c->g->slots[j].counts[c->base.rank];
  int rc = leave(c, "all_to_all_counts", err, errlen);
  if (!tmp) return errf(err, errlen, "comm: all_to_all_counts: out of host memory");
  if (rc == 0) memcpy(recv_bytes, tmp, (size_t)P * sizeof *tmp);
  free(tmp);
  return rc;
}

static int threads_all_to_all_v(comm *cc, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes,
                      char *err, size_t errlen) {
  tcomm *c = TC(cc);
  if (enter(c, (slot){"all_to_all_v", send, send_bytes, recv_bytes, 0, 0, 0}, err, errlen)) return -1;
  int P = c->g->size;
  /* every rank checks the whole count matrix, so all agree on failing */
  for (int i = 0; i < P; i++)
    for (int j = 0; j < P; j++)
      if (c->g->slots[j].counts[i] != c->g->slots[i].recv_counts[j]) {
        char m[256];
        snprintf(m, sizeof m, "all_to_all_v: world rank %d sends %zu bytes to world rank %d, which expects %zu",
                 c->g->members[j], c->g->slots[j].counts[i], c->g->members[i], c->g->slots[i].recv_counts[j]);
        leave(c, "all_to_all_v", NULL, 0);
        threads_abort(c->base.w, c->base.world_rank, m);
        return errf(err, errlen, "comm: %s", m);
      }
  size_t off_out = 0;
  for (int j = 0; j < P; j++) {
    size_t off_in = 0;
    for (int d = 0; d < c->base.rank; d++) off_in += c->g->slots[j].counts[d];
    if (recv_bytes[j]) memcpy((char *)recv + off_out, (const char *)c->g->slots[j].send + off_in, recv_bytes[j]);
    off_out += recv_bytes[j];
  }
  return leave(c, "all_to_all_v", err, errlen);
}

static const comm_ops threads_ops = {"threads", threads_free, threads_get, threads_abort, threads_all_reduce_sum,
                                     threads_all_gather, threads_broadcast, threads_barrier, threads_all_to_all_counts,
                                     threads_all_to_all_v};
