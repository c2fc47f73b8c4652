/* sema_train.c -- the train { ... } section: its settings, their ranges and defaults,
 * --set overrides of training values, and the conditions between the model and training
 * (sequence length, expert parallelism, MXFP8 block alignment, tokens per step).
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sema.h"

/* --set names for training values (the model's own sizes are settable too). */
const char *const sema_train_set_names[] = {
    "data",   "batch",  "seq",      "steps",    "seed",   "lr",        "betas",   "beta1",
    "beta2",  "weight_decay", "adam_eps", "warmup", "schedule", "min_lr", "clip", "precision",
    "mx_block", "mx_weight_tile", "moments", "ep",   "dp",       "zero",       "stride",   "overlap", "val_fraction", "val_every", "rc_augment",
};
const int sema_n_train_set_names = (int)(sizeof sema_train_set_names / sizeof sema_train_set_names[0]);

enum { K_DATA, K_BATCH, K_SEQ, K_STEPS, K_SEED, K_OPTIMIZER, K_PRECISION, K_PARALLEL, K_STRIDE, K_OVERLAP,
       K_VAL_FRACTION, K_VAL_EVERY, K_RC_AUGMENT, K_COUNT };
static const char *const train_keys[K_COUNT] = {
    "data", "batch", "seq", "steps", "seed", "optimizer", "precision", "parallel", "stride", "overlap",
    "val_fraction", "val_every", "rc_augment"};

enum { A_LR, A_BETAS, A_WD, A_EPS, A_WARMUP, A_SCHEDULE, A_MIN_LR, A_CLIP, A_MOMENTS, A_COUNT };
static const char *const adamw_params[A_COUNT] = {"lr",       "betas",  "weight_decay", "eps",    "warmup",
                                                  "schedule", "min_lr", "clip",         "moments"};
static const char *const adamw_set_names[A_COUNT] = {"lr",       "betas",  "weight_decay", "adam_eps", "warmup",
                                                     "schedule", "min_lr", "clip",         "moments"};

/* A setting's expression: --set NAME wins over the file. *bad: a --set that did not parse. */
static ast_expr *pick(sema *S, const char *set_name, ast_expr *file_e, int *bad) {
  sema_set *o = set_name ? sema_find_set(S, set_name) : NULL;
  if (!o) return file_e;
  if (!o->expr) *bad = 1;
  return o->expr;
}

static int t_int(sema *S, ast_expr *e, const char *what, int64_t min, int64_t max, int64_t *out) {
  char fb[40];
  sv v = sema_eval(S, e);
  if (v.ty == TY_ERROR) return -1;
  if (v.ty != TY_INT) {
    if (v.ty == TY_FLOAT) diag_error(S->d, e->span, "'%s' must be an integer, got a float (%s)", what, ast_fmt_float(v.f, fb));
    else diag_error(S->d, e->span, "'%s' must be an integer, got %s", what, ast_type_name(v.ty));
    return -1;
  }
  if (v.i < min || v.i > max) {
    if (v.i < min) diag_error(S->d, e->span, "'%s' must be at least %" PRId64 ", got %" PRId64, what, min, v.i);
    else diag_error(S->d, e->span, "'%s' must be at most %" PRId64 ", got %" PRId64, what, max, v.i);
    sema_note_origin(S, v.origin);
    return -1;
  }
  *out = v.i;
  return 0;
}

static int t_num(sema *S, ast_expr *e, const char *what, double *out) {
  sv v = sema_eval(S, e);
  if (v.ty == TY_ERROR) return -1;
  if (v.ty != TY_INT && v.ty != TY_FLOAT) {
    diag_error(S->d, e->span, "'%s' must be a number, got %s", what, ast_type_name(v.ty));
    return -1;
  }
  *out = v.ty == TY_INT ? (double)v.i : v.f;
  return 0;
}

