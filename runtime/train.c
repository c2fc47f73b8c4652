/* train.c -- the training loop on the CPU reference executor: data windows in, AdamW steps
 * out; validation in nats and bits per base; JSON Lines log; crash-safe checkpoints that
 * resume bit-exactly (the batch of a step is a pure function of seed and step). */
#include "train.h"

#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "comm.h"
#include "cpu_exec.h"
#include "cpu_kernels.h"
#include "data.h"
#include "gpu_comm.h"
#include "gpu_exec.h"
#include "gpu_loader.h"
#include "hf_view.h"
#include "memplan.h"
#include "params.h"
#include "pipeline.h"
#include "zero.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int train_param_is_linear_weight(const ir_graph *g, int id) {
  /* linear weights, directly or through a cast, and the expert weights group-linear stacks */
  return pass_param_is_linear_weight(g, id);
}

/* ---- checkpoints (the parameters' Hugging Face view: hf_view.h) ---- */
/* ckpt_contents.progress on a terminal: "LABEL: NN%" over the progress bar's line, written when
 * the percentage changes; progress_clear erases it after. */
typedef struct {
  const char *label;
  int shown; /* the percentage on the line, -1: none yet */
} progress_line;

static void ckpt_progress(void *ctx, int64_t done, int64_t total) {
  progress_line *l = ctx;
  const int pct = total > 0 ? (int)(100.0 * (double)done / (double)total) : 100;
  if (pct == l->shown) return;
  l->shown = pct;
  fprintf(stderr, "\r%s: %3d%%\033[K", l->label, pct);
}

static void progress_clear(int tty) {
  if (tty) fputs("\r\033[K", stderr);
}

/* One rank writes the whole checkpoint (from the GPU runtime rt when not NULL). */
static int save_checkpoint(const ckpt_part *part, gpu_runtime *rt, int64_t step, const char *dir, double loss, int tty) {
  hf_view v;
  char err[1024] = "";
  int rc = hf_view_for_save(part, rt, &v);
  if (rc) snprintf(err, sizeof err, "out of host memory");
  if (rc == 0) {
    ckpt_contents c = hf_view_contents(part->g, &v);
    ckpt_kv kv[] = {{"data_position", CKPT_INT, step, 0, NULL}, {"loss", CKPT_F64, 0, isfinite(loss) ? loss : 0, NULL}};
    c.state = kv;
    c.n_state = 2;
    progress_line pl = {"checkpoint", -1};
    if (tty) c.progress = ckpt_progress, c.progress_ctx = &pl;
    rc = ckpt_save(dir, step, &c, err, sizeof err);
    progress_clear(tty);
  }
  hf_view_free(&v);
  if (rc) fprintf(stderr, "moec: error: --ckpt-dir %s: checkpoint of step %lld not written: %s\n", dir, (long long)step, err);
  else if (err[0]) fprintf(stderr, "moec: warning: %s\n", err);
  return rc;
}


/* Resumes from the checkpoint at path, or where path is "" DIR's latest (its path left in path,
 * CKPT_PATH_LEN bytes): into the host copies, or with rt a tensor at a time straight to the
 * GPU; with check_only, every check and nothing read. */
#define CKPT_PATH_LEN 4096
static int load_checkpoint(const ckpt_part *self, gpu_runtime *rt, rt_params *ps, int subset, const char *dir,
                           char *path, int check_only, int tty) {
  char err[1024] = "";
  int64_t step = 0;
  int found = path[0] ? 1 : ckpt_latest_err(dir, path, CKPT_PATH_LEN, &step, err, sizeof err);
  if (found <= 0) {
    if (found == 0)
      fprintf(stderr, "moec: error: --resume: no checkpoint in '%s' (no '%s/latest'); run without --resume to start fresh\n", dir, dir);
    else
      fprintf(stderr, "moec: error: --resume: %s\n", err);
    return -1;
  }
  hf_view v;
  int rc = hf_view_for_load(self, rt, &v);
  ckpt_state st;
  memset(&st, 0, sizeof st);
  if (rc == 0) {
    ckpt_contents c = hf_view_contents(self->g, &v);
    c.subset = subset ? ".experts." : NULL; /* what other EP ranks hold */
    c.check_only = check_only;
    progress_line pl = {"resuming", -1};
    if (tty) c.progress = ckpt_progress, c.progress_ctx = &pl;
    rc = ckpt_load(path, &c, check_only ? NULL : &st, err, sizeof err);
    progress_clear(tty && !check_only);
    if (rc) fprintf(stderr, "moec: error: --resume: %s\n", err);
  } else {
    fprintf(stderr, "moec: error: out of host memory while resuming\n");
  }
  if (rc == 0 && !check_only) {
    ps->step = st.step;
    ckpt_state_free(&st);
  }
  hf_view_free(&v);
  return rc;
}

