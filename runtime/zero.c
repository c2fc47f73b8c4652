/* zero.c -- ZeRO-1's host side: cutting the AdamW moments into this rank's shards and
 * gathering them back for checkpoints (zero.h). */
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

/* recv (size * chunk) <- every rank's shard of one moment, padded to chunk. */
static int gather_moment(comm *c, const rt_param *p, const float *shard, int64_t chunk, float *recv, char *err,
                         size_t errlen) {
  float *send = calloc((size_t)chunk + 1, sizeof *send);
  if (!send) return errf(err, errlen, "zero: out of host memory gathering the moments of %s", p->name);
  memcpy(send, shard, (size_t)p->mn * sizeof *send);
  int rc = comm_all_gather(c, send, (size_t)chunk * sizeof *send, recv, err, errlen);
  free(send);
  return rc;
}

int zero_unshard(rt_params *ps, const ir_graph *step, comm_world *w, int rank, char *err, size_t errlen) {
  for (int id = 0; id < step->n_nodes; id++) {
    comm_group grp;
    rt_param *p = sharded_param(step, id, ps, &grp);
    if (!p || p->zero_group < 0) continue;
    comm *c = comm_get(w, rank, (comm_group)p->zero_group);
    const int64_t chunk = ir_shard_len(p->numel, comm_size(c));
    const size_t all = (size_t)comm_size(c) * (size_t)chunk + 1;
    float *m = malloc(all * sizeof *m), *v = malloc(all * sizeof *v);
    int rc = m && v ? 0 : errf(err, errlen, "zero: out of host memory gathering the moments of %s", p->name);
    if (rc == 0) rc = gather_moment(c, p, p->m, chunk, m, err, errlen);
    if (rc == 0) rc = gather_moment(c, p, p->v, chunk, v, err, errlen);
    if (rc) {
      free(m);
      free(v);
      return -1;
    }
    free(p->m);
    free(p->v);
    p->m = m, p->v = v, p->mlo = 0, p->mn = p->numel, p->zero_group = -1;
  }
  return 0;
}

size_t zero_moment_bytes(const rt_params *ps, size_t bytes, int whole) {
  size_t b = 0;
  for (int i = 0; i < ps->n; i++) b += (size_t)(whole ? ps->p[i].numel : ps->p[i].mn) * 2 * bytes;
  return b;
}
