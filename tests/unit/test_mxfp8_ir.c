/* test_mxfp8_ir.c -- MXFP8 at the IR level: mxfp8_quantize / mxfp8_dequantize graphs run on
 * the CPU executor give exactly the values the OCP MX rules say (scale 2^ceil(log2(amax/448)),
 * E4M3 round-to-nearest-even), for zeros, E4M3 subnormals, 448 and just above, inf, NaN, an
 * all-zero block, negative values, and scale sharing in 128-aligned mode; column blocks and
 * blocks that restart at each expert group (the weight-gradient orientation); and the shape
 * rules of the two ops; the weight-tile quantize (128 x 128 squares). (tests/unit/test_ck_numerics.c covers the element conversions.)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ck_grouped.h"
#include "cpu_exec.h"
#include "ir.h"
#include "params.h"

#include "check.h"

static const ir_loc L = {"test.moe", 1, 1};

/* x (param f32[rows, cols]) -> mxfp8_quantize {axis, share128} -> mxfp8_dequantize (f32);
 * returns the dequantized values in out. */
static void qdq_graph(const float *x, int64_t rows, int64_t cols, int axis, int share, float *out) {
  ir_graph *g = ir_graph_new("mx");
  ir_attr pa[] = {ir_attr_str("name", "x"), ir_attr_str("init", "zeros")};
  int p = ir_add_typed(g, OP_PARAM, NULL, 0, pa, 2, (ir_type){DT_F32, 2, {rows, cols, 0, 0}}, L);
  ir_attr qa[] = {ir_attr_int("block", 32), ir_attr_int("axis", axis), ir_attr_int("share128", share)};
  int q = ir_add(g, OP_MXFP8_QUANTIZE, &p, 1, qa, 3, L);
  CHECK(q >= 0 && g->nodes[q].type.dtype == DT_E4M3, "quantize: %s", g->err);
  int d = ir_add_typed(g, OP_MXFP8_DEQUANTIZE, &q, 1, NULL, 0, (ir_type){DT_F32, 2, {rows, cols, 0, 0}}, L);
  CHECK(d >= 0, "dequantize: %s", g->err);
  g->outputs[0] = d;
  g->n_outputs = 1;
  rt_params *ps = rt_params_new(g, 1);
  memcpy(ps->p[0].w, x, (size_t)(rows * cols) * sizeof(float));
  char err[256];
  cpu_exec *ex = cpu_exec_new(g, ps, err, sizeof err);
  CHECK(ex != NULL, "exec: %s", err);
  cpu_exec_keep_all(ex, 1);
  float o[1];
  CHECK(cpu_exec_run(ex, NULL, NULL, 0, o, NULL, err, sizeof err) == 0, "run: %s", err);
  int64_t n;
  const float *v = cpu_exec_value(ex, d, &n);
  CHECK(v && n == rows * cols, "no value");
  if (v) memcpy(out, v, (size_t)n * sizeof(float));
  cpu_exec_free(ex);
  rt_params_free(ps);
  ir_graph_free(g);
}

static int same(float a, float b) { return (isnan(a) && isnan(b)) || a == b; }