static int t_bool(sema *S, ast_expr *e, const char *what, int *out) {
  sv v = sema_eval(S, e);
  if (v.ty == TY_ERROR) return -1;
  if (v.ty != TY_BOOL) {
    diag_error(S->d, e->span, "'%s' must be true or false, got %s", what, ast_type_name(v.ty));
    return -1;
  }
  *out = (int)v.i;
  return 0;
}

/* A name from a fixed list (schedule = cosine, precision = bf16). */
static int t_enum(sema *S, ast_expr *e, const char *what, const char *const *names, int n) {
  if (e->kind != EX_NAME) {
    sv v = sema_eval(S, e);
    if (v.ty != TY_ERROR) diag_error(S->d, e->span, "'%s' must be one of %s, %s%s%s, got %s", what, names[0], names[1],
                                     n > 2 ? " or " : "", n > 2 ? names[2] : "", ast_type_name(v.ty));
    return -1;
  }
  for (int i = 0; i < n; i++)
    if (strcmp(e->s, names[i]) == 0) return i;
  const char *best = diag_suggest(e->s, names, n);
  if (best) diag_error(S->d, e->span, "unknown %s '%s'; did you mean '%s'?", what, e->s, best);
  else diag_error(S->d, e->span, "unknown %s '%s' (expected %s, %s%s%s)", what, e->s, names[0], names[1], n > 2 ? " or " : "",
                  n > 2 ? names[2] : "");
  return -1;
}

static void check_range(sema *S, ast_expr *e, const char *what, double v, double lo, int lo_open, double hi, int hi_open,
                        const char *text) {
  if (!e) return;
  int ok = isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  if (!ok) diag_error(S->d, e->span, "'%s' must be %s, got %g", what, text, v);
}

