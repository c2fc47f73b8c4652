/* gen_sources.c -- writes every generated kernel module, built for the emulator (emu = 1),
 * as DIR/<module>.cu. Linked against libmoec_core.a by run.sh. */
#include <stdio.h>
#include <stdlib.h>

#include "codegen/cg_kernels.h"

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
  return 0;
}
