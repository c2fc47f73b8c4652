/* test_parallel.c -- data parallelism on the CPU (ranks as threads): `moec train --set dp=N`
 * on a tiny model gives the same losses, gradient norms, weights and Adam moments as one rank
 * (fp32, <= 1e-5 relative), and so do ep=2 and ep=2 x dp=2 (experts sharded, rows exchanged
 * all-to-all); the checkpoint a DP or EP run writes resumes at another DP or EP size; ep > 1
 * without the fused experts is refused with a message. Needs $MOEC (ctest sets it). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "safetensors.h"

#define SMALL "--set hidden=32 --set ffn=48 --set seq=64 --set batch=4 --set heads=4 --set kv_heads=2 " \
              "--set val_every=0 --val-batches 1 --device cpu"

static const char *moec, *tmp;

static int run(const char *args, const char *tag) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s train models/tiny.moe " SMALL " %s --log %s/%s.jsonl --ckpt-dir %s/%s 2>%s/%s.err", moec,
           args, tmp, tag, tmp, tag, tmp, tag);
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

/* Max over tensors of max|a - b| / max|b| (each tensor's scale), in file `which`. */
static double compare_ckpt(const char *a, const char *b, const char *step, const char *which) {
  char pa[1024], pb[1024], err[512];
  snprintf(pa, sizeof pa, "%s/%s/%s/%s", tmp, a, step, which);
  snprintf(pb, sizeof pb, "%s/%s/%s/%s", tmp, b, step, which);
  st_file *fa = st_open(pa, err, sizeof err), *fb = st_open(pb, err, sizeof err);
  CHECK(fa && fb, "open %s / %s: %s", pa, pb, err);
  double worst = fa && fb ? 0 : INFINITY;
  for (size_t i = 0; fa && fb && i < st_count(fa); i++) {
    const st_view *va = st_at(fa, i), *vb = st_find(fb, va->name);
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
  st_close(fa);
  st_close(fb);
  return worst;
}

static void same_as_one_rank(const char *tag, int steps) {
  double a[64], b[64];
  int na = read_log("dp1", a, 64), nb = read_log(tag, b, 64);
  CHECK(na == 3 * steps && nb == na, "%s: %d and %d logged values", tag, na, nb);
  double worst = 0;
  for (int i = 0; i < na && i < nb; i++) worst = fmax(worst, rel(b[i], a[i]));
  double w = compare_ckpt("dp1", tag, "step-00000006", "model.safetensors");
  double m = compare_ckpt("dp1", tag, "step-00000006", "optimizer.safetensors");
  printf("%s vs one rank: losses/grad norms %.2e, weights %.2e, Adam moments %.2e (max relative)\n", tag, worst, w, m);
  CHECK(worst <= 1e-5 && w <= 1e-5 && m <= 1e-5, "%s differs from one rank beyond 1e-5", tag);
}

int main(void) {
  moec = getenv("MOEC");
  if (!moec) {
    fprintf(stderr, "set MOEC to the moec binary\n");
    return 1;
  }
  char dir[] = "/tmp/moec-parallel-XXXXXX";
  if (!(tmp = mkdtemp(dir))) return 1;
  CHECK(run("--steps 6", "dp1") == 0, "one rank failed");
  CHECK(run("--steps 6 --set dp=2", "dp2") == 0, "dp=2 failed");
  CHECK(run("--steps 6 --set dp=4", "dp4") == 0, "dp=4 failed");
  CHECK(run("--steps 6 --set ep=2", "ep2") == 0, "ep=2 failed");
  CHECK(run("--steps 6 --set ep=2 --set dp=2", "ep2dp2") == 0, "ep=2 dp=2 failed");
  same_as_one_rank("dp2", 6);
  same_as_one_rank("dp4", 6);
  same_as_one_rank("ep2", 6);
  same_as_one_rank("ep2dp2", 6);
  /* a DP checkpoint is the full model: stop dp=2 at step 3, resume at dp=1 and at dp=4 */
  CHECK(run("--steps 6 --set dp=2 --stop-at 3", "rs1") == 0, "dp=2 --stop-at 3 failed");
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cp -r %s/rs1 %s/rs4 && cp %s/rs1.jsonl %s/rs4.jsonl", tmp, tmp, tmp, tmp);
  CHECK(system(cmd) == 0, "copy");
  CHECK(run("--steps 6 --resume", "rs1") == 0, "resume at dp=1 failed");
  CHECK(run("--steps 6 --set dp=4 --resume", "rs4") == 0, "resume at dp=4 failed");
  same_as_one_rank("rs1", 6);
  same_as_one_rank("rs4", 6);
  /* an EP checkpoint is the full model too (gathered to rank 0): ep=2 -> ep=1, ep=1 -> ep=2 x dp=2 */
  CHECK(run("--steps 6 --set ep=2 --stop-at 3", "re1") == 0, "ep=2 --stop-at 3 failed");
  CHECK(run("--steps 6 --resume", "re1") == 0, "resume at ep=1 failed");
  CHECK(run("--steps 6 --stop-at 3", "re2") == 0, "ep=1 --stop-at 3 failed");
  CHECK(run("--steps 6 --set ep=2 --set dp=2 --resume", "re2") == 0, "resume at ep=2 dp=2 failed");
  same_as_one_rank("re1", 6);
  same_as_one_rank("re2", 6);
  /* batch must split evenly; ep > 1 over the naive experts is refused with a message */
  CHECK(run("--steps 1 --set dp=3", "bad") != 0, "dp=3 with batch 4 ran");
  snprintf(cmd, sizeof cmd, "grep -q 'not a multiple of ep x dp' %s/bad.err", tmp);
  CHECK(system(cmd) == 0, "dp=3 message");
  CHECK(run("--steps 1 --set ep=2 --disable-pass grouped-mlp", "ep") != 0, "ep=2 with unfused experts ran");
  snprintf(cmd, sizeof cmd, "grep -q 'needs the fused experts' %s/ep.err", tmp);
  CHECK(system(cmd) == 0, "ep=2 unfused message");
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
  return failures != 0;
}
