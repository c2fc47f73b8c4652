/* gpu_nvrtc.c -- NVRTC loaded with dlopen, a disk cache of compiled kernels, and the dump of
 * sources and logs. nvrtc.h's types are redeclared (CUDA 13.0 values): nvrtcResult is an
 * int enum (NVRTC_SUCCESS = 0), nvrtcProgram an opaque pointer. */
#include "gpu_nvrtc.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpu_loader.h"
#include "gpu_sha256.h"

typedef int nvrtcResult;
typedef void *nvrtcProgram;
enum { NVRTC_SUCCESS = 0 };

#define NVRTC_FUNCS(X)                                                                       \
  X(Version, "nvrtcVersion", (int *, int *))                                                 \
  X(GetNumSupportedArchs, "nvrtcGetNumSupportedArchs", (int *))                              \
  X(GetSupportedArchs, "nvrtcGetSupportedArchs", (int *))                                    \
  X(CreateProgram, "nvrtcCreateProgram",                                                     \
    (nvrtcProgram *, const char *, const char *, int, const char *const *, const char *const *)) \
  X(DestroyProgram, "nvrtcDestroyProgram", (nvrtcProgram *))                                 \
  X(CompileProgram, "nvrtcCompileProgram", (nvrtcProgram, int, const char *const *))         \
  X(GetProgramLogSize, "nvrtcGetProgramLogSize", (nvrtcProgram, size_t *))                   \
  X(GetProgramLog, "nvrtcGetProgramLog", (nvrtcProgram, char *))                             \
  X(GetCUBINSize, "nvrtcGetCUBINSize", (nvrtcProgram, size_t *))                             \
  X(GetCUBIN, "nvrtcGetCUBIN", (nvrtcProgram, char *))                                       \
  X(GetPTXSize, "nvrtcGetPTXSize", (nvrtcProgram, size_t *))                                 \
  X(GetPTX, "nvrtcGetPTX", (nvrtcProgram, char *))

static struct {
#define X(f, sym, params) nvrtcResult(*f) params;
  NVRTC_FUNCS(X)
#undef X
  const char *(*GetErrorString)(nvrtcResult);
  int major, minor;
  int archs[64], n_archs;
  char path[512];
} nv;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_rc = -1;
static char load_err[1024];

const char *const gpu_nvrtc_base_options[] = {"--std=c++17", "-default-device", "--fmad=false", "--generate-line-info", NULL};

static void fmt(char *buf, size_t len, const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, len, f, ap);
  va_end(ap);
}

static void load_nvrtc(void) {
  static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  char tried[768], path[512];
  void *h = gpu_dlopen_lib("MOEC_LIBNVRTC", names, 3, path, sizeof path, tried, sizeof tried);
  if (!h) {
    fmt(load_err, sizeof load_err,
        "libnvrtc not found (tried %s); install the CUDA toolkit's NVRTC, or set CUDA_HOME or MOEC_LIBNVRTC", tried);
    return;
  }
#define X(f, sym, params)                                                                    \
  if (!(*(void **)&nv.f = dlsym(h, sym))) {                                                  \
    fmt(load_err, sizeof load_err, "%s lacks %s (NVRTC too old: moec needs CUDA 12.0 or newer)", path, sym); \
    return;                                                                                  \
  }
  NVRTC_FUNCS(X)
#undef X
  *(void **)&nv.GetErrorString = dlsym(h, "nvrtcGetErrorString");
  snprintf(nv.path, sizeof nv.path, "%s", path);
  nv.Version(&nv.major, &nv.minor);
  int n = 0;
  if (nv.GetNumSupportedArchs(&n) == NVRTC_SUCCESS && n > 0 && n <= 64 && nv.GetSupportedArchs(nv.archs) == NVRTC_SUCCESS)
    nv.n_archs = n;
  load_rc = 0;
}

int gpu_nvrtc_load(char *err, size_t errlen) {
  pthread_once(&load_once, load_nvrtc);
  if (load_rc != 0 && err) fmt(err, errlen, "%s", load_err);
  return load_rc;
}

void gpu_nvrtc_version(int *major, int *minor) {
  *major = nv.major;
  *minor = nv.minor;
}

