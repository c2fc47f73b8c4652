/* zero.c -- ZeRO-1's host side: cutting the AdamW moments into this rank's shards (zero.h). */
#include "zero.h"

#include <stdlib.h>
#include <string.h>

#include "errf.h"

/* The parameter of a sharded adamw node and its group, or NULL when id is no such node. */
static rt_param *sharded_param(const ir_graph *g, int id, rt_params *ps, comm_group *grp) {
  const ir_node *n = &g->nodes[id];
  const char *z = n->op == OP_ADAMW ? ir_get_str(n, "zero", NULL) : NULL;
  if (!z) return NULL;
  *grp = comm_group_named(z);
  return rt_params_find(ps, ir_get_str(&g->nodes[n->in[0]], "name", ""));
}

int zero_shard(rt_params *ps, const ir_graph *step, comm_world *w, int rank, char *err, size_t errlen) {
  for (int id = 0; id < step->n_nodes; id++) {
    comm_group grp;
    rt_param *p = sharded_param(step, id, ps, &grp);
    if (!p || p->zero_group >= 0) continue;
    comm *c = w ? comm_get(w, rank, grp) : NULL;
    if (!c) return errf(err, errlen, "zero: rank %d has no %s group for %s", rank, comm_group_name(grp), p->name);
    const int64_t chunk = ir_shard_len(p->numel, comm_size(c)), lo = (int64_t)comm_rank(c) * chunk;
    const int64_t want = ir_type_numel_bound(step, &step->nodes[step->nodes[id].in[1]].type);
    if (want != chunk)
      return errf(err, errlen, "zero: %s: the step graph's shard has %lld values, its %s group of %d ranks %lld", p->name,
                  (long long)want, comm_group_name(grp), comm_size(c), (long long)chunk);
    const int64_t mn = ir_shard_count(p->numel, comm_size(c), comm_rank(c));
    float *m = malloc(((size_t)mn + 1) * sizeof *m), *v = malloc(((size_t)mn + 1) * sizeof *v);
    if (!m || !v) {
      free(m);
      free(v);
      return errf(err, errlen, "zero: out of host memory for the moments of %s", p->name);
    }
    memcpy(m, p->m + p->mlo + lo, (size_t)mn * sizeof *m);
    memcpy(v, p->v + p->mlo + lo, (size_t)mn * sizeof *v);
    free(p->m);
    free(p->v);
    p->m = m, p->v = v, p->mlo = lo, p->mn = mn, p->zero_group = (int)grp;
  }
  return 0;
}

size_t zero_moment_bytes(const rt_params *ps, size_t bytes, int whole) {
  size_t b = 0;
  for (int i = 0; i < ps->n; i++) b += (size_t)(whole ? ps->p[i].numel : ps->p[i].mn) * 2 * bytes;
  return b;
}
