/* cg_kernels.c -- the family registry, the prelude every module starts with, and the
 * kernel-entry emitter shared by the family generators. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cg_family.h"
#include "runtime/cpu_kernels.h" /* CK_EINDEX, the value of the device error flag */

static const struct {
  const char *name;
  cg_family_fn emit;
} families[CG_FAM_COUNT] = {
    [CG_FAM_ELEMENTWISE] = {"elementwise", cg_emit_elementwise},
    [CG_FAM_EMBEDDING] = {"embedding", cg_emit_embedding},
    [CG_FAM_RMSNORM] = {"rmsnorm", cg_emit_rmsnorm},
    [CG_FAM_ROPE] = {"rope", cg_emit_rope},
    [CG_FAM_ROUTER] = {"router", cg_emit_router},
    [CG_FAM_ROUTE] = {"route", cg_emit_route},
    [CG_FAM_LOSS] = {"loss", cg_emit_loss},
    [CG_FAM_OPTIM] = {"optim", cg_emit_optim},
    [CG_FAM_MXFP8] = {"mxfp8", cg_emit_mxfp8},
    [CG_FAM_GROUPED] = {"grouped", cg_emit_grouped},
    [CG_FAM_NARROW] = {"narrow", cg_emit_narrow},
};

const char *cg_family_name(cg_family f) { return f < CG_FAM_COUNT ? families[f].name : "?"; }
const char *cg_dtype_name(cg_dtype t) { return t == CG_DT_BF16 ? "bf16" : "f32"; }
const char *cg_dtype_ctype(cg_dtype t) { return t == CG_DT_BF16 ? "bf16" : "float"; }

int cg_family_variants(cg_family f, cg_variant *v, int max) {
  if (f != CG_FAM_MXFP8) {
    if (max >= 1) v[0] = (cg_variant){0, 0};
    return max >= 1;
  }
  /* true OCP MX (block 32), and the Hopper tier: 32-blocks sharing one scale per 128 */
  static const cg_variant mx[] = {{32, 0}, {32, 1}};
  int n = 0;
  for (size_t i = 0; i < sizeof mx / sizeof mx[0] && n < max; i++) v[n++] = mx[i];
  return n;
}

int cg_variant_ok(cg_family f, const cg_variant *v) {
  if (f >= CG_FAM_COUNT) return -1;
  if (f != CG_FAM_MXFP8) return 0;
  int b = v->mx_block;
  if (b < 1 || b > 128 || (b & (b - 1)) != 0) return -1; /* a power of two up to 128 */
  return 0;                                               /* 128 % b == 0 follows */
}

void cg_module_name(cg_family f, const cg_variant *v, char *buf, size_t len) {
  if (f == CG_FAM_MXFP8)
    snprintf(buf, len, "mxfp8_b%d%s", v->mx_block, v->mx_share128 ? "_s128" : "");
  else
    snprintf(buf, len, "%s", cg_family_name(f));
}

const char *cg_kname(char *buf, size_t len, const char *op, int n, ...) {
  int k = snprintf(buf, len, "moec_%s", op);
  va_list ap;
  va_start(ap, n);
  for (int i = 0; i < n && k >= 0 && (size_t)k < len; i++)
    k += snprintf(buf + k, len - (size_t)k, "_%s", cg_dtype_name((cg_dtype)va_arg(ap, int)));
  va_end(ap);
  return buf;
}

void cg_dtype_kv(const char **kv, cg_dtype x, cg_dtype w) {
  kv[0] = "X", kv[1] = cg_dtype_ctype(x), kv[2] = "x", kv[3] = cg_dtype_name(x);
  kv[4] = "W", kv[5] = cg_dtype_ctype(w), kv[6] = "w", kv[7] = cg_dtype_name(w);
  kv[8] = NULL;
}

