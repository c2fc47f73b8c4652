/* test_gpu_nccl.c -- NCCL loaded at run time (gpu_nccl.h): where the library is present it
 * loads and reports its version (no GPU needed); on a GPU, a world of one rank: a unique id,
 * a communicator, all_reduce_sum of f32 and bf16 buffers (a one-rank sum: the values
 * unchanged, bit for bit), and all_to_all_v to itself with an offset (the bytes moved), also on
 * a second stream ordered by events behind the context's; the
 * watchdog declaring a collective stuck behind a stalled stream (MOEC_COMM_TIMEOUT). More
 * ranks need more GPUs (issue 8). Skips, and passes, without NCCL or without a GPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "runtime/gpu_nccl.h"

int main(void) {
  char err[1024];
  int version = 0;
  if (gpu_nccl_load(&version, err, sizeof err) != 0) {
    CHECK(strstr(err, "libnccl") != NULL, "load failure without naming the library: %s", err);
    printf("SKIP: %s\n", err);
    return failures != 0;
  }
  CHECK(version >= 20700, "NCCL version %d", version);
  printf("NCCL %d.%d.%d loaded\n", version / 10000, version / 100 % 100, version % 100);
  int ndev = 0;
  if (gpu_driver_load(err, sizeof err) != 0 || gpu_device_count(&ndev, err, sizeof err) != 0 || ndev == 0) {
    printf("SKIP: no CUDA driver/GPU (%s): the one-rank world runs on the H200\n", err[0] ? err : "no device");
    return failures != 0;
  }
  gpu_ctx *g = gpu_open(0, err, sizeof err);
  if (!g) {
    printf("FAIL: %s\n", err);
    return 1;
  }
  gpu_nccl_id id;
  gpu_nccl *c = NULL;
  CHECK(gpu_nccl_unique_id(&id, err, sizeof err) == 0, "unique id: %s", err);
  CHECK((c = gpu_nccl_new(g, 1, 0, &id, err, sizeof err)) != NULL, "communicator: %s", err);
  CHECK(gpu_nccl_new(g, 1, 1, &id, err, sizeof err) == NULL && strstr(err, "rank 1 of 1"), "rank 1 of 1 accepted: %s", err);
  if (c) {
    enum { N = 4099 };
    uint32_t *x = malloc(N * 4), *y = malloc(N * 4);
    uint64_t s = 12345;
    for (int i = 0; i < N; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      float f = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0) * 100.0f;
      memcpy(&x[i], &f, 4);
    }
    gpu_ptr d = 0, d2 = 0;
    CHECK(gpu_alloc(g, &d, N * 4, "a test buffer") == 0 && gpu_alloc(g, &d2, N * 4 + 64, "a test buffer") == 0, "alloc");
    for (int t = 0; t < 2; t++) { /* f32, then the same bytes as 2N bf16 */
      gpu_upload(g, d, x, N * 4);
      CHECK(gpu_nccl_all_reduce_sum(c, NULL, d, t ? 2 * (N / 2) : N, t ? CG_DT_BF16 : CG_DT_F32, err, sizeof err) == 0,
            "all_reduce: %s", err);
      CHECK(gpu_download(g, y, d, N * 4) == 0, "download: %s", gpu_error(g));
      CHECK(memcmp(x, y, (t ? 2 * (N / 2) * 2 : N * 4)) == 0, "one-rank all_reduce_sum (%s) changed the values",
            t ? "bf16" : "f32");
    }
    size_t so = 8, sb = 1000 * 4, ro = 64, rb = 1000 * 4;
    gpu_upload(g, d, x, N * 4);
    CHECK(gpu_nccl_all_to_all_v(c, NULL, d, &so, &sb, d2, &ro, &rb, err, sizeof err) == 0, "all_to_all_v: %s", err);
    CHECK(gpu_download(g, y, d2 + 64, 1000 * 4) == 0, "download: %s", gpu_error(g));
    CHECK(memcmp(y, x + 2, 1000 * 4) == 0, "all_to_all_v to itself moved the wrong bytes");
    /* on a stream of its own (gpu_comm's communication stream), ordered by events: behind
       ~30 ms of memsets on the context's stream, the copy must see the value the last of them
       wrote, and the context's stream, waiting for it, the copy */
    void *side = NULL, *ready = NULL, *done = NULL;
    gpu_ptr stall = 0;
    const size_t stall_bytes = (size_t)512 << 20;
    CHECK(gpu_stream_new(g, &side) == 0 && gpu_event_new(g, &ready) == 0 && gpu_event_new(g, &done) == 0 &&
              gpu_alloc(g, &stall, stall_bytes, "the stall buffer") == 0,
          "second stream: %s", gpu_error(g));
    if (side && stall) {
      uint32_t want = 0x3f800000u; /* 1.0f */
      gpu_upload(g, d, x, N * 4);
      for (int i = 0; i < 200; i++) gpu_memset32(g, stall, (uint32_t)i, stall_bytes / 4);
      gpu_memset32(g, d, want, N);
      size_t so2 = 0, sb2 = N * 4, ro2 = 0, rb2 = N * 4;
      CHECK(gpu_event_record_on(g, ready, NULL) == 0 && gpu_stream_wait(g, side, ready) == 0, "order: %s", gpu_error(g));
      CHECK(gpu_nccl_all_to_all_v(c, side, d, &so2, &sb2, d2, &ro2, &rb2, err, sizeof err) == 0, "side all_to_all_v: %s", err);
      CHECK(gpu_event_record_on(g, done, side) == 0 && gpu_stream_wait(g, NULL, done) == 0, "order: %s", gpu_error(g));
      CHECK(gpu_download(g, y, d2, N * 4) == 0, "download: %s", gpu_error(g));
      int bad = 0;
      for (int i = 0; i < N; i++) bad += y[i] != want;
      CHECK(bad == 0, "a collective on the second stream ran before the work it waits for: %d of %d values old", bad, N);
      printf("second stream: a collective ordered behind the context's stream and back by events\n");
    }
    gpu_free(g, stall);
    gpu_event_free(g, ready), gpu_event_free(g, done);
    gpu_stream_free(g, side);
    CHECK(gpu_nccl_failure(c) == NULL, "a healthy communicator reports: %s", gpu_nccl_failure(c));
    gpu_nccl_free(c, 0);
    printf("one-rank world on GPU 0: all_reduce_sum (f32, bf16) and all_to_all_v to itself\n");

    /* the watchdog: a collective queued behind ~1.3 s of memsets, with a 0.5 s limit, must be
       declared stuck, and the communicator must refuse later collectives with the reason */
    setenv("MOEC_COMM_TIMEOUT", "0.5", 1);
    gpu_nccl *w = NULL;
    gpu_ptr big = 0;
    const size_t big_bytes = (size_t)4 << 30;
    CHECK(gpu_nccl_unique_id(&id, err, sizeof err) == 0 && (w = gpu_nccl_new(g, 1, 0, &id, err, sizeof err)) != NULL,
          "communicator: %s", err);
    if (w && gpu_alloc(g, &big, big_bytes, "the stall buffer") == 0) {
      for (int i = 0; i < 1000; i++) gpu_memset32(g, big, (uint32_t)i, big_bytes / 4);
      CHECK(gpu_nccl_all_reduce_sum(w, NULL, d, N, CG_DT_F32, err, sizeof err) == 0, "all_reduce: %s", err);
      struct timespec nap = {1, 0};
      nanosleep(&nap, NULL);
      const char *f = gpu_nccl_failure(w);
      CHECK(f && strstr(f, "no progress"), "watchdog: a stalled collective not reported (%s)", f ? f : "none");
      CHECK(gpu_nccl_all_reduce_sum(w, NULL, d, N, CG_DT_F32, err, sizeof err) != 0 && strstr(err, "no progress"),
            "an aborted communicator took another collective");
      if (gpu_sync(g) != 0) printf("(the stream after the abort: %s)\n", gpu_error(g));
      gpu_free(g, big);
      printf("watchdog: a collective stuck past MOEC_COMM_TIMEOUT aborts the communicator: %s\n", f ? f : "-");
    } else if (w) {
      printf("SKIP (watchdog): no 4 GiB for the stall buffer: %s\n", gpu_error(g));
    }
    gpu_nccl_free(w, 1);
    unsetenv("MOEC_COMM_TIMEOUT");
    gpu_free(g, d), gpu_free(g, d2);
    free(x), free(y);
  }
  gpu_close(g);
  if (failures) {
    printf("test_gpu_nccl: %d failures\n", failures);
    return 1;
  }
  printf("test_gpu_nccl: ok\n");
  return 0;
}
