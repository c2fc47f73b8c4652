/* test_ck_numerics.c -- bf16 rounding, FP8 E4M3 and MXFP8 (ck_numerics.c): known values,
 * and bit-exact agreement with brute-force references (nearest representable value found
 * by search, ties to the even code). */
#include <float.h>

#include "ck_test.h"

static float bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t f_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* ---- bf16 ---- */

/* Nearest bf16 by comparing the two neighbours in double; a tie goes to the even one. */
static float naive_bf16(float x) {
  uint32_t u = f_bits(x);
  float lo = bits_f(u & 0xFFFF0000u), hi = bits_f((u & 0xFFFF0000u) + 0x10000u); /* |lo| <= |x| */
  /* above the largest bf16 the next value is inf; for the distance it counts as 2^128 */
  double hd = isinf(hi) ? copysign(0x1p128, x) : hi;
  double dl = fabs((double)x - lo), dh = fabs(hd - x);
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (f_bits(lo) >> 16) & 1 ? hi : lo;
}

static void test_bf16(void) {
  printf("bf16 rounding (ties to even):\n");
  struct {
    float in, want;
    const char *what;
  } known[] = {
      {1.0f, 1.0f, "1"},
      {1.0f + 0x1p-8f, 1.0f, "1 + 2^-8 (tie) -> 1"},
      {1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f, "1 + 3*2^-8 (tie) -> 1 + 2^-6"},
      {1.0f + 0x1p-8f + 0x1p-20f, 1.0f + 0x1p-7f, "1 + 2^-8 + 2^-20 -> 1 + 2^-7"},
      {-(1.0f + 0x1p-8f), -1.0f, "-(1 + 2^-8) -> -1"},
      {bits_f(0x7F7F0000u), bits_f(0x7F7F0000u), "bf16 max stays"},
      {bits_f(0x7F7F7FFFu), bits_f(0x7F7F0000u), "below the max/inf midpoint -> max"},
      {FLT_MAX, INFINITY, "FLT_MAX -> inf"},
      {INFINITY, INFINITY, "inf"},
      {-INFINITY, -INFINITY, "-inf"},
      {0x1p-133f, 0x1p-133f, "smallest bf16 denormal 2^-133 stays"},
      {0x1p-149f, 0.0f, "2^-149 -> 0"},
      {1.5f * 0x1p-133f, 0x1p-132f, "1.5*2^-133 (tie) -> 2^-132"},
      {0x1p-126f + 0x1p-134f, 0x1p-126f, "denormal boundary"},
  };
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
    float x = known[i].in;
    ck_round_bf16(&x, 1);
    CHECK(f_bits(x) == f_bits(known[i].want), "bf16 %s: got %a want %a", known[i].what, x,
          known[i].want);
    printf("  %-40s %a\n", known[i].what, x);
  }
  float nans[3] = {NAN, bits_f(0x7F800001u) /* signaling, payload in the low bits */, -NAN};
  ck_round_bf16(nans, 3);
  CHECK(isnan(nans[0]) && isnan(nans[1]) && isnan(nans[2]) && signbit(nans[2]) &&
            (f_bits(nans[1]) & 0x00400000u),
        "bf16 NaN handling");
  printf("  NaN, signalling NaN 0x7f800001 (would truncate to inf), -NaN: quiet NaN, sign kept\n");
  int bad = 0;
  for (int i = 0; i < 1000000; i++) {
    uint32_t u = (uint32_t)rng_u64();
    float x = bits_f(u);
    if (isnan(x)) continue;
    float y = x;
    ck_round_bf16(&y, 1);
    uint16_t b = ck_float_to_bf16(x);
    if (f_bits(y) != f_bits(naive_bf16(x)) || f_bits(ck_bf16_to_float(b)) != f_bits(y)) bad++;
  }
  CHECK(bad == 0, "bf16: %d of 1e6 random bit patterns differ from the brute-force reference", bad);
  printf("  1e6 random fp32 bit patterns against the nearest-neighbour reference: %d differ\n",
         bad);
}

/* ---- E4M3 ---- */

/* Decoding from the OCP table: E = 0: M 2^-9; E in 1..15: (1 + M/8) 2^(E-7); S.1111.111 NaN. */
static double naive_e4m3(uint8_t b) {
  int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  double v = e == 0 ? m * 0x1p-9 : (1.0 + m / 8.0) * pow(2.0, e - 7);
  return s ? -v : v;
}
/* Nearest finite code by search (so beyond 448 it is ±448); ties to the even code. */
static uint8_t naive_to_e4m3(double x) {
  if (isnan(x)) return signbit(x) ? 0xFF : 0x7F;
  static double table[256];
  static int init = 0;
  for (int c = 0; c < 256 && !init; c++) table[c] = naive_e4m3((uint8_t)c);
  init = 1;
  int best = -1;
  double bd = INFINITY;
  for (int c = 0; c < 256; c++) {
    double v = table[c];
    if (isnan(v) || (signbit(v) != signbit(x))) continue; /* keep the sign, zero included */
    double d = fabs(v - x);
    if (d < bd || (d == bd && (c & 1) == 0)) bd = d, best = c;
  }
  return (uint8_t)best;
}

