/* cg_rope.c -- rotary embedding, forward or backward by the sign of the angle, from a cos/sin
 * table the host builds (runtime/gpu_kernels_ops.c). */
#include "cg_family.h"

static const char *const src =
    "// Rotary embedding (ck_rope_fwd / _bwd), Hugging Face rotate_half layout.\n"
    "\n"
    "// cs (P, hd/2, 2) holds (cos, sin) of p * theta^(-2i/hd): built on the host, exactly as the\n"
    "// CPU builds it (double, then rounded to float), once per shape; device double trig would\n"
    "// need local memory for large angles and could differ from libm in the last bit.\n"
    "// y[i] = x1 cos - x2 sin, y[i + half] = x2 cos + x1 sin at position t % seq; sign = -1 is the\n"
    "// backward (rotation by minus the angle). y may alias x: each thread owns its pair.\n"
    "template <class T> __device__ void rope(const T *x, T *y, const float *cs, i64 nt, i64 nh, i64 hd, i64 seq, float sign) {\n"
    "  const i64 half = hd / 2;\n"
    "  GRID_LOOP(j, nt * nh * half) {\n"
    "    const i64 i = j % half, th = j / half, t = th / nh;\n"
    "    const float *c = cs + ((t % seq) * half + i) * 2;\n"
    "    const float co = c[0], si = sign * c[1];\n"
    "    const i64 b = th * hd;\n"
    "    const float x1 = ld(x + b + i), x2 = ld(x + b + i + half);\n"
    "    st(y + b + i, x1 * co - x2 * si);\n"
    "    st(y + b + i + half, x2 * co + x1 * si);\n"
    "  }\n"
    "}\n"
    ;

void cg_emit_rope(cg_buf *b, const cg_variant *v, int emu) {
  (void)v;
  cg_puts(b, src);
  const char *kv[9];
  for (int x = 0; x < CG_DT_COUNT; x++) {
    cg_dtype_kv(kv, (cg_dtype)x, (cg_dtype)x);
    cg_entry(b, CG_NT_EW, "moec_rope_${x}",
             "const ${X} *x, ${X} *y, const float *cs, i64 nt, i64 nh, i64 hd, i64 seq, float sign", "rope<${X}>", kv,
             emu);
  }
}