static void optimizer(sema *S, ast_expr *e) {
  moec_config *c = &S->cfg;
  ast_expr *a[A_COUNT] = {0};
  if (e) {
    if (e->kind != EX_CALL || strcmp(e->s, "adamw") != 0 || e->block) {
      if (e->kind == EX_CALL || e->kind == EX_NAME) diag_error(S->d, e->kind == EX_CALL ? e->name_span : e->span,
                                                              "unknown optimizer '%s'; moec has adamw(lr = ..., ...)", e->s);
      else diag_error(S->d, e->span, "'optimizer' must be adamw(lr = ..., ...)");
      e = NULL;
    } else {
      int positional = 0;
      diag_span given[A_COUNT];
      for (int i = 0; i < e->n_args; i++) {
        ast_arg *g = &e->args[i];
        int k = -1;
        if (!g->name) {
          if (positional++ == 0) k = A_LR;
          else {
            diag_error(S->d, g->value->span, "adamw takes only lr without a name; write the rest as name = value");
            continue;
          }
        } else {
          for (int j = 0; j < A_COUNT; j++)
            if (!strcmp(g->name, adamw_params[j])) k = j;
          if (k < 0) {
            const char *best = diag_suggest(g->name, adamw_params, A_COUNT);
            if (best) diag_error(S->d, g->name_span, "adamw has no argument '%s'; did you mean '%s'?", g->name, best);
            else diag_error(S->d, g->name_span, "adamw has no argument '%s' (it takes lr, betas, weight_decay, eps, warmup, schedule, min_lr, clip, moments)", g->name);
            continue;
          }
        }
        if (a[k]) {
          diag_error(S->d, g->name ? g->name_span : g->value->span, "argument '%s' of adamw given twice", adamw_params[k]);
          diag_note(S->d, given[k], "first given here");
          continue;
        }
        a[k] = g->value;
        given[k] = g->name ? g->name_span : g->value->span;
      }
    }
  }
  int bad = 0;
  c->lr = 3e-4;
  c->beta1 = 0.9;
  c->beta2 = 0.95;
  c->weight_decay = 0.1;
  c->adam_eps = 1e-8;
  c->warmup = 0;
  c->schedule = SCHED_COSINE;
  c->clip = 1.0;
  ast_expr *x;
  if ((x = pick(S, "lr", a[A_LR], &bad)) && !t_num(S, x, "lr", &c->lr)) check_range(S, x, "lr", c->lr, 0, 1, 10, 0, "positive (and at most 10)");
  /* betas = (b1, b2); --set beta1 / beta2 override one of them */
  ast_expr *bx = pick(S, "betas", a[A_BETAS], &bad);
  if (bx) {
    sv t = sema_eval(S, bx);
    if (t.ty == TY_TUPLE && t.n_tup == 2) {
      c->beta1 = t.tup[0];
      c->beta2 = t.tup[1];
      check_range(S, bx, "beta1", c->beta1, 0, 0, 1, 1, "in [0, 1)");
      check_range(S, bx, "beta2", c->beta2, 0, 0, 1, 1, "in [0, 1)");
    } else if (t.ty != TY_ERROR) {
      diag_error(S->d, bx->span, "'betas' must be a pair of numbers, e.g. (0.9, 0.95)");
    }
  }
  if ((x = pick(S, "beta1", NULL, &bad)) && !t_num(S, x, "beta1", &c->beta1)) check_range(S, x, "beta1", c->beta1, 0, 0, 1, 1, "in [0, 1)");
  if ((x = pick(S, "beta2", NULL, &bad)) && !t_num(S, x, "beta2", &c->beta2)) check_range(S, x, "beta2", c->beta2, 0, 0, 1, 1, "in [0, 1)");
  if ((x = pick(S, "weight_decay", a[A_WD], &bad)) && !t_num(S, x, "weight_decay", &c->weight_decay))
    check_range(S, x, "weight_decay", c->weight_decay, 0, 0, 1e3, 0, "non-negative");
  if ((x = pick(S, "adam_eps", a[A_EPS], &bad)) && !t_num(S, x, "eps", &c->adam_eps))
    check_range(S, x, "eps", c->adam_eps, 0, 1, 1, 0, "positive (and at most 1)");
  if ((x = pick(S, "warmup", a[A_WARMUP], &bad))) t_int(S, x, "warmup", 0, INT32_MAX, &c->warmup);
  if ((x = pick(S, "schedule", a[A_SCHEDULE], &bad))) {
    static const char *const sched[] = {"cosine", "linear", "constant"};
    int k = t_enum(S, x, "schedule", sched, 3);
    if (k >= 0) c->schedule = (moec_schedule)k;
  }
  c->min_lr = c->lr * 0.1;
  if (c->schedule == SCHED_CONSTANT) c->min_lr = c->lr;
  if ((x = pick(S, "min_lr", a[A_MIN_LR], &bad)) && !t_num(S, x, "min_lr", &c->min_lr) &&
      !(c->min_lr >= 0 && c->min_lr <= c->lr))
    diag_error(S->d, x->span, "'min_lr' must be between 0 and lr (%g), got %g", c->lr, c->min_lr);
  if ((x = pick(S, "clip", a[A_CLIP], &bad)) && !t_num(S, x, "clip", &c->clip))
    check_range(S, x, "clip", c->clip, 0, 0, 1e9, 0, "non-negative (0 turns clipping off)");
  /* moments = f32 | bf16: how m and v are stored (bf16: rounded to nearest after each update,
     half their bytes; the master weights stay f32) */
  c->moments_bf16 = 0;
  if ((x = pick(S, "moments", a[A_MOMENTS], &bad))) {
    static const char *const mt[] = {"f32", "bf16"};
    int k = t_enum(S, x, "moments", mt, 2);
    if (k >= 0) c->moments_bf16 = k;
  }
  (void)adamw_set_names;
}

