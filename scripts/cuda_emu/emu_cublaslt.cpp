/* emu_cublaslt.cpp -- a CPU stand-in for the part of libcublasLt that moec uses
 * (runtime/gpu_blas.c), so that the GPU executor runs on the CPU emulator:
 * MOEC_LIBCUBLASLT=.../libcublaslt_emu.so beside MOEC_LIBCUDA=.../libcuda_emu.so (run.sh sets
 * both). "Device" memory is host memory (emu_driver.cpp) and the stream is synchronous, so
 * cublasLtMatmul computes at once, on the calling thread (and a helper for large problems).
 *
 * Semantics are cuBLASLt's: column-major operands (CUBLASLT_ORDER_COL, also ROW),
 * D = alpha * op(A) op(B) + beta * C with fp32 accumulation (C not read when beta == 0),
 * strided batches (BATCH_COUNT, STRIDED_BATCH_OFFSET in elements), host or device alpha/beta.
 * Types: f32 x f32, bf16 x bf16 (C/D bf16 or f32), and FP8 E4M3 x E4M3 (C/D bf16 or f32) with
 *   - SCALAR_32F: one f32 per operand (a NULL scale pointer reads as 1), or
 *   - VEC128_32F (cuBLAS 12.9+, Hopper): one f32 per 128 consecutive elements of k; for A,
 *     with op(A) M x K, the scale of op(A)[i, k] is sA[(k / 128) * M + i] (M fastest), for B,
 *     op(B) K x N, sB[(k / 128) * N + j] (N fastest). Each 128-block's fp32 partial sum is
 *     multiplied by both scales and added to the accumulator (the promotion Hopper does);
 *   - BLK128x128_32F for A with VEC128_32F for B (the weight-tile recipe): one f32 per
 *     128 x 128 block of op(A), sA[(i / 128) * ldk + k / 128], ldk = ceil(K / 128) rounded up
 *     to 4 (the order test_gpu_tiles found the H200's cuBLASLt to read: TE's GEMM-ready one).
 * FP8 runs only "TN" (op(A) = A^T, op(B) = B), as on Hopper; with VEC128_32F, M and N must be
 * multiples of 16 and the scales 16-byte aligned (moec's gpu_blas.h reports that the H200 has
 * no algorithm otherwise): the stand-in refuses what the real library refuses there, so that a
 * call the GPU would reject fails here too.
 * Anything else (epilogues, other types, other scale modes, a C/D scale, amax) is refused
 * with CUBLAS_STATUS_NOT_SUPPORTED and a line on stderr. Every operand's extent is checked
 * against the live "device" allocations of emu_driver.cpp (emu_mem_check).
 * Development tool only: scripts/cuda_emu/run.sh builds it. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <map>
#include <thread>
#include <vector>

typedef int cublasStatus_t;
enum {
  ST_SUCCESS = 0, ST_NOT_INITIALIZED = 1, ST_ALLOC_FAILED = 3, ST_INVALID_VALUE = 7, ST_ARCH_MISMATCH = 8,
  ST_MAPPING_ERROR = 11, ST_EXECUTION_FAILED = 13, ST_INTERNAL_ERROR = 14, ST_NOT_SUPPORTED = 15
};
/* cudaDataType_t (library_types.h) */
enum { R_32F = 0, R_16BF = 14, R_8F_E4M3 = 28 };
/* cublasComputeType_t (cublas_api.h) */
enum { COMPUTE_32F = 68, COMPUTE_32F_FAST_16F = 74, COMPUTE_32F_FAST_16BF = 75, COMPUTE_32F_FAST_TF32 = 77 };
enum { OP_N = 0, OP_T = 1 };
/* cublasLtMatmulDescAttributes_t */
enum {
  D_COMPUTE_TYPE = 0, D_SCALE_TYPE = 1, D_POINTER_MODE = 2, D_TRANSA = 3, D_TRANSB = 4, D_TRANSC = 5, D_FILL_MODE = 6,
  D_EPILOGUE = 7, D_BIAS_POINTER = 8, D_SM_COUNT_TARGET = 14, D_A_SCALE_POINTER = 17, D_B_SCALE_POINTER = 18,
  D_FAST_ACCUM = 25, D_A_SCALE_MODE = 31, D_B_SCALE_MODE = 32, D_LAST = 40
};
enum { EPILOGUE_DEFAULT = 1 };
enum { PM_HOST = 0, PM_DEVICE = 1 };          /* cublasLtPointerMode_t */
enum { SCALE_SCALAR_32F = 0, SCALE_VEC128_32F = 4, SCALE_BLK128x128_32F = 5 }; /* cublasLtMatmulMatrixScale_t */
/* cublasLtMatrixLayoutAttribute_t */
enum { L_TYPE = 0, L_ORDER = 1, L_ROWS = 2, L_COLS = 3, L_LD = 4, L_BATCH_COUNT = 5, L_STRIDED_BATCH_OFFSET = 6,
       L_PLANE_OFFSET = 7 };