/* ---- a checkpoint in parts: each EP rank of DP group 0 writes its part of the model (n_model
 * of them), and every rank of c its part of the optimizer state (its moments: whole ones as
 * self says, and with ZeRO-1 its shards). c: the EP group, or with ZeRO the world. ---- */
static int save_checkpoint_parts(const ckpt_part *self, gpu_runtime *rt, comm *c, int n_model, int64_t step,
                                 const char *dir, double loss, int tty, char *err, size_t errlen) {
  const int me = comm_rank(c), n = comm_size(c);
  struct {
    int32_t ok;
    char tmp[4096];
  } start = {1, ""};
  char e[1024] = "";
  if (me == 0 && ckpt_parts_begin(dir, step, start.tmp, sizeof start.tmp, e, sizeof e)) start.ok = 0;
  if (comm_broadcast(c, &start, sizeof start, 0, err, errlen)) return -1;
  if (!start.ok) {
    if (me == 0) snprintf(err, errlen, "%s", e);
    else snprintf(err, errlen, "rank 0 could not start the checkpoint of step %lld", (long long)step);
    if (me == 0) fprintf(stderr, "moec: error: --ckpt-dir %s: checkpoint of step %lld not written: %s\n", dir, (long long)step, e);
    return -1;
  }
  hf_view v, vm;
  memset(&vm, 0, sizeof vm);
  int32_t good = hf_view_for_save(self, rt, &v) == 0 && hf_view_for_save_moments(self, rt, &vm) == 0;
  ckpt_contents cc = hf_view_contents(self->g, &v), cm = hf_view_contents(self->g, &vm);
  progress_line pm = {"checkpoint (model)", -1}, po = {"checkpoint (optimizer state)", -1};
  if (tty) cc.progress = cm.progress = ckpt_progress, cc.progress_ctx = &pm, cm.progress_ctx = &po;
  if (!good) snprintf(e, sizeof e, "out of host memory (or a parameter missing from this rank's store)");
  else if (me < n_model && ckpt_parts_write(start.tmp, "model", me, n_model, &cc, e, sizeof e)) good = 0;
  else if (ckpt_parts_write(start.tmp, "optimizer", me, n, &cm, e, sizeof e)) good = 0;
  progress_clear(tty);
  if (!good) fprintf(stderr, "moec: error: --ckpt-dir %s: checkpoint of step %lld, rank %d's part: %s\n", dir, (long long)step, me, e);
  int32_t all = good;
  int rc = comm_all_reduce_sum(c, &all, 1, COMM_I32, err, errlen);
  if (rc != 0 && me == 0) ckpt_parts_abandon(start.tmp); /* the writers' outcome unknown: nothing is placed */
  if (rc == 0 && me == 0) {
    ckpt_kv kv[] = {{"data_position", CKPT_INT, step, 0, NULL}, {"loss", CKPT_F64, 0, isfinite(loss) ? loss : 0, NULL}};
    cc.state = kv;
    cc.n_state = 2;
    if (all != n) {
      ckpt_parts_abandon(start.tmp);
      fprintf(stderr, "moec: error: --ckpt-dir %s: checkpoint of step %lld not written: %d of %d ranks could not write "
              "their parts (above)\n", dir, (long long)step, n - all, n);
    } else if (ckpt_parts_finish(dir, step, start.tmp, n_model, n, &cc, e, sizeof e)) {
      fprintf(stderr, "moec: error: --ckpt-dir %s: checkpoint of step %lld not written: %s\n", dir, (long long)step, e);
      rc = -1;
    } else if (e[0]) {
      fprintf(stderr, "moec: warning: %s\n", e);
    }
  }
  hf_view_free(&v);
  hf_view_free(&vm);
  if (rc == 0 && all != n) rc = -1, snprintf(err, errlen, "checkpoint of step %lld: %d of %d ranks failed to write their parts", (long long)step, n - all, n);
  return rc;
}

