/* sema.c -- semantic analysis of the model: scopes and names, constant arithmetic, the
 * built-in layers with their argument and size checks, parameter naming (Hugging Face
 * Mixtral names where the model has Mixtral's shape), and --set on model sizes.
 *
 * The model body is checked once, statement by statement, tracking each value's kind and,
 * for tensors, the row set (all T tokens, or the rows routed to one expert) and the width.
 * A repeat body is checked once; variables it carries across iterations must keep their
 * shape. Results are written into the AST (see ast.h, "sema"), for passes/lower.c:
 *   EMBEDDING n = {vocab, dim}            RMSNORM   n = {width}, x = {eps}
 *   LINEAR    n = {in, out, weight slot or -1}, bias
 *   ATTENTION n = {heads, kv_heads, head_dim, width}, x = {rope_theta}
 *   ROUTER    n = {experts, top_k, width}, x = {aux_loss, z_loss}
 *   EXPERTS   n = {experts}, slot = the routed input's slot, opnd = {x, router}
 *   PARAM     n = {rank, d0, d1}, slot = its variable's slot
 * and opnd[] holds each call's tensor operands in order.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sema.h"

/* ---- small helpers ---- */

static void *grow(void *p, int *cap, int n, size_t elem) {
  if (n < *cap) return p;
  *cap = *cap ? 2 * *cap : 16;
  void *q = realloc(p, (size_t)*cap * elem);
  if (!q) {
    fputs("moec: error: out of memory\n", stderr);
    exit(1);
  }
  return q;
}

static sv sv_err(void) {
  sv v;
  memset(&v, 0, sizeof v);
  v.ty = TY_ERROR;
  return v;
}

static sv sv_of(ast_type ty, diag_span at) {
  sv v;
  memset(&v, 0, sizeof v);
  v.ty = ty;
  v.span = at;
  return v;
}

static int is_const_ty(ast_type t) { return t == TY_INT || t == TY_FLOAT || t == TY_BOOL || t == TY_STR || t == TY_TUPLE; }

static const char *shape_str(const sv *v, char *buf, size_t n) {
  snprintf(buf, n, "[%s, %" PRId64 "]", v->rows ? "n_e" : "T", v->i);
  return buf;
}

/* ---- scopes ---- */

sema_var *sema_lookup(sema *S, const char *name) {
  for (int i = S->n_vars - 1; i >= 0; i--)
    if (strcmp(S->vars[i]->name, name) == 0) return S->vars[i];
  return NULL;
}

sema_set *sema_find_set(sema *S, const char *name) {
  sema_set *found = NULL;
  for (int i = 0; i < S->n_sets; i++)
    if (strcmp(S->sets[i].name, name) == 0) {
      S->sets[i].used = 1;
      found = &S->sets[i]; /* the last one wins */
    }
  return found;
}

void sema_note_origin(sema *S, const sema_var *v) {
  if (!v) return;
  if (v->from_set) diag_note(S->d, v->set_span, "'%s' set here", v->name);
  else diag_note(S->d, v->def, "'%s' defined here", v->name);
}

static sema_var *define(sema *S, const char *name, diag_span def, sv val, int is_const) {
  S->vars = grow(S->vars, &S->cap_vars, S->n_vars, sizeof *S->vars);
  sema_var *v = ast_alloc(S->arena, sizeof *v); /* stable: notes may point at it later */
  v->index = S->n_vars;
  S->vars[S->n_vars++] = v;
  v->name = name;
  v->def = def;
  v->val = val;
  v->is_const = is_const;
  v->slot = is_const ? -1 : S->n_slots++;
  if (is_const) {
    S->const_names = grow(S->const_names, &S->cap_const_names, S->n_const_names, sizeof *S->const_names);
    S->const_names[S->n_const_names++] = name;
  }
  return v;
}

static void unknown_name(sema *S, ast_expr *e) {
  const char **cands = malloc(((size_t)S->n_vars + 1) * sizeof *cands);
  int n = 0;
  for (int i = 0; i < S->n_vars; i++) cands[n++] = S->vars[i]->name;
  cands[n++] = "tokens";
  const char *best = diag_suggest(e->s, cands, n);
  free(cands);
  if (best) {
    diag_error(S->d, e->span, "unknown name '%s'; did you mean '%s'?", e->s, best);
    sema_var *v = sema_lookup(S, best);
    if (v) sema_note_origin(S, v);
  } else {
    diag_error(S->d, e->span, "unknown name '%s'", e->s);
  }
}

/* ---- parameter names ---- */

enum { R_EMBED = 1, R_NORM1 = 2, R_NORM2 = 4, R_ATTN = 8, R_ROUTER = 16, R_EXPERTS = 32, R_LMHEAD = 64 };

struct name_ctx {
  int kind; /* 0 top, 1 layer, 2 expert */
  int roles;
  const char **used;
  int n_used, cap_used;
  int counter;
};
typedef struct name_ctx name_ctx;



static int name_used(name_ctx *c, const char *s) {
  for (int i = 0; i < c->n_used; i++)
    if (strcmp(c->used[i], s) == 0) return 1;
  return 0;
}

static const char *use_name(sema *S, name_ctx *c, const char *base, int exact) {
  char buf[200];
  snprintf(buf, sizeof buf, "%s", base);
  for (int k = 1; !exact && name_used(c, buf); k++) snprintf(buf, sizeof buf, "%.180s_%d", base, k);
  c->used = grow(c->used, &c->cap_used, c->n_used, sizeof *c->used);
  const char *s = ast_strndup(S->arena, buf, strlen(buf));
  c->used[c->n_used++] = s;
  return s;
}

/* A role name (Mixtral's) the first time the role occurs in this scope; then the name of
 * the variable the call is assigned to, or op + a counter. */
static const char *pick_name(sema *S, ast_expr *call, int role_bit, const char *role, const char *op) {
  name_ctx *c = S->nc;
  if (role && !(c->roles & role_bit)) {
    c->roles |= role_bit;
    return use_name(S, c, role, 1);
  }
  char base[160];
  if (call == S->assign_rhs && S->assign_name) snprintf(base, sizeof base, "%s", S->assign_name);
  else snprintf(base, sizeof base, "%s%d", op, c->counter++);
  return use_name(S, c, base, 0);
}

/* ---- argument binding ---- */

typedef struct {
  const char *name;
  ast_builtin bi;
  int n_params, n_required;
  const char *params[8];
  const char *usage;
} builtin_info;

