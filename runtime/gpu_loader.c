/* gpu_loader.c -- loads libcuda.so.1 with dlopen and wraps the few driver calls moec needs.
 *
 * Types and constants are redeclared from CUDA 13.0's cuda.h (values cited); handles are
 * void *. Symbols are resolved by the names cuda.h maps the API to (cuMemAlloc ->
 * cuMemAlloc_v2, ...), which exist in every driver since CUDA 12.0; cuEventElapsedTime_v2
 * (CUDA 12.8) falls back to cuEventElapsedTime. Async calls use the per-context stream, not
 * the legacy default stream (which a non-blocking stream does not wait for).
 */
#include "gpu_loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- cuda.h, CUDA 13.0 ---- */
typedef int CUresult; /* enum cudaError_enum */
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent;
typedef unsigned long long CUdeviceptr; /* CUdeviceptr_v2 on 64-bit hosts */
enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_STUB_LIBRARY = 34,
  CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
  CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804,
};
enum { /* CUdevice_attribute */
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
  CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
  CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
  CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
};
enum { CU_STREAM_NON_BLOCKING = 0x1, CU_EVENT_DEFAULT = 0x0 };
enum { CU_FUNC_ATTRIBUTE_NUM_REGS = 4, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 };

/* X(field, symbol, fallback symbol or NULL, return, parameters) */
#define GPU_DRIVER_FUNCS(X)                                                                   \
  X(Init, "cuInit", NULL, CUresult, (unsigned))                                               \
  X(DriverGetVersion, "cuDriverGetVersion", NULL, CUresult, (int *))                         \
  X(DeviceGetCount, "cuDeviceGetCount", NULL, CUresult, (int *))                             \
  X(DeviceGet, "cuDeviceGet", NULL, CUresult, (CUdevice *, int))                             \
  X(DeviceGetName, "cuDeviceGetName", NULL, CUresult, (char *, int, CUdevice))               \
  X(DeviceGetAttribute, "cuDeviceGetAttribute", NULL, CUresult, (int *, int, CUdevice))      \
  X(DeviceTotalMem, "cuDeviceTotalMem_v2", NULL, CUresult, (size_t *, CUdevice))             \
  X(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL, CUresult, (CUcontext *, CUdevice))   \
  X(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", NULL, CUresult, (CUdevice))           \
  X(CtxSetCurrent, "cuCtxSetCurrent", NULL, CUresult, (CUcontext))                           \
  X(MemGetInfo, "cuMemGetInfo_v2", NULL, CUresult, (size_t *, size_t *))                     \
  X(MemAlloc, "cuMemAlloc_v2", NULL, CUresult, (CUdeviceptr *, size_t))                      \
  X(MemFree, "cuMemFree_v2", NULL, CUresult, (CUdeviceptr))                                  \
  X(MemAllocHost, "cuMemAllocHost_v2", "cuMemAllocHost", CUresult, (void **, size_t))        \
  X(MemFreeHost, "cuMemFreeHost", NULL, CUresult, (void *))                                  \
  X(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", NULL, CUresult,                                 \
    (CUdeviceptr, const void *, size_t, CUstream))                                           \
  X(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", NULL, CUresult,                                 \
    (void *, CUdeviceptr, size_t, CUstream))                                                 \
  X(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", NULL, CUresult,                                 \
    (CUdeviceptr, CUdeviceptr, size_t, CUstream))                                            \
  X(MemsetD8Async, "cuMemsetD8Async", NULL, CUresult,                                        \
    (CUdeviceptr, unsigned char, size_t, CUstream))                                          \
  X(MemsetD32Async, "cuMemsetD32Async", NULL, CUresult,                                      \
    (CUdeviceptr, unsigned, size_t, CUstream))                                               \
  X(StreamCreate, "cuStreamCreate", NULL, CUresult, (CUstream *, unsigned))                  \
  X(StreamDestroy, "cuStreamDestroy_v2", NULL, CUresult, (CUstream))                         \
  X(StreamSynchronize, "cuStreamSynchronize", NULL, CUresult, (CUstream))                    \
  X(StreamWaitEvent, "cuStreamWaitEvent", NULL, CUresult, (CUstream, CUevent, unsigned))     \
  X(ModuleLoadData, "cuModuleLoadData", NULL, CUresult, (CUmodule *, const void *))          \
  X(ModuleUnload, "cuModuleUnload", NULL, CUresult, (CUmodule))                              \
  X(ModuleGetFunction, "cuModuleGetFunction", NULL, CUresult,                                \
    (CUfunction *, CUmodule, const char *))                                                  \
  X(FuncSetAttribute, "cuFuncSetAttribute", NULL, CUresult, (CUfunction, int, int))          \
  X(FuncGetAttribute, "cuFuncGetAttribute", NULL, CUresult, (int *, int, CUfunction))        \
  X(LaunchKernel, "cuLaunchKernel", NULL, CUresult,                                          \
    (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,       \
     CUstream, void **, void **))                                                            \
  X(EventCreate, "cuEventCreate", NULL, CUresult, (CUevent *, unsigned))                     \
  X(EventRecord, "cuEventRecord", NULL, CUresult, (CUevent, CUstream))                       \
  X(EventSynchronize, "cuEventSynchronize", NULL, CUresult, (CUevent))                       \
  X(EventQuery, "cuEventQuery", NULL, CUresult, (CUevent))                                   \
  X(EventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime", CUresult,               \
    (float *, CUevent, CUevent))                                                             \
  X(EventDestroy, "cuEventDestroy_v2", NULL, CUresult, (CUevent))                            \
  X(GetErrorName, "cuGetErrorName", NULL, CUresult, (CUresult, const char **))               \
  X(GetErrorString, "cuGetErrorString", NULL, CUresult, (CUresult, const char **))

static struct {
#define X(f, sym, fb, ret, params) ret(*f) params;
  GPU_DRIVER_FUNCS(X)
#undef X
} cu;

/* cuTensorMapEncodeTiled (CUDA 12.0+), looked up apart: the device-driven GEMM's TMA loads
 * need it, nothing else does, and the CPU emulator has none. */
static CUresult (*tensor_map_encode_tiled)(void *map, int dtype, unsigned rank, void *base, const uint64_t *dims,
                                           const uint64_t *strides, const unsigned *box, const unsigned *elem_strides,
                                           int interleave, int swizzle, int l2_promotion, int oob_fill);

/* cuProfilerStart / cuProfilerStop, also optional: they only bound what `ncu
 * --profile-from-start off` records (MOEC_PROFILE_STEP, runtime/train.c). */
static CUresult (*profiler_start)(void), (*profiler_stop)(void);

/* cuStreamCreateWithPriority and cuCtxGetStreamPriorityRange, optional too: without them (the
 * CPU emulator) a stream of another priority is a stream of the default one. */
static CUresult (*stream_create_prio)(CUstream *, unsigned, int), (*stream_prio_range)(int *, int *);

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_rc = -1;
static char load_err[512];

struct gpu_ctx {
  CUdevice dev;
  CUcontext ctx;
  CUstream stream;
  gpu_device_info info;
  size_t held, peak;      /* bytes from gpu_alloc now, and at most (what the driver gave us) */
  size_t idle, peak_used; /* of held, bytes no tensor occupies (a pool's cached buffers and size
                             rounding, gpu_note_idle); the most held - idle at once */
  struct alloc_rec *recs; /* (n_recs) live allocations, for gpu_free's accounting */
  size_t n_recs, cap_recs;
  const char *last_kernel; /* the last launch, named when a later sync fails */
  gpu_host_stats hs;       /* the host's time blocked on the GPU and in queueing work */
  gpu_work_hook work_hook;  /* MOEC_PROFILE=kernels */
  void *work_hook_ud;
  char err[1024];
};

static void fmt(char *buf, size_t len, const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, len, f, ap);
  va_end(ap);
}