/* ---- the executors: the CPU reference, or one GPU ---- */
typedef struct {
  cpu_exec *cpu_step, *cpu_fwd;
  gpu_runtime *rt;
  gpu_exec *gpu_step, *gpu_fwd;
  gpu_comm *gcomm; /* ranks on GPUs: their collectives (host-staged or NCCL) */
} executors;

static int exec_run(executors *e, int fwd, const int32_t *tok, const int32_t *lab, int64_t step, float *out,
                    double *gnorm, char *err, size_t errlen) {
  if (e->rt) {
    int rc = gpu_exec_run(fwd ? e->gpu_fwd : e->gpu_step, tok, lab, step, out, gnorm, err, errlen);
    const char *f = gpu_comm_failure(e->gcomm); /* NCCL's watchdog: its reason beats the symptom */
    if (f) snprintf(err, errlen, "%s", f);
    return f ? -1 : rc;
  }
  return cpu_exec_run(fwd ? e->cpu_fwd : e->cpu_step, tok, lab, step, out, gnorm, err, errlen);
}

static void executors_free(executors *e, int failed) {
  gpu_comm_free(e->gcomm, failed); /* before its GPU's context goes */
  cpu_exec_free(e->cpu_step);
  cpu_exec_free(e->cpu_fwd);
  gpu_exec_free(e->gpu_step);
  gpu_exec_free(e->gpu_fwd);
  gpu_runtime_free(e->rt);
}

/* ---- data ---- */
/* The file's data path is already absolute (the front end resolves it against the .moe file
 * that names it); --data is taken as given, relative to the working directory. */
static const char *data_path(const train_opts *o, const ir_graph *g) { return o->data ? o->data : g->cfg.data; }

static void load_progress(void *ctx, int64_t done, int64_t total) {
  const int *tty = ctx;
  if (*tty && total > 0) fprintf(stderr, "\rloading data: %3d%%", (int)(100.0 * (double)done / (double)total));
}

/* Mean cross-entropy (nats per base) over validation batches. */
/* With world ranks, each takes rows [rank * B, (rank + 1) * B) of every global batch of B * world
 * windows; the graph's outputs are already summed over the ranks. */
static int validate(executors *ex, const ir_graph *fwd, const data_set *d, int64_t batches, int32_t *tok, int32_t *lab,
                    double *nats, int rank, int world) {
  int64_t B = fwd->cfg.batch, Bg = B * world, nval = data_n_windows(d, DATA_VAL);
  if (nval == 0) return 1;
  if (batches * Bg > nval) batches = (nval + Bg - 1) / Bg;
  double sum = 0;
  char err[1024];
  float out[8];
  for (int64_t b = 0; b < batches; b++) {
    data_val_batch(d, b * Bg + (int64_t)rank * B, B, tok, lab);
    if (exec_run(ex, 1, tok, lab, 0, out, NULL, err, sizeof err)) {
      fprintf(stderr, "\n%s\n", err);
      return -1;
    }
    sum += out[fwd->n_outputs > 1 ? 1 : 0];
  }
  *nats = sum / (double)batches;
  return 0;
}

static void fmt_eta(double s, char *buf, size_t n) {
  if (!isfinite(s) || s < 0) s = 0;
  long t = (long)(s + 0.5);
  snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
}

/* One rank's training loop (the only rank when ep x dp = 1). Rank 0 prints, logs and writes
 * checkpoints; every rank takes rows [rank * B, (rank + 1) * B) of each global batch of
 * B * world sequences, and its graph's collectives meet the other ranks' through comm. */
typedef struct {
  const ir_graph *fwd, *step_g; /* this rank's (its EP rank's) graphs */
  const ir_graph *const *steps;  /* (ep) every EP rank's step graph */
  const train_opts *o;
  const data_set *d;
  comm_world *comm;
  int rank, world;
  int rc;
} rank_ctx;

/* Writes a checkpoint, its tensors fetched one at a time as the writer reaches them (from the
 * GPU runtime rt when not NULL: hf_view.h): rank 0 alone, or with ep > 1 the EP group of DP
 * rank 0 (rank < ep), each rank its part (save_checkpoint_parts). With ZeRO-1 every rank
 * writes its moment shards as its part of the optimizer state, so every rank calls this. */
