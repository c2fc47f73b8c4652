/* gpu_exec.c -- the IR on one GPU, node by node: one exec function per op (the op table's
 * CUDA column), mirroring cpu_exec.c. Values live in device buffers from a size-class pool
 * and go back to it after their last use. */
#include "gpu_exec.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ep.h"
#include "cpu_kernels.h"
#include "gpu_attention.h"
#include "gpu_blas.h"
#include "gpu_comm.h"
#include "gpu_fp8.h"
#include "gpu_pool.h"
#include "gpu_kernels.h"
#include "gpu_profile.h"
#include "gpu_views.h"
#include "gpu_wgmma.h"

/* ---------------------------------------------------------------- the runtime */
typedef struct {
  gpu_ptr w, m, v; /* (numel) f32 master weight and AdamW moments */
  /* (numel) bf16 compute copy, kept between steps for the graph's cast(param -> bf16): AdamW
   * writes it with the weight, so the forward's cast costs nothing; 0 until first needed.
   * wb_fresh: it equals bf16(w) (cleared when w is uploaded). */
  gpu_ptr wb;
  int wb_fresh;
  /* wb_ld > 0: the copy is a window of a stacked expert weight (rows of wb_cols elements,
   * wb_ld apart, inside one of gpu_runtime.stacks), not an allocation of its own */
  int64_t wb_cols, wb_ld;
  int squares; /* 1 + the index of the stack kept as squares that holds it (dev_stack); 0: none */
} dev_param;

/* The bf16 copies of a stack's parameters laid out as the stack (gpu_views.h, VIEW_STACKED):
 * every graph whose stack has the same operands shares it. */
typedef struct {
  int *params; /* (n) parameter indices, in the stack's operand order */
  int n;
  gpu_ptr p;
  /* squares (the weight-tile recipe on cuBLASLt, plan_stacks): instead of bf16 copies the stack
   * is kept as the FP8 operands its quantizes make -- q[0] (E, A, B) as the stack, q[1]
   * (E, B, A) transposed, blk[] their square scales -- and AdamW writes them with the weights
   * (rt_cuda_adamw_squares, parameter table tab): no copy written, no quantize reading it.
   * fresh: they are the current weights' squares. */
  int squares, fresh, block;
  int64_t E, A, B;
  gpu_ptr q[2], blk[2], tab;
} dev_stack;

struct gpu_runtime {
  gpu_ctx *g;
  rt_cuda *k;
  gpu_blas *blas;
  gpu_attention *attn;
  gpu_wgmma *wgmma; /* the device-driven FP8 grouped GEMM, built at the first FP8 graph (sm_90a) */
  int wgmma_tried;
  rt_params *ps;
  dev_param *dp; /* (ps->n) */
  dev_stack *stacks;
  int n_stacks;
  gpu_pool *pool; /* activations and scratch (gpu_pool.h) */
  char device[320];
};

/* The pool's backend: the loader's allocations, and what no tensor occupies told to it. */
static int pool_alloc(void *ctx, size_t bytes, uint64_t *p) { return gpu_alloc(ctx, p, bytes, "activations"); }
static void pool_release(void *ctx, uint64_t p) { gpu_free(ctx, p); }
static void pool_idle(void *ctx, ptrdiff_t delta) { gpu_note_idle(ctx, delta); }

