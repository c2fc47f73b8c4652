/* ckpt_index.c -- the sharded checkpoint layout of expert parallelism (ckpt.h): each writer's
 * part files, the Hugging Face index over them, and reading either layout (ckpt_int.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "errf.h"
#include "sbuf.h"

void ckpt_part_name(char *buf, size_t len, const char *kind, int k, int n) {
  snprintf(buf, len, "%s-%05d-of-%05d.safetensors", kind, k + 1, n);
}

static int add_file(ckpt_tset *t, const char *path, char *err, size_t errlen) {
  st_file **nf = realloc(t->files, (t->n + 1) * sizeof *nf);
  if (!nf) return errf(err, errlen, "%s: out of memory", path);
  t->files = nf;
  if (!(t->files[t->n] = st_open(path, err, errlen))) return -1;
  t->n++;
  return 0;
}

/* The part named by an index entry: a plain file name in the checkpoint's directory. */
static int part_ok(const char *f) {
  size_t L = strlen(f);
  return L > 12 && !strchr(f, '/') && strcmp(f + L - 12, ".safetensors") == 0 && f[0] != '.';
}

static int index_shards(ckpt_tset *t, char *err, size_t errlen);

/* The files of t (ckpt_tset_open without the shard index). */
static int open_files(ckpt_tset *t, const char *dir, const char *kind, char *err, size_t errlen) {
  char path[4200];
  snprintf(t->label, sizeof t->label, "%s/%s.safetensors.index.json", dir, kind);
  if (access(t->label, F_OK) != 0) {
    snprintf(t->label, sizeof t->label, "%s/%s.safetensors", dir, kind);
    return add_file(t, t->label, err, errlen);
  }
  if (!(t->index = ckpt_read_json(t->label, err, errlen))) return -1;
  const st_json *map = st_json_get(t->index, "weight_map");
  if (!map || map->type != ST_JSON_OBJ)
    return errf(err, errlen, "%s: no \"weight_map\" object: not a checkpoint index", t->label);
  /* the parts, in order of first mention; map values then hold the part's position */
  char **names = calloc(map->n + 1, sizeof *names);
  if (!names) return errf(err, errlen, "%s: out of memory", t->label);
  size_t held = 0;
  int rc = 0;
  for (size_t i = 0; i < map->n && rc == 0; i++) {
    const st_json *v = &map->items[i];
    if (v->type != ST_JSON_STR || !part_ok(v->s)) {
      rc = errf(err, errlen, "%s: \"%s\" maps to %s, not a .safetensors file of this directory", t->label, map->keys[i],
                v->type == ST_JSON_STR ? v->s : st_json_type_name(v->type));
      break;
    }
    size_t k = 0;
    while (k < t->n && strcmp(names[k], v->s)) k++;
    if (k == t->n) {
      names[k] = v->s;
      snprintf(path, sizeof path, "%s/%s", dir, v->s);
      if (add_file(t, path, err, errlen)) rc = -1;
    }
    if (rc == 0 && !st_find(t->files[k], map->keys[i]))
      rc = errf(err, errlen, "%s: names '%s' in %s, which does not hold it: parts of different checkpoints mixed?",
                t->label, map->keys[i], v->s);
  }
  for (size_t k = 0; rc == 0 && k < t->n; k++) held += st_count(t->files[k]);
  if (rc == 0 && held != map->n)
    rc = errf(err, errlen, "%s: its parts hold %zu tensors but it maps %zu: parts of different checkpoints mixed?",
              t->label, held, map->n);
  free(names);
  return rc;
}

const st_view *ckpt_tset_find(const ckpt_tset *t, const char *name, const st_file **file) {
  const st_file *f = t->n ? t->files[0] : NULL;
  if (t->index) {
    const st_json *v = st_json_get(st_json_get(t->index, "weight_map"), name);
    f = NULL;
    for (size_t k = 0; v && v->type == ST_JSON_STR && k < t->n && !f; k++) {
      const char *p = st_path(t->files[k]), *base = strrchr(p, '/');
      if (!strcmp(base ? base + 1 : p, v->s)) f = t->files[k];
    }
  }
  if (file) *file = f;
  return f ? st_find(f, name) : NULL;
}

