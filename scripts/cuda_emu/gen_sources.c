/* gen_sources.c -- writes every generated kernel module, built for the emulator (emu = 1),
 * as DIR/<module>.cu, and the attention module (runtime/gpu_attention.c's own NVRTC source)
 * as DIR/attention.cu with a trampoline per kernel. Linked against libmoec_core.a by run.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cg_kernels.h"
#include "gpu_attention.h"

/* The attention source declares its kernels in a macro, `__global__ void NAME_##N(...)`,
 * instantiated by `INST(T, N)` lines: one trampoline per NAME and N. */
static int write_attention(const char *dir) {
  const char *src = gpu_attention_source();
  char path[1024];
  snprintf(path, sizeof path, "%s/attention.cu", dir);
  FILE *out = fopen(path, "w");
  if (!out) return -1;
  fprintf(out, "// runtime/gpu_attention.c's kernels, for the CPU emulator (scripts/cuda_emu/gen_sources.c)\n"
               "#include \"emu_cuda.h\"\n#undef INFINITY\n%s\n",
          src);
  int n = 0;
  for (const char *k = strstr(src, "__global__ void "); k; k = strstr(k + 1, "__global__ void ")) {
    const char *name = k + strlen("__global__ void "), *e = strstr(name, "##N(");
    if (!e) continue;
    for (const char *i = strstr(src, "\nINST("); i; i = strstr(i + 1, "\nINST(")) {
      const char *c = strchr(i, ','), *r = c ? strchr(c, ')') : NULL;
      if (!r) continue;
      while (*++c == ' ') {}
      fprintf(out, "extern \"C\" void emu_%.*s%.*s(void **a) { emu_call(%.*s%.*s, a); }\n", (int)(e - name), name,
              (int)(r - c), c, (int)(e - name), name, (int)(r - c), c);
      n++;
    }
  }
  return fclose(out) != 0 || n == 0 ? -1 : 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gen_sources DIR\n");
    return 2;
  }
  for (int f = 0; f < CG_FAM_COUNT; f++) {
    cg_variant vs[8];
    int nv = cg_family_variants((cg_family)f, vs, 8);
    for (int i = 0; i < nv; i++) {
      char mod[64], path[1024];
      cg_module_name((cg_family)f, &vs[i], mod, sizeof mod);
      snprintf(path, sizeof path, "%s/%s.cu", argv[1], mod);
      char *src = cg_emit((cg_family)f, &vs[i], 1);
      FILE *out = fopen(path, "w");
      if (!src || !out || fputs(src, out) < 0 || fclose(out) != 0) {
        fprintf(stderr, "gen_sources: cannot write %s\n", path);
        return 1;
      }
      free(src);
      printf("%s\n", mod);
    }
  }
  if (write_attention(argv[1]) != 0) {
    fprintf(stderr, "gen_sources: cannot write %s/attention.cu (or found no kernel in it)\n", argv[1]);
    return 1;
  }
  printf("attention\n");
  return 0;
}
