/* test_gpu_flash_compile.c -- the flash-attention module (runtime/gpu_flash.c) compiles with
 * NVRTC for sm_80, sm_90 and sm_90a (no GPU needed) with an empty log, ptxas asked to warn
 * about spills and local memory: spills are printed as notes and fail past SPILL_LIMIT bytes
 * a kernel. Its PTX holds every entry point gpu_flash.c looks up and the tensor-core, ldmatrix
 * and cp.async instructions the kernels are written with. Skips, and passes, where NVRTC is
 * not installed. MOEC_DUMP_DIR=DIR writes the source and the logs there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gpu_flash.h"
#include "runtime/gpu_nvrtc.h"

#include "nvrtc_check.h"

#define COUNT_FWD(hd, w, bn, mb) +1
#define COUNT_BWD(hd, w, bq, mb) +1

static void check_ptx(const char *ptx) {
  static const char *const want[] = {
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",     "cp.async.cg.shared.global",
      "cp.async.wait_group",                                "red.relaxed.gpu.global.add.v2.f32",
      "ex2.approx.ftz.f32",
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (!strstr(ptx, want[i])) FAIL("the PTX has no %s", want[i]);
  char name[96];
#define ENTRY_FWD(hd, w, bn, mb)                                                                   \
  snprintf(name, sizeof name, ".entry fa_fwd_d%d_w%d_n%d_m%d(", hd, w, bn, mb);                     \
  if (!strstr(ptx, name)) FAIL("no entry point %s", name + 7);
#define ENTRY_BWD(hd, w, bq, mb)                                                                   \
  snprintf(name, sizeof name, ".entry fa_bwd_d%d_w%d_q%d_m%d(", hd, w, bq, mb);                    \
  if (!strstr(ptx, name)) FAIL("no entry point %s", name + 7);
  GPU_FLASH_FWD_VARIANTS(ENTRY_FWD)
  GPU_FLASH_BWD_VARIANTS(ENTRY_BWD)
  static const char *const fixed[] = {".entry fa_bwd_pre_d64(", ".entry fa_bwd_pre_d128(", ".entry fa_dq_out("};
  for (size_t i = 0; i < 3; i++)
    if (!strstr(ptx, fixed[i])) FAIL("no entry point %s", fixed[i] + 7);
  int entries = 0;
  for (const char *p = ptx; (p = strstr(p, ".entry ")); p++) entries++;
  const int expect = 3 GPU_FLASH_FWD_VARIANTS(COUNT_FWD) GPU_FLASH_BWD_VARIANTS(COUNT_BWD);
  if (entries != expect) FAIL("%d entry points, expected %d", entries, expect);
}

int main(void) {
  const char *src = gpu_flash_source(), *body = gpu_flash_body();
  if (!src || !body) {
    printf("FAIL: no source\n");
    return 1;
  }
  if (strstr(src, "#include")) FAIL("the source includes a header");
  if (!strstr(src, body)) FAIL("the source does not end with the body");
  if (strstr(body, "asm")) FAIL("the body has inline assembly (it belongs in the prelude, which tests/emu replaces)");
  char err[8192];
  if (gpu_nvrtc_load(err, sizeof err) != 0) {
    printf("SKIP: libnvrtc not found (%s)\n", err);
    printf("test_gpu_flash_compile: source checks %s; NVRTC part skipped\n", failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
  }
  const char *dump = getenv("MOEC_DUMP_DIR");
  static const char *const archs[] = {"sm_80", "sm_90", "sm_90a", "compute_90"};
  for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
    char dir[1024];
    if (dump) snprintf(dir, sizeof dir, "%s/%s", dump, archs[a]);
    gpu_nvrtc_opts o = {.arch = archs[a], .dump_dir = dump ? dir : NULL, .cache_dir = "", .strict = 1};
    gpu_nvrtc_out out;
    if (gpu_nvrtc_compile("flash_attention", src, &o, &out, err, sizeof err) != 0) {
      FAIL("%s:\n%s", archs[a], err);
      continue;
    }
    check_nvrtc_log("flash", archs[a], out.log);
    printf("  flash_attention %-10s %8zu bytes of %s\n", archs[a], out.size, out.is_ptx ? "PTX" : "cubin");
    if (out.is_ptx) check_ptx((const char *)out.image);
    gpu_nvrtc_out_free(&out);
  }
  printf("test_gpu_flash_compile: %d failures\n", failures);
  return failures ? 1 : 0;
}