static const builtin_info builtins[] = {
    {"embedding", BI_EMBEDDING, 4, 3, {"tokens", "vocab", "dim", "init"},
     "embedding(tokens, vocab, dim, init = normal(std = 0.02))"},
    {"rmsnorm", BI_RMSNORM, 3, 1, {"x", "eps", "init"}, "rmsnorm(x, eps = 1e-5, init = ones)"},
    {"linear", BI_LINEAR, 4, 2, {"x", "out", "bias", "init"},
     "linear(x, out, bias = false, init = normal(std = 0.02))"},
    {"attention", BI_ATTENTION, 7, 2, {"x", "heads", "kv_heads", "head_dim", "rope_theta", "causal", "init"},
     "attention(x, heads, kv_heads = heads, head_dim = width / heads, rope_theta = 1e4, causal = true, "
     "init = normal(std = 0.02))"},
    {"router", BI_ROUTER, 6, 3, {"x", "experts", "top_k", "aux_loss", "z_loss", "init"},
     "router(x, experts, top_k, aux_loss = 0, z_loss = 0, init = normal(std = 0.02))"},
    {"experts", BI_EXPERTS, 2, 2, {"x", "router"}, "experts(x, router) { ...one expert's body... }"},
    {"silu", BI_SILU, 1, 1, {"x"}, "silu(x)"},
    {"cross_entropy", BI_CROSS_ENTROPY, 2, 2, {"logits", "labels"}, "cross_entropy(logits, next(tokens))"},
    {"next", BI_NEXT, 1, 1, {"tokens"}, "next(tokens)"},
    {"param", BI_PARAM, 2, 1, {"type", "init"}, "param(f32[in, out], init = normal(std = 0.02))"},
    {"normal", BI_NORMAL, 1, 0, {"std"}, "normal(std = 0.02)"},
};
#define N_BUILTINS ((int)(sizeof builtins / sizeof builtins[0]))

/* Binds call arguments to parameter slots; returns -1 after reporting a problem. */
static int bind_args(sema *S, ast_expr *call, int n_params, int n_required, const char *const *params,
                     const char *fname, const char *usage, ast_expr **out) {
  int positional = 0, ok = 0;
  diag_span given[8];
  for (int i = 0; i < n_params; i++) out[i] = NULL;
  for (int i = 0; i < call->n_args; i++) {
    ast_arg *a = &call->args[i];
    int slot = -1;
    if (!a->name) {
      if (positional >= n_params) {
        diag_error(S->d, a->value->span, "too many arguments to %s; it takes %s", fname, usage);
        ok = -1;
        continue;
      }
      slot = positional++;
    } else {
      for (int k = 0; k < n_params; k++)
        if (strcmp(params[k], a->name) == 0) slot = k;
      if (slot < 0) {
        const char *best = diag_suggest(a->name, params, n_params);
        if (best) diag_error(S->d, a->name_span, "%s has no argument '%s'; did you mean '%s'?", fname, a->name, best);
        else diag_error(S->d, a->name_span, "%s has no argument '%s'; it takes %s", fname, a->name, usage);
        ok = -1;
        continue;
      }
    }
    if (out[slot]) {
      diag_error(S->d, a->name ? a->name_span : a->value->span, "argument '%s' of %s given twice", params[slot], fname);
      diag_note(S->d, given[slot], "first given here");
      ok = -1;
      continue;
    }
    out[slot] = a->value;
    given[slot] = a->name ? a->name_span : a->value->span;
  }
  for (int i = 0; i < n_required && ok == 0; i++)
    if (!out[i]) {
      diag_error(S->d, call->span, "%s needs its argument '%s'; it takes %s", fname, params[i], usage);
      ok = -1;
    }
  return ok;
}

/* ---- typed argument helpers ---- */

static int want_int(sema *S, ast_expr *e, const char *fname, const char *what, int64_t min, int64_t max,
                    int64_t *out, const sema_var **origin) {
  char fb[40];
  sv v = sema_eval(S, e);
  if (v.ty == TY_ERROR) return -1;
  if (v.ty != TY_INT) {
    if (v.ty == TY_FLOAT)
      diag_error(S->d, e->span, "%s: '%s' must be an integer, got a float (%s)", fname, what, ast_fmt_float(v.f, fb));
    else
      diag_error(S->d, e->span, "%s: '%s' must be an integer, got %s", fname, what, ast_type_name(v.ty));
    sema_note_origin(S, v.origin);
    return -1;
  }
  if (v.i < min || v.i > max) {
    if (v.i < min) diag_error(S->d, e->span, "%s: '%s' must be at least %" PRId64 ", got %" PRId64, fname, what, min, v.i);
    else diag_error(S->d, e->span, "%s: '%s' is too large (%" PRId64 "; the limit is %" PRId64 ")", fname, what, v.i, max);
    sema_note_origin(S, v.origin);
    return -1;
  }
  *out = v.i;
  if (origin) *origin = v.origin;
  return 0;
}

static int want_num(sema *S, ast_expr *e, const char *fname, const char *what, double *out, const sema_var **origin) {
  sv v = sema_eval(S, e);
  if (v.ty == TY_ERROR) return -1;
  if (v.ty != TY_INT && v.ty != TY_FLOAT) {
    diag_error(S->d, e->span, "%s: '%s' must be a number, got %s", fname, what, ast_type_name(v.ty));
    sema_note_origin(S, v.origin);
    return -1;
  }
  *out = v.ty == TY_INT ? (double)v.i : v.f;
  if (origin) *origin = v.origin;
  return 0;
}

static int want_bool(sema *S, ast_expr *e, const char *fname, const char *what, int *out) {
  sv v = sema_eval(S, e);
  if (v.ty == TY_ERROR) return -1;
  if (v.ty != TY_BOOL) {
    diag_error(S->d, e->span, "%s: '%s' must be true or false, got %s", fname, what, ast_type_name(v.ty));
    return -1;
  }
  *out = (int)v.i;
  return 0;
}

/* A tensor operand over the given rows (-1: any). */
static int want_tensor(sema *S, ast_expr *e, const char *fname, const char *what, sv *out) {
  sv v = sema_eval(S, e);
  *out = v;
  if (v.ty == TY_ERROR) return -1;
  if (v.ty == TY_TOKENS) {
    diag_error(S->d, e->span, "%s: 'tokens' are integer ids; embed them first with embedding(tokens, vocab, dim)", fname);
    return -1;
  }
  if (v.ty != TY_TENSOR) {
    diag_error(S->d, e->span, "%s: '%s' must be a tensor, got %s", fname, what, ast_type_name(v.ty));
    sema_note_origin(S, v.origin);
    return -1;
  }
  return 0;
}

/* init = normal(std = S) | normal | ones | zeros */
static int want_init(sema *S, ast_expr *e, const char *fname, ast_init dflt, ast_expr *call) {
  call->init = dflt;
  call->std = 0.02;
  if (!e) return 0;
  if (e->kind == EX_NAME && (!strcmp(e->s, "ones") || !strcmp(e->s, "zeros") || !strcmp(e->s, "normal"))) {
    call->init = e->s[0] == 'o' ? INIT_ONES : e->s[0] == 'z' ? INIT_ZEROS : INIT_NORMAL;
    return 0;
  }
  if (e->kind == EX_CALL && strcmp(e->s, "normal") == 0 && !e->block) {
    ast_expr *a[1];
    const builtin_info *b = &builtins[N_BUILTINS - 1];
    if (bind_args(S, e, b->n_params, b->n_required, b->params, "normal", b->usage, a)) return -1;
    double std = 0.02;
    if (a[0] && want_num(S, a[0], "normal", "std", &std, NULL)) return -1;
    if (!(std > 0) || std > 1e3) {
      diag_error(S->d, a[0]->span, "normal: 'std' must be positive, got %g", std);
      return -1;
    }
    call->init = INIT_NORMAL;
    call->std = std;
    return 0;
  }
  diag_error(S->d, e->span, "%s: 'init' must be normal(std = ...), ones or zeros", fname);
  return -1;
}

