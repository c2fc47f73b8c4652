/* gpu_exec_stacks.c -- the stacked expert weights (gpu_views.h, VIEW_STACKED): the bf16 copies
 * of a stack's parameters laid out as the stack, or, under the weight-tile recipe on cuBLASLt,
 * the FP8 squares AdamW writes in their place (dev_stack; gpu_exec_int.h). */
#include <stdlib.h>
#include <string.h>

#include "gpu_exec_int.h"

/* ---- stacks kept as squares (dev_stack.squares) ---- */
/* Stack sk's squares made from the weights as they are (the first step, or after an upload). */
int squares_refresh(gx *x, int id, dev_stack *sk) {
  if (sk->fresh) return 0;
  if (ck(x, id, rt_cuda_adamw_squares(KX, sk->tab, (int)(sk->n / sk->E), sk->E, sk->A, sk->B, CG_DT_F32, 0, 0, NULL, 0.0,
                                      sk->block, sk->q[0], sk->blk[0], sk->q[1], sk->blk[1])))
    return -1;
  sk->fresh = 1;
  return 0;
}

/* Entry j of t (parameter `param`) as part `part` of expert e of stack sk: its gradient a
 * window of the stacked gradient g0 (E, A, B) of dtype gt. */
static int squares_grad_fits(const dev_stack *sk, const rt_cuda_adamw_tensor *t, cg_dtype gt, gpu_ptr g0, int64_t e,
                             int64_t c0, int64_t w) {
  const rt_cuda_adamw_win *wn = &t->win;
  const int64_t es = gt == CG_DT_BF16 ? 2 : 4;
  return t->g == g0 + (gpu_ptr)((e * sk->A * sk->B + c0) * es) &&
         ((wn->g_cols == w && wn->g_ld == sk->B) || (wn->g_cols == wn->g_ld && w == sk->B));
}

/* Which entries of the AdamW run t (n entries, from node id) the stacks kept as squares update:
 * stack_of[j] = s when stack s has all its parameters in the run, with one weight decay and
 * their gradients windows of one stacked gradient (squares_update then updates them all in one
 * launch, first[s] its first parameter's entry), else -1. A stack only partly so keeps its
 * entries and its squares go stale (its next quantize remakes them from the weights). */
int squares_plan(gx *x, int id, cg_dtype gt, const rt_cuda_adamw_tensor *t, int n, int *stack_of, int *first) {
  gpu_runtime *rt = x->rt;
  for (int j = 0; j < n; j++) stack_of[j] = -1;
  int *at = NULL; /* (ps->n) a parameter's entry in t, -1: none */
  for (int s = 0; s < rt->n_stacks; s++) {
    dev_stack *sk = &rt->stacks[s];
    first[s] = -1;
    if (!sk->squares) continue;
    if (!at) {
      if (!(at = malloc((size_t)rt->ps->n * sizeof *at))) return fail(x, id, "out of host memory");
      for (int i = 0; i < rt->ps->n; i++) at[i] = -1;
      for (int j = 0; j < n; j++)
        for (int i = 0; i < rt->ps->n; i++)
          if (rt->dp[i].w == t[j].p) at[i] = j;
    }
    int in_run = 0, all = 1;
    const int64_t parts = sk->n / sk->E;
    const int j00 = at[sk->params[0]];
    for (int64_t part = 0, c0 = 0; part < parts; c0 += rt->ps->p[sk->params[part * sk->E]].numel / sk->A, part++)
      for (int64_t e = 0; e < sk->E; e++) {
        const int j = at[sk->params[part * sk->E + e]];
        in_run |= j >= 0;
        all &= j >= 0 && j00 >= 0 && stack_of[j] < 0 && t[j].wd == t[j00].wd && t[j00].g % 16 == 0 &&
               squares_grad_fits(sk, &t[j], gt, t[j00].g, e, c0, rt->ps->p[sk->params[part * sk->E + e]].numel / sk->A);
      }
    if (!in_run) continue;
    if (!all) {
      sk->fresh = 0;
      continue;
    }
    first[s] = j00;
    for (int k = 0; k < sk->n; k++) stack_of[at[sk->params[k]]] = s;
  }
  free(at);
  return 0;
}

/* Stack s's weights, moments and squares updated in one launch (t0: its first parameter's
 * entry, whose gradient starts the stacked one). */
int squares_update(gx *x, int id, cg_dtype gt, const rt_cuda_adamw_hp *hp, gpu_ptr gnorm, int s,
                   const rt_cuda_adamw_tensor *t0) {
  dev_stack *sk = &x->rt->stacks[s];
  if (ck(x, id, rt_cuda_adamw_squares(KX, sk->tab, (int)(sk->n / sk->E), sk->E, sk->A, sk->B, gt, t0->g, gnorm, hp,
                                      t0->wd, sk->block, sk->q[0], sk->blk[0], sk->q[1], sk->blk[1])))
    return -1;
  sk->fresh = 1;
  for (int k = 0; k < sk->n; k++) x->rt->dp[sk->params[k]].wb_fresh = 0; /* a copy of its own, if another graph made one, is stale */
  return 0;
}

