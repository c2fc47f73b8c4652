/* gpu_nccl.c -- see gpu_nccl.h. Enum values are NCCL 2.28's nccl.h (cited by name). */
#include "gpu_nccl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "errf.h"

typedef int nccl_result;                                /* ncclResult_t, ncclSuccess = 0 */
enum { NCCL_IN_PROGRESS = 7 };                          /* ncclInProgress */
enum { NCCL_INT8 = 0, NCCL_INT32 = 2, NCCL_FLOAT32 = 7, NCCL_BFLOAT16 = 9 }; /* ncclDataType_t */
enum { NCCL_SUM = 0 };                                  /* ncclRedOp_t */

static struct {
  nccl_result (*GetVersion)(int *);
  nccl_result (*GetUniqueId)(gpu_nccl_id *);
  nccl_result (*CommInitRank)(void **comm, int nranks, gpu_nccl_id id, int rank);
  nccl_result (*CommDestroy)(void *comm);
  nccl_result (*CommAbort)(void *comm);
  nccl_result (*CommGetAsyncError)(void *comm, nccl_result *state);
  const char *(*GetErrorString)(nccl_result);
  nccl_result (*AllReduce)(const void *send, void *recv, size_t count, int dtype, int op, void *comm, void *stream);
  nccl_result (*Send)(const void *send, size_t count, int dtype, int peer, void *comm, void *stream);
  nccl_result (*Recv)(void *recv, size_t count, int dtype, int peer, void *comm, void *stream);
  nccl_result (*GroupStart)(void);
  nccl_result (*GroupEnd)(void);
  nccl_result (*ReduceScatter)(const void *send, void *recv, size_t recvcount, int dtype, int op, void *comm, void *stream);
  nccl_result (*AllGather)(const void *send, void *recv, size_t sendcount, int dtype, void *comm, void *stream);
} api;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int loaded, version;
static char load_err[1024];