static int save_any(const rank_ctx *r, rt_params *ps, gpu_runtime *rt, int ep, int64_t step, double loss, char *err,
                    size_t errlen) {
  ckpt_part self = {r->step_g, ps, r->rank > 0, r->rank >= ep};
  const int tty = r->o->progress && r->rank == 0;
  if (r->step_g->cfg.zero && r->comm)
    return save_checkpoint_parts(&self, rt, comm_get(r->comm, r->rank, COMM_WORLD), ep, step, r->o->ckpt_dir, loss, tty,
                                 err, errlen);
  if (r->rank >= ep) return 0;
  if (ep == 1) return save_checkpoint(&self, rt, step, r->o->ckpt_dir, loss, tty);
  return save_checkpoint_parts(&self, rt, comm_get(r->comm, r->rank, COMM_EP), ep, step, r->o->ckpt_dir, loss, tty, err,
                               errlen);
}


/* Ranks on GPUs: rank r on GPU (local rank mod GPUs), and its collectives, host-staged or NCCL
 * as all ranks agree (gpu_comm_agree). Every rank makes the same collective calls here. */
static int gpu_rank_setup(rank_ctx *r, rt_params *ps, executors *ex, FILE *msgf, char *err, size_t errlen) {
  const train_opts *o = r->o;
  int ngpus = 0, local = o->world ? o->local_rank : r->rank;
  char e[1024] = "";
  if (gpu_driver_load(e, sizeof e) != 0 || gpu_device_count(&ngpus, e, sizeof e) != 0 || ngpus < 1) {
    snprintf(err, errlen, "%s", e[0] ? e : "the NVIDIA driver sees no GPU; use --device cpu");
    fprintf(msgf, "moec: error: --device cuda: %s\n", err);
    return -1;
  }
  if (!(ex->rt = gpu_runtime_new_on(ps, local % ngpus, o->dump_dir, err, errlen))) {
    fprintf(msgf, "moec: error: --device cuda: %s\n", err);
    return -1;
  }
  if (!(ex->gpu_step = gpu_exec_new(ex->rt, r->step_g, err, errlen)) || !(ex->gpu_fwd = gpu_exec_new(ex->rt, r->fwd, err, errlen))) {
    fprintf(msgf, "moec: error: --device cuda: %s\n", err);
    return -1;
  }
  if (!r->comm) return 0;
  gpu_comm_kind kind;
  char note[1400];
  char gpu_id[GPU_COMM_ID_LEN];
  gpu_comm_gpu_id(gpu_runtime_ctx(ex->rt), gpu_id, sizeof gpu_id);
  if (gpu_comm_agree(r->comm, r->rank, gpu_id, &kind, note, sizeof note, err, errlen) != 0 ||
      !(ex->gcomm = gpu_comm_new(kind, r->comm, r->rank, gpu_runtime_ctx(ex->rt), err, errlen))) {
    fprintf(stderr, "moec: error: rank %d: --device cuda: %s\n", r->rank, err);
    return -1;
  }
  if (note[0]) fprintf(msgf, "moec: note: %s\n", note);
  fprintf(msgf, "collectives between the ranks' GPUs: %s (rank 0 on GPU %d of %d: %s)\n", gpu_comm_kind_name(kind),
          local % ngpus, ngpus, gpu_runtime_device(ex->rt));
  gpu_exec_set_comm(ex->gpu_step, ex->gcomm);
  gpu_exec_set_comm(ex->gpu_fwd, ex->gcomm);
  return 0;
}