/* Whether stack id (VIEW_STACKED) can be kept as squares (dev_stack.squares): the weight-tile
 * recipe (cuBLASLt's block mode, or the wgmma kernel's squares), every reader a weight
 * quantize in squares that writes its packed form only, whole squares in every part. MOEC_SQUARES=0 keeps bf16 copies (for side-by-side
 * timing). On the H200 a genos_1b gate_up stack's step: squares 0.54 ms against 0.62 for
 * AdamW + copies + the two quantizes (f32 moments); with bf16 moments 0.44 against 0.46 for
 * AdamW alone + the two quantizes (the copies' own write not counted). */
static int squares_ok(gx *x, int id) {
  const char *env = getenv("MOEC_SQUARES");
  const ir_node *st = N(id);
  const int64_t E = st->type.dims[0];
  /* ZeRO-1's adamw updates shards and writes no squares (the all_gather makes copies stale) */
  if ((env && strcmp(env, "0") == 0) || st->type.dims[1] % 128 || st->n_in % E || (x->g->cfg.zero && x->g->cfg.ep * x->g->cfg.dp > 1))
    return 0;
  for (int j = 0; j < st->n_in; j += (int)E)
    if (COLS(st->in[j]) % 128) return 0;
  int readers = 0;
  for (int r = 0; r < x->g->n_nodes; r++)
    for (int k = 0; k < N(r)->n_in; k++) {
      if (N(r)->in[k] != id) continue;
      if (N(r)->op != OP_MXFP8_QUANTIZE || !ir_get_int(N(r), "tile", 0) || x->fp8.values[r] ||
          (x->fp8.kind[r] != FP8_W_IN && x->fp8.kind[r] != FP8_W_OUT))
        return 0;
      readers++;
    }
  return readers > 0;
}

/* Stack sk (stack node id) kept as squares: both orientations, their scales, the parameters'
 * table; no bf16 copies. */
static int squares_alloc(gx *x, int id, dev_stack *sk, char *err, size_t errlen) {
  gpu_runtime *rt = x->rt;
  const ir_node *st = N(id);
  sk->E = st->type.dims[0], sk->A = st->type.dims[1], sk->B = st->type.dims[2];
  for (int r = 0; r < x->g->n_nodes && !sk->block; r++)
    if (N(r)->op == OP_MXFP8_QUANTIZE && N(r)->in[0] == id) sk->block = (int)ir_get_int(N(r), "block", 32);
  const size_t qb = (size_t)(sk->E * sk->A * sk->B);
  rt_cuda_sq_param *tab = malloc((size_t)sk->n * sizeof *tab);
  if (!tab) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  for (int64_t part = 0, c0 = 0; part < sk->n / sk->E; part++) {
    const int64_t w = COLS(st->in[part * sk->E]);
    for (int64_t e = 0; e < sk->E; e++) {
      dev_param *dp = &rt->dp[sk->params[part * sk->E + e]];
      tab[part * sk->E + e] = (rt_cuda_sq_param){dp->w, dp->m, dp->v, c0, w};
      dp->squares = (int)(sk - rt->stacks) + 1;
    }
    c0 += w;
  }
  const char *what = "the expert weights' FP8 squares";
  int rc = gpu_alloc(rt->g, &sk->q[0], qb, what) || gpu_alloc(rt->g, &sk->q[1], qb, what) ||
           gpu_alloc(rt->g, &sk->blk[0], (size_t)(sk->E * rt_cuda_tile_blk_floats(sk->A, sk->B)) * 4, what) ||
           gpu_alloc(rt->g, &sk->blk[1], (size_t)(sk->E * rt_cuda_tile_blk_floats(sk->B, sk->A)) * 4, what) ||
           gpu_alloc(rt->g, &sk->tab, (size_t)sk->n * sizeof *tab, what) ||
           gpu_upload(rt->g, sk->tab, tab, (size_t)sk->n * sizeof *tab);
  free(tab);
  if (rc) {
    snprintf(err, errlen, "%s", gpu_error(rt->g));
    return -1;
  }
  sk->squares = 1;
  return 0;
}

/* The stack last registered for node id, whose storage could not be made, taken back (no later
 * graph may share it); -1. */
static int stack_unmake(gx *x, int id) {
  gpu_runtime *rt = x->rt;
  dev_stack *sk = &rt->stacks[--rt->n_stacks];
  for (int j = 0; j < sk->n; j++) rt->dp[sk->params[j]].squares = 0;
  gpu_free(rt->g, sk->p);
  for (int k = 0; k < 2; k++) gpu_free(rt->g, sk->q[k]), gpu_free(rt->g, sk->blk[k]);
  gpu_free(rt->g, sk->tab);
  free(sk->params);
  x->stack_of[id] = -1;
  return -1;
}