static void load(void) {
  /* the dynamic loader's path first; CUDA 13's toolkit keeps NCCL in lib/, not lib64/ */
  static const char *const names[] = {"libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2"};
  char tried[768], path[512];
  void *h = gpu_dlopen_lib("MOEC_LIBNCCL", names, 2, path, sizeof path, tried, sizeof tried);
  if (!h) {
    snprintf(load_err, sizeof load_err, "libnccl not found (tried %s); install NCCL 2.x, or set MOEC_LIBNCCL", tried);
    return;
  }
  static const struct {
    void **slot;
    const char *sym;
  } syms[] = {
      {(void **)&api.GetVersion, "ncclGetVersion"},     {(void **)&api.GetUniqueId, "ncclGetUniqueId"},
      {(void **)&api.CommInitRank, "ncclCommInitRank"}, {(void **)&api.CommDestroy, "ncclCommDestroy"},
      {(void **)&api.CommAbort, "ncclCommAbort"},       {(void **)&api.GetErrorString, "ncclGetErrorString"},
      {(void **)&api.CommGetAsyncError, "ncclCommGetAsyncError"},
      {(void **)&api.AllReduce, "ncclAllReduce"},       {(void **)&api.Send, "ncclSend"},
      {(void **)&api.Recv, "ncclRecv"},                 {(void **)&api.GroupStart, "ncclGroupStart"},
      {(void **)&api.GroupEnd, "ncclGroupEnd"},         {(void **)&api.ReduceScatter, "ncclReduceScatter"},
      {(void **)&api.AllGather, "ncclAllGather"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
    if (!(*syms[i].slot = dlsym(h, syms[i].sym))) {
      snprintf(load_err, sizeof load_err, "%s lacks %s (NCCL too old: moec needs 2.7 or newer)", path, syms[i].sym);
      return;
    }
  if (api.GetVersion(&version) != 0) {
    snprintf(load_err, sizeof load_err, "%s: ncclGetVersion failed", path);
    return;
  }
  loaded = 1;
}

int gpu_nccl_load(int *v, char *err, size_t errlen) {
  pthread_once(&once, load);
  if (!loaded) return errf(err, errlen, "%s", load_err);
  if (v) *v = version;
  return 0;
}

static int nccl_fail(nccl_result r, const char *what, char *err, size_t errlen) {
  return errf(err, errlen, "%s failed: %s (NCCL %d; NCCL_DEBUG=WARN says more)", what, api.GetErrorString(r), version);
}

int gpu_nccl_unique_id(gpu_nccl_id *id, char *err, size_t errlen) {
  if (gpu_nccl_load(NULL, err, errlen)) return -1;
  nccl_result r = api.GetUniqueId(id);
  return r ? nccl_fail(r, "ncclGetUniqueId", err, errlen) : 0;
}

/* The watchdog: a thread per communicator that aborts it when NCCL reports an asynchronous
 * error (a peer's connection lost) or when the last queued collective has not finished within
 * the timeout (a peer stopped or hangs). Aborting ends this rank's NCCL kernels, so a host
 * thread waiting on the stream returns; every later call here then fails with the reason
 * (gpu_nccl_failure), and the rank stops with it instead of waiting forever. */
struct gpu_nccl {
  gpu_ctx *g;
  void *comm;
  int nranks, rank;
  pthread_t dog;
  int dog_on;
  pthread_mutex_t mu;    /* guards the fields below */
  int stop, aborted;
  char failure[512];     /* why the watchdog aborted, "" while healthy */
  void *ev;              /* recorded after each collective */
  double ev_at;          /* when it was last recorded (monotonic seconds); < 0: seen finished */
  double timeout_s;
};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *watchdog(void *p) {
  gpu_nccl *c = p;
  int bound = gpu_bind(c->g) == 0; /* event queries need the context; without it, async errors only */
  for (;;) {
    struct timespec nap = {0, 100 * 1000 * 1000};
    nanosleep(&nap, NULL);
    pthread_mutex_lock(&c->mu);
    if (c->stop || c->aborted) {
      pthread_mutex_unlock(&c->mu);
      return NULL;
    }
    nccl_result st = 0;
    if (api.CommGetAsyncError(c->comm, &st) == 0 && st != 0 && st != NCCL_IN_PROGRESS)
      snprintf(c->failure, sizeof c->failure, "NCCL rank %d of %d: %s (a peer rank failed or its connection was lost)",
               c->rank, c->nranks, api.GetErrorString(st));
    else if (bound && c->ev_at >= 0 && now_s() - c->ev_at > c->timeout_s) {
      int done = gpu_event_done(c->ev);
      if (done != 0) c->ev_at = -1; /* finished, or the query failed: no verdict from it */
      else
        snprintf(c->failure, sizeof c->failure,
                 "NCCL rank %d of %d: a collective made no progress for %.0f s (a peer rank stopped or hangs; "
                 "MOEC_COMM_TIMEOUT sets the limit)", c->rank, c->nranks, c->timeout_s);
    }
    if (c->failure[0]) {
      c->aborted = 1;
      pthread_mutex_unlock(&c->mu);
      api.CommAbort(c->comm); /* ends this rank's NCCL kernels: waits on the stream return */
      return NULL;
    }
    pthread_mutex_unlock(&c->mu);
  }
}

const char *gpu_nccl_failure(gpu_nccl *c) {
  if (!c) return NULL;
  pthread_mutex_lock(&c->mu);
  const char *f = c->failure[0] ? c->failure : NULL;
  pthread_mutex_unlock(&c->mu);
  return f;
}

/* Before a collective: the watchdog's reason, if it aborted. After: the completion mark. */
static int usable(gpu_nccl *c, char *err, size_t errlen) {
  const char *f = gpu_nccl_failure(c);
  return f ? errf(err, errlen, "%s", f) : 0;
}
/* The mark moves to the newest collective and its clock restarts: a hang anywhere before it
 * keeps it unfinished, and once the host stops queuing (it waits on the stream) the clock runs. */
static void queued(gpu_nccl *c, void *stream) {
  pthread_mutex_lock(&c->mu);
  if (!c->aborted && gpu_event_record_on(c->g, c->ev, stream) == 0) c->ev_at = now_s();
  pthread_mutex_unlock(&c->mu);
}

gpu_nccl *gpu_nccl_new(gpu_ctx *g, int nranks, int rank, const gpu_nccl_id *id, char *err, size_t errlen) {
  if (gpu_nccl_load(NULL, err, errlen)) return NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks) return errf(err, errlen, "nccl: rank %d of %d", rank, nranks), NULL;
  gpu_nccl *c = calloc(1, sizeof *c);
  if (!c) return errf(err, errlen, "out of host memory"), NULL;
  c->g = g, c->nranks = nranks, c->rank = rank, c->ev_at = -1, c->timeout_s = comm_timeout_from_env();
  pthread_mutex_init(&c->mu, NULL);
  nccl_result r = api.CommInitRank(&c->comm, nranks, *id, rank);
  if (r) {
    nccl_fail(r, "ncclCommInitRank", err, errlen);
    c->comm = NULL;
    gpu_nccl_free(c, 1);
    return NULL;
  }
  if (gpu_event_new(g, &c->ev) != 0) {
    errf(err, errlen, "nccl watchdog: %s", gpu_error(g));
    gpu_nccl_free(c, 1);
    return NULL;
  }
  if (pthread_create(&c->dog, NULL, watchdog, c) != 0) {
    errf(err, errlen, "nccl watchdog: cannot start its thread");
    gpu_nccl_free(c, 1);
    return NULL;
  }
  c->dog_on = 1;
  return c;
}

void gpu_nccl_free(gpu_nccl *c, int abort) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->stop = 1;
  pthread_mutex_unlock(&c->mu);
  if (c->dog_on) pthread_join(c->dog, NULL);
  if (c->comm && !c->aborted) (abort ? api.CommAbort : api.CommDestroy)(c->comm);
  if (c->ev) gpu_event_free(c->g, c->ev);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

int gpu_nccl_all_reduce_sum(gpu_nccl *c, void *stream, gpu_ptr buf, int64_t n, cg_dtype t, char *err, size_t errlen) {
  if (usable(c, err, errlen)) return -1;
  void *p = (void *)(uintptr_t)buf, *s = stream ? stream : gpu_stream(c->g);
  nccl_result r = api.AllReduce(p, p, (size_t)n, t == CG_DT_BF16 ? NCCL_BFLOAT16 : NCCL_FLOAT32, NCCL_SUM, c->comm, s);
  if (r) return nccl_fail(r, "ncclAllReduce", err, errlen);
  queued(c, s);
  return 0;
}

int gpu_nccl_all_reduce_sum_i32(gpu_nccl *c, void *stream, gpu_ptr buf, int64_t n, char *err, size_t errlen) {
  if (usable(c, err, errlen)) return -1;
  void *p = (void *)(uintptr_t)buf, *s = stream ? stream : gpu_stream(c->g);
  nccl_result r = api.AllReduce(p, p, (size_t)n, NCCL_INT32, NCCL_SUM, c->comm, s);
  if (r) return nccl_fail(r, "ncclAllReduce (int32)", err, errlen);
  queued(c, s);
  return 0;
}

int gpu_nccl_all_to_all_v(gpu_nccl *c, void *stream, gpu_ptr send, const size_t *send_off, const size_t *send_bytes,
                          gpu_ptr recv, const size_t *recv_off, const size_t *recv_bytes, char *err, size_t errlen) {
  if (usable(c, err, errlen)) return -1;
  void *s = stream ? stream : gpu_stream(c->g);
  nccl_result r = api.GroupStart();
  for (int p = 0; p < c->nranks && r == 0; p++) {
    if (send_bytes[p])
      r = api.Send((const void *)(uintptr_t)(send + send_off[p]), send_bytes[p], NCCL_INT8, p, c->comm, s);
    if (r == 0 && recv_bytes[p])
      r = api.Recv((void *)(uintptr_t)(recv + recv_off[p]), recv_bytes[p], NCCL_INT8, p, c->comm, s);
  }
  nccl_result r2 = api.GroupEnd(); /* always closes the group */
  if (r == 0) r = r2;
  if (r) return nccl_fail(r, "the all-to-all's grouped ncclSend/ncclRecv", err, errlen);
  queued(c, s);
  return 0;
}

int gpu_nccl_reduce_scatter_sum(gpu_nccl *c, void *stream, gpu_ptr send, gpu_ptr recv, int64_t count, char *err,
                                size_t errlen) {
  if (usable(c, err, errlen)) return -1;
  void *s = stream ? stream : gpu_stream(c->g);
  nccl_result r = api.ReduceScatter((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, (size_t)count, NCCL_FLOAT32,
                                    NCCL_SUM, c->comm, s);
  if (r) return nccl_fail(r, "ncclReduceScatter", err, errlen);
  queued(c, s);
  return 0;
}

int gpu_nccl_all_gather(gpu_nccl *c, void *stream, gpu_ptr send, gpu_ptr recv, size_t bytes, char *err, size_t errlen) {
  if (usable(c, err, errlen)) return -1;
  void *s = stream ? stream : gpu_stream(c->g);
  nccl_result r = api.AllGather((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, bytes, NCCL_INT8, c->comm, s);
  if (r) return nccl_fail(r, "ncclAllGather", err, errlen);
  queued(c, s);
  return 0;
}
