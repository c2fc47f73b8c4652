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

/* The view's entries, one per parameter of part (VIEW_SAVE_MOMENTS: and every ZeRO-sharded
 * one); for a load, buffers for the transposed. */
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
    if (save) {
      c->fetch = fetch, c->fetch_ctx = s, c->has_moments = 1;
      if (p->zero_group >= 0) c->shard_lo = p->mlo, c->shard_n = p->mn, c->has_moments = p->mn > 0;
    } else if (s->transposed) {
      size_t bytes = (size_t)p->numel * sizeof(float);
      c->w = malloc(bytes), c->m = malloc(bytes), c->v = malloc(bytes);
      if (!c->w || !c->m || !c->v) {
        free(c->w), free(c->m), free(c->v);
        return -1;
      }
    } else {
      c->w = p->w, c->m = p->m, c->v = p->v;
    }
    v->n++;
  }
  return 0;
}

int hf_view_for_save(const ckpt_part *part, gpu_runtime *rt, hf_view *v) { return make(part, rt, VIEW_SAVE, v); }
int hf_view_for_save_moments(const ckpt_part *part, gpu_runtime *rt, hf_view *v) {
  return make(part, rt, VIEW_SAVE_MOMENTS, v);
}
int hf_view_for_load(const ckpt_part *part, hf_view *v) { return make(part, NULL, VIEW_LOAD, v); }

void hf_view_store(const hf_view *v) {
  for (int i = 0; i < v->n; i++) {
    if (!v->src[i].transposed) continue;
    rt_param *p = v->src[i].p;
    transpose(v->cp[i].w, p->w, v->cp[i].shape[0], v->cp[i].shape[1]);
    transpose(v->cp[i].m, p->m, v->cp[i].shape[0], v->cp[i].shape[1]);
    transpose(v->cp[i].v, p->v, v->cp[i].shape[0], v->cp[i].shape[1]);
  }
}

void hf_view_free(hf_view *v) {
  for (int i = 0; v->cp && v->src && i < v->n; i++)
    if (v->src[i].transposed && !v->cp[i].fetch) {
      free(v->cp[i].w);
      free(v->cp[i].m);
      free(v->cp[i].v);
    }
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