static void test_special_values(void) {
  enum { C = 32 * 8 };
  float x[C], y[C];
  for (int i = 0; i < C; i++) x[i] = 0;
  /* block 0: amax 448 -> scale 2^0; E4M3 subnormals 2^-9 (kept), 2^-10 (tie -> 0), 3*2^-10 (tie -> 2^-8) */
  x[0] = 448, x[1] = 0x1p-9f, x[2] = 0x1p-10f, x[3] = 3 * 0x1p-10f, x[4] = -0.0f, x[5] = 1.0f, x[6] = 17.0f;
  /* block 1: amax 449 -> scale 2: 449 -> 224.5 -> 224 -> 448; 448 -> 224 -> 448; -300 -> -150 -> -144 -> -288 */
  x[32] = 449, x[33] = 448, x[34] = -300;
  /* block 2: an inf makes the block NaN; block 3: a NaN too */
  x[64] = INFINITY, x[65] = 1.0f;
  x[96] = NAN, x[97] = 2.0f;
  /* block 4: all zero (scale code 0) */
  /* block 5: negatives mirror positives */
  x[160] = -448, x[161] = -0x1p-9f, x[162] = -17.0f, x[163] = 17.0f;
  /* block 6: tiny values only: the scale goes down (amax 2^-20 -> scale 2^-28), they stay exact */
  x[192] = 0x1p-20f, x[193] = 0x1.8p-21f;
  /* block 7: amax 1 -> scale 2^-8 (448 * 2^-8 = 1.75 >= 1): 1/3 -> 85.33 -> 88 -> 0.34375 */
  x[224] = 1.0f, x[225] = 1.0f / 3.0f;
  qdq_graph(x, 1, C, 1, 0, y);
  const struct {
    int i;
    float want;
    const char *what;
  } cases[] = {
      {0, 448, "448 exact"}, {1, 0x1p-9f, "smallest E4M3 subnormal"}, {2, 0, "2^-10 ties to 0"},
      {3, 0x1p-8f, "3*2^-10 ties to even 2^-8"}, {5, 1.0f, "1 exact"}, {6, 16.0f, "17 -> 16 (spacing 2)"},
      {32, 448, "449 -> 448 with scale 2"}, {33, 448, "448 with scale 2"}, {34, -288, "-300 -> -288 with scale 2"},
      {64, NAN, "inf -> NaN block"}, {65, NAN, "inf's block is NaN"}, {96, NAN, "NaN"}, {97, NAN, "NaN's block is NaN"},
      {128, 0, "all-zero block"}, {160, -448, "-448"}, {161, -0x1p-9f, "-2^-9"}, {162, -16.0f, "-17 -> -16"},
      {163, 16.0f, "17 -> 16"}, {192, 0x1p-20f, "2^-20 with its own small scale"}, {193, 0x1.8p-21f, "1.5*2^-21"},
      {224, 1.0f, "1 with scale 2^-8"}, {225, 0.34375f, "1/3 -> 0.34375"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    CHECK(same(y[cases[k].i], cases[k].want), "%s: x[%d] = %a gives %a, want %a", cases[k].what, cases[k].i,
          (double)x[cases[k].i], (double)y[cases[k].i], (double)cases[k].want);
  CHECK(signbit(y[4]) && y[4] == 0, "-0 keeps its sign");
  for (int i = 128; i < 160; i++) CHECK(y[i] == 0, "all-zero block: y[%d] = %g", i, (double)y[i]);
  for (int i = 64; i < 128; i++) CHECK(isnan(y[i]), "non-finite blocks are NaN: y[%d] = %g", i, (double)y[i]);
  printf("  special values: zeros, subnormals, 448 and above, inf, NaN, all-zero block, negatives ok\n");
}

static void test_share128(void) {
  enum { C = 256 };
  float x[2 * C], y32[2 * C], y128[2 * C];
  for (int i = 0; i < 2 * C; i++) x[i] = 0.001f * (float)((i * 37) % 11 - 5);
  x[3] = 1000.0f; /* in the first 32-block of the first 128 */
  qdq_graph(x, 2, C, 1, 0, y32);
  qdq_graph(x, 2, C, 1, 1, y128);
  /* block 32: elements of the other three blocks keep their own scale; 128: they share 1000's
   * scale 2^2 (1000 / 448 in (2, 4]) and 0.005 / 4 is below E4M3's smallest subnormal */
  int lost = 0, kept = 1;
  for (int i = 32; i < 128; i++) {
    if (x[i] != 0 && y128[i] == 0) lost++;
    if (x[i] != 0 && fabsf(y32[i] - x[i]) > 0.07f * fabsf(x[i])) kept = 0;
  }
  CHECK(lost > 0, "share128: small elements in the 128-group of a large one should flush to zero");
  CHECK(kept, "block 32: small elements keep ~3 significant bits");
  /* the defining property: within each 128, the scale of the 128's amax */
  for (int r = 0; r < 2; r++)
    for (int g = 0; g < C; g += 128) {
      float amax = 0;
      for (int i = 0; i < 128; i++) amax = fmaxf(amax, fabsf(x[r * C + g + i]));
      int ex;
      float f = frexpf(amax, &ex);
      int s = f <= 0.875f ? ex - 9 : ex - 8;
      for (int i = 0; i < 128; i++) {
        float v = x[r * C + g + i], want = ldexpf(ck_e4m3_to_float(ck_float_to_e4m3(ldexpf(v, -s))), s);
        CHECK(y128[r * C + g + i] == want, "share128 r%d c%d: %g, want %g", r, g + i, (double)y128[r * C + g + i],
              (double)want);
      }
    }
  printf("  share128: one scale per 128 from its amax; small neighbours of a large value flush (%d here)\n", lost);
}

static void test_columns_and_groups(void) {
  /* column blocks (axis 0) equal row blocks of the transpose */
  enum { R = 64, C = 8 };
  float x[R * C], xt[C * R], y[R * C], yt[C * R];
  for (int i = 0; i < R * C; i++) x[i] = sinf(0.37f * (float)i) * (float)(1 + i % 7);
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) xt[c * R + r] = x[r * C + c];
  qdq_graph(x, R, C, 0, 0, y);
  qdq_graph(xt, C, R, 1, 0, yt);
  int ok = 1;
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) ok &= y[r * C + c] == yt[c * R + r];
  CHECK(ok, "axis 0 is the transpose of axis 1");
  /* blocks restarting at each expert's rows: counts {5, 0, 40, 19}: as quantizing each group
   * alone, its last block short */
  const int32_t counts[4] = {5, 0, 40, 19};
  int64_t dims[2] = {R, C};
  float g[R * C], part[R * C];
  CHECK(ck_mxfp8_qdq(x, g, 2, dims, 0, 32, 0, counts, 4) == CK_OK, "grouped qdq");
  int64_t off = 0;
  ok = 1;
  for (int e = 0; e < 4; e++) {
    int64_t d[2] = {counts[e], C};
    if (counts[e]) CHECK(ck_mxfp8_qdq(x + off * C, part, 2, d, 0, 32, 0, NULL, 0) == CK_OK, "group %d", e);
    for (int64_t i = 0; i < counts[e] * C; i++) ok &= part[i] == g[off * C + i];
    off += counts[e];
  }
  CHECK(ok, "grouped column blocks equal quantizing each group alone");
  const int32_t bad[4] = {5, 0, 40, 18};
  CHECK(ck_mxfp8_qdq(x, g, 2, dims, 0, 32, 0, bad, 4) == CK_EINDEX, "counts not adding up to the rows");
  printf("  column blocks and per-expert groups ok\n");
}