static const char *const prelude =
    "// Self-contained: no #include, so NVRTC needs no include path at run time.\n"
    "typedef unsigned char u8;\n"
    "typedef unsigned short u16;\n"
    "typedef unsigned int u32;\n"
    "typedef long long i64;\n"
    "\n"
    "// bf16 storage: the 16 bits of a bfloat16. Conversions are ck_float_to_bf16's (round to\n"
    "// nearest even; NaN stays a quiet NaN with its sign), done on the bits, not by cvt (whose\n"
    "// NaN is canonical), so GPU and CPU agree bit for bit.\n"
    "struct bf16 {\n"
    "  u16 bits;\n"
    "};\n"
    "\n"
    "__device__ __forceinline__ float f32_inf() { return __int_as_float(0x7f800000); }\n"
    "__device__ __forceinline__ float f32_qnan() { return __int_as_float(0x7fc00000); } // the CPU's NAN\n"
    "__device__ __forceinline__ bool is_nan(float x) { return x != x; }\n"
    "__device__ __forceinline__ bool is_finite(float x) { return fabsf(x) <= 3.40282347e38f; }\n"
    "\n"
    "// ck_dense.c's sigmoidf (to a few ulp); and the GroupedMLP's activation p (silu(g) u), in\n"
    "// the CPU's order (cg_grouped.c's mlp_act, and cg_mxfp8.c's quantize of it). sigmoidf's branches,\n"
    "// 1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) below, are the same operations on t = e^-|x|\n"
    "// (NaN, signed zeros and infinities included): one exp and one division a value, where\n"
    "// branches would make a warp of mixed signs run both.\n"
    "// The exponential and the division are the hardware's approximations (__expf, __fdividef:\n"
    "// a few ulp from the CPU's, 1 + t in [1, 2] is in __fdividef's range), far fewer instructions\n"
    "// than expf and an IEEE division, in kernels whose outputs are bf16 or MXFP8.\n"
    "__device__ __forceinline__ float sigm(float x) {\n"
    "  const float t = __expf(-fabsf(x));\n"
    "  return __fdividef(x >= 0.0f ? 1.0f : t, 1.0f + t);\n"
    "}\n"
    "__device__ __forceinline__ float swiglu_p(float g, float u, float p) { return p * ((g * sigm(g)) * u); }\n"
    "\n"
    "// MXFP8 decoding (cg_mxfp8.c's dequantize; grouped_mlp_bwd reads a stored gate_up with it).\n"
    "// 2^k as a float, exact for k in [-149, 127].\n"
    "__device__ __forceinline__ float pow2f(int k) {\n"
    "  return k >= -126 ? __int_as_float((k + 127) << 23) : __int_as_float(1 << (k + 149));\n"
    "}\n"
    "// Exact value of a non-NaN E4M3 code.\n"
    "__device__ __forceinline__ float e4m3_decode(u8 b) {\n"
    "  const int E = (b >> 3) & 15, M = b & 7;\n"
    "  const float v = E == 0 ? (float)M * pow2f(-9) : (float)(8 + M) * pow2f(E - 10);\n"
    "  return b & 0x80 ? -v : v;\n"
    "}\n"
    "// x = e4m3(q) 2^(scale - 127); scale 0xFF gives NaN, an E4M3 NaN code gives NaN with its\n"
    "// sign (the CPU's ldexpf keeps it; a float multiply would not).\n"
    "__device__ __forceinline__ float mx_dequant1(u32 b, int code, float mul) {\n"
    "  if (code == 0xFF) return f32_qnan();\n"
    "  if ((b & 0x7F) == 0x7F) return __uint_as_float(((b & 0x80) << 24) | 0x7fc00000u);\n"
    "  return e4m3_decode((u8)b) * mul;\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ float ld(const float *p) { return *p; }\n"
    "__device__ __forceinline__ float ld(const bf16 *p) { return __uint_as_float((u32)p->bits << 16); }\n"
    "__device__ __forceinline__ u16 bf16_bits(float x) {\n"
    "  u32 u = __float_as_uint(x);\n"
    "  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u16)((u >> 16) | 0x0040u);\n"
    "  u += 0x7FFFu + ((u >> 16) & 1u); // may carry into inf, as it should\n"
    "  return (u16)(u >> 16);\n"
    "}\n"
    "__device__ __forceinline__ void st(float *p, float v) { *p = v; }\n"
    "__device__ __forceinline__ void st(bf16 *p, float v) { p->bits = bf16_bits(v); }\n"
    "// v as a store to p's type would leave it: an op with a residual folded in (fuse-residual)\n"
    "// rounds its own result first, so that the sum is the separate add's bit for bit.\n"
    "__device__ __forceinline__ float rnd_as(const float *, float v) { return v; }\n"
    "__device__ __forceinline__ float rnd_as(const bf16 *, float v) { return __uint_as_float((u32)bf16_bits(v) << 16); }\n"
    "\n"
    "// Eight consecutive values through 16-byte accesses (one for bf16, two for f32): p must be\n"
    "// 16-byte aligned. The memory-bound kernels run their bulk through these (VEC_LOOP).\n"
    "struct alignas(16) u32x4 {\n"
    "  u32 w[4];\n"
    "};\n"
    "__device__ __forceinline__ bool aligned16(const void *p) { return ((unsigned long long)p & 15u) == 0; }\n"
    "// A hint that the line holding p be fetched into L2: more of a latency-bound loop's next\n"
    "// loads in flight without registers to hold them (none on the CPU emulator).\n"
    "__device__ __forceinline__ void prefetch_l2(const void *p) {\n"
    "#if defined(__CUDA_ARCH__)\n"
    "  asm volatile(\"prefetch.L2 [%0];\" ::\"l\"(p));\n"
    "#else\n"
    "  (void)p;\n"
    "#endif\n"
    "}\n"
    "__device__ __forceinline__ void ld8(const float *p, float v[8]) {\n"
    "  const u32x4 a = ((const u32x4 *)p)[0], b = ((const u32x4 *)p)[1];\n"
    "#pragma unroll\n"
    "  for (int k = 0; k < 4; k++) v[k] = __uint_as_float(a.w[k]), v[4 + k] = __uint_as_float(b.w[k]);\n"
    "}\n"
    "__device__ __forceinline__ void ld8(const bf16 *p, float v[8]) {\n"
    "  const u32x4 a = *(const u32x4 *)p;\n"
    "#pragma unroll\n"
    "  for (int k = 0; k < 4; k++) v[2 * k] = __uint_as_float(a.w[k] << 16), v[2 * k + 1] = __uint_as_float(a.w[k] & 0xFFFF0000u);\n"
    "}\n"
    "__device__ __forceinline__ void st8(float *p, const float v[8]) {\n"
    "  u32x4 a, b;\n"
    "#pragma unroll\n"
    "  for (int k = 0; k < 4; k++) a.w[k] = __float_as_uint(v[k]), b.w[k] = __float_as_uint(v[4 + k]);\n"
    "  ((u32x4 *)p)[0] = a;\n"
    "  ((u32x4 *)p)[1] = b;\n"
    "}\n"
    "// v rounded to bf16, as pairs (low half first): what st8 stores.\n"
    "__device__ __forceinline__ u32x4 bf16x8(const float v[8]) {\n"
    "  u32x4 a;\n"
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n"
    "  // The hardware's nearest-even conversion, two values an instruction, is bf16_bits for every\n"
    "  // non-NaN float (subnormals and the carry into inf alike); its NaN is canonical where the\n"
    "  // CPU's keeps sign and payload, so a chunk holding a NaN takes the bit form below. (The bit\n"
    "  // form cost ~6 instructions a value: a third of the split backward's.)\n"
    "  bool nan = false;\n"
    "#pragma unroll\n"
    "  for (int k = 0; k < 8; k++) nan |= is_nan(v[k]);\n"
    "  if (!nan) {\n"
    "#pragma unroll\n"
    "    for (int k = 0; k < 4; k++) asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(a.w[k]) : \"f\"(v[2 * k + 1]), \"f\"(v[2 * k]));\n"
    "    return a;\n"
    "  }\n"
    "#endif\n"
    "#pragma unroll\n"
    "  for (int k = 0; k < 4; k++) a.w[k] = (u32)bf16_bits(v[2 * k]) | (u32)bf16_bits(v[2 * k + 1]) << 16;\n"
    "  return a;\n"
    "}\n"
    "__device__ __forceinline__ void st8(bf16 *p, const float v[8]) { *(u32x4 *)p = bf16x8(v); }\n"
    "\n"
    "// Grid-stride loop over [0, n).\n"
    "#define GRID_LOOP(i, n) \\\n"
    "  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)\n"
    "// An elementwise loop over [0, n): f(w, i) handles N = decltype(w)::value elements from i,\n"
    "// N = 8 (16-byte accesses, ldn/stn) over the bulk when `vec` (every pointer 16-byte\n"
    "// aligned), N = 1 over the rest. Write the body once, generic in N.\n"
    "template <int N> struct width {\n"
    "  static constexpr int value = N;\n"
    "};\n"
    "template <int N, class T> __device__ __forceinline__ void ldn(const T *p, float *v) {\n"
    "  if constexpr (N == 8) ld8(p, v);\n"
    "  else v[0] = ld(p);\n"
    "}\n"
    "template <int N, class T> __device__ __forceinline__ void stn(T *p, const float *v) {\n"
    "  if constexpr (N == 8) st8(p, v);\n"
    "  else st(p, v[0]);\n"
    "}\n"
    "template <class F> __device__ __forceinline__ void ew_loop(i64 n, bool vec, F f) {\n"
    "  const i64 n8 = vec ? n / 8 * 8 : 0;\n"
    "  GRID_LOOP(c, n8 / 8) f(width<8>(), c * 8);\n"
    "  GRID_LOOP(r, n - n8) f(width<1>(), n8 + r);\n"
    "}\n"
    "// The body's head and its first statement: ew_loop(n, vec, EW_BODY { EW_N; ... });\n"
    "#define EW_BODY [&](auto w_, i64 i)\n"
    "#define EW_N constexpr int N = decltype(w_)::value\n"
    "\n"
    "// Reductions. Orders are fixed by the launch shape, so results repeat run to run.\n"
    "__device__ __forceinline__ float warp_max(float v) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "  return v;\n"
    "}\n"
    "template <class T> __device__ __forceinline__ T warp_sum(T v) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  return v;\n"
    "}\n"
    "// Sum over the block (blockDim.x a multiple of 32); every thread gets it. sh holds 32\n"
    "// values; the leading barrier lets a caller use the same sh twice in a row.\n"
    "template <class T> __device__ T block_sum(T v, T *sh) {\n"
    "  v = warp_sum(v);\n"
    "  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;\n"
    "  __syncthreads();\n"
    "  if (lane == 0) sh[w] = v;\n"
    "  __syncthreads();\n"
    "  v = lane < (int)(blockDim.x >> 5) ? sh[lane] : (T)0;\n"
    "  return warp_sum(v);\n"
    "}\n"
    "\n"
    "// One torch.optim.AdamW step of one weight, in ck_adamw_step's operation order (the optimizer\n"
    "// and the weight-tile squares it writes both run it). gi: the gradient times the clipping\n"
    "// factor; torch's CPU kernels fuse lerp and addcmul into multiply-adds, and so does the CPU\n"
    "// reference; explicit fmaf fuses whatever --fmad says.\n"
    "__device__ __forceinline__ void adamw_update(float &p, float &m, float &v, float gi, float decay, int decay_on, float w1,\n"
    "                                             float b2, float c2, float neg_step, float bc2_sqrt, float eps, int small) {\n"
    "  const float pi = decay_on ? p * decay : p;\n"
    "  m = small ? fmaf(w1, gi - m, m) : fmaf(w1 - 1.0f, gi - m, gi);\n"
    "  v = fmaf(c2 * gi, gi, v * b2);\n"
    "  const float denom = sqrtf(v) / bc2_sqrt + eps;\n"
    "  p = pi + neg_step * m / denom;\n"
    "}\n"
    "// The clipping factor clip / (norm + 1e-6) where under 1 (or NaN), formed from the\n"
    "// device-resident norm so that no host sync is needed; 1 without clipping.\n"
    "__device__ __forceinline__ float clip_factor(const float *gnorm, float clip) {\n"
    "  if (!gnorm || clip <= 0.0f) return 1.0f;\n"
    "  const float c = clip / (*gnorm + 1e-6f);\n"
    "  return is_nan(c) || c < 1.0f ? c : 1.0f;\n"
    "}\n"
    "\n"
    "// The first failure wins; the host reads the flag once per step.\n"
    "__device__ __forceinline__ void raise_err(int *err, int code) {\n"
    "  if (err) atomicCAS(err, 0, code);\n"
    "}\n"
    ;

