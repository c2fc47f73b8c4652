/* cg_mxfp8_tiles.c -- the weight-tile recipe's quantize (mxfp8(block = 128, weight_tile =
 * 128)), appended to the mxfp8 module (it uses that module's E4M3/E8M0 helpers): E expert
 * weights (A, B) cut into 128 x 128 squares, each square's elements under one E8M0 scale from
 * its amax (ck_mxfp8_qdq_tiles is the reference). */
#include "cg_family.h"

static const char *const src =
    "\n"
    "// A block of WT_NT threads takes a square (block b: expert b / (nA nB), square row b / nB % nA,\n"
    "// column b % nB); thread t's chunks are 8 columns, 8 (t % 16) .., of rows t / 16 + 16 k,\n"
    "// k < WT_CH (a warp: two rows of the square's 128 columns, 256-byte lines of bf16), loaded\n"
    "// back to back as raw bits before any is used.\n"
    "constexpr int WT = 128, WT_NT = 256, WT_CH = WT * WT / 8 / WT_NT;\n"
    "// q: the E4M3 bytes, (E, A, B) as the weight (tr = 0) or transposed, (E, B, A) (tr = 1);\n"
    "// codes: the E8M0 code of each block of BLOCK along the rows of q, (E A, B / BLOCK) or\n"
    "// (E B, A / BLOCK), as mxfp8_quantize writes them for q's rows; blk: the f32 scales of\n"
    "// cuBLASLt's 128 x 128 block mode for each expert's (N, K) = q's matrix, seg floats an\n"
    "// expert, (N / 128) rows of K / 128 rounded up to 4 (TE's GEMM-ready layout, which the\n"
    "// H200's cuBLASLt reads; test_gpu_tiles). x: 16-byte aligned, rb:\n"
    "// each value rounded to bf16 first (a cast the quantize reads through).\n"
    "template <class T>\n"
    "__device__ void mxfp8_quantize_tiles(const T *x, i64 A, i64 B, int rb, int tr, i64 seg, u8 *q, u8 *codes,\n"
    "                                     float *blk) {\n"
    "  __shared__ u32 sq[WT][WT / 4 + 1]; // (tr) the square's bytes as words, a word of padding a row\n"
    "  __shared__ u32 sh[WT_NT / 32];\n"
    "  const i64 nA = A / WT, nB = B / WT, e = blockIdx.x / (nA * nB), ta = blockIdx.x / nB % nA, tb = blockIdx.x % nB;\n"
    "  const int r0 = threadIdx.x / 16, c0 = threadIdx.x % 16 * 8, lane = threadIdx.x & 31;\n"
    "  const T *p = x + e * A * B + (ta * WT + r0) * B + tb * WT + c0;\n"
    "  bits8<T> b[WT_CH];\n"
    "#pragma unroll\n"
    "  for (int k = 0; k < WT_CH; k++) ld_bits8(p + (i64)16 * k * B, b[k]);\n"
    "  float v[WT_CH][8];\n"
    "  u32 amax = 0;\n"
    "#pragma unroll\n"
    "  for (int k = 0; k < WT_CH; k++)\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < 8; j++) v[k][j] = bits8_at(b[k], j, rb), amax = umax(amax, abs_bits(v[k][j]));\n"
    "#pragma unroll\n"
    "  for (int o = 16; o > 0; o >>= 1) amax = umax(amax, __shfl_xor_sync(0xffffffffu, amax, o));\n"
    "  if (lane == 0) sh[threadIdx.x / 32] = amax;\n"
    "  __syncthreads();\n"
    "  amax = 0;\n"
    "#pragma unroll\n"
    "  for (int w = 0; w < WT_NT / 32; w++) amax = umax(amax, sh[w]);\n"
    "  const int code = e8m0_for_bits(amax);\n"
    "  float mul[8];\n"
    "  int cd[8];\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < 8; j++) mul[j] = e8m0_mul(code), cd[j] = code;\n"
    "#pragma unroll\n"
    "  for (int k = 0; k < WT_CH; k++) {\n"
    "    u32 w[2];\n"
    "    e4m3_pack<8>(v[k], mul, cd, w);\n"
    "    const i64 r = ta * WT + r0 + 16 * k;\n"
    "    if (!tr) {\n"
    "      *(unsigned long long *)(q + e * A * B + r * B + tb * WT + c0) = (unsigned long long)w[1] << 32 | w[0];\n"
    "      if (c0 % BLOCK == 0) codes[(e * A + r) * (B / BLOCK) + (tb * WT + c0) / BLOCK] = (u8)code;\n"
    "    } else {\n"
    "      sq[r0 + 16 * k][c0 / 4] = w[0];\n"
    "      sq[r0 + 16 * k][c0 / 4 + 1] = w[1];\n"
    "    }\n"
    "  }\n"
    "  if (tr) { // thread t writes column t / 2 of the square as 64 bytes of a row of q: rows 64 (t % 2) ..\n"
    "    __syncthreads();\n"
    "    const int c = threadIdx.x / 2, rh = threadIdx.x % 2 * 64;\n"
    "    u32x4 o[4];\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 16; i++) {\n"
    "      u32 word = 0;\n"
    "#pragma unroll\n"
    "      for (int y = 0; y < 4; y++) word |= (sq[rh + 4 * i + y][c / 4] >> (8 * (c % 4)) & 0xFFu) << (8 * y);\n"
    "      o[i / 4].w[i % 4] = word;\n"
    "    }\n"
    "    const i64 row = e * B + tb * WT + c;\n"
    "    u32x4 *dst = (u32x4 *)(q + row * A + ta * WT + rh);\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 4; i++) dst[i] = o[i];\n"
    "    for (int j = 0; j < 64; j += BLOCK) codes[row * (A / BLOCK) + (ta * WT + rh + j) / BLOCK] = (u8)code;\n"
    "  }\n"
    "  if (threadIdx.x == 0) {\n"
    "    const i64 nb = tr ? tb : ta, kb = tr ? ta : tb, ldk = ((tr ? nA : nB) + 3) / 4 * 4;\n"
    "    blk[e * seg + nb * ldk + kb] = code == 0xFF ? __uint_as_float(0x7fc00000u) : pow2f(code - 127);\n"
    "  }\n"
    "}\n";

_Static_assert(CG_NT_MX == 256, "the tile kernel's WT_NT is the block size");

void cg_emit_mxfp8_tiles(cg_buf *b, int emu) {
  cg_puts(b, src);
  const char *kv[9];
  for (int x = 0; x < CG_DT_COUNT; x++) {
    cg_dtype_kv(kv, (cg_dtype)x, (cg_dtype)x);
    cg_entry(b, CG_NT_MX, "moec_mxfp8_quantize_tiles_${x}",
             "const ${X} *x, i64 A, i64 B, int rb, int tr, i64 seg, u8 *q, u8 *codes, float *blk",
             "mxfp8_quantize_tiles<${X}>", kv, emu);
  }
}
