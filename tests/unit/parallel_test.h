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

/* Max over tensors of max|a - b| / max|b| (each tensor's scale), of kind `which` ("model" or
 * "optimizer"): one file, or the parts of a sharded (EP) checkpoint (ckpt_int.h reads both). */
static double compare_ckpt(const char *a, const char *b, const char *step, const char *which) {
  char pa[1024], pb[1024], err[512] = "";
  snprintf(pa, sizeof pa, "%s/%s/%s", tmp, a, step);
  snprintf(pb, sizeof pb, "%s/%s/%s", tmp, b, step);
  ckpt_tset ta, tb;
  int oa = ckpt_tset_open(&ta, pa, which, err, sizeof err) == 0, ob = oa && ckpt_tset_open(&tb, pb, which, err, sizeof err) == 0;
  if (!oa) ckpt_tset_close(&ta); /* a failed open may hold some parts */
  if (oa && !ob) ckpt_tset_close(&tb);
  CHECK(oa && ob, "open %s of %s / %s: %s", which, pa, pb, err);
  double worst = oa && ob ? 0 : INFINITY;
  CHECK(!(oa && ob) || ckpt_tset_count(&ta) == ckpt_tset_count(&tb), "%s: %zu and %zu tensors", which,
        ckpt_tset_count(&ta), ckpt_tset_count(&tb));
  for (size_t f = 0; oa && ob && f < ta.n; f++)
    for (size_t i = 0; i < st_count(ta.files[f]); i++) {
      const st_view *va = st_at(ta.files[f], i), *vb = ckpt_tset_find(&tb, va->name, NULL);
      CHECK(vb && vb->numel == va->numel && va->dtype == ST_F32, "%s: %s missing or different", which, va->name);
      if (!vb || vb->numel != va->numel || va->dtype != ST_F32) continue;
      const float *x = va->data, *y = vb->data;
      double d = 0, m = 0;
      for (int64_t k = 0; k < va->numel; k++) {
        d = fmax(d, fabs((double)x[k] - (double)y[k]));
        m = fmax(m, fabs((double)y[k]));
      }
      if (m > 0) worst = fmax(worst, d / m);
    }
  if (oa && ob) ckpt_tset_close(&tb);
  if (oa) ckpt_tset_close(&ta);
  return worst;
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
