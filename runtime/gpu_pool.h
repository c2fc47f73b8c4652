/* gpu_pool.h -- the executor's caching allocator of device memory: segments from the driver,
 * split into blocks and coalesced again, so that what it holds stays close to what tensors
 * use (the power-of-two classes it replaces rounded a 640 MiB request to 1 GiB and kept each
 * class's free buffers apart; genos_1b at seq 131,072 in bf16 then ran out of memory with 120
 * GiB in use on a 140 GiB GPU).
 *
 * - Requests round up to 512 bytes. Below 1 MiB they come from 2 MiB segments (the small pool),
 *   from 1 MiB up from segments of their own size rounded to 2 MiB (the large pool); a free
 *   block of the same pool that fits is taken first (the smallest that fits), split when what
 *   is left is worth keeping (512 bytes small, 1 MiB large).
 * - A freed block merges with free neighbours of its segment. Work on the device is ordered on
 *   one stream, so a block freed after the kernels that use it are queued may be handed out at
 *   once: the next user's kernels queue behind them.
 * - When the driver says out of memory, the wholly free segments go back to it and the request
 *   is tried once more.
 * - The backend is three functions (gpu_exec.c passes gpu_alloc, gpu_free and gpu_note_idle),
 *   so tests/unit/test_gpu_pool.c drives it on the CPU. note_idle hears of every change in
 *   what the pool holds but no tensor uses (free blocks, and rounding inside used ones), before
 *   a segment is allocated, so that held - idle never counts a new segment as in use. */
#ifndef MOEC_GPU_POOL_H
#define MOEC_GPU_POOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  void *ctx;
  int (*alloc)(void *ctx, size_t bytes, uint64_t *ptr); /* 0, or -1 (the backend keeps the message) */
  void (*free)(void *ctx, uint64_t ptr);
  void (*note_idle)(void *ctx, ptrdiff_t delta); /* NULL: not told */
} gpu_pool_backend;

typedef struct gpu_pool gpu_pool;

gpu_pool *gpu_pool_new(const gpu_pool_backend *b); /* NULL: out of host memory */
void gpu_pool_free(gpu_pool *p);                   /* every segment back to the backend */
/* *ptr = a block of at least bytes (0 taken as 1). -1: the backend's out of memory (after
 * giving back the free segments), or out of host memory (the backend's alloc not called). */
int gpu_pool_get(gpu_pool *p, size_t bytes, uint64_t *ptr);
void gpu_pool_put(gpu_pool *p, uint64_t ptr); /* a block from gpu_pool_get; 0 is ignored */
void gpu_pool_trim(gpu_pool *p);              /* wholly free segments back to the backend */

size_t gpu_pool_reserved(const gpu_pool *p); /* bytes of segments held */
size_t gpu_pool_in_use(const gpu_pool *p);   /* bytes asked for by the blocks handed out */
int gpu_pool_segments(const gpu_pool *p);

#endif
