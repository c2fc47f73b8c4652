/* test_data.c -- the genomic data pipeline (runtime/data.c): FASTA parsing, tokens, labels,
 * windows, the validation split, determinism and resume, reverse complement, compressed
 * input, every bad-data message, and the bundled genome. Fixtures are written into a
 * temporary folder. Run from the source root (ctest does). */
#include "runtime/data.h"

#include <dirent.h>
#include <errno.h>
#include <htslib/bgzf.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

static int n_pass, n_fail;

#define CHECK(cond, ...)                                                 \
  do {                                                                   \
    if (cond) {                                                          \
      n_pass++;                                                          \
    } else {                                                             \
      n_fail++;                                                          \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
      fprintf(stderr, __VA_ARGS__);                                      \
      fputc('\n', stderr);                                               \
    }                                                                    \
  } while (0)

static char tmpdir[256];

/* ---- fixtures ---- */

static const char *fixture(const char *name) {
  static char paths[8][512];
  static int k;
  char *p = paths[k++ % 8];
  snprintf(p, 512, "%s/%s", tmpdir, name);
  return p;
}

static const char *write_bytes(const char *name, const void *bytes, size_t n) {
  const char *p = fixture(name);
  FILE *f = fopen(p, "wb");
  if (!f || fwrite(bytes, 1, n, f) != n) {
    fprintf(stderr, "cannot write fixture %s\n", p);
    exit(2);
  }
  fclose(f);
  return p;
}

static const char *write_text(const char *name, const char *text) {
  return write_bytes(name, text, strlen(text));
}

static const char *write_gzip(const char *name, const void *bytes, size_t n) {
  const char *p = fixture(name);
  gzFile g = gzopen(p, "wb");
  if (!g || gzwrite(g, bytes, (unsigned)n) != (int)n) exit(2);
  gzclose(g);
  return p;
}

static const char *write_bgzf(const char *name, const void *bytes, size_t n) {
  const char *p = fixture(name);
  BGZF *b = bgzf_open(p, "w");
  if (!b || bgzf_write(b, bytes, n) != (ssize_t)n) exit(2);
  bgzf_close(b);
  return p;
}

static unsigned char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) exit(2);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len + 1);
  if (fread(b, 1, (size_t)len, f) != (size_t)len) exit(2);
  fclose(f);
  *n = (size_t)len;
  return b;
}

