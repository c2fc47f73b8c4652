/* ir.c -- graph construction: arena, interned strings, symbols, attributes, builders. */
#include "ir.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* A bump allocator: everything a graph owns besides the node and symbol arrays. */
typedef struct ir_chunk {
  struct ir_chunk *next;
  size_t used, cap;
  max_align_t data[];
} ir_chunk;

struct ir_arena {
  ir_chunk *head;
};

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n);
  if (!q) {
    fprintf(stderr, "moec: error: out of memory (asked for %zu bytes)\n", n);
    exit(1);
  }
  return q;
}

static void *arena_alloc(struct ir_arena *a, size_t n) {
  n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
  if (!a->head || a->head->used + n > a->head->cap) {
    size_t cap = n > 65536 ? n : 65536;
    ir_chunk *c = xrealloc(NULL, sizeof(ir_chunk) + cap);
    c->next = a->head;
    c->used = 0;
    c->cap = cap;
    a->head = c;
  }
  void *p = (char *)a->head->data + a->head->used;
  a->head->used += n;
  return p;
}

ir_graph *ir_graph_new(const char *model_name) {
  ir_graph *g = xrealloc(NULL, sizeof *g);
  memset(g, 0, sizeof *g);
  g->arena = xrealloc(NULL, sizeof *g->arena);
  g->arena->head = NULL;
  g->model_name = ir_intern(g, model_name ? model_name : "model");
  return g;
}

void ir_graph_free(ir_graph *g) {
  if (!g) return;
  for (ir_chunk *c = g->arena->head, *next; c; c = next) {
    next = c->next;
    free(c);
  }
  free(g->arena);
  free(g->nodes);
  free(g->syms);
  free(g);
}

const char *ir_intern(ir_graph *g, const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *p = arena_alloc(g->arena, n);
  memcpy(p, s, n);
  return p;
}

int64_t ir_sym_new(ir_graph *g, const char *name, int64_t bound) {
  if (g->n_syms == g->cap_syms) {
    g->cap_syms = g->cap_syms ? 2 * g->cap_syms : 64;
    g->syms = xrealloc(g->syms, (size_t)g->cap_syms * sizeof *g->syms);
  }
  g->syms[g->n_syms] = (ir_sym){ir_intern(g, name), bound};
  return -(int64_t)(g->n_syms++) - 1;
}

int64_t ir_dim_bound(const ir_graph *g, int64_t dim) {
  if (dim >= 0) return dim;
  int64_t s = -dim - 1;
  return s < g->n_syms ? g->syms[s].bound : 0;
}

int64_t ir_type_numel_bound(const ir_graph *g, const ir_type *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= ir_dim_bound(g, t->dims[i]);
  return n;
}

int64_t ir_group_size(const ir_graph *g, const char *group) {
  int64_t ep = g->cfg.ep > 1 ? g->cfg.ep : 1, dp = g->cfg.dp > 1 ? g->cfg.dp : 1;
  if (!strcmp(group, "world")) return ep * dp;
  if (!strcmp(group, "ep")) return ep;
  if (!strcmp(group, "dp")) return dp;
  return 0;
}

ir_attr ir_attr_int(const char *key, int64_t v) { return (ir_attr){key, IR_ATTR_INT, v, (double)v, NULL}; }
ir_attr ir_attr_float(const char *key, double v) { return (ir_attr){key, IR_ATTR_FLOAT, (int64_t)v, v, NULL}; }
ir_attr ir_attr_str(const char *key, const char *s) { return (ir_attr){key, IR_ATTR_STR, 0, 0, s}; }

const ir_attr *ir_find_attr(const ir_node *n, const char *key) {
  for (int i = 0; i < n->n_attrs; i++)
    if (strcmp(n->attrs[i].key, key) == 0) return &n->attrs[i];
  return NULL;
}

int64_t ir_get_int(const ir_node *n, const char *key, int64_t dflt) {
  const ir_attr *a = ir_find_attr(n, key);
  return a && a->kind != IR_ATTR_STR ? a->i : dflt;
}

double ir_get_float(const ir_node *n, const char *key, double dflt) {
  const ir_attr *a = ir_find_attr(n, key);
  return a && a->kind != IR_ATTR_STR ? a->f : dflt;
}

const char *ir_get_str(const ir_node *n, const char *key, const char *dflt) {
  const ir_attr *a = ir_find_attr(n, key);
  return a && a->kind == IR_ATTR_STR ? a->s : dflt;
}

static void set_err(ir_graph *g, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->err, sizeof g->err, fmt, ap);
  va_end(ap);
}

