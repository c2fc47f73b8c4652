/* gpu_nvrtc.h -- compiles generated CUDA C with NVRTC (loaded at run time) to a cubin for one
 * architecture, with an on-disk cache and an optional dump of sources and logs.
 *
 * NVRTC needs no GPU: the same call serves the executor (arch from the device) and the CI
 * test that compiles every generated kernel for sm_90 and sm_90a.
 *
 * Library. MOEC_LIBNVRTC=PATH, else libnvrtc.so.13, .so.12, .so by the loader's path, else
 * the same names under $CUDA_HOME/lib64, $CUDA_PATH/lib64 and /usr/local/cuda/lib64.
 *
 * Cache. Key = SHA-256 of (NVRTC version, options, module name, source); the cubin is stored
 * as KEY.cubin (KEY.ptx for a PTX fallback) and its log as KEY.log, in opts->cache_dir, else
 * $MOEC_CACHE, else $XDG_CACHE_HOME/moec/kernels, else ~/.cache/moec/kernels. MOEC_CACHE=off
 * (or cache_dir "") disables it. Entries are written to a temporary name and renamed, so
 * concurrent processes never read half a file.
 */
#ifndef MOEC_GPU_NVRTC_H
#define MOEC_GPU_NVRTC_H

#include <stddef.h>

typedef struct {
  const char *arch;      /* "sm_90a", "sm_90", ...: a cubin; "compute_90": PTX */
  const char *dump_dir;  /* write NAME.cu and NAME.log here; NULL: no dump */
  const char *cache_dir; /* NULL: the default above; "": no cache */
  int strict;            /* also ask ptxas to warn on spills and local memory (CI) */
  const char *const *extra; /* more NVRTC options, n_extra of them */
  int n_extra;
} gpu_nvrtc_opts;

typedef struct {
  void *image;     /* cubin bytes, or NUL-terminated PTX */
  size_t size;
  int is_ptx;
  int from_cache;
  char *log;       /* NVRTC's log (warnings), "" when clean; never NULL on success */
  char key[65];    /* the cache key, hex */
} gpu_nvrtc_out;

/* Loads NVRTC once per process. 0, or -1 and a message naming what was tried. */
int gpu_nvrtc_load(char *err, size_t errlen);
void gpu_nvrtc_version(int *major, int *minor);
/* 1 when NVRTC can emit a cubin for sm_<sm> (90 for sm_90). */
int gpu_nvrtc_supports(int sm);
/* The target for a device of compute capability major.minor: its own "sm_XY[a]" when NVRTC
 * knows it, else PTX for the newest older architecture NVRTC knows ("compute_XY"), which the
 * driver compiles at load. Writes "" when NVRTC knows nothing that old. */
void gpu_nvrtc_pick_arch(int cc_major, int cc_minor, char *arch, size_t len);

/* The options every moec kernel is compiled with (besides the arch): C++17, and
 * --fmad=false, so that a*b+c rounds twice as in the CPU reference (these kernels are
 * memory-bound; contraction would buy nothing and cost bit-parity). NULL-terminated. */
extern const char *const gpu_nvrtc_base_options[];

/* Compiles `src` (module `name`, used for file names and messages). On success *out owns the
 * image and log (free with gpu_nvrtc_out_free). On failure returns -1 with the reason, and
 * NVRTC's log, in err. */
int gpu_nvrtc_compile(const char *name, const char *src, const gpu_nvrtc_opts *o,
                      gpu_nvrtc_out *out, char *err, size_t errlen);
void gpu_nvrtc_out_free(gpu_nvrtc_out *out);

/* The cache directory that o (or the environment) selects; "" when caching is off. */
void gpu_nvrtc_cache_dir(const gpu_nvrtc_opts *o, char *buf, size_t len);

#endif