enum { ORDER_COL = 0, ORDER_ROW = 1 }; /* cublasLtOrder_t */

struct Algo {
  uint64_t data[8];
};
struct Heuristic {
  Algo algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

namespace {
const uint64_t HANDLE_MAGIC = 0x656d75636c74ull, ALGO_MAGIC = 0x656d75616c676full;
struct Handle {
  uint64_t magic;
};
/* Every attribute kept as the bytes it was set with; those the stand-in models are read back
 * with their defaults, any other one set non-zero makes the matmul NOT_SUPPORTED. */
struct Desc {
  std::map<int, std::vector<unsigned char>> attr;
  template <class T> T get(int a, T dflt) const {
    auto it = attr.find(a);
    if (it == attr.end() || it->second.size() != sizeof(T)) return dflt;
    T v;
    memcpy(&v, it->second.data(), sizeof v);
    return v;
  }
};
struct Layout {
  int32_t type = 0, order = ORDER_COL, batch = 1;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0, stride = 0, plane = 0;
};
struct Pref {
  uint64_t max_ws = 0;
};

size_t esize(int t) { return t == R_32F ? 4 : t == R_16BF ? 2 : 1; }

/* the bytes a layout's batches span from the base pointer (0 for an empty matrix) */
size_t span_bytes(const Layout &l) {
  if (l.rows == 0 || l.cols == 0) return 0;
  int64_t inner = l.order == ORDER_COL ? (int64_t)l.rows : (int64_t)l.cols;
  int64_t outer = l.order == ORDER_COL ? (int64_t)l.cols : (int64_t)l.rows;
  int64_t last = (outer - 1) * l.ld + inner; /* elements of one matrix */
  int64_t s = l.stride < 0 ? -l.stride : l.stride;
  return (size_t)((l.batch - 1) * s + last) * esize(l.type);
}

extern "C" int emu_mem_check(const void *p, size_t bytes); /* emu_driver.cpp */
extern "C" void emu_lock(void), emu_unlock(void);       /* its lock: ranks as threads take turns */

int say(int st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int say(int st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "emu cublasLt: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  return st;
}

float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* round to nearest even, NaN kept quiet */
uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
/* E4M3 (OCP FP8, "fn"): bias 7, no infinities, S.1111.111 is NaN */
float e4m3_table[256];
void init_e4m3() {
  for (int v = 0; v < 256; v++) {
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float x = (e & 15) == 15 && m == 7 ? NAN : e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
    e4m3_table[v] = s ? -x : x;
  }
}

/* One validated problem. */
struct Problem {
  int64_t M, N, K, batch;
  int ta, tb, fp8, scale_mode; /* scale_mode: B's (A's too, unless blk_a) */
  const Layout *a, *b, *c, *d;
  int blk_a; /* A's scales in 128 x 128 blocks */
};

/* op(X)[r, c] of a layout's matrix at base, as float */
struct Reader {
  const unsigned char *base;
  int type, order, trans;
  int64_t ld;
  float at(int64_t r, int64_t c) const {
    if (trans) std::swap(r, c);
    int64_t i = order == ORDER_COL ? r + c * ld : r * ld + c;
    switch (type) {
    case R_32F: { float f; memcpy(&f, base + 4 * i, 4); return f; }
    case R_16BF: { uint16_t h; memcpy(&h, base + 2 * i, 2); return bf16_to_f32(h); }
    default: return e4m3_table[base[i]];
    }
  }
};

int validate(const Desc *d, const Layout *a, const Layout *b, const Layout *c, const Layout *dl, Problem *p) {
  if (!d || !a || !b || !dl) return say(ST_INVALID_VALUE, "a NULL descriptor or layout");
  if (!c) c = dl;
  int ct = d->get<int32_t>(D_COMPUTE_TYPE, 0), st = d->get<int32_t>(D_SCALE_TYPE, 0);
  if (ct != COMPUTE_32F && ct != COMPUTE_32F_FAST_16F && ct != COMPUTE_32F_FAST_16BF && ct != COMPUTE_32F_FAST_TF32)
    return say(ST_NOT_SUPPORTED, "compute type %d (only the 32F ones are modelled)", ct);
  if (st != R_32F) return say(ST_NOT_SUPPORTED, "scale type %d (only CUDA_R_32F)", st);
  /* attributes the stand-in does not model must be left at their defaults */
  for (auto &kv : d->attr) {
    int k = kv.first;
    if (k == D_COMPUTE_TYPE || k == D_SCALE_TYPE || k == D_POINTER_MODE || k == D_TRANSA || k == D_TRANSB ||
        k == D_FILL_MODE || k == D_SM_COUNT_TARGET || k == D_FAST_ACCUM || k == D_A_SCALE_POINTER ||
        k == D_B_SCALE_POINTER || k == D_A_SCALE_MODE || k == D_B_SCALE_MODE)
      continue;
    if (k == D_EPILOGUE && d->get<uint32_t>(k, EPILOGUE_DEFAULT) == EPILOGUE_DEFAULT) continue;
    for (unsigned char byte : kv.second)
      if (byte) return say(ST_NOT_SUPPORTED, "matmul descriptor attribute %d set (not modelled)", k);
  }
  int pm = d->get<int32_t>(D_POINTER_MODE, PM_HOST);
  if (pm != PM_HOST && pm != PM_DEVICE) return say(ST_NOT_SUPPORTED, "pointer mode %d", pm);
  int ta = d->get<int32_t>(D_TRANSA, OP_N), tb = d->get<int32_t>(D_TRANSB, OP_N);
  if ((ta != OP_N && ta != OP_T) || (tb != OP_N && tb != OP_T)) return say(ST_NOT_SUPPORTED, "transa %d, transb %d", ta, tb);
  const Layout *ls[4] = {a, b, c, dl};
  for (int i = 0; i < 4; i++) {
    const Layout *l = ls[i];
    if (l->order != ORDER_COL && l->order != ORDER_ROW) return say(ST_NOT_SUPPORTED, "layout order %d", l->order);
    int64_t inner = l->order == ORDER_COL ? (int64_t)l->rows : (int64_t)l->cols;
    if (l->ld < (inner > 1 ? inner : 1)) return say(ST_INVALID_VALUE, "operand %c: ld %lld < %lld", "ABCD"[i], (long long)l->ld, (long long)inner);
    if (l->batch < 1) return say(ST_INVALID_VALUE, "operand %c: batch count %d", "ABCD"[i], l->batch);
    if (l->plane) return say(ST_NOT_SUPPORTED, "operand %c: plane offset (not modelled)", "ABCD"[i]);
  }
  int64_t M = ta ? a->cols : a->rows, K = ta ? a->rows : a->cols;
  int64_t Kb = tb ? b->cols : b->rows, N = tb ? b->rows : b->cols;
  if (K != Kb || (int64_t)dl->rows != M || (int64_t)dl->cols != N || c->rows != dl->rows || c->cols != dl->cols)
    return say(ST_INVALID_VALUE, "shapes: op(A) %lld x %lld, op(B) %lld x %lld, C %llu x %llu, D %llu x %llu", (long long)M,
               (long long)K, (long long)Kb, (long long)N, (unsigned long long)c->rows, (unsigned long long)c->cols,
               (unsigned long long)dl->rows, (unsigned long long)dl->cols);
  if (a->batch != b->batch || a->batch != dl->batch || c->batch != dl->batch)
    return say(ST_INVALID_VALUE, "batch counts A %d, B %d, C %d, D %d", a->batch, b->batch, c->batch, dl->batch);
  if (c->type != dl->type || c->order != dl->order) return say(ST_NOT_SUPPORTED, "C and D differ in type or order");
  int fp8 = a->type == R_8F_E4M3;
  int smode_a = d->get<int32_t>(D_A_SCALE_MODE, SCALE_SCALAR_32F), smode_b = d->get<int32_t>(D_B_SCALE_MODE, SCALE_SCALAR_32F);
  const void *spa = d->get<const void *>(D_A_SCALE_POINTER, nullptr), *spb = d->get<const void *>(D_B_SCALE_POINTER, nullptr);
  if (!fp8) {
    if (a->type != b->type || (a->type != R_32F && a->type != R_16BF))
      return say(ST_NOT_SUPPORTED, "A type %d x B type %d", a->type, b->type);
    if (dl->type != R_32F && dl->type != a->type) return say(ST_NOT_SUPPORTED, "D type %d with inputs of type %d", dl->type, a->type);
    if (spa || spb || smode_a || smode_b) return say(ST_NOT_SUPPORTED, "scale pointers or modes on non-FP8 inputs");
  } else {
    if (b->type != R_8F_E4M3) return say(ST_NOT_SUPPORTED, "FP8 A with B type %d", b->type);
    if (dl->type != R_32F && dl->type != R_16BF) return say(ST_NOT_SUPPORTED, "FP8 inputs with D type %d", dl->type);
    if (ta != OP_T || tb != OP_N) return say(ST_NOT_SUPPORTED, "FP8 with transa %d, transb %d: Hopper runs TN only", ta, tb);
    if (a->order != ORDER_COL || b->order != ORDER_COL || dl->order != ORDER_COL)
      return say(ST_NOT_SUPPORTED, "FP8 with a non-column-major layout");
    if (a->ld % 16 || b->ld % 16) return say(ST_NOT_SUPPORTED, "FP8 lda %lld / ldb %lld not multiples of 16 bytes", (long long)a->ld, (long long)b->ld);
    const int blk_a = smode_a == SCALE_BLK128x128_32F && smode_b == SCALE_VEC128_32F;
    if (!blk_a && (smode_a != smode_b || (smode_a != SCALE_SCALAR_32F && smode_a != SCALE_VEC128_32F)))
      return say(ST_NOT_SUPPORTED,
                 "FP8 scale modes A %d, B %d (modelled: both SCALAR_32F, both VEC128_32F, or A BLK128x128_32F with B VEC128_32F)",
                 smode_a, smode_b);
    if (smode_b == SCALE_VEC128_32F) {
      if (!spa || !spb) return say(ST_INVALID_VALUE, "VEC128_32F without a scale pointer");
      if (((uintptr_t)spa | (uintptr_t)spb) % 16) return say(ST_NOT_SUPPORTED, "VEC128_32F scales not 16-byte aligned");
      if (a->batch != 1) return say(ST_NOT_SUPPORTED, "VEC128_32F with batches (not modelled)");
      if (K % 128) return say(ST_NOT_SUPPORTED, "VEC128_32F with K %lld not a multiple of 128", (long long)K);
      if (M % 16 || N % 16) return say(ST_NOT_SUPPORTED, "VEC128_32F with M %lld, N %lld not multiples of 16 (no H200 algorithm)", (long long)M, (long long)N);
    }
  }
  *p = Problem{M, N, K, a->batch, ta, tb, fp8, fp8 ? smode_b : -1, a, b, c, dl, fp8 && smode_a == SCALE_BLK128x128_32F};
  return ST_SUCCESS;
}

/* part (M x N, M fastest) += op(A)[:, k0:k0+kb] op(B)[k0:k0+kb, :] over columns [j0, j1) */
void block_product(const float *ap, const float *bp, float *part, int64_t M, int64_t kb, int64_t j0, int64_t j1) {
  int64_t j = j0;
  for (; j + 4 <= j1; j += 4) {
    float *c0 = part + j * M, *c1 = c0 + M, *c2 = c1 + M, *c3 = c2 + M;
    const float *b0 = bp + j * kb, *b1 = b0 + kb, *b2 = b1 + kb, *b3 = b2 + kb;
    for (int64_t l = 0; l < kb; l++) {
      const float *a = ap + l * M;
      float x0 = b0[l], x1 = b1[l], x2 = b2[l], x3 = b3[l];
      for (int64_t i = 0; i < M; i++) {
        float v = a[i];
        c0[i] += v * x0, c1[i] += v * x1, c2[i] += v * x2, c3[i] += v * x3;
      }
    }
  }
  for (; j < j1; j++) {
    float *c0 = part + j * M;
    const float *b0 = bp + j * kb;
    for (int64_t l = 0; l < kb; l++) {
      const float *a = ap + l * M;
      float x0 = b0[l];
      for (int64_t i = 0; i < M; i++) c0[i] += a[i] * x0;
    }
  }
}

/* D = alpha op(A) op(B) + beta C for batch entry bi, columns [j0, j1) of D. */
void compute(const Problem &p, const unsigned char *A, const unsigned char *B, const unsigned char *C, unsigned char *D,
             const float *sa, const float *sb, float alpha, float beta, int64_t j0, int64_t j1) {
  const int64_t M = p.M, K = p.K, nj = j1 - j0;
  if (nj <= 0) return;
  const int vec = p.scale_mode == SCALE_VEC128_32F;
  const int64_t KB = vec ? 128 : 256;
  std::vector<float> acc((size_t)(M * nj), 0.0f), part(vec ? (size_t)(M * nj) : 0), ap((size_t)(M * KB)), bp((size_t)(KB * nj));
  Reader ra{A, p.a->type, p.a->order, p.ta, p.a->ld}, rb{B, p.b->type, p.b->order, p.tb, p.b->ld};
  for (int64_t k0 = 0; k0 < K; k0 += KB) {
    int64_t kb = K - k0 < KB ? K - k0 : KB;
    for (int64_t l = 0; l < kb; l++)
      for (int64_t i = 0; i < M; i++) ap[(size_t)(l * M + i)] = ra.at(i, k0 + l);
    for (int64_t j = 0; j < nj; j++)
      for (int64_t l = 0; l < kb; l++) bp[(size_t)(j * kb + l)] = rb.at(k0 + l, j0 + j);
    if (!vec) {
      block_product(ap.data(), bp.data(), acc.data(), M, kb, 0, nj);
      continue;
    }
    std::fill(part.begin(), part.end(), 0.0f);
    block_product(ap.data(), bp.data(), part.data(), M, kb, 0, nj);
    const int64_t ldk = ((K + 127) / 128 + 3) / 4 * 4;
    const float *sak = sa + (p.blk_a ? k0 / 128 : (k0 / 128) * M), *sbk = sb + (k0 / 128) * p.N;
    for (int64_t j = 0; j < nj; j++)
      for (int64_t i = 0; i < M; i++)
        acc[(size_t)(j * M + i)] += part[(size_t)(j * M + i)] * ((p.blk_a ? sak[(i / 128) * ldk] : sak[i]) * sbk[j0 + j]);
  }
  if (p.fp8 && !vec) {
    float s = (sa ? *sa : 1.0f) * (sb ? *sb : 1.0f);
    for (float &v : acc) v *= s;
  }
  const Layout *dl = p.d, *cl = p.c;
  for (int64_t j = 0; j < nj; j++)
    for (int64_t i = 0; i < M; i++) {
      float v = alpha * acc[(size_t)(j * M + i)];
      int64_t di = dl->order == ORDER_COL ? i + (j0 + j) * dl->ld : i * dl->ld + (j0 + j);
      int64_t ci = cl->order == ORDER_COL ? i + (j0 + j) * cl->ld : i * cl->ld + (j0 + j);
      if (beta != 0.0f) {
        float c;
        if (cl->type == R_32F) memcpy(&c, C + 4 * ci, 4);
        else { uint16_t h; memcpy(&h, C + 2 * ci, 2); c = bf16_to_f32(h); }
        v += beta * c;
      }
      if (dl->type == R_32F) memcpy(D + 4 * di, &v, 4);
      else { uint16_t h = f32_to_bf16(v); memcpy(D + 2 * di, &h, 2); }
    }
}
} // namespace

extern "C" {
size_t cublasLtGetVersion(void) { return 130000; }

const char *cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
  case ST_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case ST_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case ST_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case ST_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case ST_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
  case ST_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
  case ST_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case ST_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
  case ST_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

cublasStatus_t cublasLtCreate(void **handle) {
  if (!handle) return ST_INVALID_VALUE;
  static bool inited = (init_e4m3(), true);
  (void)inited;
  *handle = new Handle{HANDLE_MAGIC};
  return ST_SUCCESS;
}
cublasStatus_t cublasLtDestroy(void *handle) {
  if (!handle || ((Handle *)handle)->magic != HANDLE_MAGIC) return ST_NOT_INITIALIZED;
  ((Handle *)handle)->magic = 0;
  delete (Handle *)handle;
  return ST_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(void **desc, int compute_type, int scale_type) {
  if (!desc) return ST_INVALID_VALUE;
  Desc *d = new Desc;
  int32_t ct = compute_type, st = scale_type;
  d->attr[D_COMPUTE_TYPE].assign((unsigned char *)&ct, (unsigned char *)&ct + 4);
  d->attr[D_SCALE_TYPE].assign((unsigned char *)&st, (unsigned char *)&st + 4);
  *desc = d;
  return ST_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(void *desc) {
  delete (Desc *)desc;
  return ST_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(void *desc, int attr, const void *buf, size_t size) {
  if (!desc || !buf || attr < 0 || attr > D_LAST) return ST_INVALID_VALUE;
  size_t want = 0;
  switch (attr) {
  case D_FAST_ACCUM: want = 1; break;
  case D_BIAS_POINTER: case D_A_SCALE_POINTER: case D_B_SCALE_POINTER: case 10: case 19: case 20: case 21: case 23:
  case 24: case 29: case 30: case 36: want = sizeof(void *); break;
  case 11: case 12: case 13: want = 8; break;
  default: want = 4;
  }
  if (size != want) return say(ST_INVALID_VALUE, "matmul descriptor attribute %d set with %zu bytes, expected %zu", attr, size, want);
  ((Desc *)desc)->attr[attr].assign((const unsigned char *)buf, (const unsigned char *)buf + size);
  return ST_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(void **layout, int type, uint64_t rows, uint64_t cols, int64_t ld) {
  if (!layout) return ST_INVALID_VALUE;
  Layout *l = new Layout;
  l->type = type, l->rows = rows, l->cols = cols, l->ld = ld;
  *layout = l;
  return ST_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(void *layout) {
  delete (Layout *)layout;
  return ST_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(void *layout, int attr, const void *buf, size_t size) {
  if (!layout || !buf) return ST_INVALID_VALUE;
  Layout *l = (Layout *)layout;
  void *dst = nullptr;
  size_t want = 0;
  switch (attr) {
  case L_TYPE: dst = &l->type, want = 4; break;
  case L_ORDER: dst = &l->order, want = 4; break;
  case L_ROWS: dst = &l->rows, want = 8; break;
  case L_COLS: dst = &l->cols, want = 8; break;
  case L_LD: dst = &l->ld, want = 8; break;
  case L_BATCH_COUNT: dst = &l->batch, want = 4; break;
  case L_STRIDED_BATCH_OFFSET: dst = &l->stride, want = 8; break;
  case L_PLANE_OFFSET: dst = &l->plane, want = 8; break;
  default: return say(ST_INVALID_VALUE, "matrix layout attribute %d (not modelled)", attr);
  }
  if (size != want) return say(ST_INVALID_VALUE, "matrix layout attribute %d set with %zu bytes, expected %zu", attr, size, want);
  memcpy(dst, buf, size);
  return ST_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(void **pref) {
  if (!pref) return ST_INVALID_VALUE;
  *pref = new Pref;
  return ST_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(void *pref) {
  delete (Pref *)pref;
  return ST_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(void *pref, int attr, const void *buf, size_t size) {
  if (!pref || !buf) return ST_INVALID_VALUE;
  if (attr == 1) { /* CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES */
    if (size != 8) return ST_INVALID_VALUE;
    memcpy(&((Pref *)pref)->max_ws, buf, 8);
  }
  return ST_SUCCESS; /* the others (search mode, alignments, waves) only narrow the choice */
}

/* One algorithm, needing no workspace, for every problem the stand-in can compute. */
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(void *handle, void *desc, void *a, void *b, void *c, void *d, void *pref,
                                              int requested, Heuristic *results, int *returned) {
  if (!handle || ((Handle *)handle)->magic != HANDLE_MAGIC) return ST_NOT_INITIALIZED;
  if (!pref || !results || !returned || requested < 1) return ST_INVALID_VALUE;
  *returned = 0;
  Problem p;
  int st = validate((Desc *)desc, (Layout *)a, (Layout *)b, (Layout *)c, (Layout *)d, &p);
  if (st != ST_SUCCESS) return st;
  memset(&results[0], 0, sizeof results[0]);
  results[0].algo.data[0] = ALGO_MAGIC;
  results[0].state = ST_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return ST_SUCCESS;
}

cublasStatus_t cublasLtMatmul(void *handle, void *desc, const void *alpha, const void *A, void *adesc, const void *B,
                              void *bdesc, const void *beta, const void *C, void *cdesc, void *D, void *ddesc,
                              const Algo *algo, void *workspace, size_t workspace_bytes, void *stream) {
  (void)workspace, (void)workspace_bytes, (void)stream;
  if (!handle || ((Handle *)handle)->magic != HANDLE_MAGIC) return ST_NOT_INITIALIZED;
  struct Held {
    Held() { emu_lock(); }
    ~Held() { emu_unlock(); }
  } held;
  if (algo && algo->data[0] != ALGO_MAGIC) return say(ST_INVALID_VALUE, "an algorithm not from this library's heuristic");
  Problem p;
  int st = validate((Desc *)desc, (Layout *)adesc, (Layout *)bdesc, (Layout *)cdesc, (Layout *)ddesc, &p);
  if (st != ST_SUCCESS) return st;
  if (!alpha || !beta) return say(ST_INVALID_VALUE, "NULL alpha or beta");
  float al, be;
  memcpy(&al, alpha, 4), memcpy(&be, beta, 4); /* host or device: both are host memory here */
  if (p.M == 0 || p.N == 0) return ST_SUCCESS;
  const Desc *dd = (const Desc *)desc;
  const float *sa = dd->get<const float *>(D_A_SCALE_POINTER, nullptr), *sb = dd->get<const float *>(D_B_SCALE_POINTER, nullptr);
  /* every operand within a live allocation */
  struct { const void *ptr; size_t bytes; const char *what; } ext[] = {
      {A, span_bytes(*p.a), "A"}, {B, p.K ? span_bytes(*p.b) : 0, "B"}, {D, span_bytes(*p.d), "D"},
      {C, be != 0.0f ? span_bytes(*p.c) : 0, "C"},
      {sa, !sa ? 0 : p.blk_a ? (size_t)(((p.K + 127) / 128 + 3) / 4 * 4 * ((p.M + 127) / 128)) * 4
                  : p.scale_mode == SCALE_VEC128_32F ? (size_t)((p.K + 127) / 128 * p.M) * 4 : 4, "the A scales"},
      {sb, !sb ? 0 : p.scale_mode == SCALE_VEC128_32F ? (size_t)((p.K + 127) / 128 * p.N) * 4 : 4, "the B scales"}};
  if (p.K == 0) ext[0].bytes = 0;
  for (auto &e : ext)
    if (e.bytes && (!e.ptr || !emu_mem_check(e.ptr, e.bytes)))
      return say(ST_EXECUTION_FAILED, "%s (%p, %zu bytes) is not within one live device allocation (M %lld, N %lld, K %lld, batch %lld)",
                 e.what, e.ptr, e.bytes, (long long)p.M, (long long)p.N, (long long)p.K, (long long)p.batch);
  const int64_t work = p.M * p.N * (p.K ? p.K : 1) * p.batch;
  unsigned nt = work >= (1 << 22) ? std::thread::hardware_concurrency() : 1;
  if (nt < 1) nt = 1;
  if (nt > 8) nt = 8;
  for (int64_t bi = 0; bi < p.batch; bi++) {
    const unsigned char *a = (const unsigned char *)A + bi * p.a->stride * (int64_t)esize(p.a->type);
    const unsigned char *b = (const unsigned char *)B + bi * p.b->stride * (int64_t)esize(p.b->type);
    const unsigned char *c = (const unsigned char *)C + bi * p.c->stride * (int64_t)esize(p.c->type);
    unsigned char *d = (unsigned char *)D + bi * p.d->stride * (int64_t)esize(p.d->type);
    if (nt == 1 || p.N < 2 * (int64_t)nt) {
      compute(p, a, b, c, d, sa, sb, al, be, 0, p.N);
      continue;
    }
    std::vector<std::thread> ts;
    int64_t per = (p.N + nt - 1) / nt;
    for (unsigned t = 0; t < nt; t++) {
      int64_t j0 = t * per, j1 = j0 + per < p.N ? j0 + per : p.N;
      ts.emplace_back(compute, std::cref(p), a, b, c, d, sa, sb, al, be, j0, j1);
    }
    for (auto &t : ts) t.join();
  }
  return ST_SUCCESS;
}
}
