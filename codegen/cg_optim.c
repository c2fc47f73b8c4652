/* cg_optim.c -- fused AdamW on fp32 master weights (clipping factor read on the device; f32 or
 * bf16 gradients; f32 or bf16 moments; optionally writing the bf16 compute copy) and
 * the global gradient norm (per-tensor partial sums, one final reduction). */
#include "cg_family.h"

static const char *const src =
    "// Optimizer (ck_optim.c): AdamW on fp32 master weights and the global gradient norm.\n"
    "\n"
    "// One torch.optim.AdamW step in ck_adamw_step's operation order. The step-dependent scalars\n"
    "// are formed on the host in double exactly as there; the clipping factor on the device\n"
    "// (clip_factor: clip <= 0 or gnorm NULL, no clipping).\n"
    "// G: the gradient's storage (f32, or bf16 after fold-grad-cast; widening is exact). wb, when\n"
    "// not NULL, also gets the updated weight rounded to bf16: the compute copy the next step's\n"
    "// cast would make, written while the weight is in registers.\n"
    "// g and wb may be windows of wider rows (a stacked expert weight and its gradient): element i\n"
    "// of the weight (rows of gc columns) is g[i / gc * gl + i % gc], likewise wb with wc, wl.\n"
    "__device__ __forceinline__ i64 win_at(i64 i, i64 c, i64 l) { return c == l ? i : i / c * l + i % c; }\n"
    "// 8-element vectors stay inside a window's row\n"
    "__device__ __forceinline__ bool win_vec(i64 c, i64 l) { return c == l || (c % 8 == 0 && l % 8 == 0); }\n"
    "// M: the moments' storage (f32, or bf16 with adamw(moments = bf16): each rounded to nearest\n"
    "// after the update, which used them unrounded, as ck_round_bf16 after ck_adamw_step).\n"
    "template <class G, class M>\n"
    "__device__ void adamw(float *p, const G *g, M *m, M *v, bf16 *wb, i64 n, const float *gnorm, float clip,\n"
    "                      float decay, float w1, float b2, float c2, float neg_step, float bc2_sqrt, float eps,\n"
    "                      int small, int decay_on, i64 gc, i64 gl, i64 wc, i64 wl) {\n"
    "  const float scale = clip_factor(gnorm, clip);\n"
    "  const bool vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v) && (!wb || aligned16(wb)) &&\n"
    "                  win_vec(gc, gl) && win_vec(wc, wl);\n"
    "  ew_loop(n, vec, EW_BODY {\n"
    "    EW_N;\n"
    "    float pp[N], gg[N], mm[N], vv[N];\n"
    "    ldn<N>(p + i, pp);\n"
    "    ldn<N>(g + win_at(i, gc, gl), gg);\n"
    "    ldn<N>(m + i, mm);\n"
    "    ldn<N>(v + i, vv);\n"
    "    for (int j = 0; j < N; j++)\n"
    "      adamw_update(pp[j], mm[j], vv[j], gg[j] * scale, decay, decay_on, w1, b2, c2, neg_step, bc2_sqrt, eps, small);\n"
    "    stn<N>(p + i, pp);\n"
    "    stn<N>(m + i, mm);\n"
    "    stn<N>(v + i, vv);\n"
    "    if (wb) stn<N>(wb + win_at(i, wc, wl), pp);\n"
    "  });\n"
    "}\n"
    "\n"
    "// adamw for up to AW_TABLE parameters of one gradient storage in one launch (a step has\n"
    "// hundreds; one launch each kept the host issuing longer than the GPU ran them):\n"
    "// blockIdx.y picks the parameter, the x blocks run adamw over it; the scalars that depend on\n"
    "// the parameter (its decay) come in the table.\n"
    "struct aw_table {\n"
    "  float *p[AW_TABLE];\n"
    "  void *m[AW_TABLE], *v[AW_TABLE];\n"
    "  const void *g[AW_TABLE];\n"
    "  bf16 *wb[AW_TABLE];\n"
    "  i64 n[AW_TABLE], gc[AW_TABLE], gl[AW_TABLE], wc[AW_TABLE], wl[AW_TABLE];\n"
    "  float decay[AW_TABLE];\n"
    "  int decay_on[AW_TABLE];\n"
    "};\n"
    "template <class G, class M>\n"
    "__device__ void adamw_table(aw_table t, const float *gnorm, float clip, float w1, float b2, float c2, float neg_step,\n"
    "                            float bc2_sqrt, float eps, int small) {\n"
    "  const int y = blockIdx.y;\n"
    "  adamw<G, M>(t.p[y], (const G *)t.g[y], (M *)t.m[y], (M *)t.v[y], t.wb[y], t.n[y], gnorm, clip, t.decay[y], w1, b2, c2, neg_step,\n"
    "           bc2_sqrt, eps, small, t.decay_on[y], t.gc[y], t.gl[y], t.wc[y], t.wl[y]);\n"
    "}\n"
    "\n"
    "// part[b] = sum of squares (double) of the elements block b visits in a grid of GN_PARTS\n"
    "// blocks; each gradient tensor gets its own GN_PARTS slots.\n"
    "// x: rows of c elements, l apart (c == l: contiguous).\n"
    "template <class X> __device__ void sumsq_partial(const X *x, i64 n, i64 c, i64 l, double *part) {\n"
    "  __shared__ double sh[32];\n"
    "  double s = 0.0;\n"
    "  ew_loop(n, aligned16(x) && win_vec(c, l), EW_BODY {\n"
    "    EW_N;\n"
    "    float v[N];\n"
    "    ldn<N>(x + win_at(i, c, l), v);\n"
    "    for (int j = 0; j < N; j++) s += (double)v[j] * v[j];\n"
    "  });\n"
    "  s = block_sum(s, sh);\n"
    "  if (threadIdx.x == 0) part[blockIdx.x] = s;\n"
    "}\n"
    "\n"
    "// sumsq_partial for up to GN_TABLE tensors of one storage in one launch (a step has hundreds\n"
    "// of gradients, and one launch each left the GPU idle between them): blockIdx.y picks the\n"
    "// tensor, its parts follow the previous tensor's.\n"
    "struct gn_table {\n"
    "  const void *p[GN_TABLE];\n"
    "  i64 n[GN_TABLE], c[GN_TABLE], l[GN_TABLE];\n"
    "};\n"
    "template <class X> __device__ void sumsq_table(gn_table t, double *part) {\n"
    "  const int y = blockIdx.y;\n"
    "  sumsq_partial<X>((const X *)t.p[y], t.n[y], t.c[y], t.l[y], part + (i64)y * gridDim.x);\n"
    "}\n"
    "\n"
    "// norm = sqrt(sum of all parts), rounded to float. One block.\n"
    "__device__ void grad_norm_final(const double *part, i64 nparts, float *norm) {\n"
    "  __shared__ double sh[32];\n"
    "  double s = 0.0;\n"
    "  for (i64 i = threadIdx.x; i < nparts; i += blockDim.x) s += part[i];\n"
    "  s = block_sum(s, sh);\n"
    "  if (threadIdx.x == 0) *norm = (float)sqrt(s);\n"
    "}\n"
    ;