/* precision = fp32 | bf16 | mxfp8 | mxfp8(block = 32 | 128 [, weight_tile = 128]) */
static void precision(sema *S, ast_expr *e, diag_span *where) {
  moec_config *c = &S->cfg;
  c->precision = PREC_FP32;
  c->mx_block = 32;
  c->mx_weight_tile = 0;
  static const char *const args[] = {"block", "weight_tile"};
  ast_expr *val[2] = {NULL, NULL};
  if (e) {
    *where = e->span;
    if (e->kind == EX_CALL && !strcmp(e->s, "mxfp8") && !e->block) {
      c->precision = PREC_MXFP8;
      for (int i = 0; i < e->n_args; i++) {
        ast_arg *g = &e->args[i];
        int k = !g->name && i == 0 ? 0 : -1; /* the block may be given by position */
        for (int j = 0; g->name && j < 2; j++)
          if (!strcmp(g->name, args[j])) k = j;
        if (k < 0) {
          const char *best = g->name ? diag_suggest(g->name, args, 2) : NULL;
          if (best) diag_error(S->d, g->name_span, "mxfp8 has no argument '%s'; did you mean '%s'?", g->name, best);
          else if (g->name)
            diag_error(S->d, g->name_span, "mxfp8 has no argument '%s'; it takes mxfp8(block = 32 | 128, weight_tile = 128)",
                       g->name);
          else diag_error(S->d, g->value->span, "mxfp8 takes named arguments after the first: block = 32 | 128, weight_tile = 128");
          continue;
        }
        val[k] = g->value;
      }
    } else if (e->kind == EX_CALL) {
      diag_error(S->d, e->name_span, "unknown precision '%s'; expected fp32, bf16, mxfp8 or mxfp8(block = 32 | 128)", e->s);
    } else {
      static const char *const names[] = {"fp32", "bf16", "mxfp8"};
      int k = t_enum(S, e, "precision", names, 3);
      if (k >= 0) c->precision = (moec_precision)k;
    }
  }
  int bad = 0;
  ast_expr *bset = pick(S, "mx_block", NULL, &bad), *tset = pick(S, "mx_weight_tile", NULL, &bad);
  if (bset) val[0] = bset;
  if (tset) val[1] = tset;
  if (val[0] && !t_int(S, val[0], "block", 0, INT64_MAX, &c->mx_block) && c->mx_block != 32 && c->mx_block != 128) {
    diag_error(S->d, val[0]->span, "the MXFP8 block must be 32 or 128, got %" PRId64, c->mx_block);
    c->mx_block = 32;
  }
  if (val[1] && !t_int(S, val[1], "weight_tile", 0, INT64_MAX, &c->mx_weight_tile)) {
    if (c->mx_weight_tile && c->precision != PREC_MXFP8) {
      diag_error(S->d, val[1]->span,
                 "weight_tile is an MXFP8 setting, but the precision is not mxfp8; write "
                 "precision = mxfp8(block = 128, weight_tile = 128)");
      c->mx_weight_tile = 0;
    } else if (c->mx_weight_tile != 0 && c->mx_weight_tile != 128) {
      diag_error(S->d, val[1]->span, "the MXFP8 weight tile must be 128 (128 x 128 squares of one scale) or 0, got %" PRId64,
                 c->mx_weight_tile);
      c->mx_weight_tile = 0;
    } else if (c->mx_weight_tile && c->mx_block != 128) {
      diag_error(S->d, val[1]->span,
                 "weight_tile = 128 needs block = 128 (its squares run at FP8 speed only with 128-shared scales); "
                 "write mxfp8(block = 128, weight_tile = 128)");
      c->mx_weight_tile = 0;
    }
  }
}

