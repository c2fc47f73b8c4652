/* pipeline.c -- the default pipeline, read top to bottom, and the pass manager. */
#include "pipeline.h"

#include <string.h>

/* The pipeline. `lower` is the front end's last step; later issues add group-linear,
 * grouped-mlp, autodiff, mxfp8, fuse-elementwise and memplan here, in this order. */
static const pass_info passes[] = {
    {"autodiff", pass_autodiff, "append the backward graph and the AdamW update (training step)", 1, 1},
    {"dce", pass_dce, "remove ops whose results reach no output", 1, 0},
};

const pass_info *pass_table(int *n) {
  *n = (int)(sizeof passes / sizeof passes[0]);
  return passes;
}

const pass_info *pass_find(const char *name) {
  int n;
  const pass_info *t = pass_table(&n);
  for (int i = 0; i < n; i++)
    if (strcmp(t[i].name, name) == 0) return &t[i];
  return NULL;
}

/* True when name is an item of the comma-separated list. */
static int in_list(const char *list, const char *name) {
  if (!list) return 0;
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && strncmp(p, name, n) == 0) return 1;
    if (!e) break;
    p = e + 1;
  }
  return 0;
}

static int check_list(const char *flag, const char *list, int allow_all, FILE *err) {
  if (!list) return 0;
  if (allow_all && strcmp(list, "all") == 0) return 0;
  char item[64];
  for (const char *p = list;;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len >= sizeof item) len = sizeof item - 1;
    memcpy(item, p, len);
    item[len] = 0;
    if (!pass_find(item) && strcmp(item, "lower") != 0) {
      int n;
      const pass_info *t = pass_table(&n);
      fprintf(err, "moec: error: %s: unknown pass '%s'; the passes are: lower", flag, item);
      for (int i = 0; i < n; i++) fprintf(err, ", %s", t[i].name);
      fputs("\n", err);
      return -1;
    }
    if (!e) break;
    p = e + 1;
  }
  return 0;
}

int pipeline_check_opts(const pipeline_opts *o, FILE *err) {
  if (check_list("--passes", o->passes, 0, err) || check_list("--disable-pass", o->disable, 0, err) ||
      check_list("--print-after", o->print_after, 1, err))
    return -1;
  return 0;
}

void pipeline_print_header(const char *pass, FILE *out) { fprintf(out, "// ----- IR after %s ----- //\n", pass); }

static int want_dump(const pipeline_opts *o, const char *name) {
  return o->print_after && (strcmp(o->print_after, "all") == 0 || in_list(o->print_after, name));
}

int pipeline_run(ir_graph **g, const pipeline_opts *o, FILE *err) {
  if (want_dump(o, "lower")) {
    pipeline_print_header("lower", o->dump);
    ir_print(*g, o->dump);
  }
  int n;
  const pass_info *t = pass_table(&n);
  for (int i = 0; i < n; i++) {
    int on = o->passes ? in_list(o->passes, t[i].name) : t[i].default_on;
    if (!on || in_list(o->disable, t[i].name) || (t[i].train_only && !o->train)) continue;
    if (t[i].run(g, err) != 0) {
      fprintf(err, "moec: error: pass %s failed\n", t[i].name);
      return -1;
    }
    if (ir_verify(*g, t[i].name, err) != 0) return -1;
    if (want_dump(o, t[i].name)) {
      pipeline_print_header(t[i].name, o->dump);
      ir_print(*g, o->dump);
    }
  }
  return 0;
}