static void add_gemm(sema *S, diag_span at, const char *op, int64_t width, const sema_var *origin) {
  S->gemms = grow(S->gemms, &S->cap_gemms, S->n_gemms, sizeof *S->gemms);
  S->gemms[S->n_gemms++] = (sema_gemm){at, op, width, origin};
}

static int numel_ok(sema *S, diag_span at, const char *what, int64_t a, int64_t b, int64_t c) {
  int64_t n;
  if (__builtin_mul_overflow(a, b, &n) || __builtin_mul_overflow(n, c, &n) || n > SEMA_MAX_NUMEL) {
    diag_error(S->d, at, "%s is too large (%" PRId64 " x %" PRId64 " x %" PRId64 " elements)", what, a, b, c);
    return 0;
  }
  return 1;
}

/* ---- constant arithmetic ---- */

static sv arith(sema *S, ast_expr *e, sv a, sv b) {
  const char op = e->op;
  if (a.ty == TY_INT && b.ty == TY_INT) {
    int64_t r = 0;
    int over = 0;
    switch (op) {
    case '+': over = __builtin_add_overflow(a.i, b.i, &r); break;
    case '-': over = __builtin_sub_overflow(a.i, b.i, &r); break;
    case '*': over = __builtin_mul_overflow(a.i, b.i, &r); break;
    case '/':
    case '%':
      if (b.i == 0) {
        diag_error(S->d, e->span, "division by zero");
        if (b.origin) sema_note_origin(S, b.origin);
        return sv_err();
      }
      if (a.i == INT64_MIN && b.i == -1) over = 1;
      else r = op == '/' ? a.i / b.i : a.i % b.i;
      break;
    }
    if (over) {
      diag_error(S->d, e->span, "integer overflow: %" PRId64 " %c %" PRId64 " does not fit in 64 bits", a.i, op, b.i);
      return sv_err();
    }
    sv v = sv_of(TY_INT, e->span);
    v.i = r;
    return v;
  }
  double x = a.ty == TY_INT ? (double)a.i : a.f, y = b.ty == TY_INT ? (double)b.i : b.f, r = 0;
  switch (op) {
  case '+': r = x + y; break;
  case '-': r = x - y; break;
  case '*': r = x * y; break;
  case '/':
    if (y == 0) {
      diag_error(S->d, e->span, "division by zero");
      if (b.origin) sema_note_origin(S, b.origin);
      return sv_err();
    }
    r = x / y;
    break;
  case '%':
    diag_error(S->d, e->span, "'%%' needs integers, got %s and %s", ast_type_name(a.ty), ast_type_name(b.ty));
    return sv_err();
  }
  if (!isfinite(r)) {
    diag_error(S->d, e->span, "floating-point overflow: %g %c %g", x, op, y);
    return sv_err();
  }
  sv v = sv_of(TY_FLOAT, e->span);
  v.f = r;
  return v;
}

static sv eval_bin(sema *S, ast_expr *e) {
  sv a = sema_eval(S, e->a), b = sema_eval(S, e->b);
  if (a.ty == TY_ERROR || b.ty == TY_ERROR) return sv_err();
  int an = a.ty == TY_INT || a.ty == TY_FLOAT, bn = b.ty == TY_INT || b.ty == TY_FLOAT;
  if (an && bn) return arith(S, e, a, b);
  if (a.ty == TY_TENSOR && b.ty == TY_TENSOR) {
    if (e->op != '+' && e->op != '*') {
      diag_error(S->d, e->span, "operator '%c' is not defined on tensors (only + and *)", e->op);
      return sv_err();
    }
    if (a.rows != b.rows || a.i != b.i) {
      char sa[64], sb[64];
      diag_error(S->d, e->span, "cannot %s tensors of different shapes: %s and %s", e->op == '+' ? "add" : "multiply",
                 shape_str(&a, sa, sizeof sa), shape_str(&b, sb, sizeof sb));
      return sv_err();
    }
    e->ty = TY_TENSOR;
    sv v = a;
    v.span = e->span;
    return v;
  }
  diag_error(S->d, e->span, "operator '%c' cannot combine %s and %s", e->op, ast_type_name(a.ty), ast_type_name(b.ty));
  return sv_err();
}

/* ---- built-in layers ---- */

static void no_experts(sema *S, ast_expr *e, const char *fname) {
  if (S->in_experts) diag_error(S->d, e->name_span, "%s is not allowed inside an experts block", fname);
}

static sv call_embedding(sema *S, ast_expr *e, ast_expr **a) {
  sv t = sema_eval(S, a[0]);
  int64_t vocab, dim;
  const sema_var *dorg;
  if (t.ty != TY_ERROR && t.ty != TY_TOKENS) {
    diag_error(S->d, a[0]->span, "embedding: the first argument must be 'tokens', got %s", ast_type_name(t.ty));
    return sv_err();
  }
  no_experts(S, e, "embedding");
  if (want_int(S, a[1], "embedding", "vocab", 1, SEMA_MAX_DIM, &vocab, NULL) |
      want_int(S, a[2], "embedding", "dim", 1, SEMA_MAX_DIM, &dim, &dorg) | want_init(S, a[3], "embedding", INIT_NORMAL, e) ||
      t.ty == TY_ERROR || S->in_experts)
    return sv_err();
  if (!numel_ok(S, e->span, "the embedding table", vocab, dim, 1)) return sv_err();
  e->n[0] = vocab;
  e->n[1] = dim;
  e->pname = pick_name(S, e, R_EMBED, S->nc->kind == 0 ? "embed_tokens" : NULL, "embedding");
  if (!S->have_embed) {
    S->have_embed = 1;
    S->cfg.vocab = vocab;
    S->cfg.hidden = dim;
  }
  sv v = sv_of(TY_TENSOR, e->span);
  v.i = dim;
  v.origin = dorg;
  return v;
}

static sv call_rmsnorm(sema *S, ast_expr *e, ast_expr **a) {
  sv x;
  double eps = 1e-5;
  int bad = want_tensor(S, a[0], "rmsnorm", "x", &x);
  if (a[1] && !want_num(S, a[1], "rmsnorm", "eps", &eps, NULL) && !(eps > 0 && eps < 1)) {
    diag_error(S->d, a[1]->span, "rmsnorm: 'eps' must be between 0 and 1, got %g", eps);
    bad = -1;
  } else if (a[1] && !(eps > 0 && eps < 1)) {
    bad = -1;
  }
  if (want_init(S, a[2], "rmsnorm", INIT_ONES, e) || bad) return sv_err();
  e->n[0] = x.i;
  e->x[0] = eps;
  e->opnd[0] = a[0];
  int kind = S->nc->kind;
  if (kind == 0) e->pname = pick_name(S, e, R_NORM1, "norm", "rmsnorm");
  else if (kind == 1 && !(S->nc->roles & R_NORM1)) e->pname = pick_name(S, e, R_NORM1, "input_layernorm", "rmsnorm");
  else if (kind == 1) e->pname = pick_name(S, e, R_NORM2, "post_attention_layernorm", "rmsnorm");
  else e->pname = pick_name(S, e, 0, NULL, "rmsnorm");
  if (!S->have_norm) {
    S->have_norm = 1;
    S->cfg.norm_eps = eps;
  }
  x.span = e->span;
  return x;
}

