/* rewrite.c -- rebuilding a graph with copies, drops and replacements; use lists. */
#include "rewrite.h"

#include <stdlib.h>
#include <string.h>

int rw_begin(rw_ctx *r, ir_graph *old, const char *pass, FILE *err) {
  memset(r, 0, sizeof *r);
  r->old = old;
  r->pass = pass;
  r->err = err;
  r->g = ir_graph_new(old->model_name);
  r->map = malloc(((size_t)old->n_nodes + 1) * sizeof *r->map);
  if (!r->g || !r->map) {
    fprintf(err, "moec: error: out of memory in pass %s\n", pass);
    ir_graph_free(r->g);
    free(r->map);
    return -1;
  }
  for (int i = 0; i < old->n_nodes; i++) r->map[i] = -1;
  r->g->cfg = old->cfg;
  for (int s = 0; s < old->n_syms; s++) ir_sym_new(r->g, old->syms[s].name, old->syms[s].bound);
  return 0;
}

static int check(rw_ctx *r, int v, const char *what) {
  if (v < 0 && !r->failed) {
    fprintf(r->err, "moec: internal error: pass %s: %s: %s\n", r->pass, what, r->g->err);
    r->failed = 1;
  }
  return v;
}

static int copy_node(rw_ctx *r, int id, const int *in, int n_in, const ir_attr *extra, int n_extra) {
  const ir_node *n = &r->old->nodes[id];
  int stack_in[16], *mapped = n->n_in <= 16 ? stack_in : malloc((size_t)n->n_in * sizeof *mapped);
  ir_attr stack_a[16], *attrs = n->n_attrs + n_extra <= 16 ? stack_a : malloc((size_t)(n->n_attrs + n_extra) * sizeof *attrs);
  if (!mapped || !attrs) {
    fprintf(r->err, "moec: error: out of memory in pass %s\n", r->pass);
    r->failed = 1;
    return -1;
  }
  if (!in) {
    for (int j = 0; j < n->n_in; j++) {
      mapped[j] = r->map[n->in[j]];
      if (mapped[j] < 0 && !r->failed) {
        fprintf(r->err, "moec: internal error: pass %s: %%%d reads %%%d, which the pass dropped\n", r->pass, id, n->in[j]);
        r->failed = 1;
      }
    }
    in = mapped;
    n_in = n->n_in;
  }
  int na = 0;
  for (int j = 0; j < n->n_attrs; j++) {
    int replaced = 0;
    for (int k = 0; k < n_extra; k++) replaced |= strcmp(n->attrs[j].key, extra[k].key) == 0;
    if (!replaced) attrs[na++] = n->attrs[j];
  }
  for (int k = 0; k < n_extra; k++) attrs[na++] = extra[k];
  int v = -1;
  if (!r->failed) {
    v = check(r, ir_add_typed(r->g, n->op, in, n_in, attrs, na, n->type, n->loc), ir_ops[n->op].name);
    if (v >= 0 && n->note) ir_set_note(r->g, v, n->note);
  }
  if (mapped != stack_in) free(mapped);
  if (attrs != stack_a) free(attrs);
  r->map[id] = v;
  return v;
}

int rw_copy(rw_ctx *r, int id) { return copy_node(r, id, NULL, 0, NULL, 0); }
int rw_copy_attrs(rw_ctx *r, int id, const ir_attr *extra, int n_extra) { return copy_node(r, id, NULL, 0, extra, n_extra); }
int rw_copy_operands(rw_ctx *r, int id, const int *in, int n_in) { return copy_node(r, id, in, n_in, NULL, 0); }
int rw_copy_full(rw_ctx *r, int id, const int *in, int n_in, const ir_attr *extra, int n_extra) {
  return copy_node(r, id, in, n_in, extra, n_extra);
}

int rw_emit(rw_ctx *r, ir_op op, const int *in, int n_in, const ir_attr *attrs, int n_attrs, ir_loc loc) {
  if (r->failed) return -1;
  return check(r, ir_add(r->g, op, in, n_in, attrs, n_attrs, loc), ir_ops[op].name);
}

int rw_emit_typed(rw_ctx *r, ir_op op, const int *in, int n_in, const ir_attr *attrs, int n_attrs, ir_type t,
                  ir_loc loc) {
  if (r->failed) return -1;
  return check(r, ir_add_typed(r->g, op, in, n_in, attrs, n_attrs, t, loc), ir_ops[op].name);
}