/* Weight tiles: each 128 x 128 square under the scale of its amax, the same values whichever
 * axis; equal to quantizing the square's 16384 elements as one group; a NaN makes its square
 * NaN and leaves the others; sides not multiples of 128 are refused. */
static void test_tiles(void) {
  enum { E = 2, A = 256, B = 384 };
  float *x = malloc(sizeof(float) * E * A * B), *y = malloc(sizeof(float) * E * A * B), *sq = malloc(sizeof(float) * 128 * 128);
  uint8_t *q = malloc(128 * 128);
  for (int i = 0; i < E * A * B; i++) x[i] = sinf(0.011f * (float)i) * (float)(1 + (i / 128) % 9) * 0.3f;
  x[(1 * A + 3) * B + 200] = 1e4f; /* square (1, 0, 1): its small values flush */
  x[(0 * A + 200) * B + 10] = NAN;  /* square (0, 1, 0) */
  CHECK(ck_mxfp8_qdq_tiles(x, y, E, A, B, 128) == CK_OK, "qdq_tiles");
  int ok = 1, nan_ok = 1;
  for (int e = 0; e < E; e++)
    for (int i = 0; i < A; i += 128)
      for (int j = 0; j < B; j += 128) {
        for (int r = 0; r < 128; r++) memcpy(sq + r * 128, x + (e * A + i + r) * B + j, 128 * sizeof(float));
        uint8_t code = ck_mxfp8_quantize_group(sq, 128 * 128, q);
        for (int r = 0; r < 128; r++)
          for (int c = 0; c < 128; c++) {
            float got = y[(e * A + i + r) * B + j + c];
            if (code == 0xFF) nan_ok &= isnan(got) != 0;
            else ok &= got == ldexpf(ck_e4m3_to_float(q[r * 128 + c]), (int)code - 127);
          }
        if (e == 0 && i == 128 && j == 0) CHECK(code == 0xFF, "the NaN square's code is 0xFF");
        else CHECK(code != 0xFF, "square (%d, %d, %d) is finite", e, i / 128, j / 128);
      }
  CHECK(ok && nan_ok, "each square is one group under its amax's scale");
  /* as a graph: the quantize along axis 1 and along axis 2 give the same values */
  ir_graph *g = ir_graph_new("tiles");
  ir_attr pa[] = {ir_attr_str("name", "w"), ir_attr_str("init", "zeros")};
  int p = ir_add_typed(g, OP_PARAM, NULL, 0, pa, 2, (ir_type){DT_F32, 3, {E, A, B, 0}}, L);
  int outs[2];
  for (int ax = 1; ax <= 2; ax++) {
    ir_attr qa[] = {ir_attr_int("block", 32), ir_attr_int("axis", ax), ir_attr_int("share128", 1), ir_attr_int("tile", 128)};
    int qn = ir_add(g, OP_MXFP8_QUANTIZE, &p, 1, qa, 4, L);
    CHECK(qn >= 0, "tiled quantize along axis %d: %s", ax, g->err);
    outs[ax - 1] = ir_add_typed(g, OP_MXFP8_DEQUANTIZE, &qn, 1, NULL, 0, (ir_type){DT_F32, 3, {E, A, B, 0}}, L);
  }
  g->outputs[0] = outs[0];
  g->n_outputs = 1;
  rt_params *ps = rt_params_new(g, 1);
  memcpy(ps->p[0].w, x, sizeof(float) * E * A * B);
  char err[256];
  cpu_exec *cx = cpu_exec_new(g, ps, err, sizeof err);
  CHECK(cx != NULL, "exec: %s", err);
  cpu_exec_keep_all(cx, 1);
  float o[1];
  CHECK(cx && cpu_exec_run(cx, NULL, NULL, 0, o, NULL, err, sizeof err) == 0, "run: %s", err);
  int64_t n1 = 0, n2 = 0;
  const float *o1 = cx ? cpu_exec_value(cx, outs[0], &n1) : NULL, *o2 = cx ? cpu_exec_value(cx, outs[1], &n2) : NULL;
  int eq = o1 && o2 && n1 == E * A * B && n2 == n1;
  for (int i = 0; eq && i < E * A * B; i++) eq = same(o1[i], o2[i]) && same(o1[i], y[i]);
  CHECK(eq, "tiled quantizes along axis 1 and 2 hold the same values, ck_mxfp8_qdq_tiles'");
  cpu_exec_free(cx);
  rt_params_free(ps);
  /* shapes */
  int p2 = ir_add_typed(g, OP_PARAM, NULL, 0, pa, 1, (ir_type){DT_F32, 3, {E, A, 200, 0}}, L);
  ir_attr qa[] = {ir_attr_int("block", 32), ir_attr_int("axis", 1), ir_attr_int("share128", 1), ir_attr_int("tile", 128)};
  CHECK(ir_add(g, OP_MXFP8_QUANTIZE, &p2, 1, qa, 4, L) < 0 && strstr(g->err, "multiples"), "%s", g->err);
  ir_attr q64[] = {ir_attr_int("block", 32), ir_attr_int("axis", 1), ir_attr_int("share128", 1), ir_attr_int("tile", 64)};
  CHECK(ir_add(g, OP_MXFP8_QUANTIZE, &p, 1, q64, 4, L) < 0 && strstr(g->err, "tile must be 0 or 128"), "%s", g->err);
  CHECK(ck_mxfp8_qdq_tiles(x, y, E, A, 200, 128) == CK_ESHAPE, "qdq_tiles accepted a side of 200");
  ir_graph_free(g);
  free(x), free(y), free(sq), free(q);
  printf("  weight tiles: one scale per 128 x 128 from its amax, the same either axis\n");
}