const char *gpu_result_string(int r, char *buf, size_t len) {
  const char *name = NULL, *str = NULL;
  if (cu.GetErrorName) cu.GetErrorName(r, &name);
  if (cu.GetErrorString) cu.GetErrorString(r, &str);
  if (name && str) fmt(buf, len, "%s: %s", name, str);
  else fmt(buf, len, "CUDA driver error %d", r);
  return buf;
}

void *gpu_dlopen_lib(const char *env_var, const char *const *names, int n, char *path, size_t plen, char *tried,
                     size_t tlen) {
  const char *env = getenv(env_var);
  const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
  if (tlen) tried[0] = '\0';
  for (int d = -1; d < 3; d++) {
    for (int i = 0; i < n; i++) {
      if (env && *env) fmt(path, plen, "%s", env);
      else if (d < 0) fmt(path, plen, "%s", names[i]);
      else if (homes[d] && *homes[d]) fmt(path, plen, "%s/lib64/%s", homes[d], names[i]);
      else break;
      void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h) return h;
      size_t k = strlen(tried);
      if (k + 1 < tlen) fmt(tried + k, tlen - k, "%s%s", k ? ", " : "", path);
      if (env && *env) return NULL; /* an explicit path is the only candidate */
    }
  }
  return NULL;
}

