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
    "// backward (rotation by minus the angle). y may alias x: each thread owns its pair. x's rows\n"
    "// are ldx apart (a column window of a wider value: attention_bwd's dq or dk, read in place).\n"
    "// The bulk takes 8 pairs a thread (16-byte loads and stores, 32-bit index division where the\n"
    "// sizes fit: a 64-bit one costs ~10x, and there are three a pair); same arithmetic per pair.\n"
    "template <class T>\n"
    "__device__ void rope(const T *x, i64 ldx, T *y, const float *cs, i64 nt, i64 nh, i64 hd, i64 seq, float sign) {\n"
    "  const i64 half = hd / 2, n = nt * nh * half, row = nh * hd;\n"
    "  if (half % 8 == 0 && aligned16(x) && aligned16(y) && aligned16(cs) && ldx * (i64)sizeof(T) % 16 == 0) {\n"
    "    const bool narrow = n <= 0xffffffffll && seq <= 0xffffffffll;\n"
    "    GRID_LOOP(q, n / 8) {\n"
    "      const i64 j = q * 8;\n"
    "      i64 th, i, tok, pos;\n"
    "      if (narrow) {\n"
    "        const u32 t32 = (u32)j / (u32)half;\n"
    "        th = t32, i = (i64)((u32)j - t32 * (u32)half), tok = t32 / (u32)nh, pos = (u32)tok % (u32)seq;\n"
    "      } else {\n"
    "        th = j / half, i = j % half, tok = th / nh, pos = tok % seq;\n"
    "      }\n"
    "      const u32x4 *c4 = (const u32x4 *)(cs + (pos * half + i) * 2); // 8 (cos, sin) pairs\n"
    "      const i64 b = th * hd, bx = b + tok * (ldx - row);\n"
    "      float x1[8], x2[8], y1[8], y2[8], c[16];\n"
    "      ld8(x + bx + i, x1);\n"
    "      ld8(x + bx + i + half, x2);\n"
    "#pragma unroll\n"
    "      for (int k = 0; k < 4; k++) {\n"
    "        const u32x4 v = c4[k];\n"
    "#pragma unroll\n"
    "        for (int w = 0; w < 4; w++) c[4 * k + w] = __uint_as_float(v.w[w]);\n"
    "      }\n"
    "#pragma unroll\n"
    "      for (int k = 0; k < 8; k++) {\n"
    "        const float co = c[2 * k], si = sign * c[2 * k + 1];\n"
    "        y1[k] = x1[k] * co - x2[k] * si;\n"
    "        y2[k] = x2[k] * co + x1[k] * si;\n"
    "      }\n"
    "      st8(y + b + i, y1);\n"
    "      st8(y + b + i + half, y2);\n"
    "    }\n"
    "    return;\n"
    "  }\n"
    "  GRID_LOOP(j, n) {\n"
    "    const i64 i = j % half, th = j / half, t = th / nh;\n"
    "    const float *c = cs + ((t % seq) * half + i) * 2;\n"
    "    const float co = c[0], si = sign * c[1];\n"
    "    const i64 b = th * hd, bx = b + t * (ldx - row);\n"
    "    const float x1 = ld(x + bx + i), x2 = ld(x + bx + i + half);\n"
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
             "const ${X} *x, i64 ldx, ${X} *y, const float *cs, i64 nt, i64 nh, i64 hd, i64 seq, float sign", "rope<${X}>", kv,
             emu);
  }
}
