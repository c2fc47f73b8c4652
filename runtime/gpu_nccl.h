/* gpu_nccl.h -- NCCL, loaded at run time (libnccl.so.2; MOEC_LIBNCCL overrides), for the GPU
 * collectives of expert and data parallelism (issue 7; docs/parallel.md): a communicator per
 * rank on the rank's GPU, made from a unique id that rank 0 draws and hands to the others
 * (runtime/bootstrap.c carries it in its blob), and the collectives the parallel ops need,
 * queued on the context's stream. NCCL's types are redeclared from its 2.28 nccl.h. */
#ifndef MOEC_GPU_NCCL_H
#define MOEC_GPU_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "codegen/cg_kernels.h"
#include "gpu_loader.h"

typedef struct {
  char internal[128]; /* ncclUniqueId */
} gpu_nccl_id;

typedef struct gpu_nccl gpu_nccl;

/* Loads NCCL once per process: 0 and its version (e.g. 22805), or -1 and why in err. */
int gpu_nccl_load(int *version, char *err, size_t errlen);
/* A fresh unique id (rank 0 draws it; every rank passes the same one to gpu_nccl_new). */
int gpu_nccl_unique_id(gpu_nccl_id *id, char *err, size_t errlen);
/* Rank `rank` of `nranks` on g's device (g's context current on this thread). Blocks until
 * every rank has joined. NULL with a message. */
gpu_nccl *gpu_nccl_new(gpu_ctx *g, int nranks, int rank, const gpu_nccl_id *id, char *err, size_t errlen);
/* Frees the communicator; abort = 1 does not wait for pending work (a failed world). */
void gpu_nccl_free(gpu_nccl *c, int abort);
/* Why the communicator's watchdog aborted it (an asynchronous NCCL error, or a collective not
 * finished within MOEC_COMM_TIMEOUT seconds, 600 by default), NULL while it is healthy. Every
 * collective below fails with this reason once it is set. */
const char *gpu_nccl_failure(gpu_nccl *c);

/* The collectives are queued on `stream` (NULL: g's stream); gpu_comm puts all of a
 * communicator's on one stream, so they run in the order queued. */
/* buf (n values of t) = its sum over the ranks, in place. */
int gpu_nccl_all_reduce_sum(gpu_nccl *c, void *stream, gpu_ptr buf, int64_t n, cg_dtype t, char *err, size_t errlen);
/* The same for n int32 values (expert counts). */
int gpu_nccl_all_reduce_sum_i32(gpu_nccl *c, void *stream, gpu_ptr buf, int64_t n, char *err, size_t errlen);
/* Every rank sends send_bytes[r] bytes from send + send_off[r] to rank r and receives
 * recv_bytes[r] bytes into recv + recv_off[r] (grouped ncclSend/ncclRecv of bytes, self
 * included). */
int gpu_nccl_all_to_all_v(gpu_nccl *c, void *stream, gpu_ptr send, const size_t *send_off, const size_t *send_bytes,
                          gpu_ptr recv, const size_t *recv_off, const size_t *recv_bytes, char *err, size_t errlen);
/* ZeRO-1: recv (count f32) <- rank r's count-long slice of the ranks' summed send (nranks x
 * count f32): ncclReduceScatter. */
int gpu_nccl_reduce_scatter_sum(gpu_nccl *c, void *stream, gpu_ptr send, gpu_ptr recv, int64_t count, char *err,
                                size_t errlen);
/* recv (nranks x bytes) <- every rank's send (bytes), in rank order: ncclAllGather. */
int gpu_nccl_all_gather(gpu_nccl *c, void *stream, gpu_ptr send, gpu_ptr recv, size_t bytes, char *err, size_t errlen);

#endif