const char *gpu_fmt_bytes(size_t b, char *buf, size_t len) {
  if (b < 1024) fmt(buf, len, "%zu B", b);
  else if (b < (size_t)1 << 20) fmt(buf, len, "%.2f KiB", b / 1024.0);
  else if (b < (size_t)1 << 30) fmt(buf, len, "%.2f MiB", b / 1048576.0);
  else fmt(buf, len, "%.2f GiB", b / 1073741824.0);
  return buf;
}

/* A symbol, or its older name when the driver predates the newer one. */
static void *resolve(void *h, const char *sym, const char *fallback) {
  void *p = dlsym(h, sym);
  return p || !fallback ? p : dlsym(h, fallback);
}

static void load_driver(void) {
  const char *path = getenv("MOEC_LIBCUDA");
  const char *lib = path && *path ? path : "libcuda.so.1";
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    if (path && *path) fmt(load_err, sizeof load_err, "MOEC_LIBCUDA=%s cannot be loaded (%s); use --device cpu", path, dlerror());
    else fmt(load_err, sizeof load_err, "libcuda.so.1 not found (no NVIDIA driver); use --device cpu");
    return;
  }
#define X(f, sym, fb, ret, params)                                                           \
  *(void **)&cu.f = resolve(h, sym, fb);                                                    \
  if (!cu.f) {                                                                               \
    fmt(load_err, sizeof load_err, "%s lacks %s (NVIDIA driver too old: moec needs CUDA 12.0 or newer); use --device cpu", lib, sym); \
    memset(&cu, 0, sizeof cu);                                                               \
    return;                                                                                  \
  }
  GPU_DRIVER_FUNCS(X)
#undef X
  *(void **)&tensor_map_encode_tiled = dlsym(h, "cuTensorMapEncodeTiled"); /* optional: TMA (gpu_wgmma.c) */
  *(void **)&profiler_start = dlsym(h, "cuProfilerStart");
  *(void **)&profiler_stop = dlsym(h, "cuProfilerStop");
  *(void **)&stream_create_prio = dlsym(h, "cuStreamCreateWithPriority");
  *(void **)&stream_prio_range = dlsym(h, "cuCtxGetStreamPriorityRange");
  CUresult r = cu.Init(0);
  if (r != CUDA_SUCCESS) {
    char rs[256];
    gpu_result_string(r, rs, sizeof rs);
    const char *why = r == CUDA_ERROR_NO_DEVICE ? "no CUDA-capable GPU is visible"
                    : r == CUDA_ERROR_STUB_LIBRARY ? "the libcuda.so.1 found is the toolkit's stub, not a driver"
                    : r == CUDA_ERROR_SYSTEM_DRIVER_MISMATCH || r == CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE
                        ? "the user-space driver does not match the kernel module"
                    : r == CUDA_ERROR_DEVICE_UNAVAILABLE ? "the GPU is busy or unavailable"
                                                         : "the driver failed to initialise";
    fmt(load_err, sizeof load_err, "cuInit failed: %s (%s); use --device cpu", why, rs);
    return;
  }
  load_rc = 0;
}

