/* cg_embedding.c -- token embedding forward (gather) and backward (deterministic per-row
 * scatter-add into the fp32 table gradient), for f32 and bf16 activations. */
#include "cg_family.h"

static const char *const src =
    "// Token embedding (ck_embedding_fwd / _bwd). A token outside [0, V) raises CK_EINDEX; its\n"
    "// row is skipped rather than read out of bounds (the CPU writes nothing at all then).\n"
    "\n"
    "// out[t] = table[tokens[t]]; one block per token.\n"
    "template <class T> __device__ void embedding_fwd(const T *table, const int *tok, T *out, i64 nt, i64 V, i64 H, int *err) {\n"
    "  const i64 t = blockIdx.x;\n"
    "  if (t >= nt) return;\n"
    "  const int v = tok[t];\n"
    "  if (v < 0 || v >= V) {\n"
    "    if (threadIdx.x == 0) raise_err(err, CK_EINDEX);\n"
    "    return;\n"
    "  }\n"
    "  for (i64 i = threadIdx.x; i < H; i += blockDim.x) out[t * H + i] = table[(i64)v * H + i];\n"
    "}\n"
    "\n"
    "// dtable[v] += dout[t] for every t with tokens[t] = v, added in token order as on the CPU\n"
    "// (so f32 results are bit-identical), with no atomics. Grid (ceil(H/NT_ROW), V): a block owns\n"
    "// one table row and NT_ROW columns and scans all tokens through shared memory.\n"
    "template <class T> __device__ void embedding_bwd(const int *tok, const T *dout, float *dtable, i64 nt, i64 V, i64 H, int *err) {\n"
    "  __shared__ int stok[NT_ROW];\n"
    "  const i64 v = blockIdx.y, c = (i64)blockIdx.x * NT_ROW + threadIdx.x;\n"
    "  float acc = c < H ? dtable[v * H + c] : 0.0f;\n"
    "  for (i64 t0 = 0; t0 < nt; t0 += NT_ROW) {\n"
    "    __syncthreads();\n"
    "    const i64 t = t0 + threadIdx.x;\n"
    "    const int id = t < nt ? tok[t] : -1;\n"
    "    if (t < nt && (id < 0 || id >= V) && v == 0 && blockIdx.x == 0) raise_err(err, CK_EINDEX);\n"
    "    stok[threadIdx.x] = id;\n"
    "    __syncthreads();\n"
    "    // the tile's tokens equal to v, 32 at a time by ballot, in order: every hit's load issued\n"
    "    // before the first add (DNA uses a handful of the vocabulary, so a row can hold a quarter\n"
    "    // of the tokens, and one load at a time left its block waiting on each in turn)\n"
    "    for (int j0 = 0; j0 < NT_ROW; j0 += 32) {\n"
    "      const unsigned hit = __ballot_sync(0xffffffffu, stok[j0 + (threadIdx.x & 31)] == v);\n"
    "      if (!hit || c >= H) continue;\n"
    "      float val[32];\n"
    "#pragma unroll\n"
    "      for (int q = 0; q < 32; q++) val[q] = hit >> q & 1u ? ld(dout + (t0 + j0 + q) * H + c) : 0.0f;\n"
    "#pragma unroll\n"
    "      for (int q = 0; q < 32; q++)\n"
    "        if (hit >> q & 1u) acc += val[q];\n"
    "    }\n"
    "  }\n"
    "  if (c < H) dtable[v * H + c] = acc;\n"
    "}\n"
    ;

void cg_emit_embedding(cg_buf *b, const cg_variant *v, int emu) {
  (void)v;
  cg_puts(b, src);
  const char *kv[9];
  for (int x = 0; x < CG_DT_COUNT; x++) {
    cg_dtype_kv(kv, (cg_dtype)x, (cg_dtype)x);
    cg_entry(b, CG_NT_ROW, "moec_embedding_fwd_${x}",
             "const ${X} *table, const int *tokens, ${X} *out, i64 nt, i64 V, i64 H, int *err", "embedding_fwd<${X}>",
             kv, emu);
    cg_entry(b, CG_NT_ROW, "moec_embedding_bwd_${x}",
             "const int *tokens, const ${X} *dout, float *dtable, i64 nt, i64 V, i64 H, int *err",
             "embedding_bwd<${X}>", kv, emu);
  }
}
