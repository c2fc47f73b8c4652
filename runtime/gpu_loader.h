/* gpu_loader.h -- the CUDA driver API, loaded at run time: device query, one context and one
 * stream per device, device memory, modules and kernel launches.
 *
 * Nothing here includes a CUDA header or links a CUDA library: libcuda.so.1 is dlopen()ed on
 * first use, so the moec binary starts on a machine with no NVIDIA driver and says exactly
 * what is missing when a GPU is asked for. The few driver types are redeclared in
 * gpu_loader.c with the values of CUDA 13.0's cuda.h.
 *
 * Errors. Functions return 0 or -1. Before a context exists the message goes into the
 * caller's err buffer; afterwards into the context (gpu_error). Messages are the text that
 * follows "moec: error: --device cuda: ", e.g. "libcuda.so.1 not found (no NVIDIA driver);
 * use --device cpu".
 *
 * Environment. MOEC_LIBCUDA=PATH loads that library instead of libcuda.so.1 (a test driver,
 * or a driver outside the loader's path).
 */
#ifndef MOEC_GPU_LOADER_H
#define MOEC_GPU_LOADER_H

#include <stddef.h>
#include <stdint.h>

typedef uint64_t gpu_ptr; /* CUdeviceptr: a device address, 0 = none */
typedef struct gpu_ctx gpu_ctx;

typedef struct {
  int ordinal;
  char name[256];
  int cc_major, cc_minor; /* compute capability, 9.0 on Hopper */
  int sm_count;
  int l2_bytes;
  int smem_optin;         /* most dynamic shared memory a block may opt in to, bytes */
  int max_threads;        /* per block */
  size_t total_mem;       /* bytes */
  int driver_version;     /* 13000 = CUDA 13.0 */
  char arch[16];          /* NVRTC target for this device: "sm_90a" (the 'a' from sm_90 on) */
  int pci_domain, pci_bus, pci_device; /* where it sits: which physical GPU, whatever CUDA_VISIBLE_DEVICES says */
} gpu_device_info;

/* MOEC_DETERMINISTIC=1: GPU runs of one command give the same bits every time, at some cost in
 * speed: attention through GEMMs instead of the flash backward's atomic adds (unless
 * MOEC_ATTENTION=flash says otherwise), and each GEMM on cuBLASLt's first heuristic choice
 * instead of the fastest one timed in this run. */
int gpu_deterministic(void);

/* Loads the driver and runs cuInit, once per process (later calls repeat the first result). */
int gpu_driver_load(char *err, size_t errlen);
/* Number of CUDA devices (0 when the driver loads but sees none). */
int gpu_device_count(int *n, char *err, size_t errlen);

/* Opens device `ordinal`: retains its primary context, makes it current on this thread and
 * creates one non-blocking stream, on which every async call below is queued. */
gpu_ctx *gpu_open(int ordinal, char *err, size_t errlen);
void gpu_close(gpu_ctx *g);
/* Makes g's context current on the calling thread (a helper thread that queries g's events). */
int gpu_bind(gpu_ctx *g);
const gpu_device_info *gpu_info(const gpu_ctx *g);
const char *gpu_error(const gpu_ctx *g); /* the last failure's message */
void *gpu_stream(const gpu_ctx *g);      /* the CUstream */

/* Device memory. gpu_alloc names what it allocates: on failure the message gives the bytes
 * asked and free, and a hint, e.g. "out of GPU memory allocating activations: asked 12.00
 * GiB, 4.10 GiB free of 139.81 GiB on NVIDIA H200; use a smaller seq or batch, or
 * precision = mxfp8". */