int gpu_driver_load(char *err, size_t errlen) {
  pthread_once(&load_once, load_driver);
  if (load_rc != 0 && err) fmt(err, errlen, "%s", load_err);
  return load_rc;
}

int gpu_device_count(int *n, char *err, size_t errlen) {
  *n = 0;
  if (gpu_driver_load(err, errlen)) return -1;
  CUresult r = cu.DeviceGetCount(n);
  if (r != CUDA_SUCCESS) {
    char rs[256];
    fmt(err, errlen, "cuDeviceGetCount failed (%s)", gpu_result_string(r, rs, sizeof rs));
    return -1;
  }
  return 0;
}

/* Records a failed driver call in the context; returns -1. */
static int fail(gpu_ctx *g, CUresult r, const char *what) {
  char rs[256];
  fmt(g->err, sizeof g->err, "%s failed (%s)", what, gpu_result_string(r, rs, sizeof rs));
  return -1;
}

#define CALL(g, expr, what)                                                                  \
  do {                                                                                       \
    CUresult r_ = (expr);                                                                    \
    if (r_ != CUDA_SUCCESS) return fail((g), r_, (what));                                    \
  } while (0)

static int query(gpu_ctx *g) {
  gpu_device_info *d = &g->info;
  struct { int *dst, attr; } attrs[] = {
      {&d->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR},
      {&d->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR},
      {&d->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT},
      {&d->l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE},
      {&d->smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN},
      {&d->max_threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
      {&d->pci_domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID},
      {&d->pci_bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID},
      {&d->pci_device, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID},
  };
  CALL(g, cu.DeviceGetName(d->name, (int)sizeof d->name, g->dev), "cuDeviceGetName");
  for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++)
    CALL(g, cu.DeviceGetAttribute(attrs[i].dst, attrs[i].attr, g->dev), "cuDeviceGetAttribute");
  CALL(g, cu.DeviceTotalMem(&d->total_mem, g->dev), "cuDeviceTotalMem");
  CALL(g, cu.DriverGetVersion(&d->driver_version), "cuDriverGetVersion");
  /* The arch-specific target (sm_90a) unlocks wgmma and setmaxnreg on Hopper; such a cubin
   * runs on exactly that compute capability, which is the device it was built for. */
  fmt(d->arch, sizeof d->arch, "sm_%d%d%s", d->cc_major, d->cc_minor, d->cc_major >= 9 ? "a" : "");
  return 0;
}

gpu_ctx *gpu_open(int ordinal, char *err, size_t errlen) {
  int n;
  if (gpu_device_count(&n, err, errlen)) return NULL;
  if (n == 0) {
    fmt(err, errlen, "the NVIDIA driver sees no GPU; use --device cpu");
    return NULL;
  }
  if (ordinal < 0 || ordinal >= n) {
    fmt(err, errlen, "GPU %d asked for, but there %s %d (0..%d)", ordinal, n == 1 ? "is" : "are", n, n - 1);
    return NULL;
  }
  gpu_ctx *g = calloc(1, sizeof *g);
  if (!g) {
    fmt(err, errlen, "out of host memory");
    return NULL;
  }
  g->info.ordinal = ordinal;
  CUresult r = cu.DeviceGet(&g->dev, ordinal);
  if (r == CUDA_SUCCESS) r = cu.PrimaryCtxRetain(&g->ctx, g->dev);
  if (r == CUDA_SUCCESS) r = cu.CtxSetCurrent(g->ctx);
  if (r == CUDA_SUCCESS) r = cu.StreamCreate(&g->stream, CU_STREAM_NON_BLOCKING);
  if (r != CUDA_SUCCESS) fail(g, r, "creating a context on the GPU");
  if (r != CUDA_SUCCESS || query(g)) {
    fmt(err, errlen, "GPU %d: %s", ordinal, g->err);
    gpu_close(g);
    return NULL;
  }
  return g;
}

void gpu_close(gpu_ctx *g) {
  if (!g) return;
  if (g->stream) cu.StreamDestroy(g->stream);
  if (g->ctx) cu.PrimaryCtxRelease(g->dev);
  free(g->recs);
  free(g);
}

