/* gpu_cudnn_attn_plan.c -- execution plans: the operation graph finalized, engine heuristics
 * (mode A, then the fallback mode), the first engine config that finalizes as a plan (or the
 * n-th, MOEC_CUDNN_CONFIG=n), and the cache of plans by shape (least recently used slot
 * replaced). */
#include "gpu_cudnn_attn_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The engine behind an engine config: its global index and whether cuDNN notes it as
 * non-deterministic (-1 / 0 when it cannot tell; debugging aids only). */
static void engine_info(plan_entry *p, void *cfg, int64_t *index, int *nondet) {
  *index = -1;
  *nondet = 0;
  char scratch[256];
  void *engine = cda_new_desc(p, CD_BACKEND_ENGINE_DESCRIPTOR, "engine of a config", scratch, sizeof scratch);
  int64_t n = 0;
  if (!engine || cda_api.GetAttribute(cfg, CD_ATTR_ENGINECFG_ENGINE, CD_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine) != 0)
    return;
  cda_api.GetAttribute(engine, CD_ATTR_ENGINE_GLOBAL_INDEX, CD_TYPE_INT64, 1, &n, index);
  int notes[16];
  if (cda_api.GetAttribute(engine, CD_ATTR_ENGINE_NUMERICAL_NOTE, CD_TYPE_NUMERICAL_NOTE, 16, &n, notes) == 0)
    for (int64_t i = 0; i < n && i < 16; i++)
      if (notes[i] == CD_NUMERICAL_NOTE_NONDETERMINISTIC) *nondet = 1;
}

static const char *heur_name(int mode) {
  return mode == CD_HEUR_MODE_A ? "A" : mode == CD_HEUR_MODE_FALLBACK ? "FALLBACK" : "INSTANT";
}

/* Heuristics of `mode` over graph og, then the first of its configs that finalizes as a plan. */
static int pick_plan(gpu_cudnn_attn *c, plan_entry *p, void *og, int mode, char *err, size_t errlen) {
  char what[64];
  snprintf(what, sizeof what, "engine heuristics (mode %s)", heur_name(mode));
  void *heur = cda_new_desc(p, CD_BACKEND_ENGINEHEUR_DESCRIPTOR, what, err, errlen);
  if (!heur || cda_set(heur, what, CD_ATTR_ENGINEHEUR_OPERATION_GRAPH, CD_TYPE_BACKEND_DESCRIPTOR, 1, &og, err, errlen) ||
      cda_set(heur, what, CD_ATTR_ENGINEHEUR_MODE, CD_TYPE_HEUR_MODE, 1, &mode, err, errlen) || cda_fin(heur, what, err, errlen))
    return -1;
  int64_t count = 0;
  cd_status st = cda_api.GetAttribute(heur, CD_ATTR_ENGINEHEUR_RESULTS, CD_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
  if (st != CD_STATUS_SUCCESS)
    return cda_fail_status(st, err, errlen, "cudnnBackendGetAttribute(%s, CUDNN_ATTR_ENGINEHEUR_RESULTS count)", what);
  cda_dbg("heuristics mode %s: %lld engine configs", heur_name(mode), (long long)count);
  if (count < 1) return snprintf(err, errlen, "cuDNN: %s found no engine for the graph", what), -1;
  if (count > 64) count = 64;
  void *cfgs[64];
  for (int64_t i = 0; i < count; i++)
    if (!(cfgs[i] = cda_new_desc(p, CD_BACKEND_ENGINECFG_DESCRIPTOR, "an engine config", err, errlen))) return -1;
  int64_t got = 0;
  st = cda_api.GetAttribute(heur, CD_ATTR_ENGINEHEUR_RESULTS, CD_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs);
  if (st != CD_STATUS_SUCCESS)
    return cda_fail_status(st, err, errlen, "cudnnBackendGetAttribute(%s, CUDNN_ATTR_ENGINEHEUR_RESULTS)", what);
  /* MOEC_CUDNN_CONFIG=n takes the n-th config that finalizes (0, the default: the heuristics'
     first), or the last that does where fewer do: to time the engines side by side */
  const char *want_s = getenv("MOEC_CUDNN_CONFIG");
  const long want = want_s ? strtol(want_s, NULL, 10) : 0;
  long ok = 0;
  char first_err[1024] = "";
  for (int64_t i = 0; i < got && i < count; i++) {
    int64_t engine;
    int nondet;
    engine_info(p, cfgs[i], &engine, &nondet);
    char pw_what[96];
    snprintf(pw_what, sizeof pw_what, "execution plan (config %lld, engine %lld)", (long long)i, (long long)engine);
    char e[1024] = "";
    void *plan = cda_new_desc(p, CD_BACKEND_EXECUTION_PLAN_DESCRIPTOR, pw_what, e, sizeof e);
    if (plan) {
      if (cda_api.SetAttribute(plan, CD_ATTR_EXECUTION_PLAN_HANDLE, CD_TYPE_HANDLE, 1, &c->handle) != 0)
        cda_dbg("%s: setting CUDNN_ATTR_EXECUTION_PLAN_HANDLE refused (deprecated); going on", pw_what);
      if (cda_set(plan, pw_what, CD_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CD_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i], e,
              sizeof e) == 0 &&
          cda_fin(plan, pw_what, e, sizeof e) == 0) {
        int64_t ws = 0, n = 0;
        st = cda_api.GetAttribute(plan, CD_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CD_TYPE_INT64, 1, &n, &ws);
        if (st != CD_STATUS_SUCCESS)
          return cda_fail_status(st, err, errlen, "cudnnBackendGetAttribute(%s, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)",
                             pw_what);
        p->plan = plan;
        p->workspace = ws;
        p->engine = engine;
        p->nondeterministic = nondet;
        cda_dbg("plan: config %lld of mode %s, engine %lld%s, workspace %lld bytes%s", (long long)i, heur_name(mode),
            (long long)engine, nondet ? " (non-deterministic)" : "", (long long)ws, ok < want ? " (passed over)" : "");
        if (ok++ == want) return 0;
        continue;
      }
    }
    cda_dbg("config %lld (engine %lld) refused: %s", (long long)i, (long long)engine, e);
    if (!first_err[0]) snprintf(first_err, sizeof first_err, "%s", e);
  }
  if (ok) return 0; /* fewer than MOEC_CUDNN_CONFIG + 1 finalize: the last that did */
  snprintf(err, errlen, "cuDNN: no engine config of %s finalizes (%lld tried); the first refusal: %s", what,
           (long long)got, first_err);
  return -1;
}