static sv call_linear(sema *S, ast_expr *e, ast_expr **a) {
  char fb[40];
  sv x, w = sv_err();
  int bias = 0;
  int bad = want_tensor(S, a[0], "linear", "x", &x);
  const sema_var *oorg = NULL;
  int64_t out = 0;
  ast_expr *wexpr = a[1];
  sv o = sema_eval(S, wexpr);
  if (o.ty == TY_PARAM) {
    w = o;
    if (w.rank != 2) {
      diag_error(S->d, wexpr->span, "linear: the weight must have 2 dimensions [in, out], got %d", w.rank);
      bad = -1;
    } else if (!bad && w.dims[0] != x.i) {
      diag_error(S->d, wexpr->span, "linear: the weight is [%" PRId64 ", %" PRId64 "] but x has width %" PRId64
                 " (weights are [in, out])", w.dims[0], w.dims[1], x.i);
      bad = -1;
    }
    out = w.dims[1];
  } else if (o.ty == TY_INT) {
    out = o.i;
    oorg = o.origin;
    if (out < 1 || out > SEMA_MAX_DIM) {
      diag_error(S->d, wexpr->span, "linear: 'out' must be between 1 and %" PRId64 ", got %" PRId64, SEMA_MAX_DIM, out);
      sema_note_origin(S, o.origin);
      bad = -1;
    }
  } else if (o.ty != TY_ERROR) {
    if (o.ty == TY_FLOAT)
      diag_error(S->d, wexpr->span, "linear: 'out' must be an integer size or a param, got a float (%s)", ast_fmt_float(o.f, fb));
    else
      diag_error(S->d, wexpr->span, "linear: 'out' must be an integer size or a param, got %s", ast_type_name(o.ty));
    sema_note_origin(S, o.origin);
    bad = -1;
  } else {
    bad = -1;
  }
  if (a[2] && want_bool(S, a[2], "linear", "bias", &bias)) bad = -1;
  if (want_init(S, a[3], "linear", INIT_NORMAL, e)) bad = -1;
  if (bad) return sv_err();
  if (o.ty == TY_INT && !numel_ok(S, e->span, "the weight", x.i, out, 1)) return sv_err();
  e->n[0] = x.i;
  e->n[1] = out;
  e->n[2] = -1;
  e->bias = bias;
  e->opnd[0] = a[0];
  if (o.ty == TY_PARAM) {
    e->opnd[1] = wexpr;
  } else {
    int lm = S->nc->kind == 0 && S->have_embed && out == S->cfg.vocab;
    e->pname = pick_name(S, e, R_LMHEAD, lm ? "lm_head" : NULL, "linear");
    e->pabs = lm && strcmp(e->pname, "lm_head") == 0;
    if (S->in_experts && S->n_exp_lin < 8) S->exp_lin[S->n_exp_lin++] = e;
    else if (S->in_experts) S->n_exp_lin = 9;
  }
  if (!e->pabs) {
    add_gemm(S, e->span, "linear: the input width", x.i, x.origin);
    add_gemm(S, e->span, "linear: the output width", out, oorg);
  }
  sv v = x;
  v.i = out;
  v.origin = oorg;
  v.span = e->span;
  return v;
}

static sv call_attention(sema *S, ast_expr *e, ast_expr **a) {
  sv x;
  int64_t nh = 0, nkv = 0, hd = 0;
  double theta = 1e4;
  int causal = 1;
  const sema_var *ho = NULL, *ko = NULL;
  int bad = want_tensor(S, a[0], "attention", "x", &x);
  no_experts(S, e, "attention");
  if (want_int(S, a[1], "attention", "heads", 1, 65536, &nh, &ho)) bad = -1;
  if (a[2] ? want_int(S, a[2], "attention", "kv_heads", 1, 65536, &nkv, &ko) : 0) bad = -1;
  if (!a[2]) nkv = nh, ko = ho;
  if (a[3] && want_int(S, a[3], "attention", "head_dim", 2, 65536, &hd, NULL)) bad = -1;
  if (a[4] && !want_num(S, a[4], "attention", "rope_theta", &theta, NULL) && !(theta > 0)) {
    diag_error(S->d, a[4]->span, "attention: 'rope_theta' must be positive, got %g", theta);
    bad = -1;
  } else if (a[4] && !(theta > 0)) {
    bad = -1;
  }
  if (a[5] && !want_bool(S, a[5], "attention", "causal", &causal) && !causal) {
    diag_error(S->d, a[5]->span, "attention: only causal attention is supported");
    bad = -1;
  }
  if (want_init(S, a[6], "attention", INIT_NORMAL, e)) bad = -1;
  if (bad || S->in_experts) return sv_err();
  if (nh % nkv) {
    diag_error(S->d, (a[2] ? a[2] : a[1])->span, "attention: heads (%" PRId64 ") is not a multiple of kv_heads (%" PRId64 ")", nh, nkv);
    sema_note_origin(S, ho);
    if (ko != ho) sema_note_origin(S, ko);
    return sv_err();
  }
  if (!a[3]) {
    if (x.i % nh) {
      diag_error(S->d, a[1]->span, "attention: hidden size %" PRId64 " is not a multiple of heads (%" PRId64 ")", x.i, nh);
      sema_note_origin(S, x.origin);
      sema_note_origin(S, ho);
      return sv_err();
    }
    hd = x.i / nh;
  }
  if (hd % 2) {
    diag_error(S->d, (a[3] ? a[3] : a[1])->span, "attention: the head size %" PRId64 " must be even for rope", hd);
    return sv_err();
  }
  if (!numel_ok(S, e->span, "the attention projection", x.i, nh, hd)) return sv_err();
  e->n[0] = nh;
  e->n[1] = nkv;
  e->n[2] = hd;
  e->n[3] = x.i;
  e->x[0] = theta;
  e->opnd[0] = a[0];
  e->pname = pick_name(S, e, R_ATTN, "self_attn", "attn");
  add_gemm(S, e->span, "attention: the hidden size", x.i, x.origin);
  add_gemm(S, e->span, "attention: the q width (heads x head_dim)", nh * hd, NULL);
  add_gemm(S, e->span, "attention: the k/v width (kv_heads x head_dim)", nkv * hd, NULL);
  if (!S->have_attn) {
    S->have_attn = 1;
    S->cfg.heads = nh;
    S->cfg.kv_heads = nkv;
    S->cfg.head_dim = hd;
    S->cfg.rope_theta = theta;
  }
  x.span = e->span;
  return x;
}

