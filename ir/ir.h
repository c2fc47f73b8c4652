/* ir.h -- moec's graph IR: SSA values with a dtype and a shape, one result per node.
 *
 * A graph is a list of nodes in topological order; node i defines value %i. Operands name
 * earlier values. Every node carries the source location that produced it. Ops come from
 * the one op table, ops.def. Builders check shapes through the op's shape rule; the
 * verifier re-checks types, shapes, SSA order and use-def after every pass.
 */
#ifndef MOEC_IR_H
#define MOEC_IR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"

typedef enum {
#define OP(id, name, min_in, max_in, cg) OP_##id,
#include "ops.def"
#undef OP
  OP_COUNT
} ir_op;

typedef enum { CG_NONE, CG_ELEMENTWISE, CG_KERNEL, CG_GEMM, CG_ATTENTION, CG_COLLECTIVE } ir_cg_class;

typedef struct {
  const char *name;
  int min_in, max_in; /* max_in < 0: variadic */
  ir_cg_class cg;
} ir_op_info;

extern const ir_op_info ir_ops[OP_COUNT];
ir_op ir_op_by_name(const char *name); /* OP_COUNT when unknown */
/* Ops that act by effect (the optimizer update): dce keeps them though nothing reads them. */
static inline int ir_op_has_effect(ir_op op) { return op == OP_ADAMW || op == OP_ALL_GATHER; }

typedef enum { DT_F32, DT_BF16, DT_I32, DT_E4M3, DT_E8M0, DT_COUNT } ir_dtype;
const char *ir_dtype_name(ir_dtype t);

/* A dimension >= 0 is a static size. A negative dimension -(s+1) names symbol s of the graph:
 * a size known only at run time (per-expert routed rows), with a static upper bound. */
#define IR_MAX_RANK 4
typedef struct {
  ir_dtype dtype;
  int rank; /* 0 = scalar */
  int64_t dims[IR_MAX_RANK];
} ir_type;

typedef struct {
  const char *file; /* interned in the graph, or a static string */
  int line, col;
} ir_loc;

typedef enum { IR_ATTR_INT, IR_ATTR_FLOAT, IR_ATTR_STR } ir_attr_kind;
typedef struct {
  const char *key; /* interned */
  ir_attr_kind kind;
  int64_t i;
  double f;
  const char *s; /* interned */
} ir_attr;

typedef struct {
  ir_op op;
  int n_in;
  int *in; /* (n_in) operand value ids, each < this node's id */
  int n_attrs;
  ir_attr *attrs; /* (n_attrs) */
  ir_type type;
  ir_loc loc;
  const char *note; /* pass remark printed after the op line as a comment, or NULL */
} ir_node;

typedef struct {
  const char *name;
  int64_t bound; /* upper bound, for memory planning */
} ir_sym;

typedef struct ir_graph {
  const char *model_name;
  ir_node *nodes;
  int n_nodes, cap_nodes;
  ir_sym *syms;
  int n_syms, cap_syms;
  int n_outputs;
  int outputs[8]; /* value ids the step returns; outputs[0] is the loss */
  moec_config cfg; /* sizes and the training section the graph was lowered from */
  struct ir_arena *arena; /* owns node operands, attrs and strings */
  char err[512];         /* last builder error */
} ir_graph;

ir_graph *ir_graph_new(const char *model_name);
void ir_graph_free(ir_graph *g);
const char *ir_intern(ir_graph *g, const char *s);

/* Symbols: returns the negative dimension code for a new run-time size. */
int64_t ir_sym_new(ir_graph *g, const char *name, int64_t bound);
int64_t ir_dim_bound(const ir_graph *g, int64_t dim); /* static size or the symbol's bound */

/* Attribute constructors and lookups. */
ir_attr ir_attr_int(const char *key, int64_t v);
ir_attr ir_attr_float(const char *key, double v);
ir_attr ir_attr_str(const char *key, const char *s); /* key and s are interned by ir_add */
const ir_attr *ir_find_attr(const ir_node *n, const char *key);
int64_t ir_get_int(const ir_node *n, const char *key, int64_t dflt);
double ir_get_float(const ir_node *n, const char *key, double dflt);
const char *ir_get_str(const ir_node *n, const char *key, const char *dflt);

/* Builders. ir_add infers the result type with the op's shape rule; ir_add_typed takes it
 * (leaves: input, param; and casts). Both return the new value id, or -1 with g->err set
 * to a message that names the op and the offending operand. */
int ir_add(ir_graph *g, ir_op op, const int *in, int n_in, const ir_attr *attrs, int n_attrs,
           ir_loc loc);
int ir_add_typed(ir_graph *g, ir_op op, const int *in, int n_in, const ir_attr *attrs,
                 int n_attrs, ir_type type, ir_loc loc);
void ir_set_note(ir_graph *g, int id, const char *note);

/* Shape rule of n's op applied to its operands: 0 and *out, or -1 and a message in err. */
int ir_infer_type(const ir_graph *g, const ir_node *n, ir_type *out, char *err, size_t errlen);

/* Checks SSA order, arity, operand ids, dtypes and shapes (against the shape rule) of every
 * node. Prints "error: IR invalid after pass NAME: %ID = op(...) loc(...): message" lines
 * to err and returns the number of problems (0 = valid). */
int ir_verify(const ir_graph *g, const char *after_pass, FILE *err);

/* Text dump, one op per line:
 *   %12 = linear(%10, %11) {k=1} : bf16[256,128] loc("tiny.moe":21:9)  */
void ir_print(const ir_graph *g, FILE *out);
/* Formats a type as "bf16[n0_3,128]" into buf; returns buf. */
const char *ir_type_str(const ir_graph *g, const ir_type *t, char *buf, size_t len);
int ir_type_equal(const ir_type *a, const ir_type *b);
/* Graphviz DOT export of the same graph. */
void ir_print_dot(const ir_graph *g, FILE *out);

/* Number of elements, using symbol bounds for run-time sizes. */
int64_t ir_type_numel_bound(const ir_graph *g, const ir_type *t);

/* The size of a collective's group ("world" = ep x dp, "ep", "dp") in g's world; 0 for another
 * name. A ZeRO shard of n values over that group holds ceil(n / size) (ir_shard_len). */
int64_t ir_group_size(const ir_graph *g, const char *group);
static inline int64_t ir_shard_len(int64_t n, int64_t size) { return size > 0 ? (n + size - 1) / size : n; }
/* The values of that tensor in shard `rank` (its first is rank x ir_shard_len): the shard's
 * length, less past n (0 for a shard wholly past it). */
static inline int64_t ir_shard_count(int64_t n, int64_t size, int64_t rank) {
  const int64_t c = ir_shard_len(n, size), left = n - rank * c;
  return left < 0 ? 0 : left < c ? left : c;
}

/* A weight: a parameter, its cast (the bf16 compute copy), or a stack of parameter casts (the
 * expert weights of a layer). Values the GPU keeps between steps, at hand the whole step. */
int ir_is_weight(const ir_graph *g, int v);

/* Columns of grouped_mlp_bwd's f32 result: d gate_up (2F) | act (F) | d p (1), padded with
 * zeros to a multiple of 8, so that every row of it starts 32-byte aligned (the GPU reads its
 * column windows in place, 16 bytes at a time). */
static inline int64_t ir_mlp_bwd_width(int64_t F) { return (3 * F + 1 + 7) / 8 * 8; }

#endif
