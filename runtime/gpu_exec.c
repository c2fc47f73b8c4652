/* gpu_exec.c -- the IR on one GPU, node by node: one exec function per op (the op table's
 * CUDA column), mirroring cpu_exec.c. Values live in device buffers from a size-class pool
 * and go back to it after their last use. The fusion passes' ops are in gpu_exec_grouped.c,
 * the stacked expert weights in gpu_exec_stacks.c (gpu_exec_int.h). */
#include "gpu_exec.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ep.h"
#include "cpu_kernels.h"
#include "errf.h"
#include "gpu_exec_int.h"

/* ---------------------------------------------------------------- the runtime */
/* The pool's backend: the loader's allocations, and what no tensor occupies told to it. */
static int pool_alloc(void *ctx, size_t bytes, uint64_t *p) { return gpu_alloc(ctx, p, bytes, "activations"); }
static void pool_release(void *ctx, uint64_t p) { gpu_free(ctx, p); }
static void pool_idle(void *ctx, ptrdiff_t delta) { gpu_note_idle(ctx, delta); }

gpu_runtime *gpu_runtime_new(rt_params *ps, const char *dump_dir, char *err, size_t errlen) {
  return gpu_runtime_new_on(ps, 0, dump_dir, err, errlen);
}

gpu_runtime *gpu_runtime_new_on(rt_params *ps, int ordinal, const char *dump_dir, char *err, size_t errlen) {
  gpu_runtime *rt = calloc(1, sizeof *rt);
  if (!rt) {
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  int n = 0;
  if (gpu_driver_load(err, errlen) != 0 || gpu_device_count(&n, err, errlen) != 0) goto fail;
  if (n < 1) {
    snprintf(err, errlen, "the NVIDIA driver sees no GPU; use --device cpu");
    goto fail;
  }
  if (ordinal < 0 || ordinal >= n) {
    snprintf(err, errlen, "GPU %d asked for, but %d GPU(s) are visible (CUDA_VISIBLE_DEVICES?)", ordinal, n);
    goto fail;
  }
  rt->upd.mode = -1; /* read at the first update */
  if (!(rt->g = gpu_open(ordinal, err, errlen))) goto fail;
  const gpu_pool_backend pb = {rt->g, pool_alloc, pool_release, pool_idle};
  if (!(rt->pool = gpu_pool_new(&pb))) {
    snprintf(err, errlen, "out of host memory");
    goto fail;
  }
  rt_cuda_opts ko;
  memset(&ko, 0, sizeof ko);
  ko.dump_dir = dump_dir;
  if (!(rt->k = rt_cuda_new(rt->g, &ko, err, errlen))) goto fail;
  if (!(rt->blas = gpu_blas_new(rt->g, err, errlen))) goto fail;
  if (!(rt->attn = gpu_attention_new(rt->k, rt->blas, err, errlen))) goto fail;
  const gpu_device_info *d = gpu_info(rt->g);
  snprintf(rt->device, sizeof rt->device, "%s (%s)", d->name, rt_cuda_arch(rt->k));
  rt->ps = ps;
  rt->dp = calloc((size_t)ps->n + 1, sizeof *rt->dp);
  if (!rt->dp) goto fail;
  for (int i = 0; i < ps->n; i++) {
    /* moments: this rank's ZeRO shard (mn values) or the whole */
    size_t bytes = (size_t)ps->p[i].numel * 4, mb = (size_t)(ps->p[i].mn ? ps->p[i].mn : 1) * (ps->moments_bf16 ? 2 : 4);
    if (gpu_alloc(rt->g, &rt->dp[i].w, bytes, "the weights") || gpu_alloc(rt->g, &rt->dp[i].m, mb, "the AdamW moments") ||
        gpu_alloc(rt->g, &rt->dp[i].v, mb, "the AdamW moments")) {
      snprintf(err, errlen, "%s", gpu_error(rt->g));
      goto fail;
    }
  }
  if (gpu_runtime_upload(rt, ps, err, errlen) != 0) goto fail;
  return rt;
fail:
  gpu_runtime_free(rt);
  return NULL;
}

void gpu_runtime_free(gpu_runtime *rt) {
  if (!rt) return;
  if (rt->g) update_free(rt), gpu_sync(rt->g);
  for (int i = 0; rt->dp && i < rt->ps->n; i++) {
    gpu_free(rt->g, rt->dp[i].w);
    gpu_free(rt->g, rt->dp[i].m);
    gpu_free(rt->g, rt->dp[i].v);
    if (rt->dp[i].wb && !rt->dp[i].wb_ld) gpu_free(rt->g, rt->dp[i].wb);
  }
  free(rt->dp);
  for (int i = 0; i < rt->n_stacks; i++) {
    dev_stack *sk = &rt->stacks[i];
    gpu_free(rt->g, sk->p);
    for (int k = 0; k < 2; k++) gpu_free(rt->g, sk->q[k]), gpu_free(rt->g, sk->blk[k]);
    gpu_free(rt->g, sk->tab);
    free(rt->stacks[i].params);
  }
  free(rt->stacks);
  gpu_pool_free(rt->pool);
  gpu_attention_free(rt->attn);
  gpu_wgmma_free(rt->wgmma);
  gpu_blas_free(rt->blas);
  rt_cuda_free(rt->k);
  if (rt->g) gpu_close(rt->g);
  free(rt);
}

/* A moment (n) between the host's f32 and the device's storage: bf16 with moments_bf16
 * (rounded to nearest on the way up, widened exactly on the way down). -1: a GPU error, -2:
 * out of host memory. */
static int moment_move(gpu_runtime *rt, int up, gpu_ptr d, float *h, int64_t n) {
  if (!rt->ps->moments_bf16) return up ? gpu_upload(rt->g, d, h, (size_t)n * 4) : gpu_download(rt->g, h, d, (size_t)n * 4);
  uint16_t *b = malloc((size_t)(n > 0 ? n : 1) * 2);
  if (!b) return -2;
  int rc = 0;
  if (up) {
    for (int64_t i = 0; i < n; i++) b[i] = ck_float_to_bf16(h[i]);
    rc = gpu_upload(rt->g, d, b, (size_t)n * 2);
  } else if ((rc = gpu_download(rt->g, b, d, (size_t)n * 2)) == 0) {
    for (int64_t i = 0; i < n; i++) h[i] = ck_bf16_to_float(b[i]);
  }
  free(b);
  return rc ? -1 : 0;
}

/* Weights and moments of ps to the device (up) or back. */
static int params_move(gpu_runtime *rt, rt_params *ps, int up, char *err, size_t errlen) {
  if (update_settle(rt)) return errf(err, errlen, "%s", gpu_error(rt->g));
  for (int i = 0; i < ps->n; i++) {
    rt_param *p = &ps->p[i];
    const size_t bytes = (size_t)p->numel * 4;
    int rc = up ? gpu_upload(rt->g, rt->dp[i].w, p->w, bytes) : gpu_download(rt->g, p->w, rt->dp[i].w, bytes);
    if (rc == 0) rc = moment_move(rt, up, rt->dp[i].m, p->m, p->mn);
    if (rc == 0) rc = moment_move(rt, up, rt->dp[i].v, p->v, p->mn);
    if (rc) {
      snprintf(err, errlen, "%s", rc == -2 ? "out of host memory for the bf16 moments" : gpu_error(rt->g));
      return -1;
    }
    if (up) rt->dp[i].wb_fresh = 0;
  }
  if (up)
    for (int s = 0; s < rt->n_stacks; s++) rt->stacks[s].fresh = 0;
  return 0;
}

int gpu_runtime_upload(gpu_runtime *rt, const rt_params *ps, char *err, size_t errlen) {
  return params_move(rt, (rt_params *)ps, 1, err, errlen); /* (read only on the way up) */
}

int gpu_runtime_download(gpu_runtime *rt, rt_params *ps, char *err, size_t errlen) {
  return params_move(rt, ps, 0, err, errlen);
}

int gpu_runtime_fetch(gpu_runtime *rt, int i, int which, float *dst, char *err, size_t errlen) {
  const rt_param *p = &rt->ps->p[i];
  if (update_settle(rt)) return errf(err, errlen, "%s", gpu_error(rt->g));
  if (which == 0)
    return gpu_download(rt->g, dst, rt->dp[i].w, (size_t)p->numel * 4) ? errf(err, errlen, "%s", gpu_error(rt->g)) : 0;
  int rc = moment_move(rt, 0, which == 1 ? rt->dp[i].m : rt->dp[i].v, dst, p->mn);
  return rc == -2 ? errf(err, errlen, "out of host memory for the bf16 moments") : rc ? errf(err, errlen, "%s", gpu_error(rt->g)) : 0;
}

int gpu_runtime_store(gpu_runtime *rt, int i, int which, const float *src, char *err, size_t errlen) {
  const rt_param *p = &rt->ps->p[i];
  int rc;
  if (update_settle(rt)) return errf(err, errlen, "%s", gpu_error(rt->g));
  if (which == 0) {
    if (gpu_upload(rt->g, rt->dp[i].w, src, (size_t)p->numel * 4)) return errf(err, errlen, "%s", gpu_error(rt->g));
    rt->dp[i].wb_fresh = 0;
    for (int s = 0; s < rt->n_stacks; s++) rt->stacks[s].fresh = 0;
    return 0;
  }
  rc = moment_move(rt, 1, which == 1 ? rt->dp[i].m : rt->dp[i].v, (float *)src, p->mn); /* (read only on the way up) */
  return rc == -2 ? errf(err, errlen, "out of host memory for the bf16 moments") : rc ? errf(err, errlen, "%s", gpu_error(rt->g)) : 0;
}

const char *gpu_runtime_device(const gpu_runtime *rt) { return rt->device; }
size_t gpu_runtime_peak_bytes(const gpu_runtime *rt) { return gpu_peak_bytes(rt->g); }
size_t gpu_runtime_peak_used_bytes(const gpu_runtime *rt) { return gpu_peak_used_bytes(rt->g); }
gpu_ctx *gpu_runtime_ctx(gpu_runtime *rt) { return rt->g; }
size_t gpu_runtime_live_bytes(const gpu_runtime *rt) { return gpu_used_bytes(rt->g); }
gpu_host_stats gpu_runtime_host_stats(const gpu_runtime *rt) { return gpu_host_stats_of(rt->g); }

/* ---------------------------------------------------------------- the executor */
/* The stream waits for value v's all_reduce if it may still run beside it (gpu_comm.h). */
static int comm_wait(gx *x, int v) {
  if (!x->comm_pending || !x->comm_pending[v]) return 0;
  x->comm_pending[v] = 0;
  return gpu_stream_wait(x->rt->g, NULL, x->comm_done[v]);
}

static void release(gx *x, dev_value *v) {
  /* a buffer an all_reduce may still write goes back to the pool only behind it */
  const int id = (int)(v - x->val);
  if (comm_wait(x, id) != 0) return; /* leaked, not reused while written; the step fails later */
  if (v->bytes) pool_put_after(x->rt, v->p, x->upd_ev ? x->upd_ev[id] : -1); /* held while the update beside the forward reads it */
  if (x->upd_ev) x->upd_ev[id] = -1;
  if (v->q8_bytes) pool_put(x->rt, v->q8);
  if (v->s8_bytes) pool_put(x->rt, v->s8);
  memset(v, 0, sizeof *v);
}

/* ---- routing ---- */
static routing *route_of(gx *x, int id, int idx) {
  for (int i = 0; i < x->n_routes; i++)
    if (x->routes[i].idx == idx) return &x->routes[i];
  if (x->n_routes == MAX_ROUTINGS) {
    fail(x, id, "more than %d routers in one graph", MAX_ROUTINGS);
    return NULL;
  }
  /* E = the width of the logits the topk read */
  const ir_node *topk = N(idx);
  if (topk->op != OP_TOPK) {
    fail(x, id, "routing indices must come straight from topk");
    return NULL;
  }
  routing *r = &x->routes[x->n_routes++];
  memset(r, 0, sizeof *r);
  r->idx = idx;
  r->E = x->g->nodes[topk->in[0]].type.dims[1];
  int64_t T = x->val[idx].rows, k = COLS(idx), np = T * k;
  r->bytes = (size_t)(3 * np + 2 * r->E + 2) * 4 + 1024;
  if (pool_get(x->rt, r->bytes, &r->mem) != 0) {
    fail(x, id, "%s", gpu_error(x->rt->g));
    return NULL;
  }
  gpu_ptr p = r->mem;
  r->r.rows = p, p += (gpu_ptr)(np * 4 + 255) / 256 * 256;
  r->r.slots = p, p += (gpu_ptr)(np * 4 + 255) / 256 * 256;
  r->r.pos = p, p += (gpu_ptr)(np * 4 + 255) / 256 * 256;
  r->r.counts = p, p += (gpu_ptr)(r->E * 4 + 255) / 256 * 256;
  r->r.offsets = p;
  r->counts = malloc((size_t)r->E * 4);
  r->offsets = malloc((size_t)(r->E + 1) * 4);
  r->dy_of = -1;
  if (!r->counts || !r->offsets) {
    fail(x, id, "out of host memory");
    return NULL;
  }
  /* the per-expert GEMMs need the row counts on the host: one synchronisation per layer */
  if (rt_cuda_route(KX, x->val[idx].p, T, k, r->E, &r->r) != 0 ||
      gpu_download(x->rt->g, r->offsets, r->r.offsets, (size_t)(r->E + 1) * 4) != 0) {
    fail(x, id, "%s", rt_cuda_error(KX)[0] ? rt_cuda_error(KX) : gpu_error(x->rt->g));
    return NULL;
  }
  for (int64_t e = 0; e < r->E; e++) r->counts[e] = r->offsets[e + 1] - r->offsets[e];
  return r;
}

static void routes_release(gx *x) {
  for (int i = 0; i < x->n_routes; i++) {
    routing *r = &x->routes[i];
    pool_put(x->rt, r->mem);
    if (r->dy_bytes) pool_put(x->rt, r->dy_stacked);
    free(r->counts);
    free(r->offsets);
  }
  x->n_routes = 0;
}

/* Expert outputs y_0..y_{E-1} (operands first..) copied into one (T*k, H) buffer, expert e's
 * rows at offsets[e]: the layout the combine kernels read. */
static int stack_experts(gx *x, int id, routing *r, int first, gpu_ptr *out, size_t *bytes) {
  int64_t H = INCOLS(id, first), Tk = (int64_t)r->offsets[r->E];
  size_t es = dsize(x->g->nodes[N(id)->in[first]].type.dtype);
  *bytes = (size_t)(Tk > 0 ? Tk : 1) * (size_t)H * es;
  if (pool_get(x->rt, *bytes, out) != 0) return fail(x, id, "%s", gpu_error(x->rt->g));
  for (int64_t e = 0; e < r->E; e++) {
    const dev_value *y = V(id, first + (int)e);
    if (y->rows != r->counts[e]) return fail(x, id, "expert %lld has %lld rows, routing gives %d", (long long)e, (long long)y->rows, r->counts[e]);
    if (r->counts[e] && gpu_copy(x->rt->g, *out + (gpu_ptr)((size_t)r->offsets[e] * (size_t)H * es), y->p,
                                 (size_t)r->counts[e] * (size_t)H * es) != 0)
      return fail(x, id, "%s", gpu_error(x->rt->g));
  }
  return 0;
}

/* ---- GEMM ---- */
/* c (m, n) = op(a) . op(b) [+ addend, a value of c's type and layout: fuse-gemm-add; -1 for none] */
static int gemm(gx *x, int id, int64_t m, int64_t n, int64_t k, int a, int ta, int b, int tb, int c, int addend) {
  gpu_mat A = {DT(x, a), x->val[a].p, INCOLS(id, 0), 0, ta};
  gpu_mat B = {DT(x, b), x->val[b].p, COLS(b), 0, tb};
  gpu_mat C = {DT(x, c), x->val[c].p, COLS(c), 0, 0};
  A.ld = x->val[a].ld ? x->val[a].ld : COLS(a); /* a VIEW_COLS slice: its input's row stride */
  if (x->val[b].ld) B.ld = x->val[b].ld;
  /* f32 of at most CG_NARROW columns (the router's logits and the gate's gradient): one read of
     the wide operand, where cuBLASLt ran SIMT sgemm tiles (0.024 / 0.027 ms a call against
     0.048 / 0.035 at genos_1b's shapes on the H200) */
  if (addend < 0 && !x->narrow_off && A.dtype == CG_DT_F32 && B.dtype == CG_DT_F32 && C.dtype == CG_DT_F32 &&
      rt_cuda_narrow_ok(m, n, k))
    return ck(x, id, rt_cuda_narrow_gemm(KX, m, n, k, A.p, A.ld, ta, B.p, B.ld, tb, C.p, C.ld));
  char e[512];
  if (addend >= 0) {
    if (x->val[addend].ld && x->val[addend].ld != C.ld) return fail(x, id, "the addend is a window of another width");
    return gpu_gemm_add(x->rt->blas, m, n, k, &A, &B, x->val[addend].p, &C, e, sizeof e) ? fail(x, id, "%s", e) : 0;
  }
  return gpu_gemm(x->rt->blas, m, n, k, 1.0f, &A, &B, 0.0f, &C, 1, e, sizeof e) ? fail(x, id, "%s", e) : 0;
}

/* ---- one exec function per op ---- */
static int exec_INPUT(gx *x, int id) {
  const char *name = ir_get_str(N(id), "name", "");
  gpu_ptr p = strcmp(name, "tokens") == 0 ? x->tokens : strcmp(name, "labels") == 0 ? x->labels : 0;
  if (!p) return fail(x, id, "unknown input '%s'", name);
  x->val[id] = (dev_value){.p = p, .rows = N(id)->type.dims[0], .numel = N(id)->type.dims[0]};
  return 0;
}

static int exec_PARAM(gx *x, int id) {
  int i = x->param_index[id];
  x->val[id] = (dev_value){.p = x->rt->dp[i].w, .rows = N(id)->type.dims[0], .numel = x->rt->ps->p[i].numel};
  return 0;
}

/* cast(param f32 -> bf16): the parameter's persistent bf16 copy (dev_param.wb), cast only
 * when stale; AdamW refreshes it in the same kernel that updates the weight. */
/* Parameter i's bf16 copy made fresh (a window of a stacked weight: rows of wb_cols). */
int fresh_copy(gx *x, int id, int i) {
  dev_param *p = &x->rt->dp[i];
  int64_t n = x->rt->ps->p[i].numel;
  if (!p->wb && gpu_alloc(x->rt->g, &p->wb, (size_t)n * 2, "the bf16 weight copies") != 0)
    return fail(x, id, "%s", gpu_error(x->rt->g));
  if (!p->wb_fresh && ck(x, id, p->wb_ld ? rt_cuda_copy_cols(KX, CG_DT_F32, CG_DT_BF16, p->w, p->wb_cols, 0, p->wb,
                                                             p->wb_ld, 0, n / p->wb_cols, p->wb_cols)
                                         : rt_cuda_cast(KX, CG_DT_F32, p->w, CG_DT_BF16, p->wb, n)) != 0)
    return -1;
  p->wb_fresh = 1;
  return 0;
}

static int cast_param(gx *x, int id) {
  int i = x->param_index[N(id)->in[0]];
  dev_param *p = &x->rt->dp[i];
  int64_t n = x->rt->ps->p[i].numel;
  if (x->view[id] == VIEW_IN_STACK && !x->keep_all) { /* its stack reads the copy (gpu_views.h) */
    x->val[id] = (dev_value){.rows = V(id, 0)->rows, .numel = n};
    return 0;
  }
  if (fresh_copy(x, id, i)) return -1;
  if (p->wb_ld) { /* the copy is a window of a stack: this value is its own */
    if (alloc_out(x, id, V(id, 0)->rows, 0)) return -1;
    return ck(x, id, rt_cuda_copy_cols(KX, CG_DT_BF16, CG_DT_BF16, p->wb, p->wb_ld, 0, x->val[id].p, p->wb_cols, 0,
                                       n / p->wb_cols, p->wb_cols));
  }
  x->val[id] = (dev_value){.p = p->wb, .rows = V(id, 0)->rows, .numel = n};
  return 0;
}

int exec_CAST(gx *x, int id) {
  const dev_value *a = V(id, 0);
  if (N(N(id)->in[0])->op == OP_PARAM && DT(x, N(id)->in[0]) == CG_DT_F32 && DT(x, id) == CG_DT_BF16)
    return cast_param(x, id);
  if (x->view[id] == VIEW_ALIAS && !x->keep_all) { /* a split piece, already bf16 (gpu_views.h); not owned */
    x->val[id] = (dev_value){.p = a->p, .rows = a->rows, .numel = a->numel};
    return 0;
  }
  if (x->view[id] == VIEW_CAST && !x->keep_all) { /* its quantizes read a and round (gpu_views.h) */
    x->val[id] = (dev_value){.rows = a->rows, .numel = a->numel};
    return 0;
  }
  if (alloc_out(x, id, a->rows, 0)) return -1;
  if (x->view[N(id)->in[0]] == VIEW_WINDOW && !a->p) { /* cast(slice_cols(s)): the window of s, converted in one pass */
    int s = N(id)->in[0], src = N(s)->in[0];
    return ck(x, id, rt_cuda_copy_cols(KX, DT(x, src), DT(x, id), x->val[src].p, COLS(src), ir_get_int(N(s), "start", 0),
                                       x->val[id].p, COLS(id), 0, a->rows, COLS(id)));
  }
  return ck(x, id, rt_cuda_cast(KX, DT(x, N(id)->in[0]), a->p, DT(x, id), x->val[id].p, a->numel));
}

static int exec_EMBEDDING(gx *x, int id) {
  const dev_value *tab = V(id, 0), *tok = V(id, 1);
  if (alloc_out(x, id, tok->rows, 0)) return -1;
  return ck(x, id, rt_cuda_embedding_fwd(KX, DT(x, id), tab->p, tok->p, x->val[id].p, tok->rows, tab->rows, COLS(id)));
}

static int exec_RMSNORM(gx *x, int id) {
  const dev_value *a = V(id, 0);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  return ck(x, id, rt_cuda_rmsnorm_fwd(KX, DT(x, id), DT(x, N(id)->in[1]), a->p, V(id, 1)->p, x->val[id].p, a->rows,
                                       COLS(id), (float)ir_get_float(N(id), "eps", 1e-5)));
}

static int exec_LINEAR(gx *x, int id) {
  if (N(id)->n_in == 3) return fail(x, id, "linear with a bias is not on the GPU yet; use bias = false");
  const dev_value *a = V(id, 0);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  return gemm(x, id, a->rows, COLS(id), INCOLS(id, 0), N(id)->in[0], 0, N(id)->in[1], 0, id, -1);
}

static int exec_ROPE(gx *x, int id) {
  const dev_value *a = V(id, 0);
  int64_t nh = ir_get_int(N(id), "heads", 1), hd = COLS(id) / nh, seq = ir_get_int(N(id), "seq", a->rows);
  double theta = ir_get_float(N(id), "theta", 1e4);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  const int64_t ldx = a->ld ? a->ld : COLS(id); /* a VIEW_COLS slice: its input's row stride */
  int rc = ir_get_int(N(id), "inverse", 0) ? rt_cuda_rope_bwd(KX, DT(x, id), a->p, ldx, x->val[id].p, a->rows, nh, hd, seq, theta)
                                           : rt_cuda_rope_fwd(KX, DT(x, id), a->p, ldx, x->val[id].p, a->rows, nh, hd, seq, theta);
  return ck(x, id, rc);
}

static gpu_attn_dims attn_dims(gx *x, int id) {
  gpu_attn_dims d;
  d.seq = ir_get_int(N(id), "seq", 1);
  d.B = V(id, 0)->rows / d.seq;
  d.nh = ir_get_int(N(id), "heads", 1);
  d.nkv = ir_get_int(N(id), "kv_heads", 1);
  d.hd = INCOLS(id, 0) / d.nh;
  d.causal = (int)ir_get_int(N(id), "causal", 1);
  d.dt = DT(x, N(id)->in[0]);
  return d;
}

static int exec_ATTENTION(gx *x, int id) {
  gpu_attn_dims d = attn_dims(x, id);
  if (alloc_out(x, id, V(id, 0)->rows, 0)) return -1;
  if (gpu_attention_fwd(x->rt->attn, &d, V(id, 0)->p, V(id, 1)->p, V(id, 2)->p, x->val[id].p, x->err, x->errlen))
    return fail(x, id, "%s", x->err);
  return 0;
}

static int exec_TOPK(gx *x, int id) {
  const dev_value *l = V(id, 0);
  if (alloc_out(x, id, l->rows, 0)) return -1;
  return ck(x, id, rt_cuda_topk(KX, l->p, x->val[id].p, l->rows, INCOLS(id, 0), COLS(id)));
}

static int exec_ROUTE_WEIGHTS(gx *x, int id) {
  const dev_value *l = V(id, 0);
  if (alloc_out(x, id, l->rows, 0)) return -1;
  return ck(x, id, rt_cuda_route_weights_fwd(KX, l->p, V(id, 1)->p, x->val[id].p, l->rows, INCOLS(id, 0), COLS(id)));
}

/* ---- data and expert parallelism (docs/parallel.md): each loss as this rank's share of the
 * loss over all ranks, and the collectives through gpu_comm (host-staged or NCCL) ---- */
static int need_comm(gx *x, int id) {
  return x->comm ? 0 : fail(x, id, "a collective, but this executor has no communicator (run it through moec train)");
}

/* ---- ZeRO-1 (passes/sync.c): a tensor of n values in P shards of chunk = ceil(n / P) ---- */
/* The group of ZeRO op id and its size; -1 after fail(). */
static int zero_group(gx *x, int id, comm_group *grp, int *P, int *me) {
  if (need_comm(x, id)) return -1;
  *grp = comm_group_named(ir_get_str(N(id), "group", "world"));
  comm *h = gpu_comm_host_group(x->comm, *grp);
  if (!h) return fail(x, id, "no %s group", comm_group_name(*grp));
  *P = comm_size(h), *me = comm_rank(h);
  return 0;
}

/* out (chunk) <- this rank's shard of the summed gradient: from the gradient itself when it
 * divides into P equal shares (ncclReduceScatter's), else padded with zeros to P x chunk first. */
static int exec_REDUCE_SCATTER(gx *x, int id) {
  const dev_value *a = V(id, 0);
  comm_group grp;
  int P, me;
  if (zero_group(x, id, &grp, &P, &me)) return -1;
  const int64_t chunk = N(id)->type.dims[0];
  if (ir_shard_len(a->numel, P) != chunk)
    return fail(x, id, "%lld values in shards of %lld, but the group has %d ranks", (long long)a->numel, (long long)chunk, P);
  gpu_ptr pad = 0;
  const size_t bytes = (size_t)P * (size_t)chunk * 4;
  char m[1024];
  if (alloc_out(x, id, chunk, 0)) return -1;
  if ((int64_t)P * chunk == a->numel) /* equal shares: no padded copy */
    return gpu_comm_reduce_scatter_sum(x->comm, grp, a->p, x->val[id].p, chunk, m, sizeof m) ? fail(x, id, "%s", m) : 0;
  if (pool_get(x->rt, bytes ? bytes : 4, &pad) != 0) return fail(x, id, "%s", gpu_error(x->rt->g));
  int rc = (a->numel && gpu_copy(x->rt->g, pad, a->p, (size_t)a->numel * 4)) ||
                   (bytes > (size_t)a->numel * 4 &&
                    gpu_memset8(x->rt->g, pad + (gpu_ptr)((size_t)a->numel * 4), 0, bytes - (size_t)a->numel * 4))
               ? fail(x, id, "%s", gpu_error(x->rt->g))
               : 0;
  if (rc == 0 && gpu_comm_reduce_scatter_sum(x->comm, grp, pad, x->val[id].p, chunk, m, sizeof m)) rc = fail(x, id, "%s", m);
  pool_put(x->rt, pad); /* the stream waited for the collective: later work on it is ordered after */
  return rc;
}

/* In place: every rank's updated shard of the parameter into every replica; its bf16 copy is
 * stale then (the sharded adamw wrote none), and the next reader casts it (fresh_copy). A
 * parameter of P equal shares is gathered within the weight itself (ncclAllGather's in-place
 * form: each rank sends the shard where it lies); others through a padded buffer. */
static int exec_ALL_GATHER(gx *x, int id) {
  const int a = N(id)->in[0], i = x->param_index[N(a)->in[0]];
  dev_param *p = &x->rt->dp[i];
  const int64_t n = x->rt->ps->p[i].numel;
  comm_group grp;
  int P, me;
  if (zero_group(x, id, &grp, &P, &me)) return -1;
  const int64_t chunk = ir_shard_len(n, P), lo = (int64_t)me * chunk, mine = ir_shard_count(n, P, me);
  gpu_ptr send = 0, recv = 0;
  char m[1024];
  p->wb_fresh = 0;
  x->val[id] = x->val[a];
  if (P > 1 && (int64_t)P * chunk == n)
    return gpu_comm_all_gather(x->comm, grp, p->w + (gpu_ptr)((size_t)lo * 4), p->w, (size_t)chunk * 4, m, sizeof m)
               ? fail(x, id, "%s", m)
               : 0;
  int rc = pool_get(x->rt, (size_t)chunk * 4 + 4, &send) || pool_get(x->rt, (size_t)P * (size_t)chunk * 4 + 4, &recv)
               ? fail(x, id, "%s", gpu_error(x->rt->g))
               : 0;
  if (rc == 0 && ((mine < chunk && gpu_memset8(x->rt->g, send, 0, (size_t)chunk * 4)) ||
                  (mine && gpu_copy(x->rt->g, send, p->w + (gpu_ptr)((size_t)lo * 4), (size_t)mine * 4))))
    rc = fail(x, id, "%s", gpu_error(x->rt->g));
  if (rc == 0 && gpu_comm_all_gather(x->comm, grp, send, recv, (size_t)chunk * 4, m, sizeof m)) rc = fail(x, id, "%s", m);
  if (rc == 0 && n && gpu_copy(x->rt->g, p->w, recv, (size_t)n * 4)) rc = fail(x, id, "%s", gpu_error(x->rt->g));
  if (send) pool_put(x->rt, send);
  if (recv) pool_put(x->rt, recv);
  return rc;
}

static int exec_LABEL_COUNT(gx *x, int id) {
  const dev_value *lab = V(id, 0);
  if (alloc_out(x, id, 1, 0)) return -1;
  return ck(x, id, rt_cuda_label_count(KX, lab->p, x->val[id].p, lab->rows));
}

static int exec_ALL_REDUCE(gx *x, int id) {
  const dev_value *a = V(id, 0);
  const char *gs = ir_get_str(N(id), "group", "world");
  comm_group grp = comm_group_named(gs);
  ir_dtype t = N(id)->type.dtype;
  if (t != DT_F32 && t != DT_BF16 && t != DT_I32) return fail(x, id, "all_reduce takes f32, bf16 or i32 values on the GPU");
  if (need_comm(x, id) || alloc_out(x, id, a->rows, 0)) return -1;
  if (a->numel && gpu_copy(x->rt->g, x->val[id].p, a->p, (size_t)a->numel * dsize(t)) != 0)
    return fail(x, id, "%s", gpu_error(x->rt->g));
  char m[1024];
  gpu_comm_dtype ct = t == DT_I32 ? GPU_COMM_I32 : t == DT_BF16 ? GPU_COMM_BF16 : GPU_COMM_F32;
  /* left running beside the stream (NCCL): the backward goes on, and the op's first reader
     (or the buffer's release) makes the stream wait for it (comm_wait) */
  if (!x->comm_done[id] && gpu_event_new(x->rt->g, &x->comm_done[id]) != 0) return fail(x, id, "%s", gpu_error(x->rt->g));
  int pending = 0;
  if (gpu_comm_all_reduce_sum_async(x->comm, grp, x->val[id].p, a->numel, ct, x->comm_done[id], &pending, m, sizeof m))
    return fail(x, id, "%s", m);
  x->comm_pending[id] = (uint8_t)pending;
  return 0;
}

/* The EP group's counts (P x E on the host, gathered once per counts value and step) for EP op
 * id; checks that the graph was built for this EP rank. */
static const int32_t *ep_all_counts(gx *x, int id, int *P, int *me) {
  if (need_comm(x, id)) return NULL;
  comm *c = gpu_comm_host_group(x->comm, COMM_EP);
  *P = comm_size(c), *me = comm_rank(c);
  if (*me != ir_get_int(N(id), "ep_rank", -1) || *P != ir_get_int(N(id), "ep", 0))
    return fail(x, id, "the graph is EP rank %lld of %lld, but this is EP rank %d of %d", (long long)ir_get_int(N(id), "ep_rank", -1),
                (long long)ir_get_int(N(id), "ep", 0), *me, *P), NULL;
  int v = N(id)->in[N(id)->n_in == 1 ? 0 : 1];
  if (x->ep_all[v]) return x->ep_all[v];
  int64_t E = ir_get_int(N(id), "experts", 0);
  if (x->val[v].numel != E) return fail(x, id, "%lld expert counts for %lld experts", (long long)x->val[v].numel, (long long)E), NULL;
  int32_t *mine = malloc((size_t)(E > 0 ? E : 1) * 4), *all = malloc((size_t)(*P * E > 0 ? *P * E : 1) * 4);
  char m[1024];
  int rc = !mine || !all ? fail(x, id, "out of host memory")
           : gpu_download(x->rt->g, mine, x->val[v].p, (size_t)E * 4) ? fail(x, id, "%s", gpu_error(x->rt->g))
           : ep_gather_counts(c, E, mine, all, m, sizeof m) ? fail(x, id, "%s", m)
                                                             : 0;
  free(mine);
  if (rc) return free(all), NULL;
  return x->ep_all[v] = all;
}

/* Rows between the by-rank and by-expert layouts (cpu_ep.h's ep_blocks), rb bytes each. */
static int ep_regroup(gx *x, int id, int P, int me, int64_t E, const int32_t *all, gpu_ptr src, gpu_ptr dst, size_t rb,
                      int to_expert) {
  int64_t nb = E / P * P;
  ep_block *b = malloc((size_t)(nb > 0 ? nb : 1) * sizeof *b);
  if (!b) return fail(x, id, "out of host memory");
  ep_blocks(P, me, E, all, b);
  int rc = 0;
  for (int64_t i = 0; i < nb && rc == 0; i++) {
    gpu_ptr r = (gpu_ptr)((size_t)b[i].by_rank * rb), e = (gpu_ptr)((size_t)b[i].by_expert * rb);
    if (b[i].n && gpu_copy(x->rt->g, dst + (to_expert ? e : r), src + (to_expert ? r : e), (size_t)b[i].n * rb) != 0)
      rc = fail(x, id, "%s", gpu_error(x->rt->g));
  }
  free(b);
  return rc;
}

/* Forward: this rank's expert-sorted rows (so grouped by owner) go to their experts' ranks,
 * and the rows of its own experts from every rank come back grouped by local expert, then
 * source rank (cpu_ep.h). Reverse: the other way. */
static int exec_EP_ALL_TO_ALL(gx *x, int id) {
  int P, me;
  const int32_t *all = ep_all_counts(x, id, &P, &me);
  if (!all) return -1;
  const dev_value *a = V(id, 0);
  int64_t E = ir_get_int(N(id), "experts", 0);
  int rev = (int)ir_get_int(N(id), "reverse", 0);
  size_t rb = (size_t)COLS(id) * dsize(N(id)->type.dtype); /* bytes per row */
  if (DT(x, N(id)->in[0]) != DT(x, id)) return fail(x, id, "input and output dtypes differ");
  if (a->rows != ep_rows(P, me, E, all, !rev))
    return fail(x, id, "%lld rows in, the counts give %lld", (long long)a->rows, (long long)ep_rows(P, me, E, all, !rev));
  if (alloc_out(x, id, ep_rows(P, me, E, all, rev), 0)) return -1;
  size_t *so = calloc((size_t)P * 4, sizeof *so), *sb = so + P, *ro = so + 2 * P, *rbytes = so + 3 * P, ns = 0, nr = 0;
  if (!so) return fail(x, id, "out of host memory");
  for (int j = 0; j < P; j++) { /* forward: my rows of j's experts out, j's rows of mine in */
    so[j] = ns, ro[j] = nr;
    sb[j] = (size_t)(rev ? ep_seg(E, P, all, j, me) : ep_seg(E, P, all, me, j)) * rb;
    rbytes[j] = (size_t)(rev ? ep_seg(E, P, all, me, j) : ep_seg(E, P, all, j, me)) * rb;
    ns += sb[j], nr += rbytes[j];
  }
  size_t tb = (rev ? ns : nr) > 0 ? (rev ? ns : nr) : 1; /* the by-rank rows */
  gpu_ptr tmp = 0;
  char m[1024];
  int rc = pool_get(x->rt, tb, &tmp) != 0 ? fail(x, id, "%s", gpu_error(x->rt->g)) : 0;
  if (rc == 0 && !rev) {
    if (gpu_comm_all_to_all_v(x->comm, COMM_EP, a->p, so, sb, tmp, ro, rbytes, m, sizeof m) != 0) rc = fail(x, id, "%s", m);
    if (rc == 0) rc = ep_regroup(x, id, P, me, E, all, tmp, x->val[id].p, rb, 1);
  } else if (rc == 0) {
    rc = ep_regroup(x, id, P, me, E, all, a->p, tmp, rb, 0);
    if (rc == 0 && gpu_comm_all_to_all_v(x->comm, COMM_EP, tmp, so, sb, x->val[id].p, ro, rbytes, m, sizeof m) != 0)
      rc = fail(x, id, "%s", m);
  }
  if (tmp) pool_put(x->rt, tmp); /* stream order keeps it for the queued copies */
  free(so);
  return rc;
}

static int exec_EP_LOCAL_COUNTS(gx *x, int id) {
  int P, me;
  const int32_t *all = ep_all_counts(x, id, &P, &me);
  if (!all) return -1;
  int64_t E = ir_get_int(N(id), "experts", 0), El = N(id)->type.dims[0];
  if (El != E / P) return fail(x, id, "%lld local counts, but %lld experts over %d EP ranks", (long long)El, (long long)E, P);
  int32_t *loc = malloc((size_t)(El > 0 ? El : 1) * 4);
  if (!loc) return fail(x, id, "out of host memory");
  ep_local_counts(P, me, E, all, loc);
  if (alloc_out(x, id, El, 0) || gpu_upload(x->rt->g, x->val[id].p, loc, (size_t)El * 4) != 0) {
    free(loc);
    return x->val[id].bytes ? fail(x, id, "%s", gpu_error(x->rt->g)) : -1;
  }
  x->hcounts[id] = loc; /* the grouped GEMMs read them on the host: no download */
  return 0;
}

static int exec_AUX_LOSS(gx *x, int id) {
  const dev_value *l = V(id, 0);
  float coef = (float)ir_get_float(N(id), "coef", 0);
  if (alloc_out(x, id, 1, 0)) return -1;
  if (N(id)->n_in == 3) /* with the routes of all ranks: this rank's share */
    return ck(x, id, rt_cuda_aux_loss_share_fwd(KX, l->p, V(id, 2)->p, x->val[id].p, l->rows, INCOLS(id, 0), INCOLS(id, 1), coef));
  return ck(x, id, rt_cuda_aux_loss_fwd(KX, l->p, V(id, 1)->p, x->val[id].p, l->rows, INCOLS(id, 0), INCOLS(id, 1), coef));
}

/* z_loss's coefficient; with global_tokens (this rank's share of the loss over all ranks),
 * scaled so the kernel's mean over the T local tokens becomes the sum over global_tokens
 * (as cpu_exec's z_coef). */
static float z_coef(gx *x, int id, int64_t T) {
  double coef = ir_get_float(N(id), "coef", 0);
  int64_t g = ir_get_int(N(id), "global_tokens", 0);
  return (float)(g > 0 ? coef * (double)T / (double)g : coef);
}

static int exec_Z_LOSS(gx *x, int id) {
  const dev_value *l = V(id, 0);
  if (alloc_out(x, id, 1, 0)) return -1;
  return ck(x, id, rt_cuda_z_loss_fwd(KX, l->p, x->val[id].p, l->rows, INCOLS(id, 0), z_coef(x, id, l->rows)));
}

static int exec_DISPATCH(gx *x, int id) {
  routing *r = route_of(x, id, N(id)->in[1]);
  if (!r) return -1;
  int e = (int)ir_get_int(N(id), "expert", 0);
  const dev_value *a = V(id, 0);
  if (alloc_out(x, id, r->counts[e], 0)) return -1;
  if (r->counts[e] == 0) return 0;
  return ck(x, id, rt_cuda_dispatch_fwd(KX, DT(x, id), a->p, r->r.rows, r->r.offsets, e, x->val[id].p, a->rows,
                                        r->counts[e], COLS(id)));
}

static int exec_COMBINE(gx *x, int id) {
  routing *r = route_of(x, id, N(id)->in[0]);
  if (!r) return -1;
  gpu_ptr y;
  size_t yb;
  int64_t T = V(id, 0)->rows, k = INCOLS(id, 0);
  if (stack_experts(x, id, r, 2, &y, &yb)) return -1;
  int rc = alloc_out(x, id, T, 0);
  if (rc == 0)
    rc = ck(x, id, rt_cuda_combine_fwd(KX, DT(x, id), DT(x, N(id)->in[1]), r->r.pos, V(id, 1)->p, y, x->val[id].p, T, k,
                                       COLS(id)));
  pool_put(x->rt, y);
  return rc;
}

#define ELEMENTWISE_1(ID, CALL)                        \
  static int exec_##ID(gx *x, int id) {                \
    const dev_value *a = V(id, 0);                     \
    if (alloc_out(x, id, a->rows, 0)) return -1;       \
    return ck(x, id, CALL);                            \
  }
