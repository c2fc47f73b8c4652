/* pipeline.c -- the default pipeline, read top to bottom, and the pass manager. */
#include "pipeline.h"

#include "hash.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* The pipeline. `lower` is the front end's last step; later issues add fuse-elementwise and
 * memplan after mxfp8. */
static const pass_info passes[] = {
    {"group-linear", pass_group_linear, "E per-expert linears -> one grouped_linear over expert-sorted tokens", 1, 0},
    {"grouped-mlp", pass_grouped_mlp, "grouped gate_up -> SwiGLU -> x routing prob -> grouped down => grouped_mlp", 1, 0},
    {"parallelize", pass_parallelize, "one rank's graph of an EP x DP world: every loss a share of the global batch's (world > 1)", 1, 0},
    {"mxfp8-projections", pass_mxfp8_projections, "attention projections -> one-group grouped_linear, FP8 GEMMs like the experts' (precision mxfp8)", 1, 0},
    {"autodiff", pass_autodiff, "append the backward graph and the AdamW update (training step)", 1, 1},
    {"sync", pass_sync, "all_reduce the gradients before the optimizer and the outputs (world > 1)", 1, 0},
    {"fold-grad-cast", pass_fold_grad_cast, "grad_norm and adamw read bf16 gradients directly (no f32 copy; exact)", 1, 1},
    {"mxfp8", pass_mxfp8, "MXFP8 quantize ops on grouped GEMM operands (experts, projections) and saved activations (precision mxfp8)", 1, 0},
    {"fuse-residual", pass_fuse_residual, "residual adds folded into the unpermute or norm gradient making a term (exact)", 1, 0},
    {"fuse-gemm-add", pass_fuse_gemm_add, "adds of a GEMM's result folded into the GEMM as its accumulator (one rounding)", 1, 0},
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
  if (o->dump_dir) {
    struct stat st;
    if (mkdir(o->dump_dir, 0777) != 0 && (errno != EEXIST || stat(o->dump_dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
      fprintf(err, "moec: error: --dump-dir=%s: not a directory that can be made: %s\n", o->dump_dir,
              errno == EEXIST ? "a file is in the way" : strerror(errno));
      return -1;
    }
  }
  return 0;
}

void pipeline_print_header(const char *pass, FILE *out) { fprintf(out, "// ----- IR after %s ----- //\n", pass); }

/* FNV-1a over the bytes of what a dump shows. */
static uint64_t mix(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = hash_fnv(h, b[i]);
  return h;
}
static uint64_t mix_str(uint64_t h, const char *s) { return s ? mix(h, s, strlen(s) + 1) : mix(h, "", 1); }

uint64_t ir_hash(const ir_graph *g) {
  uint64_t h = HASH_FNV_INIT;
  h = mix(h, &g->n_nodes, sizeof g->n_nodes);
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    h = mix(h, &n->op, sizeof n->op);
    h = mix(h, n->in, (size_t)n->n_in * sizeof *n->in);
    h = mix(h, &n->type.dtype, sizeof n->type.dtype);
    h = mix(h, n->type.dims, (size_t)n->type.rank * sizeof n->type.dims[0]);
    h = mix(h, &n->loc.line, sizeof n->loc.line);
    h = mix(h, &n->loc.col, sizeof n->loc.col);
    h = mix_str(h, n->note);
    for (int j = 0; j < n->n_attrs; j++) {
      const ir_attr *a = &n->attrs[j];
      h = mix_str(h, a->key);
      h = mix(h, &a->i, sizeof a->i);
      h = mix(h, &a->f, sizeof a->f);
      if (a->kind == IR_ATTR_STR) h = mix_str(h, a->s);
    }
  }
  for (int s = 0; s < g->n_syms; s++) h = mix_str(h, g->syms[s].name);
  return mix(h, g->outputs, (size_t)g->n_outputs * sizeof g->outputs[0]);
}

/* Prints after pass `name` (pipeline position `pos`) as the options ask. Returns -1 when a
 * dump file cannot be written. */
static int dump_after(const ir_graph *g, const pipeline_opts *o, const char *name, int pos, int changed, FILE *err) {
  if (o->print_after_change && !changed) return 0;
  int want = o->print_after ? strcmp(o->print_after, "all") == 0 || in_list(o->print_after, name) : o->print_after_change;
  if (want) {
    pipeline_print_header(name, o->dump);
    ir_print(g, o->dump);
  }
  if (!o->dump_dir) return 0;
  char path[4096];
  snprintf(path, sizeof path, "%s/%02d-after-%s.mir", o->dump_dir, pos, name);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(err, "moec: error: --dump-dir: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  pipeline_print_header(name, f);
  ir_print(g, f);
  if (fclose(f) != 0) {
    fprintf(err, "moec: error: --dump-dir: write failed: %s: %s\n", path, strerror(errno));
    return -1;
  }
  return 0;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

int pipeline_run_table(ir_graph **g, const pass_info *t, int n, const pipeline_opts *o, FILE *err) {
  if (dump_after(*g, o, "lower", 0, 1, err)) return -1;
  double total = 0;
  if (o->pass_timing) fprintf(err, "pass timing:\n  %-14s %10s %8s %8s  %s\n", "pass", "ms", "ops in", "ops out", "IR");
  for (int i = 0; i < n; i++) {
    int on = o->passes ? in_list(o->passes, t[i].name) : t[i].default_on;
    if (!on || in_list(o->disable, t[i].name) || (t[i].train_only && !o->train)) continue;
    int before = (*g)->n_nodes;
    uint64_t h0 = ir_hash(*g);
    double t0 = now_ms();
    if (t[i].run(g, err) != 0) {
      fprintf(err, "moec: error: pass %s failed\n", t[i].name);
      return -1;
    }
    double dt = now_ms() - t0;
    total += dt;
    int changed = ir_hash(*g) != h0;
    if (o->pass_timing)
      fprintf(err, "  %-14s %10.3f %8d %8d  %s\n", t[i].name, dt, before, (*g)->n_nodes, changed ? "changed" : "unchanged");
    if (ir_verify(*g, t[i].name, err) != 0) {
      fprintf(err, "moec: error: pass %s left an invalid IR (the lines above name each offending op and its source)\n",
              t[i].name);
      return -1;
    }
    if (dump_after(*g, o, t[i].name, i + 1, changed, err)) return -1;
  }
  if (o->pass_timing) fprintf(err, "  %-14s %10.3f\n", "total", total);
  return 0;
}

int pipeline_run(ir_graph **g, const pipeline_opts *o, FILE *err) {
  int n;
  const pass_info *t = pass_table(&n);
  return pipeline_run_table(g, t, n, o, err);
}

/* ---- queries about what the passes made ---- */

int pass_param_is_linear_weight(const ir_graph *g, int id) {
  for (int i = id + 1; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    for (int j = 0; j < n->n_in; j++) {
      int v = n->in[j];
      if (v != id && !(g->nodes[v].op == OP_CAST && g->nodes[v].in[0] == id)) continue;
      if ((n->op == OP_LINEAR && j == 1) || n->op == OP_STACK) return 1;
    }
  }
  return 0;
}