static int train_rank(rank_ctx *r) {
  const ir_graph *fwd = r->fwd, *step_g = r->step_g;
  const train_opts *o = r->o;
  const data_set *d = r->d;
  const moec_config *cfg = &step_g->cfg;
  char err[2048] = "";
  int tty = o->progress && r->rank == 0;
  FILE *msgf = r->rank == 0 ? stderr : NULL;
  if (!msgf && !(msgf = fopen("/dev/null", "w"))) return 1;
  int rc = 1;
  int64_t B = cfg->batch, S = cfg->seq, T = B * S;
  if (!o->cuda) {
    /* a model that cannot fit would be killed by the kernel mid-allocation: say so up front */
    memplan mp;
    memplan_estimate(step_g, &mp);
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (ram > 0 && (double)mp.total > ram) {
      char need[32], have[32];
      fprintf(msgf, "moec: error: %s needs about %s of memory to train on the CPU (weights, AdamW moments and "
              "activations), but this machine has %s; train on a GPU (--device cuda), or use a smaller seq or batch "
              "(--set seq=N, --set batch=N)\n", step_g->model_name, gpu_fmt_bytes((size_t)mp.total, need, sizeof need),
              gpu_fmt_bytes((size_t)ram, have, sizeof have));
      if (msgf != stderr) fclose(msgf);
      return 1;
    }
  }
  int ep = cfg->ep > 1 ? (int)cfg->ep : 1;
  rt_params *ps = rt_params_new(step_g, (uint64_t)cfg->seed);
  ckpt_part self = {step_g, ps, 0, 0};
  char resume_path[CKPT_PATH_LEN] = ""; /* the checkpoint a GPU run checks first and reads later */
  executors ex;
  memset(&ex, 0, sizeof ex);
  FILE *logf = NULL;
  int32_t *tok = malloc((size_t)T * sizeof *tok), *lab = malloc((size_t)T * sizeof *lab);
  if (!ps || !tok || !lab) {
    fprintf(msgf, "moec: error: out of host memory for the parameters and the batch\n");
    goto done;
  }
  if (o->resume) {
    if (!o->ckpt_dir) {
      fprintf(msgf, "moec: error: --resume needs --ckpt-dir DIR (where the checkpoints are)\n");
      goto done;
    }
    /* with ep > 1 this rank reads the dense parameters and its own experts only; a GPU run
       only checks the checkpoint here, and reads it after the upload (below) */
    if (load_checkpoint(&self, NULL, ps, ep > 1, o->ckpt_dir, resume_path, o->cuda, tty)) goto done;
    if (!o->cuda && ps->moments_bf16) /* moments saved in f32 (a run without moments = bf16) start as a GPU would hold them */
      for (int i = 0; i < ps->n; i++) ck_round_bf16(ps->p[i].m, ps->p[i].numel), ck_round_bf16(ps->p[i].v, ps->p[i].numel);
    if (!o->cuda) fprintf(msgf, "resumed from %s at step %lld\n", o->ckpt_dir, (long long)ps->step);
  }
  if (cfg->zero && r->comm) {
    if (zero_shard(ps, step_g, r->comm, r->rank, err, sizeof err)) {
      fprintf(msgf, "moec: error: %s\n", err);
      goto done;
    }
    char held[32], whole[32];
    const size_t vb = o->cuda && ps->moments_bf16 ? 2 : 4; /* the host keeps bf16 moments in f32 */
    fprintf(msgf, "ZeRO-1: rank 0 holds %s of AdamW moments%s (%s without zero)\n",
            gpu_fmt_bytes(zero_moment_bytes(ps, vb, 0), held, sizeof held), o->cuda ? " on its GPU" : "",
            gpu_fmt_bytes(zero_moment_bytes(ps, vb, 1), whole, sizeof whole));
  } else if (cfg->zero) {
    fprintf(msgf, "moec: note: zero = true shards the AdamW moments over several ranks; with one rank it changes nothing\n");
  }
  if (o->cuda) {
    if (gpu_rank_setup(r, ps, &ex, msgf, err, sizeof err)) goto done;
    rt_params_release_host(ps); /* on the device now; checkpoints fetch from there (hf_view.h) */
    /* a resume reads each tensor straight to the device: one on the host at a time, not the part */
    if (o->resume && load_checkpoint(&self, ex.rt, ps, ep > 1, o->ckpt_dir, resume_path, 0, tty)) goto done;
    if (o->resume) fprintf(msgf, "resumed from %s at step %lld\n", o->ckpt_dir, (long long)ps->step);
  } else if (!(ex.cpu_step = cpu_exec_new(step_g, ps, err, sizeof err)) || !(ex.cpu_fwd = cpu_exec_new(fwd, ps, err, sizeof err))) {
    fprintf(msgf, "moec: internal error: %s\n", err);
    goto done;
  } else if (r->comm) {
    cpu_exec_set_comm(ex.cpu_step, r->comm, r->rank);
    cpu_exec_set_comm(ex.cpu_fwd, r->comm, r->rank);
  }
  if (r->rank == 0 && o->log_path && !(logf = fopen(o->log_path, o->resume ? "a" : "w"))) {
    fprintf(msgf, "moec: error: --log %s: cannot open for writing: %s\n", o->log_path, strerror(errno));
    goto done;
  }
  int64_t end = cfg->steps;
  if (o->stop_at >= 0 && o->stop_at < end) end = o->stop_at;
  if (end <= ps->step) {
    /* nothing to train (--stop-at 0, or resumed at the end): write the weights as they are */
    fprintf(msgf, "no steps to run (at step %lld, stopping at %lld)\n", (long long)ps->step, (long long)end);
    rc = (r->rank < ep || cfg->zero) && o->ckpt_dir ? save_any(r, ps, ex.rt, ep, ps->step, NAN, err, sizeof err) != 0 : 0;
    goto done;
  }
  int64_t val_batches = o->val_batches > 0 ? o->val_batches : 8;
  int64_t print_every = (end - ps->step) / 20 > 0 ? (end - ps->step) / 20 : 1;
  fprintf(msgf, "training %s on %s: %lld parameters, %lld tokens per step, steps %lld..%lld of %lld\n",
          step_g->model_name, ex.rt ? gpu_runtime_device(ex.rt) : "the CPU", (long long)rt_params_numel(ps), (long long)(T * r->world), (long long)ps->step + 1, (long long)end,
          (long long)cfg->steps);
  double t0 = now_s(), loss = NAN, val = NAN;
  int64_t first = ps->step;
  /* device bytes in use after a step: weights, moments, bf16 copies, batch, and the gradients the
     update beside the next forward still reads (gpu_exec_update.c) */
  size_t held_between = 0;
  /* steps past the first two (kernel compiles, cuBLASLt's heuristics): their time, and where the
     host's went (gpu_host_stats) */
  double timed_s = 0;
  gpu_host_stats hs_sum = {0};
  const char *pstep_env = getenv("MOEC_PROFILE_STEP");
  const long long profile_step = pstep_env ? atoll(pstep_env) : 0;
  int64_t timed_steps = 0;
  rc = 0;
  while (ps->step < end) {
    int64_t s = ps->step + 1;
    double ts = now_s(), gnorm = 0;
    const gpu_host_stats hs0 = ex.rt ? gpu_runtime_host_stats(ex.rt) : (gpu_host_stats){0};
    float out[8];
    data_train_rows(d, s - 1, B * r->world, (int64_t)r->rank * B, B, tok, lab);
    /* MOEC_PROFILE_STEP=N: step N alone inside cuProfilerStart/Stop, for `ncu --profile-from-start
       off` (every kernel's own time, none of MOEC_PROFILE's event gaps; gpu_session.sh ncustep) */
    const int ncu_range = ex.rt && profile_step > 0 && s == profile_step;
    if (ncu_range && gpu_profiler_range(gpu_runtime_ctx(ex.rt), 1))
      fprintf(msgf, "moec: warning: MOEC_PROFILE_STEP: %s\n", gpu_error(gpu_runtime_ctx(ex.rt)));
    if (exec_run(&ex, 0, tok, lab, s, out, &gnorm, err, sizeof err)) {
      fprintf(msgf, "\n%s\n", err);
      rc = 1;
      break;
    }
    if (ncu_range) gpu_profiler_range(gpu_runtime_ctx(ex.rt), 0);
    ps->step = s;
    loss = out[0];
    if (ex.rt && gpu_runtime_live_bytes(ex.rt) > held_between) held_between = gpu_runtime_live_bytes(ex.rt);
    double dt = now_s() - ts;
    if (ex.rt && s - first > 2) {
      const gpu_host_stats h = gpu_runtime_host_stats(ex.rt);
      hs_sum.wait_s += h.wait_s - hs0.wait_s, hs_sum.issue_s += h.issue_s - hs0.issue_s;
      hs_sum.slow_s += h.slow_s - hs0.slow_s, hs_sum.issues += h.issues - hs0.issues;
      hs_sum.slow_issues += h.slow_issues - hs0.slow_issues;
      timed_s += dt, timed_steps++;
    }
    double lr = ck_lr_at(s, cfg->steps, cfg->warmup, cfg->lr, cfg->min_lr, cfg->schedule);
    double tps = (double)(T * r->world) / dt, eta = (now_s() - t0) / (double)(s - first) * (double)(end - s);
    if (!isfinite(loss)) {
      fprintf(msgf, "\nmoec: error: step %lld: the loss is %f; lower the learning rate (--set lr=...) or raise warmup\n",
              (long long)s, loss);
      rc = 1;
      break;
    }
    if (logf)
      fprintf(logf, "{\"step\":%lld,\"loss\":%.6f,\"ce\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"tokens_per_s\":%.1f}\n",
              (long long)s, loss, (double)out[step_g->n_outputs > 1 ? 1 : 0], lr, gnorm, tps);
    char etab[32];
    fmt_eta(eta, etab, sizeof etab);
    if (tty) {
      int width = 24, fill = (int)((double)width * (double)s / (double)end);
      fprintf(msgf, "\r[%.*s%.*s] step %lld/%lld loss %.4f %.0f tok/s ETA %s ", fill,
              "########################", width - fill, "------------------------", (long long)s, (long long)end, loss,
              tps, etab);
    } else if (s % print_every == 0 || s == end) {
      fprintf(msgf, "step %lld/%lld loss %.4f lr %.3g grad_norm %.3f %.0f tok/s ETA %s\n", (long long)s, (long long)end,
              loss, lr, gnorm, tps, etab);
    }
    int last = s == end;
    if ((cfg->val_every > 0 && s % cfg->val_every == 0) || last) {
      int vr = validate(&ex, fwd, d, val_batches, tok, lab, &val, r->rank, r->world);
      if (vr < 0) {
        rc = 1;
        break;
      }
      if (vr == 0) {
        fprintf(msgf, "%sstep %lld: val_loss %.4f nats/base (%.4f bits/base)\n", tty ? "\n" : "", (long long)s, val,
                val / M_LN2);
        if (logf) fprintf(logf, "{\"step\":%lld,\"val_loss\":%.6f,\"val_bits\":%.6f}\n", (long long)s, val, val / M_LN2);
      }
    }
    if (logf) fflush(logf);
    if ((r->rank < ep || cfg->zero) && o->ckpt_dir && ((o->ckpt_every > 0 && s % o->ckpt_every == 0) || last) &&
        save_any(r, ps, ex.rt, ep, ps->step, loss, err, sizeof err)) {
      rc = 1;
      break;
    }
  }
  if (tty) fputs("\n", msgf);
  if (rc == 0)
    fprintf(msgf, "done: step %lld, loss %.4f, val_loss %.4f nats/base, %.1fs\n", (long long)ps->step, loss, val,
            now_s() - t0);
  if (rc == 0 && ex.rt) {
    char b[32];
    memplan mp;
    memplan_estimate(step_g, &mp);
    char pb[32], hb[32], sb[32];
    size_t peak = gpu_runtime_peak_used_bytes(ex.rt), reserved = gpu_runtime_peak_bytes(ex.rt);
    char rb[32];
    /* in use by tensors, as the peer's torch.cuda.max_memory_allocated counts; the pool's
       cached buffers and size-class rounding on top are what the driver gave us */
    fprintf(msgf, "peak GPU memory: %s (predicted from liveness: %s; reserved from the driver: %s)\n",
            gpu_fmt_bytes(peak, b, sizeof b), gpu_fmt_bytes((size_t)mp.total, pb, sizeof pb),
            gpu_fmt_bytes(reserved, rb, sizeof rb));
    /* the peer's static_gib and step_gib: what stays between steps, and what a step adds on top */
    fprintf(msgf, "GPU memory held between steps: %s; step memory (peak - held): %s\n",
            gpu_fmt_bytes(held_between, hb, sizeof hb), gpu_fmt_bytes(peak - held_between, sb, sizeof sb));
    if (timed_steps) { /* the mean of the steps after the first two */
      const double n = (double)timed_steps;
      fprintf(msgf,
              "host, a step: %.1f ms; %.1f waiting for the GPU, %.1f in %.0f calls queueing work (%.1f in the %.0f "
              "over 50 us, mostly the queue full), %.1f in moec's own work (%s)\n",
              1e3 * timed_s / n, 1e3 * hs_sum.wait_s / n, 1e3 * hs_sum.issue_s / n, (double)hs_sum.issues / n,
              1e3 * hs_sum.slow_s / n, (double)hs_sum.slow_issues / n, 1e3 * timed_s / n - 1e3 * (hs_sum.wait_s + hs_sum.issue_s) / n,
              /* a host that waits (or blocks on a full queue) for most of the step is ahead of the GPU */
              hs_sum.wait_s + hs_sum.slow_s > 0.5 * timed_s ? "the host waits: the GPU bounds the step"
                                                            : "little waiting: the host bounds the step");
    }
  }
done:
  if (logf && fclose(logf) != 0) {
    fprintf(msgf, "moec: error: --log %s: write failed: %s\n", o->log_path, strerror(errno));
    rc = 1;
  }
  /* release the peers waiting in a collective first: freeing the GPU waits for this rank's queue */
  if (rc && r->comm) comm_abort(r->comm, r->rank, err[0] ? err : "training stopped");
  executors_free(&ex, rc != 0);
  rt_params_free(ps);
  free(tok);
  free(lab);
  if (msgf != stderr) fclose(msgf);
  return rc;
}