ELEMENTWISE_1(SILU, rt_cuda_silu_fwd(KX, DT(x, id), a->p, x->val[id].p, a->numel))
ELEMENTWISE_1(MUL, rt_cuda_mul_fwd(KX, DT(x, id), a->p, V(id, 1)->p, x->val[id].p, a->numel))
ELEMENTWISE_1(ADD, rt_cuda_add_fwd(KX, DT(x, id), a->p, V(id, 1)->p, x->val[id].p, a->numel))
ELEMENTWISE_1(SILU_BWD, rt_cuda_silu_bwd(KX, DT(x, id), V(id, 1)->p, a->p, x->val[id].p, a->numel))

static int exec_CROSS_ENTROPY(gx *x, int id) {
  const dev_value *l = V(id, 0);
  if (alloc_out(x, id, 1, 0)) return -1;
  if (N(id)->n_in == 3) /* with the global label count: this rank's share of the global mean */
    return ck(x, id, rt_cuda_cross_entropy_share_fwd(KX, DT(x, N(id)->in[0]), l->p, V(id, 1)->p, V(id, 2)->p, x->val[id].p,
                                                     l->rows, INCOLS(id, 0)));
  return ck(x, id, rt_cuda_cross_entropy_fwd(KX, DT(x, N(id)->in[0]), l->p, V(id, 1)->p, x->val[id].p, l->rows,
                                             INCOLS(id, 0)));
}