int gpu_mem_info(gpu_ctx *g, size_t *free_bytes, size_t *total_bytes);
int gpu_alloc(gpu_ctx *g, gpu_ptr *p, size_t bytes, const char *what);
void gpu_free(gpu_ctx *g, gpu_ptr p);
size_t gpu_peak_bytes(const gpu_ctx *g); /* most bytes held by gpu_alloc at once */
size_t gpu_held_bytes(const gpu_ctx *g); /* bytes held by gpu_alloc now */
/* A caching allocator on top (the executor's pool) tells how much of what it holds no tensor
 * occupies: its cached free buffers and the rounding of sizes up to its classes (delta > 0:
 * more idle). Held minus idle is what torch.cuda.memory_allocated counts, and its peak what
 * max_memory_allocated does: the measure the peer reports. */
void gpu_note_idle(gpu_ctx *g, ptrdiff_t delta);
size_t gpu_used_bytes(const gpu_ctx *g);      /* held - idle now */
size_t gpu_peak_used_bytes(const gpu_ctx *g); /* the most held - idle at once */
/* Where the host's time goes, summed since the context began: blocked in gpu_sync and
 * gpu_event_wait (and the synchronous copies built on them), and in the calls that queue GPU
 * work (kernel launches, cuBLASLt, cuDNN), of which those over 50 us mostly waited for room in
 * the driver's queue (the GPU behind). A step that waits little in either is bound by the host. */
typedef struct {
  double wait_s, issue_s, slow_s;
  long issues, slow_issues;
} gpu_host_stats;
gpu_host_stats gpu_host_stats_of(const gpu_ctx *g);
double gpu_clock_s(void);
void gpu_note_issue(gpu_ctx *g, double t0); /* a call that queued work returned; it began at t0 */
/* Formats the out-of-memory message (used by gpu_alloc; public for the memory planner,
 * which checks its predicted peak before allocating anything). */
void gpu_oom_message(char *buf, size_t len, const char *what, size_t asked, size_t free_bytes,
                     size_t total_bytes, const char *device);

/* Copies and fills on the context's stream. upload and download wait for the stream, so
 * host buffers may be reused on return; copy and the memsets are asynchronous. */
int gpu_upload(gpu_ctx *g, gpu_ptr dst, const void *src, size_t bytes);
int gpu_download(gpu_ctx *g, void *dst, gpu_ptr src, size_t bytes);
int gpu_copy(gpu_ctx *g, gpu_ptr dst, gpu_ptr src, size_t bytes);
/* Page-locked host memory, which a queued download (gpu_download_async: no wait; record an
 * event after it and gpu_event_wait for it) fills while the host goes on. */
int gpu_alloc_host(gpu_ctx *g, void **p, size_t bytes);
void gpu_free_host(gpu_ctx *g, void *p);
int gpu_download_async(gpu_ctx *g, void *dst, gpu_ptr src, size_t bytes);
int gpu_event_wait(gpu_ctx *g, void *ev); /* until the work before the event is done; reports a failure */
int gpu_memset8(gpu_ctx *g, gpu_ptr dst, unsigned char value, size_t count);
int gpu_memset32(gpu_ctx *g, gpu_ptr dst, uint32_t value, size_t count);
int gpu_sync(gpu_ctx *g); /* waits for the stream; reports a failed kernel by name */

/* Modules: a cubin (or NUL-terminated PTX, which the driver compiles). */
int gpu_module_load(gpu_ctx *g, const void *image, void **module, const char *name);
void gpu_module_unload(gpu_ctx *g, void *module);
int gpu_function(gpu_ctx *g, void *module, const char *name, void **fn);
/* cuLaunchKernel on the stream; args[i] points at the i-th kernel parameter. `name` is kept
 * so that a later asynchronous failure can say which kernel it followed. */
int gpu_launch(gpu_ctx *g, void *fn, const char *name, const unsigned grid[3],
               const unsigned block[3], unsigned smem_bytes, void **args);
/* A TMA descriptor (CUtensorMap, 128 bytes, 64-byte aligned, at map) of the row-major byte
 * matrix (rows, cols) at base: boxes of box_cols x box_rows with the 128-byte swizzle (wgmma's
 * K-major form), zeros read outside. -1 where the driver lacks TMA. */
/* on = 1: cuProfilerStart, 0: cuProfilerStop -- what an external profiler started with
 * `ncu --profile-from-start off` records lies between them. */