/* The emulator's stand-ins for CUDA's keywords and intrinsics come from its own header. */
static const char *const emu_prelude = "#include \"emu_cuda.h\"\n";

/* One parameter of a C parameter list: its type (everything before the name) and name. */
static int split_param(const char *p, size_t n, char *type, size_t tl, char *name, size_t nl) {
  while (n && (*p == ' ' || *p == '\n')) p++, n--;
  while (n && (p[n - 1] == ' ' || p[n - 1] == '\n')) n--;
  size_t e = n;
  while (e && (p[e - 1] == '_' || (p[e - 1] >= '0' && p[e - 1] <= '9') || (p[e - 1] >= 'a' && p[e - 1] <= 'z') ||
               (p[e - 1] >= 'A' && p[e - 1] <= 'Z')))
    e--;
  if (e == n || e == 0) return -1;
  snprintf(type, tl, "%.*s", (int)e, p);
  snprintf(name, nl, "%.*s", (int)(n - e), p + e);
  return 0;
}

void cg_entry(cg_buf *b, int threads, const char *name_t, const char *params_t, const char *impl_t,
              const char *const *kv, int emu) {
  cg_entry_occ(b, threads, 0, name_t, params_t, impl_t, kv, emu);
}

void cg_entry_occ(cg_buf *b, int threads, int min_blocks, const char *name_t, const char *params_t, const char *impl_t,
                  const char *const *kv, int emu) {
  cg_buf nm, pr, im;
  cg_buf_init(&nm);
  cg_buf_init(&pr);
  cg_buf_init(&im);
  cg_subst(&nm, name_t, kv);
  cg_subst(&pr, params_t, kv);
  cg_subst(&im, impl_t, kv);
  if (nm.oom || pr.oom || im.oom) {
    b->oom = 1;
  } else {
    char bounds[32];
    snprintf(bounds, sizeof bounds, min_blocks > 0 ? "%d, %d" : "%d", threads, min_blocks);
    cg_printf(b, "extern \"C\" __global__ void __launch_bounds__(%s) %s(%s) {\n  %s(", bounds, nm.s, pr.s, im.s);
    cg_buf call, un; /* the call's arguments, and the trampoline's unpacking */
    cg_buf_init(&call);
    cg_buf_init(&un);
    const char *p = pr.s;
    for (int i = 0; *p; i++) {
      const char *c = strchr(p, ',');
      size_t n = c ? (size_t)(c - p) : strlen(p);
      char type[128], pname[64];
      if (split_param(p, n, type, sizeof type, pname, sizeof pname) == 0) {
        cg_printf(&call, "%s%s", i ? ", " : "", pname);
        cg_printf(&un, "%s*(%s *)a[%d]", i ? ", " : "", type, i);
      } else {
        b->oom = 1; /* a malformed template: make the generator fail loudly */
      }
      p += n + (c ? 1 : 0);
    }
    cg_printf(b, "%s);\n}\n", call.s ? call.s : "");
    if (emu) cg_printf(b, "extern \"C\" void emu_%s(void **a) { %s(%s); }\n", nm.s, nm.s, un.s ? un.s : "");
    cg_buf_free(&call);
    cg_buf_free(&un);
  }
  cg_buf_free(&nm);
  cg_buf_free(&pr);
  cg_buf_free(&im);
}

