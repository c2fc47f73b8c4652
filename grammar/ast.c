/* ast.c -- the syntax tree's arena and constructors. */
#include "ast.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ast_chunk {
  struct ast_chunk *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
} ast_chunk;

struct ast_arena {
  ast_chunk *head;
};

ast_arena *ast_arena_new(void) {
  ast_arena *a = calloc(1, sizeof *a);
  if (!a) {
    fputs("moec: error: out of memory\n", stderr);
    exit(1);
  }
  return a;
}

void ast_arena_free(ast_arena *a) {
  if (!a) return;
  for (ast_chunk *c = a->head, *next; c; c = next) {
    next = c->next;
    free(c);
  }
  free(a);
}

void *ast_alloc(ast_arena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (!a->head || a->head->used + n > a->head->cap) {
    size_t cap = n > 65536 ? n : 65536;
    ast_chunk *c = malloc(sizeof(ast_chunk) + cap);
    if (!c) {
      fputs("moec: error: out of memory\n", stderr);
      exit(1);
    }
    c->next = a->head;
    c->used = 0;
    c->cap = cap;
    a->head = c;
  }
  void *p = a->head->data + a->head->used;
  a->head->used += n;
  memset(p, 0, n);
  return p;
}

char *ast_strndup(ast_arena *a, const char *s, size_t n) {
  char *p = ast_alloc(a, n + 1);
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

ast_expr *ast_expr_new(ast_arena *a, ast_expr_kind kind, diag_span span) {
  ast_expr *e = ast_alloc(a, sizeof *e);
  e->kind = kind;
  e->span = span;
  e->slot = -1;
  return e;
}

ast_stmt *ast_stmt_new(ast_arena *a, ast_stmt_kind kind, diag_span span) {
  ast_stmt *s = ast_alloc(a, sizeof *s);
  s->kind = kind;
  s->span = span;
  s->slot = -1;
  return s;
}

void ast_block_push(ast_arena *a, ast_block *b, ast_stmt *s) {
  if (b->n == b->cap) {
    int cap = b->cap ? 2 * b->cap : 8;
    ast_stmt **v = ast_alloc(a, (size_t)cap * sizeof *v);
    if (b->n) memcpy(v, b->v, (size_t)b->n * sizeof *v);
    b->v = v;
    b->cap = cap;
  }
  b->v[b->n++] = s;
}

void ast_arg_push(ast_arena *a, ast_expr *e, const char *name, diag_span name_span, ast_expr *value) {
  /* capacity doubles at powers of two */
  int n = e->n_args;
  if (n == 0 || (n & (n - 1)) == 0) {
    ast_arg *v = ast_alloc(a, (size_t)(n ? 2 * n : 1) * sizeof *v);
    if (n) memcpy(v, e->args, (size_t)n * sizeof *v);
    e->args = v;
  }
  e->args[n] = (ast_arg){name, name_span, value};
  e->n_args = n + 1;
  if (value && value->bad) e->bad = 1;
}

int ast_depth(ast_expr *e) {
  int d = 0;
  if (e->a && e->a->depth > d) d = e->a->depth;
  if (e->b && e->b->depth > d) d = e->b->depth;
  for (int i = 0; i < e->n_args; i++)
    if (e->args[i].value && e->args[i].value->depth > d) d = e->args[i].value->depth;
  e->depth = d + 1;
  if ((e->a && e->a->bad) || (e->b && e->b->bad)) e->bad = 1;
  return e->depth;
}

const char *ast_type_name(ast_type t) {
  switch (t) {
  case TY_ERROR: return "an invalid value";
  case TY_INT: return "an integer";
  case TY_FLOAT: return "a float";
  case TY_BOOL: return "a boolean";
  case TY_STR: return "a string";
  case TY_TUPLE: return "a tuple";
  case TY_RECORD: return "a record";
  case TY_ENUM: return "a name";
  case TY_INIT: return "an initialiser";
  case TY_TYPE: return "a type";
  case TY_TOKENS: return "the token ids";
  case TY_LABELS: return "the labels";
  case TY_TENSOR: return "a tensor";
  case TY_ROUTER: return "a router";
  case TY_LOSS: return "a loss";
  case TY_PARAM: return "a parameter";
  }
  return "a value";
}

const char *ast_fmt_float(double v, char *buf) {
  snprintf(buf, 32, "%.15g", v);
  if (!strpbrk(buf, ".eEni")) strcat(buf, ".0");
  return buf;
}