const gpu_device_info *gpu_info(const gpu_ctx *g) { return &g->info; }
const char *gpu_error(const gpu_ctx *g) { return g->err; }
void *gpu_stream(const gpu_ctx *g) { return g->stream; }
size_t gpu_peak_bytes(const gpu_ctx *g) { return g->peak; }
size_t gpu_held_bytes(const gpu_ctx *g) { return g->held; }
size_t gpu_used_bytes(const gpu_ctx *g) { return g->held - g->idle; }
size_t gpu_peak_used_bytes(const gpu_ctx *g) { return g->peak_used; }

static void note_used(gpu_ctx *g) {
  if (g->held - g->idle > g->peak_used) g->peak_used = g->held - g->idle;
}

void gpu_note_idle(gpu_ctx *g, ptrdiff_t delta) {
  g->idle = (size_t)((ptrdiff_t)g->idle + delta);
  note_used(g);
}

int gpu_mem_info(gpu_ctx *g, size_t *free_b, size_t *total_b) {
  CALL(g, cu.MemGetInfo(free_b, total_b), "cuMemGetInfo");
  return 0;
}

void gpu_oom_message(char *buf, size_t len, const char *what, size_t asked, size_t free_b,
                     size_t total_b, const char *device) {
  char a[32], f[32], t[32];
  fmt(buf, len,
      "out of GPU memory allocating %s: asked %s, %s free of %s on %s; use a smaller seq or "
      "batch (--set seq=N, --set batch=N), or precision = mxfp8",
      what && *what ? what : "a buffer", gpu_fmt_bytes(asked, a, sizeof a),
      gpu_fmt_bytes(free_b, f, sizeof f), gpu_fmt_bytes(total_b, t, sizeof t), device);
}

/* Allocation sizes are remembered so that gpu_free can keep the held/peak counts. */
typedef struct alloc_rec {
  gpu_ptr p;
  size_t bytes;
} alloc_rec;

int gpu_alloc(gpu_ctx *g, gpu_ptr *p, size_t bytes, const char *what) {
  *p = 0;
  CUdeviceptr d = 0;
  CUresult r = cu.MemAlloc(&d, bytes ? bytes : 1);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    size_t fr = 0, tot = g->info.total_mem;
    cu.MemGetInfo(&fr, &tot);
    gpu_oom_message(g->err, sizeof g->err, what, bytes, fr, tot, g->info.name);
    return -1;
  }
  if (r != CUDA_SUCCESS) {
    char rs[256];
    fmt(g->err, sizeof g->err, "cuMemAlloc of %zu bytes for %s failed (%s)", bytes, what ? what : "a buffer",
        gpu_result_string(r, rs, sizeof rs));
    return -1;
  }
  if (g->n_recs == g->cap_recs) {
    size_t nc = g->cap_recs ? 2 * g->cap_recs : 64;
    alloc_rec *nr = realloc(g->recs, nc * sizeof *nr);
    if (!nr) {
      cu.MemFree(d);
      fmt(g->err, sizeof g->err, "out of host memory");
      return -1;
    }
    g->recs = nr;
    g->cap_recs = nc;
  }
  g->recs[g->n_recs++] = (alloc_rec){d, bytes};
  g->held += bytes;
  if (g->held > g->peak) g->peak = g->held;
  note_used(g);
  *p = d;
  return 0;
}

void gpu_free(gpu_ctx *g, gpu_ptr p) {
  if (!p) return;
  for (size_t i = g->n_recs; i-- > 0;) /* recent allocations are freed first */
    if (g->recs[i].p == p) {
      g->held -= g->recs[i].bytes;
      g->recs[i] = g->recs[--g->n_recs];
      break;
    }
  cu.MemFree(p);
}

double gpu_clock_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

gpu_host_stats gpu_host_stats_of(const gpu_ctx *g) { return g->hs; }

void gpu_note_issue(gpu_ctx *g, double t0) {
  const double dt = gpu_clock_s() - t0;
  g->hs.issue_s += dt;
  g->hs.issues++;
  if (dt > 50e-6) g->hs.slow_issues++, g->hs.slow_s += dt;
}