static void test_shape_rules(void) {
  ir_graph *g = ir_graph_new("mx");
  ir_attr pa[] = {ir_attr_str("name", "x")};
  int p = ir_add_typed(g, OP_PARAM, NULL, 0, pa, 1, (ir_type){DT_F32, 2, {4, 64, 0, 0}}, L);
  ir_attr bad_axis[] = {ir_attr_int("block", 32), ir_attr_int("axis", 2)};
  CHECK(ir_add(g, OP_MXFP8_QUANTIZE, &p, 1, bad_axis, 2, L) < 0 && strstr(g->err, "axis 2 is not a dimension"), "%s", g->err);
  ir_attr bad_share[] = {ir_attr_int("block", 96), ir_attr_int("axis", 1), ir_attr_int("share128", 1)};
  CHECK(ir_add(g, OP_MXFP8_QUANTIZE, &p, 1, bad_share, 3, L) < 0 && strstr(g->err, "divides 128"), "%s", g->err);
  CHECK(ir_add_typed(g, OP_MXFP8_DEQUANTIZE, &p, 1, NULL, 0, (ir_type){DT_F32, 2, {4, 64, 0, 0}}, L) < 0 &&
            strstr(g->err, "e4m3"),
        "%s", g->err);
  ir_graph_free(g);
}

int main(void) {
  test_special_values();
  test_share128();
  test_columns_and_groups();
  test_tiles();
  test_shape_rules();
  if (failures) {
    printf("test_mxfp8_ir: %d failures\n", failures);
    return 1;
  }
  printf("test_mxfp8_ir: MXFP8 quantize/dequantize ops follow the OCP MX rules\n");
  return 0;
}