static uint64_t rng_state = 12345;
static uint64_t rng(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* FASTA text of records with random ACGT bases, wrapped at width; caller frees. */
static char *random_fasta(int nrec, const int64_t *lens, int width, char **seqs) {
  size_t cap = 64;
  for (int r = 0; r < nrec; r++) cap += (size_t)lens[r] + (size_t)lens[r] / (size_t)width + 64;
  char *t = malloc(cap), *p = t;
  for (int r = 0; r < nrec; r++) {
    p += sprintf(p, ">rec%d random\n", r);
    for (int64_t i = 0; i < lens[r]; i++) {
      char c = "ACGT"[rng() & 3];
      if (seqs) seqs[r][i] = c;
      *p++ = c;
      if ((i + 1) % width == 0 || i + 1 == lens[r]) *p++ = '\n';
    }
  }
  *p = 0;
  return t;
}

static data_opts opts(int64_t seq, int64_t stride, double vf) {
  data_opts o = {seq, stride, vf, 0, 0, 1};
  return o;
}

/* ---- error messages ---- */

/* Exact match, except that '#' in the pattern matches a run of one or more digits. */
static int match(const char *pat, const char *s) {
  while (*pat) {
    if (*pat == '#') {
      if (*s < '0' || *s > '9') return 0;
      while (*s >= '0' && *s <= '9') s++;
      pat++;
    } else if (*pat++ != *s++) {
      return 0;
    }
  }
  return *s == 0;
}

static char errbuf[2048];

static const char *open_error(const char *path, const data_opts *o) {
  errbuf[0] = 0;
  data_set *d = data_open(path, o, errbuf, sizeof errbuf);
  if (d) {
    data_close(d);
    return "(opened without error)";
  }
  return errbuf;
}

static void expect_error(int line, const char *path, const data_opts *o, const char *fmt, ...) {
  char want[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(want, sizeof want, fmt, ap);
  va_end(ap);
  const char *got = open_error(path, o);
  if (match(want, got)) {
    n_pass++;
  } else {
    n_fail++;
    fprintf(stderr, "FAIL %s:%d: error message\n  want: %s\n  got:  %s\n", __FILE__, line, want,
            got);
  }
}
#define EXPECT_ERROR(path, o, ...) expect_error(__LINE__, path, o, __VA_ARGS__)

/* ---- tests ---- */

static int same_i32(const int32_t *a, const int32_t *b, int64_t n) {
  return memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

static void check_window(const data_set *d, int split, int64_t w, int rc, const int32_t *tok,
                         const int32_t *lab, int64_t seq, const char *what) {
  int32_t t[64], l[64];
  data_window(d, split, w, rc, t, l);
  CHECK(same_i32(t, tok, seq), "%s: tokens of window %lld", what, (long long)w);
  CHECK(same_i32(l, lab, seq), "%s: labels of window %lld", what, (long long)w);
}

/* Multi-record, wrapped, CRLF, lowercase, IUPAC: exact tokens and labels. */
static void test_tiny_exact(void) {
  const char *p = write_text("tiny.fa",
                             ">r1 first record\r\nACGTa\r\ncgtN\r\n\r\n"
                             ">r2\r\nRYk\r\nm A\r\n");
  data_opts o = opts(4, 3, 0.0);
  char err[512];
  data_set *d = data_open(p, &o, err, sizeof err);
  CHECK(d != NULL, "open: %s", err);
  if (!d) return;
  const uint8_t want[] = {DATA_BOS, 'A', 'C', 'G', 'T', 'a', 'c', 'g', 't', 'N', DATA_EOS,
                          DATA_BOS, 'R', 'Y', 'k', 'm', 'A', DATA_EOS};
  int64_t n;
  const uint8_t *s = data_stream(d, DATA_TRAIN, &n);
  CHECK(n == (int64_t)sizeof want && memcmp(s, want, sizeof want) == 0, "train stream");
  CHECK(data_n_records(d) == 2, "records %lld", (long long)data_n_records(d));
  CHECK(data_n_bases(d, DATA_TRAIN) == 14, "bases %lld", (long long)data_n_bases(d, DATA_TRAIN));
  CHECK(data_n_bases(d, DATA_VAL) == 0 && data_n_windows(d, DATA_VAL) == 0, "no val");
  CHECK(data_n_acgt(d) == 9, "acgt %lld", (long long)data_n_acgt(d));
  /* 18 tokens, seq 4, stride 3: starts 0,3,6,9,12 (13 + 4 < 18 fails: 13..17 has no label) */
  CHECK(data_n_windows(d, DATA_TRAIN) == 5, "windows %lld",
        (long long)data_n_windows(d, DATA_TRAIN));
  const int32_t I = DATA_IGNORE;
  {
    int32_t t[] = {DATA_BOS, 'A', 'C', 'G'}, l[] = {'A', 'C', 'G', 'T'};
    check_window(d, DATA_TRAIN, 0, 0, t, l, 4, "tiny");
  }
  {
    int32_t t[] = {'G', 'T', 'a', 'c'}, l[] = {'T', 'a', 'c', 'g'};
    check_window(d, DATA_TRAIN, 1, 0, t, l, 4, "tiny");
  }
  {
    int32_t t[] = {'c', 'g', 't', 'N'}, l[] = {'g', 't', I, I};
    check_window(d, DATA_TRAIN, 2, 0, t, l, 4, "tiny");
  }
  {
    int32_t t[] = {'N', DATA_EOS, DATA_BOS, 'R'}, l[] = {I, I, I, I};
    check_window(d, DATA_TRAIN, 3, 0, t, l, 4, "tiny");
  }
  {
    int32_t t[] = {'R', 'Y', 'k', 'm'}, l[] = {I, I, I, 'A'};
    check_window(d, DATA_TRAIN, 4, 0, t, l, 4, "tiny");
  }
  {
    /* out of range: PAD, all masked */
    int32_t t[] = {DATA_PAD, DATA_PAD, DATA_PAD, DATA_PAD}, l[] = {I, I, I, I};
    check_window(d, DATA_TRAIN, 5, 0, t, l, 4, "tiny");
  }
  data_close(d);

  /* uppercase option folds soft-masking */
  o.uppercase = 1;
  d = data_open(p, &o, err, sizeof err);
  CHECK(d != NULL, "open uppercase: %s", err);
  if (!d) return;
  const uint8_t up[] = {DATA_BOS, 'A', 'C', 'G', 'T', 'A', 'C', 'G', 'T', 'N', DATA_EOS,
                        DATA_BOS, 'R', 'Y', 'K', 'M', 'A', DATA_EOS};
  s = data_stream(d, DATA_TRAIN, &n);
  CHECK(n == (int64_t)sizeof up && memcmp(s, up, sizeof up) == 0, "uppercase stream");
  data_close(d);
}

static void test_special_ids(void) {
  CHECK(DATA_EOS == 0 && DATA_PAD == 1 && DATA_BOS == 2, "BioNeMo ids");
  const char *bases = "ACGTNacgtnRYSWKMBDHVU";
  for (const char *c = bases; *c; c++)
    CHECK(*c != DATA_EOS && *c != DATA_PAD && *c != DATA_BOS && *c < DATA_VOCAB, "%c", *c);
}

static void test_windows_and_stride(void) {
  int64_t len = 100;
  char *fa = random_fasta(1, &len, 60, NULL);
  const char *p = write_text("w.fa", fa);
  free(fa);
  struct { int64_t seq, stride, want; } cases[] = {
      {10, 10, 10}, {10, 0, 10}, {10, 5, 19}, {10, 1, 92}, {101, 1, 1}, {50, 7, 8}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    data_opts o = opts(cases[k].seq, cases[k].stride, 0.0);
    data_set *d = data_open(p, &o, errbuf, sizeof errbuf);
    CHECK(d != NULL, "%s", errbuf);
    if (!d) continue;
    int64_t nw = data_n_windows(d, DATA_TRAIN), n, stride = cases[k].stride ? cases[k].stride
                                                                            : cases[k].seq;
    CHECK(nw == cases[k].want, "seq %lld stride %lld: %lld windows, want %lld",
          (long long)cases[k].seq, (long long)cases[k].stride, (long long)nw,
          (long long)cases[k].want);
    const uint8_t *s = data_stream(d, DATA_TRAIN, &n);
    CHECK(n == 102, "tokens %lld", (long long)n);
    int32_t *t = malloc(sizeof(int32_t) * (size_t)cases[k].seq);
    int32_t *l = malloc(sizeof(int32_t) * (size_t)cases[k].seq);
    int ok = 1;
    for (int64_t w = 0; w < nw; w++) {
      data_window(d, DATA_TRAIN, w, 0, t, l);
      for (int64_t i = 0; i < cases[k].seq; i++) {
        uint8_t next = s[w * stride + i + 1];
        int32_t lab = (next == 'A' || next == 'C' || next == 'G' || next == 'T') ? next : -1;
        ok &= t[i] == s[w * stride + i] && l[i] == lab;
      }
    }
    CHECK(ok, "windows are stream slices (seq %lld stride %lld)", (long long)cases[k].seq,
          (long long)stride);
    free(t);
    free(l);
    data_close(d);
  }
  /* seq 101 is the longest one window allows (102 tokens); seq 102 is too long */
  data_opts o = opts(102, 0, 0.0);
  EXPECT_ERROR(p, &o,
               "%s: error: genome too short for one window: the training split has 102 tokens "
               "(100 bases + 2 BOS/EOS) but seq = 102 needs 103 (a window and one more token "
               "for its last label); use a smaller seq (at most 101), or a longer genome "
               "(about 101 bases at val_fraction 0)",
               p);
}

/* Records shorter than a window are packed with the next. */
static void test_short_records_packed(void) {
  const char *p = write_text("short.fa", ">a\nAC\n>b\nG\n>c\nTTA\n>d\nC\n");
  data_opts o = opts(6, 6, 0.0);
  data_set *d = data_open(p, &o, errbuf, sizeof errbuf);
  CHECK(d != NULL, "%s", errbuf);
  if (!d) return;
  /* BOS A C EOS BOS G EOS BOS T T A EOS BOS C EOS: 15 tokens, windows at 0 and 6 */
  CHECK(data_n_windows(d, DATA_TRAIN) == 2, "%lld", (long long)data_n_windows(d, DATA_TRAIN));
  const int32_t I = DATA_IGNORE;
  int32_t t0[] = {DATA_BOS, 'A', 'C', DATA_EOS, DATA_BOS, 'G'}, l0[] = {'A', 'C', I, I, 'G', I};
  int32_t t1[] = {DATA_EOS, DATA_BOS, 'T', 'T', 'A', DATA_EOS},
          l1[] = {I, 'T', 'T', 'A', I, I};
  check_window(d, DATA_TRAIN, 0, 0, t0, l0, 6, "packed");
  check_window(d, DATA_TRAIN, 1, 0, t1, l1, 6, "packed");
  data_close(d);
}

/* The validation split is the last val_fraction of each record; no base is in both. */
static void test_val_split(void) {
  int64_t lens[3] = {1000, 500, 4};
  char s0[1000], s1[500], s2[4];
  char *seqs[3] = {s0, s1, s2};
  char *fa = random_fasta(3, lens, 70, seqs);
  const char *p = write_text("val.fa", fa);
  free(fa);
  data_opts o = opts(16, 8, 0.2);
  data_set *d = data_open(p, &o, errbuf, sizeof errbuf);
  CHECK(d != NULL, "%s", errbuf);
  if (!d) return;
  /* record 0: 800 train + 200 val; record 1: 400 + 100; record 2: floor(0.8) = 0 val */
  CHECK(data_n_bases(d, DATA_TRAIN) == 1204, "%lld", (long long)data_n_bases(d, DATA_TRAIN));
  CHECK(data_n_bases(d, DATA_VAL) == 300, "%lld", (long long)data_n_bases(d, DATA_VAL));
  uint8_t wt[1300], wv[400], *q = wt;
  *q++ = DATA_BOS, memcpy(q, s0, 800), q += 800;
  *q++ = DATA_BOS, memcpy(q, s1, 400), q += 400;
  *q++ = DATA_BOS, memcpy(q, s2, 4), q += 4, *q++ = DATA_EOS;
  size_t nt = (size_t)(q - wt);
  q = wv;
  memcpy(q, s0 + 800, 200), q += 200, *q++ = DATA_EOS;
  memcpy(q, s1 + 400, 100), q += 100, *q++ = DATA_EOS;
  size_t nv = (size_t)(q - wv);
  int64_t n;
  const uint8_t *st = data_stream(d, DATA_TRAIN, &n);
  CHECK(n == (int64_t)nt && memcmp(st, wt, nt) == 0, "train stream = heads of records");
  const uint8_t *sv = data_stream(d, DATA_VAL, &n);
  CHECK(n == (int64_t)nv && memcmp(sv, wv, nv) == 0, "val stream = tails of records");
  CHECK(data_n_windows(d, DATA_TRAIN) == ((int64_t)nt - 17) / 8 + 1, "train windows");
  CHECK(data_n_windows(d, DATA_VAL) == ((int64_t)nv - 17) / 8 + 1, "val windows");

  /* every training sample's bases come from the train stream, every validation window's
   * from the val stream: 16-mers of the two are disjoint for random sequence */
  int32_t t[16 * 4], l[16 * 4];
  int ok = 1;
  for (int64_t step = 0; step < 40; step++) {
    data_train_batch(d, step, 4, t, l);
    for (int r = 0; r < 4; r++) {
      uint8_t b[16];
      for (int i = 0; i < 16; i++) b[i] = (uint8_t)t[r * 16 + i];
      ok &= memmem(wt, nt, b, 16) != NULL && memmem(wv, nv, b, 16) == NULL;
    }
  }
  CHECK(ok, "training samples come from the training region only");
  ok = 1;
  int64_t nval = data_n_windows(d, DATA_VAL);
  for (int64_t i = 0; i < nval; i += 4) {
    data_val_batch(d, i, 4, t, l);
    for (int r = 0; r < 4; r++) {
      int64_t w = (i + r) % nval;
      for (int j = 0; j < 16; j++) ok &= t[r * 16 + j] == sv[w * 8 + j];
    }
  }
  CHECK(ok, "validation batches are the sequential windows, wrapping");
  data_close(d);

  /* vf 0.2 but every record too short to give a validation window */
  const char *p2 = write_text("val_short.fa", ">a\nACGTACGTACGTACGTACGT\n");
  o = opts(8, 8, 0.2);
  EXPECT_ERROR(p2, &o,
               "%s: error: validation split too short for one window: the last 0.2 of each "
               "record gives 5 tokens (4 bases + EOS) but seq = 8 needs 9; raise val_fraction, "
               "use a smaller seq (at most 4), or set val_fraction = 0 to skip validation",
               p2);
}

static data_set *open_random(int64_t len, uint64_t seed, int rc, double vf) {
  rng_state = 777;
  char *fa = random_fasta(1, &len, 60, NULL);
  const char *p = write_text("det.fa", fa);
  free(fa);
  data_opts o = opts(32, 16, vf);
  o.seed = seed;
  o.rc_augment = rc;
  data_set *d = data_open(p, &o, errbuf, sizeof errbuf);
  CHECK(d != NULL, "%s", errbuf);
  return d;
}

static void test_determinism_and_resume(void) {
  enum { B = 8, T = 32, STEPS = 60 };
  data_set *a = open_random(20000, 42, 1, 0.1), *b = open_random(20000, 42, 1, 0.1),
           *c = open_random(20000, 43, 1, 0.1);
  if (!a || !b || !c) return;
  int64_t n = data_n_windows(a, DATA_TRAIN);
  CHECK(n == (18001 - 33) / 16 + 1, "windows %lld", (long long)n);
  static int32_t ta[STEPS][B * T], la[STEPS][B * T];
  int32_t tb[B * T], lb[B * T];
  int same = 1, diff = 0;
  for (int s = 0; s < STEPS; s++) {
    data_train_batch(a, s, B, ta[s], la[s]);
    data_train_batch(b, s, B, tb, lb);
    same &= same_i32(ta[s], tb, B * T) && same_i32(la[s], lb, B * T);
    data_train_batch(c, s, B, tb, lb);
    diff += !same_i32(ta[s], tb, B * T);
  }
  CHECK(same, "same seed, same batches");
  CHECK(diff > STEPS - 2, "different seed, different batches (%d of %d differ)", diff, STEPS);

  /* resume: step s computed fresh, in any order, equals the sequential run */
  data_close(b);
  b = open_random(20000, 42, 1, 0.1);
  int ok = 1;
  for (int s = STEPS - 1; s >= 0; s -= 7) {
    data_train_batch(b, s, B, tb, lb);
    ok &= same_i32(ta[s], tb, B * T) && same_i32(la[s], lb, B * T);
  }
  CHECK(ok, "batch of step s is a pure function of (seed, s)");
  /* rows of a batch (data parallel shares) equal the whole batch's rows */
  data_train_rows(b, 17, B, 3, 4, tb, lb);
  CHECK(same_i32(ta[17] + 3 * T, tb, 4 * T) && same_i32(la[17] + 3 * T, lb, 4 * T), "rows");

  /* each epoch visits every window exactly once, in a seed- and epoch-dependent order */
  char *seen = calloc((size_t)n, 1);
  int64_t *first = malloc(sizeof(int64_t) * (size_t)n);
  int perm_ok = 1, moved = 0, ep_diff = 0, rc1 = 0;
  for (int64_t g = 0; g < n; g++) {
    int rc;
    int64_t w = data_train_window_id(a, g, 1, 0, &rc);
    perm_ok &= w >= 0 && w < n && !seen[w];
    if (w >= 0 && w < n) seen[w] = 1;
    first[g] = w;
    moved += w != g;
    rc1 += rc;
    ep_diff += data_train_window_id(a, n + g, 1, 0, NULL) != w;
  }
  CHECK(perm_ok, "epoch 0 is a permutation of the %lld windows", (long long)n);
  CHECK(moved > n * 9 / 10, "shuffled (%d of %lld moved)", moved, (long long)n);
  CHECK(ep_diff > n * 9 / 10, "epoch 1 order differs from epoch 0 (%d)", ep_diff);
  CHECK(rc1 > n * 4 / 10 && rc1 < n * 6 / 10, "about half reverse-complemented: %d of %lld", rc1,
        (long long)n);
  free(seen);
  free(first);
  data_close(a);
  data_close(b);
  data_close(c);

  /* permutations of small and odd sizes */
  int64_t lens[] = {40, 41, 56, 75, 100, 300, 1000};
  for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
    data_set *d = open_random(lens[k], 9, 0, 0.0);
    if (!d) continue;
    int64_t m = data_n_windows(d, DATA_TRAIN);
    char mark[64] = {0};
    int pok = m > 0 && m <= 64;
    for (int64_t g = 0; pok && g < m; g++) {
      int rc = 5;
      int64_t w = data_train_window_id(d, g, 1, 0, &rc);
      pok &= w >= 0 && w < m && !mark[w] && rc == 0;
      if (w >= 0 && w < m) mark[w] = 1;
    }
    CHECK(pok, "permutation of %lld windows", (long long)m);
    data_close(d);
  }
}

static void test_reverse_complement(void) {
  const char *p = write_text("rc.fa", ">x\nACgRNtKb\n");
  data_opts o = opts(9, 1, 0.0);
  data_set *d = data_open(p, &o, errbuf, sizeof errbuf);
  CHECK(d != NULL, "%s", errbuf);
  if (!d) return;
  const int32_t I = DATA_IGNORE;
  /* forward: BOS A C g R N t K b | EOS */
  int32_t tf[] = {DATA_BOS, 'A', 'C', 'g', 'R', 'N', 't', 'K', 'b'},
          lf[] = {'A', 'C', 'g', I, I, 't', I, I, I};
  check_window(d, DATA_TRAIN, 0, 0, tf, lf, 9, "forward");
  /* reverse complement of the 10 tokens: BOS v M a N Y c G T | EOS */
  int32_t tr[] = {DATA_BOS, 'v', 'M', 'a', 'N', 'Y', 'c', 'G', 'T'},
          lr[] = {I, I, 'a', I, I, 'c', 'G', 'T', I};
  check_window(d, DATA_TRAIN, 0, 1, tr, lr, 9, "reverse complement");
  data_close(d);

  const char *from = "ACGTURYSWKMBDHVNacgturyswkmbdhvn", *to = "TGCAAYRSWMKVHDBNtgcaayrswmkvhdbn";
  int ok = 1;
  for (int i = 0; from[i]; i++) ok &= data_complement(from[i]) == to[i];
  CHECK(ok, "IUPAC complement, case kept");
  CHECK(data_complement(DATA_BOS) == DATA_EOS && data_complement(DATA_EOS) == DATA_BOS &&
            data_complement(DATA_PAD) == DATA_PAD,
        "specials");

  /* augmented training samples: an rc sample is the reverse complement of its window */
  data_set *a = open_random(5000, 3, 1, 0.1);
  if (!a) return;
  int32_t t[8 * 32], l[8 * 32], f[33], fl[33], r[32], rl[32];
  int checked_rc = 0, checked_fw = 0, ok2 = 1;
  for (int64_t step = 0; step < 10; step++) {
    data_train_batch(a, step, 8, t, l);
    for (int row = 0; row < 8; row++) {
      int rc;
      int64_t w = data_train_window_id(a, step, 8, row, &rc);
      data_window(a, DATA_TRAIN, w, 0, f, fl);
      data_window(a, DATA_TRAIN, w, rc, r, rl);
      ok2 &= same_i32(t + row * 32, r, 32) && same_i32(l + row * 32, rl, 32);
      if (rc) {
        /* r[i] = comp(window token 32 - i); token 32 is the last label of the forward window */
        int64_t n;
        const uint8_t *s = data_stream(a, DATA_TRAIN, &n) + w * 16;
        for (int i = 0; i < 32; i++) ok2 &= r[i] == data_complement(s[32 - i]);
        checked_rc++;
      } else {
        ok2 &= same_i32(r, f, 32);
        checked_fw++;
      }
    }
  }
  CHECK(ok2 && checked_rc > 10 && checked_fw > 10, "rc samples (%d rc, %d forward)", checked_rc,
        checked_fw);
  data_close(a);
}

static void test_compressed_inputs(void) {
  int64_t lens[2] = {30000, 777};
  rng_state = 99;
  char *fa = random_fasta(2, lens, 61, NULL);
  size_t n = strlen(fa);
  const char *pp = write_bytes("c.fa", fa, n);
  const char *pg = write_gzip("c.fa.gz", fa, n);
  const char *pb = write_bgzf("c.bgz.fa.gz", fa, n);
  free(fa);
  data_opts o = opts(64, 48, 0.05);
  o.rc_augment = 1;
  data_set *d[3] = {data_open(pp, &o, errbuf, sizeof errbuf), data_open(pg, &o, NULL, 0),
                    data_open(pb, &o, NULL, 0)};
  CHECK(d[0] && d[1] && d[2], "open plain/gzip/bgzf: %s", errbuf);
  if (d[0] && d[1] && d[2]) {
    int ok = 1;
    for (int k = 1; k < 3; k++) {
      for (int s = 0; s < 2; s++) {
        int64_t n0, nk;
        const uint8_t *a = data_stream(d[0], s, &n0), *b = data_stream(d[k], s, &nk);
        ok &= n0 == nk && memcmp(a, b, (size_t)n0) == 0;
        ok &= data_n_windows(d[0], s) == data_n_windows(d[k], s);
      }
      int32_t t0[4 * 64], l0[4 * 64], tk[4 * 64], lk[4 * 64];
      for (int s = 0; s < 5; s++) {
        data_train_batch(d[0], s, 4, t0, l0);
        data_train_batch(d[k], s, 4, tk, lk);
        ok &= same_i32(t0, tk, 4 * 64) && same_i32(l0, lk, 4 * 64);
        data_val_batch(d[0], s, 4, t0, l0);
        data_val_batch(d[k], s, 4, tk, lk);
        ok &= same_i32(t0, tk, 4 * 64) && same_i32(l0, lk, 4 * 64);
      }
    }
    CHECK(ok, "gzip and BGZF give the same windows as plain FASTA");
  }
  for (int k = 0; k < 3; k++) data_close(d[k]);
}

static int n_progress;
static int64_t last_done, last_total;
static void on_progress(void *ctx, int64_t done, int64_t total) {
  (void)ctx;
  n_progress++;
  last_done = done;
  last_total = total;
}

static void test_bundled(void) {
  data_opts o = opts(256, 256, 0.05);
  const char *p = "data/chr20_slice.fa.gz";
  data_set *d = data_open_cb(p, &o, on_progress, NULL, errbuf, sizeof errbuf);
  CHECK(d != NULL, "%s", errbuf);
  if (d) {
    int64_t bt = data_n_bases(d, DATA_TRAIN), bv = data_n_bases(d, DATA_VAL);
    CHECK(data_n_records(d) == 1, "records");
    CHECK(bt + bv == 3000000, "chr20 slice has 3,000,000 bases: %lld", (long long)(bt + bv));
    CHECK(bv == 150000, "5%% validation: %lld", (long long)bv);
    double acgt = (double)data_n_acgt(d) / (double)(bt + bv);
    CHECK(acgt > 0.999, "fraction ACGT %.4f", acgt);
    CHECK(data_n_windows(d, DATA_TRAIN) == (2850002 - 257) / 256 + 1, "windows %lld",
          (long long)data_n_windows(d, DATA_TRAIN));
    struct stat st;
    stat(p, &st);
    CHECK(n_progress >= 1 && last_done == st.st_size && last_total == st.st_size,
          "progress: %d calls, last %lld of %lld", n_progress, (long long)last_done,
          (long long)last_total);
    data_close(d);
  }
  d = data_open("data/lambda_phage.fa.gz", &o, errbuf, sizeof errbuf);
  CHECK(d != NULL, "%s", errbuf);
  if (d) {
    CHECK(data_n_bases(d, DATA_TRAIN) + data_n_bases(d, DATA_VAL) == 48502, "lambda bases");
    CHECK(data_n_acgt(d) == 48502, "lambda acgt");
    data_close(d);
  }
  /* the full chromosome, when scripts/fetch_data.sh has downloaded it */
  if (access("data/chr20.fa.gz", R_OK) == 0) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    d = data_open("data/chr20.fa.gz", &o, errbuf, sizeof errbuf);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK(d != NULL, "%s", errbuf);
    if (d) {
      int64_t b = data_n_bases(d, DATA_TRAIN) + data_n_bases(d, DATA_VAL);
      CHECK(b == 63025520, "chr20 bases %lld", (long long)b);
      printf("full chr20: %lld bases, %.1f%% ACGT, loaded in %.2f s\n", (long long)b,
             100.0 * (double)data_n_acgt(d) / (double)b,
             (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
      data_close(d);
    }
  }
}

/* Permission denied, as a user who cannot read the file (as root: in a child that drops to
 * nobody, since root reads everything). */
static void test_permission_denied(void) {
  const char *p = write_text("noperm.fa", ">x\nACGT\n");
  chmod(p, 0);
  char want[1024];
  snprintf(want, sizeof want,
           "%s: error: permission denied: the file is not readable; make it readable "
           "(`chmod a+r %s`) or copy it somewhere you can read",
           p, p);
  data_opts o = opts(2, 1, 0.0);
  if (geteuid() != 0) {
    CHECK(strcmp(open_error(p, &o), want) == 0, "got: %s", errbuf);
    return;
  }
  int fds[2];
  if (pipe(fds)) return;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    if (setgid(65534) || setuid(65534)) _exit(3);
    const char *msg = open_error(p, &o);
    ssize_t wr = write(fds[1], msg, strlen(msg));
    _exit(wr < 0);
  }
  close(fds[1]);
  char got[1024];
  ssize_t k = 0, r;
  while (k < (ssize_t)sizeof got - 1 && (r = read(fds[0], got + k, sizeof got - 1 - (size_t)k)) > 0)
    k += r;
  got[k > 0 ? k : 0] = 0;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
    printf("test_data: permission test skipped: cannot drop root privileges here\n");
    return;
  }
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0 && strcmp(got, want) == 0,
        "as nobody: got: %s", got);
}

