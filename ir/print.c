/* print.c -- the IR's text form (one op per line, MLIR-like, with locations) and a
 * Graphviz DOT export; and the verifier that runs after every pass. */
#include <inttypes.h>
#include <string.h>

#include "ir.h"

const char *ir_type_str(const ir_graph *g, const ir_type *t, char *buf, size_t len) {
  size_t k = (size_t)snprintf(buf, len, "%s[", ir_dtype_name(t->dtype));
  for (int i = 0; i < t->rank && k < len; i++) {
    int64_t d = t->dims[i];
    const char *sep = i ? "," : "";
    if (d >= 0)
      k += (size_t)snprintf(buf + k, len - k, "%s%" PRId64, sep, d);
    else if (-d - 1 < g->n_syms)
      k += (size_t)snprintf(buf + k, len - k, "%s%s", sep, g->syms[-d - 1].name);
    else
      k += (size_t)snprintf(buf + k, len - k, "%s?", sep);
  }
  if (k < len) snprintf(buf + k, len - k, "]");
  return buf;
}

static void print_string(const char *s, FILE *out) {
  fputc('"', out);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', out);
    fputc(*s, out);
  }
  fputc('"', out);
}

static void print_node(const ir_graph *g, int id, FILE *out) {
  const ir_node *n = &g->nodes[id];
  char tb[128];
  fprintf(out, "%%%d = %s(", id, ir_ops[n->op].name);
  for (int i = 0; i < n->n_in; i++) fprintf(out, "%s%%%d", i ? ", " : "", n->in[i]);
  fputc(')', out);
  if (n->n_attrs) {
    fputs(" {", out);
    for (int i = 0; i < n->n_attrs; i++) {
      const ir_attr *a = &n->attrs[i];
      fprintf(out, "%s%s=", i ? ", " : "", a->key);
      if (a->kind == IR_ATTR_INT) fprintf(out, "%" PRId64, a->i);
      else if (a->kind == IR_ATTR_FLOAT) fprintf(out, "%.9g", a->f);
      else print_string(a->s, out);
    }
    fputc('}', out);
  }
  fprintf(out, " : %s loc(", ir_type_str(g, &n->type, tb, sizeof tb));
  print_string(n->loc.file ? n->loc.file : "?", out);
  fprintf(out, ":%d:%d)", n->loc.line, n->loc.col);
}

void ir_print(const ir_graph *g, FILE *out) {
  fprintf(out, "graph @%s {\n", g->model_name);
  for (int s = 0; s < g->n_syms; s++)
    fprintf(out, "  // %s: rows routed at run time, at most %" PRId64 "\n", g->syms[s].name, g->syms[s].bound);
  for (int i = 0; i < g->n_nodes; i++) {
    fputs("  ", out);
    print_node(g, i, out);
    fputc('\n', out);
    if (g->nodes[i].note) fprintf(out, "    // %s\n", g->nodes[i].note);
  }
  fputs("  return", out);
  for (int i = 0; i < g->n_outputs; i++) fprintf(out, "%s %%%d", i ? "," : "", g->outputs[i]);
  fputs("\n}\n", out);
}

void ir_print_dot(const ir_graph *g, FILE *out) {
  char tb[128];
  fprintf(out, "digraph \"%s\" {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n",
          g->model_name);
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    const char *style = n->op == OP_PARAM ? ", style=filled, fillcolor=\"#e8eef7\""
                        : n->op == OP_INPUT ? ", style=filled, fillcolor=\"#e7f4e4\""
                                            : "";
    const char *pname = ir_get_str(n, "name", NULL);
    fprintf(out, "  n%d [label=\"%%%d %s%s%s\\n%s\\n%s:%d\"%s];\n", i, i, ir_ops[n->op].name,
            pname ? " " : "", pname ? pname : "", ir_type_str(g, &n->type, tb, sizeof tb),
            n->loc.file ? n->loc.file : "?", n->loc.line, style);
    for (int j = 0; j < n->n_in; j++) fprintf(out, "  n%d -> n%d;\n", n->in[j], i);
  }
  for (int i = 0; i < g->n_outputs; i++)
    fprintf(out, "  out%d [shape=oval, label=\"%s\"];\n  n%d -> out%d;\n", i, i ? "output" : "loss",
            g->outputs[i], i);
  fputs("}\n", out);
}

static int report(const ir_graph *g, int id, const char *pass, const char *msg, FILE *err) {
  fprintf(err, "error: IR invalid after pass %s: ", pass);
  if (id >= 0) {
    print_node(g, id, err);
    fputs(": ", err);
  }
  fprintf(err, "%s\n", msg);
  return 1;
}

int ir_verify(const ir_graph *g, const char *after_pass, FILE *err) {
  int problems = 0;
  char msg[512];
  for (int id = 0; id < g->n_nodes; id++) {
    const ir_node *n = &g->nodes[id];
    if ((unsigned)n->op >= OP_COUNT) {
      snprintf(msg, sizeof msg, "op code %d is not in the op table", (int)n->op);
      problems += report(g, -1, after_pass, msg, err);
      continue;
    }
    const ir_op_info *info = &ir_ops[n->op];
    if (n->n_in < info->min_in || (info->max_in >= 0 && n->n_in > info->max_in)) {
      snprintf(msg, sizeof msg, "wrong number of operands (%d)", n->n_in);
      problems += report(g, id, after_pass, msg, err);
      continue;
    }
    int bad_operand = 0;
    for (int i = 0; i < n->n_in; i++)
      if (n->in[i] < 0 || n->in[i] >= id) {
        snprintf(msg, sizeof msg, "operand %d (%%%d) is not defined before its use (SSA order)", i, n->in[i]);
        problems += report(g, id, after_pass, msg, err);
        bad_operand = 1;
      }
    if (bad_operand) continue;
    if (!n->loc.file || n->loc.line <= 0) problems += report(g, id, after_pass, "has no source location", err);
    ir_type t;
    if (ir_infer_type(g, n, &t, msg, sizeof msg) != 0) {
      problems += report(g, id, after_pass, msg, err);
    } else if (!ir_type_equal(&t, &n->type)) {
      char tb[128];
      snprintf(msg, sizeof msg, "result type should be %s", ir_type_str(g, &t, tb, sizeof tb));
      problems += report(g, id, after_pass, msg, err);
    }
  }
  if (g->n_outputs < 1) problems += report(g, -1, after_pass, "the graph returns nothing (no loss)", err);
  for (int i = 0; i < g->n_outputs; i++)
    if (g->outputs[i] < 0 || g->outputs[i] >= g->n_nodes) {
      snprintf(msg, sizeof msg, "output %d names %%%d, which does not exist", i, g->outputs[i]);
      problems += report(g, -1, after_pass, msg, err);
    }
  if (g->n_outputs >= 1 && g->outputs[0] >= 0 && g->outputs[0] < g->n_nodes) {
    const ir_type *lt = &g->nodes[g->outputs[0]].type;
    if (lt->rank != 0 || lt->dtype != DT_F32) problems += report(g, g->outputs[0], after_pass, "the loss must be an f32 scalar", err);
  }
  return problems;
}