int gpu_sync(gpu_ctx *g) {
  const double t0 = gpu_clock_s();
  CUresult r = cu.StreamSynchronize(g->stream);
  g->hs.wait_s += gpu_clock_s() - t0;
  if (r != CUDA_SUCCESS) {
    char rs[256], what[160];
    fmt(what, sizeof what, "the GPU stream (last kernel launched: %s)", g->last_kernel ? g->last_kernel : "none");
    fmt(g->err, sizeof g->err, "%s failed (%s)", what, gpu_result_string(r, rs, sizeof rs));
    return -1;
  }
  return 0;
}

/* From pageable memory the copies wait for the stream inside the call: waiting, as the sync. */
int gpu_upload(gpu_ctx *g, gpu_ptr dst, const void *src, size_t bytes) {
  if (!bytes) return 0;
  const double t0 = gpu_clock_s();
  CUresult r = cu.MemcpyHtoDAsync(dst, src, bytes, g->stream);
  g->hs.wait_s += gpu_clock_s() - t0;
  if (r != CUDA_SUCCESS) return fail(g, r, "cuMemcpyHtoDAsync");
  return gpu_sync(g);
}

int gpu_download(gpu_ctx *g, void *dst, gpu_ptr src, size_t bytes) {
  if (!bytes) return 0;
  const double t0 = gpu_clock_s();
  CUresult r = cu.MemcpyDtoHAsync(dst, src, bytes, g->stream);
  g->hs.wait_s += gpu_clock_s() - t0;
  if (r != CUDA_SUCCESS) return fail(g, r, "cuMemcpyDtoHAsync");
  return gpu_sync(g);
}

int gpu_alloc_host(gpu_ctx *g, void **p, size_t bytes) {
  *p = NULL;
  CALL(g, cu.MemAllocHost(p, bytes ? bytes : 1), "cuMemAllocHost (page-locked host memory)");
  return 0;
}

void gpu_free_host(gpu_ctx *g, void *p) {
  (void)g;
  if (p) cu.MemFreeHost(p);
}

int gpu_download_async(gpu_ctx *g, void *dst, gpu_ptr src, size_t bytes) {
  if (!bytes) return 0;
  const double t0 = gpu_clock_s(); /* queued work: may block on a full queue */
  CALL(g, cu.MemcpyDtoHAsync(dst, src, bytes, g->stream), "cuMemcpyDtoHAsync");
  gpu_note_issue(g, t0);
  return 0;
}

int gpu_event_wait(gpu_ctx *g, void *ev) {
  const double t0 = gpu_clock_s();
  CUresult r = cu.EventSynchronize(ev);
  g->hs.wait_s += gpu_clock_s() - t0;
  if (r != CUDA_SUCCESS) {
    char rs[256];
    fmt(g->err, sizeof g->err, "waiting for the GPU (last kernel launched: %s) failed (%s)",
        g->last_kernel ? g->last_kernel : "none", gpu_result_string(r, rs, sizeof rs));
    return -1;
  }
  return 0;
}

int gpu_copy(gpu_ctx *g, gpu_ptr dst, gpu_ptr src, size_t bytes) {
  if (!bytes) return 0;
  const double t0 = gpu_clock_s(); /* queued work: may block on a full queue */
  CALL(g, cu.MemcpyDtoDAsync(dst, src, bytes, g->stream), "cuMemcpyDtoDAsync");
  gpu_note_issue(g, t0);
  return 0;
}

int gpu_memset8(gpu_ctx *g, gpu_ptr dst, unsigned char v, size_t n) {
  if (!n) return 0;
  const double t0 = gpu_clock_s(); /* queued work: may block on a full queue */
  CALL(g, cu.MemsetD8Async(dst, v, n, g->stream), "cuMemsetD8Async");
  gpu_note_issue(g, t0);
  return 0;
}

int gpu_memset32(gpu_ctx *g, gpu_ptr dst, uint32_t v, size_t n) {
  if (!n) return 0;
  const double t0 = gpu_clock_s(); /* queued work: may block on a full queue */
  CALL(g, cu.MemsetD32Async(dst, v, n, g->stream), "cuMemsetD32Async");
  gpu_note_issue(g, t0);
  return 0;
}