int gpu_profiler_range(gpu_ctx *g, int on);
int gpu_tensor_map_u8_2d(gpu_ctx *g, void *map, gpu_ptr base, uint64_t rows, uint64_t cols, unsigned box_cols,
                         unsigned box_rows);
/* Raises a kernel's dynamic shared memory limit (above 48 KiB needs this). */
int gpu_set_max_smem(gpu_ctx *g, void *fn, int bytes);
/* The registers a thread the loaded kernel fn was compiled to (what each launch reserves). */
int gpu_function_regs(gpu_ctx *g, void *fn, int *regs);

/* Timing with events on the stream: start, then stop returns the milliseconds between. */
typedef struct {
  void *start, *stop;
} gpu_timer;
int gpu_timer_start(gpu_ctx *g, gpu_timer *t);
int gpu_timer_stop(gpu_ctx *g, gpu_timer *t, float *ms);
void gpu_timer_free(gpu_ctx *g, gpu_timer *t);
/* Single events, for many marks on one timeline (the per-op profile): record queues the mark
 * on the stream; elapsed waits for `later` and gives the milliseconds since `earlier`. */
int gpu_event_new(gpu_ctx *g, void **ev);
int gpu_event_record(gpu_ctx *g, void *ev);
int gpu_event_elapsed(gpu_ctx *g, void *earlier, void *later, float *ms);
void gpu_event_free(gpu_ctx *g, void *ev);
/* A hook called before each kernel launch and each library call put on the stream (the kernel
 * profile, MOEC_PROFILE=kernels); NULL removes it. Libraries name their calls with
 * gpu_note_work; gpu_launch names its kernel. The name need not outlive the call. */
typedef void (*gpu_work_hook)(void *ud, const char *name);
void gpu_set_work_hook(gpu_ctx *g, gpu_work_hook hook, void *ud);
void gpu_note_work(gpu_ctx *g, const char *name);
/* 1 when the work before ev's record has finished, 0 not yet, -1 on an error; from any thread. */
int gpu_event_done(void *ev);
/* A second stream on g's context (the communication stream), and how streams order each other:
 * ev recorded on `stream`, and `stream` waiting (on the GPU; the host goes on) for the work
 * before ev's last record. stream NULL: g's own stream. */
int gpu_stream_new(gpu_ctx *g, void **stream);
/* ... of a priority: > 0 the device's greatest, < 0 its least, 0 the default. */
int gpu_stream_new_prio(gpu_ctx *g, void **stream, int priority);
/* Makes `stream` g's own (the one every queued call above uses) and returns the one it was:
 * a run of launches put on a second stream, the first swapped back after it. */
void *gpu_stream_swap(gpu_ctx *g, void *stream);
/* The host waits for `stream` (NULL: g's own). */
int gpu_stream_sync(gpu_ctx *g, void *stream);
void gpu_stream_free(gpu_ctx *g, void *stream);
int gpu_event_record_on(gpu_ctx *g, void *ev, void *stream);
int gpu_stream_wait(gpu_ctx *g, void *stream, void *ev);

/* "CUDA_ERROR_OUT_OF_MEMORY: out of memory" for a CUresult, via the driver when loaded. */
const char *gpu_result_string(int result, char *buf, size_t len);

/* dlopen()s a CUDA library: the path in environment variable env_var alone when it is set,
 * else the first of names[0..n) found by the dynamic loader, else under $CUDA_HOME/lib64,
 * $CUDA_PATH/lib64 and /usr/local/cuda/lib64. Returns the handle and the path it loaded,
 * or NULL and the comma-separated list of what was tried. */
void *gpu_dlopen_lib(const char *env_var, const char *const *names, int n, char *path, size_t path_len,
                     char *tried, size_t tried_len);

/* Human-readable byte count: "512 B", "1.50 MiB", "12.00 GiB". */
const char *gpu_fmt_bytes(size_t bytes, char *buf, size_t len);

#endif
