/* test_gpu_nvrtc_compile.c -- compiles every generated kernel module, and the runtime's
 * hand-written one (attention's softmax kernels), with NVRTC for sm_90 and sm_90a (no GPU
 * needed) and fails on any error or warning: NVRTC's log must be empty, with ptxas asked to
 * warn about spills and local memory. Skips, and passes, where NVRTC is
 * not installed (CI has no CUDA toolkit).
 *
 * ptxas is also asked for its spill and local-memory diagnostics. Those are printed as notes,
 * and fail the test only past SPILL_LIMIT bytes: a few bytes are saved around calls into
 * libdevice's slow paths (IEEE division, double exp/log), which moec does not control.
 *
 * MOEC_DUMP_DIR=DIR also writes each module's source and log (DIR/ARCH/NAME.cu, .log).
 * It also checks the generators themselves: every template placeholder filled, every kernel
 * the launcher names present, the sources deterministic, and the kernel cache round trip.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen/cg_kernels.h"
#include "runtime/gpu_attention.h"
#include "runtime/gpu_kernels.h"
#include "runtime/gpu_nvrtc.h"
#include "runtime/gpu_sha256.h"

#include "nvrtc_check.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void test_sha256(void) {
  static const struct {
    const char *in, *hex;
  } v[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
  };
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    gpu_sha256 s;
    char hex[65];
    gpu_sha256_init(&s);
    gpu_sha256_update(&s, v[i].in, strlen(v[i].in));
    gpu_sha256_hex(&s, hex);
    if (strcmp(hex, v[i].hex) != 0) FAIL("sha256(\"%s\") = %s, want %s", v[i].in, hex, v[i].hex);
  }
}

/* Generator checks that need no NVRTC: placeholders filled, output deterministic, every kernel
 * the launcher uses defined in the module it looks in. */
static void test_generators(void) {
  for (int f = 0; f < CG_FAM_COUNT; f++) {
    cg_variant vs[8];
    int nv = cg_family_variants((cg_family)f, vs, 8);
    if (nv < 1) FAIL("family %s has no variant", cg_family_name((cg_family)f));
    for (int i = 0; i < nv; i++) {
      char mod[64];
      cg_module_name((cg_family)f, &vs[i], mod, sizeof mod);
      char *a = cg_emit((cg_family)f, &vs[i], 0), *b = cg_emit((cg_family)f, &vs[i], 0);
      if (!a || !b) FAIL("%s: generator returned NULL", mod);
      else {
        if (strcmp(a, b) != 0) FAIL("%s: two generations differ (the cache key would not be stable)", mod);
        if (strstr(a, "${")) FAIL("%s: unfilled template placeholder near: %.60s", mod, strstr(a, "${"));
        if (strstr(a, "\n#include")) FAIL("%s: NVRTC source includes a header (needs an include path)", mod);
      }
      free(a);
      free(b);
    }
  }
  cg_variant bad = {48, 0};
  if (cg_emit(CG_FAM_MXFP8, &bad, 0) != NULL) FAIL("mxfp8 accepted block 48 (not a power of two)");
  /* every kernel the launcher can ask for exists in its module's source */
  int n = 0;
  const rt_cuda_kernel_ref *refs = rt_cuda_kernel_refs(&n);
  for (int i = 0; i < n; i++) {
    char *s = cg_emit(refs[i].family, &refs[i].variant, 0);
    char pat[160];
    snprintf(pat, sizeof pat, " %s(", refs[i].name);
    if (!s || !strstr(s, pat)) FAIL("kernel %s, used by the launcher, is not in module %s", refs[i].name, cg_family_name(refs[i].family));
    free(s);
  }
  printf("  generators: %d kernels the launcher uses, all defined\n", n);
}

