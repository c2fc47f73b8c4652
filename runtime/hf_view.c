/* hf_view.c -- the checkpoint's view of a rank's parameters (hf_view.h). */
#include "hf_view.h"

#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "errf.h"
#include "train.h"

struct hf_src {
  rt_param *p;
  int transposed;  /* stored [in, out] (rows x cols), written [out, in] */
  gpu_runtime *rt; /* fetch from the device (NULL: the host copies) */
  int index;       /* p's index in the runtime's parameter store */
};

static void transpose(const float *src, float *dst, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

/* ckpt_param.fetch: the weight (which 0) or a moment (1, 2), into dst in the HF layout; a
 * ZeRO shard of a moment as held (the runtime's order: ckpt_param.shard_t). */
static int fetch(void *ctx, int which, float *dst, char *err, size_t errlen) {
  const hf_src *s = ctx;
  const rt_param *p = s->p;
  const int shard = which && p->zero_group >= 0, transposed = s->transposed && !shard;
  const int64_t n = shard ? p->mn : p->numel;
  const float *src = which == 0 ? p->w : which == 1 ? p->m : p->v;
  float *tmp = NULL;
  if (s->rt) { /* straight into dst, or into a buffer to transpose from */
    if (transposed && !(tmp = malloc((size_t)n * sizeof *tmp + 1)))
      return errf(err, errlen, "out of host memory for %s", p->name);
    if (gpu_runtime_fetch(s->rt, s->index, which, tmp ? tmp : dst, err, errlen) != 0) {
      free(tmp);
      return -1;
    }
    src = tmp ? tmp : dst;
  } else if (!src) {
    return errf(err, errlen, "%s: no host copy to write", p->name);
  }
  if (transposed) transpose(src, dst, p->type.dims[0], p->type.dims[1]);
  else if (src != dst) memcpy(dst, src, (size_t)n * sizeof *dst);
  free(tmp);
  return 0;
}

typedef enum { VIEW_LOAD, VIEW_SAVE, VIEW_SAVE_MOMENTS } view_kind;

/* ckpt_param.store: a tensor read from the checkpoint (HF layout) into its place, the host copy
 * or the GPU (rt): transposed back to [in, out] for a linear weight, and of a ZeRO-sharded
 * moment this rank's shard alone. */
static int store(void *ctx, int which, const float *src, char *err, size_t errlen) {
  const hf_src *s = ctx;
  const rt_param *p = s->p;
  const int shard = which && p->zero_group >= 0;
  const int64_t n = shard ? p->mn : p->numel;
  float *host = which == 0 ? p->w : which == 1 ? p->m : p->v, *tmp = NULL;
  if (n == 0) return 0; /* an empty ZeRO shard */
  if (!s->rt && !host) return errf(err, errlen, "%s: no host copy to load into", p->name);
  const float *from = src;
  if (s->transposed) { /* [out, in] -> [in, out]: into place, or into a buffer to cut or upload from */
    float *dst = !s->rt && !shard ? host : (tmp = malloc((size_t)p->numel * sizeof *tmp + 1));
    if (!dst) return errf(err, errlen, "out of host memory for %s", p->name);
    transpose(src, dst, p->type.dims[1], p->type.dims[0]);
    from = dst;
  }
  if (shard) from += p->mlo;
  int rc = 0;
  if (s->rt) rc = gpu_runtime_store(s->rt, s->index, which, from, err, errlen);
  else if (from != host) memcpy(host, from, (size_t)n * sizeof *host);
  free(tmp);
  return rc;
}

/* The view's entries, one per parameter of part (VIEW_SAVE_MOMENTS: and every ZeRO-sharded
 * one). */
static int make(const ckpt_part *part, gpu_runtime *rt, view_kind kind, hf_view *v) {
  const int save = kind != VIEW_LOAD;
  const ir_graph *g = part->g;
  const int total = part->ps->n;
  memset(v, 0, sizeof *v);
  v->cp = calloc((size_t)total + 1, sizeof *v->cp);
  v->src = calloc((size_t)total + 1, sizeof *v->src);
  if (!v->cp || !v->src) return -1;
  for (int id = 0; id < g->n_nodes; id++) {
    if (g->nodes[id].op != OP_PARAM) continue;
    rt_param *p = rt_params_find(part->ps, ir_get_str(&g->nodes[id], "name", ""));
    if (!p || v->n >= total) return -1;
    const int whole = !(part->experts_only && ir_get_int(&g->nodes[id], "expert", -1) < 0) && !part->shards_only;
    if (!whole && !(kind == VIEW_SAVE_MOMENTS && p->zero_group >= 0)) continue;
    ckpt_param *c = &v->cp[v->n];
    hf_src *s = &v->src[v->n];
    *s = (hf_src){p, p->type.rank == 2 && train_param_is_linear_weight(g, id), rt, (int)(p - part->ps->p)};
    c->name = p->name;
    c->ndim = p->type.rank;
    for (int d = 0; d < p->type.rank; d++) c->shape[d] = p->type.dims[d];
    if (s->transposed) c->shape[0] = p->type.dims[1], c->shape[1] = p->type.dims[0];
    c->shard_t = s->transposed;
    c->fetch_ctx = s, c->has_moments = 1;
    if (save) c->fetch = fetch;
    else c->store = store;
    if (save && p->zero_group >= 0) /* an empty shard (past the end: mlo may exceed numel) writes nothing */
      c->shard_lo = p->mn > 0 ? p->mlo : 0, c->shard_n = p->mn, c->has_moments = p->mn > 0;
    v->n++;
  }
  return 0;
}

int hf_view_for_save(const ckpt_part *part, gpu_runtime *rt, hf_view *v) { return make(part, rt, VIEW_SAVE, v); }
int hf_view_for_save_moments(const ckpt_part *part, gpu_runtime *rt, hf_view *v) {
  return make(part, rt, VIEW_SAVE_MOMENTS, v);
}
int hf_view_for_load(const ckpt_part *part, gpu_runtime *rt, hf_view *v) { return make(part, rt, VIEW_LOAD, v); }

void hf_view_free(hf_view *v) {
  free(v->cp);
  free(v->src);
  memset(v, 0, sizeof *v);
}

ckpt_contents hf_view_contents(const ir_graph *g, const hf_view *v) {
  ckpt_contents c;
  memset(&c, 0, sizeof c);
  c.config = &g->cfg;
  c.bos_id = DATA_BOS, c.eos_id = DATA_EOS, c.pad_id = DATA_PAD;
  c.params = v->cp;
  c.n_params = (size_t)v->n;
  return c;
}