static int exec_FILL(gx *x, int id) {
  const ir_type *t = &N(id)->type;
  if (alloc_out(x, id, t->rank ? t->dims[0] : 1, 0)) return -1;
  if (t->dtype == DT_I32) { /* a one-group GEMM's row count (mxfp8-projections) */
    int32_t v = (int32_t)ir_get_float(N(id), "value", 0);
    if (gpu_memset32(x->rt->g, x->val[id].p, (uint32_t)v, (size_t)x->val[id].numel) != 0) return fail(x, id, "%s", gpu_error(x->rt->g));
    return 0;
  }
  return ck(x, id, rt_cuda_fill(KX, DT(x, id), x->val[id].p, x->val[id].numel, (float)ir_get_float(N(id), "value", 0)));
}

static int exec_MATMUL(gx *x, int id) {
  int a = N(id)->in[0], b = N(id)->in[1];
  int ta = (int)ir_get_int(N(id), "trans_a", 0), tb = (int)ir_get_int(N(id), "trans_b", 0);
  int64_t ar = x->val[a].rows, ac = COLS(a), br = x->val[b].rows, bc = COLS(b);
  int64_t m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
  if ((tb ? bc : br) != k) return fail(x, id, "inner sizes differ at run time");
  if (alloc_out(x, id, m, k == 0)) return -1;
  const int addend = N(id)->n_in == 3 ? N(id)->in[2] : -1; /* fuse-gemm-add */
  if (k > 0) return gemm(x, id, m, n, k, a, ta, b, tb, id, addend);
  /* an expert with no rows: its weight gradient is zero (plus the addend, if any) */
  const size_t bytes = (size_t)x->val[id].numel * dsize(N(id)->type.dtype);
  if (addend >= 0 && gpu_copy(x->rt->g, x->val[id].p, x->val[addend].p, bytes) != 0) return fail(x, id, "%s", gpu_error(x->rt->g));
  return 0;
}

