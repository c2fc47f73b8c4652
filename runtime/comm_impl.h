/* comm_impl.h -- what a communicator backend implements (comm_threads.c: ranks as threads of
 * one process; comm_tcp.c: one rank per process over a TCP mesh). comm.c dispatches the
 * calls of comm.h through the world's ops; a backend's world and handle structs start with
 * struct comm_world and struct comm. */
#ifndef MOEC_COMM_IMPL_H
#define MOEC_COMM_IMPL_H

#include "comm.h"

typedef struct comm_ops {
  const char *name;
  void (*free)(comm_world *w);
  comm *(*get)(comm_world *w, int rank, comm_group grp);
  void (*abort)(comm_world *w, int rank, const char *msg);
  int (*all_reduce_sum)(comm *c, void *buf, int64_t n, comm_dtype dt, char *err, size_t errlen);
  int (*all_gather)(comm *c, const void *send, size_t bytes, void *recv, char *err, size_t errlen);
  int (*broadcast)(comm *c, void *buf, size_t bytes, int root, char *err, size_t errlen);
  int (*barrier)(comm *c, char *err, size_t errlen);
  int (*all_to_all_counts)(comm *c, const size_t *send_bytes, size_t *recv_bytes, char *err, size_t errlen);
  int (*all_to_all_v)(comm *c, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes,
                      char *err, size_t errlen);
} comm_ops;

struct comm_world {
  const comm_ops *ops;
  int ep, dp, n;
  double timeout_s;
};

struct comm {
  comm_world *w;
  comm_group grp;
  int rank, size, world_rank; /* rank and size in the group */
};

/* The layout (rank = dp_index * EP + ep_index): the world ranks of world rank r's group grp,
 * ascending, into members (size ep * dp at most); returns the group size, *me = r's rank in it. */
int comm_layout(int ep, int dp, int r, comm_group grp, int *members, int *me);

#endif