/* parallel = { ep = N, dp = M, zero = 0 | 1 } */
static void parallel(sema *S, ast_expr *e, ast_expr **ep, ast_expr **dp, ast_expr **zero) {
  *ep = *dp = *zero = NULL;
  if (!e) return;
  if (e->kind != EX_RECORD) {
    sv v = sema_eval(S, e);
    if (v.ty != TY_ERROR) diag_error(S->d, e->span, "'parallel' must be a record, e.g. { ep = 1, dp = 1 }");
    return;
  }
  static const char *const names[] = {"ep", "dp", "zero"};
  for (int i = 0; i < e->n_args; i++) {
    ast_arg *g = &e->args[i];
    ast_expr **slot = !strcmp(g->name, "ep") ? ep : !strcmp(g->name, "dp") ? dp : !strcmp(g->name, "zero") ? zero : NULL;
    if (!slot) {
      const char *best = diag_suggest(g->name, names, 3);
      if (best) diag_error(S->d, g->name_span, "unknown parallel setting '%s'; did you mean '%s'?", g->name, best);
      else diag_error(S->d, g->name_span, "unknown parallel setting '%s' (expected ep, dp and zero)", g->name);
      continue;
    }
    if (*slot) {
      diag_error(S->d, g->name_span, "duplicate definition of '%s'", g->name);
      diag_note(S->d, (*slot)->span, "first given here");
      continue;
    }
    *slot = g->value;
  }
}

static void resolve_data(sema *S, ast_expr *e) {
  moec_config *c = &S->cfg;
  sv v = sema_eval(S, e);
  if (v.ty == TY_ERROR) return;
  if (v.ty != TY_STR) {
    diag_error(S->d, e->span, "'data' must be a string (a FASTA path), got %s", ast_type_name(v.ty));
    return;
  }
  /* Relative paths become absolute: against the folder of the file that names the data,
   * or the current directory for --set data=PATH. */
  char buf[sizeof c->data + 8], base[sizeof c->data];
  const diag_file *f = e->span.file;
  base[0] = 0;
  if (v.s[0] != '/') {
    char dir[sizeof c->data];
    const char *slash = f && !f->plain ? strrchr(f->path, '/') : NULL;
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - f->path), f->path);
    else snprintf(dir, sizeof dir, ".");
    char *real = realpath(dir[0] ? dir : "/", NULL);
    if (real) snprintf(base, sizeof base, "%s/", strcmp(real, "/") ? real : "");
    free(real);
  }
  snprintf(buf, sizeof buf, "%s%s", base, v.s);
  if (strlen(buf) >= sizeof c->data) {
    diag_error(S->d, e->span, "the data path is too long (the limit is %zu bytes)", sizeof c->data - 1);
    return;
  }
  if (!v.s[0]) {
    diag_error(S->d, e->span, "'data' is empty");
    return;
  }
  memcpy(c->data, buf, strlen(buf) + 1);
}

static void mxfp8_checks(sema *S, diag_span prec_at) {
  int64_t block = S->cfg.mx_block, seen[32];
  int n_seen = 0;
  for (int i = 0; i < S->n_gemms && !S->d->stopped; i++) {
    sema_gemm *g = &S->gemms[i];
    if (g->width % block == 0) continue;
    int dup = 0;
    for (int k = 0; k < n_seen; k++)
      if (seen[k] == g->width) dup = 1;
    if (dup) continue;
    if (n_seen < 32) seen[n_seen++] = g->width;
    diag_error(S->d, g->at, "%s, %s%s%" PRId64 ", is not a multiple of the MXFP8 block (%" PRId64 ")", g->op,
               g->origin ? g->origin->name : "", g->origin ? " = " : "", g->width, block);
    sema_note_origin(S, g->origin);
    diag_note(S->d, prec_at, "precision is mxfp8 with block = %" PRId64 " here", block);
  }
}

