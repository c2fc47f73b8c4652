/* test_gpu_parallel.c -- data and expert parallelism on GPUs (issue 7):
 *  1. gpu_comm's host-staged transport, 2 ranks as threads on GPU 0: all_reduce_sum (f32 in
 *     rank order bit for bit, bf16 summed in f32 and rounded once, i32) and all_to_all_v with
 *     uneven and empty segments, against sums and copies made on the host;
 *  2. `moec train --device cuda` on tiny (fp32, 6 steps; MOEC_GPU_PARALLEL_STEPS) at dp=2 (naive and fused experts), ep=2 and
 *     ep=2 x dp=2 (fused experts), ranks as threads on one GPU through the host-staged
 *     transport: the same losses, grad norms, weights and Adam moments as one rank on the GPU
 *     (<= 1e-5 relative, as test_parallel on the CPU); the same with ZeRO-1 (zero = true: dp=2,
 *     ep=2 x dp=2; and at hidden 34, whose norms do not split into 4 equal shares: ZeRO's
 *     padded collectives beside the in-place ones), and gpu_comm's reduce_scatter and
 *     all_gather on their own; resumes (a
 *     tensor at a time straight to the device; ZeRO's shards written by each rank and cut to
 *     each rank's on the way in): one rank, and dp=2 with zero resumed at ep=2 x dp=2 with zero;
 *  3. with 2+ GPUs and NCCL: dp=2 and ep=2 over NCCL (ranks as threads, one GPU each), ep=2 as
 *     2 processes (moec launch), and dp=2 with ZeRO-1, against the same one-rank runs.
 * Needs $MOEC (ctest sets it). Prints SKIP and passes where there is no CUDA driver or GPU. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm.h"
#include "cpu_kernels.h"
#include "gpu_comm.h"
#include "gpu_loader.h"
#include "gpu_nccl.h"
#include "parallel_test.h"

#define SMALL "--set hidden=32 --set ffn=48 --set seq=64 --set batch=4 --set heads=4 --set kv_heads=2 " \
              "--set val_every=0 --val-batches 1 --device cuda --set precision=fp32"
/* the fused experts for every run that compares with ep > 1 (one rank too: the same sums) */
#define NAIVE "--disable-pass=group-linear,grouped-mlp" /* the per-expert linears (the default is fused) */
#define FUSED "--passes=lower,group-linear,grouped-mlp,parallelize,autodiff,sync,fold-grad-cast,fuse-residual,dce"

/* steps a run trains: 6, or MOEC_GPU_PARALLEL_STEPS (at least 2; CI's emulator runs 3, each
   emulated step taking seconds); the resumes stop half way */
static int steps = 6;

static int run(const char *env, const char *launch, const char *args, const char *tag) {
  char cmd[3072];
  /* a stuck collective fails after half the run's time with the rank and the collective named,
     well before the outer timeout kills it without a word: 120 s a run, or MOEC_TEST_RUN_TIMEOUT
     (the CPU emulator, slower, on a busy CI machine) */
  const char *t = getenv("MOEC_TEST_RUN_TIMEOUT");
  const int limit = t && atoi(t) > 0 ? atoi(t) : 120;
  snprintf(cmd, sizeof cmd,
           "MOEC_COMM_TIMEOUT=%d %s timeout -k 5 %d %s %s train models/tiny.moe " SMALL " --steps %d %s --log %s/%s.jsonl --ckpt-dir %s/%s 2>%s/%s.err",
           limit / 2, env, limit, launch, moec, steps, args, tmp, tag, tmp, tag, tmp, tag);
  int rc = system(cmd);
  if (rc != 0) {
    snprintf(cmd, sizeof cmd, "tail -5 %s/%s.err >&2", tmp, tag);
    if (system(cmd) != 0) fprintf(stderr, "(no %s.err)\n", tag);
  }
  return rc;
}

/* 1 when the run's stderr says its collectives went over `kind` */
static int used(const char *tag, const char *kind) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "grep -q \"collectives between the ranks' GPUs: %s\" %s/%s.err", kind, tmp, tag);
  return system(cmd) == 0;
}

/* ---- 1. the host-staged transport on its own ---- */
enum { NR = 2, NV = 1027 };
typedef struct {
  comm_world *w;
  int rank;
} rank_arg;

static float vals(int r, int i) { return (float)((i * 37 + r * 11) % 101) * 0.173f - 8.0f + (float)r * 1e-3f; }

/* ZeRO's two: reduce_scatter of a padded tensor (each rank its chunk of the rank-order sum,
 * zero in the padding) and all_gather of one chunk a rank, in group rank order. d and d2 hold
 * NV + 64 floats. */