/* Drops the symbols no node's type names, renumbering the others. */
static void drop_unused_syms(ir_graph *g) {
  if (g->n_syms == 0) return;
  int *renum = malloc((size_t)g->n_syms * sizeof *renum);
  if (!renum) return; /* keeping them is harmless */
  for (int s = 0; s < g->n_syms; s++) renum[s] = -1;
  for (int i = 0; i < g->n_nodes; i++)
    for (int d = 0; d < g->nodes[i].type.rank; d++)
      if (g->nodes[i].type.dims[d] < 0) renum[-g->nodes[i].type.dims[d] - 1] = 0;
  int k = 0;
  for (int s = 0; s < g->n_syms; s++)
    if (renum[s] == 0) {
      g->syms[k] = g->syms[s];
      renum[s] = k++;
    }
  g->n_syms = k;
  for (int i = 0; i < g->n_nodes; i++)
    for (int d = 0; d < g->nodes[i].type.rank; d++)
      if (g->nodes[i].type.dims[d] < 0) g->nodes[i].type.dims[d] = -(int64_t)renum[-g->nodes[i].type.dims[d] - 1] - 1;
  free(renum);
}

int rw_finish(rw_ctx *r, ir_graph **gp) {
  ir_graph *g = r->g;
  for (int i = 0; i < r->old->n_outputs && !r->failed; i++) {
    g->outputs[i] = r->map[r->old->outputs[i]];
    if (g->outputs[i] < 0) {
      fprintf(r->err, "moec: internal error: pass %s dropped output %d (%%%d)\n", r->pass, i, r->old->outputs[i]);
      r->failed = 1;
    }
  }
  g->n_outputs = r->old->n_outputs;
  free(r->map);
  r->map = NULL;
  if (r->failed) {
    ir_graph_free(g);
    return -1;
  }
  drop_unused_syms(g);
  ir_graph_free(r->old);
  *gp = g;
  return 0;
}

int uses_build(const ir_graph *g, ir_uses *u) {
  int n = g->n_nodes, total = 0;
  u->start = calloc((size_t)n + 2, sizeof *u->start);
  u->out = calloc((size_t)n + 1, 1);
  for (int i = 0; i < n; i++) total += g->nodes[i].n_in;
  u->list = malloc(((size_t)total + 1) * sizeof *u->list);
  if (!u->start || !u->out || !u->list) {
    uses_free(u);
    return -1;
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++) u->start[g->nodes[i].in[j] + 1]++;
  for (int v = 0; v < n; v++) u->start[v + 1] += u->start[v];
  int *fill = malloc(((size_t)n + 1) * sizeof *fill);
  if (!fill) {
    uses_free(u);
    return -1;
  }
  memcpy(fill, u->start, (size_t)n * sizeof *fill);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++) u->list[fill[g->nodes[i].in[j]]++] = i;
  free(fill);
  for (int i = 0; i < g->n_outputs; i++)
    if (g->outputs[i] >= 0 && g->outputs[i] < n) u->out[g->outputs[i]] = 1;
  return 0;
}

void uses_free(ir_uses *u) {
  free(u->start);
  free(u->list);
  free(u->out);
  memset(u, 0, sizeof *u);
}

int attrs_equal(const ir_node *a, const ir_node *b) {
  if (a->n_attrs != b->n_attrs) return 0;
  for (int i = 0; i < a->n_attrs; i++) {
    const ir_attr *x = &a->attrs[i], *y = ir_find_attr(b, x->key);
    if (!y || x->kind != y->kind) return 0;
    if (x->kind == IR_ATTR_INT && x->i != y->i) return 0;
    if (x->kind == IR_ATTR_FLOAT && x->f != y->f) return 0;
    if (x->kind == IR_ATTR_STR && strcmp(x->s, y->s) != 0) return 0;
  }
  return 1;
}

const char *name_pattern(const char *a, const char *b, char *buf, size_t len) {
  size_t na = strlen(a), nb = strlen(b), p = 0, s = 0;
  while (p < na && p < nb && a[p] == b[p]) p++;
  while (s < na - p && s < nb - p && a[na - 1 - s] == b[nb - 1 - s]) s++;
  if (p == na && p == nb) snprintf(buf, len, "%s", a);
  else snprintf(buf, len, "%.*s*%s", (int)p, a, a + na - s);
  return buf;
}