static void test_e4m3(void) {
  printf("E4M3 (OCP FP8, E4M3FN):\n");
  int bad = 0;
  for (int c = 0; c < 256; c++) {
    double want = naive_e4m3((uint8_t)c);
    float got = ck_e4m3_to_float((uint8_t)c);
    if (isnan(want) ? !isnan(got) : (double)got != want) bad++;
    if (!isnan(want) && ck_float_to_e4m3((float)want) != c) bad++;
  }
  CHECK(bad == 0, "E4M3: %d codes fail decode or round trip", bad);
  printf("  all 256 codes against the OCP table, decode and round trip: %d failures\n", bad);
  struct {
    float in;
    uint8_t want;
    const char *what;
  } known[] = {
      {448.0f, 0x7E, "448 (max)"},
      {-448.0f, 0xFE, "-448"},
      {464.0f, 0x7E, "464 (tie with the missing 480) -> 448"},
      {1e6f, 0x7E, "1e6 saturates to 448"},
      {INFINITY, 0x7E, "inf saturates to 448 (satfinite)"},
      {-INFINITY, 0xFE, "-inf -> -448"},
      {NAN, 0x7F, "NaN -> 0x7f"},
      {0x1p-6f, 0x08, "2^-6 smallest normal"},
      {0x1p-9f, 0x01, "2^-9 smallest subnormal"},
      {7 * 0x1p-9f, 0x07, "7*2^-9 largest subnormal"},
      {0x1p-10f, 0x00, "2^-10 (tie with 0) -> 0"},
      {3 * 0x1p-11f, 0x01, "3*2^-11 -> 2^-9"},
      {15 * 0x1p-10f, 0x08, "7.5*2^-9 (tie) -> 2^-6"},
      {-0.0f, 0x80, "-0"},
      {1.0625f, 0x38, "1 + 2^-4 (tie) -> 1"},
      {1.1875f, 0x3A, "1 + 3*2^-4 (tie) -> 1.25"},
  };
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
    uint8_t got = ck_float_to_e4m3(known[i].in);
    CHECK(got == known[i].want, "e4m3 %s: got 0x%02x want 0x%02x", known[i].what, got,
          known[i].want);
    printf("  %-40s 0x%02x\n", known[i].what, got);
  }
  bad = 0;
  for (int i = 0; i < 200000; i++) {
    float x = (float)((rng_unit() * 2 - 1) * pow(2.0, rng_unit() * 24 - 14)); /* 2^-14 .. 2^10 */
    if (ck_float_to_e4m3(x) != naive_to_e4m3(x)) bad++;
  }
  CHECK(bad == 0, "e4m3: %d of 2e5 random values differ from the nearest-code search", bad);
  printf("  2e5 random values, |x| in 2^-14..2^10, against the nearest-code search: %d differ\n",
         bad);
}

/* ---- MXFP8 ---- */

/* The scale exponent by search: the smallest s >= -127 with amax <= 448 * 2^s. */
static int naive_scale_exp(double amax) {
  int s = -127;
  while (amax > 448.0 * pow(2.0, s)) s++;
  return s;
}
/* Whole-tensor reference quantizer: codes and scales. */
static void naive_mx(const float *x, int64_t rows, int64_t cols, int64_t block, int share,
                     uint8_t *q, uint8_t *sc) {
  int64_t group = share ? 128 : block;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t g = 0; g < cols; g += group) {
      double amax = 0.0;
      int nonfinite = 0;
      for (int64_t i = g; i < g + group; i++) {
        nonfinite |= !isfinite(x[r * cols + i]);
        amax = fmax(amax, fabs(x[r * cols + i]));
      }
      int s = nonfinite ? 0 : naive_scale_exp(amax);
      for (int64_t i = g; i < g + group; i++)
        q[r * cols + i] = nonfinite ? 0x7F : naive_to_e4m3(x[r * cols + i] / pow(2.0, s));
      for (int64_t b = g / block; b < (g + group) / block; b++)
        sc[r * (cols / block) + b] = nonfinite ? 0xFF : (uint8_t)(s + 127);
    }
}

