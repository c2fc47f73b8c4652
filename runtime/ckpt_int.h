/* ckpt_int.h -- what ckpt.c (the save protocol, loading) and ckpt_index.c (the sharded
 * layout: parts, their index, reading either layout) share. */
#ifndef MOEC_CKPT_INT_H
#define MOEC_CKPT_INT_H

#include <stddef.h>

#include "ckpt.h"
#include "safetensors.h"

/* A JSON object file (a checkpoint's config, state or index); NULL with err set. */
st_json *ckpt_read_json(const char *path, char *err, size_t errlen);

/* Part k (0-based) of n of a kind ("model", "optimizer"): "model-00001-of-00002.safetensors". */
void ckpt_part_name(char *buf, size_t len, const char *kind, int k, int n);

/* The tensors of one kind in a checkpoint directory: KIND.safetensors, or the parts that
 * KIND.safetensors.index.json maps every tensor name to (each name in exactly one part, each
 * part holding exactly the names mapped to it). */
typedef struct ckpt_shard_ref ckpt_shard_ref;
typedef struct {
  st_file **files; /* (n) */
  size_t n;
  st_json *index;  /* NULL for one file */
  char label[4200]; /* the file or the index, for messages */
  ckpt_shard_ref *shards; /* (n_shards) every ZeRO shard, by moment name then start */
  size_t n_shards;
} ckpt_tset;

int ckpt_tset_open(ckpt_tset *t, const char *dir, const char *kind, char *err, size_t errlen);
const st_view *ckpt_tset_find(const ckpt_tset *t, const char *name, const st_file **file);
size_t ckpt_tset_count(const ckpt_tset *t);
void ckpt_tset_close(ckpt_tset *t);

/* A ZeRO moment shard's name (ckpt.h), "<moment>.shard.<lo>" or "<moment>.shard_t.<lo>": the
 * length of its "<moment>" prefix, with *lo and *t (transposed order) set; 0 for other names. */
size_t ckpt_shard_name(const char *name, int64_t *lo, int *t);
/* Moment `name` ("<param>.exp_avg") as shards in t: 0 when its shards (*count of them, in the
 * order *t says) cover numel values exactly once, 1 when it has none, -1 with err set when
 * they overlap, leave a gap, are not 1-D F32/BF16/F16, or mix orders. */
int ckpt_tset_shards(const ckpt_tset *t, const char *name, int64_t numel, size_t *count, int *order, char *err,
                     size_t errlen);
/* Tensor `name` whole, into dst (numel of shape, in shape's order): the tensor of that name, or
 * a moment's ZeRO shards assembled (shard_t ones transposed back). 0, or -1 with err set. */
int ckpt_tset_read(const ckpt_tset *t, const char *name, int ndim, const int64_t *shape, float *dst, char *err,
                          size_t errlen);

/* Writes tmp/KIND.safetensors.index.json for the n parts already in tmp, from their headers:
 * {"metadata": {"total_size": bytes of tensor data}, "weight_map": {name: part file}}. */
int ckpt_write_index(const char *tmp, const char *kind, int n, char *err, size_t errlen);

#endif