static int exec_COLSUM(gx *x, int id) {
  const dev_value *a = V(id, 0);
  if (alloc_out(x, id, COLS(id), 0)) return -1;
  return ck(x, id, rt_cuda_colsum(KX, DT(x, N(id)->in[0]), a->p, x->val[id].p, a->rows, INCOLS(id, 0), 0));
}

static int exec_EMBEDDING_BWD(gx *x, int id) {
  const dev_value *dy = V(id, 0), *tok = V(id, 1);
  int64_t V_ = N(id)->type.dims[0];
  if (alloc_out(x, id, V_, 1)) return -1;
  return ck(x, id, rt_cuda_embedding_bwd(KX, DT(x, N(id)->in[0]), tok->p, dy->p, x->val[id].p, tok->rows, V_, COLS(id)));
}

static int exec_RMSNORM_BWD_X(gx *x, int id) {
  const dev_value *dy = V(id, 0), *a = V(id, 1);
  const gpu_ptr res = ir_get_int(N(id), "residual", 0) ? V(id, 3)->p : 0; /* fuse-residual's add */
  if (alloc_out(x, id, a->rows, 0)) return -1;
  return ck(x, id, rt_cuda_rmsnorm_bwd(KX, DT(x, id), DT(x, N(id)->in[2]), a->p, V(id, 2)->p, dy->p, res, x->val[id].p, 0,
                                       a->rows, COLS(id), (float)ir_get_float(N(id), "eps", 1e-5)));
}

