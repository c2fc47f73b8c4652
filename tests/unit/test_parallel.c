/* test_parallel.c -- data parallelism on the CPU (ranks as threads): `moec train --set dp=N`
 * on a tiny model gives the same losses, gradient norms, weights and Adam moments as one rank
 * (fp32, <= 1e-5 relative), and so do ep=2 and ep=2 x dp=2 (experts sharded, rows exchanged
 * all-to-all); the checkpoint a DP or EP run writes resumes at another DP or EP size (with EP
 * each EP rank writes its own part: ep=2 -> 1, 1 -> ep=2 x dp=2, ep=2 -> 4); ep > 1 without the
 * fused experts is refused with a message. Needs $MOEC (ctest sets it). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "parallel_test.h"

static void same_as_one_rank(const char *tag, int steps) { same_as("dp1", tag, steps); }

/* Run tag's checkpoint at step is sharded in n parts of each kind (one per EP rank), the parts
 * after the first holding experts only (their EP rank's), every part some. */
static void check_sharded(const char *tag, int step, size_t n) {
  for (int kind = 0; kind < 2; kind++) {
    char path[1024], err[512] = "";
    snprintf(path, sizeof path, "%s/%s/step-%08d", tmp, tag, step);
    ckpt_tset t;
    int ok = ckpt_tset_open(&t, path, kind ? "optimizer" : "model", err, sizeof err) == 0;
    CHECK(ok && t.index && t.n == n, "%s: %s: not %zu parts with an index: %s", tag, kind ? "optimizer" : "model", n, err);
    for (size_t k = 0; ok && k < t.n; k++) {
      CHECK(st_count(t.files[k]) > 0, "%s: part %zu is empty", tag, k);
      for (size_t i = 0; k > 0 && i < st_count(t.files[k]); i++)
        CHECK(strstr(st_at(t.files[k], i)->name, ".experts."), "%s: part %zu holds %s", tag, k, st_at(t.files[k], i)->name);
    }
    ckpt_tset_close(&t); /* a failed open may hold some parts */
  }
}

int main(void) {
  char dir[] = "/tmp/moec-parallel-XXXXXX";
  if (parallel_test_begin(dir)) return 1;
  CHECK(run_cpu("--steps 6", "dp1") == 0, "one rank failed");
  CHECK(run_cpu("--steps 6 --set dp=2", "dp2") == 0, "dp=2 failed");
  CHECK(run_cpu("--steps 6 --set dp=4", "dp4") == 0, "dp=4 failed");
  CHECK(run_cpu("--steps 6 --set ep=2", "ep2") == 0, "ep=2 failed");
  CHECK(run_cpu("--steps 6 --set ep=2 --set dp=2", "ep2dp2") == 0, "ep=2 dp=2 failed");
  same_as_one_rank("dp2", 6);
  same_as_one_rank("dp4", 6);
  same_as_one_rank("ep2", 6);
  same_as_one_rank("ep2dp2", 6);
  /* a DP checkpoint is the full model: stop dp=2 at step 3, resume at dp=1 and at dp=4 */
  CHECK(run_cpu("--steps 6 --set dp=2 --stop-at 3", "rs1") == 0, "dp=2 --stop-at 3 failed");
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cp -r %s/rs1 %s/rs4 && cp %s/rs1.jsonl %s/rs4.jsonl", tmp, tmp, tmp, tmp);
  CHECK(system(cmd) == 0, "copy");
  CHECK(run_cpu("--steps 6 --resume", "rs1") == 0, "resume at dp=1 failed");
  CHECK(run_cpu("--steps 6 --set dp=4 --resume", "rs4") == 0, "resume at dp=4 failed");
  same_as_one_rank("rs1", 6);
  same_as_one_rank("rs4", 6);
  /* an EP checkpoint (each EP rank's part) is the full model too: ep=2 -> ep=1, ep=1 -> ep=2 x dp=2 */
  CHECK(run_cpu("--steps 6 --set ep=2 --stop-at 3", "re1") == 0, "ep=2 --stop-at 3 failed");
  CHECK(run_cpu("--steps 6 --resume", "re1") == 0, "resume at ep=1 failed");
  CHECK(run_cpu("--steps 6 --stop-at 3", "re2") == 0, "ep=1 --stop-at 3 failed");
  CHECK(run_cpu("--steps 6 --set ep=2 --set dp=2 --resume", "re2") == 0, "resume at ep=2 dp=2 failed");
  same_as_one_rank("re1", 6);
  same_as_one_rank("re2", 6);
  /* each EP rank writes its own part: ep=2's checkpoint is two parts, and it resumes at ep=4 */
  check_sharded("ep2", 6, 2);
  check_sharded("re2", 6, 2);
  CHECK(run_cpu("--steps 6 --set ep=2 --stop-at 3", "re4") == 0, "ep=2 --stop-at 3 failed");
  CHECK(run_cpu("--steps 6 --set ep=4 --resume", "re4") == 0, "resume at ep=4 failed");
  check_sharded("re4", 6, 4);
  same_as_one_rank("re4", 6);
  /* bf16 and mxfp8: each expert's compute copy (a cast of its param) goes with the param to the
     rank that owns it; the losses follow one rank's within the rounding of the sums' order */
  for (int p = 0; p < 2; p++) {
    const char *prec = p ? "mxfp8" : "bf16";
    /* mxfp8 blocks of 32: every width it quantizes (hidden, ffn, the k/v width) a multiple */
    const char *sizes = p ? "--set hidden=64 --set ffn=64" : "";
    char args[192], one[16], two[16];
    snprintf(one, sizeof one, "%s1", prec);
    snprintf(two, sizeof two, "%s2", prec);
    snprintf(args, sizeof args, "--steps 4 --set precision=%s %s", prec, sizes);
    CHECK(run_cpu(args, one) == 0, "%s, one rank failed", prec);
    snprintf(args, sizeof args, "--steps 4 --set precision=%s %s --set ep=2", prec, sizes);
    CHECK(run_cpu(args, two) == 0, "%s, ep=2 failed", prec);
    double a[64], b[64];
    int na = read_log(one, a, 64), nb = read_log(two, b, 64);
    double worst = 0;
    for (int i = 0; i < na && i < nb; i++) worst = fmax(worst, rel(b[i], a[i]));
    printf("%s ep=2 vs one rank: losses/grad norms %.2e (max relative)\n", prec, worst);
    CHECK(na == 12 && nb == na && worst <= 1e-3, "%s ep=2: %d/%d logged values, %.2e from one rank", prec, na, nb, worst);
  }
  /* batch must split evenly; ep > 1 over the naive experts is refused with a message */
  CHECK(run_cpu("--steps 1 --set dp=3", "bad") != 0, "dp=3 with batch 4 ran");
  snprintf(cmd, sizeof cmd, "grep -q 'not a multiple of ep x dp' %s/bad.err", tmp);
  CHECK(system(cmd) == 0, "dp=3 message");
  CHECK(run_cpu("--steps 1 --set ep=2 --disable-pass grouped-mlp", "ep") != 0, "ep=2 with unfused experts ran");
  snprintf(cmd, sizeof cmd, "grep -q 'needs the fused experts' %s/ep.err", tmp);
  CHECK(system(cmd) == 0, "ep=2 unfused message");
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
  return failures != 0;
}