static int pool_get(gpu_runtime *rt, size_t bytes, gpu_ptr *p) { return gpu_pool_get(rt->pool, bytes, p); }
static void pool_put(gpu_runtime *rt, gpu_ptr p) { gpu_pool_put(rt->pool, p); }

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
    size_t bytes = (size_t)ps->p[i].numel * 4, mb = (size_t)ps->p[i].numel * (ps->moments_bf16 ? 2 : 4);
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
  if (rt->g) gpu_sync(rt->g);
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
  for (int i = 0; i < ps->n; i++) {
    rt_param *p = &ps->p[i];
    const size_t bytes = (size_t)p->numel * 4;
    int rc = up ? gpu_upload(rt->g, rt->dp[i].w, p->w, bytes) : gpu_download(rt->g, p->w, rt->dp[i].w, bytes);
    if (rc == 0) rc = moment_move(rt, up, rt->dp[i].m, p->m, p->numel);
    if (rc == 0) rc = moment_move(rt, up, rt->dp[i].v, p->v, p->numel);
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

const char *gpu_runtime_device(const gpu_runtime *rt) { return rt->device; }
size_t gpu_runtime_peak_bytes(const gpu_runtime *rt) { return gpu_peak_bytes(rt->g); }
size_t gpu_runtime_peak_used_bytes(const gpu_runtime *rt) { return gpu_peak_used_bytes(rt->g); }
gpu_ctx *gpu_runtime_ctx(gpu_runtime *rt) { return rt->g; }
size_t gpu_runtime_live_bytes(const gpu_runtime *rt) { return gpu_used_bytes(rt->g); }
gpu_host_stats gpu_runtime_host_stats(const gpu_runtime *rt) { return gpu_host_stats_of(rt->g); }

/* ---------------------------------------------------------------- the executor */
typedef struct {
  gpu_ptr p;
  size_t bytes;   /* pool size class request; 0 = not owned (param, input) */
  int64_t rows;   /* run-time leading dimension */
  int64_t numel;
  int64_t ld; /* a strided view's row stride in elements (VIEW_STRIDED); 0: rows of its own columns */
  /* an mxfp8_quantize's packed FP8 form (gpu_fp8.h): E4M3 bytes and scales; owned when the
   * sizes are not 0 */
  gpu_ptr q8, s8;
  size_t q8_bytes, s8_bytes;
  gpu_ptr sq; /* a weight in 128 x 128 squares (tile = 128): cuBLASLt's square scales, inside s8 */
} dev_value;

/* The expert permutation of one routing (a topk result), computed once per run. */
typedef struct {
  int idx;            /* value id of the topk result, -1 = empty slot */
  int64_t E;
  rt_cuda_routing r;  /* device arrays */
  gpu_ptr mem;
  size_t bytes;
  int32_t *counts, *offsets; /* host copies (E), (E+1) */
  gpu_ptr dy_stacked; /* combine's expert gradients, all experts (T*k, H), for one dout */
  int dy_of;          /* the dout value id it was computed for */
  size_t dy_bytes;
} routing;

#define MAX_ROUTINGS 256
struct gpu_exec {
  gpu_runtime *rt;
  const ir_graph *g;
  int *param_index; /* (n_nodes) index into rt->ps/dp for param ops, -1 otherwise */
  int *last_use;
  dev_value *val;
  routing routes[MAX_ROUTINGS];
  int n_routes;
  gpu_ptr tokens, labels; /* i32 (T) */
  int64_t T;
  gpu_ptr gnorm;          /* f32 () the last grad_norm */
  int keep_all;
  gpu_profile *prof;      /* MOEC_PROFILE=1: per-op times, printed when the executor is freed */
  int grouped_device;     /* MOEC_GROUPED_GEMM=device: the device-driven grouped GEMMs, no host sync */
  int adamw_single;       /* MOEC_ADAMW_MULTI=0: one launch per parameter */
  int aw_from, aw_until;  /* this step's AdamW run (aw_from, aw_until] was done by the launch at aw_from */
  int32_t **hcounts;      /* (n_nodes) host copies of expert-count values, downloaded once per step */
  void **cpin, **cev;     /* (n_nodes) an expert_counts' page-locked copy, queued as it is made, and its event */
  uint8_t *cpending;      /* (n_nodes) 1: that copy is queued this step, not yet read */
  gpu_fp8_plan fp8;       /* which expert GEMMs run in FP8 (MOEC_FP8_GEMM=0: none) */
  gpu_wgmma *wgmma;       /* their kernel: device-driven wgmma (MOEC_FP8_GEMM=wgmma), or NULL: cuBLASLt per expert */
  uint8_t *view;          /* (n_nodes) gpu_view: a value read through its input (gpu_views.h) */
  int *stack_of;          /* (n_nodes) a VIEW_STACKED stack's index in rt->stacks, -1 otherwise */
  gpu_comm *comm;         /* data/expert parallelism: this rank's collectives (gpu_exec_set_comm) */
  void **comm_done;       /* (n_nodes) an all_reduce's end on the communication stream (made on first use) */
  uint8_t *comm_pending;  /* (n_nodes) 1: that all_reduce may still run; the stream waits before a reader */
  int32_t **ep_all;       /* (n_nodes) the EP group's counts (P x E, host) of a counts value, once per step */
  int64_t step;
  char *err;
  size_t errlen;
};
typedef struct gpu_exec gx;
#define N(id) (&x->g->nodes[id])
#define V(id, k) (&x->val[N(id)->in[k]])
#define COLS(id) (N(id)->type.rank >= 2 ? N(id)->type.dims[N(id)->type.rank - 1] : 1)
#define INCOLS(id, k) COLS(N(id)->in[k])
#define KX x->rt->k

static int fail(gx *x, int id, const char *fmt, ...) {
  const ir_node *n = &x->g->nodes[id];
  int k = snprintf(x->err, x->errlen, "%s:%d:%d: error: %s (%%%d) on the GPU: ", n->loc.file ? n->loc.file : "?",
                   n->loc.line, n->loc.col, ir_ops[n->op].name, id);
  va_list ap;
  va_start(ap, fmt);
  if (k >= 0 && (size_t)k < x->errlen) vsnprintf(x->err + k, x->errlen - (size_t)k, fmt, ap);
  va_end(ap);
  return -1;
}

static int ck(gx *x, int id, int rc) { return rc == 0 ? 0 : fail(x, id, "%s", rt_cuda_error(KX)); }

/* Storage of an IR dtype. An e4m3 value (an mxfp8_quantize result) is kept as the exact values
 * its E4M3 elements and E8M0 scales encode, in bf16: 3 mantissa bits fit in 7, and the scale
 * is a power of two (exact unless the block's scale is below 2^-124, where its smallest E4M3
 * steps fall under bf16's smallest subnormal, 2^-133: a block amax under about 2^-116), at
 * half the bytes of f32. */
static cg_dtype cdt(ir_dtype t) { return t == DT_BF16 || t == DT_E4M3 ? CG_DT_BF16 : CG_DT_F32; }
static size_t dsize(ir_dtype t) { return t == DT_BF16 || t == DT_E4M3 ? 2 : 4; }
static cg_dtype DT(gx *x, int v) { return cdt(x->g->nodes[v].type.dtype); }

/* The result of id, rows rows (and `slack` more allocated, unused: an FP8 GEMM's 16-row blocks
 * may write past an expert's rows, gpu_fp8.h). */
static int alloc_out_slack(gx *x, int id, int64_t rows, int zero, int64_t slack) {
  const ir_type *t = &N(id)->type;
  int64_t numel = t->rank == 0 ? 1 : rows, row = 1;
  for (int d = 1; d < t->rank; d++) numel *= t->dims[d], row *= t->dims[d];
  dev_value *v = &x->val[id];
  v->rows = t->rank == 0 ? 1 : rows;
  v->numel = numel;
  v->bytes = (size_t)(numel + slack * row > 0 ? numel + slack * row : 1) * dsize(t->dtype);
  if (pool_get(x->rt, v->bytes, &v->p) != 0) {
    v->bytes = 0;
    return fail(x, id, "%s", gpu_error(x->rt->g));
  }
  if (zero && gpu_memset8(x->rt->g, v->p, 0, v->bytes) != 0) return fail(x, id, "%s", gpu_error(x->rt->g));
  return 0;
}

static int alloc_out(gx *x, int id, int64_t rows, int zero) { return alloc_out_slack(x, id, rows, zero, 0); }

/* The stream waits for value v's all_reduce if it may still run beside it (gpu_comm.h). */
static int comm_wait(gx *x, int v) {
  if (!x->comm_pending || !x->comm_pending[v]) return 0;
  x->comm_pending[v] = 0;
  return gpu_stream_wait(x->rt->g, NULL, x->comm_done[v]);
}

static void release(gx *x, dev_value *v) {
  /* a buffer an all_reduce may still write goes back to the pool only behind it */
  if (comm_wait(x, (int)(v - x->val)) != 0) return; /* leaked, not reused while written; the step fails later */
  if (v->bytes) pool_put(x->rt, v->p);
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
static int gemm(gx *x, int id, int64_t m, int64_t n, int64_t k, int a, int ta, int b, int tb, int c) {
  gpu_mat A = {DT(x, a), x->val[a].p, INCOLS(id, 0), 0, ta};
  gpu_mat B = {DT(x, b), x->val[b].p, COLS(b), 0, tb};
  gpu_mat C = {DT(x, c), x->val[c].p, COLS(c), 0, 0};
  A.ld = COLS(a);
  char e[512];
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
static int fresh_copy(gx *x, int id, int i) {
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

static int exec_CAST(gx *x, int id) {
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
  return gemm(x, id, a->rows, COLS(id), INCOLS(id, 0), N(id)->in[0], 0, N(id)->in[1], 0, id);
}

static int exec_ROPE(gx *x, int id) {
  const dev_value *a = V(id, 0);
  int64_t nh = ir_get_int(N(id), "heads", 1), hd = COLS(id) / nh, seq = ir_get_int(N(id), "seq", a->rows);
  double theta = ir_get_float(N(id), "theta", 1e4);
  if (alloc_out(x, id, a->rows, 0)) return -1;
  int rc = ir_get_int(N(id), "inverse", 0) ? rt_cuda_rope_bwd(KX, DT(x, id), a->p, x->val[id].p, a->rows, nh, hd, seq, theta)
                                           : rt_cuda_rope_fwd(KX, DT(x, id), a->p, x->val[id].p, a->rows, nh, hd, seq, theta);
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

static int exec_LABEL_COUNT(gx *x, int id) {
  const dev_value *lab = V(id, 0);
  if (alloc_out(x, id, 1, 0)) return -1;
  return ck(x, id, rt_cuda_label_count(KX, lab->p, x->val[id].p, lab->rows));
}

static int exec_ALL_REDUCE(gx *x, int id) {
  const dev_value *a = V(id, 0);
  const char *gs = ir_get_str(N(id), "group", "world");
  comm_group grp = !strcmp(gs, "ep") ? COMM_EP : !strcmp(gs, "dp") ? COMM_DP : COMM_WORLD;
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
  return ck(x, id, rt_cuda_fill(KX, DT(x, id), x->val[id].p, x->val[id].numel, (float)ir_get_float(N(id), "value", 0)));
}

static int exec_MATMUL(gx *x, int id) {
  int a = N(id)->in[0], b = N(id)->in[1];
  int ta = (int)ir_get_int(N(id), "trans_a", 0), tb = (int)ir_get_int(N(id), "trans_b", 0);
  int64_t ar = x->val[a].rows, ac = COLS(a), br = x->val[b].rows, bc = COLS(b);
  int64_t m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
  if ((tb ? bc : br) != k) return fail(x, id, "inner sizes differ at run time");
  if (alloc_out(x, id, m, k == 0)) return -1;
  if (k == 0) return 0; /* an expert with no rows: its weight gradient is zero */
  return gemm(x, id, m, n, k, a, ta, b, tb, id);
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
  if (alloc_out(x, id, a->rows, 0)) return -1;
  return ck(x, id, rt_cuda_rmsnorm_bwd(KX, DT(x, id), DT(x, N(id)->in[2]), a->p, V(id, 2)->p, dy->p, x->val[id].p, 0,
                                       a->rows, COLS(id), (float)ir_get_float(N(id), "eps", 1e-5)));
}

static int exec_RMSNORM_BWD_W(gx *x, int id) {
  const dev_value *dy = V(id, 0), *a = V(id, 1);
  if (alloc_out(x, id, INCOLS(id, 1), 1)) return -1;
  return ck(x, id, rt_cuda_rmsnorm_bwd(KX, DT(x, N(id)->in[1]), CG_DT_F32, a->p, 0, dy->p, 0, x->val[id].p, a->rows,
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
  if (x->view[id] == VIEW_PIECE && !x->keep_all) { /* its piece of the split grouped_mlp_bwd; not owned */
    int G = N(id)->in[0];
    x->val[id] = (dev_value){.p = a->p + (gpu_ptr)gpu_split_offset(a->rows, ir_get_int(N(G), "ffn", 0), ir_get_int(N(id), "start", 0)),
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

/* ---- stacks kept as squares (dev_stack.squares) ---- */
/* Stack sk's squares made from the weights as they are (the first step, or after an upload). */
static int squares_refresh(gx *x, int id, dev_stack *sk) {
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

/* The AdamW run t (n entries, from node id) for the parameters of stacks kept as squares: one
 * rt_cuda_adamw_squares a stack whose parameters are all in the run, with one weight decay and
 * their gradients windows of one stacked gradient; those entries leave t (*n shrinks). A
 * stack only partly so keeps its entries and its squares go stale (its next quantize remakes
 * them from the weights). */
static int squares_adamw(gx *x, int id, cg_dtype gt, const rt_cuda_adamw_hp *hp, gpu_ptr gnorm, rt_cuda_adamw_tensor *t,
                         int *n) {
  gpu_runtime *rt = x->rt;
  int *at = NULL; /* (ps->n) a parameter's entry in t, -1: none */
  for (int s = 0; s < rt->n_stacks; s++) {
    dev_stack *sk = &rt->stacks[s];
    if (!sk->squares) continue;
    if (!at) {
      if (!(at = malloc((size_t)rt->ps->n * sizeof *at))) return fail(x, id, "out of host memory");
      for (int i = 0; i < rt->ps->n; i++) at[i] = -1;
      for (int j = 0; j < *n; j++)
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
        all &= j >= 0 && j00 >= 0 && t[j].n >= 0 && t[j].wd == t[j00].wd && t[j00].g % 16 == 0 &&
               squares_grad_fits(sk, &t[j], gt, t[j00].g, e, c0, rt->ps->p[sk->params[part * sk->E + e]].numel / sk->A);
      }
    if (!in_run) continue;
    if (!all) {
      sk->fresh = 0;
      continue;
    }
    if (ck(x, id, rt_cuda_adamw_squares(KX, sk->tab, (int)parts, sk->E, sk->A, sk->B, gt, t[j00].g, gnorm, hp, t[j00].wd,
                                        sk->block, sk->q[0], sk->blk[0], sk->q[1], sk->blk[1]))) {
      free(at);
      return -1;
    }
    sk->fresh = 1;
    for (int k = 0; k < sk->n; k++) {
      rt->dp[sk->params[k]].wb_fresh = 0; /* a copy of its own, if another graph made one, is stale */
      t[at[sk->params[k]]].n = -1;        /* done */
    }
  }
  int m = 0;
  for (int j = 0; j < *n; j++)
    if (t[j].n >= 0) t[m++] = t[j];
  *n = m;
  free(at);
  return 0;
}

/* The run of AdamW nodes from id with id's gradient storage and norm (they stand together at
 * the step's end) goes in one rt_cuda_adamw_multi; the run's later nodes then find it done. */
static int exec_ADAMW(gx *x, int id) {
  if (id > x->aw_from && id <= x->aw_until) return 0;
  const moec_config *c = &x->g->cfg;
  rt_cuda_adamw_hp hp = {ck_lr_at(x->step, c->steps, c->warmup, c->lr, c->min_lr, c->schedule), c->beta1, c->beta2,
                         c->adam_eps, 0, x->step, c->clip, x->rt->ps->moments_bf16 /* as they are stored */};
  const cg_dtype gt = DT(x, N(id)->in[1]);
  int end = id + 1;
  while (!x->adamw_single && end < x->g->n_nodes && N(end)->op == OP_ADAMW && DT(x, N(end)->in[1]) == gt &&
         N(end)->in[2] == N(id)->in[2])
    end++;
  for (int a = id + 1; a < end; a++) /* the run's later gradients: the loop waited only for id's */
    for (int k = 0; k < N(a)->n_in; k++)
      if (comm_wait(x, N(a)->in[k]) != 0) return fail(x, id, "%s", gpu_error(x->rt->g));
  rt_cuda_adamw_tensor *t = malloc((size_t)(end - id) * sizeof *t);
  if (!t) return fail(x, id, "out of host memory");
  for (int a = id; a < end; a++) t[a - id] = adamw_entry(x, a);
  int nt = end - id;
  int rc = squares_adamw(x, id, gt, &hp, V(id, 2)->p, t, &nt);
  if (rc == 0) rc = ck(x, id, rt_cuda_adamw_multi(KX, gt, t, nt, V(id, 2)->p, &hp));
  free(t);
  x->aw_from = id, x->aw_until = end - 1;
  return rc;
}

/* ---- the fusion passes' ops (group-linear, grouped-mlp): expert-sorted rows, counts read on
 * the device (codegen/cg_grouped.c); nothing here waits for the GPU. ---- */
#define OPTP(id, k) (N(id)->n_in > (k) ? V(id, k)->p : 0)
static int need_f32(gx *x, int id, int v, const char *what) {
  return x->g->nodes[v].type.dtype == DT_F32 ? 0 : fail(x, id, "%s must be f32 on the GPU", what);
}

/* The counts' host copy is queued right behind the kernel that makes them: by the time a
 * grouped GEMM on cuBLASLt needs them (host_counts), the GPU has them on their way and still has
 * the layer's permute and quantizes to run, instead of draining its queue at a blocking copy. */
static int exec_EXPERT_COUNTS(gx *x, int id) {
  const dev_value *idx = V(id, 0);
  const int64_t E = N(id)->type.dims[0];
  if (alloc_out(x, id, E, 0)) return -1;
  if (ck(x, id, rt_cuda_expert_counts(KX, idx->p, idx->rows, INCOLS(id, 0), E, x->val[id].p))) return -1;
  if (x->grouped_device) return 0; /* no host copy wanted */
  gpu_ctx *g = x->rt->g;
  if ((!x->cpin[id] && gpu_alloc_host(g, &x->cpin[id], (size_t)E * 4)) || (!x->cev[id] && gpu_event_new(g, &x->cev[id])) ||
      gpu_download_async(g, x->cpin[id], x->val[id].p, (size_t)E * 4) || gpu_event_record(g, x->cev[id]))
    return fail(x, id, "%s", gpu_error(g));
  x->cpending[id] = 1;
  return 0;
}

static int exec_EXPERT_SORT(gx *x, int id) {
  const dev_value *idx = V(id, 0);
  if (alloc_out(x, id, idx->rows * INCOLS(id, 0), 0)) return -1;
  return ck(x, id, rt_cuda_expert_sort(KX, idx->p, idx->rows, INCOLS(id, 0), ir_get_int(N(id), "experts", 0), x->val[id].p));
}

static int exec_EXPERT_PERMUTE(gx *x, int id) {
  const dev_value *a = V(id, 0);
  int64_t k = ir_get_int(N(id), "top_k", 1);
  cg_dtype tw = N(id)->n_in > 2 ? DT(x, N(id)->in[2]) : CG_DT_F32;
  if (alloc_out(x, id, a->rows * k, 0)) return -1;
  if (DT(x, N(id)->in[0]) != DT(x, id)) return fail(x, id, "input and output dtypes differ");
  return ck(x, id, rt_cuda_expert_permute(KX, DT(x, id), tw, a->p, V(id, 1)->p, OPTP(id, 2), x->val[id].p, a->rows, k, COLS(id)));
}

static int exec_EXPERT_UNPERMUTE(gx *x, int id) {
  const dev_value *ys = V(id, 0);
  int64_t k = ir_get_int(N(id), "top_k", 1);
  cg_dtype tw = N(id)->n_in > 2 ? DT(x, N(id)->in[2]) : CG_DT_F32;
  if (alloc_out(x, id, ys->rows / k, 0)) return -1;
  if (DT(x, N(id)->in[0]) != DT(x, id)) return fail(x, id, "input and output dtypes differ");
  return ck(x, id, rt_cuda_expert_unpermute(KX, DT(x, id), tw, ys->p, V(id, 1)->p, OPTP(id, 2), x->val[id].p, ys->rows / k, k,
                                            COLS(id)));
}

static int exec_EXPERT_PROBS(gx *x, int id) {
  const dev_value *w = V(id, 0);
  if (need_f32(x, id, N(id)->in[0], "the routing weights") || need_f32(x, id, id, "the probabilities")) return -1;
  if (alloc_out(x, id, w->numel, 0)) return -1;
  return ck(x, id, rt_cuda_expert_probs(KX, w->p, V(id, 1)->p, x->val[id].p, w->rows, INCOLS(id, 0)));
}

static int exec_EXPERT_PROBS_BWD(gx *x, int id) {
  int64_t k = COLS(id), T = V(id, 0)->rows / k;
  if (need_f32(x, id, N(id)->in[0], "the probabilities' gradient") || need_f32(x, id, id, "the routing weights' gradient"))
    return -1;
  if (alloc_out(x, id, T, 0)) return -1;
  return ck(x, id, rt_cuda_expert_probs_bwd(KX, V(id, 0)->p, V(id, 1)->p, x->val[id].p, T, k));
}

static int exec_EXPERT_WEIGHT_GRAD(gx *x, int id) {
  const dev_value *a = V(id, 0);
  if (need_f32(x, id, id, "the routing weights' gradient")) return -1;
  if (alloc_out(x, id, a->rows, 0)) return -1;
  return ck(x, id, rt_cuda_expert_weight_grad(KX, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]), a->p, V(id, 1)->p, V(id, 2)->p,
                                              x->val[id].p, a->rows, COLS(id), INCOLS(id, 0)));
}

static int exec_STACK(gx *x, int id) {
  /* out[e, :, part p columns] = operand p*E + e */
  const ir_type *t = &N(id)->type;
  int64_t E = t->dims[0], in = t->dims[1], C = t->dims[2], parts = N(id)->n_in / E, c0 = 0;
  size_t es = dsize(t->dtype);
  const dev_stack *sk = x->stack_of[id] >= 0 ? &x->rt->stacks[x->stack_of[id]] : NULL;
  if (sk && sk->squares && !x->keep_all) { /* its quantizes take the squares (fp8_pack) */
    x->val[id] = (dev_value){.rows = E, .numel = E * in * C};
    return 0;
  }
  if (sk && !sk->squares) { /* the parameters' copies are the stack: refresh stale ones */
    for (int j = 0; j < N(id)->n_in; j++)
      if (fresh_copy(x, id, x->param_index[N(N(id)->in[j])->in[0]])) return -1;
    x->val[id] = (dev_value){.p = x->rt->dp[x->param_index[N(N(id)->in[0])->in[0]]].wb, .rows = E, .numel = E * in * C};
    return 0;
  }
  if (alloc_out(x, id, E, 0)) return -1;
  for (int64_t p = 0; p < parts; p++) {
    int64_t w = INCOLS(id, (int)(p * E));
    for (int64_t e = 0; e < E; e++) {
      int v = N(id)->in[p * E + e];
      if (ck(x, id, rt_cuda_copy_cols(KX, DT(x, v), DT(x, id), x->val[v].p, w, 0, x->val[id].p + (gpu_ptr)((size_t)(e * in * C) * es),
                                      C, c0, in, w)))
        return -1;
    }
    c0 += w;
  }
  return 0;
}

static int exec_UNSTACK(gx *x, int id) {
  int64_t in = N(N(id)->in[0])->type.dims[1], C = INCOLS(id, 0), e = ir_get_int(N(id), "expert", 0),
          start = ir_get_int(N(id), "start", 0), w = COLS(id);
  size_t es = dsize(N(N(id)->in[0])->type.dtype);
  if (x->view[id] == VIEW_SLAB && !x->keep_all) { /* expert e's slab of the stacked input, not owned */
    x->val[id] = (dev_value){.p = V(id, 0)->p + (gpu_ptr)((size_t)(e * in * C) * es), .rows = in, .numel = in * w};
    return 0;
  }
  if (x->view[id] == VIEW_STRIDED && !x->keep_all) { /* its window of expert e's rows, read with their stride */
    x->val[id] = (dev_value){.p = V(id, 0)->p + (gpu_ptr)((size_t)(e * in * C + start) * es), .rows = in, .numel = in * w,
                             .ld = C};
    return 0;
  }
  if (alloc_out(x, id, in, 0)) return -1;
  return ck(x, id, rt_cuda_copy_cols(KX, DT(x, N(id)->in[0]), DT(x, id), V(id, 0)->p + (gpu_ptr)((size_t)(e * in * C) * es), C,
                                     start, x->val[id].p, w, 0, in, w));
}

static int exec_PAD_COLS(gx *x, int id) {
  const dev_value *a = V(id, 0);
  int64_t w = INCOLS(id, 0), start = ir_get_int(N(id), "start", 0), W = COLS(id);
  if (alloc_out(x, id, a->rows, 1)) return -1;
  return ck(x, id, rt_cuda_copy_cols(KX, DT(x, N(id)->in[0]), DT(x, id), a->p, w, 0, x->val[id].p, W, start, a->rows, w));
}

/* ---- grouped GEMMs through cuBLASLt, one call per expert. cuBLASLt takes each expert's row
 * count from the host, so a counts vector is downloaded once per step (a stream sync per MoE
 * layer; the backward reuses the copy). MOEC_GROUPED_GEMM=device keeps the device-driven
 * kernels above instead (no sync, capturable; slower until issue 6's wgmma kernel). ---- */
static int grouped_blas(gx *x, cg_dtype ta, cg_dtype tb) { return !x->grouped_device && ta == tb; }

/* counts value v (i32 (E)): its host copy; the counts must sum to S, the rows they split */
static const int32_t *host_counts(gx *x, int id, int v, int64_t S) {
  if (!x->hcounts[v]) {
    int64_t E = x->val[v].numel, sum = 0;
    int32_t *c = malloc((size_t)(E > 0 ? E : 1) * sizeof *c);
    if (!c) return fail(x, id, "out of host memory"), NULL;
    if (x->cpending[v]) { /* queued by exec_EXPERT_COUNTS */
      x->cpending[v] = 0;
      if (gpu_event_wait(x->rt->g, x->cev[v]) != 0) {
        free(c);
        return fail(x, id, "%s", gpu_error(x->rt->g)), NULL;
      }
      memcpy(c, x->cpin[v], (size_t)E * sizeof *c);
    } else if (gpu_download(x->rt->g, c, x->val[v].p, (size_t)E * sizeof *c) != 0) {
      free(c);
      return fail(x, id, "%s", gpu_error(x->rt->g)), NULL;
    }
    for (int64_t e = 0; e < E; e++) sum += c[e] >= 0 ? c[e] : S + 1;
    x->hcounts[v] = c;
    if (sum != S) return fail(x, id, "expert counts sum to %lld, not to the %lld rows", (long long)sum, (long long)S), NULL;
  }
  return x->hcounts[v];
}

/* C rows of expert e (row stride ldc) = A rows of e (row stride lda, K columns) . B_e, the e-th
 * (K, N) matrix of b, or its stored (N, K) matrix read transposed (trans_b). */
static int ggemm_blas(gx *x, int id, const int32_t *cnt, int64_t E, cg_dtype ta, gpu_ptr a, int64_t lda, cg_dtype tb,
                      gpu_ptr b, int trans_b, cg_dtype tc, gpu_ptr c, int64_t ldc, int64_t N, int64_t K) {
  char e_[512];
  size_t sa = ta == CG_DT_BF16 ? 2 : 4, sb = tb == CG_DT_BF16 ? 2 : 4, sc = tc == CG_DT_BF16 ? 2 : 4;
  int64_t r0 = 0;
  int rc = gpu_blas_fork(x->rt->blas, e_, sizeof e_); /* disjoint rows of C: the experts may overlap */
  for (int64_t e = 0; e < E && rc == 0; r0 += cnt[e++]) {
    if (cnt[e] == 0) continue;
    gpu_mat A = {ta, a + (gpu_ptr)((size_t)(r0 * lda) * sa), lda, 0, 0};
    gpu_mat B = {tb, b + (gpu_ptr)((size_t)(e * K * N) * sb), trans_b ? K : N, 0, trans_b};
    gpu_mat C = {tc, c + (gpu_ptr)((size_t)(r0 * ldc) * sc), ldc, 0, 0};
    rc = gpu_gemm(x->rt->blas, cnt[e], N, K, 1.0f, &A, &B, 0.0f, &C, 1, e_, sizeof e_);
    gpu_blas_next_lane(x->rt->blas);
  }
  return gpu_blas_join(x->rt->blas, rc, e_, sizeof e_) ? fail(x, id, "%s", e_) : 0;
}

#define DIMOF(id, k, d) (x->g->nodes[N(id)->in[k]].type.dims[d])

/* ---- FP8 expert GEMMs (gpu_fp8.h): the packed forms, and the sites' GEMMs ---- */
static int pool_buf(gx *x, int id, size_t bytes, gpu_ptr *p) {
  return pool_get(x->rt, bytes ? bytes : 4, p) != 0 ? fail(x, id, "%s", gpu_error(x->rt->g)) : 0;
}

/* val[id].q8 (q8 bytes) and .s8 (s8 bytes) from the pool; on failure neither is held. */
static int packed_bufs(gx *x, int id, size_t q8, size_t s8) {
  dev_value *v = &x->val[id];
  if (pool_buf(x, id, q8, &v->q8)) return -1;
  if (pool_buf(x, id, s8, &v->s8)) {
    pool_put(x->rt, v->q8);
    v->q8 = 0;
    return -1;
  }
  v->q8_bytes = q8, v->s8_bytes = s8;
  return 0;
}

/* The quantize behind input k of FP8 site id (input k is its dequantize). */
#define QOF(id, k) (N(N(id)->in[k])->in[0])

/* Writes quantize id's packed form (its plan kind) into val[id].q8 / .s8. */
static int fp8_pack(gx *x, int id) {
  const ir_node *n = N(id);
  const dev_value *a = V(id, 0);
  dev_value *v = &x->val[id];
  cg_dtype t = DT(x, n->in[0]);
  int64_t block = ir_get_int(n, "block", 32);
  size_t es = dsize(x->g->nodes[n->in[0]].type.dtype);
  int kind = x->fp8.kind[id];
  v->sq = 0;
  /* the input: a itself, or through a cast view (rounded here) and/or a slice's window */
  int r = n->in[0], rb = 0;
  int64_t sx = 0;
  if (x->view[r] == VIEW_CAST && !x->val[r].p) rb = 1, r = N(r)->in[0];
  if (x->view[r] == VIEW_WINDOW && !x->val[r].p) sx = ir_get_int(N(r), "start", 0), r = N(r)->in[0];
  gpu_ptr src = x->val[r].p;
  int64_t ldx = COLS(r);
  t = DT(x, r);
  if (kind == FP8_STORE) { /* (S, K) E4M3 + E8M0 codes, expanded by its dequantizes */
    int64_t S = a->rows, K = COLS(id);
    if (packed_bufs(x, id, (size_t)(S * K), (size_t)(S * K / block))) return -1;
    return ck(x, id, rt_cuda_mxfp8_quantize_win(KX, t, src, ldx, sx, rb, S, K, block, (int)ir_get_int(n, "share128", 0),
                                                v->q8, v->s8));
  }
  if (kind == FP8_ROWS) { /* (S, K): E4M3 as is, E8M0 codes; the reader lays the scales out per expert */
    int64_t S = a->rows, K = COLS(id);
    if (packed_bufs(x, id, (size_t)((S + 16) * K), (size_t)(S * K / block))) return -1; /* 16 rows of slack (gpu_fp8.h) */
    return ck(x, id, rt_cuda_mxfp8_quantize_win(KX, t, src, ldx, sx, rb, S, K, block, 1, v->q8, v->s8));
  }
  if (kind == FP8_COLS) { /* (S, C) by expert: transposed, padded expert blocks with f32 scales; for
                              the wgmma kernel one (C, fp8_cols_ld) matrix (gpu_wgmma.h) */
    int64_t S = a->rows, C = COLS(id), E = DIMOF(id, 1, 0), ldq = x->wgmma ? fp8_cols_ld(S, E) : 0;
    if (packed_bufs(x, id, (size_t)(C * (ldq > S + 128 * E ? ldq : S + 128 * E)), (size_t)(C * (S / 128 + E)) * 4))
      return -1;
    return ck(x, id, rt_cuda_mxfp8_quantize_cols_experts_win(KX, t, src, ldx, sx, rb, S, C, V(id, 1)->p, E, ldq, v->q8,
                                                             v->s8));
  }
  /* weights (E, A, B): W_IN along A -> (E, B, A) transposed; W_OUT along B -> as is. Then the
   * f32 scales, one segment of N rows per expert. */
  int64_t E = n->type.dims[0], A = n->type.dims[1], B = n->type.dims[2];
  int64_t N_ = kind == FP8_W_IN ? B : A, K = kind == FP8_W_IN ? A : B;
  size_t codes_bytes = (size_t)(E * N_ * K / block);
  gpu_ptr codes = 0;
  const int64_t tile = ir_get_int(n, "tile", 0);
  if (tile && x->stack_of[r] >= 0 && x->rt->stacks[x->stack_of[r]].squares) { /* kept as squares: not owned */
    dev_stack *sk = &x->rt->stacks[x->stack_of[r]];
    if (squares_refresh(x, id, sk)) return -1;
    const int tr = kind == FP8_W_IN;
    v->q8 = sk->q[tr], v->s8 = 0, v->sq = sk->blk[tr];
    v->q8_bytes = v->s8_bytes = 0;
    return 0;
  }
  /* squares: the VEC128 scales (the wgmma kernel's, and cuBLASLt's fallback) then the squares' */
  const size_t vec_bytes = (size_t)(E * fp8_scale_floats(fp8_rows(N_), K)) * 4,
               sq_bytes = tile ? (size_t)(E * rt_cuda_tile_blk_floats(N_, K)) * 4 : 0;
  if (packed_bufs(x, id, (size_t)(E * N_ * K), vec_bytes + sq_bytes) || pool_buf(x, id, codes_bytes, &codes)) return -1;
  int rc = 0;
  v->sq = 0;
  if (tile) { /* one pass: the squares' codes, the bytes in the reader's orientation, the scales */
    v->sq = v->s8 + (gpu_ptr)vec_bytes;
    if (sx) {
      pool_put(x->rt, codes);
      return fail(x, id, "internal error: a weight in squares read through a slice's window");
    }
    rc = rt_cuda_mxfp8_quantize_tiles(KX, t, src, rb, E, A, B, block, kind == FP8_W_IN, v->q8, codes, v->sq);
  } else if (kind == FP8_W_IN)
    for (int64_t e = 0; e < E && rc == 0; e++)
      rc = rt_cuda_mxfp8_quantize_cols(KX, t, a->p + (gpu_ptr)((size_t)(e * A * B) * es), A, B, block, 1,
                                       v->q8 + (gpu_ptr)(e * A * B), codes + (gpu_ptr)(e * A * B / block));
  else
    rc = rt_cuda_mxfp8_quantize(KX, t, a->p, E * A, B, block, 1, v->q8, codes);
  if (rc == 0) rc = rt_cuda_mxfp8_scales_vec128(KX, codes, E * N_, K, block, 0, 0, N_, v->s8);
  pool_put(x->rt, codes); /* stream order keeps it alive for the queued kernels */
  return ck(x, id, rc);
}

/* Per-expert f32 scales of the FP8_ROWS operand quantized by q (K columns) into a pool buffer. */
static int fp8_row_scales(gx *x, int id, int q, int64_t E, gpu_ptr counts, gpu_ptr *sf, size_t *bytes) {
  int64_t S = x->val[q].rows, K = COLS(q);
  *bytes = (size_t)((S + 16 * E) * (K / 128) + 4 * E) * 4; /* segments of fp8_rows(m_e) */
  if (pool_buf(x, id, *bytes, sf)) return -1;
  return ck(x, id, rt_cuda_mxfp8_scales_vec128(KX, x->val[q].s8, S, K, ir_get_int(N(q), "block", 32), counts, E, 0, *sf));
}

static int fp8_fail(gx *x, int id, const char *e) {
  return fail(x, id, "%s (MOEC_FP8_GEMM=0 runs the expert GEMMs in bf16 on the same MXFP8 values)", e);
}

/* The FP8 expert GEMMs run on the device-driven wgmma kernel (gpu_wgmma.h: one launch, the
 * counts value vc read on the device, no host sync) where the executor has it, else on
 * cuBLASLt, one call per expert, from the counts' host copy. */
static int fp8_gemm_rows(gx *x, int id, int vc, int64_t E, int64_t S, int64_t N_, int64_t K, gpu_ptr qa, gpu_ptr sa,
                         gpu_ptr qb, gpu_ptr sb, gpu_ptr sq, cg_dtype tc, gpu_ptr c, int64_t ldc) {
  char e_[512];
  int rc;
  if (x->wgmma) {
    rc = gpu_wgmma_fp8_rows(x->wgmma, x->val[vc].p, E, S, N_, K, qa, sa, qb, sb, tc, c, ldc, e_, sizeof e_);
  } else {
    const int32_t *cnt = host_counts(x, id, vc, S);
    if (!cnt) return -1;
    rc = gpu_fp8_grouped_gemm(x->rt->blas, cnt, E, N_, K, qa, sa, qb, sb, sq, tc, c, ldc, e_, sizeof e_);
  }
  return rc ? fp8_fail(x, id, e_) : 0;
}

/* out rows of expert e (N columns, stride ldc) = rows operand at input ka (K columns) . weights
 * operand at input kw, both in FP8; vc the counts value, S the rows. */
static int fp8_site_gemm(gx *x, int id, int ka, int kw, int64_t E, int vc, int64_t S, int64_t N_, int64_t K,
                         cg_dtype tc, gpu_ptr c, int64_t ldc) {
  gpu_ptr sf = 0;
  size_t sf_bytes = 0;
  if (fp8_row_scales(x, id, QOF(id, ka), E, x->val[vc].p, &sf, &sf_bytes)) return -1;
  const dev_value *qa = &x->val[QOF(id, ka)], *qw = &x->val[QOF(id, kw)];
  int rc = fp8_gemm_rows(x, id, vc, E, S, N_, K, qa->q8, sf, qw->q8, qw->s8, qw->sq, tc, c, ldc);
  pool_put(x->rt, sf);
  return rc;
}

static int exec_GROUPED_LINEAR(gx *x, int id) {
  const dev_value *a = V(id, 0);
  if (N(id)->n_in > 3) return fail(x, id, "a grouped linear with a bias is not on the GPU yet");
  int64_t E = DIMOF(id, 1, 0), in = DIMOF(id, 1, 1), out = DIMOF(id, 1, 2);
  if (alloc_out_slack(x, id, a->rows, 0, x->fp8.site[id] ? 16 : 0)) return -1;
  if (x->fp8.site[id]) /* w (E, in, out) packed as (E, out, in) */
    return fp8_site_gemm(x, id, 0, 1, E, N(id)->in[2], a->rows, out, in, DT(x, id), x->val[id].p, out);
  if (grouped_blas(x, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]))) {
    const int32_t *cnt = host_counts(x, id, N(id)->in[2], a->rows);
    return cnt ? ggemm_blas(x, id, cnt, E, DT(x, N(id)->in[0]), a->p, in, DT(x, N(id)->in[1]), V(id, 1)->p, 0, DT(x, id),
                            x->val[id].p, out, out, in)
               : -1;
  }
  return ck(x, id, rt_cuda_grouped_linear_fwd(KX, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]), DT(x, id), a->p, V(id, 1)->p,
                                              V(id, 2)->p, x->val[id].p, a->rows, E, in, out));
}

static int exec_GROUPED_LINEAR_DGRAD(gx *x, int id) {
  const dev_value *dy = V(id, 0);
  int64_t E = DIMOF(id, 1, 0), in = DIMOF(id, 1, 1), out = DIMOF(id, 1, 2);
  if (alloc_out_slack(x, id, dy->rows, 0, x->fp8.site[id] ? 16 : 0)) return -1;
  if (x->fp8.site[id]) /* dx (S, in) = dy (S, out) . w[e]^T, w (E, in, out) along out, as is */
    return fp8_site_gemm(x, id, 0, 1, E, N(id)->in[2], dy->rows, in, out, DT(x, id), x->val[id].p, in);
  if (grouped_blas(x, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]))) {
    const int32_t *cnt = host_counts(x, id, N(id)->in[2], dy->rows);
    return cnt ? ggemm_blas(x, id, cnt, E, DT(x, N(id)->in[0]), dy->p, out, DT(x, N(id)->in[1]), V(id, 1)->p, 1, DT(x, id),
                            x->val[id].p, in, in, out)
               : -1;
  }
  return ck(x, id, rt_cuda_grouped_linear_dgrad(KX, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]), DT(x, id), dy->p, V(id, 1)->p,
                                                V(id, 2)->p, x->val[id].p, dy->rows, E, in, out));
}

static int exec_GROUPED_LINEAR_WGRAD(gx *x, int id) {
  const dev_value *a = V(id, 0);
  const ir_type *t = &N(id)->type;
  if (alloc_out(x, id, t->dims[0], 0)) return -1;
  if (x->fp8.site[id]) { /* dw[e] (in, out) = xs_e^T . dy_e over the expert's padded rows */
    const dev_value *qx = &x->val[QOF(id, 0)], *qd = &x->val[QOF(id, 1)];
    char e_[512];
    int rc;
    if (x->wgmma) {
      const int64_t ld = fp8_cols_ld(a->rows, t->dims[0]);
      rc = gpu_wgmma_fp8_wgrad(x->wgmma, V(id, 2)->p, t->dims[0], a->rows, t->dims[1], t->dims[2], ld, qx->q8, qx->s8,
                               qd->q8, qd->s8, DT(x, id), x->val[id].p, e_, sizeof e_);
    } else {
      const int32_t *cnt = host_counts(x, id, N(id)->in[2], a->rows);
      if (!cnt) return -1;
      rc = gpu_fp8_grouped_wgrad(x->rt->blas, x->rt->g, cnt, t->dims[0], t->dims[1], t->dims[2], qx->q8, qx->s8, qd->q8,
                                 qd->s8, DT(x, id), x->val[id].p, e_, sizeof e_);
    }
    return rc ? fp8_fail(x, id, e_) : 0;
  }
  if (grouped_blas(x, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]))) {
    /* dw[e] (in, out) = xs_e^T . dy_e, K = the expert's rows; zero for an expert without rows */
    const int32_t *cnt = host_counts(x, id, N(id)->in[2], a->rows);
    if (!cnt) return -1;
    int64_t in = t->dims[1], out = t->dims[2], r0 = 0;
    cg_dtype ta = DT(x, N(id)->in[0]), tc = DT(x, id);
    size_t sa = dsize(x->g->nodes[N(id)->in[0]].type.dtype), sc = dsize(t->dtype);
    char e_[512];
    int rc = gpu_blas_fork(x->rt->blas, e_, sizeof e_); /* one expert's gradient each: disjoint */
    for (int64_t e = 0; e < t->dims[0] && rc == 0; r0 += cnt[e++]) {
      gpu_ptr dw = x->val[id].p + (gpu_ptr)((size_t)(e * in * out) * sc);
      if (cnt[e] == 0) {
        if (gpu_memset8(x->rt->g, dw, 0, (size_t)(in * out) * sc) != 0) snprintf(e_, sizeof e_, "%s", gpu_error(x->rt->g)), rc = -1;
        continue;
      }
      gpu_mat A = {ta, a->p + (gpu_ptr)((size_t)(r0 * in) * sa), in, 0, 1};
      gpu_mat B = {ta, V(id, 1)->p + (gpu_ptr)((size_t)(r0 * out) * sa), out, 0, 0};
      gpu_mat C = {tc, dw, out, 0, 0};
      rc = gpu_gemm(x->rt->blas, in, out, cnt[e], 1.0f, &A, &B, 0.0f, &C, 1, e_, sizeof e_);
      gpu_blas_next_lane(x->rt->blas);
    }
    return gpu_blas_join(x->rt->blas, rc, e_, sizeof e_) ? fail(x, id, "%s", e_) : 0;
  }
  return ck(x, id, rt_cuda_grouped_linear_wgrad(KX, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]), DT(x, id), a->p, V(id, 1)->p,
                                                V(id, 2)->p, x->val[id].p, a->rows, t->dims[0], t->dims[1], t->dims[2]));
}