static void *rank_main(void *p) {
  rank_ctx *r = p;
  r->rc = train_rank(r);
  return NULL;
}

/* ep x dp ranks as threads of this process, through the in-process communicator. */
static int train_ranks(const ir_graph *const *fwds, const ir_graph *const *steps, const train_opts *o, const data_set *d, int64_t world) {
  const ir_graph *step_g = steps[0];
  int ep = step_g->cfg.ep > 1 ? (int)step_g->cfg.ep : 1;
  comm_world *w = comm_world_new((int)step_g->cfg.ep, (int)step_g->cfg.dp, comm_timeout_from_env());
  rank_ctx *r = calloc((size_t)world, sizeof *r);
  pthread_t *th = calloc((size_t)world, sizeof *th);
  if (!w || !r || !th) {
    fprintf(stderr, "moec: error: out of host memory for %lld ranks\n", (long long)world);
    comm_world_free(w);
    free(r);
    free(th);
    return 1;
  }
  fprintf(stderr, "ranks: %lld (ep %lld x dp %lld) as threads of this process, %lld sequences each\n", (long long)world,
          (long long)step_g->cfg.ep, (long long)step_g->cfg.dp, (long long)step_g->cfg.batch);
  int64_t started = 0;
  for (; started < world; started++) {
    r[started] = (rank_ctx){fwds[started % ep], steps[started % ep], steps, o, d, w, (int)started, (int)world, 1};
    if (pthread_create(&th[started], NULL, rank_main, &r[started]) != 0) {
      comm_abort(w, (int)started, "could not start its thread");
      break;
    }
  }
  int rc = started < world;
  for (int64_t i = 0; i < started; i++) {
    pthread_join(th[i], NULL);
    rc |= r[i].rc;
  }
  comm_world_free(w);
  free(r);
  free(th);
  return rc;
}

