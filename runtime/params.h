/* params.h -- the model's parameters on the host: fp32 master weights and AdamW moments,
 * one entry per `param` op of the graph, found by name (Hugging Face Mixtral names). */
#ifndef MOEC_PARAMS_H
#define MOEC_PARAMS_H

#include <stdint.h>

#include "ir.h"

typedef struct {
  const char *name; /* owned */
  ir_type type;     /* f32, static shape */
  int64_t numel;
  float *w;         /* (numel) master weight */
  float *m, *v;     /* (mn) AdamW first and second moments of elements [mlo, mlo + mn) */
  int64_t mlo, mn;  /* 0, numel; with ZeRO-1 this rank's shard (runtime/zero.h) */
  int zero_group;   /* ZeRO-1: the comm_group its moments are sharded over; -1 when whole */
  int expert;       /* expert index, -1 for dense parameters */
} rt_param;

typedef struct {
  rt_param *p;
  int n;
  int64_t step; /* optimizer steps taken */
  int moments_bf16; /* adamw(moments = bf16): m and v hold bf16 values (a device keeps them in bf16) */
} rt_params;

/* One parameter per PARAM node of g, initialised as its attributes say (normal(std) or
 * ones), deterministically from seed and the parameter's name. NULL if out of memory. */
rt_params *rt_params_new(const ir_graph *g, uint64_t seed);
void rt_params_free(rt_params *ps);
rt_param *rt_params_find(rt_params *ps, const char *name);
/* A GPU run needs the host copies only to upload them (checkpoints fetch a tensor at a time
 * from the device): release frees every w, m and v (NULL). */
void rt_params_release_host(rt_params *ps);
int64_t rt_params_numel(const rt_params *ps);

#endif