static sv call_router(sema *S, ast_expr *e, ast_expr **a) {
  char fb[40];
  sv x;
  int64_t ne = 0, k = 0;
  double aux = 0, z = 0;
  const sema_var *eo = NULL, *ko = NULL;
  int bad = want_tensor(S, a[0], "router", "x", &x);
  no_experts(S, e, "router");
  if (want_int(S, a[1], "router", "experts", 1, 4096, &ne, &eo)) bad = -1;
  else if (!S->have_router) {
    S->have_router = 1;
    S->cfg.experts = ne;
    S->experts_origin = eo;
    S->experts_span = a[1]->span;
  }
  sv kv = sema_eval(S, a[2]);
  if (kv.ty == TY_INT) {
    k = kv.i;
    ko = kv.origin;
    if (k < 1) {
      diag_error(S->d, a[2]->span, "router: top_k must be at least 1, got %" PRId64, k);
      sema_note_origin(S, ko);
      bad = -1;
    } else if (!bad && k > ne) {
      diag_error(S->d, a[2]->span, "router: top_k (%" PRId64 ") is more than experts (%" PRId64 ")", k, ne);
      sema_note_origin(S, ko);
      sema_note_origin(S, eo);
      bad = -1;
    }
  } else if (kv.ty != TY_ERROR) {
    if (kv.ty == TY_FLOAT) diag_error(S->d, a[2]->span, "router: 'top_k' must be an integer, got a float (%s)", ast_fmt_float(kv.f, fb));
    else diag_error(S->d, a[2]->span, "router: 'top_k' must be an integer, got %s", ast_type_name(kv.ty));
    sema_note_origin(S, kv.origin);
    bad = -1;
  } else {
    bad = -1;
  }
  if (a[3] && !want_num(S, a[3], "router", "aux_loss", &aux, NULL) && !(aux >= 0)) {
    diag_error(S->d, a[3]->span, "router: 'aux_loss' must not be negative, got %g", aux);
    bad = -1;
  } else if (a[3] && !(aux >= 0)) {
    bad = -1;
  }
  if (a[4] && !want_num(S, a[4], "router", "z_loss", &z, NULL) && !(z >= 0)) {
    diag_error(S->d, a[4]->span, "router: 'z_loss' must not be negative, got %g", z);
    bad = -1;
  } else if (a[4] && !(z >= 0)) {
    bad = -1;
  }
  if (want_init(S, a[5], "router", INIT_NORMAL, e)) bad = -1;
  if (bad || S->in_experts) return sv_err();
  e->n[0] = ne;
  e->n[1] = k;
  e->n[2] = x.i;
  e->x[0] = aux;
  e->x[1] = z;
  e->opnd[0] = a[0];
  e->pname = pick_name(S, e, R_ROUTER, "block_sparse_moe", "router");
  if (!S->have_router_done) {
    S->have_router_done = 1;
    S->cfg.top_k = k;
    S->cfg.aux_loss = aux;
    S->cfg.z_loss = z;
  }
  sv v = sv_of(TY_ROUTER, e->span);
  v.i = ne;
  v.k = k;
  return v;
}

static ast_expr *resolve(ast_expr *e) {
  for (int n = 0; e && e->kind == EX_NAME && e->opnd[0] && n < 64; n++) e = e->opnd[0];
  return e;
}

static int is_lin(ast_expr *e, ast_expr *const *lins, int n) {
  for (int i = 0; i < n; i++)
    if (lins[i] == e) return 1;
  return 0;
}

/* Names gate/up/down w1/w3/w2 when the body is Mixtral's: linear(silu(g) * u, out) with
 * g = linear(x, F) and u = linear(x, F) over the routed input x. */
static void name_swiglu(sema *S, ast_expr *out, int in_slot) {
  if (S->n_exp_lin != 3) return;
  ast_expr *down = resolve(out);
  if (!down || down->kind != EX_CALL || down->bi != BI_LINEAR || !is_lin(down, S->exp_lin, 3)) return;
  ast_expr *m = resolve(down->opnd[0]);
  if (!m || m->kind != EX_BIN || m->op != '*') return;
  for (int side = 0; side < 2; side++) {
    ast_expr *s = resolve(side ? m->b : m->a), *u = resolve(side ? m->a : m->b);
    if (!s || s->kind != EX_CALL || s->bi != BI_SILU) continue;
    ast_expr *g = resolve(s->opnd[0]);
    if (!g || !u || g == u || g == down || u == down || !is_lin(g, S->exp_lin, 3) || !is_lin(u, S->exp_lin, 3)) continue;
    ast_expr *gx = resolve(g->opnd[0]), *ux = resolve(u->opnd[0]);
    if (!gx || !ux || gx->kind != EX_NAME || ux->kind != EX_NAME || gx->slot != in_slot || ux->slot != in_slot) continue;
    if (g->bias || u->bias || down->bias || g->n[1] != u->n[1]) continue;
    g->pname = "w1";
    u->pname = "w3";
    down->pname = "w2";
    if (!S->have_ffn) {
      S->have_ffn = 1;
      if (!S->cfg.ffn) S->cfg.ffn = g->n[1];
    }
    return;
  }
}

static void walk_block(sema *S, ast_block *b, int kind);

static sv call_experts(sema *S, ast_expr *e, ast_expr **a) {
  if (!e->block) {
    diag_error(S->d, e->span, "experts(x, router) needs a { ... } block with one expert's body");
    return sv_err();
  }
  if (S->in_experts) {
    diag_error(S->d, e->name_span, "experts blocks cannot be nested");
    return sv_err();
  }
  ast_expr *xe = a[0];
  sv x = sema_eval(S, xe), r = sema_eval(S, a[1]);
  int bad = 0;
  if (xe->kind != EX_NAME || (x.ty != TY_TENSOR && x.ty != TY_ERROR)) {
    if (x.ty != TY_ERROR)
      diag_error(S->d, xe->span, "experts: the first argument must name a tensor variable (it names the routed rows inside the block), e.g. experts(h, r)");
    bad = 1;
  }
  if (r.ty != TY_ROUTER) {
    if (r.ty != TY_ERROR) diag_error(S->d, a[1]->span, "experts: the second argument must be a router, got %s", ast_type_name(r.ty));
    bad = 1;
  }
  if (bad) return sv_err();
  e->n[0] = r.i;
  e->opnd[0] = xe;
  e->opnd[1] = a[1];
  e->pname = pick_name(S, e, R_EXPERTS, "block_sparse_moe", "moe");
  /* the body: a scope where the input's name means the rows routed to one expert */
  int base = S->n_vars, saved_floor = S->experts_floor;
  name_ctx nc = {2, 0, NULL, 0, 0, 0}, *saved_nc = S->nc;
  ast_expr *saved_rhs = S->assign_rhs;
  S->nc = &nc;
  S->n_exp_lin = 0;
  S->in_experts = 1;
  S->experts_floor = base;
  sv in = x;
  in.rows = 1;
  sema_var *iv = define(S, xe->s, xe->span, in, 0);
  e->slot = iv->slot;
  ast_block *body = e->block;
  walk_block(S, body, 2);
  sv res = sv_err();
  ast_stmt *last = body->n ? body->v[body->n - 1] : NULL;
  if (!last || last->kind != ST_EXPR) {
    diag_error(S->d, last ? last->span : body->close,
               "an experts block must end with the expert's output, e.g. linear(silu(g) * u, hidden)");
  } else if (last->value->ty == TY_TENSOR) {
    /* walk_block evaluated it; re-read its shape from the annotation */
    res = sv_of(TY_TENSOR, e->span);
    res.i = last->value->n[3];
    res.rows = 0;
    name_swiglu(S, last->value, iv->slot);
  }
  S->n_vars = base;
  S->in_experts = 0;
  S->experts_floor = saved_floor;
  S->nc = saved_nc;
  S->assign_rhs = saved_rhs;
  free(nc.used);
  return res;
}