/* Storage for the stacked views (gpu_views.h, VIEW_STACKED): the stack's parameters get their
 * bf16 copies as windows of one buffer laid out as the stack, which every graph with the same
 * stack shares -- or, where squares_ok, the stack is kept as squares. A stack some of whose
 * parameters already have a copy of another layout (or of their own), or that this graph
 * cannot read as the squares another graph keeps, stays a copy, its casts values. */
int plan_stacks(gx *x, char *err, size_t errlen) {
  gpu_runtime *rt = x->rt;
  const ir_graph *g = x->g;
  const char *env = getenv("MOEC_STACK_VIEWS"); /* 0: stacks copy (for side-by-side timing) */
  const int off = env && strcmp(env, "0") == 0;
  for (int id = 0; id < g->n_nodes; id++) {
    x->stack_of[id] = -1;
    if (x->view[id] != VIEW_STACKED && !(off && x->view[id] == VIEW_STRIDED)) continue;
    if (off) {
      for (int j = 0; x->view[id] == VIEW_STACKED && j < g->nodes[id].n_in; j++) x->view[g->nodes[id].in[j]] = VIEW_NONE;
      x->view[id] = VIEW_NONE;
      continue;
    }
    const ir_node *st = &g->nodes[id];
    const int n = st->n_in;
    const int64_t E = st->type.dims[0], in = st->type.dims[1], C = st->type.dims[2];
    int *pi = malloc((size_t)n * sizeof *pi);
    dev_stack *ns = realloc(rt->stacks, (size_t)(rt->n_stacks + 1) * sizeof *ns);
    if (!pi || !ns) {
      free(pi);
      snprintf(err, errlen, "out of host memory");
      return -1;
    }
    rt->stacks = ns;
    for (int j = 0; j < n; j++) pi[j] = x->param_index[g->nodes[st->in[j]].in[0]];
    int shared = -1, free_copies = n % E == 0;
    for (int s = 0; s < rt->n_stacks; s++)
      if (rt->stacks[s].n == n && memcmp(rt->stacks[s].params, pi, (size_t)n * sizeof *pi) == 0) shared = s;
    for (int j = 0; j < n; j++) /* (a parameter is in one stack kept as squares at most) */
      free_copies &= !rt->dp[pi[j]].wb && !rt->dp[pi[j]].squares && rt->ps->p[pi[j]].numel == in * COLS(st->in[j]);
    const int can_square = squares_ok(x, id), squares = free_copies && can_square;
    /* a stack another graph keeps as squares is shared if this graph can read squares, else its
       casts become copies of their own */
    if (shared >= 0 && rt->stacks[shared].squares && !can_square) shared = -1, free_copies = 0;
    if (shared >= 0 || !free_copies) {
      if (shared < 0) /* a copy after all */
        for (int j = 0; j < n; j++) x->view[st->in[j]] = VIEW_NONE;
      if (shared < 0) x->view[id] = VIEW_NONE;
      x->stack_of[id] = shared;
      free(pi);
      continue;
    }
    dev_stack *sk = &rt->stacks[rt->n_stacks];
    memset(sk, 0, sizeof *sk);
    sk->params = pi;
    sk->n = n;
    x->stack_of[id] = rt->n_stacks++;
    if (squares) {
      if (squares_alloc(x, id, sk, err, errlen) != 0) return stack_unmake(x, id);
      continue;
    }
    if (gpu_alloc(rt->g, &sk->p, (size_t)(E * in * C) * 2, "the stacked bf16 expert weights") != 0) {
      snprintf(err, errlen, "%s", gpu_error(rt->g));
      return stack_unmake(x, id);
    }
    /* operand p*E + e is part p of expert e: columns c0 .. c0+w of its rows */
    for (int64_t part = 0, c0 = 0; part < n / E; part++) {
      const int64_t w = COLS(st->in[part * E]);
      for (int64_t e = 0; e < E; e++) {
        dev_param *dp = &rt->dp[pi[part * E + e]];
        dp->wb = sk->p + (gpu_ptr)((size_t)(e * in * C + c0) * 2);
        dp->wb_cols = w;
        dp->wb_ld = C;
        dp->wb_fresh = 0;
      }
      c0 += w;
    }
  }
  return 0;
}

int gpu_exec_squares(const gpu_exec *x) {
  int n = 0;
  for (int id = 0; id < x->g->n_nodes; id++) n += x->stack_of[id] >= 0 && x->rt->stacks[x->stack_of[id]].squares;
  return n;
}