static int exec_RMSNORM_BWD_W(gx *x, int id) {
  const dev_value *dy = V(id, 0), *a = V(id, 1);
  if (alloc_out(x, id, INCOLS(id, 1), 1)) return -1;
  return ck(x, id, rt_cuda_rmsnorm_bwd(KX, DT(x, N(id)->in[1]), CG_DT_F32, a->p, 0, dy->p, 0, 0, x->val[id].p, a->rows,
                                       INCOLS(id, 1), (float)ir_get_float(N(id), "eps", 1e-5)));
}

static int exec_ATTENTION_BWD(gx *x, int id) {
  gpu_attn_dims d = attn_dims(x, id);
  if (alloc_out(x, id, V(id, 0)->rows, 0)) return -1;
  if (gpu_attention_bwd(x->rt->attn, &d, V(id, 0)->p, V(id, 1)->p, V(id, 2)->p, V(id, 3)->p, V(id, 4)->p, x->val[id].p,
                        x->err, x->errlen))
    return fail(x, id, "%s", x->err);
  return 0;
}

static int exec_SLICE_COLS(gx *x, int id) {
  const dev_value *a = V(id, 0);
  if (x->view[id] == VIEW_WINDOW && !x->keep_all) { /* its readers take their window of a in place */
    x->val[id] = (dev_value){.rows = a->rows, .numel = a->rows * COLS(id)};
    return 0;
  }
  if (x->view[id] == VIEW_COLS && !x->keep_all) { /* its first column, read with a's row stride; not owned */
    x->val[id] = (dev_value){.p = a->p + (gpu_ptr)(ir_get_int(N(id), "start", 0) * (int64_t)dsize(N(id)->type.dtype)),
                             .rows = a->rows, .numel = a->rows * COLS(id), .ld = INCOLS(id, 0)};
    return 0;
  }
  if (x->view[id] == VIEW_PIECE && !x->keep_all) { /* its piece of the split grouped_mlp_bwd; not owned */
    int G = N(id)->in[0], cq[2];
    const int64_t F = ir_get_int(N(G), "ffn", 0), start = ir_get_int(N(id), "start", 0);
    /* a split writing FP8 columns holds dp alone; its other pieces are never written or read */
    const int fp8 = gpu_split_fp8(x->g, x->view, G, cq);
    x->val[id] = (dev_value){.p = fp8 ? (start >= 3 * F ? a->p : 0) : a->p + (gpu_ptr)gpu_split_offset(a->rows, F, start),
                             .rows = a->rows, .numel = a->rows * COLS(id)};
    return 0;
  }
  if (alloc_out(x, id, a->rows, 0)) return -1;
  return ck(x, id, rt_cuda_slice_cols(KX, DT(x, id), a->p, x->val[id].p, a->rows, INCOLS(id, 0),
                                      ir_get_int(N(id), "start", 0), COLS(id)));
}

static int exec_ROUTE_WEIGHTS_BWD(gx *x, int id) {
  const dev_value *l = V(id, 1);
  if (alloc_out(x, id, l->rows, 0)) return -1;
  return ck(x, id, rt_cuda_route_weights_bwd(KX, l->p, V(id, 2)->p, V(id, 0)->p, x->val[id].p, l->rows, COLS(id),
                                             INCOLS(id, 2)));
}

static int exec_AUX_LOSS_BWD(gx *x, int id) {
  const dev_value *l = V(id, 1);
  if (alloc_out(x, id, l->rows, 1)) return -1;
  if (N(id)->n_in == 4)
    return ck(x, id, rt_cuda_aux_loss_share_bwd(KX, l->p, V(id, 3)->p, V(id, 0)->p, x->val[id].p, l->rows, COLS(id),
                                                INCOLS(id, 2), (float)ir_get_float(N(id), "coef", 0)));
  return ck(x, id, rt_cuda_aux_loss_bwd(KX, l->p, V(id, 2)->p, V(id, 0)->p, x->val[id].p, l->rows, COLS(id),
                                        INCOLS(id, 2), (float)ir_get_float(N(id), "coef", 0)));
}