static void check_zero_collectives(gpu_ctx *g, gpu_comm *c, int rank, gpu_ptr d, gpu_ptr d2) {
  enum { CH = (NV + NR - 1) / NR };
  float x[NR * CH], y[NR * CH];
  char err[1024];
  for (int i = 0; i < NR * CH; i++) x[i] = i < NV ? vals(rank, i) : 0.0f;
  gpu_upload(g, d2, x, sizeof x);
  CHECK(gpu_comm_reduce_scatter_sum(c, COMM_WORLD, d2, d, CH, err, sizeof err) == 0, "reduce_scatter: %s", err);
  gpu_download(g, y, d, CH * 4);
  int bad = 0;
  for (int i = 0; i < CH; i++) {
    int at = rank * CH + i;
    float want = 0;
    if (at < NV) {
      want = vals(0, at);
      for (int r = 1; r < NR; r++) want += vals(r, at);
    }
    bad += memcmp(&y[i], &want, 4) != 0;
  }
  CHECK(bad == 0, "rank %d: %d reduce_scatter values are not the rank-order sums", rank, bad);
  for (int i = 0; i < CH; i++) x[i] = (float)(1000 * rank + i);
  gpu_upload(g, d, x, CH * 4);
  CHECK(gpu_comm_all_gather(c, COMM_WORLD, d, d2, CH * 4, err, sizeof err) == 0, "all_gather: %s", err);
  gpu_download(g, y, d2, sizeof y);
  bad = 0;
  for (int j = 0; j < NR; j++)
    for (int i = 0; i < CH; i++) bad += y[j * CH + i] != (float)(1000 * j + i);
  CHECK(bad == 0, "rank %d: all_gather placed %d values wrong", rank, bad);
}

static void *comm_rank_main(void *p) {
  rank_arg *a = p;
  char err[1024];
  gpu_ctx *g = gpu_open(0, err, sizeof err);
  gpu_comm *c = g ? gpu_comm_new(GPU_COMM_HOST, a->w, a->rank, g, err, sizeof err) : NULL;
  CHECK(c != NULL, "rank %d: %s", a->rank, err);
  if (!c) {
    comm_abort(a->w, a->rank, err);
    if (g) gpu_close(g);
    return NULL;
  }
  gpu_ptr d = 0, d2 = 0;
  CHECK(gpu_alloc(g, &d, NV * 4 + 256, "a test buffer") == 0 && gpu_alloc(g, &d2, NV * 4 + 256, "a test buffer") == 0, "alloc");
  float x[NV], y[NV], want[NV];
  int32_t xi[NV], yi[NV];
  uint16_t xb[NV], yb[NV];
  /* f32: the rank-order sum, bit for bit */
  for (int i = 0; i < NV; i++) {
    x[i] = vals(a->rank, i);
    want[i] = vals(0, i);
    for (int r = 1; r < NR; r++) want[i] += vals(r, i);
  }
  gpu_upload(g, d, x, sizeof x);
  CHECK(gpu_comm_all_reduce_sum(c, COMM_WORLD, d, NV, GPU_COMM_F32, err, sizeof err) == 0, "f32: %s", err);
  gpu_download(g, y, d, sizeof y);
  CHECK(memcmp(y, want, sizeof y) == 0, "rank %d: f32 all_reduce is not the rank-order sum", a->rank);
  /* bf16: summed in f32, rounded once (what the CPU ranks do with bf16 values) */
  for (int i = 0; i < NV; i++) {
    xb[i] = ck_float_to_bf16(vals(a->rank, i));
    float s = ck_bf16_to_float(ck_float_to_bf16(vals(0, i)));
    for (int r = 1; r < NR; r++) s += ck_bf16_to_float(ck_float_to_bf16(vals(r, i)));
    want[i] = ck_bf16_to_float(ck_float_to_bf16(s));
  }
  gpu_upload(g, d, xb, sizeof xb);
  CHECK(gpu_comm_all_reduce_sum(c, COMM_WORLD, d, NV, GPU_COMM_BF16, err, sizeof err) == 0, "bf16: %s", err);
  gpu_download(g, yb, d, sizeof yb);
  int bad = 0;
  for (int i = 0; i < NV; i++) bad += ck_bf16_to_float(yb[i]) != want[i];
  CHECK(bad == 0, "rank %d: %d bf16 sums differ", a->rank, bad);
  for (int i = 0; i < NV; i++) xi[i] = i * (a->rank + 1) - 500;
  gpu_upload(g, d, xi, sizeof xi);
  CHECK(gpu_comm_all_reduce_sum(c, COMM_WORLD, d, NV, GPU_COMM_I32, err, sizeof err) == 0, "i32: %s", err);
  gpu_download(g, yi, d, sizeof yi);
  bad = 0;
  for (int i = 0; i < NV; i++) bad += yi[i] != i * (NR * (NR + 1) / 2) - 500 * NR;
  CHECK(bad == 0, "rank %d: %d i32 sums differ", a->rank, bad);
  /* all_to_all_v: rank r sends n(r, j) = 100 r + 7 j + (r == 1 && j == 0 ? -7 : 0) floats to j
     (rank 1 sends none to rank 0), from offset 4 floats, each segment tagged by (r, j) */
  size_t so[NR], sb[NR], ro[NR], rb[NR], off = 16;
  for (int j = 0; j < NR; j++) {
    int n = a->rank == 1 && j == 0 ? 0 : 100 * a->rank + 7 * j + 3;
    so[j] = off, sb[j] = (size_t)n * 4;
    for (int i = 0; i < n; i++) x[off / 4 + i] = (float)(1000 * a->rank + 100 * j + i);
    off += sb[j];
  }
  size_t roff = 256;
  for (int j = 0; j < NR; j++) { /* what rank j sends me */
    int n = j == 1 && a->rank == 0 ? 0 : 100 * j + 7 * a->rank + 3;
    ro[j] = roff, rb[j] = (size_t)n * 4;
    roff += rb[j];
  }
  gpu_upload(g, d, x, off);
  CHECK(gpu_comm_all_to_all_v(c, COMM_WORLD, d, so, sb, d2, ro, rb, err, sizeof err) == 0, "all_to_all_v: %s", err);
  float *got = malloc(roff);
  gpu_download(g, got, d2, roff);
  bad = 0;
  for (int j = 0; j < NR; j++)
    for (size_t i = 0; i < rb[j] / 4; i++) bad += got[ro[j] / 4 + i] != (float)(1000 * j + 100 * a->rank + (int)i);
  CHECK(bad == 0, "rank %d: all_to_all_v moved %d values wrong", a->rank, bad);
  free(got);
  check_zero_collectives(g, c, a->rank, d, d2);
  gpu_free(g, d);
  gpu_free(g, d2);
  gpu_comm_free(c, 0);
  gpu_close(g);
  return NULL;
}

