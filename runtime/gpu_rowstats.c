/* gpu_rowstats.c -- see gpu_rowstats.h. */
#include "gpu_rowstats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SLOTS = 64 };

typedef struct {
  gpu_rowstats_key key;
  gpu_ptr buf;
  size_t cap;
  uint64_t used; /* the clock at the last use; 0: empty */
  uint64_t run;  /* the run of the last use: older entries are stale */
} entry;

struct gpu_rowstats {
  gpu_ctx *g;
  const char *what;
  entry e[SLOTS];
  uint64_t clock, run;
};

gpu_rowstats *gpu_rowstats_new(gpu_ctx *g, const char *what) {
  gpu_rowstats *c = calloc(1, sizeof *c);
  if (c) c->g = g, c->what = what;
  return c;
}

void gpu_rowstats_free(gpu_rowstats *c) {
  if (!c) return;
  for (int i = 0; i < SLOTS; i++) gpu_free(c->g, c->e[i].buf);
  free(c);
}

void gpu_rowstats_new_run(gpu_rowstats *c) {
  if (c) c->run++;
}

static int same(const gpu_rowstats_key *a, const gpu_rowstats_key *b) {
  return a->q == b->q && a->k == b->k && a->v == b->v && a->out == b->out && a->B == b->B && a->seq == b->seq &&
         a->nh == b->nh && a->nkv == b->nkv && a->hd == b->hd && a->causal == b->causal;
}

static entry *find(gpu_rowstats *c, const gpu_rowstats_key *key) {
  for (int i = 0; i < SLOTS; i++)
    if (c->e[i].used && same(&c->e[i].key, key)) return &c->e[i];
  return NULL;
}

gpu_ptr gpu_rowstats_get(gpu_rowstats *c, const gpu_rowstats_key *key, size_t bytes, int *fresh, char *err,
                         size_t errlen) {
  entry *e = find(c, key);
  *fresh = e == NULL;
  if (!e) {
    for (int i = 0; i < SLOTS; i++) { /* a stale entry whose buffer fits, the least recently used of them */
      entry *x = &c->e[i];
      if (x->used && x->run != c->run && x->cap >= bytes && (!e || x->used < e->used)) e = x;
    }
    if (!e) {
      e = &c->e[0];
      for (int i = 1; i < SLOTS; i++)
        if (c->e[i].used < e->used) e = &c->e[i];
    }
    e->key = *key;
  }
  e->used = ++c->clock;
  e->run = c->run;
  if (e->cap < bytes) { /* queued kernels may still read the old buffer: wait for them first */
    if (e->buf && gpu_sync(c->g) != 0) {
      snprintf(err, errlen, "%s", gpu_error(c->g));
      e->used = 0;
      return 0;
    }
    gpu_free(c->g, e->buf);
    e->buf = 0;
    e->cap = 0;
    if (gpu_alloc(c->g, &e->buf, bytes, c->what) != 0) {
      snprintf(err, errlen, "%s", gpu_error(c->g));
      e->used = 0;
      return 0;
    }
    e->cap = bytes;
  }
  return e->buf;
}

void gpu_rowstats_drop(gpu_rowstats *c, const gpu_rowstats_key *key) {
  entry *e = find(c, key);
  if (e) e->used = 0;
}