static int exec_Z_LOSS_BWD(gx *x, int id) {
  const dev_value *l = V(id, 1);
  if (alloc_out(x, id, l->rows, 1)) return -1;
  return ck(x, id, rt_cuda_z_loss_bwd(KX, l->p, V(id, 0)->p, x->val[id].p, l->rows, COLS(id), z_coef(x, id, l->rows)));
}

static int exec_DISPATCH_BWD(gx *x, int id) {
  routing *r = route_of(x, id, N(id)->in[1]);
  if (!r) return -1;
  int e = (int)ir_get_int(N(id), "expert", 0);
  const dev_value *dxe = V(id, 0);
  int64_t T = V(id, 1)->rows;
  if (alloc_out(x, id, T, 1)) return -1;
  if (r->counts[e] == 0) return 0;
  return ck(x, id, rt_cuda_dispatch_bwd(KX, DT(x, id), dxe->p, r->r.rows, r->r.offsets, e, x->val[id].p, T, r->counts[e],
                                        COLS(id)));
}

static int exec_COMBINE_BWD_Y(gx *x, int id) {
  routing *r = route_of(x, id, N(id)->in[1]);
  if (!r) return -1;
  int dout = N(id)->in[0], e = (int)ir_get_int(N(id), "expert", 0);
  int64_t T = V(id, 1)->rows, k = INCOLS(id, 1), H = COLS(id);
  size_t es = dsize(N(id)->type.dtype);
  if (r->dy_of != dout) { /* every expert's gradient at once, then one slice per op */
    if (r->dy_bytes) pool_put(x->rt, r->dy_stacked);
    r->dy_bytes = (size_t)(T * k > 0 ? T * k : 1) * (size_t)H * es;
    if (pool_get(x->rt, r->dy_bytes, &r->dy_stacked) != 0) {
      r->dy_bytes = 0;
      return fail(x, id, "%s", gpu_error(x->rt->g));
    }
    if (ck(x, id, rt_cuda_combine_bwd(KX, DT(x, dout), DT(x, N(id)->in[2]), r->r.pos, V(id, 2)->p, 0, V(id, 0)->p,
                                      r->dy_stacked, 0, T, k, H)))
      return -1;
    r->dy_of = dout;
  }
  if (alloc_out(x, id, r->counts[e], 0)) return -1;
  if (r->counts[e] == 0) return 0;
  return gpu_copy(x->rt->g, x->val[id].p, r->dy_stacked + (gpu_ptr)((size_t)r->offsets[e] * (size_t)H * es),
                  (size_t)r->counts[e] * (size_t)H * es)
             ? fail(x, id, "%s", gpu_error(x->rt->g))
             : 0;
}

static int exec_COMBINE_BWD_W(gx *x, int id) {
  routing *r = route_of(x, id, N(id)->in[1]);
  if (!r) return -1;
  int64_t T = V(id, 1)->rows, k = INCOLS(id, 1), H = INCOLS(id, 0);
  gpu_ptr y;
  size_t yb;
  if (stack_experts(x, id, r, 2, &y, &yb)) return -1;
  int rc = alloc_out(x, id, T, 0);
  /* the weights do not enter dw: pass the output gradient's own buffer shape through */
  if (rc == 0)
    rc = ck(x, id, rt_cuda_combine_bwd(KX, DT(x, N(id)->in[0]), CG_DT_F32, r->r.pos, x->val[id].p, y, V(id, 0)->p, 0,
                                       x->val[id].p, T, k, H));
  pool_put(x->rt, y);
  return rc;
}

static int exec_CROSS_ENTROPY_BWD(gx *x, int id) {
  const dev_value *l = V(id, 1);
  if (alloc_out(x, id, l->rows, 0)) return -1;
  if (N(id)->n_in == 4)
    return ck(x, id, rt_cuda_cross_entropy_share_bwd(KX, DT(x, N(id)->in[1]), l->p, V(id, 2)->p, V(id, 3)->p, V(id, 0)->p,
                                                     x->val[id].p, l->rows, COLS(id)));
  return ck(x, id, rt_cuda_cross_entropy_bwd(KX, DT(x, N(id)->in[1]), l->p, V(id, 2)->p, V(id, 0)->p, x->val[id].p,
                                             l->rows, COLS(id)));
}

/* sizes (3n): the sizes, then each buffer's row width and row stride (rt_cuda_grad_norm_win) */
static int grad_norm_ep(gx *x, int id, const gpu_ptr *bufs, const cg_dtype *dts, const int64_t *sizes, int n, int k) {
  const int64_t *cols = sizes + n, *ld = sizes + 2 * n;
  gpu_ptr en = 0;
  float d = 0, e = 0;
  char m[1024];
  if (need_comm(x, id)) return -1;
  if (pool_get(x->rt, 4, &en) != 0) return fail(x, id, "%s", gpu_error(x->rt->g));
  int rc = ck(x, id, rt_cuda_grad_norm_win(KX, bufs, dts, sizes, cols, ld, k, x->val[id].p));
  if (rc == 0) rc = ck(x, id, rt_cuda_grad_norm_win(KX, bufs + k, dts + k, sizes + k, cols + k, ld + k, n - k, en));
  if (rc == 0 && (gpu_download(x->rt->g, &d, x->val[id].p, 4) || gpu_download(x->rt->g, &e, en, 4)))
    rc = fail(x, id, "%s", gpu_error(x->rt->g));
  pool_put(x->rt, en);
  float e2 = (float)pow(e, 2);
  if (rc == 0 && comm_all_reduce_sum(gpu_comm_host_group(x->comm, COMM_EP), &e2, 1, COMM_F32, m, sizeof m) != 0)
    rc = fail(x, id, "%s", m);
  float gn = (float)sqrt((double)d * d + (double)e2);
  if (rc == 0 && gpu_upload(x->rt->g, x->val[id].p, &gn, 4) != 0) rc = fail(x, id, "%s", gpu_error(x->rt->g));
  return rc;
}

/* ZeRO: the shards' norm d here; every rank's d^2, summed in world rank order on the host, is
 * the whole gradient's. */
static int grad_norm_shards(gx *x, int id) {
  float d = 0;
  char m[1024];
  if (need_comm(x, id)) return -1;
  if (gpu_download(x->rt->g, &d, x->val[id].p, 4)) return fail(x, id, "%s", gpu_error(x->rt->g));
  double s = 0;
  if (comm_sum_f64(gpu_comm_host_group(x->comm, COMM_WORLD), (double)d * d, &s, m, sizeof m)) return fail(x, id, "%s", m);
  float gn = (float)sqrt(s);
  return gpu_upload(x->rt->g, x->val[id].p, &gn, 4) ? fail(x, id, "%s", gpu_error(x->rt->g)) : 0;
}

static int exec_GRAD_NORM(gx *x, int id) {
  int n = N(id)->n_in;
  gpu_ptr *bufs = malloc((size_t)n * sizeof *bufs);
  int64_t *sizes = malloc((size_t)n * 3 * sizeof *sizes), *cols = sizes + n, *ld = sizes + 2 * n;
  cg_dtype *dts = malloc((size_t)n * sizeof *dts);
  int rc = (!bufs || !sizes || !dts) ? fail(x, id, "out of host memory") : alloc_out(x, id, 1, 0);
  for (int i = 0; rc == 0 && i < n; i++) {
    bufs[i] = V(id, i)->p;
    sizes[i] = V(id, i)->numel;
    dts[i] = DT(x, N(id)->in[i]);
    cols[i] = V(id, i)->ld ? INCOLS(id, i) : 1; /* a window of a stacked gradient (VIEW_STRIDED) */
    ld[i] = V(id, i)->ld ? V(id, i)->ld : 1;
  }
  /* with sharded experts (operands from expert_from on): sqrt(dense^2 + sum over EP of expert^2),
     the one-rank norm, so every rank clips alike (as cpu_exec; the two norms via the host) */
  int k = (int)ir_get_int(N(id), "expert_from", n);
  if (rc == 0 && k < n) rc = grad_norm_ep(x, id, bufs, dts, sizes, n, k);
  else if (rc == 0) rc = ck(x, id, rt_cuda_grad_norm_win(KX, bufs, dts, sizes, cols, ld, n, x->val[id].p));
  if (rc == 0 && ir_get_int(N(id), "sharded", 0)) rc = grad_norm_shards(x, id);
  if (rc == 0) x->gnorm = x->val[id].p;
  free(bufs);
  free(sizes);
  free(dts);
  return rc;
}

/* AdamW node a's parameter as a table entry; its value (the updated weight) set. The gradient
 * may be a window of a stacked one, the copy a window of a stacked weight. */
static rt_cuda_adamw_tensor adamw_entry(gx *x, int a) {
  int i = x->param_index[N(a)->in[0]];
  dev_param *p = &x->rt->dp[i];
  int64_t n = x->rt->ps->p[i].numel;
  x->val[a] = (dev_value){.p = p->w, .rows = N(a)->type.dims[0], .numel = n};
  p->wb_fresh = p->wb != 0;
  const dev_value *gv = V(a, 1);
  return (rt_cuda_adamw_tensor){p->w, gv->p, p->m, p->v, p->wb, n, ir_get_float(N(a), "weight_decay", 0),
                                {gv->ld ? INCOLS(a, 1) : n, gv->ld ? gv->ld : n, p->wb_ld ? p->wb_cols : n,
                                 p->wb_ld ? p->wb_ld : n}};
}

/* ZeRO-1's adamw: this rank's shard [mlo, mlo + mn) of the weight, its moments (of that shard
 * only), no bf16 copy (the all_gather after it makes the copy stale). */
static int adamw_shard(gx *x, int id, rt_cuda_adamw_hp *hp) {
  const int i = x->param_index[N(id)->in[0]];
  dev_param *p = &x->rt->dp[i];
  const rt_param *hostp = &x->rt->ps->p[i];
  x->val[id] = (dev_value){.p = p->w, .rows = N(id)->type.dims[0], .numel = hostp->numel};
  if (hostp->zero_group < 0) return fail(x, id, "%s: the graph shards the update, but the moments are whole", hostp->name);
  if (DT(x, N(id)->in[1]) != CG_DT_F32) return fail(x, id, "a ZeRO shard of the gradient must be f32");
  hp->wd = ir_get_float(N(id), "weight_decay", 0);
  if (hostp->mn == 0) return 0; /* a tensor smaller than the group: nothing here */
  return ck(x, id, rt_cuda_adamw_step(KX, p->w + (gpu_ptr)((size_t)hostp->mlo * 4), CG_DT_F32, V(id, 1)->p, p->m, p->v, 0,
                                      hostp->mn, V(id, 2)->p, hp));
}

