/* ast.h -- the syntax tree of a .moe file, allocated in one arena per load.
 *
 * The parser builds it; sema (grammar/sema.c) resolves names, evaluates sizes and fills
 * the annotation fields marked "sema"; lowering (passes/lower.c) reads those to build the IR.
 */
#ifndef MOEC_AST_H
#define MOEC_AST_H

#include <stdint.h>

#include "diag.h"

#define AST_MAX_DEPTH 256 /* deepest expression tree; deeper is an error, not a crash */

typedef struct ast_arena ast_arena;
ast_arena *ast_arena_new(void);
void ast_arena_free(ast_arena *a);
void *ast_alloc(ast_arena *a, size_t n); /* zeroed */
char *ast_strndup(ast_arena *a, const char *s, size_t n);

typedef enum {
  EX_INT,    /* i */
  EX_FLOAT,  /* f */
  EX_STR,    /* s */
  EX_BOOL,   /* i */
  EX_NAME,   /* s */
  EX_BIN,    /* a op b, op in + - * / % */
  EX_NEG,    /* -a */
  EX_CALL,   /* s(args) [block] */
  EX_TYPE,   /* s[args]: a parameter type such as f32[hidden, ffn] */
  EX_TUPLE,  /* (args) */
  EX_RECORD, /* { name = value, ... } as args */
} ast_expr_kind;

/* Value kinds that sema gives expressions. */
typedef enum {
  TY_ERROR, /* already reported: stay quiet */
  TY_INT, TY_FLOAT, TY_BOOL, TY_STR, TY_TUPLE, TY_RECORD, TY_ENUM, TY_INIT, TY_TYPE,
  TY_TOKENS, TY_LABELS, TY_TENSOR, TY_ROUTER, TY_LOSS, TY_PARAM,
} ast_type;

/* Built-in functions, as sema resolves calls. */
typedef enum {
  BI_NONE, BI_EMBEDDING, BI_RMSNORM, BI_LINEAR, BI_ATTENTION, BI_ROUTER, BI_EXPERTS, BI_SILU,
  BI_CROSS_ENTROPY, BI_NEXT, BI_PARAM, BI_NORMAL, BI_ADAMW, BI_MXFP8, BI_COUNT
} ast_builtin;

typedef enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS } ast_init;

typedef struct ast_expr ast_expr;
typedef struct ast_block ast_block;

typedef struct {
  const char *name; /* keyword argument, or NULL */
  diag_span name_span;
  ast_expr *value;
} ast_arg;

struct ast_expr {
  ast_expr_kind kind;
  diag_span span;
  int depth; /* height of the tree below */
  int bad;   /* a literal or subtree already reported as wrong */
  int64_t i;
  double f;
  const char *s;
  char op;
  ast_expr *a, *b;
  diag_span name_span; /* CALL, TYPE: the name */
  ast_arg *args;
  int n_args;
  ast_block *block; /* CALL with a trailing { ... } */

  /* sema */
  ast_type ty;
  int slot;          /* NAME of a tensor variable; EXPERTS: the slot of the routed input */
  ast_builtin bi;    /* CALL */
  int64_t n[4];      /* CALL: integer arguments (see sema.c: per builtin) */
  double x[3];       /* CALL: float arguments */
  ast_expr *opnd[3]; /* CALL: tensor operands, in order */
  ast_init init;     /* CALL that creates a parameter: its initialiser */
  double std;
  const char *pname; /* parameter name, relative to the scope prefix (see lower.c) */
  int pabs;          /* pname is a whole name (lm_head.weight) */
  int bias;          /* linear with a bias */
  int layer_local;   /* pname sits under model.layers.{i} */
};

typedef enum {
  ST_ASSIGN,  /* name = value */
  ST_EXPR,    /* value (the result of an experts block) */
  ST_REPEAT,  /* repeat value body */
  ST_INCLUDE, /* include "name" */
  ST_MODEL,   /* model name body */
  ST_TRAIN,   /* train body */
} ast_stmt_kind;

typedef struct ast_stmt {
  ast_stmt_kind kind;
  diag_span span;
  const char *name; /* ASSIGN target, MODEL name, INCLUDE path */
  diag_span name_span;
  ast_expr *value;
  ast_block *body;
  int slot;   /* sema: ASSIGN of a tensor variable */
  int is_const; /* sema: ASSIGN of a size or hyperparameter */
} ast_stmt;

struct ast_block {
  ast_stmt **v;
  int n, cap;
  diag_span open, close;
};

ast_expr *ast_expr_new(ast_arena *a, ast_expr_kind kind, diag_span span);
ast_stmt *ast_stmt_new(ast_arena *a, ast_stmt_kind kind, diag_span span);
void ast_block_push(ast_arena *a, ast_block *b, ast_stmt *s);
/* Appends an argument to a call, tuple, type or record. */
void ast_arg_push(ast_arena *a, ast_expr *e, const char *name, diag_span name_span, ast_expr *value);
/* Sets e->depth from its children; returns it. */
int ast_depth(ast_expr *e);

const char *ast_type_name(ast_type t);
/* A float as a user would write it: 2.0, 0.001, 1e+30 (buf of at least 32 bytes). */
const char *ast_fmt_float(double v, char *buf); /* "an integer", "a string", ... */

#endif
