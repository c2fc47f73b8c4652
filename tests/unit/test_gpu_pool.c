/* test_gpu_pool.c -- the executor's caching allocator (runtime/gpu_pool.c) on a fake backend
 * (addresses from a counter, a byte limit standing in for the GPU's memory):
 * - 20,000 random gets and puts of sizes from 1 byte to 300 MiB: live blocks never overlap,
 *   each lies inside a live segment and is 512-byte aligned; in_use, reserved and the idle
 *   bytes the backend was told agree with the live blocks and segments after every call;
 * - everything put back and trimmed: no segment left, nothing reserved;
 * - a training step's pattern (activations kept through a "forward", freed in reverse while
 *   gradients come and go) run twice: the second run asks the backend for nothing, and
 *   reserved stays within 10% of the most bytes in use;
 * - out of memory: a request past the limit fails; with wholly free segments held, the pool
 *   gives them back and the request succeeds; a pointer not from the pool is ignored. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gpu_pool.h"

#include "check.h"

#define MIB ((size_t)1 << 20)

typedef struct {
  uint64_t next;      /* the next address handed out */
  uint64_t base[4096];
  size_t size[4096];
  int n;              /* live segments */
  size_t held, limit; /* bytes held, and the most allowed (0: no limit) */
  ptrdiff_t idle;     /* what the pool said no tensor uses */
  int allocs;
} fake;

static int fake_alloc(void *ctx, size_t bytes, uint64_t *ptr) {
  fake *f = ctx;
  if ((f->limit && f->held + bytes > f->limit) || f->n == 4096) return -1;
  *ptr = f->next;
  f->next += (bytes + (2 * MIB - 1)) / (2 * MIB) * (2 * MIB) + 2 * MIB; /* a gap: neighbours never touch */
  f->base[f->n] = *ptr;
  f->size[f->n++] = bytes;
  f->held += bytes;
  f->allocs++;
  return 0;
}

static void fake_free(void *ctx, uint64_t ptr) {
  fake *f = ctx;
  for (int i = 0; i < f->n; i++)
    if (f->base[i] == ptr) {
      f->held -= f->size[i];
      f->base[i] = f->base[--f->n];
      f->size[i] = f->size[f->n];
      return;
    }
  CHECK(0, "the pool freed %llx, which the backend never gave", (unsigned long long)ptr);
}

static void fake_idle(void *ctx, ptrdiff_t d) { ((fake *)ctx)->idle += d; }

typedef struct {
  uint64_t p;
  size_t n;
} live;

static int by_ptr(const void *a, const void *b) {
  uint64_t x = ((const live *)a)->p, y = ((const live *)b)->p;
  return (x > y) - (x < y);
}