static sv call_param(sema *S, ast_expr *e, ast_expr **a) {
  ast_expr *t = a[0];
  int bad = 0;
  if (e != S->assign_rhs) {
    diag_error(S->d, e->span, "param(...) must be assigned to a name, e.g. w = param(f32[hidden, ffn])");
    bad = 1;
  }
  if (t->kind != EX_TYPE) {
    diag_error(S->d, t->span, "param: expected a type such as f32[hidden, ffn]");
    return sv_err();
  }
  if (strcmp(t->s, "f32") != 0) {
    if (!strcmp(t->s, "bf16") || !strcmp(t->s, "fp32") || !strcmp(t->s, "fp16") || !strcmp(t->s, "e4m3"))
      diag_error(S->d, t->name_span, "param: parameters are f32 master weights (write f32[...]); train.precision sets the compute type");
    else
      diag_error(S->d, t->name_span, "param: unknown element type '%s' (parameters are f32)", t->s);
    bad = 1;
  }
  if (t->n_args < 1 || t->n_args > 2) {
    diag_error(S->d, t->span, "param: a parameter has 1 or 2 dimensions, got %d", t->n_args);
    return sv_err();
  }
  sv v = sv_of(TY_PARAM, e->span);
  v.rank = t->n_args;
  for (int i = 0; i < t->n_args; i++) {
    if (t->args[i].name) {
      diag_error(S->d, t->args[i].name_span, "param: dimensions are sizes, not named arguments");
      bad = 1;
      continue;
    }
    if (want_int(S, t->args[i].value, "param", "dimension", 1, SEMA_MAX_DIM, &v.dims[i], NULL)) bad = 1;
  }
  if (want_init(S, a[1], "param", INIT_NORMAL, e)) bad = 1;
  if (bad) return sv_err();
  if (v.rank == 2 && !numel_ok(S, e->span, "the parameter", v.dims[0], v.dims[1], 1)) return sv_err();
  e->n[0] = v.rank;
  e->n[1] = v.dims[0];
  e->n[2] = v.rank == 2 ? v.dims[1] : 0;
  e->pname = use_name(S, S->nc, S->assign_name, 0);
  return v;
}

static sv eval_call(sema *S, ast_expr *e) {
  const builtin_info *b = NULL;
  for (int i = 0; i < N_BUILTINS; i++)
    if (strcmp(builtins[i].name, e->s) == 0) b = &builtins[i];
  if (!b) {
    const char *names[N_BUILTINS + 2];
    for (int i = 0; i < N_BUILTINS; i++) names[i] = builtins[i].name;
    const char *best = diag_suggest(e->s, names, N_BUILTINS);
    if (!strcmp(e->s, "adamw") || !strcmp(e->s, "mxfp8"))
      diag_error(S->d, e->name_span, "%s(...) belongs in the train section", e->s);
    else if (best) diag_error(S->d, e->name_span, "unknown function '%s'; did you mean '%s'?", e->s, best);
    else diag_error(S->d, e->name_span, "unknown function '%s'", e->s);
    return sv_err();
  }
  e->bi = b->bi;
  if (e->block && b->bi != BI_EXPERTS) {
    diag_error(S->d, e->block->open, "only experts(...) takes a { ... } block");
    return sv_err();
  }
  ast_expr *a[8];
  if (bind_args(S, e, b->n_params, b->n_required, b->params, b->name, b->usage, a)) return sv_err();
  switch (b->bi) {
  case BI_EMBEDDING: return call_embedding(S, e, a);
  case BI_RMSNORM: return call_rmsnorm(S, e, a);
  case BI_LINEAR: return call_linear(S, e, a);
  case BI_ATTENTION: return call_attention(S, e, a);
  case BI_ROUTER: return call_router(S, e, a);
  case BI_EXPERTS: return call_experts(S, e, a);
  case BI_PARAM: return call_param(S, e, a);
  case BI_SILU: {
    sv x;
    if (want_tensor(S, a[0], "silu", "x", &x)) return sv_err();
    e->opnd[0] = a[0];
    x.span = e->span;
    return x;
  }
  case BI_NEXT: {
    sv t = sema_eval(S, a[0]);
    if (t.ty == TY_ERROR) return t;
    if (t.ty != TY_TOKENS) {
      diag_error(S->d, a[0]->span, "next: the argument must be 'tokens', got %s", ast_type_name(t.ty));
      return sv_err();
    }
    return sv_of(TY_LABELS, e->span);
  }
  case BI_CROSS_ENTROPY: {
    sv l, y = sv_err();
    int bad = want_tensor(S, a[0], "cross_entropy", "logits", &l);
    no_experts(S, e, "cross_entropy");
    if (a[1]) y = sema_eval(S, a[1]);
    if (y.ty != TY_LABELS && y.ty != TY_ERROR) {
      diag_error(S->d, a[1]->span, "cross_entropy: the labels must be next(tokens), got %s", ast_type_name(y.ty));
      bad = -1;
    }
    if (bad || y.ty == TY_ERROR || S->in_experts) return sv_err();
    if (S->have_embed && l.i != S->cfg.vocab) {
      diag_error(S->d, a[0]->span, "cross_entropy: the logits have width %" PRId64 ", but the vocabulary has %" PRId64 " entries",
                 l.i, S->cfg.vocab);
      return sv_err();
    }
    e->opnd[0] = a[0];
    e->opnd[1] = a[1];
    return sv_of(TY_LOSS, e->span);
  }
  case BI_NORMAL:
    diag_error(S->d, e->name_span, "normal(...) is an initialiser: write it as init = normal(std = ...)");
    return sv_err();
  default: break;
  }
  return sv_err();
}

/* ---- expressions ---- */

static sv eval_name(sema *S, ast_expr *e) {
  if (strcmp(e->s, "tokens") == 0 && !sema_lookup(S, "tokens")) {
    if (S->in_experts) {
      diag_error(S->d, e->span, "'tokens' cannot be used inside an experts block");
      return sv_err();
    }
    return sv_of(TY_TOKENS, e->span);
  }
  sema_var *v = sema_lookup(S, e->s);
  if (!v) {
    if (!strcmp(e->s, "ones") || !strcmp(e->s, "zeros"))
      diag_error(S->d, e->span, "'%s' is an initialiser: write it as init = %s", e->s, e->s);
    else
      unknown_name(S, e);
    return sv_err();
  }
  if (v->is_const) {
    sv r = v->val;
    r.origin = v;
    r.span = e->span;
    return r;
  }
  if (S->in_experts && v->index < S->experts_floor) {
    diag_error(S->d, e->span, "'%s' is defined outside the experts block; inside it, only the routed input and sizes can be used", e->s);
    diag_note(S->d, v->def, "'%s' defined here", e->s);
    return sv_err();
  }
  e->slot = v->slot;
  e->opnd[0] = v->def_expr;
  sv r = v->val;
  r.span = e->span;
  return r;
}