static void test_host_staged(void) {
  comm_world *w = comm_threads_new(1, NR, 60);
  pthread_t th[NR];
  rank_arg a[NR];
  for (int r = 0; r < NR; r++) {
    a[r] = (rank_arg){w, r};
    pthread_create(&th[r], NULL, comm_rank_main, &a[r]);
  }
  for (int r = 0; r < NR; r++) pthread_join(th[r], NULL);
  comm_world_free(w);
  printf("gpu_comm host-staged, %d ranks on GPU 0: all_reduce_sum f32/bf16/i32, all_to_all_v, reduce_scatter, all_gather (%s)\n", NR,
         failures ? "FAILED" : "ok");
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  char err[1024] = "";
  int ngpus = 0;
  if (gpu_driver_load(err, sizeof err) != 0 || gpu_device_count(&ngpus, err, sizeof err) != 0 || ngpus == 0) {
    printf("SKIP: no CUDA driver or GPU here (%s); GPU parallelism is tested on the H200\n", ngpus == 0 && !err[0] ? "no device" : err);
    return 0;
  }
  char dir[] = "/tmp/moec-gpu-parallel-XXXXXX";
  if (parallel_test_begin(dir)) return 1;
  const char *st = getenv("MOEC_GPU_PARALLEL_STEPS");
  if (st && atoi(st) >= 2) steps = atoi(st);
  printf("test_gpu_parallel: %d steps a run\n", steps);
  test_host_staged();

  /* 2. ranks as threads sharing GPU 0 through host memory */
  const char *host = "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} MOEC_GPU_COMM=host";
  CHECK(run(host, "", NAIVE, "one") == 0, "one rank (naive experts) failed");
  CHECK(run(host, "", FUSED, "onef") == 0, "one rank (fused experts) failed");
  CHECK(run(host, "", NAIVE " --set dp=2", "dp2") == 0, "dp=2 failed");
  CHECK(run(host, "", FUSED " --set dp=2", "dp2f") == 0, "dp=2 (fused experts) failed");
  CHECK(run(host, "", FUSED " --set ep=2", "ep2") == 0, "ep=2 failed");
  CHECK(run(host, "", FUSED " --set ep=2 --set dp=2", "ep2dp2") == 0, "ep=2 x dp=2 failed");
  CHECK(run(host, "", "--set ep=2", "ep2d") == 0, "ep=2 with the driver's default passes failed");
  /* ZeRO-1: sharded AdamW moments, the gradients reduce-scattered and the weights all-gathered */
  CHECK(run(host, "", FUSED " --set dp=2 --set zero=true", "dp2z") == 0, "dp=2 zero failed");
  CHECK(run(host, "", FUSED " --set ep=2 --set dp=2 --set zero=true", "ep2dp2z") == 0, "ep=2 x dp=2 zero failed");
  /* ep=2 alone: the experts' updates whole (their DP group has one rank), the dense ones sharded,
     the two kinds adjacent in the AdamW run */
  CHECK(run(host, "", FUSED " --set ep=2 --set zero=true", "ep2z") == 0, "ep=2 zero failed");
#define ODD " --set hidden=34 --set heads=1 --set kv_heads=1"
  CHECK(run(host, "", FUSED ODD, "oneo") == 0, "one rank at hidden 34 failed");
  CHECK(run(host, "", FUSED ODD " --set ep=2 --set dp=2 --set zero=true", "ep2dp2zo") == 0, "ep=2 x dp=2 zero at hidden 34 failed");
  char fstop[256], zstop[256]; /* the resumes' first halves */
  snprintf(fstop, sizeof fstop, FUSED " --stop-at %d", steps / 2);
  snprintf(zstop, sizeof zstop, FUSED " --set dp=2 --set zero=true --stop-at %d", steps / 2);
  CHECK(run(host, "", fstop, "onefr") == 0, "one rank --stop-at %d failed", steps / 2);
  CHECK(run(host, "", FUSED " --resume", "onefr") == 0, "one rank --resume failed");
  CHECK(run(host, "", zstop, "zr") == 0, "dp=2 zero --stop-at %d failed", steps / 2);
  CHECK(run(host, "", FUSED " --set ep=2 --set dp=2 --set zero=true --resume", "zr") == 0, "ep=2 x dp=2 zero --resume failed");
  for (const char *const *t = (const char *const[]){"dp2", "dp2f", "ep2", "ep2dp2", "ep2d", "dp2z", "ep2dp2z", "ep2z", NULL};
       *t; t++)
    CHECK(used(*t, "host-staged"), "%s: not through the host-staged transport", *t);
  same_as("onef", "dp2z", steps);
  same_as("onef", "ep2dp2z", steps);
  same_as("onef", "ep2z", steps);
  same_as("oneo", "ep2dp2zo", steps);
  same_as("onef", "onefr", steps);
  same_as("onef", "zr", steps);
  same_as("one", "dp2", steps);
  same_as("onef", "dp2f", steps);
  same_as("onef", "ep2", steps);
  same_as("onef", "ep2dp2", steps);
  same_as("onef", "ep2d", steps);

  /* 3. NCCL, one GPU per rank */
  char nerr[1024];
  if (ngpus < 2 || gpu_nccl_load(NULL, nerr, sizeof nerr) != 0) {
    printf("SKIP (NCCL part): %s\n", ngpus < 2 ? "needs 2 GPUs (one per rank)" : nerr);
  } else {
    CHECK(run("MOEC_GPU_COMM=nccl", "", NAIVE " --set dp=2", "ncdp2") == 0, "dp=2 over NCCL failed");
    CHECK(run("MOEC_GPU_COMM=nccl", "", FUSED " --set ep=2", "ncep2") == 0, "ep=2 over NCCL failed");
    char launch[1200];
    snprintf(launch, sizeof launch, "%s launch -n 2", moec);
    CHECK(run("MOEC_GPU_COMM=nccl", launch, FUSED " --set ep=2", "ncep2p") == 0, "ep=2 as 2 processes over NCCL failed");
    CHECK(run("MOEC_GPU_COMM=nccl", "", FUSED " --set dp=2 --set zero=true", "ncdp2z") == 0, "dp=2 zero over NCCL failed");
    for (const char *const *t = (const char *const[]){"ncdp2", "ncep2", "ncep2p", "ncdp2z", NULL}; *t; t++)
      CHECK(used(*t, "NCCL"), "%s: not over NCCL", *t);
    same_as("onef", "ncdp2z", steps);
    same_as("one", "ncdp2", steps);
    same_as("onef", "ncep2", steps);
    same_as("onef", "ncep2p", steps);
  }
  /* impossible configurations say so */
  if (ngpus == 1) {
    CHECK(run("MOEC_GPU_COMM=nccl", "", "--set dp=2", "bad") != 0, "dp=2 over NCCL on one GPU ran");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "grep -q 'NCCL needs a GPU per rank\\|libnccl' %s/bad.err", tmp);
    CHECK(system(cmd) == 0, "NCCL on one GPU: no message saying why");
  }
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
  if (failures == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
  if (failures) {
    printf("test_gpu_parallel: %d failures (runs kept in %s)\n", failures, tmp);
    return 1;
  }
  printf("test_gpu_parallel: GPU ranks match one rank\n");
  return 0;
}