static int exec_GROUPED_COLSUM(gx *x, int id) {
  const dev_value *dy = V(id, 0);
  int64_t E = N(id)->type.dims[0];
  if (need_f32(x, id, id, "the bias gradient")) return -1;
  if (alloc_out(x, id, E, 0)) return -1;
  return ck(x, id, rt_cuda_grouped_colsum(KX, DT(x, N(id)->in[0]), dy->p, V(id, 1)->p, x->val[id].p, dy->rows, E, COLS(id)));
}

static int exec_GROUPED_MLP(gx *x, int id) {
  const dev_value *a = V(id, 0);
  int64_t E = DIMOF(id, 1, 0), H = INCOLS(id, 0), F = ir_get_int(N(id), "ffn", 0);
  if (need_f32(x, id, N(id)->in[4], "the routing probabilities")) return -1;
  if (DT(x, N(id)->in[1]) != DT(x, N(id)->in[2])) return fail(x, id, "w_gu and w_down dtypes differ");
  if (alloc_out_slack(x, id, a->rows, 0, x->fp8.site[id] ? 16 : 0)) return -1;
  cg_dtype tx = DT(x, N(id)->in[0]), tw = DT(x, N(id)->in[1]), to = DT(x, id);
  int64_t mx_block = ir_get_int(N(id), "mx_block", 0);
  if (x->fp8.site[id]) {
    /* gate_up = xs . w_gu[e] and y = act . w_down[e] in FP8, act quantized here (128-shared) */
    int64_t S = a->rows, W = H + 2 * F;
    gpu_ptr counts = V(id, 3)->p, gu = x->val[id].p + (gpu_ptr)((size_t)H * dsize(N(id)->type.dtype)), qa = 0, ca = 0, sfa = 0;
    size_t qa_bytes = (size_t)((S + 16) * F), ca_bytes = (size_t)(S * F / mx_block) + 4,
           sfa_bytes = (size_t)((S + 16 * E) * (F / 128) + 4 * E) * 4;
    int rc = pool_buf(x, id, qa_bytes, &qa) || pool_buf(x, id, ca_bytes, &ca) || pool_buf(x, id, sfa_bytes, &sfa) ? -1 : 0;
    if (rc == 0) rc = fp8_site_gemm(x, id, 0, 1, E, N(id)->in[3], S, 2 * F, H, to, gu, W);
    /* act = p silu(g) u, rounded to `to`, quantized in the same pass: no act in memory */
    if (rc == 0) rc = ck(x, id, rt_cuda_mxfp8_quantize_act(KX, to, gu, W, V(id, 4)->p, S, F, mx_block, 1, qa, ca));
    if (rc == 0) rc = ck(x, id, rt_cuda_mxfp8_scales_vec128(KX, ca, S, F, mx_block, counts, E, 0, sfa));
    const dev_value *qd = &x->val[QOF(id, 2)];
    if (rc == 0) rc = fp8_gemm_rows(x, id, N(id)->in[3], E, S, H, F, qa, sfa, qd->q8, qd->s8, qd->sq, to, x->val[id].p, W);
    if (qa) pool_put(x->rt, qa); /* those obtained; stream order keeps them for the queued work */
    if (ca) pool_put(x->rt, ca);
    if (sfa) pool_put(x->rt, sfa);
    return rc;
  }
  if (grouped_blas(x, tx, tw) && to == tw) {
    /* out (S, H + 2F) = y | gate_up: gate_up = xs . w_gu[e]; act = p * silu(g) * u; y = act . w_down[e] */
    const int32_t *cnt = host_counts(x, id, N(id)->in[3], a->rows);
    if (!cnt) return -1;
    int64_t S = a->rows, W = H + 2 * F;
    size_t es = dsize(N(id)->type.dtype), act_bytes = (size_t)(S * F > 0 ? S * F : 1) * es;
    gpu_ptr gu = x->val[id].p + (gpu_ptr)((size_t)H * es), act = 0;
    if (pool_get(x->rt, act_bytes, &act) != 0) return fail(x, id, "%s", gpu_error(x->rt->g));
    int rc = ggemm_blas(x, id, cnt, E, tx, a->p, H, tw, V(id, 1)->p, 0, to, gu, W, 2 * F, H);
    if (rc == 0) rc = ck(x, id, rt_cuda_mlp_act(KX, to, gu, W, V(id, 4)->p, act, S, F));
    /* mxfp8: the down GEMM's operand quantized to MXFP8 row blocks, as ck_grouped_mlp_fwd */
    const int64_t act_dims[2] = {S, F};
    if (rc == 0 && mx_block > 0)
      rc = ck(x, id, rt_cuda_mxfp8_qdq(KX, to, act, to, act, 2, act_dims, 1, mx_block, (int)ir_get_int(N(id), "mx_share128", 0), 0, 0));
    if (rc == 0) rc = ggemm_blas(x, id, cnt, E, to, act, F, tw, V(id, 2)->p, 0, to, x->val[id].p, W, H, F);
    pool_put(x->rt, act); /* stream order keeps it alive for the queued GEMMs */
    return rc;
  }
  return ck(x, id, rt_cuda_grouped_mlp_fwd(KX, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]), DT(x, id), a->p, V(id, 1)->p,
                                           V(id, 2)->p, V(id, 3)->p, V(id, 4)->p, x->val[id].p, a->rows, E, H, F,
                                           ir_get_int(N(id), "mx_block", 0)));
}