/* The invariants over the live blocks l (n of them). */
static void check_state(const char *when, gpu_pool *p, fake *f, live *l, int n) {
  size_t used = 0;
  for (int i = 0; i < n; i++) used += l[i].n;
  CHECK(gpu_pool_in_use(p) == used, "%s: in_use %zu, live blocks ask %zu", when, gpu_pool_in_use(p), used);
  CHECK(gpu_pool_reserved(p) == f->held, "%s: reserved %zu, backend holds %zu", when, gpu_pool_reserved(p), f->held);
  CHECK(f->idle == (ptrdiff_t)(f->held - used), "%s: told idle %td, held - used %zu", when, f->idle, f->held - used);
  CHECK(gpu_pool_segments(p) == f->n, "%s: %d segments, backend %d", when, gpu_pool_segments(p), f->n);
  live *s = malloc((size_t)(n > 0 ? n : 1) * sizeof *s);
  if (n > 0) memcpy(s, l, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, by_ptr);
  for (int i = 0; i < n; i++) {
    CHECK(s[i].p % 512 == 0, "%s: block %llx not 512-aligned", when, (unsigned long long)s[i].p);
    if (i > 0) CHECK(s[i - 1].p + s[i - 1].n <= s[i].p, "%s: blocks at %llx and %llx overlap", when,
                     (unsigned long long)s[i - 1].p, (unsigned long long)s[i].p);
    int inside = 0;
    for (int k = 0; k < f->n && !inside; k++) inside = s[i].p >= f->base[k] && s[i].p + s[i].n <= f->base[k] + f->size[k];
    CHECK(inside, "%s: block %llx (+%zu) outside every segment", when, (unsigned long long)s[i].p, s[i].n);
  }
  free(s);
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t next_rand(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}

static size_t random_size(void) {
  switch (next_rand() % 4) {
    case 0: return next_rand() % 4096 + 1;          /* tiny */
    case 1: return next_rand() % (900 * 1024) + 1;  /* small pool */
    case 2: return next_rand() % (64 * MIB) + MIB;  /* large */
    default: return next_rand() % (300 * MIB) + MIB;
  }
}

/* A step: L "layers" keep activations (sizes cycling), then the backward frees them in reverse
 * while taking and returning gradient buffers; the most bytes in use goes to *peak. */
static int step(gpu_pool *p, uint64_t *keep, size_t *peak) {
  static const size_t act[] = {16 * MIB, 512 * MIB, 640 * MIB, 32 * MIB + 4096, 128 * MIB, 300 * 1024};
  enum { L = 12, A = sizeof act / sizeof act[0] };
  for (int l = 0; l < L * A; l++) {
    if (gpu_pool_get(p, act[l % A], &keep[l])) return -1;
    if (gpu_pool_in_use(p) > *peak) *peak = gpu_pool_in_use(p);
  }
  for (int l = L * A - 1; l >= 0; l--) {
    uint64_t g1, g2;
    if (gpu_pool_get(p, act[l % A] * 2, &g1) || gpu_pool_get(p, 7 * MIB, &g2)) return -1;
    if (gpu_pool_in_use(p) > *peak) *peak = gpu_pool_in_use(p);
    gpu_pool_put(p, g2);
    gpu_pool_put(p, keep[l]);
    gpu_pool_put(p, g1);
  }
  return 0;
}

int main(void) {
  fake f;
  memset(&f, 0, sizeof f);
  f.next = 1ull << 40;
  gpu_pool_backend b = {&f, fake_alloc, fake_free, fake_idle};
  gpu_pool *p = gpu_pool_new(&b);
  CHECK(p != NULL, "gpu_pool_new");

  enum { MAXLIVE = 400 };
  live l[MAXLIVE];
  int n = 0;
  for (int it = 0; it < 20000; it++) {
    if (n < MAXLIVE && (n == 0 || next_rand() % 100 < 55)) {
      size_t sz = random_size();
      uint64_t ptr;
      if (gpu_pool_get(p, sz, &ptr) != 0) {
        CHECK(0, "get %zu failed with no limit", sz);
        break;
      }
      l[n++] = (live){ptr, sz};
    } else {
      int k = (int)(next_rand() % (uint64_t)n);
      gpu_pool_put(p, l[k].p);
      l[k] = l[--n];
    }
    if (it % 97 == 0) check_state("random", p, &f, l, n);
  }
  check_state("random (end)", p, &f, l, n);
  printf("random: %d segments, %.1f MiB reserved for %.1f MiB in use (%d live blocks)\n", gpu_pool_segments(p),
         gpu_pool_reserved(p) / (double)MIB, gpu_pool_in_use(p) / (double)MIB, n);
  while (n > 0) gpu_pool_put(p, l[--n].p);
  check_state("all put back", p, &f, l, 0);
  gpu_pool_trim(p);
  CHECK(gpu_pool_reserved(p) == 0 && gpu_pool_segments(p) == 0 && f.n == 0, "trim left %zu bytes in %d segments",
        gpu_pool_reserved(p), gpu_pool_segments(p));
  gpu_pool_free(p);

  /* a training step's pattern, twice */
  memset(&f, 0, sizeof f);
  f.next = 1ull << 40;
  p = gpu_pool_new(&b);
  uint64_t keep[12 * 6];
  size_t peak = 0;
  CHECK(step(p, keep, &peak) == 0, "step 1");
  size_t reserved1 = gpu_pool_reserved(p);
  int allocs1 = f.allocs;
  CHECK(step(p, keep, &peak) == 0, "step 2");
  CHECK(f.allocs == allocs1, "step 2 asked the backend for %d more segments", f.allocs - allocs1);
  CHECK(reserved1 <= peak + peak / 10, "a step reserved %.1f MiB for at most %.1f MiB in use", reserved1 / (double)MIB,
        peak / (double)MIB);
  printf("step pattern: %.1f MiB reserved for at most %.1f MiB in use (%d segments); step 2 allocated nothing\n",
         reserved1 / (double)MIB, peak / (double)MIB, gpu_pool_segments(p));
  check_state("after the steps", p, &f, NULL, 0);
  gpu_pool_free(p);

  /* out of memory, and giving back free segments */
  memset(&f, 0, sizeof f);
  f.next = 1ull << 40;
  f.limit = 1024 * MIB;
  p = gpu_pool_new(&b);
  uint64_t a1, a2, a3;
  CHECK(gpu_pool_get(p, 600 * MIB, &a1) == 0 && gpu_pool_get(p, 300 * MIB, &a2) == 0, "600 + 300 MiB within 1 GiB");
  CHECK(gpu_pool_get(p, 500 * MIB, &a3) != 0 && a3 == 0, "500 MiB more than the limit allows");
  check_state("after a refused get", p, &f, (live[]){{a1, 600 * MIB}, {a2, 300 * MIB}}, 2);
  gpu_pool_put(p, a1); /* its segment wholly free, but a 700 MiB request does not fit in it */
  CHECK(gpu_pool_get(p, 700 * MIB, &a3) == 0, "700 MiB after giving the free 600 back");
  check_state("after the retry", p, &f, (live[]){{a2, 300 * MIB}, {a3, 700 * MIB}}, 2);
  gpu_pool_put(p, 12345 * 512); /* not from the pool */
  check_state("after a foreign put", p, &f, (live[]){{a2, 300 * MIB}, {a3, 700 * MIB}}, 2);
  gpu_pool_put(p, a2);
  gpu_pool_put(p, a3);
  gpu_pool_free(p);
  CHECK(f.n == 0 && f.held == 0 && f.idle == 0, "gpu_pool_free left %d segments, idle %td", f.n, f.idle);

  if (failures) {
    printf("test_gpu_pool: %d failures\n", failures);
    return 1;
  }
  printf("test_gpu_pool: ok\n");
  return 0;
}
