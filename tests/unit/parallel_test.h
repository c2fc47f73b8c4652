/* parallel_test.h -- what the data/expert-parallel equivalence tests share (test_parallel on the
 * CPU, test_gpu_parallel on GPUs): the values a `moec train --log` wrote, and the comparison of
 * a run's losses, weights and Adam moments with the one-rank run's. Runs live in tmp/TAG.jsonl
 * and tmp/TAG/step-N. Include once per test program, after check.h. */
#ifndef MOEC_PARALLEL_TEST_H
#define MOEC_PARALLEL_TEST_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_int.h"
#include "safetensors.h"

static const char *moec; /* $MOEC */
static const char *tmp;  /* the runs' directory */

/* moec from $MOEC and a fresh tmp, dir ("/tmp/moec-NAME-XXXXXX", made here); 0, or -1 after a
 * message. */
static int parallel_test_begin(char *dir) {
  if (!(moec = getenv("MOEC"))) {
    fprintf(stderr, "set MOEC to the moec binary\n");
    return -1;
  }
  if (!(tmp = mkdtemp(dir))) perror(dir);
  return tmp ? 0 : -1;
}

/* The CPU tests' small tiny: `moec train` of it plus args, logging to tmp/TAG.jsonl,
 * checkpointing in tmp/TAG, stderr into tmp/TAG.err; system()'s status. */
#define PARALLEL_TEST_SMALL "--set hidden=32 --set ffn=48 --set seq=64 --set batch=4 --set heads=4 --set kv_heads=2 " \
                            "--set val_every=0"
static inline int run_cpu(const char *args, const char *tag) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s train models/tiny.moe " PARALLEL_TEST_SMALL " --val-batches 1 --device cpu %s --log %s/%s.jsonl "
           "--ckpt-dir %s/%s 2>%s/%s.err", moec, args, tmp, tag, tmp, tag, tmp, tag);
  return system(cmd);
}

/* "loss", "ce" and "grad_norm" of every step line, in order. */
static int read_log(const char *tag, double *v, int max) {
  char path[1024], line[1024];
  snprintf(path, sizeof path, "%s/%s.jsonl", tmp, tag);
  FILE *f = fopen(path, "r");
  int n = 0;
  while (f && fgets(line, sizeof line, f))
    for (const char *key = "\"loss\":"; strstr(line, "\"step\"") && strstr(line, key) && n + 3 <= max; key = NULL) {
      v[n++] = atof(strstr(line, "\"loss\":") + 7);
      v[n++] = atof(strstr(line, "\"ce\":") + 5);
      v[n++] = atof(strstr(line, "\"grad_norm\":") + 12);
      break;
    }
  if (f) fclose(f);
  return n;
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

/* max|x - y| / max|y| over n values (0 when y is all zero). */
static double rel_diff(const float *x, const float *y, int64_t n) {
  double d = 0, m = 0;
  for (int64_t k = 0; k < n; k++) {
    d = fmax(d, fabs((double)x[k] - (double)y[k]));
    m = fmax(m, fabs((double)y[k]));
  }
  return m > 0 ? d / m : 0;
}

/* Max over tensors of max|a - b| / max|b| (each tensor's scale), of kind `which` ("model" or
 * "optimizer"): one file, or the parts of a sharded (EP, ZeRO) checkpoint (ckpt_int.h reads
 * all). The moments are compared whole, each assembled from its ZeRO shards where saved so;
 * with bits, the largest difference must be 0 (returned as 1 otherwise). */
static double compare_ckpt_as(const char *a, const char *b, const char *step, const char *which, int bits) {
  char pa[1024], pb[1024], err[512] = "";
  snprintf(pa, sizeof pa, "%s/%s/%s", tmp, a, step);
  snprintf(pb, sizeof pb, "%s/%s/%s", tmp, b, step);
  const int opt = !strcmp(which, "optimizer");
  ckpt_tset model, ta, tb;
  int om = ckpt_tset_open(&model, pa, "model", err, sizeof err) == 0;
  int oa = om && ckpt_tset_open(&ta, pa, which, err, sizeof err) == 0;
  int ob = oa && ckpt_tset_open(&tb, pb, which, err, sizeof err) == 0;
  if (!om) ckpt_tset_close(&model); /* a failed open may hold some parts */
  if (om && !oa) ckpt_tset_close(&ta);
  if (oa && !ob) ckpt_tset_close(&tb);
  CHECK(ob, "open %s of %s / %s: %s", which, pa, pb, err);
  double worst = ob ? 0 : INFINITY;
  CHECK(!ob || opt || ckpt_tset_count(&ta) == ckpt_tset_count(&tb), "%s: %zu and %zu tensors", which,
        ckpt_tset_count(&ta), ckpt_tset_count(&tb));
  /* every parameter of a's model: its weight, or its two moments */
  for (size_t f = 0; ob && f < model.n; f++)
    for (size_t i = 0; i < st_count(model.files[f]); i++) {
      const st_view *w = st_at(model.files[f], i);
      for (int k = 0; k < (opt ? 2 : 1); k++) {
        char nm[1024];
        snprintf(nm, sizeof nm, "%s%s", w->name, opt ? (k ? ".exp_avg_sq" : ".exp_avg") : "");
        float *x = malloc((size_t)w->numel * sizeof *x + 1), *y = malloc((size_t)w->numel * sizeof *y + 1);
        int ra = x && y ? ckpt_tset_read(&ta, nm, w->ndim, w->shape, x, err, sizeof err) : -1;
        int rb = ra == 0 ? ckpt_tset_read(&tb, nm, w->ndim, w->shape, y, err, sizeof err) : -1;
        CHECK(rb == 0, "%s: %s: %s", which, nm, err);
        if (rb == 0) {
          double d = rel_diff(x, y, w->numel);
          if (bits && memcmp(x, y, (size_t)w->numel * sizeof *x)) d = fmax(d, 1);
          worst = fmax(worst, d);
        }
        free(x);
        free(y);
      }
    }
  if (ob) ckpt_tset_close(&tb);
  if (oa) ckpt_tset_close(&ta);
  if (om) ckpt_tset_close(&model);
  return worst;
}

static double compare_ckpt(const char *a, const char *b, const char *step, const char *which) {
  return compare_ckpt_as(a, b, step, which, 0);
}

/* Run `tag` against run `one` (one rank) after `steps` steps: losses, grad norms, weights and
 * moments within 1e-5 relative. */
static void same_as(const char *one, const char *tag, int steps) {
  double a[64], b[64];
  char step[32];
  snprintf(step, sizeof step, "step-%08d", steps);
  int na = read_log(one, a, 64), nb = read_log(tag, b, 64);
  CHECK(na == 3 * steps && nb == na, "%s: %d and %d logged values", tag, na, nb);
  double worst = 0;
  for (int i = 0; i < na && i < nb; i++) worst = fmax(worst, rel(b[i], a[i]));
  double w = compare_ckpt(one, tag, step, "model");
  double m = compare_ckpt(one, tag, step, "optimizer");
  printf("%s vs one rank: losses/grad norms %.2e, weights %.2e, Adam moments %.2e (max relative)\n", tag, worst, w, m);
  CHECK(worst <= 1e-5 && w <= 1e-5 && m <= 1e-5, "%s differs from one rank beyond 1e-5", tag);
}

#endif