static int exec_GROUPED_MLP_BWD(gx *x, int id) {
  const dev_value *dy = V(id, 0);
  int64_t E = DIMOF(id, 2, 0), H = INCOLS(id, 0), F = ir_get_int(N(id), "ffn", 0), S = dy->rows;
  if (need_f32(x, id, N(id)->in[4], "the routing probabilities")) return -1;
  const int split = x->view[id] == VIEW_SPLIT && !x->keep_all;
  if (!split && alloc_out(x, id, S, 0)) return -1;
  if (split) { /* dg | du and act in bf16, dp in f32, apart (gpu_views.h) */
    dev_value *v = &x->val[id];
    *v = (dev_value){.rows = S, .numel = S * COLS(id), .bytes = (size_t)gpu_split_offset(S, F, 3 * F + 1)};
    if (pool_get(x->rt, v->bytes > 0 ? v->bytes : 1, &v->p) != 0) {
      v->bytes = 0;
      return fail(x, id, "%s", gpu_error(x->rt->g));
    }
  }
  /* the saved gate_up: a value, or a window of grouped_mlp's output (its rows ldg apart) */
  int gu = N(id)->in[1];
  gpu_ptr gup = V(id, 1)->p;
  int64_t ldg = 2 * F;
  if (x->view[gu] == VIEW_WINDOW && !gup) {
    int src = N(gu)->in[0];
    gup = x->val[src].p + (gpu_ptr)(ir_get_int(N(gu), "start", 0) * (int64_t)dsize(N(src)->type.dtype));
    ldg = COLS(src);
  }
  cg_dtype tdy = DT(x, N(id)->in[0]), tw = DT(x, N(id)->in[2]);
  if (x->fp8.site[id] || grouped_blas(x, tdy, tw)) {
    /* dact (S, F) f32 = dy . w_down[e]^T (FP8: w_down (E, F, H) along H, as is), then the
       rows: dg | du | act | dp */
    const int32_t *cnt = x->fp8.site[id] ? NULL : host_counts(x, id, N(id)->in[3], dy->rows);
    if (!x->fp8.site[id] && !cnt) return -1;
    size_t dact_bytes = (size_t)((S + (x->fp8.site[id] ? 16 : 0)) * F > 0 ? (S + (x->fp8.site[id] ? 16 : 0)) * F : 1) * 4;
    gpu_ptr dact = 0;
    if (pool_get(x->rt, dact_bytes, &dact) != 0) return fail(x, id, "%s", gpu_error(x->rt->g));
    int rc = x->fp8.site[id] ? fp8_site_gemm(x, id, 0, 2, E, N(id)->in[3], S, F, H, CG_DT_F32, dact, F)
                             : ggemm_blas(x, id, cnt, E, tdy, dy->p, H, tw, V(id, 2)->p, 1, CG_DT_F32, dact, F, F, H);
    const gpu_ptr out = x->val[id].p;
    /* a decoded gate_up (VIEW_DECODE): the stored quantize's E4M3 values and E8M0 codes */
    const int q = x->view[gu] == VIEW_DECODE && !gup ? N(gu)->in[0] : -1;
    if (rc == 0 && split)
      rc = ck(x, id, rt_cuda_mlp_bwd_split_mx(KX, DT(x, gu), dact, gup, ldg, q >= 0 ? x->val[q].q8 : 0, q >= 0 ? x->val[q].s8 : 0,
                                              q >= 0 ? ir_get_int(N(q), "block", 32) : 0, V(id, 4)->p, out,
                                              out + gpu_split_offset(S, F, 2 * F), out + gpu_split_offset(S, F, 3 * F), S, F));
    else if (rc == 0 && q >= 0)
      rc = fail(x, id, "internal error: a decoded gate_up off the split path");
    else if (rc == 0)
      rc = ck(x, id, rt_cuda_mlp_bwd_rows(KX, DT(x, gu), DT(x, id), dact, gup, ldg, V(id, 4)->p, out, S, F, COLS(id)));
    pool_put(x->rt, dact);
    return rc;
  }
  if (split || gup != V(id, 1)->p) /* gpu_views_plan splits and windows only what runs on cuBLASLt */
    return fail(x, id, "internal error: a split or windowed grouped_mlp_bwd off the cuBLASLt path");
  return ck(x, id, rt_cuda_grouped_mlp_bwd(KX, DT(x, N(id)->in[0]), DT(x, N(id)->in[1]), DT(x, N(id)->in[2]), DT(x, id), dy->p,
                                           V(id, 1)->p, V(id, 2)->p, V(id, 3)->p, V(id, 4)->p, x->val[id].p, dy->rows, E, H,
                                           F, COLS(id)));
}

