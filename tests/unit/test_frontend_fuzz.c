/* test_frontend_fuzz.c -- feeds the front end random bytes, token soup, and truncated or
 * mutated copies of the shipped models (and random --set options), and checks that it
 * always returns: a verified graph, or NULL after printing at least one error. Fixed seed,
 * a few thousand cases; the suite also runs it under ASan + UBSan. For a longer hunt:
 * MOEC_FUZZ_ROUNDS=50 MOEC_FUZZ_SEED=7 build-asan/test_frontend_fuzz */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend.h"
#include "ir.h"

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}
static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

typedef struct {
  char *p;
  size_t n, cap;
} buf;

static void put(buf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    b->cap = (b->n + n + 1) * 2;
    b->p = realloc(b->p, b->cap);
    if (!b->p) exit(2);
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}
static void puts_b(buf *b, const char *s) { put(b, s, strlen(s)); }

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  buf b = {0};
  char tmp[4096];
  size_t r;
  while ((r = fread(tmp, 1, sizeof tmp, f)) > 0) put(&b, tmp, r);
  fclose(f);
  *len = b.n;
  return b.p;
}

static const char *const words[] = {
    "model", "train", "repeat", "include", "true", "false", "m", "x", "h", "r", "g", "u", "loss", "tokens",
    "embedding", "rmsnorm", "linear", "attention", "router", "experts", "silu", "cross_entropy", "next", "param",
    "f32", "normal", "ones", "adamw", "mxfp8", "fp32", "bf16", "block", "data", "batch", "seq", "steps", "lr",
    "betas", "parallel", "ep", "dp", "hidden", "vocab", "ffn", "heads", "kv_heads", "top_k", "layers", "{", "}",
    "(", ")", "[", "]", ",", ";", "=", "+", "-", "*", "/", "%", "\n", "\n", " ", "\t", "#", "/*", "*/", "\"",
    "\"inc.moe\"", "\"fz.moe\"", "\"a\\q\"", "0", "1", "2", "4", "64", "128", "256", "-1", "1e-5", "5e5",
    "99999999999999999999", "9223372036854775807", "1e999", "0.5", "1.5.2", "12ab", "\xff", "\xc3\xa9", "\xc3",
    "((((((((((((((((((((", "--------------------", "{{{{{{{{{{{{{{{{", "1+1+1+1+1+1+1+1+1+1+1+1",
};
#define N_WORDS (sizeof words / sizeof words[0])

static const char *const set_names[] = {"top_k", "precision", "ep", "dp", "lr", "steps", "seq", "hidden", "ffn",
                                        "experts", "batch", "data", "betas", "beta1", "mx_block", "stride", "overlap",
                                        "schedule", "hiden", "x", "9", "", "rc_augment", "val_fraction"};
static const char *const set_values[] = {"1", "2", "0", "-1", "bf16", "fp32", "mxfp8", "mxfp8(block=128)", "mxfp8(block=64)",
                                         "1e-4", "1e999", "(", "(0.9, 0.99)", "\xff", "", "\"s\"", "true", "hidden",
                                         "cosine", "1/0", "4611686018427387904*4", "x.fa", "nope", "3.5"};

static int cases, loaded, failed_quiet;

static void run_case(const char *dir, const char *text, size_t len, const moec_set *sets, int n_sets) {
  char path[512];
  snprintf(path, sizeof path, "%s/fz.moe", dir);
  FILE *f = fopen(path, "wb");
  if (!f) exit(2);
  fwrite(text, 1, len, f);
  fclose(f);
  char *out = NULL;
  size_t outlen = 0;
  FILE *diag = open_memstream(&out, &outlen);
  ir_graph *g = moec_frontend_load(path, sets, n_sets, diag);
  fclose(diag);
  cases++;
  if (g) {
    loaded++;
    if (ir_verify(g, "fuzz", stderr) != 0) failed_quiet++;
    ir_graph_free(g);
  } else if (outlen == 0) {
    /* a failure must say why */
    if (failed_quiet++ < 3) fprintf(stderr, "fuzz: load failed without a message on:\n%.*s\n", (int)(len > 400 ? 400 : len), text);
  }
  free(out);
}