size_t ckpt_tset_count(const ckpt_tset *t) {
  size_t n = 0;
  for (size_t k = 0; k < t->n; k++) n += st_count(t->files[k]);
  return n;
}

int ckpt_tset_open(ckpt_tset *t, const char *dir, const char *kind, char *err, size_t errlen) {
  memset(t, 0, sizeof *t);
  return open_files(t, dir, kind, err, errlen) || index_shards(t, err, errlen) ? -1 : 0;
}

void ckpt_tset_close(ckpt_tset *t) {
  for (size_t k = 0; k < t->n; k++) st_close(t->files[k]);
  free(t->files);
  free(t->shards);
  st_json_free(t->index);
  memset(t, 0, sizeof *t);
}

/* ---- ZeRO moment shards (ckpt.h) ---- */

size_t ckpt_shard_name(const char *name, int64_t *lo, int *t) {
  const char *dot = strrchr(name, '.');
  if (!dot || !dot[1]) return 0;
  int64_t v = 0;
  for (const char *c = dot + 1; *c; c++) {
    if (*c < '0' || *c > '9' || v > (INT64_MAX - 9) / 10) return 0;
    v = v * 10 + (*c - '0');
  }
  const size_t L = (size_t)(dot - name);
  for (int tr = 0; tr < 2; tr++) {
    const char *suf = tr ? ".shard_t" : ".shard";
    const size_t S = strlen(suf);
    if (L > S && !memcmp(name + L - S, suf, S)) {
      *lo = v, *t = tr;
      return L - S;
    }
  }
  return 0;
}

struct ckpt_shard_ref {
  const st_view *v;
  const st_file *f;
  size_t len; /* of the moment's name, v->name's prefix */
  int64_t lo;
  int t;
};
typedef ckpt_shard_ref shard_ref;

/* name[0, len) against the moment name of r */
static int cmp_key(const char *name, size_t len, const shard_ref *r) {
  const int c = memcmp(name, r->v->name, len < r->len ? len : r->len);
  return c ? c : (len > r->len) - (len < r->len);
}

static int by_key(const void *a, const void *b) {
  const shard_ref *x = a, *y = b;
  const int c = cmp_key(x->v->name, x->len, y);
  return c ? c : (x->lo > y->lo) - (x->lo < y->lo);
}

/* Every shard of t, sorted by moment name then start: one pass over the names, so a lookup is
 * a binary search however many ranks wrote parts. */
static int index_shards(ckpt_tset *t, char *err, size_t errlen) {
  size_t cap = 0;
  for (size_t k = 0; k < t->n; k++)
    for (size_t i = 0; i < st_count(t->files[k]); i++) {
      const st_view *v = st_at(t->files[k], i);
      int64_t lo;
      int tr;
      const size_t len = ckpt_shard_name(v->name, &lo, &tr);
      if (!len) continue;
      if (t->n_shards == cap) {
        shard_ref *g = realloc(t->shards, (cap = cap ? 2 * cap : 64) * sizeof *g);
        if (!g) return errf(err, errlen, "%s: out of memory", t->label);
        t->shards = g;
      }
      t->shards[t->n_shards++] = (shard_ref){v, t->files[k], len, lo, tr};
    }
  if (t->n_shards) qsort(t->shards, t->n_shards, sizeof *t->shards, by_key);
  return 0;
}

/* Moment name's shards in t, by start: *out points into t's index (*n of them). */
static void find_shards(const ckpt_tset *t, const char *name, const shard_ref **out, size_t *n) {
  const size_t L = strlen(name);
  size_t a = 0, b = t->n_shards;
  while (a < b) { /* the first shard not below name */
    const size_t m = a + (b - a) / 2;
    if (cmp_key(name, L, &t->shards[m]) > 0) a = m + 1;
    else b = m;
  }
  *out = t->shards + a, *n = 0;
  while (a + *n < t->n_shards && cmp_key(name, L, &t->shards[a + *n]) == 0) (*n)++;
}

