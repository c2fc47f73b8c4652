/* gpu_cudnn_attn.c -- cuDNN fused flash attention through the backend C API (see
 * gpu_cudnn_attn.h): the library (dlopen, the table of entry points, the enum values checked
 * against cudnn_graph.h where it is found), debug output and error messages, and the object's
 * life: handle, version, free. The rest: the graphs as plain data (gpu_cudnn_attn_graph.c,
 * gpu_cudnn_attn_check.c), their backend descriptors (gpu_cudnn_attn_desc.c), heuristics and
 * the plan cache (gpu_cudnn_attn_plan.c), execution (gpu_cudnn_attn_exec.c). */
#include "gpu_cudnn_attn_int.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MOEC_HAVE_CUDNN_GRAPH_H
#include <cudnn_graph.h> /* only to check the values of gpu_cudnn_attn_int.h */
#endif

#ifdef MOEC_HAVE_CUDNN_GRAPH_H
#define CD_CHECK(n, v) _Static_assert(CD_##n == (int)CUDNN_##n, "cuDNN enum CUDNN_" #n " differs");
CD_DESCRIPTORS(CD_CHECK)
CD_ATTRS(CD_CHECK)
CD_TYPES(CD_CHECK)
CD_VALUES(CD_CHECK)
#undef CD_CHECK
#endif

cd_api cda_api;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_state; /* 0 absent, 1 loaded, -1 broken */
static char load_err[1024];

static void load(void) {
  static const char *const names[] = {"libcudnn.so.9", "libcudnn.so"};
  char tried[768], path[512];
  void *h = gpu_dlopen_lib("MOEC_LIBCUDNN", names, 2, path, sizeof path, tried, sizeof tried);
  if (!h) {
    snprintf(load_err, sizeof load_err, "libcudnn not found (tried %s)", tried);
    load_state = getenv("MOEC_LIBCUDNN") && *getenv("MOEC_LIBCUDNN") ? -1 : 0; /* asked for by path: an error */
    return;
  }
  static const struct {
    void **slot;
    const char *sym;
  } syms[] = {
      {(void **)&cda_api.GetVersion, "cudnnGetVersion"},
      {(void **)&cda_api.Create, "cudnnCreate"},
      {(void **)&cda_api.Destroy, "cudnnDestroy"},
      {(void **)&cda_api.SetStream, "cudnnSetStream"},
      {(void **)&cda_api.GetErrorString, "cudnnGetErrorString"},
      {(void **)&cda_api.CreateDescriptor, "cudnnBackendCreateDescriptor"},
      {(void **)&cda_api.DestroyDescriptor, "cudnnBackendDestroyDescriptor"},
      {(void **)&cda_api.Finalize, "cudnnBackendFinalize"},
      {(void **)&cda_api.SetAttribute, "cudnnBackendSetAttribute"},
      {(void **)&cda_api.GetAttribute, "cudnnBackendGetAttribute"},
      {(void **)&cda_api.Execute, "cudnnBackendExecute"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
    if (!(*syms[i].slot = dlsym(h, syms[i].sym))) {
      snprintf(load_err, sizeof load_err, "%s lacks %s (moec needs cuDNN 9)", path, syms[i].sym);
      load_state = -1;
      return;
    }
  *(void **)&cda_api.GetLastErrorString = dlsym(h, "cudnnGetLastErrorString"); /* 9.0 on */
  const size_t ver = cda_api.GetVersion();
  if (ver < 90000) {
    snprintf(load_err, sizeof load_err, "%s is cuDNN %zu.%zu.%zu; moec needs cuDNN 9", path, ver / 10000,
             ver / 100 % 100, ver % 100);
    load_state = -1;
    return;
  }
  load_state = 1;
}

int cda_debug_on(void) {
  static int v = -1;
  if (v < 0) {
    const char *e = getenv("MOEC_CUDNN_DEBUG");
    v = e && *e && strcmp(e, "0") != 0;
  }
  return v;
}

void cda_dbg(const char *fmt, ...) {
  if (!cda_debug_on()) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "moec cudnn: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

/* err = "cuDNN: <call> failed: <status name> (<code>): <last error>" */
int cda_fail_status(cd_status st, char *err, size_t errlen, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  char last[512] = "";
  if (cda_api.GetLastErrorString) cda_api.GetLastErrorString(last, sizeof last);
  snprintf(err, errlen, "cuDNN: %s failed: %s (%d)%s%s", what, cda_api.GetErrorString ? cda_api.GetErrorString(st) : "?",
           st, last[0] ? ": " : "", last);
  cda_dbg("%s", err);
  return -1;
}

gpu_cudnn_attn *gpu_cudnn_attn_new(gpu_ctx *g, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  pthread_once(&load_once, load);
  if (load_state != 1) {
    cda_dbg("%s", load_err);
    if (load_state < 0) snprintf(err, errlen, "%s", load_err);
    return NULL;
  }
  gpu_cudnn_attn *c = calloc(1, sizeof *c);
  if (!c || !(c->stats = gpu_rowstats_new(g, "attention softmax stats (cuDNN)"))) {
    free(c);
    return snprintf(err, errlen, "out of host memory"), NULL;
  }
  c->g = g;
  c->version = cda_api.GetVersion();
  cd_status st = cda_api.Create(&c->handle);
  if (st != CD_STATUS_SUCCESS) {
    cda_fail_status(st, err, errlen, "cudnnCreate");
    gpu_rowstats_free(c->stats);
    free(c);
    return NULL;
  }
  st = cda_api.SetStream(c->handle, gpu_stream(g));
  if (st != CD_STATUS_SUCCESS) {
    cda_fail_status(st, err, errlen, "cudnnSetStream");
    gpu_cudnn_attn_free(c);
    return NULL;
  }
  cda_dbg("cuDNN %zu loaded; handle on the context's stream", c->version);
  return c;
}

void gpu_cudnn_attn_free(gpu_cudnn_attn *c) {
  if (!c) return;
  gpu_sync(c->g);
  for (int i = 0; i < PLAN_SLOTS; i++) cda_plan_release(&c->plans[i]);
  gpu_rowstats_free(c->stats);
  gpu_free(c->g, c->workspace);
  gpu_free(c->g, c->ssum);
  gpu_free(c->g, c->dq_accum);
  gpu_free(c->g, c->out_scratch);
  if (c->handle) cda_api.Destroy(c->handle);
  free(c);
}

size_t gpu_cudnn_attn_version(const gpu_cudnn_attn *c) { return c ? c->version : 0; }
int gpu_cudnn_attn_supports(const gpu_cudnn_attn *c, int64_t hd) { return c && (hd == 64 || hd == 128); }
void gpu_cudnn_attn_new_run(gpu_cudnn_attn *c) {
  if (c) gpu_rowstats_new_run(c->stats);
}