int main(void) {
  char dir[] = "/tmp/moec_fuzz_XXXXXX";
  if (!mkdtemp(dir)) return 2;
  char inc[600];
  snprintf(inc, sizeof inc, "%s/inc.moe", dir);
  FILE *f = fopen(inc, "w");
  fputs("vocab = 256\ninclude \"fz.moe\"\n", f);
  fclose(f);

  static const char *const models[] = {"models/tiny.moe", "models/l0_sanity.moe", "models/genos_1b.moe",
                                       "models/og2_8x1b.moe", "models/og2_8x7b.moe"};
  char *src[5];
  size_t srclen[5];
  for (int i = 0; i < 5; i++) {
    src[i] = slurp(models[i], &srclen[i]);
    if (!src[i]) {
      fprintf(stderr, "fuzz: cannot read %s (run from the source root)\n", models[i]);
      return 2;
    }
  }
  buf b = {0};
  int rounds = getenv("MOEC_FUZZ_ROUNDS") ? atoi(getenv("MOEC_FUZZ_ROUNDS")) : 1;
  if (getenv("MOEC_FUZZ_SEED")) rng_state ^= (uint64_t)strtoull(getenv("MOEC_FUZZ_SEED"), NULL, 10) * 0x9E3779B97F4A7C15ull;
  if (!rng_state) rng_state = 1;
  for (int round = 0; round < rounds; round++) {
    /* random bytes */
    for (int i = 0; i < 400; i++) {
      b.n = 0;
      size_t n = below(600);
      for (size_t k = 0; k < n; k++) {
        char c = (char)rnd();
        put(&b, &c, 1);
      }
      run_case(dir, b.p ? b.p : "", b.n, NULL, 0);
    }
    /* token soup, sometimes inside a model block */
    for (int i = 0; i < 800; i++) {
      b.n = 0;
      int wrap = i % 2;
      if (wrap) puts_b(&b, "model m {\n");
      size_t n = below(80);
      for (size_t k = 0; k < n; k++) {
        puts_b(&b, words[below(N_WORDS)]);
        if (rnd() & 1) puts_b(&b, " ");
      }
      if (wrap && (rnd() & 3)) puts_b(&b, "\n}\n");
      run_case(dir, b.p, b.n, NULL, 0);
    }
    /* mutated and truncated models */
    for (int i = 0; i < 2000; i++) {
      int m = i % 5 == 4 && i % 3 ? 0 : i % 5; /* the largest model less often */
      const char *s = src[m];
      size_t n = srclen[m];
      b.n = 0;
      switch (i % 4) {
      case 0: /* truncate */
        put(&b, s, below(n + 1));
        break;
      case 1: { /* flip bytes */
        put(&b, s, n);
        for (int k = 1 + (int)below(8); k > 0; k--) b.p[below(n)] = (char)rnd();
        break;
      }
      case 2: { /* insert words */
        size_t at = below(n + 1);
        put(&b, s, at);
        for (int k = 1 + (int)below(4); k > 0; k--) puts_b(&b, words[below(N_WORDS)]);
        put(&b, s + at, n - at);
        break;
      }
      default: { /* delete or duplicate a range */
        size_t a = below(n), len = below(200);
        if (a + len > n) len = n - a;
        put(&b, s, a + (rnd() & 1 ? len : 0));
        put(&b, s + a, n - a);
        if (rnd() & 1) {
          b.n = 0;
          put(&b, s, a);
          put(&b, s + a + len, n - a - len);
        }
      }
      }
      run_case(dir, b.p, b.n, NULL, 0);
    }
    /* random --set options on the tiny model */
    for (int i = 0; i < 300; i++) {
      moec_set sets[4];
      int n = 1 + (int)below(4);
      for (int k = 0; k < n; k++) sets[k] = (moec_set){set_names[below(sizeof set_names / sizeof *set_names)],
                                                       set_values[below(sizeof set_values / sizeof *set_values)]};
      run_case(dir, src[0], srclen[0], sets, n);
    }
  }
  for (int i = 0; i < 5; i++) free(src[i]);
  free(b.p);
  char path[600];
  snprintf(path, sizeof path, "%s/fz.moe", dir);
  unlink(path);
  unlink(inc);
  rmdir(dir);
  printf("test_frontend_fuzz: %d cases, %d loaded, %d failures without a message\n", cases, loaded, failed_quiet);
  return failed_quiet ? 1 : 0;
}