/* MXFP8 (the mxfp8 pass): an e4m3 value is kept, as on the CPU, as the exact values its
 * E4M3 elements and E8M0 scales encode (quantize-dequantize along the op's axis; stored in
 * bf16, see cdt); the GEMMs then read it through mxfp8_dequantize in bf16, except where
 * the FP8 plan (gpu_fp8.h) packs it for FP8 GEMMs instead. */
static int exec_MXFP8_QUANTIZE(gx *x, int id) {
  const dev_value *a = V(id, 0);
  const ir_type *t = &N(id)->type;
  int64_t dims[IR_MAX_RANK];
  for (int d = 0; d < t->rank; d++) dims[d] = t->dims[d];
  dims[0] = a->rows;
  if (x->fp8.kind[id] != FP8_NONE && fp8_pack(x, id) != 0) return -1;
  if (!x->fp8.values[id]) { /* only FP8 GEMMs read it: the packed form is all */
    x->val[id].rows = a->rows;
    x->val[id].numel = a->numel;
    return 0;
  }
  if (alloc_out(x, id, a->rows, 0)) return -1;
  const int64_t tile = ir_get_int(N(id), "tile", 0);
  if (tile) { /* a weight in squares (E, A, B): quantized as is, then expanded into the values */
    const int64_t E = dims[0], A = dims[1], B = dims[2], block = ir_get_int(N(id), "block", 32);
    gpu_ptr q = 0, codes = 0, sq = 0;
    int rc = pool_buf(x, id, (size_t)(E * A * B), &q) || pool_buf(x, id, (size_t)(E * A * B / block), &codes) ||
                     pool_buf(x, id, (size_t)(E * rt_cuda_tile_blk_floats(A, B)) * 4, &sq)
                 ? -1
                 : 0;
    if (rc == 0) rc = ck(x, id, rt_cuda_mxfp8_quantize_tiles(KX, DT(x, N(id)->in[0]), a->p, 0, E, A, B, block, 0, q, codes, sq));
    if (rc == 0) rc = ck(x, id, rt_cuda_mxfp8_dequantize(KX, DT(x, id), q, codes, E * A, B, block, x->val[id].p));
    if (q) pool_put(x->rt, q); /* those obtained; stream order keeps them for the queued work */
    if (codes) pool_put(x->rt, codes);
    if (sq) pool_put(x->rt, sq);
    return rc;
  }
  if (x->view[N(id)->in[0]] == VIEW_WINDOW && !a->p) { /* the window of the slice's input, in place */
    int s = N(id)->in[0], src = N(s)->in[0];
    return ck(x, id, rt_cuda_mxfp8_qdq_cols(KX, DT(x, src), x->val[src].p, COLS(src), ir_get_int(N(s), "start", 0), DT(x, id),
                                            x->val[id].p, a->rows, COLS(id), ir_get_int(N(id), "block", 32),
                                            (int)ir_get_int(N(id), "share128", 0)));
  }
  gpu_ptr counts = N(id)->n_in == 2 ? V(id, 1)->p : 0;
  int64_t E = N(id)->n_in == 2 ? DIMOF(id, 1, 0) : 0;
  return ck(x, id, rt_cuda_mxfp8_qdq(KX, DT(x, N(id)->in[0]), a->p, DT(x, id), x->val[id].p, t->rank, dims,
                                     (int)ir_get_int(N(id), "axis", 0), ir_get_int(N(id), "block", 32),
                                     (int)ir_get_int(N(id), "share128", 0), counts, E));
}

