/* ckpt.h -- crash-safe training checkpoints, in a layout Hugging Face transformers can load.
 *
 * Layout of a checkpoint root DIR:
 *   DIR/latest                   one line, "step-00000100\n": the checkpoint to resume from
 *   DIR/step-00000100/           one complete checkpoint (steps >= 1e8 get more digits)
 *       model.safetensors        parameters, f32, under the caller's (HF) names;
 *                                metadata {"format": "pt"} as transformers expects
 *       optimizer.safetensors    Adam moments, f32: "<param>.exp_avg", "<param>.exp_avg_sq"
 *       config.json              MixtralForCausalLM config (ckpt_hf_config_json)
 *       state.json               {"step": S, "seed": ..., "moec_version": "...", caller keys}
 *   DIR/.tmp-step-00000100-<pid>/  a checkpoint being written (or left by a crashed writer)
 *
 * A sharded save (expert parallelism: each EP rank writes its own experts) holds, instead of
 * the two .safetensors files, Hugging Face's sharded layout: model-00001-of-0000N.safetensors
 * .. (part k: what writer k holds) and model.safetensors.index.json ({"metadata":
 * {"total_size": bytes}, "weight_map": {name: part}}); optimizer-*-of-* and
 * optimizer.safetensors.index.json likewise. ckpt_load reads either layout.
 *
 * ZeRO-1 (runtime/zero.h): every rank writes an optimizer part of its own, holding its shards
 * of the moments it updates in shards, 1-D:
 *       "<param>.exp_avg.shard.<lo>"    values [lo, lo + n) of the moment flattened in the
 *                                       parameter's (HF) shape's order, n the tensor's length
 *       "<param>.exp_avg.shard_t.<lo>"  the same in the order of the shape's transpose (moec
 *                                       holds linear weights as [in, out])
 * (exp_avg_sq likewise); a moment's shards cover it exactly once. No rank holds a whole
 * moment to write it, and ckpt_load assembles whole moments from any shards, so a checkpoint
 * moves between zero and not, and across world sizes.
 *
 * ckpt_save writes everything into the .tmp- directory (each file fsynced), fsyncs it,
 * renames it to step-N (atomically exchanging with an existing step-N), fsyncs DIR, replaces
 * DIR/latest atomically (temporary file, fsync, rename, fsync DIR), and only then deletes
 * checkpoints beyond the last `keep` and stale .tmp-* entries of dead writers. A kill or a
 * power loss at any moment leaves `latest` naming a complete checkpoint (or absent, before
 * the first save completes). Every write, fsync, close and rename is checked.
 *
 * All functions that can fail take (char *err, size_t errlen); messages name the file and
 * the tensor, and say what to do. err may be NULL.
 */
#ifndef MOEC_CKPT_H
#define MOEC_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "safetensors.h"

#define CKPT_MAX_DIMS ST_MAX_DIMS
#define CKPT_DEFAULT_KEEP 2

/* One trainable parameter. save reads w/m/v; load writes them (numel floats each). */
typedef struct {
  const char *name;             /* HF name, "model.layers.0.self_attn.q_proj.weight" */
  int ndim;                     /* 0 = scalar */
  int64_t shape[CKPT_MAX_DIMS]; /* HF (PyTorch) order: Linear weights are [out, in] */
  float *w;                     /* (numel) the fp32 master weight */
  float *m, *v;                 /* (numel) Adam exp_avg / exp_avg_sq; both NULL = not optimised */
  /* Saves only, instead of w, m, v: fetch fills dst (numel floats, in the HF layout above) with
   * the weight (which 0), exp_avg (1) or exp_avg_sq (2) when the writer reaches the tensor, so
   * no copy of the whole model need exist at once (transposed on the fly, or fetched from a
   * GPU); has_moments says whether 1 and 2 exist. 0, or -1 with err set. */
  int (*fetch)(void *ctx, int which, float *dst, char *err, size_t errlen);
  void *fetch_ctx;
  int has_moments;
  /* Loads only, instead of w, m, v: store takes each tensor (numel floats, HF layout; which as
   * fetch's) as the loader reads it, once everything checked out, so the caller can put it
   * straight where it lives (a GPU) with one tensor on the host at a time; has_moments says
   * whether the moments are wanted. Its ctx is fetch_ctx. 0, or -1 with err set. */
  int (*store)(void *ctx, int which, const float *src, char *err, size_t errlen);
  /* ZeRO-1 (above). Save: shard_n > 0 writes moment values [shard_lo, shard_lo + shard_n) as
   * shards, m and v (fetch 1 and 2) then holding those values alone, in the shape's order or,
   * with shard_t, its transpose's. Load: whole moments, from whole tensors or from shards,
   * which must be in the order shard_t names. */
  int64_t shard_lo, shard_n;
  int shard_t;
} ckpt_param;

typedef enum { CKPT_INT, CKPT_F64, CKPT_STR } ckpt_kind;

/* A caller key for state.json (data position, RNG counters, last loss, ...). */
typedef struct {
  const char *key;              /* not "step", "seed" or "moec_version" */
  ckpt_kind kind;
  int64_t i;                    /* CKPT_INT */
  double d;                     /* CKPT_F64 (finite) */
  const char *s;                /* CKPT_STR */
} ckpt_kv;