int gpu_module_load(gpu_ctx *g, const void *image, void **module, const char *name) {
  CUresult r = cu.ModuleLoadData(module, image);
  if (r != CUDA_SUCCESS) {
    char what[160];
    fmt(what, sizeof what, "loading kernel module %s", name ? name : "?");
    return fail(g, r, what);
  }
  return 0;
}

void gpu_module_unload(gpu_ctx *g, void *module) {
  (void)g;
  if (module) cu.ModuleUnload(module);
}

int gpu_function(gpu_ctx *g, void *module, const char *name, void **fn) {
  CUresult r = cu.ModuleGetFunction(fn, module, name);
  if (r != CUDA_SUCCESS) {
    char what[160];
    fmt(what, sizeof what, "finding kernel %s", name);
    return fail(g, r, what);
  }
  return 0;
}

void gpu_set_work_hook(gpu_ctx *g, gpu_work_hook hook, void *ud) {
  g->work_hook = hook;
  g->work_hook_ud = ud;
}

void gpu_note_work(gpu_ctx *g, const char *name) {
  if (g->work_hook) g->work_hook(g->work_hook_ud, name);
}

int gpu_launch(gpu_ctx *g, void *fn, const char *name, const unsigned grid[3], const unsigned block[3],
               unsigned smem, void **args) {
  g->last_kernel = name;
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return 0; /* nothing to do: not an error */
  gpu_note_work(g, name);
  const double t0 = gpu_clock_s();
  CUresult r = cu.LaunchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, g->stream, args, NULL);
  gpu_note_issue(g, t0);
  if (r != CUDA_SUCCESS) {
    char what[256];
    fmt(what, sizeof what, "launching %s (grid %u,%u,%u block %u,%u,%u smem %u)", name, grid[0], grid[1], grid[2],
        block[0], block[1], block[2], smem);
    return fail(g, r, what);
  }
  return 0;
}

int gpu_profiler_range(gpu_ctx *g, int on) {
  CUresult (*f)(void) = on ? profiler_start : profiler_stop;
  if (!f) {
    fmt(g->err, sizeof g->err, "this NVIDIA driver has no cuProfilerStart/cuProfilerStop");
    return -1;
  }
  CALL(g, f(), on ? "cuProfilerStart" : "cuProfilerStop");
  return 0;
}

int gpu_tensor_map_u8_2d(gpu_ctx *g, void *map, gpu_ptr base, uint64_t rows, uint64_t cols, unsigned box_cols,
                         unsigned box_rows) {
  if (!tensor_map_encode_tiled) {
    fmt(g->err, sizeof g->err, "this NVIDIA driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12.0 or newer)");
    return -1;
  }
  const uint64_t dims[2] = {cols, rows}, strides[1] = {cols};
  const unsigned box[2] = {box_cols, box_rows}, elem_strides[2] = {1, 1};
  /* CU_TENSOR_MAP_DATA_TYPE_UINT8 0, INTERLEAVE_NONE 0, SWIZZLE_128B 3, L2_PROMOTION_L2_256B 3, FLOAT_OOB_FILL_NONE 0 */
  CALL(g, tensor_map_encode_tiled(map, 0, 2, (void *)(uintptr_t)base, dims, strides, box, elem_strides, 0, 3, 3, 0),
       "cuTensorMapEncodeTiled");
  return 0;
}

int gpu_function_regs(gpu_ctx *g, void *fn, int *regs) {
  CALL(g, cu.FuncGetAttribute(regs, CU_FUNC_ATTRIBUTE_NUM_REGS, fn), "cuFuncGetAttribute");
  return 0;
}

int gpu_set_max_smem(gpu_ctx *g, void *fn, int bytes) {
  CALL(g, cu.FuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes), "cuFuncSetAttribute");
  return 0;
}

int gpu_timer_start(gpu_ctx *g, gpu_timer *t) {
  if (!t->start) CALL(g, cu.EventCreate(&t->start, CU_EVENT_DEFAULT), "cuEventCreate");
  if (!t->stop) CALL(g, cu.EventCreate(&t->stop, CU_EVENT_DEFAULT), "cuEventCreate");
  CALL(g, cu.EventRecord(t->start, g->stream), "cuEventRecord");
  return 0;
}

