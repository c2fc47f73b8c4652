/* params.c -- parameter storage and deterministic initialisation. */
#include "params.h"

#include "hash.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The next value of a splitmix64 stream. */
static uint64_t next_u64(uint64_t *s) {
  uint64_t r = hash_mix64(*s);
  *s += HASH_GOLDEN;
  return r;
}

/* Standard normal by Box-Muller from two 53-bit uniforms in (0, 1]. */
static double normal01(uint64_t *s) {
  double u1 = ((double)(next_u64(s) >> 11) + 1.0) * 0x1.0p-53;
  double u2 = (double)(next_u64(s) >> 11) * 0x1.0p-53;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

rt_params *rt_params_new(const ir_graph *g, uint64_t seed) {
  rt_params *ps = calloc(1, sizeof *ps);
  if (!ps) return NULL;
  ps->moments_bf16 = g->cfg.moments_bf16;
  for (int i = 0; i < g->n_nodes; i++) ps->n += g->nodes[i].op == OP_PARAM;
  ps->p = calloc((size_t)(ps->n ? ps->n : 1), sizeof *ps->p);
  if (!ps->p) {
    free(ps);
    return NULL;
  }
  int k = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    if (n->op != OP_PARAM) continue;
    rt_param *p = &ps->p[k++];
    p->name = strdup(ir_get_str(n, "name", "?"));
    p->type = n->type;
    p->numel = ir_type_numel_bound(g, &n->type);
    p->expert = (int)ir_get_int(n, "expert", -1);
    p->w = malloc((size_t)p->numel * sizeof(float));
    p->m = calloc((size_t)p->numel, sizeof(float));
    p->v = calloc((size_t)p->numel, sizeof(float));
    p->mlo = 0, p->mn = p->numel, p->zero_group = -1;
    if (!p->name || !p->w || !p->m || !p->v) {
      rt_params_free(ps);
      return NULL;
    }
    const char *init = ir_get_str(n, "init", "normal");
    if (strcmp(init, "ones") == 0) {
      for (int64_t j = 0; j < p->numel; j++) p->w[j] = 1.0f;
    } else if (strcmp(init, "zeros") == 0) {
      memset(p->w, 0, (size_t)p->numel * sizeof(float));
    } else {
      double std = ir_get_float(n, "std", 0.02);
      /* each parameter's stream depends on its name, so adding a layer leaves the others alone */
      uint64_t s = seed * HASH_GOLDEN ^ hash_str(p->name);
      for (int64_t j = 0; j < p->numel; j++) p->w[j] = (float)(std * normal01(&s));
    }
  }
  return ps;
}

void rt_params_free(rt_params *ps) {
  if (!ps) return;
  for (int i = 0; i < ps->n; i++) {
    free((void *)ps->p[i].name);
    free(ps->p[i].w);
    free(ps->p[i].m);
    free(ps->p[i].v);
  }
  free(ps->p);
  free(ps);
}

void rt_params_release_host(rt_params *ps) {
  for (int i = 0; i < ps->n; i++) {
    rt_param *p = &ps->p[i];
    free(p->w), free(p->m), free(p->v);
    p->w = p->m = p->v = NULL;
  }
}

rt_param *rt_params_find(rt_params *ps, const char *name) {
  for (int i = 0; i < ps->n; i++)
    if (ps->p[i].name && strcmp(ps->p[i].name, name) == 0) return &ps->p[i];
  return NULL;
}

int64_t rt_params_numel(const rt_params *ps) {
  int64_t n = 0;
  for (int i = 0; i < ps->n; i++) n += ps->p[i].numel;
  return n;
}
