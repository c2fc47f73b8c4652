/* test_safetensors.c -- safetensors writer/reader, BF16 rounding, the strict JSON parser,
 * golden bytes, corruption cases and a fuzz loop over truncations and byte flips. */
#include "runtime/safetensors.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures;
#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                     \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)
#define CHECK_ERR(err, sub)                                                                        \
  do {                                                                                             \
    if (!strstr((err), (sub))) {                                                                   \
      fprintf(stderr, "%s:%d: error message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, (err),   \
              (sub));                                                                              \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)

static char tmpdir[256];

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static float f_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t u_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  long sz = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)sz + 1);
  *n = fread(b, 1, (size_t)sz, fp);
  fclose(fp);
  return b;
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  if (d) closedir(d);
  return n;
}

/* ---------------------------------------------------------------- bf16 */

/* reference: the nearer of the two bf16 neighbours, ties to the even one, in double */
static uint16_t bf16_ref(float f) {
  uint32_t u = u_of(f);
  if (isnan(f)) return 0;
  uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1); /* toward larger magnitude */
  double dl = fabs((double)f - (double)st_bf16_to_f32(lo));
  double xh = (lo & 0x7fff) == 0x7f7f ? ldexp(1.0, 128) * (f < 0 ? -1 : 1)
                                      : (double)st_bf16_to_f32(hi);
  double dh = fabs((double)f - xh);
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

