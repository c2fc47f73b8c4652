/* config.h -- the model sizes and the training section of a .moe file, after --set
 * overrides, as the front end resolved them. Lowering records it in the graph; the runtime
 * reads the training section from here. */
#ifndef MOEC_CONFIG_H
#define MOEC_CONFIG_H

#include <stdint.h>

typedef enum { PREC_FP32, PREC_BF16, PREC_MXFP8 } moec_precision;
typedef enum { SCHED_COSINE, SCHED_LINEAR, SCHED_CONSTANT } moec_schedule;

typedef struct {
  /* model sizes (0 where the file does not name them) */
  int64_t vocab, hidden, layers, seq, heads, kv_heads, head_dim, experts, top_k, ffn;
  double norm_eps, rope_theta, aux_loss, z_loss;

  /* train { ... } */
  char data[1024];   /* data path, absolute (the front end resolves it against the .moe file) */
  int64_t batch;     /* sequences per step */
  int64_t steps;     /* run length and schedule horizon */
  int64_t seed;
  double lr, beta1, beta2, weight_decay, adam_eps, clip, min_lr; /* min_lr: floor of the schedule */
  int moments_bf16; /* adamw(moments = bf16): both moments stored in bf16, rounded after each update */
  int64_t warmup;
  moec_schedule schedule;
  moec_precision precision;
  int64_t mx_block;   /* 32 or 128 when precision is mxfp8 */
  int64_t mx_weight_tile; /* 0, or 128: expert weights in 128 x 128 squares of one scale (needs block 128) */
  int64_t ep, dp;     /* expert- and data-parallel group sizes */
  int zero;           /* ZeRO-1: each rank keeps the AdamW moments of its 1/G of every parameter (G its reduce group) */
  int64_t ep_rank;    /* this rank's index in its EP group (set by the driver, not by files): parallelize keeps its experts */
  int64_t stride;     /* window stride in bases (seq - overlap) */
  double val_fraction; /* held-out share of each record, by region */
  int64_t val_every;   /* validate every N steps (0: only at the end) */
  int rc_augment;      /* reverse-complement augmentation */
} moec_config;

#endif