int gpu_nvrtc_supports(int sm) {
  for (int i = 0; i < nv.n_archs; i++)
    if (nv.archs[i] == sm) return 1;
  return 0;
}

void gpu_nvrtc_pick_arch(int cc_major, int cc_minor, char *arch, size_t len) {
  int sm = cc_major * 10 + cc_minor, best = 0;
  if (gpu_nvrtc_supports(sm)) {
    fmt(arch, len, "sm_%d%s", sm, cc_major >= 9 ? "a" : "");
    return;
  }
  for (int i = 0; i < nv.n_archs; i++)
    if (nv.archs[i] <= sm && nv.archs[i] > best) best = nv.archs[i];
  if (best) fmt(arch, len, "compute_%d", best);
  else if (len) arch[0] = '\0';
}

static const char *nvrtc_str(nvrtcResult r) {
  const char *s = nv.GetErrorString ? nv.GetErrorString(r) : NULL;
  return s ? s : "NVRTC error";
}

void gpu_nvrtc_cache_dir(const gpu_nvrtc_opts *o, char *buf, size_t len) {
  const char *env = getenv("MOEC_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  if (o && o->cache_dir) fmt(buf, len, "%s", o->cache_dir);
  else if (env && strcmp(env, "off") == 0) fmt(buf, len, "%s", "");
  else if (env && *env) fmt(buf, len, "%s", env);
  else if (xdg && *xdg) fmt(buf, len, "%s/moec/kernels", xdg);
  else if (home && *home) fmt(buf, len, "%s/.cache/moec/kernels", home);
  else fmt(buf, len, "%s", "");
}

/* mkdir -p; 0 when the directory exists afterwards. */
static int mkdirs(const char *dir) {
  char p[1024];
  fmt(p, sizeof p, "%s", dir);
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = '\0';
      if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
      *s = '/';
    }
  return mkdir(p, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

static char *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
      free(buf);
      buf = NULL;
    } else {
      buf[n] = '\0';
      *size = (size_t)n;
    }
  }
  fclose(f);
  return buf;
}

/* Writes via a temporary name and rename(), so that readers see all or nothing. The name is
 * unique per process and call: ranks as threads of one process may write the same entry. */
static int write_file(const char *path, const void *data, size_t n) {
  static _Atomic unsigned seq;
  char tmp[1100];
  fmt(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), seq++);
  FILE *f = fopen(tmp, "wb");
  if (!f) return -1;
  int ok = fwrite(data, 1, n, f) == n;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) {
    unlink(tmp);
    return -1;
  }
  return 0;
}

static void dump(const gpu_nvrtc_opts *o, const char *name, const char *src, const char *const *opts, int n_opts,
                 const char *log, const char *note) {
  if (!o->dump_dir || !*o->dump_dir || mkdirs(o->dump_dir) != 0) return;
  char path[1024];
  fmt(path, sizeof path, "%s/%s.cu", o->dump_dir, name);
  write_file(path, src, strlen(src));
  fmt(path, sizeof path, "%s/%s.log", o->dump_dir, name);
  FILE *f = fopen(path, "w");
  if (!f) return;
  fprintf(f, "// NVRTC %d.%d (%s), module %s\n// options:", nv.major, nv.minor, nv.path, name);
  for (int i = 0; i < n_opts; i++) fprintf(f, " %s", opts[i]);
  fprintf(f, "\n// %s\n%s", note, log && *log ? log : "(empty log: no warnings)\n");
  fclose(f);
}

