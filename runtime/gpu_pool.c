/* gpu_pool.c -- see gpu_pool.h. Blocks live in one array (slots recycled), each segment's
 * blocks chained in address order; the free blocks in an unordered list searched for the
 * smallest fit; the used ones in a hash by address (gpu_pool_put gets only the pointer). */
#include "gpu_pool.h"

#include <stdlib.h>
#include <string.h>

enum {
  ALIGN = 512,
  SMALL_LIMIT = 1 << 20,   /* requests below go to the small pool */
  SMALL_SEGMENT = 2 << 20, /* and come from segments of this size */
  LARGE_ROUND = 2 << 20,   /* large segments are multiples of this */
  LARGE_SPLIT = 1 << 20,   /* a large block is split when at least this is left over */
  BUCKETS = 4096,
};

typedef struct {
  uint64_t ptr;
  size_t size;     /* bytes of the block */
  size_t req;      /* bytes asked for, while handed out */
  int seg;         /* its segment */
  int prev, next;  /* neighbours in the segment, address order; -1 none */
  int hnext;       /* next used block of its hash bucket; next recycled slot when dead */
  int fpos;        /* place in the free list; -1 when handed out */
} blk;

typedef struct {
  uint64_t base;
  size_t size;
  int small, live;
} seg;

struct gpu_pool {
  gpu_pool_backend b;
  blk *blocks;
  int n_blocks, cap_blocks, dead; /* dead: first recycled slot, -1 none */
  seg *segs;
  int n_segs, cap_segs;
  int *free_list, n_free, cap_free;
  int bucket[BUCKETS];
  size_t reserved, in_use;
};

static void note(gpu_pool *p, ptrdiff_t delta) {
  if (p->b.note_idle && delta) p->b.note_idle(p->b.ctx, delta);
}

static int grow(void **a, int *cap, int need, size_t elem) {
  if (need <= *cap) return 0;
  int c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  void *n = realloc(*a, (size_t)c * elem);
  if (!n) return -1;
  *a = n;
  *cap = c;
  return 0;
}

/* A block slot (index; the array may move). -1: out of host memory. */
static int new_block(gpu_pool *p) {
  if (p->dead >= 0) {
    int i = p->dead;
    p->dead = p->blocks[i].hnext;
    return i;
  }
  if (grow((void **)&p->blocks, &p->cap_blocks, p->n_blocks + 1, sizeof(blk))) return -1;
  return p->n_blocks++;
}

static void kill_block(gpu_pool *p, int i) {
  p->blocks[i].hnext = p->dead;
  p->blocks[i].fpos = -1;
  p->dead = i;
}

static int free_add(gpu_pool *p, int i) {
  if (grow((void **)&p->free_list, &p->cap_free, p->n_free + 1, sizeof(int))) return -1;
  p->blocks[i].fpos = p->n_free;
  p->free_list[p->n_free++] = i;
  return 0;
}

static void free_remove(gpu_pool *p, int i) {
  int at = p->blocks[i].fpos, last = p->free_list[--p->n_free];
  p->free_list[at] = last;
  p->blocks[last].fpos = at;
  p->blocks[i].fpos = -1;
}

static unsigned hash(uint64_t ptr) { return (unsigned)(((ptr / ALIGN) * 0x9E3779B97F4A7C15ull) >> 52) % BUCKETS; }

static void used_add(gpu_pool *p, int i) {
  unsigned h = hash(p->blocks[i].ptr);
  p->blocks[i].hnext = p->bucket[h];
  p->bucket[h] = i;
}

/* The used block at ptr, unlinked from its bucket; -1 when none. */
static int used_take(gpu_pool *p, uint64_t ptr) {
  unsigned h = hash(ptr);
  for (int *at = &p->bucket[h]; *at >= 0; at = &p->blocks[*at].hnext)
    if (p->blocks[*at].ptr == ptr) {
      int i = *at;
      *at = p->blocks[i].hnext;
      return i;
    }
  return -1;
}

gpu_pool *gpu_pool_new(const gpu_pool_backend *b) {
  gpu_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->b = *b;
  p->dead = -1;
  for (int i = 0; i < BUCKETS; i++) p->bucket[i] = -1;
  return p;
}

void gpu_pool_trim(gpu_pool *p) {
  for (int s = 0; s < p->n_segs; s++) {
    if (!p->segs[s].live) continue;
    /* wholly free: one free block spanning the segment */
    int i = -1;
    for (int k = 0; k < p->n_free && i < 0; k++)
      if (p->blocks[p->free_list[k]].seg == s && p->blocks[p->free_list[k]].size == p->segs[s].size) i = p->free_list[k];
    if (i < 0) continue;
    free_remove(p, i);
    kill_block(p, i);
    p->b.free(p->b.ctx, p->segs[s].base);
    p->segs[s].live = 0;
    p->reserved -= p->segs[s].size;
    note(p, -(ptrdiff_t)p->segs[s].size);
  }
}