void gpu_timer_free(gpu_ctx *g, gpu_timer *t) {
  (void)g;
  if (t->start) cu.EventDestroy(t->start);
  if (t->stop) cu.EventDestroy(t->stop);
  t->start = t->stop = NULL;
}

int gpu_timer_stop(gpu_ctx *g, gpu_timer *t, float *ms) {
  CALL(g, cu.EventRecord(t->stop, g->stream), "cuEventRecord");
  CALL(g, cu.EventSynchronize(t->stop), "cuEventSynchronize");
  CALL(g, cu.EventElapsedTime(ms, t->start, t->stop), "cuEventElapsedTime");
  return 0;
}

int gpu_event_new(gpu_ctx *g, void **ev) {
  CALL(g, cu.EventCreate((CUevent *)ev, CU_EVENT_DEFAULT), "cuEventCreate");
  return 0;
}

int gpu_event_record(gpu_ctx *g, void *ev) {
  const double t0 = gpu_clock_s(); /* queued work: may block on a full queue */
  CALL(g, cu.EventRecord(ev, g->stream), "cuEventRecord");
  gpu_note_issue(g, t0);
  return 0;
}

int gpu_event_elapsed(gpu_ctx *g, void *earlier, void *later, float *ms) {
  CALL(g, cu.EventSynchronize(later), "cuEventSynchronize");
  CALL(g, cu.EventElapsedTime(ms, earlier, later), "cuEventElapsedTime");
  return 0;
}

int gpu_bind(gpu_ctx *g) {
  CALL(g, cu.CtxSetCurrent(g->ctx), "cuCtxSetCurrent");
  return 0;
}

int gpu_deterministic(void) {
  const char *e = getenv("MOEC_DETERMINISTIC");
  return e && *e && strcmp(e, "0") != 0;
}

int gpu_stream_new(gpu_ctx *g, void **stream) {
  *stream = NULL;
  CALL(g, cu.StreamCreate((CUstream *)stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate (a second stream)");
  return 0;
}

int gpu_stream_new_prio(gpu_ctx *g, void **stream, int priority) {
  int least = 0, greatest = 0;
  if (!priority || !stream_create_prio || !stream_prio_range || stream_prio_range(&least, &greatest) != CUDA_SUCCESS)
    return gpu_stream_new(g, stream);
  *stream = NULL;
  CALL(g, stream_create_prio((CUstream *)stream, CU_STREAM_NON_BLOCKING, priority > 0 ? greatest : least),
       "cuStreamCreateWithPriority (a second stream)");
  return 0;
}

int gpu_stream_sync(gpu_ctx *g, void *stream) {
  CALL(g, cu.StreamSynchronize(stream ? stream : g->stream), "cuStreamSynchronize (a second stream)");
  return 0;
}

void *gpu_stream_swap(gpu_ctx *g, void *stream) {
  void *was = g->stream;
  g->stream = stream;
  return was;
}

void gpu_stream_free(gpu_ctx *g, void *stream) {
  (void)g;
  if (stream) cu.StreamDestroy(stream);
}

int gpu_event_record_on(gpu_ctx *g, void *ev, void *stream) {
  const double t0 = gpu_clock_s();
  CALL(g, cu.EventRecord(ev, stream ? stream : g->stream), "cuEventRecord");
  gpu_note_issue(g, t0);
  return 0;
}

int gpu_stream_wait(gpu_ctx *g, void *stream, void *ev) {
  CALL(g, cu.StreamWaitEvent(stream ? stream : g->stream, ev, 0), "cuStreamWaitEvent");
  return 0;
}

int gpu_event_done(void *ev) {
  CUresult r = cu.EventQuery(ev);
  return r == CUDA_SUCCESS ? 1 : r == CUDA_ERROR_NOT_READY ? 0 : -1;
}

void gpu_event_free(gpu_ctx *g, void *ev) {
  (void)g;
  if (ev) cu.EventDestroy(ev);
}