sv sema_eval(sema *S, ast_expr *e) {
  sv v = sv_err();
  if (!e || e->bad) return v;
  switch (e->kind) {
  case EX_INT: v = sv_of(TY_INT, e->span); v.i = e->i; break;
  case EX_FLOAT: v = sv_of(TY_FLOAT, e->span); v.f = e->f; break;
  case EX_BOOL: v = sv_of(TY_BOOL, e->span); v.i = e->i; break;
  case EX_STR: v = sv_of(TY_STR, e->span); v.s = e->s; break;
  case EX_NAME: v = eval_name(S, e); break;
  case EX_BIN: v = eval_bin(S, e); break;
  case EX_NEG: {
    sv a = sema_eval(S, e->a);
    if (a.ty == TY_INT) {
      if (a.i == INT64_MIN) {
        diag_error(S->d, e->span, "integer overflow: -(%" PRId64 ") does not fit in 64 bits", a.i);
        return sv_err();
      }
      v = sv_of(TY_INT, e->span);
      v.i = -a.i;
    } else if (a.ty == TY_FLOAT) {
      v = sv_of(TY_FLOAT, e->span);
      v.f = -a.f;
    } else if (a.ty != TY_ERROR) {
      diag_error(S->d, e->span, "unary '-' needs a number, got %s", ast_type_name(a.ty));
    }
    break;
  }
  case EX_CALL: v = eval_call(S, e); break;
  case EX_TYPE:
    diag_error(S->d, e->span, "a type such as %s[...] can only be used in param(...)", e->s);
    break;
  case EX_TUPLE: {
    v = sv_of(TY_TUPLE, e->span);
    for (int i = 0; i < e->n_args; i++) {
      sv x = sema_eval(S, e->args[i].value);
      if (x.ty == TY_ERROR) return sv_err();
      if ((x.ty != TY_INT && x.ty != TY_FLOAT) || e->args[i].name || i >= 4) {
        diag_error(S->d, e->args[i].value->span, "tuples hold up to 4 numbers, got %s", ast_type_name(x.ty));
        return sv_err();
      }
      v.tup[v.n_tup++] = x.ty == TY_INT ? (double)x.i : x.f;
    }
    break;
  }
  case EX_RECORD:
    diag_error(S->d, e->span, "a record { ... } is only used for train.parallel");
    break;
  }
  e->ty = v.ty;
  if (v.ty == TY_TENSOR) e->n[3] = v.i;
  return v;
}

/* ---- statements ---- */

/* --set on a constant definition: the value replaces the file's. */
static sv apply_set(sema *S, ast_stmt *st, sv v, sema_set **from) {
  sema_set *o = sema_find_set(S, st->name);
  *from = NULL;
  if (!o || v.ty == TY_ERROR) return v;
  if (!is_const_ty(v.ty) || v.ty == TY_TUPLE) {
    diag_error_at(S->d, o->file->path, "'%s' is %s, not a size or hyperparameter", st->name, ast_type_name(v.ty));
    return sv_err();
  }
  if (!o->expr) return sv_err();
  sv n = sema_eval(S, o->expr);
  if (n.ty == TY_ERROR) return n;
  if (v.ty == TY_FLOAT && n.ty == TY_INT) {
    n.ty = TY_FLOAT;
    n.f = (double)n.i;
  }
  if (n.ty != v.ty) {
    diag_error(S->d, o->expr->span, "'%s' is %s in the model; got %s", st->name, ast_type_name(v.ty), ast_type_name(n.ty));
    return sv_err();
  }
  n.origin = NULL;
  n.span = o->expr->span;
  *from = o;
  return n;
}

static void walk_assign(sema *S, ast_stmt *st, int kind) {
  ast_expr *saved_rhs = S->assign_rhs;
  const char *saved_name = S->assign_name;
  S->assign_rhs = st->value;
  S->assign_name = st->name;
  sv v = sema_eval(S, st->value);
  S->assign_rhs = saved_rhs;
  S->assign_name = saved_name;
  sema_set *set_marker = NULL;
  v = apply_set(S, st, v, &set_marker);
  if (strcmp(st->name, "tokens") == 0) {
    diag_error(S->d, st->name_span, "'tokens' is built in (the input token ids) and cannot be redefined");
    return;
  }
  sema_var *old = sema_lookup(S, st->name);
  if (old && old->val.ty == TY_ERROR) {
    /* its first definition was wrong (and reported): take the new one quietly */
    old->val = v;
    old->def_expr = st->value;
    st->slot = old->slot;
    if (is_const_ty(v.ty)) old->is_const = 1, st->is_const = 1;
    return;
  }
  if (old && !old->is_const && S->in_experts && old->index < S->experts_floor) {
    diag_error(S->d, st->name_span, "cannot assign to '%s' inside an experts block: it is defined outside", st->name);
    diag_note(S->d, old->def, "'%s' defined here", st->name);
    return;
  }
  if (old && (old->is_const || is_const_ty(v.ty))) {
    diag_error(S->d, st->name_span, "duplicate definition of '%s'", st->name);
    diag_note(S->d, old->def, "'%s' first defined here", st->name);
    return;
  }
  if (old) {
    if (v.ty == TY_ERROR) {
      old->val = v;
      st->slot = old->slot;
      return;
    }
    if (old->val.ty != TY_ERROR && old->val.ty != v.ty) {
      diag_error(S->d, st->name_span, "'%s' holds %s; it cannot be reassigned %s", st->name, ast_type_name(old->val.ty),
                 ast_type_name(v.ty));
      diag_note(S->d, old->def, "'%s' first defined here", st->name);
      return;
    }
    if (v.ty == TY_PARAM) {
      diag_error(S->d, st->name_span, "duplicate definition of parameter '%s'", st->name);
      diag_note(S->d, old->def, "'%s' first defined here", st->name);
      return;
    }
    old->val = v;
    old->def_expr = st->value;
    st->slot = old->slot;
    return;
  }
  if (kind == 0 && v.ty != TY_ERROR && !is_const_ty(v.ty)) {
    diag_error(S->d, st->value->span, "only sizes and hyperparameters can be defined outside a model");
    return;
  }
  int is_const = is_const_ty(v.ty);
  sema_var *nv = define(S, st->name, st->name_span, v, is_const);
  st->is_const = is_const;
  if (set_marker) {
    nv->from_set = 1;
    nv->set_span = set_marker->expr->span;
  }
  if (!is_const) {
    nv->def_expr = st->value;
    st->slot = nv->slot;
    if (v.ty == TY_PARAM) st->value->slot = nv->slot;
  }
}