/* The run of AdamW nodes from id with id's gradient storage and norm (they stand together at
 * the step's end) is done here, the run's later nodes then find it done: the stacks kept as
 * squares one rt_cuda_adamw_squares each, the rest in rt_cuda_adamw_multi's tables, on the
 * update's stream beside the next forward unless that is off (gpu_exec_update.c). */
static int exec_ADAMW(gx *x, int id) {
  if (id > x->aw_from && id <= x->aw_until) return 0;
  const moec_config *c = &x->g->cfg;
  rt_cuda_adamw_hp hp = {ck_lr_at(x->step, c->steps, c->warmup, c->lr, c->min_lr, c->schedule), c->beta1, c->beta2,
                         c->adam_eps, 0, x->step, c->clip, x->rt->ps->moments_bf16 /* as they are stored */};
  if (ir_get_str(N(id), "zero", NULL)) return adamw_shard(x, id, &hp);
  const cg_dtype gt = DT(x, N(id)->in[1]);
  int end = id + 1;
  while (!x->adamw_single && end < x->g->n_nodes && N(end)->op == OP_ADAMW && DT(x, N(end)->in[1]) == gt &&
         N(end)->in[2] == N(id)->in[2] && !ir_get_str(N(end), "zero", NULL)) /* a ZeRO shard is adamw_shard's */
    end++;
  for (int a = id + 1; a < end; a++) /* the run's later gradients: the loop waited only for id's */
    for (int k = 0; k < N(a)->n_in; k++)
      if (comm_wait(x, N(a)->in[k]) != 0) return fail(x, id, "%s", gpu_error(x->rt->g));
  const int nt = end - id, ns = x->rt->n_stacks;
  rt_cuda_adamw_tensor *t = malloc((size_t)nt * sizeof *t), *chunk = malloc((size_t)nt * sizeof *t);
  int *stack_of = malloc((size_t)nt * sizeof(int)), *first = malloc((size_t)(ns + 1) * sizeof(int)),
      *params = malloc((size_t)nt * sizeof(int)), *chunk_node = malloc((size_t)nt * sizeof(int));
  int rc = t && chunk && stack_of && first && params && chunk_node ? 0 : fail(x, id, "out of host memory");
  for (int a = id; rc == 0 && a < end; a++) t[a - id] = adamw_entry(x, a);
  if (rc == 0) rc = squares_plan(x, id, gt, t, nt, stack_of, first);
  /* Overlapped with the next forward (update_begin: 1; MOEC_ADAMW_OVERLAP), the launches go in graph order, which
     is the order the forward reads the parameters, each followed by an event: the stacks one
     a launch, the other parameters in 16 chunks or so (about a layer's each, so that the
     forward's first layers wait for little). Else as before: each stack, then the rest in one
     rt_cuda_adamw_multi. */
  const int over = rc == 0 ? update_begin(x, id) : 0;
  if (over < 0) rc = -1;
  int64_t chunk_numel = INT64_MAX;
  if (over) {
    chunk_numel = 0;
    for (int j = 0; j < nt; j++) chunk_numel += stack_of[j] < 0 ? t[j].n : 0;
    chunk_numel = chunk_numel / 16 > 4096 ? chunk_numel / 16 : 4096;
  }
  int nc = 0;
  int64_t numel = 0;
  for (int j = 0; rc == 0 && j <= nt; j++) {
    const int s = j < nt ? stack_of[j] : -1;
    if (nc && (j == nt || (over && s >= 0 && first[s] == j) || numel >= chunk_numel)) {
      rc = ck(x, id, rt_cuda_adamw_multi(KX, gt, chunk, nc, V(id, 2)->p, &hp));
      if (rc == 0 && over) rc = update_mark(x, id, params, nc);
      for (int c = 0; rc == 0 && over && c < nc; c++) update_reads(x, N(chunk_node[c])->in[1], x->rt->upd.n_ev - 1);
      nc = 0, numel = 0;
    }
    if (j == nt || rc) break;
    if (s < 0) {
      chunk[nc] = t[j], chunk_node[nc] = id + j, params[nc++] = x->param_index[N(id + j)->in[0]], numel += t[j].n;
    } else if (first[s] == j) {
      rc = squares_update(x, id, gt, &hp, V(id, 2)->p, s, &t[j]);
      if (rc == 0 && over) rc = update_mark(x, id, x->rt->stacks[s].params, x->rt->stacks[s].n);
      for (int k = 0; rc == 0 && over && k < nt; k++) /* its gradients: windows of one stacked gradient */
        if (stack_of[k] == s) update_reads(x, N(id + k)->in[1], x->rt->upd.n_ev - 1);
    }
  }
  if (rc == 0 && over) update_reads(x, N(id)->in[2], x->rt->upd.n_ev - 1); /* the norm: every launch */
  if (over > 0 && update_end(x, id) && rc == 0) rc = -1;
  free(t), free(chunk), free(stack_of), free(first), free(params), free(chunk_node);
  x->aw_from = id, x->aw_until = end - 1;
  return rc;
}

typedef int (*exec_fn)(gx *, int);
static const exec_fn exec_table[] = {
#define OP(id, name, min_in, max_in, cg) [OP_##id] = exec_##id,
#include "ops.def"
#undef OP
};
static_assert(sizeof exec_table / sizeof exec_table[0] == OP_COUNT, "one GPU exec function per op");

static void hcounts_release(gx *x) {
  for (int i = 0; x->hcounts && i < x->g->n_nodes; i++) free(x->hcounts[i]), x->hcounts[i] = NULL;
  for (int i = 0; x->ep_all && i < x->g->n_nodes; i++) free(x->ep_all[i]), x->ep_all[i] = NULL;
}

void gpu_exec_set_comm(gpu_exec *x, gpu_comm *c) { x->comm = c; }

gpu_exec *gpu_exec_new(gpu_runtime *rt, const ir_graph *g, char *err, size_t errlen) {
  gx *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  x->rt = rt;
  x->g = g;
  size_t n = (size_t)g->n_nodes + 1;
  x->param_index = malloc(n * sizeof(int));
  x->last_use = malloc(n * sizeof(int));
  x->val = calloc(n, sizeof *x->val);
  x->T = g->cfg.batch * g->cfg.seq;
  if (!x->param_index || !x->last_use || !x->val) {
    snprintf(err, errlen, "out of host memory");
    gpu_exec_free(x);
    return NULL;
  }
  for (int id = 0; id < g->n_nodes; id++) {
    const ir_node *nd = &g->nodes[id];
    x->param_index[id] = -1;
    x->last_use[id] = id;
    for (int j = 0; j < nd->n_in; j++) x->last_use[nd->in[j]] = id;
    if (nd->op == OP_PARAM) {
      const char *name = ir_get_str(nd, "name", "");
      for (int i = 0; i < rt->ps->n; i++)
        if (strcmp(rt->ps->p[i].name, name) == 0) x->param_index[id] = i;
      if (x->param_index[id] < 0) {
        snprintf(err, errlen, "parameter '%s' is not in the parameter store", name);
        gpu_exec_free(x);
        return NULL;
      }
    }
  }
  for (int i = 0; i < g->n_outputs; i++) x->last_use[g->outputs[i]] = g->n_nodes;
  /* the grad norm is downloaded after the run (x->gnorm): its buffer must not go back to the
     pool after the last adamw, where the collectives on the outputs would reuse it */
  for (int id = 0; id < g->n_nodes; id++)
    if (g->nodes[id].op == OP_GRAD_NORM) x->last_use[id] = g->n_nodes;
  x->prof = gpu_profile_from_env(rt->g, g);
  const char *gg = getenv("MOEC_GROUPED_GEMM");
  x->grouped_device = gg && strcmp(gg, "device") == 0;
  const char *aw = getenv("MOEC_ADAMW_MULTI");
  x->adamw_single = aw && strcmp(aw, "0") == 0;
  const char *nw = getenv("MOEC_NARROW_GEMM");
  x->narrow_off = nw && strcmp(nw, "0") == 0;
  /* FP8 expert GEMMs (mxfp8(block = 128) on sm_90; MOEC_FP8_GEMM=0 keeps bf16) */
  const char *f8 = getenv("MOEC_FP8_GEMM");
  /* Hopper only: sm_100 has native MX block scaling (VEC32_UE8M0), untested here */
  int fp8_on = !(f8 && strcmp(f8, "0") == 0) && !x->grouped_device && gpu_info(rt->g)->cc_major == 9;
  if (gpu_fp8_plan_new(g, fp8_on, x->last_use, &x->fp8) != 0) {
    snprintf(err, errlen, "out of host memory");
    gpu_exec_free(x);
    return NULL;
  }
  int any_site = 0, most_experts = 0;
  for (int id = 0; id < g->n_nodes && fp8_on; id++) {
    if (!x->fp8.site[id]) continue;
    any_site = 1;
    const ir_node *s = &g->nodes[id];
    int vc = s->op == OP_GROUPED_MLP || s->op == OP_GROUPED_MLP_BWD ? s->in[3] : s->in[2];
    if (g->nodes[vc].type.dims[0] > most_experts) most_experts = (int)g->nodes[vc].type.dims[0];
  }
  if (any_site && f8 && strcmp(f8, "wgmma") == 0) { /* opt-in until it beats cuBLASLt end to end */
    if (most_experts > GPU_WGMMA_MAX_E) {
      fprintf(stderr, "moec: warning: MOEC_FP8_GEMM=wgmma takes at most %d experts, this model has %d; the FP8 expert "
                      "GEMMs run on cuBLASLt\n", GPU_WGMMA_MAX_E, most_experts);
    } else {
      if (!rt->wgmma_tried) { /* built once a runtime; where it cannot be, cuBLASLt runs them */
        char e2[1024];
        rt->wgmma_tried = 1;
        rt->wgmma = gpu_wgmma_new(rt->g, rt_cuda_arch(rt->k), NULL, e2, sizeof e2);
        if (!rt->wgmma)
          fprintf(stderr, "moec: warning: the wgmma FP8 grouped GEMM is unavailable (%s); the FP8 expert GEMMs run on cuBLASLt\n",
                  e2[0] ? e2 : "it needs an sm_90 GPU");
      }
      x->wgmma = rt->wgmma;
    }
  }
  x->hcounts = calloc(n, sizeof *x->hcounts);
  x->cpin = calloc(n, sizeof *x->cpin), x->cev = calloc(n, sizeof *x->cev), x->cpending = calloc(n, 1);
  x->ep_all = calloc(n, sizeof *x->ep_all);
  x->view = calloc(n, 1);
  x->upd_ev = malloc(n * sizeof *x->upd_ev);
  for (size_t i = 0; x->upd_ev && i < n; i++) x->upd_ev[i] = -1;
  x->stack_of = malloc(n * sizeof *x->stack_of);
  x->store_q = malloc(n * sizeof *x->store_q);
  x->comm_done = calloc(n, sizeof *x->comm_done), x->comm_pending = calloc(n, 1);
  if (!x->hcounts || !x->cpin || !x->cev || !x->cpending || !x->ep_all || !x->view || !x->upd_ev || !x->stack_of ||
      !x->store_q || !x->comm_done || !x->comm_pending) {
    snprintf(err, errlen, "out of host memory");
    gpu_exec_free(x);
    return NULL;
  }
  /* VIEW_GATHER: the FP8 quantizes gather the permuted rows (docs/cuda.md); the default since
     it ran on an H100 (bench/RESULTS.md, 2026-12-06 second session). MOEC_GATHER=0 writes the
     permute out as before. MOEC_SPLIT_Q=0: dg | du's rows quantize as a kernel of its own, not
     in the split backward (VIEW_SPLIT_Q). The split writes the expert columns of dg | du and act
     too, and no bf16 piece (VIEW_SPLIT_FP8; the default since it ran faster on an H100,
     bench/RESULTS.md, 2026-12-07 tenth session); MOEC_SPLIT_FP8=0 leaves them to quantizes.
     MOEC_COLS_VIEW=0: attention_bwd's dq | dk | dv copied out by their slices (VIEW_COLS). */
  const char *ga = getenv("MOEC_GATHER"), *sq = getenv("MOEC_SPLIT_Q"), *co = getenv("MOEC_COLS_VIEW"),
             *sf = getenv("MOEC_SPLIT_FP8");
  const int split_q = sq && strcmp(sq, "0") == 0 ? 0 : sf && strcmp(sf, "0") == 0 ? 1 : 2;
  gpu_views_plan(g, &x->fp8, !x->grouped_device, !(ga && strcmp(ga, "0") == 0), split_q, !(co && strcmp(co, "0") == 0),
                 x->last_use, x->view);
  plan_gate_up_stores(x);
  if (plan_stacks(x, err, errlen) != 0) {
    gpu_exec_free(x);
    return NULL;
  }
  if (gpu_alloc(rt->g, &x->tokens, (size_t)x->T * 4, "the batch") || gpu_alloc(rt->g, &x->labels, (size_t)x->T * 4, "the batch")) {
    snprintf(err, errlen, "%s", gpu_error(rt->g));
    gpu_exec_free(x);
    return NULL;
  }
  return x;
}

