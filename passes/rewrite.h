/* rewrite.h -- how passes change the IR: they rebuild the graph. A pass walks the old graph in
 * order and, for each node, copies it (operands renamed to their new ids), drops it, or emits
 * replacement ops in its place; rw_finish swaps the new graph in. Node ids stay dense and in
 * SSA order by construction, and every emitted op goes through the shape rules (ir_add).
 *
 * Also: use lists (who reads a value), for the pattern matchers. */
#ifndef MOEC_REWRITE_H
#define MOEC_REWRITE_H

#include <stdio.h>

#include "ir.h"

typedef struct {
  ir_graph *old; /* the graph being rewritten (read only) */
  ir_graph *g;   /* the graph being built */
  int *map;      /* (old->n_nodes) new id of each old value, -1 while not (or never) copied */
  const char *pass;
  FILE *err;
  int failed;
} rw_ctx;

/* Starts an empty copy of old (name, config, symbols). 0, or -1 when out of memory. */
int rw_begin(rw_ctx *r, ir_graph *old, const char *pass, FILE *err);
/* Copies old node id with its operands mapped; records and returns the new id. */
int rw_copy(rw_ctx *r, int id);
/* Copies old node id with extra attributes appended (or replacing ones of the same key). */
int rw_copy_attrs(rw_ctx *r, int id, const ir_attr *extra, int n_extra);
/* Copies old node id with new operands (new ids) instead of its mapped ones. */
int rw_copy_operands(rw_ctx *r, int id, const int *in, int n_in);
/* Both: new operands (or NULL for the mapped ones) and extra attributes. */
int rw_copy_full(rw_ctx *r, int id, const int *in, int n_in, const ir_attr *extra, int n_extra);
/* Emits a new op (operands are new ids); the result type comes from the shape rule. -1 and a
 * message naming the pass on failure (a bug in the pass). */
int rw_emit(rw_ctx *r, ir_op op, const int *in, int n_in, const ir_attr *attrs, int n_attrs, ir_loc loc);
int rw_emit_typed(rw_ctx *r, ir_op op, const int *in, int n_in, const ir_attr *attrs, int n_attrs, ir_type t,
                  ir_loc loc);
/* Maps the outputs, drops symbols no type uses any more, frees the old graph and stores the new
 * one in *gp. Returns 0, or -1 (and frees the new graph) when any step failed. */
int rw_finish(rw_ctx *r, ir_graph **gp);

/* Use lists: the users of value v are list[start[v] .. start[v+1]), in order (a user reading
 * v twice appears twice). out[v] = 1 when v is a graph output. */
typedef struct {
  int *start, *list;
  char *out;
} ir_uses;
int uses_build(const ir_graph *g, ir_uses *u); /* 0, or -1 when out of memory */
void uses_free(ir_uses *u);
static inline int uses_count(const ir_uses *u, int v) { return u->start[v + 1] - u->start[v]; }

/* Folds each add one of whose terms comes from an op that takes(op) says can absorb the other
 * (read by the add alone, no graph output, of the add's type, as the other term must be): that
 * op takes the other term as a last operand and attribute=1, with a note naming pass and how
 * ("its result rounded first: the same bits"), in its own place where the other term exists by
 * then, else the add's (passes/fold_add.c; fuse-residual, fuse-gemm-add). 0, or -1 after an
 * error message. */
typedef int (*fold_taker)(const ir_node *op);
int fold_adds(ir_graph **gp, const char *pass, fold_taker takes, const char *attribute, const char *how, FILE *err);

/* Two attribute lists hold the same keys and values (order ignored). */
int attrs_equal(const ir_node *a, const ir_node *b);

/* "prefix*suffix" of two names that differ in one place (e.g. expert weights
 * model.layers.0.mlp.experts.*.w1.weight), into buf. */
const char *name_pattern(const char *a, const char *b, char *buf, size_t len);

#endif
