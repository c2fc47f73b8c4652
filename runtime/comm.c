/* comm.c -- the communicator's front: the rank layout, and the calls of comm.h dispatched to
 * the world's backend (comm_threads.c, comm_tcp.c). */
#include "comm_impl.h"

#include <stdlib.h>
#include <string.h>

#include "errf.h"

static const char *const group_names[COMM_GROUPS] = {"world", "ep", "dp"};
const char *comm_group_name(comm_group grp) { return grp < COMM_GROUPS ? group_names[grp] : "?"; }
comm_group comm_group_named(const char *name) { return !strcmp(name, "ep") ? COMM_EP : !strcmp(name, "dp") ? COMM_DP : COMM_WORLD; }

int comm_layout(int ep, int dp, int r, comm_group grp, int *members, int *me) {
  int e = r % ep, d = r / ep, n = 0;
  switch (grp) {
  case COMM_WORLD:
    for (int j = 0; j < ep * dp; j++) members[n++] = j;
    *me = r;
    break;
  case COMM_EP:
    for (int j = 0; j < ep; j++) members[n++] = d * ep + j;
    *me = e;
    break;
  default:
    for (int j = 0; j < dp; j++) members[n++] = j * ep + e;
    *me = d;
    break;
  }
  return n;
}

comm_world *comm_world_new(int ep, int dp, double timeout_s) { return comm_threads_new(ep, dp, timeout_s); }
void comm_world_free(comm_world *w) {
  if (w) w->ops->free(w);
}
int comm_world_size(const comm_world *w) { return w->n; }

double comm_timeout_from_env(void) {
  const char *t = getenv("MOEC_COMM_TIMEOUT");
  double v = t && *t ? atof(t) : 0.0;
  return v > 0 ? v : 600.0;
}
const char *comm_world_backend(const comm_world *w) { return w->ops->name; }
comm *comm_get(comm_world *w, int rank, comm_group grp) {
  if (rank < 0 || rank >= w->n || grp >= COMM_GROUPS) return NULL;
  return w->ops->get(w, rank, grp);
}
int comm_rank(const comm *c) { return c->rank; }
int comm_size(const comm *c) { return c->size; }
int comm_world_rank(const comm *c) { return c->world_rank; }
void comm_abort(comm_world *w, int rank, const char *msg) { w->ops->abort(w, rank, msg); }

int comm_all_reduce_sum(comm *c, void *buf, int64_t n, comm_dtype dt, char *err, size_t errlen) {
  return c->w->ops->all_reduce_sum(c, buf, n, dt, err, errlen);
}
int comm_all_gather(comm *c, const void *send, size_t bytes, void *recv, char *err, size_t errlen) {
  return c->w->ops->all_gather(c, send, bytes, recv, err, errlen);
}
int comm_broadcast(comm *c, void *buf, size_t bytes, int root, char *err, size_t errlen) {
  return c->w->ops->broadcast(c, buf, bytes, root, err, errlen);
}
int comm_barrier(comm *c, char *err, size_t errlen) { return c->w->ops->barrier(c, err, errlen); }
int comm_all_to_all_counts(comm *c, const size_t *send_bytes, size_t *recv_bytes, char *err, size_t errlen) {
  return c->w->ops->all_to_all_counts(c, send_bytes, recv_bytes, err, errlen);
}
int comm_all_to_all_v(comm *c, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes,
                      char *err, size_t errlen) {
  return c->w->ops->all_to_all_v(c, send, send_bytes, recv, recv_bytes, err, errlen);
}

int comm_reduce_scatter_sum(comm *c, const float *send, int64_t n, float *recv, char *err, size_t errlen) {
  const int size = c->size, me = c->rank;
  const int64_t chunk = n > 0 ? (n + size - 1) / size : 0;
  int64_t lo = (int64_t)me * chunk, mine = n - lo < chunk ? n - lo : chunk; /* this rank's real values */
  if (mine < 0) mine = 0;
  size_t *send_bytes = malloc(2 * (size_t)size * sizeof *send_bytes);
  float *from = malloc(((size_t)size * (size_t)mine + 1) * sizeof *from); /* (size, mine): every peer's copy of my shard */
  if (!send_bytes || !from) {
    free(send_bytes);
    free(from);
    return errf(err, errlen, "comm: reduce_scatter: out of host memory for %lld values", (long long)n);
  }
  size_t *recv_bytes = send_bytes + size;
  for (int j = 0; j < size; j++) {
    int64_t jl = (int64_t)j * chunk, jn = n - jl < chunk ? n - jl : chunk;
    send_bytes[j] = (size_t)(jn > 0 ? jn : 0) * sizeof(float);
    recv_bytes[j] = (size_t)mine * sizeof(float);
  }
  int rc = comm_all_to_all_v(c, send, send_bytes, from, recv_bytes, err, errlen);
  if (rc == 0) {
    /* rank order, from the first term (not 0 + x_0): comm_all_reduce_sum's bits */
    if (mine) memcpy(recv, from, (size_t)mine * sizeof *recv);
    for (int j = 1; j < size; j++)
      for (int64_t i = 0; i < mine; i++) recv[i] += from[(size_t)j * (size_t)mine + (size_t)i];
    for (int64_t i = mine; i < chunk; i++) recv[i] = 0.0f;
  }
  free(send_bytes);
  free(from);
  return rc;
}

int comm_sum_f64(comm *c, double x, double *sum, char *err, size_t errlen) {
  double *all = malloc((size_t)c->size * sizeof *all);
  if (!all) return errf(err, errlen, "comm: out of host memory");
  int rc = comm_all_gather(c, &x, sizeof x, all, err, errlen);
  double s = 0;
  for (int j = 0; rc == 0 && j < c->size; j++) s += all[j];
  free(all);
  *sum = s;
  return rc;
}
