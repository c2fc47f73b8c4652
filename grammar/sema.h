/* sema.h -- semantic analysis of a parsed .moe program: name resolution, types, size
 * arithmetic and checks, the train section, and --set overrides. Its output is the
 * annotated AST (see ast.h) plus a moec_config, which passes/lower.c turns into IR.
 */
#ifndef MOEC_SEMA_H
#define MOEC_SEMA_H

#include "ast.h"
#include "config.h"

#define SEMA_MAX_DIM ((int64_t)1 << 30)   /* largest size of one dimension */
#define SEMA_MAX_NUMEL ((int64_t)1 << 50) /* largest element count of one tensor */

/* One --set NAME=VALUE, parsed by the front end. */
typedef struct sema_set {
  const char *name;
  diag_file *file; /* plain source "--set NAME=VALUE", for messages */
  ast_expr *expr;  /* the value as an expression, or NULL when it did not parse */
  int used;
} sema_set;

/* What lowering needs besides the annotated tree. */
typedef struct sema_program {
  const ast_stmt *model; /* model NAME { ... } */
  const char *model_name;
  int n_slots;   /* tensor variables (see ast_expr.slot) */
  int loss_slot; /* the variable 'loss' */
  moec_config cfg;
} sema_program;

/* Checks the items of a program (includes already spliced in). Returns the number of
 * errors reported; fills *out when there are none. */
int sema_check(diag_engine *d, ast_arena *arena, ast_block *items, sema_set *sets, int n_sets,
               sema_program *out);

/* passes/lower.c: the naive forward graph of a checked program, verified; NULL after an
 * internal error printed to diag. */
struct ir_graph;
struct ir_graph *lower_program(const sema_program *p, FILE *diag);

/* The training values --set can name, besides the model's own sizes. */
extern const char *const sema_train_set_names[];
extern const int sema_n_train_set_names;

/* ---- internal: shared by sema.c and sema_train.c ---- */

typedef struct sema_var sema_var;

/* A value during checking. */
typedef struct sv {
  ast_type ty;
  int64_t i;     /* INT, BOOL; TENSOR: width; ROUTER: experts */
  double f;      /* FLOAT */
  const char *s; /* STR, ENUM */
  int rows;      /* TENSOR: 0 = all T tokens, 1 = the rows routed to one expert */
  int64_t k;     /* ROUTER: top_k */
  int rank;      /* PARAM, TYPE */
  int64_t dims[2];
  int n_tup;     /* TUPLE of numbers */
  double tup[4];
  const sema_var *origin; /* the named constant the value (or a tensor's width) came from */
  diag_span span;         /* where it was written */
} sv;

struct sema_var {
  const char *name;
  diag_span def; /* the name at its first definition */
  int is_const;
  sv val;
  int slot;
  ast_expr *def_expr; /* tensor: the expression last assigned */
  int index;          /* position in the scope stack */
  int from_set;       /* its value came from --set */
  diag_span set_span;
};

typedef struct sema_gemm {
  diag_span at;
  const char *op;   /* "linear: the output width" */
  int64_t width;
  const sema_var *origin;
} sema_gemm;

typedef struct sema sema;
struct sema {
  diag_engine *d;
  ast_arena *arena;
  sema_var **vars; /* the scope stack; the variables live in the arena */
  int n_vars, cap_vars;
  int n_slots;
  int in_repeat, in_experts, experts_floor;
  sema_set *sets;
  int n_sets;
  const char **const_names; /* every constant defined, for --set suggestions */
  int n_const_names, cap_const_names;
  sema_gemm *gemms;
  int n_gemms, cap_gemms;
  moec_config cfg;
  int have_embed, have_attn, have_router, have_router_done, have_norm, have_ffn;
  const sema_var *experts_origin; /* where the first router's expert count came from */
  diag_span experts_span;
  int64_t model_seq; /* the model's 'seq', or 0 */
  struct name_ctx *nc;  /* parameter names taken in the current scope */
  ast_expr *assign_rhs; /* the expression an assignment is evaluating, and its target */
  const char *assign_name;
  ast_expr *exp_lin[8]; /* implicit-weight linears of the current experts block */
  int n_exp_lin;
  diag_span model_at;
};

sv sema_eval(sema *S, ast_expr *e);
sema_var *sema_lookup(sema *S, const char *name);
sema_set *sema_find_set(sema *S, const char *name);
void sema_note_origin(sema *S, const sema_var *v);
/* Checks the train section (NULL: defaults) and the model/train cross conditions. */
void sema_train(sema *S, const ast_stmt *train);

#endif
