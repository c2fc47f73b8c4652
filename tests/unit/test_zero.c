/* test_zero.c -- ZeRO-1 on the CPU (ranks as threads): `--set zero=true` shards every
 * parameter's AdamW update over its reduce group (passes/sync.c, runtime/zero.c).
 *   - the dump: each sharded adamw reads a reduce_scatter and is followed by its all_gather;
 *     grad_norm reads the shards; `moec compile` predicts half the AdamW bytes at dp=2;
 *   - dp=2, a checkpoint every 2 steps (each rank writing its shards): the same logged values,
 *     model bytes and moments as dp=2 without zero (same sums, in the same order), and each
 *     rank holds half the moments;
 *   - dp=4, ep=2 x dp=2, ep=2 alone: the same as one rank (<= 1e-5 relative, parallel_test.h);
 *   - moments = bf16 with zero: the same bytes as without;
 *   - checkpoints move in and out of zero and across layouts (each rank writing its shards): dp=2
 *     zero -> one rank, one rank -> ep=2 x dp=2 zero, dp=2 zero -> dp=4 zero, ep=2 x dp=2 zero
 *     -> ep=2, and dp=6 zero with empty shards -> one rank.
 * Needs $MOEC (ctest sets it). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "parallel_test.h"

/* Runs a (without zero) and b (with) wrote the same checkpoint at step `steps`: the model file
 * byte for byte, the moments bit for bit (b's assembled from its ranks' shards), and b's
 * optimizer state as one part a rank, each holding shards alone. */
static void same_bytes(const char *a, const char *b, int steps) {
  char cmd[1024], step[32];
  snprintf(cmd, sizeof cmd, "cmp -s %s/%s/step-%08d/model.safetensors %s/%s/step-%08d/model.safetensors", tmp, a, steps,
           tmp, b, steps);
  CHECK(system(cmd) == 0, "%s and %s: model.safetensors differ", a, b);
  snprintf(step, sizeof step, "step-%08d", steps);
  CHECK(compare_ckpt_as(a, b, step, "optimizer", 1) == 0, "%s and %s: the moments differ", a, b);
  snprintf(cmd, sizeof cmd, "cd %s/%s/%s && test -f optimizer-00002-of-00002.safetensors && ! grep -q 'exp_avg\"' "
           "optimizer.safetensors.index.json && grep -q 'exp_avg.shard' optimizer.safetensors.index.json", tmp, b, step);
  CHECK(system(cmd) == 0, "%s: not two optimizer parts of shards alone", b);
  double x[64], y[64];
  int nx = read_log(a, x, 64), ny = read_log(b, y, 64);
  CHECK(nx == 3 * steps && ny == nx && memcmp(x, y, (size_t)nx * sizeof *x) == 0, "%s and %s: logged values differ", a, b);
}

/* The value of "N units" after `key` in a run's stderr, in bytes (0 when absent). */
static double bytes_after(const char *tag, const char *key) {
  char path[1024], line[1024];
  snprintf(path, sizeof path, "%s/%s.err", tmp, tag);
  FILE *f = fopen(path, "r");
  double v = 0;
  while (f && fgets(line, sizeof line, f)) {
    const char *at = strstr(line, key);
    if (!at) continue;
    char unit[16] = "";
    if (sscanf(at + strlen(key), "%lf %15s", &v, unit) == 2)
      v *= !strncmp(unit, "GiB", 3) ? 1073741824.0 : !strncmp(unit, "MiB", 3) ? 1048576.0 : !strncmp(unit, "KiB", 3) ? 1024.0 : 1.0;
    break;
  }
  if (f) fclose(f);
  return v;
}

/* Counts of the optimizer's ops in the dump of dp=2 (with zero or not). */
typedef struct {
  int adamw, zero_adamw, reduce_scatter, all_gather, all_reduce, norm_sharded;
} dump_counts;

static dump_counts dump(const char *zero) {
  char cmd[2048], line[4096];
  snprintf(cmd, sizeof cmd, "%s dump models/tiny.moe " PARALLEL_TEST_SMALL " --train --set dp=2 --set zero=%s > %s/dump.txt 2>&1",
           moec, zero, tmp);
  CHECK(system(cmd) == 0, "dump with zero=%s failed", zero);
  snprintf(cmd, sizeof cmd, "%s/dump.txt", tmp);
  FILE *f = fopen(cmd, "r");
  dump_counts c = {0};
  while (f && fgets(line, sizeof line, f)) {
    if (strstr(line, "= adamw(")) c.adamw++, c.zero_adamw += strstr(line, "zero=\"world\"") != NULL;
    c.reduce_scatter += strstr(line, "= reduce_scatter(") != NULL;
    c.all_gather += strstr(line, "= all_gather(") != NULL;
    c.all_reduce += strstr(line, "= all_reduce(") != NULL;
    c.norm_sharded += strstr(line, "= grad_norm(") && strstr(line, "sharded=1");
  }
  if (f) fclose(f);
  return c;
}

/* `moec compile`'s predicted AdamW bytes, in bytes (0 when not found). */
static double predicted_moments(const char *zero) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s compile models/tiny.moe " PARALLEL_TEST_SMALL " --set dp=2 --set zero=%s -o %s/b.%s > %s/%s.err 2>&1",
           moec, zero, tmp, zero, tmp, zero);
  CHECK(system(cmd) == 0, "compile with zero=%s failed", zero);
  return bytes_after(zero, "AdamW moments ");
}

/* With zero every adamw is sharded, reads a reduce_scatter and is followed by an all_gather;
 * grad_norm is sharded; the gradients' all_reduces are gone, the others (losses, counts) stay. */
