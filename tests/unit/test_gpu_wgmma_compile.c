/* test_gpu_wgmma_compile.c -- the FP8 grouped GEMM module (runtime/gpu_wgmma.c) compiles with
 * NVRTC for sm_90a (no GPU needed) with an empty log, ptxas asked to warn about spills and
 * local memory (spills fail past SPILL_LIMIT bytes a kernel); its PTX (compute_90a) holds
 * every variant's entry point and the wgmma, cp.async, TMA, mbarrier and proxy-fence
 * instructions the kernels are written with. Skips, and passes, where NVRTC is not installed. MOEC_DUMP_DIR=DIR writes
 * the source and the logs there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gpu_nvrtc.h"
#include "runtime/gpu_wgmma.h"

#include "nvrtc_check.h"

static void check_ptx(const char *ptx) {
  static const char *const want[] = {
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3", "wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
      "wgmma.wait_group.sync.aligned", "cp.async.cg.shared.global", "fence.proxy.async.shared::cta",
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes", "mbarrier.try_wait.parity",
      ".multicast::cluster", "mapa.shared::cluster", "barrier.cluster.arrive", ".explicitcluster",
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (!strstr(ptx, want[i])) FAIL("the PTX has no %s", want[i]);
  char name[64];
  int expect = 0, entries = 0;
#define ENTRY(t, w, s)                                                                             \
  if (t == 4) snprintf(name, sizeof name, ".entry wg_fp8_wides_s%d(", s);                           \
  else if (t == 3) snprintf(name, sizeof name, ".entry wg_fp8_wide_s%d(", s);                       \
  else if (t == 2) snprintf(name, sizeof name, ".entry wg_fp8_mc_s%d(", s);                         \
  else if (t) snprintf(name, sizeof name, ".entry wg_fp8_tma_s%d(", s);                             \
  else snprintf(name, sizeof name, ".entry wg_fp8_w%d_s%d(", w, s);                                 \
  expect++;                                                                                        \
  if (!strstr(ptx, name)) FAIL("no entry point %s", name + 7);
  GPU_WGMMA_VARIANTS(ENTRY)
  for (const char *p = ptx; (p = strstr(p, ".entry ")); p++) entries++;
  if (entries != expect) FAIL("%d entry points, expected %d", entries, expect);
}

int main(void) {
  const char *src = gpu_wgmma_source();
  if (!src) {
    printf("FAIL: no source\n");
    return 1;
  }
  if (strstr(src, "#include")) FAIL("the source includes a header");
  char err[8192];
  if (gpu_nvrtc_load(err, sizeof err) != 0) {
    printf("SKIP: libnvrtc not found (%s)\n", err);
    printf("test_gpu_wgmma_compile: source checks %s; NVRTC part skipped\n", failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
  }
  if (!gpu_nvrtc_supports(90)) {
    printf("SKIP: this NVRTC cannot target sm_90a\n");
    return failures ? 1 : 0;
  }
  const char *dump = getenv("MOEC_DUMP_DIR");
  static const char *const archs[] = {"sm_90a", "compute_90a"};
  for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
    char dir[1024];
    if (dump) snprintf(dir, sizeof dir, "%s/%s", dump, archs[a]);
    gpu_nvrtc_opts o = {.arch = archs[a], .dump_dir = dump ? dir : NULL, .cache_dir = "", .strict = 1};
    gpu_nvrtc_out out;
    if (gpu_nvrtc_compile("wgmma_fp8", src, &o, &out, err, sizeof err) != 0) {
      FAIL("%s:\n%s", archs[a], err);
      continue;
    }
    check_nvrtc_log("wgmma_fp8", archs[a], out.log);
    printf("  wgmma_fp8 %-12s %8zu bytes of %s\n", archs[a], out.size, out.is_ptx ? "PTX" : "cubin");
    if (out.is_ptx) check_ptx((const char *)out.image);
    gpu_nvrtc_out_free(&out);
  }
  printf("test_gpu_wgmma_compile: %d failures\n", failures);
  return failures ? 1 : 0;
}
