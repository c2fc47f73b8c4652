/* test_gpu_loader.c -- the GPU runtime's host side, everywhere (no GPU, no CUDA needed): the
 * messages for a missing driver, NVRTC or cuBLASLt, the out-of-memory message, byte
 * formatting, the kernel cache directory, architecture choice, and the code generators'
 * string helpers. Loaders keep their first result per process, so each missing-library case
 * runs in a child process. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codegen/cg_buf.h"
#include "codegen/cg_kernels.h"
#include "runtime/gpu_blas.h"
#include "runtime/gpu_kernels.h"
#include "runtime/gpu_loader.h"
#include "runtime/gpu_nvrtc.h"

const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libnvrtc\nleak:libcublasLt\n"; }

static int failures, checks;
#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    checks++;                                                                                      \
    if (!(cond)) {                                                                                 \
      failures++;                                                                                  \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                  \
      printf(__VA_ARGS__);                                                                         \
      printf("\n");                                                                                \
    }                                                                                              \
  } while (0)

/* Runs fn in a child; its exit status is its number of failures. */
static void in_child(const char *what, int (*fn)(void)) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) exit(fn());
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s (child status %d)", what, st);
}

static int child_bad_libcuda(void) {
  setenv("MOEC_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  char err[1024], info[128];
  int bad = gpu_driver_load(err, sizeof err) == 0;
  const char *want = "MOEC_LIBCUDA=/nonexistent/libcuda.so.1 cannot be loaded (";
  bad |= strncmp(err, want, strlen(want)) != 0;
  bad |= strstr(err, "; use --device cpu") == NULL;
  printf("  driver from MOEC_LIBCUDA missing: %s\n", err);
  bad |= rt_cuda_probe(info, sizeof info, err, sizeof err) == 0 || strstr(err, "MOEC_LIBCUDA=") != err;
  bad |= gpu_open(0, err, sizeof err) != NULL;
  return bad;
}

static int child_default_libcuda(void) {
  unsetenv("MOEC_LIBCUDA");
  char err[1024];
  if (gpu_driver_load(err, sizeof err) == 0) {
    printf("  a CUDA driver is installed here\n");
    return 0;
  }
  printf("  no driver: %s\n", err);
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return strcmp(err, "libcuda.so.1 not found (no NVIDIA driver); use --device cpu") != 0;
  return strstr(err, "; use --device cpu") == NULL; /* a driver that fails cuInit says why */
}

static int child_bad_nvrtc(void) {
  setenv("MOEC_LIBNVRTC", "/nonexistent/libnvrtc.so.13", 1);
  char err[1024];
  int bad = gpu_nvrtc_load(err, sizeof err) == 0;
  bad |= strcmp(err, "libnvrtc not found (tried /nonexistent/libnvrtc.so.13); install the CUDA toolkit's NVRTC, "
                     "or set CUDA_HOME or MOEC_LIBNVRTC") != 0;
  printf("  NVRTC missing: %s\n", err);
  gpu_nvrtc_opts o = {.arch = "sm_90a", .cache_dir = ""};
  gpu_nvrtc_out out;
  bad |= gpu_nvrtc_compile("x", "", &o, &out, err, sizeof err) == 0;
  return bad;
}

static int child_bad_cublaslt(void) {
  setenv("MOEC_LIBCUBLASLT", "/nonexistent/libcublasLt.so.13", 1);
  char err[1024];
  int bad = gpu_blas_load(err, sizeof err) != NULL;
  const char *want = "libcublasLt not found (tried /nonexistent/libcublasLt.so.13); install cuBLAS";
  bad |= strncmp(err, want, strlen(want)) != 0;
  printf("  cuBLASLt missing: %s\n", err);
  return bad;
}

static void test_formats(void) {
  char b[64], m[512];
  CHECK(strcmp(gpu_fmt_bytes(512, b, sizeof b), "512 B") == 0, "%s", b);
  CHECK(strcmp(gpu_fmt_bytes(1536, b, sizeof b), "1.50 KiB") == 0, "%s", b);
  CHECK(strcmp(gpu_fmt_bytes((size_t)5 << 20, b, sizeof b), "5.00 MiB") == 0, "%s", b);
  CHECK(strcmp(gpu_fmt_bytes((size_t)3 << 30, b, sizeof b), "3.00 GiB") == 0, "%s", b);
  gpu_oom_message(m, sizeof m, "activations", (size_t)12 << 30, (size_t)41 << 28, (size_t)140 << 30, "NVIDIA H200");
  CHECK(strcmp(m, "out of GPU memory allocating activations: asked 12.00 GiB, 10.25 GiB free of 140.00 GiB on "
                  "NVIDIA H200; use a smaller seq or batch (--set seq=N, --set batch=N), or precision = mxfp8") == 0,
        "oom message: %s", m);
  printf("  %s\n", m);
}

static void test_cache_dir(void) {
  char d[512];
  gpu_nvrtc_opts o = {0};
  setenv("MOEC_CACHE", "off", 1);
  gpu_nvrtc_cache_dir(&o, d, sizeof d);
  CHECK(d[0] == '\0', "MOEC_CACHE=off: '%s'", d);
  setenv("MOEC_CACHE", "/tmp/kc", 1);
  gpu_nvrtc_cache_dir(&o, d, sizeof d);
  CHECK(strcmp(d, "/tmp/kc") == 0, "MOEC_CACHE=/tmp/kc: '%s'", d);
  unsetenv("MOEC_CACHE");
  setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
  gpu_nvrtc_cache_dir(&o, d, sizeof d);
  CHECK(strcmp(d, "/tmp/xdg/moec/kernels") == 0, "XDG_CACHE_HOME: '%s'", d);
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/home/u", 1);
  gpu_nvrtc_cache_dir(&o, d, sizeof d);
  CHECK(strcmp(d, "/home/u/.cache/moec/kernels") == 0, "HOME: '%s'", d);
  o.cache_dir = "/opt/k";
  gpu_nvrtc_cache_dir(&o, d, sizeof d);
  CHECK(strcmp(d, "/opt/k") == 0, "opts: '%s'", d);
}

static void test_codegen_helpers(void) {
  cg_buf b;
  cg_buf_init(&b);
  const char *kv[] = {"X", "bf16", "n", "7", NULL};
  cg_subst(&b, "a ${X} b ${n}${n} ${unknown} $ {X} ${X", kv);
  char *s = cg_buf_take(&b);
  CHECK(s && strcmp(s, "a bf16 b 77 ${unknown} $ {X} ${X") == 0, "cg_subst: '%s'", s ? s : "(null)");
  free(s);
  char name[64];
  CHECK(strcmp(cg_kname(name, sizeof name, "rmsnorm_fwd", 2, CG_DT_BF16, CG_DT_F32), "moec_rmsnorm_fwd_bf16_f32") == 0,
        "cg_kname: %s", name);
  cg_variant v = {32, 1};
  cg_module_name(CG_FAM_MXFP8, &v, name, sizeof name);
  CHECK(strcmp(name, "mxfp8_b32_s128") == 0, "module name %s", name);
}

int main(void) {
  printf("GPU runtime host side:\n");
  test_formats();
  test_cache_dir();
  test_codegen_helpers();
  in_child("a missing MOEC_LIBCUDA is reported as such", child_bad_libcuda);
  in_child("without a driver, the message names libcuda.so.1", child_default_libcuda);
  in_child("a missing NVRTC is reported with what was tried", child_bad_nvrtc);
  in_child("a missing cuBLASLt is reported with what was tried", child_bad_cublaslt);
  char err[1024];
  if (gpu_nvrtc_load(err, sizeof err) == 0) {
    char a[32];
    gpu_nvrtc_pick_arch(9, 0, a, sizeof a);
    CHECK(strcmp(a, "sm_90a") == 0, "Hopper arch: %s", a);
    gpu_nvrtc_pick_arch(8, 0, a, sizeof a);
    CHECK(strcmp(a, "sm_80") == 0, "Ampere arch: %s", a);
    gpu_nvrtc_pick_arch(99, 9, a, sizeof a);
    CHECK(strncmp(a, "compute_", 8) == 0, "a future GPU gets PTX: %s", a);
    printf("  NVRTC: sm_90 -> sm_90a, a future sm_999 -> %s (PTX the driver compiles)\n", a);
  } else {
    printf("  (no NVRTC here: architecture choice not checked)\n");
  }
  const gpu_blas_api *blas = gpu_blas_load(err, sizeof err);
  if (blas) printf("  cuBLASLt %zu loads\n", blas->GetVersion());
  else printf("  (no cuBLASLt here: %s)\n", err);
  printf("test_gpu_loader: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