int main(void) {
  double t0 = now();
  test_sha256();
  test_generators();
  char err[2048];
  if (gpu_nvrtc_load(err, sizeof err) != 0) {
    printf("SKIP: libnvrtc not found\n  (%s)\n", err);
    printf("test_gpu_nvrtc_compile: generator checks %s; NVRTC part skipped\n", failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
  }
  int major, minor;
  gpu_nvrtc_version(&major, &minor);
  printf("NVRTC %d.%d\n", major, minor);
  const char *dump = getenv("MOEC_DUMP_DIR");
  static const char *const archs[] = {"sm_90", "sm_90a"};
  int n_modules = 0;
  for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
    if (!gpu_nvrtc_supports(90)) {
      FAIL("this NVRTC cannot target sm_90");
      break;
    }
    char dump_dir[1024];
    if (dump) snprintf(dump_dir, sizeof dump_dir, "%s/%s", dump, archs[a]);
    for (int f = 0; f < CG_FAM_COUNT; f++) {
      cg_variant vs[8];
      int nv = cg_family_variants((cg_family)f, vs, 8);
      for (int i = 0; i < nv; i++) {
        char mod[64];
        cg_module_name((cg_family)f, &vs[i], mod, sizeof mod);
        char *src = cg_emit((cg_family)f, &vs[i], 0);
        gpu_nvrtc_opts o = {.arch = archs[a], .dump_dir = dump ? dump_dir : NULL, .cache_dir = "", .strict = 1};
        gpu_nvrtc_out out;
        double t = now();
        if (!src) {
          FAIL("%s: no source", mod);
        } else if (gpu_nvrtc_compile(mod, src, &o, &out, err, sizeof err) != 0) {
          FAIL("%s for %s:\n%s", mod, archs[a], err);
        } else {
          check_nvrtc_log(mod, archs[a], out.log);
          printf("  %-16s %-7s %7zu bytes of cubin  %.2f s\n", mod, archs[a], out.size, now() - t);
          n_modules++;
          gpu_nvrtc_out_free(&out);
        }
        free(src);
      }
    }
    /* modules written by hand elsewhere in the runtime */
    struct {
      const char *name, *src;
    } extra[] = {{"attention", gpu_attention_source()}};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
      gpu_nvrtc_opts o = {.arch = archs[a], .dump_dir = dump ? dump_dir : NULL, .cache_dir = "", .strict = 1};
      gpu_nvrtc_out out;
      double t = now();
      if (gpu_nvrtc_compile(extra[i].name, extra[i].src, &o, &out, err, sizeof err) != 0) {
        FAIL("%s for %s:\n%s", extra[i].name, archs[a], err);
      } else {
        check_nvrtc_log(extra[i].name, archs[a], out.log);
        printf("  %-16s %-7s %7zu bytes of cubin  %.2f s\n", extra[i].name, archs[a], out.size, now() - t);
        n_modules++;
        gpu_nvrtc_out_free(&out);
      }
    }
  }

  /* The disk cache: a second compile of the same source is a hit with the same bytes. */
  char dir[] = "/tmp/moec_nvrtc_cache_XXXXXX";
  if (mkdtemp(dir)) {
    char *src = cg_emit(CG_FAM_ROPE, NULL, 0);
    gpu_nvrtc_opts o = {.arch = "sm_90a", .cache_dir = dir};
    gpu_nvrtc_out a, b;
    if (src && gpu_nvrtc_compile("rope", src, &o, &a, err, sizeof err) == 0) {
      if (a.from_cache) FAIL("cache: first compile claims a cache hit");
      if (gpu_nvrtc_compile("rope", src, &o, &b, err, sizeof err) != 0) FAIL("cache: second compile failed: %s", err);
      else {
        if (!b.from_cache) FAIL("cache: second compile missed the cache");
        if (b.size != a.size || memcmp(a.image, b.image, a.size) != 0) FAIL("cache: cached cubin differs");
        if (strcmp(a.key, b.key) != 0) FAIL("cache: key not stable");
        char path[1200];
        snprintf(path, sizeof path, "%s/%s.cubin", dir, a.key);
        unlink(path);
        snprintf(path, sizeof path, "%s/%s.log", dir, a.key);
        unlink(path);
        gpu_nvrtc_out_free(&b);
      }
      gpu_nvrtc_out_free(&a);
    } else {
      FAIL("cache: compile failed: %s", err);
    }
    free(src);
    rmdir(dir);
  }

  /* a compile error comes back with NVRTC's log */
  gpu_nvrtc_opts o = {.arch = "sm_90a", .cache_dir = ""};
  gpu_nvrtc_out out;
  if (gpu_nvrtc_compile("broken", "extern \"C\" __global__ void k() { undeclared_thing(); }", &o, &out, err,
                        sizeof err) == 0) {
    FAIL("a broken source compiled");
    gpu_nvrtc_out_free(&out);
  } else if (!strstr(err, "undeclared_thing")) {
    FAIL("the compile error does not quote NVRTC's log: %s", err);
  }

  printf("test_gpu_nvrtc_compile: %d modules compiled, %d failures (%.1f s)\n", n_modules, failures, now() - t0);
  return failures ? 1 : 0;
}