static int exec_MXFP8_DEQUANTIZE(gx *x, int id) {
  int q = N(id)->in[0];
  if (x->view[id] == VIEW_DECODE && !x->keep_all) { /* its readers decode the packed form (gpu_views.h) */
    x->val[id] = (dev_value){.rows = x->val[q].rows, .numel = x->val[q].numel};
    return 0;
  }
  if (x->fp8.kind[q] == FP8_STORE) { /* expands the packed values: those the quantize would have kept */
    if (alloc_out(x, id, x->val[q].rows, 0)) return -1;
    return ck(x, id, rt_cuda_mxfp8_dequantize(KX, DT(x, id), x->val[q].q8, x->val[q].s8, x->val[q].rows, COLS(id),
                                              ir_get_int(N(q), "block", 32), x->val[id].p));
  }
  if (x->view[id] == VIEW_ALIAS && !x->keep_all) { /* its input's buffer (gpu_views.h); not owned */
    x->val[id] = (dev_value){.p = V(id, 0)->p, .rows = V(id, 0)->rows, .numel = V(id, 0)->numel};
    return 0;
  }
  if (!x->fp8.skip[id]) return exec_CAST(x, id);
  x->val[id] = (dev_value){.rows = V(id, 0)->rows, .numel = V(id, 0)->numel}; /* its readers take the packed form */
  return 0;
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

/* Whether stack id (VIEW_STACKED) can be kept as squares (dev_stack.squares): the weight-tile
 * recipe on cuBLASLt, every reader a weight quantize in squares that writes its packed form
 * only, whole squares in every part. MOEC_SQUARES=0 keeps bf16 copies (for side-by-side
 * timing). On the H200 a genos_1b gate_up stack's step: squares 0.54 ms against 0.62 for
 * AdamW + copies + the two quantizes (f32 moments); 0.44 against 0.46 (bf16 moments). */
static int squares_ok(gx *x, int id) {
  const char *env = getenv("MOEC_SQUARES");
  const ir_node *st = N(id);
  const int64_t E = st->type.dims[0];
  if ((env && strcmp(env, "0") == 0) || x->wgmma ||
      st->type.dims[1] % 128 || st->n_in % E)
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
static int plan_stacks(gx *x, char *err, size_t errlen) {
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
  x->stack_of = malloc(n * sizeof *x->stack_of);
  x->comm_done = calloc(n, sizeof *x->comm_done), x->comm_pending = calloc(n, 1);
  if (!x->hcounts || !x->cpin || !x->cev || !x->cpending || !x->ep_all || !x->view || !x->stack_of || !x->comm_done || !x->comm_pending) {
    snprintf(err, errlen, "out of host memory");
    gpu_exec_free(x);
    return NULL;
  }
  gpu_views_plan(g, &x->fp8, !x->grouped_device, x->last_use, x->view);
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

int gpu_exec_fp8_sites(const gpu_exec *x) {
  int n = 0;
  for (int id = 0; id < x->g->n_nodes; id++) n += x->fp8.site[id];
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
  gpu_free(x->rt->g, x->tokens);
  gpu_free(x->rt->g, x->labels);
  free(x->param_index);
  free(x->last_use);
  free(x->val);
  free(x);
}

void gpu_exec_keep_all(gpu_exec *x, int keep_all) { x->keep_all = keep_all; }

int64_t gpu_exec_value(gpu_exec *x, int id, float *dst, int64_t cap) {
  if (id < 0 || id >= x->g->n_nodes || !x->val[id].p) return 0;
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
  return rc;
}