void sema_train(sema *S, const ast_stmt *train) {
  moec_config *c = &S->cfg;
  ast_expr *k[K_COUNT] = {0};
  diag_span kat[K_COUNT];
  memset(kat, 0, sizeof kat);
  if (train) {
    for (int i = 0; i < train->body->n; i++) {
      ast_stmt *st = train->body->v[i];
      if (st->kind != ST_ASSIGN) {
        diag_error(S->d, st->span, "the train section holds settings, NAME = VALUE");
        continue;
      }
      int key = -1;
      for (int j = 0; j < K_COUNT; j++)
        if (!strcmp(st->name, train_keys[j])) key = j;
      if (key < 0) {
        int is_adam = 0;
        for (int j = 0; j < A_COUNT; j++)
          if (!strcmp(st->name, adamw_params[j])) is_adam = 1;
        const char *best = diag_suggest(st->name, train_keys, K_COUNT);
        if (is_adam) diag_error(S->d, st->name_span, "'%s' is an optimizer setting: write optimizer = adamw(%s = ...)", st->name, st->name);
        else if (!strcmp(st->name, "ep") || !strcmp(st->name, "dp") || !strcmp(st->name, "zero"))
          diag_error(S->d, st->name_span, "'%s' is a parallel setting: write parallel = { %s = ... }", st->name, st->name);
        else if (best) diag_error(S->d, st->name_span, "unknown train setting '%s'; did you mean '%s'?", st->name, best);
        else diag_error(S->d, st->name_span, "unknown train setting '%s'", st->name);
        continue;
      }
      if (k[key]) {
        diag_error(S->d, st->name_span, "duplicate definition of '%s'", st->name);
        diag_note(S->d, kat[key], "'%s' first defined here", st->name);
        continue;
      }
      k[key] = st->value;
      kat[key] = st->name_span;
    }
  }
  int bad = 0;
  ast_expr *x;
  c->batch = 1;
  c->steps = 1000;
  c->seed = 1;
  c->val_fraction = 0.01;
  c->dp = c->ep = 1;
  if ((x = pick(S, "data", k[K_DATA], &bad))) resolve_data(S, x);
  if ((x = pick(S, "batch", k[K_BATCH], &bad))) t_int(S, x, "batch", 1, 1 << 20, &c->batch);
  if ((x = pick(S, "steps", k[K_STEPS], &bad))) t_int(S, x, "steps", 1, INT32_MAX, &c->steps);
  if ((x = pick(S, "seed", k[K_SEED], &bad))) t_int(S, x, "seed", 0, INT64_MAX, &c->seed);
  /* seq: train's, or the model's (--set seq changes both) */
  c->seq = 0;
  int seq_ok = 0;
  if ((x = pick(S, "seq", k[K_SEQ], &bad))) {
    seq_ok = !t_int(S, x, "seq", 2, SEMA_MAX_DIM, &c->seq);
  } else {
    sema_var *ms = NULL;
    for (int i = S->n_vars - 1; i >= 0 && !ms; i--)
      if (!strcmp(S->vars[i]->name, "seq") && S->vars[i]->is_const) ms = S->vars[i];
    if (ms && ms->val.ty == TY_INT) {
      c->seq = ms->val.i;
      seq_ok = 1;
      if (c->seq < 2 || c->seq > SEMA_MAX_DIM) {
        diag_span at = ms->from_set ? ms->set_span : ms->val.span;
        if (c->seq < 2) diag_error(S->d, at, "'seq' must be at least 2, got %" PRId64, c->seq);
        else diag_error(S->d, at, "'seq' must be at most %" PRId64 ", got %" PRId64, SEMA_MAX_DIM, c->seq);
        seq_ok = 0;
      }
    } else if (ms && ms->val.ty != TY_ERROR) {
      diag_error(S->d, ms->val.span, "'seq' must be an integer, got %s", ast_type_name(ms->val.ty));
    } else if (!ms && !bad) {
      diag_error(S->d, S->model_at, "no sequence length: define 'seq' in the model or in the train section");
    }
  }
  optimizer(S, k[K_OPTIMIZER] ? pick(S, NULL, k[K_OPTIMIZER], &bad) : NULL);
  diag_span prec_at = kat[K_PRECISION];
  ast_expr *pe = pick(S, "precision", k[K_PRECISION], &bad);
  if (pe && pe != k[K_PRECISION]) prec_at = pe->span;
  precision(S, pe, &prec_at);
  ast_expr *ep = NULL, *dp = NULL, *zero = NULL;
  parallel(S, k[K_PARALLEL], &ep, &dp, &zero);
  if ((x = pick(S, "ep", ep, &bad)) && !t_int(S, x, "ep", 1, 4096, &c->ep)) {
    if (S->have_router && c->experts % c->ep) {
      diag_error(S->d, x->span, "ep = %" PRId64 " does not divide experts (%" PRId64 ")", c->ep, c->experts);
      if (S->experts_origin) sema_note_origin(S, S->experts_origin);
      else diag_note(S->d, S->experts_span, "experts given here");
    } else if (!S->have_router && c->ep > 1) {
      diag_error(S->d, x->span, "ep = %" PRId64 " needs a model with experts", c->ep);
    }
  }
  if ((x = pick(S, "dp", dp, &bad))) t_int(S, x, "dp", 1, 1 << 20, &c->dp);
  if ((x = pick(S, "zero", zero, &bad))) t_bool(S, x, "zero", &c->zero);
  ast_expr *st = pick(S, "stride", k[K_STRIDE], &bad), *ov = pick(S, "overlap", k[K_OVERLAP], &bad);
  c->stride = c->seq;
  if (st && ov) {
    diag_error(S->d, ov->span, "give either stride or overlap, not both (stride = seq - overlap)");
  } else if (st && seq_ok) {
    if (!t_int(S, st, "stride", 1, INT64_MAX, &c->stride) && c->stride > c->seq) {
      diag_error(S->d, st->span, "'stride' must be at most seq (%" PRId64 "), got %" PRId64, c->seq, c->stride);
      c->stride = c->seq;
    }
  } else if (ov && seq_ok) {
    int64_t o = 0;
    if (!t_int(S, ov, "overlap", 0, INT64_MAX, &o)) {
      if (o >= c->seq) diag_error(S->d, ov->span, "'overlap' must be less than seq (%" PRId64 "), got %" PRId64, c->seq, o);
      else c->stride = c->seq - o;
    }
  }
  if ((x = pick(S, "val_fraction", k[K_VAL_FRACTION], &bad)) && !t_num(S, x, "val_fraction", &c->val_fraction))
    check_range(S, x, "val_fraction", c->val_fraction, 0, 0, 1, 1, "in [0, 1)");
  if ((x = pick(S, "val_every", k[K_VAL_EVERY], &bad))) t_int(S, x, "val_every", 0, INT32_MAX, &c->val_every);
  if ((x = pick(S, "rc_augment", k[K_RC_AUGMENT], &bad))) t_bool(S, x, "rc_augment", &c->rc_augment);

  /* tokens per step, and the largest activations */
  int64_t T;
  if (seq_ok && c->seq >= 2) {
    if (__builtin_mul_overflow(c->batch, c->seq, &T) || T > SEMA_MAX_DIM)
      diag_error(S->d, S->model_at, "batch * seq = %" PRId64 " * %" PRId64 " tokens per step is too many (the limit is %" PRId64 ")",
                 c->batch, c->seq, SEMA_MAX_DIM);
    else {
      int64_t widest = c->vocab > c->hidden ? c->vocab : c->hidden, n;
      for (int i = 0; i < S->n_gemms; i++)
        if (S->gemms[i].width > widest) widest = S->gemms[i].width;
      if (__builtin_mul_overflow(T, widest, &n) || n > SEMA_MAX_NUMEL)
        diag_error(S->d, S->model_at, "an activation of %" PRId64 " tokens x %" PRId64 " is too large", T, widest);
    }
  }
  if (c->precision == PREC_MXFP8) mxfp8_checks(S, prec_at);
}
