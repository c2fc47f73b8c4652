/* train.h -- the training loop: data, steps, validation, logging, checkpoints. */
#ifndef MOEC_TRAIN_H
#define MOEC_TRAIN_H

#include <stdint.h>

#include "ir.h"

typedef struct {
  const char *moe_path;  /* the model file (relative data paths are resolved against it) */
  const char *data;      /* --data, overrides the file's data path; NULL: the file's */
  int64_t stop_at;       /* --stop-at: end after this step (-1: run to cfg.steps; 0: initial weights only) */
  const char *log_path;  /* --log FILE.jsonl, or NULL */
  const char *ckpt_dir;  /* --ckpt-dir, or NULL */
  int64_t ckpt_every;    /* --ckpt-every N (0: only at the end / at --stop-at) */
  int resume;            /* --resume from ckpt_dir/latest */
  int64_t val_batches;   /* batches per validation (0: default) */
  int progress;          /* 1: progress bar (a terminal), 0: plain lines */
  int cuda;              /* 1: train on GPUs (gpu_exec; rank r on GPU r mod GPUs), 0: the CPU reference executor */
  const char *dump_dir;  /* --dump-dir: generated kernel sources and NVRTC logs */
  struct comm_world *world; /* multi-process (WORLD_SIZE > 1): this process is rank `rank` of this
                               world (comm_tcp_new); NULL: ep x dp ranks as threads here */
  int rank;
  int local_rank, local_world; /* multi-process: LOCAL_RANK and LOCAL_WORLD_SIZE (the GPU of this rank) */
} train_opts;

/* Trains: fwd is the forward graph (validation), step the training-step graph (forward,
 * backward, AdamW) of the same model. Returns 0, or 1 after printing an error. */
/* fwd[e], step[e]: the graphs of EP rank e (one of each when ep <= 1); DP ranks share them. */
int moec_train(const ir_graph *const *fwd, const ir_graph *const *step, const train_opts *o);

/* Weight layout of Hugging Face checkpoints: Linear weights are [out, in], moec keeps
 * [in, out]; embeddings are the same in both. 1 when param node id feeds a linear. */
int train_param_is_linear_weight(const ir_graph *g, int id);

#endif
