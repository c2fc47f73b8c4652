/* test_gpu_flash_emu.c -- the flash-attention kernels (runtime/gpu_flash.c) run on the CPU:
 * their body, as gpu_flash_body() gives it, is compiled by the host C++ compiler behind
 * tests/emu/fa_emu.h (a software warp: ldmatrix, mma.sync, shfl, cp.async, __syncthreads)
 * and tests/emu/fa_emu_main.cpp compares forward and backward with a naive double-precision
 * attention, every kernel variant, causal and not, grouped KV heads, ragged tails. It runs
 * twice: cp.async landing at once, and only at its wait_group. No GPU needed; skips, and
 * passes, where there is no C++ compiler (set CXX to choose one). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/gpu_flash.h"

static int run(const char *cmd) {
  printf("$ %s\n", cmd);
  fflush(stdout);
  int rc = system(cmd);
  return rc == -1 ? -1 : WEXITSTATUS(rc);
}

int main(void) {
  const char *cxx = getenv("CXX");
  if (!cxx || !*cxx) cxx = "c++";
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "%s --version >/dev/null 2>&1", cxx);
  if (system(cmd) != 0) {
    printf("SKIP: no C++ compiler (%s)\n", cxx);
    return 0;
  }
  char dir[] = "/tmp/moec_fa_emu_XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  const char *body = gpu_flash_body();
  if (!body) {
    printf("FAIL: no kernel body\n");
    return 1;
  }
  char path[1200];
  snprintf(path, sizeof path, "%s/fa_body.cuh", dir);
  FILE *f = fopen(path, "w");
  if (!f || fputs(body, f) < 0 || fclose(f) != 0) {
    perror(path);
    return 1;
  }
  int failures = 0;
  snprintf(cmd, sizeof cmd, "%s -std=c++17 -O2 -w -I tests/emu -I %s -I . tests/emu/fa_emu_main.cpp -o %s/fa_emu", cxx, dir,
           dir);
  if (run(cmd) != 0) {
    printf("FAIL: the emulator did not build\n");
    failures++;
  } else {
    snprintf(cmd, sizeof cmd, "%s/fa_emu 0 1", dir);
    if (run(cmd) != 0) failures++;
    snprintf(cmd, sizeof cmd, "%s/fa_emu 1 2", dir);
    if (run(cmd) != 0) failures++;
  }
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
  printf("test_gpu_flash_emu: %s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