static int build_plan(gpu_cudnn_attn *c, plan_entry *p, int bwd, const gpu_cudnn_shape *s, char *err, size_t errlen) {
  ca_graph g;
  cda_build_graph(&g, bwd, s);
  if (cda_check_graph(&g, s, err, errlen)) return -1;
  cda_dbg("building the %s graph: B %lld seq %lld heads %lld kv_heads %lld hd %lld %s (cuDNN %zu)",
      bwd ? "backward" : "forward", (long long)s->B, (long long)s->seq, (long long)s->nh, (long long)s->nkv,
      (long long)s->hd, s->causal ? "causal" : "full", c->version);
  void *td[MAX_TENSORS], *ops[MAX_OPS];
  char line[512];
  for (int i = 0; i < g.nt; i++) {
    cda_tensor_line(&g.t[i], line, sizeof line);
    cda_dbg("%s", line);
    if (cda_make_tensor(p, &g.t[i], &td[i], err, errlen)) return -1;
  }
  for (int i = 0; i < g.nop; i++) {
    cda_op_line(&g, i, line, sizeof line);
    cda_dbg("%s", line);
    if (cda_make_op(p, &g, i, td, &ops[i], err, errlen)) return -1;
  }
  const char *what = bwd ? "operation graph (attention backward)" : "operation graph (attention forward)";
  void *og = cda_new_desc(p, CD_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what, err, errlen);
  if (!og || cda_set(og, what, CD_ATTR_OPERATIONGRAPH_OPS, CD_TYPE_BACKEND_DESCRIPTOR, g.nop, ops, err, errlen)) return -1;
  if (cda_api.SetAttribute(og, CD_ATTR_OPERATIONGRAPH_HANDLE, CD_TYPE_HANDLE, 1, &c->handle) != 0)
    cda_dbg("%s: setting CUDNN_ATTR_OPERATIONGRAPH_HANDLE refused (deprecated); going on", what);
  if (cda_fin(og, what, err, errlen)) return -1;
  cda_dbg("%s finalized: %d tensors, %d operations", what, g.nt, g.nop);
  char err_a[1024];
  if (pick_plan(c, p, og, CD_HEUR_MODE_A, err_a, sizeof err_a) == 0) return 0;
  cda_dbg("heuristics mode A gave no plan (%s); trying the fallback mode", err_a);
  if (pick_plan(c, p, og, CD_HEUR_MODE_FALLBACK, err, errlen) == 0) return 0;
  size_t n = strlen(err);
  if (n < errlen) snprintf(err + n, errlen - n, "; heuristics mode A: %s", err_a);
  return -1;
}

static int same_shape(const gpu_cudnn_shape *a, const gpu_cudnn_shape *b) {
  return a->B == b->B && a->seq == b->seq && a->nh == b->nh && a->nkv == b->nkv && a->hd == b->hd &&
         (a->causal != 0) == (b->causal != 0);
}

plan_entry *cda_get_plan(gpu_cudnn_attn *c, int bwd, const gpu_cudnn_shape *s, char *err, size_t errlen) {
  plan_entry *e = NULL;
  for (int i = 0; i < PLAN_SLOTS; i++)
    if (c->plans[i].used && c->plans[i].bwd == bwd && same_shape(&c->plans[i].s, s)) {
      c->plans[i].used = ++c->plan_clock;
      return &c->plans[i];
    }
  e = &c->plans[0];
  for (int i = 1; i < PLAN_SLOTS; i++)
    if (c->plans[i].used < e->used) e = &c->plans[i];
  if (e->used) {
    if (gpu_sync(c->g) != 0) return snprintf(err, errlen, "%s", gpu_error(c->g)), NULL;
    cda_plan_release(e);
  }
  if (build_plan(c, e, bwd, s, err, errlen)) {
    cda_plan_release(e);
    return NULL;
  }
  e->bwd = bwd;
  e->s = *s;
  e->used = ++c->plan_clock;
  return e;
}

int gpu_cudnn_attn_bwd_nondeterministic(const gpu_cudnn_attn *c, const gpu_cudnn_shape *s) {
  for (int i = 0; c && i < PLAN_SLOTS; i++)
    if (c->plans[i].used && c->plans[i].bwd && same_shape(&c->plans[i].s, s)) return c->plans[i].nondeterministic;
  return -1;
}
