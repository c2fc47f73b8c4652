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

int ckpt_tset_open(ckpt_tset *t, const char *dir, const char *kind, char *err, size_t errlen) {
  memset(t, 0, sizeof *t);
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

void ckpt_tset_close(ckpt_tset *t) {
  for (size_t k = 0; k < t->n; k++) st_close(t->files[k]);
  free(t->files);
  st_json_free(t->index);
  memset(t, 0, sizeof *t);
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
