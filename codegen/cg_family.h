/* cg_family.h -- internal to codegen/: what each family generator (cg_<family>.c) is given
 * and the helpers they share (cg_kernels.c). */
#ifndef MOEC_CG_FAMILY_H
#define MOEC_CG_FAMILY_H

#include "cg_buf.h"
#include "cg_kernels.h"

/* Appends the family's device code and kernels after the prelude. */
typedef void (*cg_family_fn)(cg_buf *b, const cg_variant *v, int emu);
void cg_emit_elementwise(cg_buf *b, const cg_variant *v, int emu);
void cg_emit_embedding(cg_buf *b, const cg_variant *v, int emu);
void cg_emit_rmsnorm(cg_buf *b, const cg_variant *v, int emu);
void cg_emit_rope(cg_buf *b, const cg_variant *v, int emu);
void cg_emit_router(cg_buf *b, const cg_variant *v, int emu);
void cg_emit_route(cg_buf *b, const cg_variant *v, int emu);
void cg_emit_loss(cg_buf *b, const cg_variant *v, int emu);
void cg_emit_optim(cg_buf *b, const cg_variant *v, int emu);
void cg_emit_mxfp8(cg_buf *b, const cg_variant *v, int emu);
void cg_emit_mxfp8_tiles(cg_buf *b, int emu); /* part of the mxfp8 module (cg_mxfp8_tiles.c) */
void cg_emit_grouped(cg_buf *b, const cg_variant *v, int emu);
void cg_emit_narrow(cg_buf *b, const cg_variant *v, int emu);

/* The MXFP8 codec's device functions (E8M0 codes from a group maximum's bits, E4M3 packing),
 * emitted by the mxfp8 module and by the grouped module, whose split backward quantizes its
 * own output (cg_mxfp8.c). */
extern const char *const cg_mx_codec;

/* Emits one kernel:
 *     extern "C" __global__ void __launch_bounds__(threads) NAME(PARAMS) { IMPL(ARGS); }
 * where NAME, PARAMS and IMPL are templates filled from kv (see cg_subst), and ARGS are the
 * parameter names in order. PARAMS is a C parameter list ("const ${X} *x, i64 n"). With emu,
 * also a host trampoline emu_NAME(void **a) that unpacks a[] as cuLaunchKernel's args. */
void cg_entry(cg_buf *b, int threads, const char *name, const char *params, const char *impl,
              const char *const *kv, int emu);
/* The same with __launch_bounds__(threads, min_blocks): the registers capped so that min_blocks
 * blocks fit an SM (min_blocks 0: no cap). */
void cg_entry_occ(cg_buf *b, int threads, int min_blocks, const char *name, const char *params, const char *impl,
                  const char *const *kv, int emu);

/* Fills kv (at least 9 slots) with X/x and W/w = the C type and name of dtypes x and w:
 * "X" "bf16" "x" "bf16" "W" "float" "w" "f32" NULL. */
void cg_dtype_kv(const char **kv, cg_dtype x, cg_dtype w);

#endif