static void show_block(const char *what, const float *x, int n, const uint8_t *q, uint8_t sc) {
  printf("  %-34s scale 0x%02x (2^%d), codes", what, sc, sc == 0xFF ? 0 : sc - 127);
  for (int i = 0; i < n; i++) printf(" %g->%02x", x[i], q[i]);
  printf("\n");
}

static void test_mxfp8_known(void) {
  printf("MXFP8 (block 32) special blocks:\n");
  enum { C = 32 };
  float x[C], y[C];
  uint8_t q[C], sc;

  for (int i = 0; i < C; i++) x[i] = 0.0f;
  ck_mxfp8_quantize(x, 1, C, C, 0, q, &sc);
  int ok = sc == 0;
  for (int i = 0; i < C; i++) ok &= q[i] == 0;
  ck_mxfp8_dequantize(q, &sc, 1, C, C, y);
  for (int i = 0; i < C; i++) ok &= y[i] == 0.0f;
  CHECK(ok, "all-zero block: scale code 0, zero codes, zero values");
  show_block("all-zero block", x, 2, q, sc);

  fill(x, C, -100, 100);
  x[7] = 448.0f, x[3] = 0x1p-8f, x[4] = 0x1p-10f, x[5] = -3 * 0x1p-11f;
  ck_mxfp8_quantize(x, 1, C, C, 0, q, &sc);
  CHECK(sc == 127 && q[7] == 0x7E && q[3] == 0x02 && q[4] == 0x00 && q[5] == 0x81,
        "amax exactly 448: scale 2^0, 448 -> 0x7e, subnormals 2^-8 -> 0x02, 2^-10 -> 0, "
        "-3*2^-11 -> 0x81 (got scale %02x, %02x %02x %02x %02x)",
        sc, q[7], q[3], q[4], q[5]);
  show_block("amax = 448, subnormal elements", x + 3, 5, q + 3, sc);

  x[7] = 449.0f, x[8] = -448.0f, x[9] = 224.5f;
  ck_mxfp8_quantize(x, 1, C, C, 0, q, &sc);
  CHECK(sc == 128 && q[7] == 0x76 && q[8] == 0xF6 && q[9] == 0x6E,
        "amax 449: scale 2^1, 449 -> 224 (0x76), -448 -> -224, 224.5 -> 112 (0x6e) (got %02x %02x "
        "%02x %02x)",
        sc, q[7], q[8], q[9]);
  show_block("amax just above 448", x + 7, 3, q + 7, sc);

  for (int i = 0; i < C; i++) x[i] = -rng_float(1, 2) * 0x1p-20f;
  x[0] = -0x1p-20f * 2.0f; /* amax 2^-19 = 448 * 2^-27.8: s = -27 */
  ck_mxfp8_quantize(x, 1, C, C, 0, q, &sc);
  ok = sc == 127 - 27;
  for (int i = 0; i < C; i++) ok &= (q[i] & 0x80) != 0;
  CHECK(ok, "all-negative block: sign bits set, scale 2^-27 (got %02x)", sc);
  show_block("all negative, amax 2^-19", x, 2, q, sc);

  for (int i = 0; i < C; i++) x[i] = (float)(i + 1) * 1e-41f; /* fp32 subnormals */
  ck_mxfp8_quantize(x, 1, C, C, 0, q, &sc);
  ck_mxfp8_dequantize(q, &sc, 1, C, C, y);
  ok = sc == 0;
  for (int i = 0; i < C; i++) ok &= fabsf(y[i] - x[i]) <= 0.0625f * fabsf(x[i]) + 0x1p-137f;
  CHECK(ok, "fp32-subnormal block: scale clamps at 2^-127 (code %02x) and round-trips", sc);
  show_block("fp32 subnormals (scale clamps)", x + 30, 2, q + 30, sc);

  /* non-finite: the block's scale is NaN, its elements NaN; other blocks untouched */
  float z[3 * C];
  uint8_t qz[3 * C], sz[3];
  fill(z, 3 * C, -1, 1);
  z[5] = INFINITY, z[C + 9] = NAN;
  ck_mxfp8_quantize(z, 1, 3 * C, C, 0, qz, sz);
  float w[3 * C];
  ck_mxfp8_dequantize(qz, sz, 1, 3 * C, C, w);
  ok = sz[0] == 0xFF && sz[1] == 0xFF && sz[2] != 0xFF;
  for (int i = 0; i < 2 * C; i++) ok &= isnan(w[i]) && qz[i] == 0x7F;
  for (int i = 2 * C; i < 3 * C; i++) ok &= !isnan(w[i]);
  CHECK(ok, "inf and NaN blocks: scale 0xff, NaN elements; the next block is finite");
  printf("  block with inf -> scale 0x%02x, block with NaN -> 0x%02x, clean block -> 0x%02x\n",
         sz[0], sz[1], sz[2]);

  uint8_t qq[96], ss[3];
  CHECK(ck_mxfp8_quantize(z, 1, 96, 32, 1, qq, ss) == CK_ESHAPE, "share128 with cols 96");
  CHECK(ck_mxfp8_quantize(z, 1, 40, 32, 0, qq, ss) == CK_ESHAPE, "cols 40, block 32");
  CHECK(ck_mxfp8_dequantize(qq, ss, 1, 40, 32, w) == CK_ESHAPE, "dequantize cols 40");
  printf("  share128 with cols 96, and cols 40 with block 32: CK_ESHAPE\n");
}