int moec_train(const ir_graph *const *fwds, const ir_graph *const *steps, const train_opts *o) {
  const ir_graph *step_g = steps[0];
  const moec_config *cfg = &step_g->cfg;
  char err[2048] = "";
  const char *path = data_path(o, step_g);
  int tty = o->progress;
  data_opts dopt = {cfg->seq, cfg->stride, cfg->val_fraction, 0, cfg->rc_augment, (uint64_t)cfg->seed};
  double t_load = now_s();
  data_set *d = data_open_cb(path, &dopt, load_progress, &tty, err, sizeof err);
  if (tty) fputs("\r", stderr);
  if (!d) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  if (data_n_windows(d, DATA_TRAIN) == 0) {
    fprintf(stderr, "%s: error: no training window of seq %lld fits in the data; use a smaller seq (--set seq=N)\n", path,
            (long long)cfg->seq);
    data_close(d);
    return 1;
  }
  if (!o->world || o->rank == 0)
    fprintf(stderr, "data: %s: %lld records, %lld train / %lld val bases, %lld train windows of %lld (%.1fs)\n", path,
          (long long)data_n_records(d), (long long)data_n_bases(d, DATA_TRAIN), (long long)data_n_bases(d, DATA_VAL),
          (long long)data_n_windows(d, DATA_TRAIN), (long long)cfg->seq, now_s() - t_load);

  int rc;
  int64_t world = cfg->ep * cfg->dp;
  if (o->world) {
    /* one rank of a world of processes: the same per-rank loop, through the world's communicator */
    int ep = cfg->ep > 1 ? (int)cfg->ep : 1;
    if (o->rank == 0)
      fprintf(stderr, "ranks: %lld (ep %lld x dp %lld) as processes (%s communicator), %lld sequences each\n",
              (long long)world, (long long)cfg->ep, (long long)cfg->dp, comm_world_backend(o->world), (long long)cfg->batch);
    rank_ctx r = {fwds[o->rank % ep], steps[o->rank % ep], steps, o, d, o->world, o->rank, comm_world_size(o->world), 1};
    rc = train_rank(&r);
  } else if (world <= 1) {
    rank_ctx r = {fwds[0], steps[0], steps, o, d, NULL, 0, 1, 0};
    rc = train_rank(&r);
  } else {
    rc = train_ranks(fwds, steps, o, d, world);
  }
  data_close(d);
  return rc;
}

