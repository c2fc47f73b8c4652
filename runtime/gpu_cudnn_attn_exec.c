/* gpu_cudnn_attn_exec.c -- execution: the variant pack binding each graph's buffers and
 * scalars, the workspace and scratch buffers grown as needed, the forward and backward calls,
 * and the stats kept from a forward for its backward. */
#include "gpu_cudnn_attn_int.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

/* Grows a device buffer; waits for the stream first, since queued work may use the old one. */
static int grow(gpu_cudnn_attn *c, gpu_ptr *p, size_t *cap, size_t bytes, const char *what, char *err, size_t errlen) {
  if (*cap >= bytes) return 0;
  if (*p && gpu_sync(c->g) != 0) return snprintf(err, errlen, "%s", gpu_error(c->g)), -1;
  gpu_free(c->g, *p);
  *p = 0;
  *cap = 0;
  if (gpu_alloc(c->g, p, bytes, what) != 0) return snprintf(err, errlen, "%s", gpu_error(c->g)), -1;
  *cap = bytes;
  return 0;
}

static void *dptr(gpu_ptr p) { return (void *)(uintptr_t)p; }

static int execute(gpu_cudnn_attn *c, plan_entry *p, const gpu_ptr bind[BIND_COUNT], char *err, size_t errlen) {
  ca_graph g;
  cda_build_graph(&g, p->bwd, &p->s);
  const float scale = (float)(1.0 / sqrt((double)p->s.hd)), one = 1.0f;
  /* cudnn-frontend masks with -inf from 9.10 on, with the lowest float before */
  const float neg_inf = c->version >= 91000 ? -INFINITY : -FLT_MAX;
  int64_t uids[MAX_TENSORS];
  void *ptrs[MAX_TENSORS];
  int n = 0;
  for (int i = 0; i < g.nt; i++) {
    const ca_tensor *t = &g.t[i];
    if (t->is_virtual) continue;
    uids[n] = t->uid;
    ptrs[n] = t->bind == BIND_SCALE ? (void *)&scale
              : t->bind == BIND_ONE ? (void *)&one
              : t->bind == BIND_NEG_INF ? (void *)&neg_inf
                                        : dptr(bind[t->bind]);
    if (!ptrs[n]) return snprintf(err, errlen, "cuDNN attention: no buffer for %s", cda_bind_names[t->bind]), -1;
    n++;
  }
  size_t ws_bytes = p->workspace > 0 ? (size_t)p->workspace : 0;
  if (grow(c, &c->workspace, &c->cap_workspace, ws_bytes < 256 ? 256 : ws_bytes, "the cuDNN attention workspace", err,
           errlen))
    return -1;
  void *ws = dptr(c->workspace);
  void *vp = NULL;
  const char *what = p->bwd ? "variant pack (attention backward)" : "variant pack (attention forward)";
  cd_status st = cda_api.CreateDescriptor(CD_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  if (st != CD_STATUS_SUCCESS)
    return cda_fail_status(st, err, errlen, "cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)");
  int rc = cda_set(vp, what, CD_ATTR_VARIANT_PACK_UNIQUE_IDS, CD_TYPE_INT64, n, uids, err, errlen) ||
           cda_set(vp, what, CD_ATTR_VARIANT_PACK_DATA_POINTERS, CD_TYPE_VOID_PTR, n, ptrs, err, errlen) ||
           cda_set(vp, what, CD_ATTR_VARIANT_PACK_WORKSPACE, CD_TYPE_VOID_PTR, 1, &ws, err, errlen) ||
           cda_fin(vp, what, err, errlen);
  if (!rc) {
    cda_dbg("execute %s: B %lld seq %lld heads %lld/%lld hd %lld, %d buffers, workspace %zu bytes",
        p->bwd ? "backward" : "forward", (long long)p->s.B, (long long)p->s.seq, (long long)p->s.nh,
        (long long)p->s.nkv, (long long)p->s.hd, n, ws_bytes);
    gpu_note_work(c->g, p->bwd ? "cudnn attention backward" : "cudnn attention forward");
    const double t0 = gpu_clock_s();
    st = cda_api.Execute(c->handle, p->plan, vp);
    gpu_note_issue(c->g, t0);
    if (st != CD_STATUS_SUCCESS)
      rc = cda_fail_status(st, err, errlen, "cudnnBackendExecute(attention %s, engine %lld)",
                       p->bwd ? "backward" : "forward", (long long)p->engine);
  }
  cda_api.DestroyDescriptor(vp);
  if (!rc && cda_debug_on() && gpu_sync(c->g) != 0)
    return snprintf(err, errlen, "cuDNN attention %s: %s", p->bwd ? "backward" : "forward", gpu_error(c->g)), -1;
  return rc ? -1 : 0;
}

static int check_call(const gpu_cudnn_attn *c, const gpu_cudnn_shape *s, gpu_ptr ptrs_or, char *err, size_t errlen) {
  if (cda_valid_shape(s, err, errlen)) return -1;
  if (!gpu_cudnn_attn_supports(c, s->hd)) {
    snprintf(err, errlen, "cuDNN attention: head dim %lld (64 and 128 are supported)", (long long)s->hd);
    return -1;
  }
  if (ptrs_or & 15) return snprintf(err, errlen, "cuDNN attention: a buffer is not 16-byte aligned"), -1;
  return 0;
}

int gpu_cudnn_attn_fwd(gpu_cudnn_attn *c, const gpu_cudnn_shape *s, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out,
                       gpu_ptr stats, char *err, size_t errlen) {
  if (check_call(c, s, q | k | v | out | stats, err, errlen)) return -1;
  plan_entry *p = cda_get_plan(c, 0, s, err, errlen);
  if (!p) return -1;
  gpu_ptr bind[BIND_COUNT] = {0};
  bind[BIND_Q] = q, bind[BIND_K] = k, bind[BIND_V] = v, bind[BIND_O] = out, bind[BIND_STATS] = stats;
  return execute(c, p, bind, err, errlen);
}

int gpu_cudnn_attn_bwd(gpu_cudnn_attn *c, const gpu_cudnn_shape *s, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out,
                       gpu_ptr dout, gpu_ptr stats, gpu_ptr packed, char *err, size_t errlen) {
  if (check_call(c, s, q | k | v | out | dout | stats | packed, err, errlen)) return -1;
  plan_entry *p = cda_get_plan(c, 1, s, err, errlen);
  if (!p) return -1;
  const size_t rows = (size_t)(s->B * s->nh * s->seq);
  if (grow(c, &c->ssum, &c->cap_ssum, rows * 4, "attention row statistics (cuDNN)", err, errlen) ||
      grow(c, &c->dq_accum, &c->cap_dq_accum, rows * (size_t)s->hd * 4, "attention dq accumulator (cuDNN)", err,
           errlen))
    return -1;
  /* before 9.6 the caller zeroes dQ_accum (cudnn-frontend does); from 9.6 cuDNN does */
  if (c->version < 90600 && gpu_memset32(c->g, c->dq_accum, 0, rows * (size_t)s->hd) != 0)
    return snprintf(err, errlen, "%s", gpu_error(c->g)), -1;
  gpu_cudnn_view vw[GPU_CUDNN_NVIEWS];
  gpu_cudnn_attn_views(s, vw);
  gpu_ptr bind[BIND_COUNT] = {0};
  bind[BIND_Q] = q, bind[BIND_K] = k, bind[BIND_V] = v, bind[BIND_O] = out, bind[BIND_DO] = dout;
  bind[BIND_STATS] = stats;
  bind[BIND_DQ] = packed + (gpu_ptr)vw[GPU_CUDNN_DQ].offset * 2;
  bind[BIND_DK] = packed + (gpu_ptr)vw[GPU_CUDNN_DK].offset * 2;
  bind[BIND_DV] = packed + (gpu_ptr)vw[GPU_CUDNN_DV].offset * 2;
  bind[BIND_SOFTMAX_SUM] = c->ssum;
  bind[BIND_DQ_ACCUM] = c->dq_accum;
  return execute(c, p, bind, err, errlen);
}

/* ---- the stats kept from a forward for its backward (gpu_rowstats.h) ---- */

static gpu_rowstats_key stats_key(const gpu_cudnn_shape *s, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out) {
  const gpu_rowstats_key key = {q, k, v, out, s->B, s->seq, s->nh, s->nkv, s->hd, s->causal != 0};
  return key;
}

int gpu_cudnn_attn_fwd_cached(gpu_cudnn_attn *c, const gpu_cudnn_shape *s, gpu_ptr q, gpu_ptr k, gpu_ptr v,
                              gpu_ptr out, char *err, size_t errlen) {
  if (check_call(c, s, q | k | v | out, err, errlen)) return -1;
  int fresh;
  const gpu_rowstats_key key = stats_key(s, q, k, v, out);
  gpu_ptr stats = gpu_rowstats_get(c->stats, &key, (size_t)(s->B * s->nh * s->seq) * 4, &fresh, err, errlen);
  if (!stats) return -1;
  if (gpu_cudnn_attn_fwd(c, s, q, k, v, out, stats, err, errlen) == 0) return 0;
  gpu_rowstats_drop(c->stats, &key);
  return -1;
}

int gpu_cudnn_attn_bwd_cached(gpu_cudnn_attn *c, const gpu_cudnn_shape *s, gpu_ptr q, gpu_ptr k, gpu_ptr v,
                              gpu_ptr out, gpu_ptr dout, gpu_ptr packed, char *err, size_t errlen) {
  if (check_call(c, s, q | k | v | out | dout | packed, err, errlen)) return -1;
  int fresh;
  const gpu_rowstats_key key = stats_key(s, q, k, v, out);
  gpu_ptr stats = gpu_rowstats_get(c->stats, &key, (size_t)(s->B * s->nh * s->seq) * 4, &fresh, err, errlen);
  if (!stats) return -1;
  if (fresh) { /* no forward of these buffers left its stats: recompute them */
    cda_dbg("backward with no cached stats: a forward into scratch first");
    const size_t bytes = (size_t)(s->B * s->seq * s->nh * s->hd) * 2;
    if (grow(c, &c->out_scratch, &c->cap_out, bytes, "attention output (recomputed, cuDNN)", err, errlen) ||
        gpu_cudnn_attn_fwd(c, s, q, k, v, c->out_scratch, stats, err, errlen)) {
      gpu_rowstats_drop(c->stats, &key);
      return -1;
    }
  }
  return gpu_cudnn_attn_bwd(c, s, q, k, v, out, dout, stats, packed, err, errlen);
}