void gpu_pool_free(gpu_pool *p) {
  if (!p) return;
  for (int s = 0; s < p->n_segs; s++)
    if (p->segs[s].live) p->b.free(p->b.ctx, p->segs[s].base);
  note(p, -(ptrdiff_t)(p->reserved - p->in_use));
  free(p->blocks);
  free(p->segs);
  free(p->free_list);
  free(p);
}

/* A new segment of `size` holding one free block; its index, or -1. The caller has noted
 * the segment idle except for `req`. */
static int new_segment(gpu_pool *p, size_t size, int small) {
  int s = -1;
  for (int k = 0; k < p->n_segs && s < 0; k++)
    if (!p->segs[k].live) s = k;
  if (s < 0) {
    if (grow((void **)&p->segs, &p->cap_segs, p->n_segs + 1, sizeof(seg))) return -1;
    s = p->n_segs++;
    p->segs[s].live = 0;
  }
  int i = new_block(p);
  if (i < 0 || grow((void **)&p->free_list, &p->cap_free, p->n_free + 1, sizeof(int))) return -1;
  uint64_t base = 0;
  if (p->b.alloc(p->b.ctx, size, &base) != 0) {
    kill_block(p, i);
    return -2;
  }
  p->segs[s] = (seg){base, size, small, 1};
  p->blocks[i] = (blk){base, size, 0, s, -1, -1, -1, -1};
  free_add(p, i); /* room made above */
  p->reserved += size;
  return i;
}

int gpu_pool_get(gpu_pool *p, size_t bytes, uint64_t *ptr) {
  *ptr = 0;
  const size_t req = bytes ? bytes : 1, need = (req + ALIGN - 1) / ALIGN * ALIGN;
  const int small = need < SMALL_LIMIT;
  int best = -1;
  for (int k = 0; k < p->n_free; k++) {
    const blk *c = &p->blocks[p->free_list[k]];
    if (p->segs[c->seg].small == small && c->size >= need && (best < 0 || c->size < p->blocks[best].size))
      best = p->free_list[k];
  }
  if (best >= 0) {
    note(p, -(ptrdiff_t)req);
  } else {
    const size_t size = small ? SMALL_SEGMENT : (need + LARGE_ROUND - 1) / LARGE_ROUND * LARGE_ROUND;
    note(p, (ptrdiff_t)(size - req));
    best = new_segment(p, size, small);
    if (best == -2) { /* the driver is out: give back what is wholly free, once */
      size_t before = p->reserved;
      gpu_pool_trim(p);
      best = p->reserved < before ? new_segment(p, size, small) : -2;
    }
    if (best < 0) {
      note(p, -(ptrdiff_t)(size - req));
      return -1;
    }
  }
  /* split off what is worth keeping, as a free block right after */
  blk *b = &p->blocks[best];
  if (b->size - need >= (small ? (size_t)ALIGN : (size_t)LARGE_SPLIT)) {
    int r = new_block(p);
    if (r >= 0 && free_add(p, r) == 0) {
      b = &p->blocks[best];
      blk *rb = &p->blocks[r];
      *rb = (blk){b->ptr + need, b->size - need, 0, b->seg, best, b->next, -1, rb->fpos};
      if (b->next >= 0) p->blocks[b->next].prev = r;
      b->next = r;
      b->size = need;
    } else if (r >= 0) {
      kill_block(p, r);
    }
  }
  free_remove(p, best);
  b = &p->blocks[best];
  b->req = req;
  used_add(p, best);
  p->in_use += req;
  *ptr = b->ptr;
  return 0;
}

/* Folds block j (free, right after i in its segment) into i. */
static void merge_next(gpu_pool *p, int i, int j) {
  blk *a = &p->blocks[i], *c = &p->blocks[j];
  free_remove(p, j);
  a->size += c->size;
  a->next = c->next;
  if (c->next >= 0) p->blocks[c->next].prev = i;
  kill_block(p, j);
}

void gpu_pool_put(gpu_pool *p, uint64_t ptr) {
  if (!ptr) return;
  int i = used_take(p, ptr);
  if (i < 0) return; /* not ours: a caller bug that must not corrupt the pool */
  size_t req = p->blocks[i].req;
  p->blocks[i].req = 0;
  p->in_use -= req;
  note(p, (ptrdiff_t)req);
  int prev = p->blocks[i].prev, next = p->blocks[i].next;
  if (prev >= 0 && p->blocks[prev].fpos >= 0) { /* into the free block before it */
    blk *a = &p->blocks[prev];
    a->size += p->blocks[i].size;
    a->next = next;
    if (next >= 0) p->blocks[next].prev = prev;
    kill_block(p, i);
    i = prev;
  } else if (free_add(p, i) != 0) { /* out of host memory: leak the block rather than lose track */
    return;
  }
  next = p->blocks[i].next;
  if (next >= 0 && p->blocks[next].fpos >= 0) merge_next(p, i, next);
}

size_t gpu_pool_reserved(const gpu_pool *p) { return p->reserved; }
size_t gpu_pool_in_use(const gpu_pool *p) { return p->in_use; }
int gpu_pool_segments(const gpu_pool *p) {
  int n = 0;
  for (int s = 0; s < p->n_segs; s++) n += p->segs[s].live;
  return n;
}