void cg_emit_optim(cg_buf *b, const cg_variant *v, int emu) {
  (void)v;
  cg_printf(b, "#define GN_TABLE %d\n#define AW_TABLE %d\n", CG_GN_TABLE, CG_AW_TABLE);
  cg_puts(b, src);
  const char *kv[9];
  /* one AdamW per gradient storage (f32, and bf16 after fold-grad-cast) and moment storage; one
     sum of squares per gradient storage */
  for (int x = 0; x < CG_DT_COUNT; x++) {
    for (int mt = 0; mt < CG_DT_COUNT; mt++) { /* the moments' storage */
      cg_dtype_kv(kv, (cg_dtype)x, (cg_dtype)mt);
      cg_entry(b, CG_NT_EW, "moec_adamw_${x}_${w}",
               "float *p, const ${X} *g, ${W} *m, ${W} *v, bf16 *wb, i64 n, const float *gnorm, float clip, float decay, "
               "float w1, float b2, float c2, float neg_step, float bc2_sqrt, float eps, int small, int decay_on, i64 gc, "
               "i64 gl, i64 wc, i64 wl",
               "adamw<${X}, ${W}>", kv, emu);
      cg_entry(b, CG_NT_EW, "moec_adamw_table_${x}_${w}",
               "aw_table t, const float *gnorm, float clip, float w1, float b2, float c2, float neg_step, float bc2_sqrt, "
               "float eps, int small",
               "adamw_table<${X}, ${W}>", kv, emu);
    }
    cg_dtype_kv(kv, (cg_dtype)x, (cg_dtype)x);
    cg_entry(b, CG_NT_RED, "moec_sumsq_partial_${x}", "const ${X} *x, i64 n, i64 c, i64 l, double *part", "sumsq_partial<${X}>", kv, emu);
    cg_entry(b, CG_NT_RED, "moec_sumsq_table_${x}", "gn_table t, double *part", "sumsq_table<${X}>", kv, emu);
  }
  cg_dtype_kv(kv, CG_DT_F32, CG_DT_F32);
  cg_entry(b, CG_NT_RED, "moec_grad_norm_final", "const double *part, i64 nparts, float *norm", "grad_norm_final", kv,
           emu);
}
