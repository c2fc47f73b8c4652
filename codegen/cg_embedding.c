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
    "// one table row and NT_ROW columns. It scans the tokens a window of EB_WIN at a time, first\n"
    "// listing the window's hits in order in shared memory (a ballot a warp, the warps' counts\n"
    "// summed before it), then walks the list 32 hits at a time, every load of a batch issued\n"
    "// before the first add. DNA uses a handful of the vocabulary, so a row can hold a quarter of\n"
    "// the tokens: scanning with the loads 32 tokens at a time left ~8 hits a batch, and one\n"
    "// launch took 0.87 ms of genos_1b's step on an H200.\n"
    "constexpr int EB_WIN = NT_ROW * 8;\n"
    "template <class T> __device__ void embedding_bwd(const int *tok, const T *dout, float *dtable, i64 nt, i64 V, i64 H, int *err) {\n"
    "  __shared__ int hits[EB_WIN];\n"
    "  __shared__ int wcount[NT_ROW / 32];\n"
    "  const i64 v = blockIdx.y, c = (i64)blockIdx.x * NT_ROW + threadIdx.x;\n"
    "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
    "  float acc = c < H ? dtable[v * H + c] : 0.0f;\n"
    "  for (i64 w0 = 0; w0 < nt; w0 += EB_WIN) {\n"
    "    int nh = 0; // hits listed so far in this window (the same in every thread)\n"
    "    for (i64 t0 = w0; t0 < w0 + EB_WIN && t0 < nt; t0 += NT_ROW) {\n"
    "      const i64 t = t0 + threadIdx.x;\n"
    "      const int id = t < nt ? tok[t] : -1;\n"
    "      if (t < nt && (id < 0 || id >= V) && v == 0 && blockIdx.x == 0) raise_err(err, CK_EINDEX);\n"
    "      const unsigned hit = __ballot_sync(0xffffffffu, id == v);\n"
    "      if (lane == 0) wcount[warp] = __popc(hit);\n"
    "      __syncthreads();\n"
    "      int before = 0, total = 0;\n"
    "      for (int q = 0; q < NT_ROW / 32; q++) before += q < warp ? wcount[q] : 0, total += wcount[q];\n"
    "      if (id == v) hits[nh + before + __popc(hit & ((1u << lane) - 1u))] = (int)(t - w0);\n"
    "      nh += total;\n"
    "      __syncthreads(); // wcount is rewritten next round; hits is read below\n"
    "    }\n"
    "    if (c < H) {\n"
    "      for (int j0 = 0; j0 < nh; j0 += 32) {\n"
    "        float val[32];\n"
    "#pragma unroll\n"
    "        for (int q = 0; q < 32; q++) val[q] = j0 + q < nh ? ld(dout + (w0 + hits[j0 + q]) * H + c) : 0.0f;\n"
    "#pragma unroll\n"
    "        for (int q = 0; q < 32; q++)\n"
    "          if (j0 + q < nh) acc += val[q];\n"
    "      }\n"
    "    }\n"
    "    __syncthreads(); // the next window rewrites hits\n"
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