/* Appends the node without type inference; the caller sets the type. */
static int append(ir_graph *g, ir_op op, const int *in, int n_in, const ir_attr *attrs,
                  int n_attrs, ir_loc loc) {
  if ((unsigned)op >= OP_COUNT) {
    set_err(g, "unknown op %d", (int)op);
    return -1;
  }
  const ir_op_info *info = &ir_ops[op];
  if (n_in < info->min_in || (info->max_in >= 0 && n_in > info->max_in)) {
    set_err(g, "%s takes %d%s operands, got %d", info->name, info->min_in,
            info->max_in < 0 ? " or more" : info->max_in > info->min_in ? " to max" : "", n_in);
    return -1;
  }
  for (int i = 0; i < n_in; i++) {
    if (in[i] < 0 || in[i] >= g->n_nodes) {
      set_err(g, "%s: operand %d is %%%d, which is not defined before this op", info->name, i, in[i]);
      return -1;
    }
  }
  if (g->n_nodes == g->cap_nodes) {
    g->cap_nodes = g->cap_nodes ? 2 * g->cap_nodes : 256;
    g->nodes = xrealloc(g->nodes, (size_t)g->cap_nodes * sizeof *g->nodes);
  }
  ir_node *n = &g->nodes[g->n_nodes];
  memset(n, 0, sizeof *n);
  n->op = op;
  n->n_in = n_in;
  n->in = arena_alloc(g->arena, (size_t)(n_in ? n_in : 1) * sizeof(int));
  if (n_in) memcpy(n->in, in, (size_t)n_in * sizeof(int));
  n->n_attrs = n_attrs;
  n->attrs = arena_alloc(g->arena, (size_t)(n_attrs ? n_attrs : 1) * sizeof(ir_attr));
  for (int i = 0; i < n_attrs; i++) {
    n->attrs[i] = attrs[i];
    n->attrs[i].key = ir_intern(g, attrs[i].key);
    if (attrs[i].kind == IR_ATTR_STR) n->attrs[i].s = ir_intern(g, attrs[i].s ? attrs[i].s : "");
  }
  n->loc = loc;
  n->loc.file = loc.file ? ir_intern(g, loc.file) : NULL;
  return g->n_nodes++;
}

int ir_add_typed(ir_graph *g, ir_op op, const int *in, int n_in, const ir_attr *attrs,
                 int n_attrs, ir_type type, ir_loc loc) {
  int id = append(g, op, in, n_in, attrs, n_attrs, loc);
  if (id < 0) return -1;
  g->nodes[id].type = type;
  char msg[400], want[96], got[96];
  ir_type inferred;
  if (ir_infer_type(g, &g->nodes[id], &inferred, msg, sizeof msg) != 0) {
    set_err(g, "%s", msg);
    g->n_nodes--;
    return -1;
  }
  if (!ir_type_equal(&inferred, &type)) {
    set_err(g, "%s: given type %s, but its operands make it %s", ir_ops[op].name,
            ir_type_str(g, &type, got, sizeof got), ir_type_str(g, &inferred, want, sizeof want));
    g->n_nodes--;
    return -1;
  }
  return id;
}

int ir_add(ir_graph *g, ir_op op, const int *in, int n_in, const ir_attr *attrs, int n_attrs,
           ir_loc loc) {
  int id = append(g, op, in, n_in, attrs, n_attrs, loc);
  if (id < 0) return -1;
  char msg[400];
  if (ir_infer_type(g, &g->nodes[id], &g->nodes[id].type, msg, sizeof msg) != 0) {
    set_err(g, "%s", msg);
    g->n_nodes--; /* drop it; the arena keeps the bytes until the graph is freed */
    return -1;
  }
  return id;
}

void ir_set_note(ir_graph *g, int id, const char *note) {
  if (id >= 0 && id < g->n_nodes) g->nodes[id].note = ir_intern(g, note);
}

int ir_is_weight(const ir_graph *g, int v) {
  const ir_node *n = &g->nodes[v];
  if (n->op == OP_PARAM) return 1;
  if (n->op == OP_CAST) return g->nodes[n->in[0]].op == OP_PARAM;
  if (n->op != OP_STACK || n->n_in < 1) return 0;
  for (int j = 0; j < n->n_in; j++) {
    const ir_node *c = &g->nodes[n->in[j]];
    if (!(c->op == OP_PARAM || (c->op == OP_CAST && g->nodes[c->in[0]].op == OP_PARAM))) return 0;
  }
  return 1;
}