static void test_bf16(void) {
  CHECK(st_f32_to_bf16(1.0f) == 0x3f80);
  CHECK(st_f32_to_bf16(-2.0f) == 0xc000);
  CHECK(st_f32_to_bf16(f_of(0x3f808000)) == 0x3f80); /* tie, even stays */
  CHECK(st_f32_to_bf16(f_of(0x3f818000)) == 0x3f82); /* tie, odd rounds up */
  CHECK(st_f32_to_bf16(f_of(0x3f808001)) == 0x3f81); /* above the tie */
  CHECK(st_f32_to_bf16(f_of(0x3f807fff)) == 0x3f80); /* below the tie */
  CHECK(st_f32_to_bf16(f_of(0x80000000)) == 0x8000); /* -0 */
  CHECK(st_f32_to_bf16(f_of(0x00008000)) == 0x0000); /* subnormal tie to even 0 */
  CHECK(st_f32_to_bf16(f_of(0x00018000)) == 0x0002); /* subnormal tie to even 2 */
  CHECK(st_f32_to_bf16(f_of(0x7f7fffff)) == 0x7f80); /* FLT_MAX rounds to +inf */
  CHECK(st_f32_to_bf16(f_of(0x7f7f7fff)) == 0x7f7f); /* stays finite */
  CHECK(st_f32_to_bf16(INFINITY) == 0x7f80);
  CHECK(st_f32_to_bf16(-INFINITY) == 0xff80);
  uint16_t qn = st_f32_to_bf16(f_of(0x7f800001)); /* sNaN with payload only in low bits */
  CHECK((qn & 0x7f80) == 0x7f80 && (qn & 0x7f) != 0);
  CHECK((st_f32_to_bf16(f_of(0xffc00000)) & 0x8000) && isnan(st_bf16_to_f32(st_f32_to_bf16(NAN))));
  CHECK(st_bf16_to_f32(0x3fc0) == 1.5f);
  for (int i = 0; i < 1000000; i++) {
    float f = f_of((uint32_t)rng());
    if (isnan(f)) continue;
    if (st_f32_to_bf16(f) != bf16_ref(f)) {
      fprintf(stderr, "bf16 rounding of 0x%08x: got 0x%04x want 0x%04x\n", u_of(f),
              st_f32_to_bf16(f), bf16_ref(f));
      failures++;
      break;
    }
  }
  /* every bf16 value survives f32 -> bf16 exactly */
  for (uint32_t h = 0; h < 65536; h++) {
    float f = st_bf16_to_f32((uint16_t)h);
    if (!isnan(f) && st_f32_to_bf16(f) != h) {
      fprintf(stderr, "bf16 0x%04x does not round-trip\n", h);
      failures++;
      break;
    }
  }
  /* f16 decode */
  CHECK(st_f16_to_f32(0x3c00) == 1.0f);
  CHECK(st_f16_to_f32(0xc000) == -2.0f);
  CHECK(st_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
  CHECK(st_f16_to_f32(0x7bff) == 65504.0f);
  CHECK(isinf(st_f16_to_f32(0x7c00)) && isnan(st_f16_to_f32(0x7e00)));
}

/* ---------------------------------------------------------------- JSON */

static void test_json(void) {
  char err[256];
  const char *ok = " {\"a\": [1, -2, 3.5, 1e3, -0, true, false, null], \"s\": \"x\\\"\\\\\\/\\b\\f"
                   "\\n\\r\\t\\u00e9\\ud83d\\ude00\xc3\xa9\", \"big\": 9223372036854775807, "
                   "\"min\": -9223372036854775808, \"over\": 9223372036854775808, \"e\": {}} \n";
  st_json *j = st_json_parse(ok, strlen(ok), err, sizeof err);
  CHECK(j != NULL);
  if (j) {
    const st_json *a = st_json_get(j, "a");
    CHECK(a && a->type == ST_JSON_ARR && a->n == 8);
    if (a && a->n == 8) {
      CHECK(a->items[0].type == ST_JSON_INT && a->items[0].i == 1);
      CHECK(a->items[1].type == ST_JSON_INT && a->items[1].i == -2);
      CHECK(a->items[2].type == ST_JSON_NUM && a->items[2].d == 3.5);
      CHECK(a->items[3].type == ST_JSON_NUM && a->items[3].d == 1000.0);
      CHECK(a->items[5].type == ST_JSON_BOOL && a->items[5].b == 1);
      CHECK(a->items[6].type == ST_JSON_BOOL && a->items[6].b == 0);
      CHECK(a->items[7].type == ST_JSON_NULL);
    }
    const st_json *s = st_json_get(j, "s");
    CHECK(s && s->type == ST_JSON_STR &&
          !strcmp(s->s, "x\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80\xc3\xa9"));
    CHECK(st_json_get(j, "big")->i == INT64_MAX);
    CHECK(st_json_get(j, "min")->i == INT64_MIN);
    CHECK(st_json_get(j, "over")->type == ST_JSON_NUM);
    CHECK(st_json_get(j, "e")->type == ST_JSON_OBJ && st_json_get(j, "e")->n == 0);
    CHECK(st_json_get(j, "nope") == NULL);
    st_json_free(j);
  }
  static const struct {
    const char *text, *msg;
  } bad[] = {
      {"", "unexpected end"},
      {"{", "unexpected end"},
      {"{\"a\":1,}", "trailing comma"},
      {"[1,]", "trailing comma"},
      {"{\"a\":1,\"a\":2}", "duplicate key"},
      {"{\"a\" 1}", "':' expected"},
      {"{a:1}", "object key"},
      {"[01]", "leading zero"},
      {"[1.]", "digit expected after '.'"},
      {"[1e]", "digit expected in exponent"},
      {"[-]", "invalid number"},
      {"[1e999]", "out of range"},
      {"[\"\\x\"]", "invalid escape"},
      {"[\"\\u12\"]", "bad hex digit"},
      {"[\"\\ud800\"]", "low surrogate"},
      {"[\"\\udc00\"]", "lone low surrogate"},
      {"[\"\\u0000\"]", "\\u0000"},
      {"[\"\xff\"]", "invalid UTF-8"},
      {"[\"\xc0\xaf\"]", "invalid UTF-8"},       /* overlong '/' */
      {"[\"\xed\xa0\x80\"]", "invalid UTF-8"},   /* encoded surrogate */
      {"[\"a\nb\"]", "control character"},
      {"[\"abc", "unterminated string"},
      {"[tru]", "unexpected character"},
      {"{} x", "trailing characters"},
      {"[1 2]", "',' or ']' expected"},
      {"// c\n{}", "unexpected character"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = 0;
    st_json *b = st_json_parse(bad[i].text, strlen(bad[i].text), err, sizeof err);
    CHECK(b == NULL);
    st_json_free(b);
    CHECK_ERR(err, bad[i].msg);
    CHECK_ERR(err, "byte ");
  }
  /* depth limit */
  char deep[300];
  memset(deep, '[', 100);
  memset(deep + 100, ']', 100);
  CHECK(st_json_parse(deep, 200, err, sizeof err) == NULL);
  CHECK_ERR(err, "nesting deeper");
  CHECK((j = st_json_parse(deep + 36, 128, err, sizeof err)) != NULL); /* 64 levels is fine */
  st_json_free(j);
  /* quoting */
  char q[64];
  CHECK(st_json_quote("a\"b\\c\n\x01", q, sizeof q) == 21);
  CHECK(!strcmp(q, "\"a\\\"b\\\\c\\u000a\\u0001\""));
  CHECK(st_json_quote("abcdef", q, 4) == 8 && !strcmp(q, "\"ab"));
  char d[64];
  CHECK(st_json_fmt_double(1e-5, d, sizeof d) == 0 && strtod(d, NULL) == 1e-5);
  CHECK(st_json_fmt_double(0.1, d, sizeof d) == 0 && !strcmp(d, "0.10000000000000001"));
  CHECK(st_json_fmt_double(NAN, d, sizeof d) == -1 && st_json_fmt_double(INFINITY, d, 64) == -1);
}

/* ---------------------------------------------------------------- golden bytes */

static void test_golden(void) {
  char path[512], err[512];
  snprintf(path, sizeof path, "%s/golden.safetensors", tmpdir);
  const float a[2] = {1.0f, -2.0f}, b = 1.5f;
  const int32_t iv[2] = {7, -1};
  st_tensor t[3] = {
      {.name = "b", .dtype = ST_BF16, .ndim = 0, .data = &b, .from_f32 = 1},
      {.name = "a", .dtype = ST_F32, .ndim = 1, .shape = {2}, .data = a},
      {.name = "i", .dtype = ST_I32, .ndim = 2, .shape = {1, 2}, .data = iv},
  };
  st_kv meta[] = {{"format", "pt"}};
  CHECK(st_write(path, t, 3, meta, 1, err, sizeof err) == 0);
  /* Written by hand from the format description: 200 = 196 bytes of JSON + 4 spaces, data in
   * element-size order (F32 a, I32 i, then BF16 b). */
  static const char hdr[] =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"i\":{\"dtype\":\"I32\",\"shape\":[1,2],\"data_offsets\":[8,16]},"
      "\"b\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[16,18]}}    ";
  static const unsigned char data[] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0, /* a */
                                       0x07, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, /* i */
                                       0xc0, 0x3f};                                   /* b */
  unsigned char want[8 + 200 + 18] = {0xc8, 0, 0, 0, 0, 0, 0, 0};
  CHECK(sizeof hdr - 1 == 200);
  memcpy(want + 8, hdr, 200);
  memcpy(want + 208, data, sizeof data);
  size_t n = 0;
  unsigned char *got = slurp(path, &n);
  CHECK(got && n == sizeof want && memcmp(got, want, sizeof want) == 0);
  if (got && n == sizeof want && memcmp(got, want, n))
    for (size_t i = 0; i < n; i++)
      if (got[i] != want[i]) {
        fprintf(stderr, "golden: first difference at byte %zu: 0x%02x vs 0x%02x\n", i, got[i],
                want[i]);
        break;
      }
  free(got);
  /* the hand-written image parses */
  st_file *f = st_open_buffer(want, sizeof want, "golden", err, sizeof err);
  CHECK(f != NULL);
  if (f) {
    CHECK(st_count(f) == 3 && !strcmp(st_at(f, 0)->name, "a") && !strcmp(st_at(f, 2)->name, "b"));
    const st_view *v = st_find(f, "b");
    CHECK(v && v->dtype == ST_BF16 && v->ndim == 0 && v->numel == 1);
    float x;
    CHECK(st_get_f32(f, "b", &x, 1, err, sizeof err) == 0 && x == 1.5f);
    CHECK(!strcmp(st_meta(f, "format"), "pt") && st_meta(f, "nope") == NULL);
    CHECK(st_meta_count(f) == 1 && !strcmp(st_meta_at(f, 0)->key, "format"));
    st_close(f);
  }
}

/* ---------------------------------------------------------------- round trips */

static void test_roundtrip(void) {
  char path[512], err[512];
  snprintf(path, sizeof path, "%s/rt.safetensors", tmpdir);
  enum { N = 1000 };
  float *w = malloc(N * sizeof *w);
  for (int i = 0; i < N; i++) w[i] = f_of((uint32_t)rng() & 0xbfffffffu); /* finite-ish */
  w[0] = NAN;
  int32_t iv[6] = {0, 1, -1, INT32_MAX, INT32_MIN, 42};
  int64_t lv[3] = {INT64_MIN, 0, INT64_MAX};
  uint8_t bytes[5] = {0, 1, 127, 128, 255};
  float scalar = 3.25f;
  st_tensor t[] = {
      {.name = "u8", .dtype = ST_U8, .ndim = 1, .shape = {5}, .data = bytes},
      {.name = "w.f32", .dtype = ST_F32, .ndim = 2, .shape = {10, 100}, .data = w},
      {.name = "w.bf16", .dtype = ST_BF16, .ndim = 3, .shape = {10, 10, 10}, .data = w, .from_f32 = 1},
      {.name = "i32", .dtype = ST_I32, .ndim = 2, .shape = {2, 3}, .data = iv},
      {.name = "i64", .dtype = ST_I64, .ndim = 1, .shape = {3}, .data = lv},
      {.name = "empty", .dtype = ST_F32, .ndim = 2, .shape = {0, 7}, .data = NULL},
      {.name = "empty1", .dtype = ST_BF16, .ndim = 1, .shape = {0}, .data = NULL},
      {.name = "scalar", .dtype = ST_F32, .ndim = 0, .data = &scalar},
      {.name = "caf\xc3\xa9 \"q\"", .dtype = ST_F32, .ndim = 1, .shape = {1}, .data = &scalar},
  };
  size_t nt = sizeof t / sizeof t[0];
  CHECK(st_write(path, t, nt, NULL, 0, err, sizeof err) == 0);
  st_file *f = st_open(path, err, sizeof err);
  CHECK(f != NULL);
  if (!f) {
    fprintf(stderr, "%s\n", err);
    free(w);
    return;
  }
  CHECK(st_count(f) == nt && st_meta_count(f) == 0 && !strcmp(st_path(f), path));
  size_t hn = 0;
  unsigned char *raw = slurp(path, &hn);
  CHECK(raw && !memmem(raw, hn, "__metadata__", 12)); /* empty metadata: key omitted */
  free(raw);
  /* every view aligned to its element size (the writer orders by size) */
  for (size_t i = 0; i < st_count(f); i++) {
    const st_view *v = st_at(f, i);
    CHECK(((uintptr_t)v->data % st_dtype_size(v->dtype)) == 0);
  }
  const st_view *v = st_find(f, "w.f32");
  CHECK(v && v->dtype == ST_F32 && v->ndim == 2 && v->shape[0] == 10 && v->shape[1] == 100);
  CHECK(v && memcmp(v->data, w, N * 4) == 0); /* bit exact, NaN included */
  float *back = malloc(N * sizeof *back);
  CHECK(st_get_f32(f, "w.bf16", back, N, err, sizeof err) == 0);
  int bad = 0;
  for (int i = 1; i < N; i++) bad += u_of(back[i]) != ((uint32_t)st_f32_to_bf16(w[i]) << 16);
  CHECK(bad == 0 && isnan(back[0]));
  v = st_find(f, "i32");
  CHECK(v && v->dtype == ST_I32 && memcmp(v->data, iv, sizeof iv) == 0);
  v = st_find(f, "i64");
  CHECK(v && v->dtype == ST_I64 && memcmp(v->data, lv, sizeof lv) == 0);
  v = st_find(f, "u8");
  CHECK(v && v->numel == 5 && memcmp(v->data, bytes, 5) == 0);
  v = st_find(f, "empty");
  CHECK(v && v->numel == 0 && v->begin == v->end && v->shape[0] == 0 && v->shape[1] == 7);
  CHECK(st_get_f32(f, "empty", back, 0, err, sizeof err) == 0);
  v = st_find(f, "empty1");
  CHECK(v && v->numel == 0 && v->dtype == ST_BF16);
  v = st_find(f, "scalar");
  CHECK(v && v->ndim == 0 && v->numel == 1 && *(const float *)v->data == 3.25f);
  CHECK(st_find(f, "caf\xc3\xa9 \"q\"") != NULL);
  CHECK(st_find(f, "nope") == NULL);
  /* st_get_f32 errors name the file and the tensor */
  CHECK(st_get_f32(f, "nope", back, 1, err, sizeof err) == -1);
  CHECK_ERR(err, path);
  CHECK_ERR(err, "no tensor named 'nope'");
  CHECK(st_get_f32(f, "w.f32", back, 999, err, sizeof err) == -1);
  CHECK_ERR(err, "tensor 'w.f32' has shape [10, 100] (1000 elements), expected 999");
  CHECK(st_get_f32(f, "i32", back, 6, err, sizeof err) == -1);
  CHECK_ERR(err, "tensor 'i32' is I32, which cannot be read as f32");
  st_close(f);

  /* metadata with characters that need escaping */
  st_kv meta[] = {{"format", "pt"}, {"note", "line1\nline2 \"quoted\" \\ tab\t \xe2\x82\xac"}};
  CHECK(st_write(path, t, 1, meta, 2, err, sizeof err) == 0);
  f = st_open(path, err, sizeof err);
  CHECK(f && st_count(f) == 1 && !strcmp(st_meta(f, "note"), meta[1].value));
  st_close(f);

  /* no tensors at all */
  CHECK(st_write(path, NULL, 0, NULL, 0, err, sizeof err) == 0);
  f = st_open(path, err, sizeof err);
  CHECK(f && st_count(f) == 0);
  st_close(f);
  CHECK(count_entries(tmpdir) == 2); /* golden + rt: no temporaries left behind */

  /* writer errors */
  st_tensor dup[2] = {t[1], t[1]};
  CHECK(st_write(path, dup, 2, NULL, 0, err, sizeof err) == -1);
  CHECK_ERR(err, "given twice");
  st_tensor badt = t[3];
  badt.from_f32 = 1;
  CHECK(st_write(path, &badt, 1, NULL, 0, err, sizeof err) == -1);
  CHECK_ERR(err, "cannot convert f32 to I32");
  badt = t[1];
  badt.name = "__metadata__";
  CHECK(st_write(path, &badt, 1, NULL, 0, err, sizeof err) == -1);
  CHECK_ERR(err, "invalid name");
  badt.name = "bad\xff";
  CHECK(st_write(path, &badt, 1, NULL, 0, err, sizeof err) == -1);
  CHECK_ERR(err, "invalid name");
  st_kv badm = {"k", "\xc3"};
  CHECK(st_write(path, t, 1, &badm, 1, err, sizeof err) == -1);
  CHECK_ERR(err, "not UTF-8");
  badt = t[1];
  badt.data = NULL;
  CHECK(st_write(path, &badt, 1, NULL, 0, err, sizeof err) == -1);
  CHECK_ERR(err, "no data");
  badt = t[1];
  badt.shape[0] = -1;
  CHECK(st_write(path, &badt, 1, NULL, 0, err, sizeof err) == -1);
  CHECK_ERR(err, "invalid shape");
  char nodir[600];
  snprintf(nodir, sizeof nodir, "%s/no/such/dir/x.safetensors", tmpdir);
  CHECK(st_write(nodir, t, 1, NULL, 0, err, sizeof err) == -1);
  CHECK_ERR(err, "does not exist");
  CHECK(st_open(nodir, err, sizeof err) == NULL);
  CHECK_ERR(err, "cannot open");
  CHECK(st_open(tmpdir, err, sizeof err) == NULL);
  CHECK_ERR(err, "not a regular file");
  CHECK(count_entries(tmpdir) == 2);
  free(back);
  free(w);
}

/* ---------------------------------------------------------------- corruption */

/* builds a file image: 8-byte length, header (padded), datalen bytes of data */
static unsigned char *image(const char *hdr, size_t datalen, size_t *n) {
  size_t hl = strlen(hdr);
  *n = 8 + hl + datalen;
  unsigned char *b = calloc(1, *n);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
  memcpy(b + 8, hdr, hl);
  return b;
}

static void expect_bad(const char *hdr, size_t datalen, const char *msg, int line) {
  size_t n;
  unsigned char *b = image(hdr, datalen, &n);
  char err[512] = "";
  st_file *f = st_open_buffer(b, n, "bad.safetensors", err, sizeof err);
  if (f || !strstr(err, msg) || !strstr(err, "bad.safetensors")) {
    fprintf(stderr, "%s:%d: corrupt header %s: %s (want \"%s\")\n", __FILE__, line, hdr,
            f ? "accepted" : err, msg);
    failures++;
  }
  st_close(f);
  free(b);
}
#define BAD(hdr, datalen, msg) expect_bad(hdr, datalen, msg, __LINE__)

static void test_corrupt(void) {
  char err[512];
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
      "tensor 'a': data_offsets [0, 8] run past the end of the data (4 bytes)");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12,
      "cover 8 bytes of data but the file holds 12");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
      "tensor 'b': data_offsets [4, 12] overlap tensor 'a'");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
      "tensor 'a': data_offsets [4, 12] leave a hole of 4 bytes");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
      "tensor 'a': data_offsets [8, 0] are reversed");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
      "tensor 'a': data_offsets [0, 8] hold 8 bytes but F32 [3] needs 12");
  BAD("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16,
      "hold 16 bytes but BF16 [2, 2] needs 8");
  BAD("{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
      "tensor 'a': unsupported dtype \"F31\"");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
      "tensor 'a': shape[0] is not a non-negative integer");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8,
      "shape[0] is not a non-negative integer");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
      "overflows");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
      "tensor 'a': \"data_offsets\" must be [begin, end]");
  BAD("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "tensor 'a': missing or non-array \"shape\"");
  BAD("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor 'a': missing or non-string \"dtype\"");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
      "tensor 'a': unknown field \"x\"");
  BAD("{\"a\":[1]}", 0, "tensor 'a': entry is an array, not an object");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
      "9 dimensions");
  BAD("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ value for \"k\" is an integer");
  BAD("{\"__metadata__\":[]}", 0, "__metadata__ is an array");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}", 8,
      "corrupt header JSON: byte 54: trailing comma");
  BAD("{\"a\":1,\"a\":2}", 0, "duplicate key \"a\"");
  BAD("[1]", 0, "header does not start with '{'");
  BAD("{\"\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, "empty name");

  /* header length larger than the file; too short */
  unsigned char b[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
  CHECK(st_open_buffer(b, 16, "x.st", err, sizeof err) == NULL);
  CHECK_ERR(err, "x.st: header length 65535 is larger than the file (16 bytes)");
  b[0] = 0xff;
  memset(b + 1, 0xff, 7);
  CHECK(st_open_buffer(b, 16, "x.st", err, sizeof err) == NULL);
  CHECK_ERR(err, "is larger than the file");
  CHECK(st_open_buffer(b, 5, "x.st", err, sizeof err) == NULL);
  CHECK_ERR(err, "x.st: file is 5 bytes, too short");
  CHECK(st_open_buffer(b, 0, "x.st", err, sizeof err) == NULL);
  memset(b, 0, 8);
  b[0] = 2;
  st_file *e = st_open_buffer(b, 10, "x.st", err, sizeof err);
  CHECK(e && st_count(e) == 0);
  st_close(e);

  /* header order need not be data order; tensors sorted by offset are validated */
  size_t n;
  unsigned char *img = image("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                             "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, &n);
  e = st_open_buffer(img, n, "order", err, sizeof err);
  CHECK(e && !strcmp(st_at(e, 0)->name, "a") && st_find(e, "b")->begin == 4);
  st_close(e);
  free(img);
}

/* ---------------------------------------------------------------- fuzz */

static void test_fuzz(void) {
  char path[512], err[512];
  snprintf(path, sizeof path, "%s/fuzz.safetensors", tmpdir);
  float w[24];
  for (int i = 0; i < 24; i++) w[i] = (float)i * 0.5f - 3.0f;
  int32_t iv[3] = {1, 2, 3};
  st_tensor t[] = {
      {.name = "model.embed_tokens.weight", .dtype = ST_F32, .ndim = 2, .shape = {4, 3}, .data = w},
      {.name = "h", .dtype = ST_BF16, .ndim = 1, .shape = {12}, .data = w + 12, .from_f32 = 1},
      {.name = "idx", .dtype = ST_I32, .ndim = 1, .shape = {3}, .data = iv},
      {.name = "z", .dtype = ST_F32, .ndim = 2, .shape = {3, 0}, .data = NULL},
      {.name = "s", .dtype = ST_F32, .ndim = 0, .data = w},
  };
  st_kv meta[] = {{"format", "pt"}, {"k\\", "v\"\n"}};
  CHECK(st_write(path, t, 5, meta, 2, err, sizeof err) == 0);
  size_t n;
  unsigned char *good = slurp(path, &n);
  CHECK(good != NULL);
  if (!good) return;
  st_file *f = st_open_buffer(good, n, "fuzz", err, sizeof err);
  CHECK(f && st_count(f) == 5);
  st_close(f);
  /* every truncation fails cleanly */
  for (size_t len = 0; len < n; len++) {
    f = st_open_buffer(good, len, "fuzz", err, sizeof err);
    if (f) {
      fprintf(stderr, "truncation to %zu of %zu bytes was accepted\n", len, n);
      failures++;
      st_close(f);
    } else if (!strstr(err, "fuzz: ")) {
      fprintf(stderr, "truncation error does not name the file: %s\n", err);
      failures++;
    }
  }
  /* random byte flips: no crash (ASan/UBSan watch), and anything accepted is consistent */
  unsigned char *buf = malloc(n);
  int accepted = 0;
  for (int it = 0; it < 30000; it++) {
    memcpy(buf, good, n);
    int flips = 1 + (int)(rng() % 4);
    for (int k = 0; k < flips; k++) {
      size_t pos = rng() % 3 ? 8 + rng() % (n - 8 < 300 ? n - 8 : 300) : rng() % n;
      uint64_t r = rng();
      if (r % 3 == 0) buf[pos] ^= (unsigned char)(1u << (r >> 8) % 8);
      else if (r % 3 == 1) buf[pos] = (unsigned char)(r >> 16);
      else buf[pos] = "{}[]\":,0123456789-e.\\u "[(r >> 16) % 24];
    }
    f = st_open_buffer(buf, n, "fuzz", err, sizeof err);
    if (!f) continue;
    accepted++;
    uint64_t at = 0;
    for (size_t i = 0; i < st_count(f); i++) {
      const st_view *v = st_at(f, i);
      CHECK(v->begin == at && v->end >= v->begin);
      CHECK(v->end - v->begin == (uint64_t)v->numel * st_dtype_size(v->dtype));
      at = v->end;
      CHECK(st_find(f, v->name) == v);
      if (v->dtype == ST_F32 || v->dtype == ST_BF16 || v->dtype == ST_F16) {
        float *dst = malloc((size_t)(v->numel ? v->numel : 1) * 4);
        CHECK(st_get_f32(f, v->name, dst, v->numel, err, sizeof err) == 0);
        free(dst);
      }
    }
    st_close(f);
  }
  if (accepted == 0) fprintf(stderr, "note: no fuzzed file was accepted\n");
  /* random garbage of random lengths */
  for (int it = 0; it < 3000; it++) {
    size_t len = rng() % 128;
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)rng();
    if (len >= 8) {
      uint64_t hl = rng() % (len + 4);
      for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hl >> (8 * i));
    }
    f = st_open_buffer(buf, len, "junk", err, sizeof err);
    st_close(f);
  }
  /* JSON parser alone, on mutated headers */
  for (int it = 0; it < 20000; it++) {
    size_t hl = (size_t)(good[0] | good[1] << 8);
    memcpy(buf, good + 8, hl);
    size_t len = rng() % (hl + 1);
    for (int k = 0; k < 3; k++) buf[rng() % hl] = (unsigned char)rng();
    st_json *j = st_json_parse((const char *)buf, len, err, sizeof err);
    st_json_free(j);
  }
  free(buf);
  free(good);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "%s/moec_st_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_bf16();
  test_json();
  test_golden();
  test_roundtrip();
  test_corrupt();
  test_fuzz();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  if (failures) {
    fprintf(stderr, "test_safetensors: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_safetensors: ok\n");
  return 0;
}