static void check_dump(void) {
  dump_counts z = dump("true"), p = dump("false");
  printf("dump, dp=2 zero: %d adamw (%d sharded), %d reduce_scatter, %d all_gather, %d all_reduce (%d without zero)\n",
         z.adamw, z.zero_adamw, z.reduce_scatter, z.all_gather, z.all_reduce, p.all_reduce);
  CHECK(z.adamw > 0 && z.zero_adamw == z.adamw && z.reduce_scatter == z.adamw && z.all_gather == z.adamw &&
            z.norm_sharded == 1, "every adamw sharded, with its reduce_scatter and all_gather");
  CHECK(p.adamw == z.adamw && p.zero_adamw == 0 && p.reduce_scatter == 0 && p.all_gather == 0 && p.norm_sharded == 0,
        "without zero: no shards");
  CHECK(z.all_reduce == p.all_reduce - p.adamw, "zero: %d all_reduce, without %d (%d gradients)", z.all_reduce,
        p.all_reduce, p.adamw);
  double mz = predicted_moments("true"), mp = predicted_moments("false");
  printf("predicted AdamW moments at dp=2: %.0f bytes with zero, %.0f without\n", mz, mp);
  CHECK(mp > 0 && fabs(mz / mp - 0.5) < 0.01, "predicted moments %.0f with zero, %.0f without", mz, mp);
}

/* A run of `args` stopped at step `stop`, resumed with `resume` (the same --steps), matches
 * run `ref` after `steps` steps. */
static void resumed(const char *args, int stop, const char *resume, const char *tag, const char *ref, int steps) {
  char a[512], b[512];
  snprintf(a, sizeof a, "%s --stop-at %d", args, stop);
  snprintf(b, sizeof b, "%s --resume", resume);
  CHECK(run_cpu(a, tag) == 0, "%s: %s failed", tag, a);
  CHECK(run_cpu(b, tag) == 0, "%s: %s failed", tag, b);
  same_as(ref, tag, steps);
}

int main(void) {
  char dir[] = "/tmp/moec-zero-XXXXXX";
  if (parallel_test_begin(dir)) return 1;
  check_dump();
  CHECK(run_cpu("--steps 6", "one") == 0, "one rank failed");
  /* checkpoints every 2 steps: each rank writes its shards, and goes on with them */
  CHECK(run_cpu("--steps 6 --set dp=2 --ckpt-every 2", "dp2") == 0, "dp=2 failed");
  CHECK(run_cpu("--steps 6 --set dp=2 --set zero=true --ckpt-every 2", "dp2z") == 0, "dp=2 zero failed");
  same_bytes("dp2", "dp2z", 6);
  /* the moments each rank holds: half of the whole at dp=2 (shards round up: within 1%) */
  double held = bytes_after("dp2z", "holds "), whole = bytes_after("dp2z", "moments (");
  printf("dp=2 zero: rank 0 holds %.0f of %.0f bytes of moments\n", held, whole);
  CHECK(whole > 0 && fabs(held / whole - 0.5) < 0.01, "dp=2 zero: rank 0 holds %.0f of %.0f bytes", held, whole);
  CHECK(run_cpu("--steps 6 --set dp=4 --set zero=true", "dp4z") == 0, "dp=4 zero failed");
  CHECK(run_cpu("--steps 6 --set ep=2 --set dp=2 --set zero=true", "ep2dp2z") == 0, "ep=2 dp=2 zero failed");
  CHECK(run_cpu("--steps 6 --set ep=2 --set zero=true", "ep2z") == 0, "ep=2 zero failed");
  same_as("one", "dp4z", 6);
  same_as("one", "ep2dp2z", 6);
  same_as("one", "ep2z", 6);
  /* bf16 moments: rounded after each shard's update, as whole ones are */
  CHECK(run_cpu("--steps 4 --set dp=2 --set moments=bf16", "bf") == 0, "dp=2 bf16 moments failed");
  CHECK(run_cpu("--steps 4 --set dp=2 --set moments=bf16 --set zero=true", "bfz") == 0, "dp=2 bf16 moments zero failed");
  same_bytes("bf", "bfz", 4);
  /* checkpoints move: zero's shards -> one rank, one rank -> ep=2 x dp=2 with zero, and zero's
   * shards -> another world size with zero (dp=2 -> dp=4) */
  resumed("--steps 6 --set dp=2 --set zero=true", 3, "--steps 6", "rz1", "one", 6);
  resumed("--steps 6", 3, "--steps 6 --set ep=2 --set dp=2 --set zero=true", "rz2", "one", 6);
  resumed("--steps 6 --set dp=2 --set zero=true", 3, "--steps 6 --set dp=4 --set zero=true", "rz3", "one", 6);
  /* ep=2 x dp=2's shards (experts over DP, the dense over the world) -> ep=2 alone, no zero */
  resumed("--steps 6 --set ep=2 --set dp=2 --set zero=true", 3, "--steps 6 --set ep=2", "rz4", "one", 6);
  /* dp=6 at hidden 8: a norm's 8 values in shards of 2 leave ranks 4 and 5 none (rank 5's would
   * start at 10, past the end): those write nothing of it, and the rest still loads whole */
#define TINY8 "--steps 4 --set hidden=8 --set ffn=8 --set seq=16 --set batch=6 --set heads=2 --set kv_heads=2"
  CHECK(run_cpu(TINY8, "one8") == 0, "one rank at hidden 8 failed");
  resumed(TINY8 " --set dp=6 --set zero=true", 2, TINY8, "rz6", "one8", 4);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
  return failures != 0;
}