int gpu_exec_fp8_sites(const gpu_exec *x) {
  int n = 0;
  for (int id = 0; id < x->g->n_nodes; id++) n += x->fp8.site[id];
  return n;
}

int gpu_exec_act_stores(const gpu_exec *x) {
  int n = 0;
  for (int id = 0; id < x->g->n_nodes; id++) n += x->store_q[id] >= 0;
  return n;
}

void gpu_exec_free(gpu_exec *x) {
  if (!x) return;
  gpu_fp8_plan_free(&x->fp8);
  gpu_profile_print(x->prof, stderr);
  gpu_profile_free(x->prof);
  if (x->val)
    for (int i = 0; i < x->g->n_nodes; i++) release(x, &x->val[i]);
  routes_release(x);
  hcounts_release(x);
  free(x->hcounts);
  if (x->cpin) gpu_sync(x->rt->g); /* no queued copy may still write a page-locked buffer */
  for (int i = 0; x->cpin && i < x->g->n_nodes; i++) gpu_free_host(x->rt->g, x->cpin[i]);
  for (int i = 0; x->cev && i < x->g->n_nodes; i++) gpu_event_free(x->rt->g, x->cev[i]);
  free(x->cpin), free(x->cev), free(x->cpending);
  for (int i = 0; x->comm_done && i < x->g->n_nodes; i++) gpu_event_free(x->rt->g, x->comm_done[i]);
  free(x->comm_done), free(x->comm_pending);
  free(x->ep_all);
  free(x->view);
  free(x->stack_of);
  free(x->store_q);
  free(x->upd_ev);
  gpu_free(x->rt->g, x->tokens);
  gpu_free(x->rt->g, x->labels);
  free(x->param_index);
  free(x->last_use);
  free(x->val);
  free(x);
}

void gpu_exec_keep_all(gpu_exec *x, int keep_all) { x->keep_all = keep_all; }

int64_t gpu_exec_value(gpu_exec *x, int id, float *dst, int64_t cap) {
  if (id < 0 || id >= x->g->n_nodes || !x->val[id].p || update_settle(x->rt)) return 0;
  const dev_value *v = &x->val[id];
  int64_t n = v->numel < cap ? v->numel : cap;
  ir_dtype t = x->g->nodes[id].type.dtype;
  if (t == DT_F32) return gpu_download(x->rt->g, dst, v->p, (size_t)n * 4) ? 0 : n;
  if (t != DT_BF16) return 0;
  uint16_t *tmp = malloc((size_t)(n > 0 ? n : 1) * 2);
  if (!tmp || gpu_download(x->rt->g, tmp, v->p, (size_t)n * 2)) {
    free(tmp);
    return 0;
  }
  for (int64_t i = 0; i < n; i++) dst[i] = ck_bf16_to_float(tmp[i]);
  free(tmp);
  return n;
}

int gpu_exec_run(gpu_exec *x, const int32_t *tokens, const int32_t *labels, int64_t step, float *outputs,
                 double *grad_norm, char *err, size_t errlen) {
  const ir_graph *g = x->g;
  x->err = err;
  x->errlen = errlen;
  x->step = step;
  x->gnorm = 0;
  gpu_attention_new_run(x->rt->attn);
  for (int i = 0; i < g->n_nodes; i++) release(x, &x->val[i]);
  routes_release(x);
  hcounts_release(x);
  if (gpu_upload(x->rt->g, x->tokens, tokens, (size_t)x->T * 4) || gpu_upload(x->rt->g, x->labels, labels, (size_t)x->T * 4)) {
    snprintf(err, errlen, "%s", gpu_error(x->rt->g));
    return -1;
  }
  int rc = 0;
  for (int id = 0; id < g->n_nodes && rc == 0; id++) {
    gpu_profile_mark(x->prof, id);
    for (int j = 0; j < g->nodes[id].n_in && rc == 0; j++)
      if (comm_wait(x, g->nodes[id].in[j]) != 0) rc = fail(x, id, "%s", gpu_error(x->rt->g));
    if (rc == 0) rc = update_wait_inputs(x, id);
    if (rc == 0) rc = exec_table[g->nodes[id].op](x, id);
    if (!x->keep_all)
      for (int j = 0; j < g->nodes[id].n_in; j++) {
        int v = g->nodes[id].in[j];
        if (x->last_use[v] == id) release(x, &x->val[v]);
        /* a packed quantize lives until the FP8 site (or the decoding split backward) that
           reads it through this dequantize, and the input of a viewed slice until its last cast */
        if (g->nodes[v].op == OP_MXFP8_DEQUANTIZE && (!x->view[v] || x->view[v] == VIEW_DECODE) &&
            x->last_use[g->nodes[v].in[0]] == id)
          release(x, &x->val[g->nodes[v].in[0]]);
        else if (x->view[v] == VIEW_GATHER) /* its input and perm live to its last quantize */
          for (int k = 0; k < 2; k++) {
            if (x->last_use[g->nodes[v].in[k]] == id) release(x, &x->val[g->nodes[v].in[k]]);
          }
        else if (x->view[v] && x->last_use[gpu_view_root(g, x->view, v)] == id)
          release(x, &x->val[gpu_view_root(g, x->view, v)]);
      }
  }
  for (int v = 0; v < g->n_nodes; v++) /* the outputs and the step's end come after every collective */
    if (comm_wait(x, v) != 0 && rc == 0) rc = -1, snprintf(err, errlen, "%s", gpu_error(x->rt->g));
  if (rc == 0) {
    gpu_profile_mark(x->prof, g->n_nodes);
    gpu_profile_step_done(x->prof);
  } else {
    gpu_profile_step_abort(x->prof);
  }
  int ckc = CK_OK;
  if (rc == 0 && rt_cuda_check(KX, &ckc) != 0) rc = -1, snprintf(err, errlen, "%s", rt_cuda_error(KX));
  if (rc == 0 && ckc != CK_OK) rc = -1, snprintf(err, errlen, "a kernel found bad data: %s (token or label out of range?)", ck_strerror(ckc));
  for (int i = 0; rc == 0 && i < g->n_outputs; i++)
    if (gpu_download(x->rt->g, &outputs[i], x->val[g->outputs[i]].p, 4)) rc = -1, snprintf(err, errlen, "%s", gpu_error(x->rt->g));
  if (rc == 0 && grad_norm) {
    float gn = 0;
    if (x->gnorm && gpu_download(x->rt->g, &gn, x->gnorm, 4)) rc = -1, snprintf(err, errlen, "%s", gpu_error(x->rt->g));
    *grad_norm = gn;
  }
  if (!x->keep_all) {
    for (int i = 0; i < g->n_nodes; i++) release(x, &x->val[i]);
    routes_release(x);
  }
  update_run_end(x->rt); /* (after the releases: the gradients among them are held) */
  return rc;
}

int gpu_exec_views(const gpu_exec *x, int view) {
  int n = 0;
  for (int id = 0; id < x->g->n_nodes; id++) n += x->view[id] == view;
  return n;
}
