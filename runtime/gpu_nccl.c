/* gpu_nccl.c -- see gpu_nccl.h. Enum values are NCCL 2.28's nccl.h (cited by name). */
#include "gpu_nccl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "errf.h"

typedef int nccl_result;                                /* ncclResult_t, ncclSuccess = 0 */
enum { NCCL_INT8 = 0, NCCL_INT32 = 2, NCCL_FLOAT32 = 7, NCCL_BFLOAT16 = 9 }; /* ncclDataType_t */
enum { NCCL_SUM = 0 };                                  /* ncclRedOp_t */

static struct {
  nccl_result (*GetVersion)(int *);
  nccl_result (*GetUniqueId)(gpu_nccl_id *);
  nccl_result (*CommInitRank)(void **comm, int nranks, gpu_nccl_id id, int rank);
  nccl_result (*CommDestroy)(void *comm);
  nccl_result (*CommAbort)(void *comm);
  const char *(*GetErrorString)(nccl_result);
  nccl_result (*AllReduce)(const void *send, void *recv, size_t count, int dtype, int op, void *comm, void *stream);
  nccl_result (*Send)(const void *send, size_t count, int dtype, int peer, void *comm, void *stream);
  nccl_result (*Recv)(void *recv, size_t count, int dtype, int peer, void *comm, void *stream);
  nccl_result (*GroupStart)(void);
  nccl_result (*GroupEnd)(void);
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
      {(void **)&api.AllReduce, "ncclAllReduce"},       {(void **)&api.Send, "ncclSend"},
      {(void **)&api.Recv, "ncclRecv"},                 {(void **)&api.GroupStart, "ncclGroupStart"},
      {(void **)&api.GroupEnd, "ncclGroupEnd"},
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

struct gpu_nccl {
  gpu_ctx *g;
  void *comm;
  int nranks, rank;
};

gpu_nccl *gpu_nccl_new(gpu_ctx *g, int nranks, int rank, const gpu_nccl_id *id, char *err, size_t errlen) {
  if (gpu_nccl_load(NULL, err, errlen)) return NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks) return errf(err, errlen, "nccl: rank %d of %d", rank, nranks), NULL;
  gpu_nccl *c = calloc(1, sizeof *c);
  if (!c) return errf(err, errlen, "out of host memory"), NULL;
  c->g = g, c->nranks = nranks, c->rank = rank;
  nccl_result r = api.CommInitRank(&c->comm, nranks, *id, rank);
  if (r) {
    nccl_fail(r, "ncclCommInitRank", err, errlen);
    free(c);
    return NULL;
  }
  return c;
}

void gpu_nccl_free(gpu_nccl *c, int abort) {
  if (!c) return;
  if (c->comm) (abort ? api.CommAbort : api.CommDestroy)(c->comm);
  free(c);
}

int gpu_nccl_all_reduce_sum(gpu_nccl *c, gpu_ptr buf, int64_t n, cg_dtype t, char *err, size_t errlen) {
  void *p = (void *)(uintptr_t)buf;
  nccl_result r = api.AllReduce(p, p, (size_t)n, t == CG_DT_BF16 ? NCCL_BFLOAT16 : NCCL_FLOAT32, NCCL_SUM, c->comm,
                                gpu_stream(c->g));
  return r ? nccl_fail(r, "ncclAllReduce", err, errlen) : 0;
}

int gpu_nccl_all_reduce_sum_i32(gpu_nccl *c, gpu_ptr buf, int64_t n, char *err, size_t errlen) {
  void *p = (void *)(uintptr_t)buf;
  nccl_result r = api.AllReduce(p, p, (size_t)n, NCCL_INT32, NCCL_SUM, c->comm, gpu_stream(c->g));
  return r ? nccl_fail(r, "ncclAllReduce (int32)", err, errlen) : 0;
}

int gpu_nccl_all_to_all_v(gpu_nccl *c, gpu_ptr send, const size_t *send_off, const size_t *send_bytes, gpu_ptr recv,
                          const size_t *recv_off, const size_t *recv_bytes, char *err, size_t errlen) {
  void *s = gpu_stream(c->g);
  nccl_result r = api.GroupStart();
  for (int p = 0; p < c->nranks && r == 0; p++) {
    if (send_bytes[p])
      r = api.Send((const void *)(uintptr_t)(send + send_off[p]), send_bytes[p], NCCL_INT8, p, c->comm, s);
    if (r == 0 && recv_bytes[p])
      r = api.Recv((void *)(uintptr_t)(recv + recv_off[p]), recv_bytes[p], NCCL_INT8, p, c->comm, s);
  }
  nccl_result r2 = api.GroupEnd(); /* always closes the group */
  if (r == 0) r = r2;
  return r ? nccl_fail(r, "the all-to-all's grouped ncclSend/ncclRecv", err, errlen) : 0;
}
