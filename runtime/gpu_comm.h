/* gpu_comm.h -- one rank's collectives on device buffers, for the GPU executor's parallel ops
 * (data and expert parallelism, docs/parallel.md). One interface, two transports:
 *
 *  - host-staged (GPU_COMM_HOST): a collective copies the device buffer to the host, runs
 *    comm.h's collective (ranks as threads, or processes over TCP) and copies the result back.
 *    Ranks may share one GPU (NCCL refuses two ranks on one GPU), no NCCL is needed, and the
 *    sums are comm.h's rank-order sums: the same bits as the CPU ranks.
 *  - NCCL (GPU_COMM_NCCL): one communicator per group of more than one rank (world, EP, DP) on
 *    this rank's own GPU, collectives queued on a communication stream of their own, ordered
 *    after the context's stream by events (the context's stream waits for each, except where
 *    the caller asks to overlap: gpu_comm_all_reduce_sum_async). Each group's rank 0 draws
 *    the unique id and broadcasts it over the host world: the TCP mesh the bootstrap built
 *    (moec launch, torchrun) or the threads' world, so no blob or ncclCommSplit is needed.
 *
 * The host world (comm.h) is there with either transport: what the executor already holds on
 * the host (the EP count matrix, the gradient norm's expert part) goes through it directly.
 * Calls return 0, or -1 with a message in err. */
#ifndef MOEC_GPU_COMM_H
#define MOEC_GPU_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "gpu_loader.h"

typedef enum { GPU_COMM_HOST, GPU_COMM_NCCL } gpu_comm_kind;
typedef enum { GPU_COMM_F32, GPU_COMM_BF16, GPU_COMM_I32 } gpu_comm_dtype;

typedef struct gpu_comm gpu_comm;

/* The transport of world w, agreed by all its ranks (a collective over the world group: call it
 * on every rank). gpu_id names this rank's physical GPU (host and PCI location,
 * gpu_comm_gpu_id): ranks whose ids match share a GPU, which NCCL refuses. MOEC_GPU_COMM=host
 * forces host-staged; nccl forces NCCL (an error on every rank if some rank lacks NCCL or a GPU
 * of its own); unset or auto: NCCL when every rank has NCCL and a GPU of its own, else
 * host-staged, with why in note (empty when NCCL). */
int gpu_comm_agree(comm_world *w, int rank, const char *gpu_id, gpu_comm_kind *kind, char *note, size_t notelen, char *err,
                   size_t errlen);
/* id (len >= GPU_COMM_ID_LEN) <- "host/domain:bus:device" of g's GPU. */
enum { GPU_COMM_ID_LEN = 96 };
void gpu_comm_gpu_id(gpu_ctx *g, char *id, size_t len);
const char *gpu_comm_kind_name(gpu_comm_kind k); /* "host-staged", "NCCL" */

/* World rank `rank`'s handle, on g (current on this thread). w stays the caller's. With NCCL
 * this blocks until every rank of each group has joined. */
gpu_comm *gpu_comm_new(gpu_comm_kind kind, comm_world *w, int rank, gpu_ctx *g, char *err, size_t errlen);
/* abort = 1: a failed world (NCCL communicators aborted, not drained). */
void gpu_comm_free(gpu_comm *c, int abort);
gpu_comm_kind gpu_comm_kind_of(const gpu_comm *c);
/* Why an NCCL watchdog aborted this rank's communicators (gpu_nccl_failure), NULL if none did:
 * a step that ran on an aborted communicator computed nothing valid. */
const char *gpu_comm_failure(gpu_comm *c);
/* The host handle on group grp (for host data: counts, scalars). */
comm *gpu_comm_host_group(gpu_comm *c, comm_group grp);

/* buf (n values of t, on the device) <- the sum over group grp; g's stream sees the result. */
int gpu_comm_all_reduce_sum(gpu_comm *c, comm_group grp, gpu_ptr buf, int64_t n, gpu_comm_dtype t, char *err,
                            size_t errlen);
/* The same, left running beside g's stream (NCCL: the collective goes on the communication
 * stream after the work g's stream has queued, and the caller's event `done` is recorded
 * behind it): *pending = 1 then, and the caller makes g's stream wait for done
 * (gpu_stream_wait(g, NULL, done)) before anything on it reads or writes buf again. The
 * host-staged transport (and a one-rank group) finishes it at once: *pending = 0. This is how
 * the gradient all-reduces overlap the rest of the backward. */
int gpu_comm_all_reduce_sum_async(gpu_comm *c, comm_group grp, gpu_ptr buf, int64_t n, gpu_comm_dtype t, void *done,
                                  int *pending, char *err, size_t errlen);
/* Over group grp (P ranks): send_bytes[j] bytes from send + send_off[j] go to rank j, and
 * recv_bytes[j] bytes from rank j arrive at recv + recv_off[j] (both sides know the sizes: the
 * caller exchanged the counts first). Self included. */
int gpu_comm_all_to_all_v(gpu_comm *c, comm_group grp, gpu_ptr send, const size_t *send_off, const size_t *send_bytes,
                          gpu_ptr recv, const size_t *recv_off, const size_t *recv_bytes, char *err, size_t errlen);
/* ZeRO-1 over group grp (P ranks): recv (chunk f32) <- this rank's chunk of the sum of every
 * rank's send (P x chunk f32; the caller pads past the tensor with zeros). Host-staged: comm.h's
 * rank-order sum (the all-reduce's bits); NCCL: ncclReduceScatter. g's stream sees the result. */
int gpu_comm_reduce_scatter_sum(gpu_comm *c, comm_group grp, gpu_ptr send, gpu_ptr recv, int64_t chunk, char *err,
                                size_t errlen);
/* recv (P x bytes) <- every rank's send (bytes), in group rank order. In place when send is
 * recv + this rank's place x bytes (NCCL's in-place form; host-staged reads send first). */
int gpu_comm_all_gather(gpu_comm *c, comm_group grp, gpu_ptr send, gpu_ptr recv, size_t bytes, char *err, size_t errlen);

#endif