int gpu_nvrtc_compile(const char *name, const char *src, const gpu_nvrtc_opts *o, gpu_nvrtc_out *out, char *err,
                      size_t errlen) {
  memset(out, 0, sizeof *out);
  if (gpu_nvrtc_load(err, errlen)) return -1;
  if (!o->arch || !*o->arch) {
    fmt(err, errlen, "no target architecture for %s", name);
    return -1;
  }
  const char *opts[48];
  int n = 0;
  char arch_opt[64];
  fmt(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", o->arch);
  opts[n++] = arch_opt;
  for (int i = 0; gpu_nvrtc_base_options[i]; i++) opts[n++] = gpu_nvrtc_base_options[i];
  if (o->strict) {
    opts[n++] = "-Xptxas=--warn-on-spills";
    opts[n++] = "-Xptxas=--warn-on-local-memory-usage";
  }
  for (int i = 0; i < o->n_extra && n < 48; i++) opts[n++] = o->extra[i];
  const int ptx = strncmp(o->arch, "compute_", 8) == 0;

  /* cache key */
  gpu_sha256 h;
  char ver[64];
  gpu_sha256_init(&h);
  fmt(ver, sizeof ver, "moec kernel cache v1\nnvrtc %d.%d\n", nv.major, nv.minor);
  gpu_sha256_update(&h, ver, strlen(ver));
  for (int i = 0; i < n; i++) gpu_sha256_update(&h, opts[i], strlen(opts[i]) + 1);
  gpu_sha256_update(&h, name, strlen(name) + 1);
  gpu_sha256_update(&h, src, strlen(src));
  gpu_sha256_hex(&h, out->key);

  char dir[768], path[1024];
  gpu_nvrtc_cache_dir(o, dir, sizeof dir);
  if (*dir) {
    fmt(path, sizeof path, "%s/%s.%s", dir, out->key, ptx ? "ptx" : "cubin");
    size_t size = 0;
    char *img = read_file(path, &size);
    /* a cubin is an ELF file; PTX is text */
    if (img && (ptx ? size > 0 : size > 4 && memcmp(img, "\177ELF", 4) == 0)) {
      size_t lsz = 0;
      fmt(path, sizeof path, "%s/%s.log", dir, out->key);
      char *log = read_file(path, &lsz);
      out->image = img;
      out->size = size;
      out->is_ptx = ptx;
      out->from_cache = 1;
      out->log = log ? log : calloc(1, 1);
      dump(o, name, src, opts, n, out->log, "loaded from the kernel cache");
      return 0;
    }
    free(img);
  }

  nvrtcProgram prog = NULL;
  nvrtcResult r = nv.CreateProgram(&prog, src, name, 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) {
    fmt(err, errlen, "nvrtcCreateProgram for %s failed (%s)", name, nvrtc_str(r));
    return -1;
  }
  nvrtcResult cr = nv.CompileProgram(prog, n, opts);
  size_t lsz = 0;
  char *log = NULL;
  if (nv.GetProgramLogSize(prog, &lsz) == NVRTC_SUCCESS && (log = calloc(1, lsz + 1)))
    nv.GetProgramLog(prog, log);
  if (!log) log = calloc(1, 1);
  /* NVRTC's log of a clean compile is "" or a lone NUL; normalise to "" */
  if (log && lsz <= 1) log[0] = '\0';
  dump(o, name, src, opts, n, log, cr == NVRTC_SUCCESS ? "compiled" : "FAILED");
  if (cr != NVRTC_SUCCESS) {
    fmt(err, errlen, "NVRTC could not compile %s for %s (%s):\n%s", name, o->arch, nvrtc_str(cr), log ? log : "");
    free(log);
    nv.DestroyProgram(&prog);
    return -1;
  }
  size_t size = 0;
  r = ptx ? nv.GetPTXSize(prog, &size) : nv.GetCUBINSize(prog, &size);
  char *img = r == NVRTC_SUCCESS && size > 0 ? malloc(size) : NULL;
  if (img) r = ptx ? nv.GetPTX(prog, img) : nv.GetCUBIN(prog, img);
  nv.DestroyProgram(&prog);
  if (!img || r != NVRTC_SUCCESS) {
    fmt(err, errlen, "NVRTC produced no %s for %s (%s)", ptx ? "PTX" : "cubin", name,
        r != NVRTC_SUCCESS ? nvrtc_str(r) : "empty image");
    free(img);
    free(log);
    return -1;
  }
  out->image = img;
  out->size = size;
  out->is_ptx = ptx;
  out->log = log;
  if (*dir && mkdirs(dir) == 0) { /* a cache that cannot be written is not an error */
    fmt(path, sizeof path, "%s/%s.%s", dir, out->key, ptx ? "ptx" : "cubin");
    if (write_file(path, img, size) == 0 && *log) {
      fmt(path, sizeof path, "%s/%s.log", dir, out->key);
      write_file(path, log, strlen(log));
    }
  }
  return 0;
}

void gpu_nvrtc_out_free(gpu_nvrtc_out *out) {
  free(out->image);
  free(out->log);
  memset(out, 0, sizeof *out);
}