typedef struct {
  const moec_config *config;    /* model sizes -> config.json; seed -> state.json */
  int64_t bos_id, eos_id, pad_id; /* token ids for config.json (-1: written as null) */
  const ckpt_param *params;
  size_t n_params;
  const ckpt_kv *state;         /* save only: extra state.json keys */
  size_t n_state;
  int keep;                     /* save only: checkpoints kept, the new one included;
                                   0 = CKPT_DEFAULT_KEEP */
  const char *subset;           /* load only: NULL, or a name fragment (".experts."): the
                                   checkpoint may also hold tensors whose names contain it
                                   (an EP rank reads its own experts, not the others') */
  int check_only;               /* load only: every check, nothing read into the params */
  /* may be NULL: called after each parameter a load reads, or each tensor a save fetches (a
     part's, with ckpt_parts_write), with the values so far and in all (a progress bar) */
  void (*progress)(void *ctx, int64_t done, int64_t total);
  void *progress_ctx;
} ckpt_contents;

/* Saves step into DIR (created, with parents, if missing). Returns 0 when the checkpoint is
 * complete and `latest` names it; err then holds "" or a warning (an old checkpoint that
 * could not be deleted). Returns -1 with err set otherwise; `latest` and the previous
 * checkpoints are then untouched. */
int ckpt_save(const char *dir, int64_t step, const ckpt_contents *c, char *err, size_t errlen);

/* A sharded save, by several writers (one process or many, on a shared file system):
 *   rank 0:       ckpt_parts_begin(dir, step, tmp, len): DIR made, a fresh temporary directory
 *                 (its path into tmp, to hand to the writers)
 *   writer k:     ckpt_parts_write(tmp, kind, k, n, c): c's parameters ("model") or their
 *                 moments ("optimizer") as part k of n of that kind (n = 1: the one file
 *                 KIND.safetensors), fsynced; the kinds may have different writers
 *   rank 0, once every writer succeeded: ckpt_parts_finish(dir, step, tmp, n_model, n_opt, c)
 *                 (c: config and state only; its params are not read): the indexes of the
 *                 kinds in parts, config.json and state.json, then into place as ckpt_save
 *                 does; otherwise ckpt_parts_abandon.
 * The crash safety is ckpt_save's: `latest` names only a complete checkpoint. */
int ckpt_parts_begin(const char *dir, int64_t step, char *tmp, size_t len, char *err, size_t errlen);
int ckpt_parts_write(const char *tmp, const char *kind, int k, int n, const ckpt_contents *c, char *err, size_t errlen);
int ckpt_parts_finish(const char *dir, int64_t step, const char *tmp, int n_model, int n_opt, const ckpt_contents *c,
                      char *err, size_t errlen);
void ckpt_parts_abandon(const char *tmp);

/* The checkpoint DIR/latest names: 1 found (path_out = "DIR/step-...", *step_out = S),
 * 0 none (DIR or DIR/latest absent), -1 error (unreadable or malformed `latest`, or it names
 * a missing directory). ckpt_latest_err also says why. step_out may be NULL. */
int ckpt_latest(const char *dir, char *path_out, size_t len, int64_t *step_out);
int ckpt_latest_err(const char *dir, char *path_out, size_t len, int64_t *step_out, char *err,
                    size_t errlen);

/* What state.json held. */
typedef struct {
  int64_t step, seed;
  char moec_version[64];
  st_json *json;                /* the whole file, for caller keys (use the getters) */
} ckpt_state;

/* Loads the checkpoint directory path (a step-* directory) into c->params[i].w/m/v, checking
 * first that all four files exist and parse, that model.safetensors holds exactly the
 * parameters of c (names, shapes; F32, or BF16/F16 converted; with c->subset, others only if named so),
 * that optimizer.safetensors holds exactly (at least) their moments, whole or as ZeRO shards
 * covering each exactly once, either file possibly in parts (above), that config.json
 * describes the same model sizes as c->config, and that state.json's step matches the
 * directory's name. Nothing is written to the
 * buffers unless all of that holds. state may be NULL; otherwise free it with
 * ckpt_state_free. Returns 0 or -1. */
int ckpt_load(const char *path, const ckpt_contents *c, ckpt_state *state, char *err,
              size_t errlen);
int ckpt_state_i64(const ckpt_state *s, const char *key, int64_t *out); /* 0, or -1 absent/type */
int ckpt_state_f64(const ckpt_state *s, const char *key, double *out);  /* INT or NUM */
const char *ckpt_state_str(const ckpt_state *s, const char *key);       /* NULL absent/type */
void ckpt_state_free(ckpt_state *s);

/* The config.json of a MixtralForCausalLM with cfg's sizes, into a malloc'd string (*out).
 * head_dim 0 means hidden/heads, kv_heads 0 means heads. Token ids < 0 are written as null.
 * Returns 0, or -1 when a size is missing or inconsistent. */
int ckpt_hf_config_json(const moec_config *cfg, int64_t bos_id, int64_t eos_id, int64_t pad_id,
                        char **out, char *err, size_t errlen);

/* Removes a directory tree (no symlinks followed). 0, or -1 with errno set. */
int ckpt_rmtree(const char *path);

#endif