char *cg_emit(cg_family f, const cg_variant *v, int emu) {
  static const cg_variant none = {0, 0};
  if (!v) v = &none;
  if (cg_variant_ok(f, v) != 0) return NULL;
  char mod[64];
  cg_module_name(f, v, mod, sizeof mod);
  cg_buf b;
  cg_buf_init(&b);
  cg_printf(&b, "// moec generated CUDA C, module %s (codegen/cg_%s.c). Regenerate, do not edit.\n", mod,
            cg_family_name(f));
  if (emu) cg_puts(&b, emu_prelude);
  cg_puts(&b, prelude);
  cg_printf(&b,
            "\n// Launch shapes and codes shared with the host (codegen/cg_kernels.h, cpu_kernels.h).\n"
            "enum { CK_EINDEX = %d };\n"
            "enum { NT_EW = %d, NT_ROW = %d, NT_RED = %d, NT_ROUTE = %d, NT_CE = %d, NT_MX = %d };\n"
            "enum { COLSUM_ROWS = %d, ROUTE_CHUNK = %d, MAX_E = %d, CE_ROWS = %d, GN_PARTS = %d };\n\n",
            CK_EINDEX, CG_NT_EW, CG_NT_ROW, CG_NT_RED, CG_NT_ROUTE, CG_NT_CE, CG_NT_MX, CG_COLSUM_ROWS,
            CG_ROUTE_CHUNK, CG_MAX_E, CG_CE_ROWS, CG_GN_PARTS);
  /* names the cubin: found by cuModuleGetGlobal, and by the CPU emulator (scripts/cuda_emu) */
  cg_printf(&b, "extern \"C\" __device__ const char moec_module[] = \"moec-module:%s\";\n\n", mod);
  families[f].emit(&b, v, emu);
  return cg_buf_take(&b);
}
