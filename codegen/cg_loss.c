/* cg_loss.c -- token cross-entropy: deterministic partial sums and a final mean, the valid
 * label count, and the logits gradient, for f32 or bf16 logits; the label count and the share
 * factor of data/expert parallelism. */
#include "cg_family.h"

static const char *const src =
    "// Token cross-entropy (ck_cross_entropy_fwd / _bwd): a warp per row, the max in float and\n"
    "// the exponentials and their sum in double, as ck_logsumexp_rows. Labels of -1 are masked;\n"
    "// any other label outside [0, V) raises CK_EINDEX and its row is skipped.\n"
    "\n"
    "template <class T> __device__ double warp_lse(const T *row, i64 V) {\n"
    "  const int lane = threadIdx.x & 31;\n"
    "  float mx = -f32_inf();\n"
    "  for (i64 i = lane; i < V; i += 32) mx = fmaxf(mx, ld(row + i));\n"
    "  mx = warp_max(mx);\n"
    "  double s = 0.0;\n"
    "  for (i64 i = lane; i < V; i += 32) s += exp((double)ld(row + i) - mx);\n"
    "  return mx + log(warp_sum(s));\n"
    "}\n"
    "\n"
    "// part[b] = sum over block b's rows (CE_ROWS of them) of lse - logit[label], npart[b] = the\n"
    "// rows that count. Each warp adds its rows in order, then the warps in order.\n"
    "template <class T> __device__ void ce_partial(const T *logits, const int *labels, double *part, int *npart, i64 nt, i64 V, int *err) {\n"
    "  constexpr int NW = NT_CE / 32;\n"
    "  __shared__ double shd[NW];\n"
    "  __shared__ int shn[NW];\n"
    "  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;\n"
    "  const i64 r0 = (i64)blockIdx.x * CE_ROWS, r1 = r0 + CE_ROWS < nt ? r0 + CE_ROWS : nt;\n"
    "  double acc = 0.0;\n"
    "  int cnt = 0;\n"
    "  for (i64 t = r0 + w; t < r1; t += NW) {\n"
    "    const int lab = labels[t];\n"
    "    if (lab == -1) continue;\n"
    "    if (lab < 0 || lab >= V) {\n"
    "      if (lane == 0) raise_err(err, CK_EINDEX);\n"
    "      continue;\n"
    "    }\n"
    "    const double l = warp_lse(logits + t * V, V);\n"
    "    acc += l - (double)ld(logits + t * V + lab);\n"
    "    cnt++;\n"
    "  }\n"
    "  if (lane == 0) {\n"
    "    shd[w] = acc;\n"
    "    shn[w] = cnt;\n"
    "  }\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x == 0) {\n"
    "    double s = 0.0;\n"
    "    int n = 0;\n"
    "    for (int v = 0; v < NW; v++) {\n"
    "      s += shd[v];\n"
    "      n += shn[v];\n"
    "    }\n"
    "    part[blockIdx.x] = s;\n"
    "    npart[blockIdx.x] = n;\n"
    "  }\n"
    "}\n"
    "\n"
    "// loss = mean over counted rows (0 if none); nvalid (may be NULL) = their number. One block.\n"
    "__device__ void ce_final(const double *part, const int *npart, i64 nb, float *loss, int *nvalid) {\n"
    "  if (threadIdx.x != 0) return;\n"
    "  double s = 0.0;\n"
    "  i64 n = 0;\n"
    "  for (i64 b = 0; b < nb; b++) {\n"
    "    s += part[b];\n"
    "    n += npart[b];\n"
    "  }\n"
    "  *loss = n > 0 ? (float)(s / (double)n) : 0.0f;\n"
    "  if (nvalid) *nvalid = (int)n;\n"
    "}\n"
    "\n"
    "// nvalid = number of labels in [0, V); one block.\n"
    "__device__ void ce_count(const int *labels, int *nvalid, i64 nt, i64 V, int *err) {\n"
    "  __shared__ int sh[32];\n"
    "  int c = 0;\n"
    "  for (i64 t = threadIdx.x; t < nt; t += blockDim.x) {\n"
    "    const int lab = labels[t];\n"
    "    if (lab == -1) continue;\n"
    "    if (lab < 0 || lab >= V) raise_err(err, CK_EINDEX);\n"
    "    else c++;\n"
    "  }\n"
    "  c = block_sum(c, sh);\n"
    "  if (threadIdx.x == 0) *nvalid = c;\n"
    "}\n"
    "\n"
    "// Data/expert parallelism (ck_label_count, ck_cross_entropy_share_*). n = labels >= 0\n"
    "// (not masked), as a float: the operand the ranks all-reduce into the global count. One block.\n"
    "__device__ void label_count(const int *labels, float *n, i64 nt) {\n"
    "  __shared__ int sh[32];\n"
    "  int c = 0;\n"
    "  for (i64 t = threadIdx.x; t < nt; t += blockDim.x) c += labels[t] >= 0;\n"
    "  c = block_sum(c, sh);\n"
    "  if (threadIdx.x == 0) *n = (float)c;\n"
    "}\n"
    "\n"
    "// out = in * (float)(nlocal / nglobal) (0 if nglobal <= 0): the local mean (or its incoming\n"
    "// gradient) made this rank's share of the global mean. out may be in. One thread.\n"
    "__device__ void ce_share(const float *in, const int *nlocal, const float *nglobal, float *out) {\n"
    "  if (threadIdx.x != 0 || blockIdx.x != 0) return;\n"
    "  const float ng = *nglobal;\n"
    "  const float f = ng > 0.0f ? (float)((double)*nlocal / (double)ng) : 0.0f;\n"
    "  *out = *in * f;\n"
    "}\n"
    "\n"
    "// dlogits = dloss (softmax - onehot) / nvalid, zero on masked rows; a warp per row.\n"
    "template <class T> __device__ void ce_bwd(const T *logits, const int *labels, const float *dloss, const int *nvalid, float *dlogits, i64 nt, i64 V) {\n"
    "  const int lane = threadIdx.x & 31;\n"
    "  const i64 t = (i64)blockIdx.x * (NT_CE / 32) + (threadIdx.x >> 5);\n"
    "  if (t >= nt) return; // the whole warp leaves together\n"
    "  const int n = *nvalid, lab = labels[t];\n"
    "  const double f = n > 0 ? (double)*dloss / (double)n : 0.0;\n"
    "  const T *row = logits + t * V;\n"
    "  float *dl = dlogits + t * V;\n"
    "  if (lab == -1) {\n"
    "    for (i64 i = lane; i < V; i += 32) dl[i] = 0.0f;\n"
    "    return;\n"
    "  }\n"
    "  if (lab < 0 || lab >= V) return;\n"
    "  const double l = warp_lse(row, V);\n"
    "  for (i64 i = lane; i < V; i += 32) {\n"
    "    const double e = exp((double)ld(row + i) - l);\n"
    "    dl[i] = (float)(i == lab ? f * (e - 1.0) : f * e);\n"
    "  }\n"
    "}\n"
    ;