static void test_mxfp8_random(int share) {
  enum { R = 16, C = 512, B = 32 };
  printf("MXFP8 random %dx%d, block 32%s:\n", R, C, share ? ", share128" : "");
  float *x = falloc(R * C), *y = falloc(R * C);
  uint8_t *q = malloc(R * C), *sc = malloc(R * C / B), *qn = malloc(R * C), *sn = malloc(R * C / B);
  for (int64_t b = 0; b < R * C / B; b++) { /* each block its own magnitude, 2^-30 .. 2^30 */
    double mag = pow(2.0, rng_int(61) - 30);
    for (int i = 0; i < B; i++) x[b * B + i] = (float)((rng_unit() * 2 - 1) * mag);
    if (b % 5 == 0) x[b * B + rng_int(B)] = (float)(448.0 * mag); /* amax on a power of two */
    if (b % 7 == 0) x[b * B + rng_int(B)] = (float)(449.0 * mag);
  }
  CHECK(ck_mxfp8_quantize(x, R, C, B, share, q, sc) == CK_OK, "quantize rc");
  naive_mx(x, R, C, B, share, qn, sn);
  int nq = 0, ns = 0;
  for (int64_t i = 0; i < R * C; i++) nq += q[i] != qn[i];
  for (int64_t i = 0; i < R * C / B; i++) ns += sc[i] != sn[i];
  CHECK(nq == 0 && ns == 0, "MXFP8: %d codes and %d scales differ from the search reference", nq,
        ns);
  printf("  against the reference (scale and nearest code by search): %d codes, %d scales differ\n",
         nq, ns);
  if (share) {
    int ok = 1;
    for (int64_t b = 0; b < R * C / B; b++) ok &= sc[b] == sc[b - b % 4];
    CHECK(ok, "share128: the four scales of each 128-group must be equal");
    printf("  share128: each 128-group's four block scales are equal\n");
  }
  CHECK(ck_mxfp8_dequantize(q, sc, R, C, B, y) == CK_OK, "dequantize rc");
  /* Bound: with s the scale exponent, y = x/2^s has |y| <= 448. In the normal range
   * (|y| >= 2^-6) nearest rounding with 3 mantissa bits errs by at most 2^-4 |y|; below it by
   * at most half the subnormal step, 2^-10. So |deq - x| <= max(2^-4 |x|, 2^(s-10)); and as
   * 2^s < amax/224 the second term is < 2^-17.8 amax: every error is <= 2^-4 of the amax. */
  int viol = 0;
  double worst_rel = 0.0, worst_amax = 0.0;
  for (int64_t r = 0; r < R; r++)
    for (int64_t c = 0; c < C; c++) {
      int64_t i = r * C + c, g = share ? 128 : B;
      int s = sc[i / B] - 127;
      double amax = 0.0;
      for (int64_t j = c - c % g; j < c - c % g + g; j++) amax = fmax(amax, fabs(x[r * C + j]));
      double err = fabs((double)y[i] - x[i]), bound = fmax(0.0625 * fabs(x[i]), ldexp(1.0, s - 10));
      viol += err > bound;
      if (fabs(x[i]) >= ldexp(1.0, s - 6)) worst_rel = fmax(worst_rel, err / fabs(x[i]));
      worst_amax = fmax(worst_amax, err / amax);
    }
  CHECK(viol == 0, "%d elements exceed max(2^-4 |x|, 2^(s-10))", viol);
  printf(
      "  round trip: |deq - x| <= max(2^-4 |x|, 2^(s-10)) for all %d values; worst relative\n"
      "  error in the normal range %.4f (bound 0.0625), worst error / amax %.4f (bound 0.0625)\n",
      R * C, worst_rel, worst_amax);
  free(x), free(y), free(q), free(sc), free(qn), free(sn);
}

int main(void) {
  double t0 = ck_now();
  printf(
      "test_ck_numerics: bf16, E4M3 and MXFP8 against known values and brute-force references\n");
  test_bf16();
  test_e4m3();
  test_mxfp8_known();
  test_mxfp8_random(0);
  test_mxfp8_random(1);
  return ck_finish("test_ck_numerics", t0);
}