/* Stack sk's orientation tr against rt_cuda_mxfp8_quantize_tiles of its weights rounded to
 * bf16 (laid out as the stack in stk), byte for byte and scale for scale; 1: they match. */
static int squares_match(gpu_runtime *rt, const dev_stack *sk, gpu_ptr stk, int tr, gpu_ptr q, gpu_ptr codes, gpu_ptr blk,
                         uint8_t *hq, uint8_t *hs, float *hb, float *hbs, char *err, size_t errlen) {
  const int64_t nq = sk->E * sk->A * sk->B, N = tr ? sk->B : sk->A, K = tr ? sk->A : sk->B,
                nb = sk->E * rt_cuda_tile_blk_floats(N, K), ldk = (K / 128 + 3) / 4 * 4;
  if (rt_cuda_mxfp8_quantize_tiles(rt->k, CG_DT_BF16, stk, 0, sk->E, sk->A, sk->B, sk->block, tr, q, codes, blk) ||
      gpu_download(rt->g, hq, q, (size_t)nq) || gpu_download(rt->g, hs, sk->q[tr], (size_t)nq) ||
      gpu_download(rt->g, hb, blk, (size_t)nb * 4) || gpu_download(rt->g, hbs, sk->blk[tr], (size_t)nb * 4)) {
    snprintf(err, errlen, "%s", rt_cuda_error(rt->k)[0] ? rt_cuda_error(rt->k) : gpu_error(rt->g));
    return -1;
  }
  int same = memcmp(hq, hs, (size_t)nq) == 0;
  for (int64_t i = 0; i < nb; i++) /* the rows' padding to 4 is written by neither */
    if (i % ldk < K / 128 && memcmp(&hb[i], &hbs[i], 4) != 0) same = 0;
  return same;
}

int gpu_exec_check_squares(gpu_exec *x, char *err, size_t errlen) {
  gpu_runtime *rt = x->rt;
  int checked = 0;
  if (update_settle(rt)) { /* the update may still write them */
    snprintf(err, errlen, "%s", gpu_error(rt->g));
    return -1;
  }
  for (int s = 0; s < rt->n_stacks; s++) {
    const dev_stack *sk = &rt->stacks[s];
    if (!sk->squares || !sk->fresh) continue;
    const int64_t nq = sk->E * sk->A * sk->B, nb = sk->E * rt_cuda_tile_blk_floats(sk->A, sk->B) +
                                                 sk->E * rt_cuda_tile_blk_floats(sk->B, sk->A);
    gpu_ptr stk = 0, q = 0, codes = 0, blk = 0;
    uint8_t *hq = malloc((size_t)nq), *hs = malloc((size_t)nq);
    float *hb = malloc((size_t)nb * 4), *hbs = malloc((size_t)nb * 4);
    int rc = !hq || !hs || !hb || !hbs ? (snprintf(err, errlen, "out of host memory"), -1) : 0;
    if (rc == 0 && (gpu_alloc(rt->g, &stk, (size_t)nq * 2, "a squares check") || gpu_alloc(rt->g, &q, (size_t)nq, "a squares check") ||
                    gpu_alloc(rt->g, &codes, (size_t)nq, "a squares check") || gpu_alloc(rt->g, &blk, (size_t)nb * 4, "a squares check")))
      rc = (snprintf(err, errlen, "%s", gpu_error(rt->g)), -1);
    for (int64_t part = 0, c0 = 0; rc == 0 && part < sk->n / sk->E; part++) { /* the weights, rounded, as the stack */
      const int64_t w = rt->ps->p[sk->params[part * sk->E]].numel / sk->A;
      for (int64_t e = 0; rc == 0 && e < sk->E; e++)
        if (rt_cuda_copy_cols(rt->k, CG_DT_F32, CG_DT_BF16, rt->dp[sk->params[part * sk->E + e]].w, w, 0,
                              stk + (gpu_ptr)((e * sk->A * sk->B + c0) * 2), sk->B, 0, sk->A, w))
          rc = (snprintf(err, errlen, "%s", rt_cuda_error(rt->k)), -1);
      c0 += w;
    }
    for (int tr = 0; rc == 0 && tr < 2; tr++) {
      int m = squares_match(rt, sk, stk, tr, q, codes, blk, hq, hs, hb, hbs, err, errlen);
      if (m == 0) snprintf(err, errlen, "stack %d of %lld x %lld x %lld: the %s squares are not those of the weights", s,
                           (long long)sk->E, (long long)sk->A, (long long)sk->B, tr ? "transposed" : "row");
      rc = m == 1 ? 0 : -1;
    }
    gpu_free(rt->g, stk), gpu_free(rt->g, q), gpu_free(rt->g, codes), gpu_free(rt->g, blk);
    free(hq), free(hs), free(hb), free(hbs);
    if (rc) return -1;
    checked++;
  }
  return checked;
}