void cg_emit_loss(cg_buf *b, const cg_variant *v, int emu) {
  (void)v;
  cg_puts(b, src);
  const char *kv[9];
  cg_dtype_kv(kv, CG_DT_F32, CG_DT_F32);
  cg_entry(b, CG_NT_CE, "moec_ce_final", "const double *part, const int *npart, i64 nb, float *loss, int *nvalid",
           "ce_final", kv, emu);
  cg_entry(b, CG_NT_CE, "moec_ce_count", "const int *labels, int *nvalid, i64 nt, i64 V, int *err", "ce_count", kv,
           emu);
  cg_entry(b, CG_NT_CE, "moec_label_count", "const int *labels, float *n, i64 nt", "label_count", kv, emu);
  cg_entry(b, CG_NT_CE, "moec_ce_share", "const float *in, const int *nlocal, const float *nglobal, float *out",
           "ce_share", kv, emu);
  for (int x = 0; x < CG_DT_COUNT; x++) {
    cg_dtype_kv(kv, (cg_dtype)x, (cg_dtype)x);
    cg_entry(b, CG_NT_CE, "moec_ce_partial_${x}",
             "const ${X} *logits, const int *labels, double *part, int *npart, i64 nt, i64 V, int *err",
             "ce_partial<${X}>", kv, emu);
    cg_entry(b, CG_NT_CE, "moec_ce_bwd_${x}",
             "const ${X} *logits, const int *labels, const float *dloss, const int *nvalid, float *dlogits, i64 nt, "
             "i64 V",
             "ce_bwd<${X}>", kv, emu);
  }
}