/* Shards that tile [0, numel) in one order; -1 with err set otherwise. */
static int check_tiling(const ckpt_tset *t, const char *name, const shard_ref *s, size_t n, int64_t numel, char *err,
                        size_t errlen) {
  int64_t at = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i].v->ndim != 1 || (s[i].v->dtype != ST_F32 && s[i].v->dtype != ST_BF16 && s[i].v->dtype != ST_F16))
      return errf(err, errlen, "%s: shard '%s' is not a 1-D F32 (or BF16/F16) tensor", t->label, s[i].v->name);
    if (s[i].t != s[0].t)
      return errf(err, errlen, "%s: the shards of '%s' mix orders (.shard and .shard_t): parts of different checkpoints mixed?",
                  t->label, name);
    if (s[i].lo != at)
      return errf(err, errlen, "%s: the shards of '%s' %s at value %lld (shard '%s'): parts missing, or of different "
                  "checkpoints mixed?", t->label, name, s[i].lo > at ? "leave a gap" : "overlap", (long long)at,
                  s[i].v->name);
    at += s[i].v->numel;
  }
  if (at != numel)
    return errf(err, errlen, "%s: the shards of '%s' hold %lld values but the model's tensor has %lld: a part missing, "
                "or a checkpoint of a different model?", t->label, name, (long long)at, (long long)numel);
  return 0;
}

int ckpt_tset_shards(const ckpt_tset *t, const char *name, int64_t numel, size_t *count, int *order, char *err,
                     size_t errlen) {
  const shard_ref *s;
  size_t n;
  find_shards(t, name, &s, &n);
  int rc = n == 0 ? 1 : check_tiling(t, name, s, n, numel, err, errlen);
  if (rc == 0) *count = n, *order = s[0].t;
  return rc;
}

static void transpose_into(const float *src, float *dst, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

int ckpt_tset_read(const ckpt_tset *t, const char *name, int ndim, const int64_t *shape, float *dst, char *err,
                          size_t errlen) {
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  const st_file *f;
  if (ckpt_tset_find(t, name, &f)) return st_get_f32(f, name, dst, numel, err, errlen);
  const shard_ref *s;
  size_t n;
  find_shards(t, name, &s, &n);
  int rc = n == 0 ? errf(err, errlen, "%s: no tensor '%s', whole or in shards", t->label, name)
                  : check_tiling(t, name, s, n, numel, err, errlen);
  const int tr = rc == 0 && s[0].t;
  if (tr && ndim != 2) rc = errf(err, errlen, "%s: '%s' has transposed shards but is not 2-D", t->label, name);
  float *buf = tr && rc == 0 ? malloc((size_t)numel * sizeof *buf + 1) : dst; /* [shape[1], shape[0]] */
  if (!buf) rc = errf(err, errlen, "out of host memory reading the shards of '%s'", name);
  for (size_t i = 0; rc == 0 && i < n; i++) rc = st_get_f32(s[i].f, s[i].v->name, buf + s[i].lo, s[i].v->numel, err, errlen);
  if (rc == 0 && tr) transpose_into(buf, dst, shape[1], shape[0]);
  if (buf != dst) free(buf);
  return rc;
}

int ckpt_write_index(const char *tmp, const char *kind, int n, char *err, size_t errlen) {
  char path[4200], part[96];
  sbuf map = {0};
  uint64_t total = 0;
  size_t count = 0;
  int rc = 0;
  for (int k = 0; k < n && rc == 0; k++) {
    ckpt_part_name(part, sizeof part, kind, k, n);
    snprintf(path, sizeof path, "%s/%s", tmp, part);
    st_file *f = st_open(path, err, errlen);
    if (!f) {
      rc = -1;
      break;
    }
    for (size_t i = 0; i < st_count(f); i++, count++) {
      const st_view *v = st_at(f, i);
      sb_str(&map, count ? ",\n    " : "\n    ");
      sb_quote(&map, v->name);
      sb_str(&map, ": ");
      sb_quote(&map, part);
      total += v->end - v->begin;
    }
    st_close(f);
  }
  snprintf(path, sizeof path, "%s/%s.safetensors.index.json", tmp, kind);
  if (rc == 0) {
    sbuf b = {0};
    sb_printf(&b, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {%s\n  }\n}\n", (unsigned long long)total,
              map.p ? map.p : "");
    if (b.oom || map.oom) rc = errf(err, errlen, "%s: out of memory", path);
    else rc = st_write_atomic(path, b.p, b.n, err, errlen);
    free(b.p);
  }
  free(map.p);
  return rc;
}