static void walk_stmt(sema *S, ast_stmt *st, int kind, int last) {
  switch (st->kind) {
  case ST_ASSIGN: walk_assign(S, st, kind); break;
  case ST_EXPR: {
    sv v = sema_eval(S, st->value);
    if (kind != 2 || !last) {
      if (v.ty != TY_ERROR)
        diag_error(S->d, st->value->span, "this value is not used; assign it to a name (x = ...)%s",
                   kind == 2 ? " or make it the last line of the experts block" : "");
    } else if (v.ty != TY_TENSOR && v.ty != TY_ERROR) {
      diag_error(S->d, st->value->span, "an experts block must end with a tensor (the expert's output), got %s",
                 ast_type_name(v.ty));
    } else if (v.ty == TY_TENSOR && v.rows != 1) {
      diag_error(S->d, st->value->span, "the expert's output must be computed from its routed input");
    }
    break;
  }
  case ST_REPEAT: {
    if (S->in_experts || kind == 3) {
      diag_error(S->d, st->name_span, "repeat is not allowed %s", S->in_experts ? "inside an experts block" : "here");
      return;
    }
    if (S->in_repeat) {
      diag_error(S->d, st->name_span, "repeat blocks cannot be nested");
      return;
    }
    int64_t n = 0;
    if (want_int(S, st->value, "repeat", "count", 1, 100000, &n, NULL)) n = 0;
    st->value->n[0] = n;
    if (n > 0) S->cfg.layers += n;
    int base = S->n_vars;
    sv *before = malloc(((size_t)base + 1) * sizeof *before);
    for (int i = 0; i < base; i++) before[i] = S->vars[i]->val;
    name_ctx nc = {1, 0, NULL, 0, 0, 0}, *saved = S->nc;
    S->nc = &nc;
    S->in_repeat = 1;
    walk_block(S, st->body, 1);
    S->in_repeat = 0;
    S->nc = saved;
    free(nc.used);
    S->n_vars = base;
    for (int i = 0; i < base; i++) {
      sv *a = &before[i], *b = &S->vars[i]->val;
      if (a->ty == TY_TENSOR && b->ty == TY_TENSOR && (a->i != b->i || a->rows != b->rows)) {
        char sa[64], sb[64];
        diag_error(S->d, st->name_span, "'%s' changes shape in the repeat body, from %s to %s; each repetition must leave it as it found it",
                   S->vars[i]->name, shape_str(a, sa, sizeof sa), shape_str(b, sb, sizeof sb));
      }
    }
    free(before);
    break;
  }
  default:
    diag_error(S->d, st->span, "%s is only allowed at the top of a file",
               st->kind == ST_MODEL ? "a model" : st->kind == ST_TRAIN ? "a train section" : "include");
  }
}

/* kind: 1 model or repeat body, 2 experts body */
static void walk_block(sema *S, ast_block *b, int kind) {
  for (int i = 0; i < b->n && !S->d->stopped; i++) walk_stmt(S, b->v[i], kind, i == b->n - 1);
}

/* ---- the program ---- */

int sema_check(diag_engine *d, ast_arena *arena, ast_block *items, sema_set *sets, int n_sets, sema_program *out) {
  sema S0, *S = &S0;
  memset(S, 0, sizeof *S);
  S->d = d;
  S->arena = arena;
  S->sets = sets;
  S->n_sets = n_sets;
  int errors0 = d->errors;
  name_ctx top = {0, 0, NULL, 0, 0, 0};
  S->nc = &top;
  const ast_stmt *model = NULL, *train = NULL;
  for (int i = 0; i < items->n; i++) {
    ast_stmt *it = items->v[i];
    if (it->kind == ST_MODEL) {
      if (model) {
        diag_error(d, it->name_span, "a second model '%s'; a program has one model", it->name);
        diag_note(d, model->name_span, "the model '%s' is defined here", model->name);
      } else {
        model = it;
      }
    } else if (it->kind == ST_TRAIN) {
      if (train) {
        diag_error(d, it->name_span, "duplicate train section");
        diag_note(d, train->name_span, "first train section here");
      } else {
        train = it;
      }
    } else if (it->kind == ST_ASSIGN) {
      walk_assign(S, it, 0);
    }
  }
  if (!model) {
    const diag_file *f = items->n ? items->v[0]->span.file : NULL;
    if (f) diag_error(d, (diag_span){f, 0, 0, 0, 0}, "no model defined; expected 'model NAME { ... }'");
  } else {
    S->model_at = model->name_span;
    int base = S->n_vars;
    walk_block(S, model->body, 1);
    sema_var *loss = NULL;
    for (int i = base; i < S->n_vars; i++) {
      if (!strcmp(S->vars[i]->name, "loss")) loss = S->vars[i];
      if (!strcmp(S->vars[i]->name, "seq") && S->vars[i]->val.ty == TY_INT) S->model_seq = S->vars[i]->val.i;
      if (!strcmp(S->vars[i]->name, "ffn") && S->vars[i]->val.ty == TY_INT) S->cfg.ffn = S->vars[i]->val.i;
      if (!strcmp(S->vars[i]->name, "vocab") && S->vars[i]->val.ty == TY_INT && !S->have_embed) S->cfg.vocab = S->vars[i]->val.i;
      if (!strcmp(S->vars[i]->name, "hidden") && S->vars[i]->val.ty == TY_INT && !S->have_embed) S->cfg.hidden = S->vars[i]->val.i;
    }
    if (!loss) {
      if (d->errors == errors0)
        diag_error(d, model->name_span, "model '%s' does not define its loss: add loss = cross_entropy(logits, next(tokens))", model->name);
    } else if (loss->val.ty != TY_LOSS && loss->val.ty != TY_ERROR) {
      diag_error(d, loss->def, "'loss' must be cross_entropy(logits, next(tokens)), got %s", ast_type_name(loss->val.ty));
    }
    if (!d->stopped) sema_train(S, train);
    if (out && loss) {
      out->model = model;
      out->model_name = model->name;
      out->n_slots = S->n_slots;
      out->loss_slot = loss->slot;
      out->cfg = S->cfg;
    }
  }
  /* --set names that matched nothing */
  for (int i = 0; i < n_sets && !d->stopped; i++) {
    sema_set *o = &sets[i];
    if (o->used) continue;
    int known = 0;
    for (int k = 0; k < sema_n_train_set_names; k++)
      if (!strcmp(sema_train_set_names[k], o->name)) known = 1;
    if (known) continue;
    int n = S->n_const_names + sema_n_train_set_names;
    const char **cands = malloc((size_t)n * sizeof *cands);
    for (int k = 0; k < S->n_const_names; k++) cands[k] = S->const_names[k];
    for (int k = 0; k < sema_n_train_set_names; k++) cands[S->n_const_names + k] = sema_train_set_names[k];
    const char *best = diag_suggest(o->name, cands, n);
    if (best) diag_error_at(d, o->file->path, "unknown name '%s'; did you mean '%s'?", o->name, best);
    else diag_error_at(d, o->file->path, "unknown name '%s' (it is neither a size of the model nor a training setting)", o->name);
    free(cands);
  }
  free(top.used);
  free(S->vars);
  free(S->const_names);
  free(S->gemms);
  return d->errors - errors0 + (d->stopped && d->errors == errors0);
}