static void test_bad_data(void) {
  data_opts o = opts(4, 4, 0.0);
  const char *p;

  p = fixture("missing.fa");
  EXPECT_ERROR(p, &o,
               "%s: error: no such file; check the path (the bundled genomes are "
               "data/chr20_slice.fa.gz and data/lambda_phage.fa.gz; scripts/fetch_data.sh "
               "downloads the full data/chr20.fa.gz)",
               p);

  EXPECT_ERROR(tmpdir, &o, "%s: error: is a directory; give a FASTA file (.fa, .fa.gz or BGZF)",
               tmpdir);

  test_permission_denied();

  p = write_text("reads.fq", "@read1\nACGT\n+\nIIII\n");
  EXPECT_ERROR(p, &o,
               "%s:1: error: this looks like FASTQ (the line starts with '@'), not FASTA; "
               "convert it first, e.g. `seqtk seq -A %s > reads.fa` or `samtools fasta %s > "
               "reads.fa`",
               p, p, p);

  p = write_bytes("binary.bin", "\x7f" "ELF\x02\x01\x01\x00\n\x00\x00", 11);
  EXPECT_ERROR(p, &o,
               "%s:1:1: error: binary data (byte 0x7f): this is not a FASTA text file; give a "
               "FASTA file (.fa, .fa.gz or BGZF) with '>name' header lines and sequence lines",
               p);
  p = write_bytes("nul.bin", "AC\x00GT\n", 6);
  EXPECT_ERROR(p, &o,
               "%s:1:3: error: binary data (byte 0x00): this is not a FASTA text file; give a "
               "FASTA file (.fa, .fa.gz or BGZF) with '>name' header lines and sequence lines",
               p);
  p = write_bytes("nulhdr.fa", ">x\x00y\nACGT\n", 10);
  EXPECT_ERROR(p, &o,
               "%s:1: error: binary data (a NUL byte) in a header line: this is not a FASTA "
               "text file",
               p);

  p = write_text("nohdr.fa", "\nACGTACGT\n>x\nACGT\n");
  EXPECT_ERROR(p, &o,
               "%s:2: error: expected a '>' header line before any sequence; FASTA records start "
               "with a line '>name' followed by their sequence lines\n  ACGTACGT\n  ^",
               p);

  p = write_text("oldmac.fa", ">x\rACGT\rACGT\r");
  EXPECT_ERROR(p, &o,
               "%s:1:3: error: carriage return inside a line: the file seems to use old Mac "
               "line ends (CR only); convert them, e.g. `tr '\\r' '\\n' < %s > fixed.fa`",
               p, p);
  EXPECT_ERROR("", &o, "(no path): error: no FASTA file given; name one (e.g. "
               "data/chr20_slice.fa.gz)");

  p = write_text("empty.fa", "");
  EXPECT_ERROR(p, &o,
               "%s: error: the file is empty (0 bytes); expected FASTA: a '>name' header line "
               "followed by sequence lines",
               p);
  p = write_gzip("empty.fa.gz", "", 0);
  EXPECT_ERROR(p, &o,
               "%s: error: the file is empty; expected FASTA: a '>name' header line followed by "
               "sequence lines",
               p);
  p = write_text("blank.fa", "\n\r\n\n");
  EXPECT_ERROR(p, &o,
               "%s: error: the file is empty (only blank lines); expected FASTA: a '>name' "
               "header line followed by sequence lines",
               p);

  p = write_text("headers.fa", ">a\n>b\n\n>c\n");
  EXPECT_ERROR(p, &o,
               "%s: error: no sequence: the file has 3 header lines ('>') and no bases; each "
               "record needs sequence lines after its header",
               p);

  p = write_text("emptyrec.fa", ">a\nACGTACGT\n>b desc\n>c\nACGT\n");
  EXPECT_ERROR(p, &o,
               "%s:3: error: record 'b' has no bases (its header is followed by another "
               "header); remove the empty record or add its sequence",
               p);
  p = write_text("emptylast.fa", ">a\nACGTACGT\n>last\n\n");
  EXPECT_ERROR(p, &o,
               "%s:3: error: record 'last' has no bases (its header is followed by the end of "
               "the file); remove the empty record or add its sequence",
               p);

  p = write_text("alln.fa", ">gap\nNNNNNNNN\nnnnnRY\n");
  EXPECT_ERROR(p, &o,
               "%s: error: no A/C/G/T bases: all 14 bases are N or other ambiguity codes, so "
               "every label would be masked; give a FASTA with real sequence",
               p);

  p = write_text("badchar.fa", ">chr1 test\nACGTACGT\nACGXACGT\n");
  EXPECT_ERROR(p, &o,
               "%s:3:4: error: invalid character 'X' (0x58) in the sequence of record 'chr1'; "
               "sequence lines may hold only IUPAC nucleotide codes (ACGTU RYSWKMBDHVN, either "
               "case): fix or remove it\n  ACGXACGT\n     ^",
               p);
  p = write_text("badchar2.fa", ">r\r\nAC-GT\r\n");
  EXPECT_ERROR(p, &o,
               "%s:2:3: error: invalid character '-' (0x2d) in the sequence of record 'r'; "
               "sequence lines may hold only IUPAC nucleotide codes (ACGTU RYSWKMBDHVN, either "
               "case): fix or remove it\n  AC-GT\n    ^",
               p);
  p = write_bytes("badbyte.fa", ">r\nACGT\nAC\x01GT\n", 14);
  EXPECT_ERROR(p, &o,
               "%s:3:3: error: invalid byte 0x01 in the sequence of record 'r'; sequence lines "
               "may hold only IUPAC nucleotide codes (ACGTU RYSWKMBDHVN, either case): fix or "
               "remove it\n  AC.GT\n    ^",
               p);

  /* gzip truncation and corruption */
  int64_t len = 400000;
  rng_state = 5;
  char *fa = random_fasta(1, &len, 60, NULL);
  const char *pg = write_gzip("big.fa.gz", fa, strlen(fa));
  const char *pb = write_bgzf("big.bgz", fa, strlen(fa));
  free(fa);
  size_t n;
  unsigned char *gz = read_all(pg, &n);
  p = write_bytes("trunc.fa.gz", gz, n / 2);
  EXPECT_ERROR(p, &o,
               "%s: error: gzip data: the compressed data ends early: the file is truncated "
               "(after line #); re-download or regenerate the file (`gzip -t %s` checks it)",
               p, p);
  p = write_bytes("trunchdr.fa.gz", gz, 12);
  EXPECT_ERROR(p, &o,
               "%s: error: gzip data: the gzip header is incomplete: the file is truncated or "
               "corrupt; re-download or regenerate it (`gzip -t %s` checks it)",
               p, p);
  for (size_t i = n / 3; i < n / 3 + 64; i++) gz[i] ^= 0x5a;
  p = write_bytes("corrupt.fa.gz", gz, n);
  EXPECT_ERROR(p, &o,
               "%s: error: gzip data: decompression failed: the compressed data is corrupt "
               "(after line #); re-download or regenerate the file (`gzip -t %s` checks it)",
               p, p);
  free(gz);
  unsigned char *bg = read_all(pb, &n);
  p = write_bytes("trunc.bgz", bg, n - 28); /* without the EOF block */
  EXPECT_ERROR(p, &o,
               "%s: error: BGZF data: the end-of-file marker is missing: the file is truncated; "
               "re-download or regenerate it (`bgzip -t %s` checks it)",
               p, p);
  p = write_bytes("trunc2.bgz", bg, n / 2);
  EXPECT_ERROR(p, &o,
               "%s: error: BGZF data: the end-of-file marker is missing: the file is truncated; "
               "re-download or regenerate it (`bgzip -t %s` checks it)",
               p, p);
  free(bg);

  /* options */
  p = write_text("ok.fa", ">x\nACGTACGTAC\n");
  data_opts b = opts(4, 4, 1.0);
  EXPECT_ERROR(p, &b,
               "%s: error: val_fraction = 1 is out of range; use a value in [0, 1), e.g. 0.05 "
               "(0 turns validation off)",
               p);
  b.val_fraction = -0.1;
  EXPECT_ERROR(p, &b,
               "%s: error: val_fraction = -0.1 is out of range; use a value in [0, 1), e.g. 0.05 "
               "(0 turns validation off)",
               p);
  b.val_fraction = NAN;
  EXPECT_ERROR(p, &b,
               "%s: error: val_fraction = nan is out of range; use a value in [0, 1), e.g. 0.05 "
               "(0 turns validation off)",
               p);
  b = opts(0, 0, 0.0);
  EXPECT_ERROR(p, &b, "%s: error: seq = 0 is out of range; a window needs seq >= 1 tokens", p);
  b = opts(4, 5, 0.0);
  EXPECT_ERROR(p, &b,
               "%s: error: stride = 5 is out of range; use 1..seq (4), or 0 for stride = seq "
               "(overlap = seq - stride)",
               p);
  b = opts(64, 0, 0.5);
  EXPECT_ERROR(p, &b,
               "%s: error: genome too short for one window: the training split has 6 tokens "
               "(5 bases + 1 BOS/EOS) but seq = 64 needs 65 (a window and one more token for "
               "its last label); use a smaller seq (at most 5), or a longer genome (about 128 "
               "bases at val_fraction 0.5)",
               p);
  /* err may be NULL */
  CHECK(data_open(p, &b, NULL, 0) == NULL, "NULL err");
}

static void rm_tree(const char *dir) {
  DIR *dp = opendir(dir);
  if (!dp) return;
  struct dirent *e;
  char path[600];
  while ((e = readdir(dp))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(dp);
  rmdir(dir);
}

int main(void) {
  const char *base = getenv("TMPDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/moec_test_data_XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 2;
  }
  chmod(tmpdir, 0755); /* the permission test reads it as nobody */

  test_special_ids();
  test_tiny_exact();
  test_windows_and_stride();
  test_short_records_packed();
  test_val_split();
  test_determinism_and_resume();
  test_reverse_complement();
  test_compressed_inputs();
  test_bad_data();
  test_bundled();

  rm_tree(tmpdir);
  printf("test_data: %d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
