/* comm.h -- the communicator: N ranks exchanging buffers through collectives.
 *
 * One interface, two backends (comm_impl.h): ranks as threads of one process
 * (comm_threads_new, comm_threads.c: a collective is a rendezvous of the group's threads on
 * shared memory), and one rank per process over a full mesh of TCP sockets (comm_tcp_new,
 * comm_tcp.c; bootstrap.h connects the mesh). The interface is the one the NCCL path will
 * implement (docs/parallel.md): all_reduce -> ncclAllReduce,
 * all_to_all_v -> ncclGroupStart + ncclSend/ncclRecv per peer, all_gather -> ncclAllGather,
 * broadcast -> ncclBroadcast, barrier -> an all_reduce of one value.
 *
 * Rank layout: world = EP x DP, rank = dp_index * EP + ep_index. The EP group of a rank is
 * the EP ranks with its dp_index (consecutive ranks, one node first); its DP group is the
 * DP ranks with its ep_index (stride EP). A group's own rank order is by world rank.
 *
 * Determinism: all_reduce sums in group rank order (((x_0 + x_1) + x_2) + ...) into every
 * rank's result, so results never depend on thread timing and every rank gets the same bits.
 *
 * Failure: a collective that waits longer than the world's timeout for a rank that never
 * arrives fails on every waiting rank with a message naming the collective, the group and the
 * missing ranks; comm_abort (a rank that hit an error) fails every rank's current and later
 * collectives at once. Every call returns 0, or -1 with the message in err.
 */
#ifndef MOEC_COMM_H
#define MOEC_COMM_H

#include <stddef.h>
#include <stdint.h>

typedef enum { COMM_WORLD, COMM_EP, COMM_DP, COMM_GROUPS } comm_group;
typedef enum { COMM_F32, COMM_I32 } comm_dtype;

typedef struct comm_world comm_world;
typedef struct comm comm; /* one rank's handle on one group */

/* A world of ep*dp ranks as threads of this process; timeout_s > 0 bounds every wait. NULL
 * when out of memory. comm_world_new is the same call (its older name). */
comm_world *comm_threads_new(int ep, int dp, double timeout_s);
comm_world *comm_world_new(int ep, int dp, double timeout_s);
/* This process as world rank `rank` of ep*dp processes: fds[j] is a connected stream socket
 * to world rank j (fds[rank] unused; bootstrap.h's boot_mesh makes them); the world owns and
 * closes them. timeout_s bounds every wait for a peer (no progress for that long fails the
 * collective). NULL (and a message in err) on bad arguments or out of memory; the fds are
 * closed then too. */
comm_world *comm_tcp_new(int ep, int dp, int rank, int *fds, double timeout_s, char *err, size_t errlen);
void comm_world_free(comm_world *w);
/* The timeout of every collective wait, seconds: MOEC_COMM_TIMEOUT when positive, else 600
 * (the host worlds and the NCCL watchdog alike). */
double comm_timeout_from_env(void);
int comm_world_size(const comm_world *w);
const char *comm_world_backend(const comm_world *w); /* "threads" or "tcp" */
/* Rank `rank`'s handle on group grp (owned by the world). The TCP world has one rank's
 * handles only: NULL for another rank. */
comm *comm_get(comm_world *w, int rank, comm_group grp);
const char *comm_group_name(comm_group grp);
comm_group comm_group_named(const char *name); /* "ep", "dp", else the world (an IR op's group attribute) */

int comm_rank(const comm *c); /* in the group */
int comm_size(const comm *c);
int comm_world_rank(const comm *c);

/* Marks the world failed with msg: every rank's pending and later collectives return -1 (over
 * TCP: this process's, and the peers' as the message reaches them). */
void comm_abort(comm_world *w, int rank, const char *msg);

/* buf (n values) <- the sum over the group, in rank order. */
int comm_all_reduce_sum(comm *c, void *buf, int64_t n, comm_dtype dt, char *err, size_t errlen);
/* ZeRO's reduce-scatter: send (n f32 values) is cut in size shards of c = ceil(n / size);
 * recv (c values) <- this rank's shard [rank c, min(n, (rank+1) c)) summed over the group in
 * rank order (the same bits as comm_all_reduce_sum's), zero past n. Each rank receives only
 * its shard from every peer (comm_all_to_all_v), not the whole of n. */
int comm_reduce_scatter_sum(comm *c, const float *send, int64_t n, float *recv, char *err, size_t errlen);
/* *sum <- every rank's x summed in double, in group rank order (the same bits on every rank):
 * the ZeRO gradient norm's squares. */
int comm_sum_f64(comm *c, double x, double *sum, char *err, size_t errlen);
/* recv (size * bytes) <- every rank's send (bytes), in rank order. */
int comm_all_gather(comm *c, const void *send, size_t bytes, void *recv, char *err, size_t errlen);
/* buf (bytes) <- root's buf. */
int comm_broadcast(comm *c, void *buf, size_t bytes, int root, char *err, size_t errlen);
int comm_barrier(comm *c, char *err, size_t errlen);
/* The counts exchange: recv_bytes[j] <- what peer j will send to this rank (its send_bytes[me]). */
int comm_all_to_all_counts(comm *c, const size_t *send_bytes, size_t *recv_bytes, char *err, size_t errlen);
/* send holds size consecutive segments, segment j (send_bytes[j]) going to peer j; recv gets
 * size consecutive segments, segment j (recv_bytes[j], from comm_all_to_all_counts) from peer j.
 * A peer whose send count disagrees with recv_bytes makes every rank fail. */
int comm_all_to_all_v(comm *c, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes,
                      char *err, size_t errlen);

#endif
