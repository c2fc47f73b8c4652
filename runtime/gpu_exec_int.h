/* gpu_exec_int.h -- the GPU executor's internals, shared by its files (not an interface):
 * gpu_exec.c -- the runtime (parameters on the device), the executor's core (values, the
 *   pool, routing, the run) and the dense ops, the optimizer included;
 * gpu_exec_grouped.c -- the fusion passes' ops: grouped GEMMs on cuBLASLt, the GroupedMLP,
 *   the FP8 expert GEMMs and the MXFP8 quantizes that feed them;
 * gpu_exec_stacks.c -- the stacked expert weights: bf16 copies laid out as the stack, or the
 *   FP8 squares AdamW writes. */
#ifndef MOEC_GPU_EXEC_INT_H
#define MOEC_GPU_EXEC_INT_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "gpu_attention.h"
#include "gpu_blas.h"
#include "gpu_comm.h"
#include "gpu_exec.h"
#include "gpu_fp8.h"
#include "gpu_kernels.h"
#include "gpu_pool.h"
#include "gpu_profile.h"
#include "gpu_views.h"
#include "gpu_wgmma.h"

/* ---- the runtime's state ---- */
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

/* AdamW beside the next forward (gpu_exec_update.c): a step's update runs on its own stream,
 * each launch followed by an event; the next forward's first reader of a parameter waits for
 * the event after that parameter's launch, so the update of later layers overlaps the forward
 * of earlier ones. The pool blocks the update reads (the gradients, the norm) are held out of
 * the pool until the main stream has waited for the event after their last reader. */
typedef struct {
  gpu_ptr p;
  int ev; /* back to the pool once the main stream waited for ev[ev] */
} held_block;

typedef struct {
  int mode;        /* MOEC_ADAMW_OVERLAP: 0 off, 1 the default priority, 2 high, 3 low; -1 unread */
  void *stream;    /* the update's stream, made on first use */
  void *start;     /* recorded on the main stream before a run of launches: the gradients are done */
  void *tail;      /* recorded on the update's stream when the main stream settles (update_settle) */
  void **ev;       /* (cap_ev) after each launch of the update in flight */
  int n_ev, cap_ev;
  int waited;      /* the main stream waited for ev[0 .. waited) */
  int *param_ev;   /* (ps->n) the event after parameter i's update, -1: none in flight */
  held_block *held; /* (cap_held) */
  int n_held, cap_held;
  int open;        /* a run's update is being queued (from its first launch to the run's end) */
  int swapped;     /* the update's stream is the context's (between update_begin and update_end) */
  void *main;      /* the main stream while swapped */
  gpu_ptr delay;   /* MOEC_ADAMW_DELAY's scratch (tests) */
  size_t delay_bytes;
  int delay_reps;
} dev_update;

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
  dev_update upd;
  char device[320];
};

/* The pool (gpu_exec_update.c): pool_get gives the held blocks back (the main stream waiting
 * for the whole update) before it fails for lack of memory; pool_put_after holds p until the
 * main stream has waited for the update's event ev (ev < 0: back now, as pool_put). */
int pool_get(gpu_runtime *rt, size_t bytes, gpu_ptr *p);
void pool_put_after(gpu_runtime *rt, gpu_ptr p, int ev);
static inline void pool_put(gpu_runtime *rt, gpu_ptr p) { pool_put_after(rt, p, -1); }

/* ---- the executor's state, and helpers every exec file uses ---- */
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
  int narrow_off;         /* MOEC_NARROW_GEMM=0: the router's f32 GEMMs on cuBLASLt too */
  int adamw_single;       /* MOEC_ADAMW_MULTI=0: one launch per parameter */
  int aw_from, aw_until;  /* this step's AdamW run (aw_from, aw_until] was done by the launch at aw_from */
  int *upd_ev;            /* (n_nodes) a value the update beside the forward reads: the event after its
                             last reader (its release holds it until then), -1 otherwise */
  int32_t **hcounts;      /* (n_nodes) host copies of expert-count values, downloaded once per step */
  void **cpin, **cev;     /* (n_nodes) an expert_counts' page-locked copy, queued as it is made, and its event */
  uint8_t *cpending;      /* (n_nodes) 1: that copy is queued this step, not yet read */
  gpu_fp8_plan fp8;       /* which expert GEMMs run in FP8 (MOEC_FP8_GEMM=0: none) */
  gpu_wgmma *wgmma;       /* their kernel: device-driven wgmma (MOEC_FP8_GEMM=wgmma), or NULL: cuBLASLt per expert */
  uint8_t *view;          /* (n_nodes) gpu_view: a value read through its input (gpu_views.h) */
  int *stack_of;          /* (n_nodes) a VIEW_STACKED stack's index in rt->stacks, -1 otherwise */
  int *store_q;           /* (n_nodes) an FP8 grouped_mlp's saved gate_up quantize, written in its act quantize's
                             kernel (plan_gate_up_stores); -1 none */
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

static inline int fail(gx *x, int id, const char *fmt, ...) {
  const ir_node *n = &x->g->nodes[id];
  int k = snprintf(x->err, x->errlen, "%s:%d:%d: error: %s (%%%d) on the GPU: ", n->loc.file ? n->loc.file : "?",
                   n->loc.line, n->loc.col, ir_ops[n->op].name, id);
  va_list ap;
  va_start(ap, fmt);
  if (k >= 0 && (size_t)k < x->errlen) vsnprintf(x->err + k, x->errlen - (size_t)k, fmt, ap);
  va_end(ap);
  return -1;
}

static inline int ck(gx *x, int id, int rc) { return rc == 0 ? 0 : fail(x, id, "%s", rt_cuda_error(KX)); }

/* Storage of an IR dtype. An e4m3 value (an mxfp8_quantize result) is kept as the exact values
 * its E4M3 elements and E8M0 scales encode, in bf16: 3 mantissa bits fit in 7, and the scale
 * is a power of two (exact unless the block's scale is below 2^-124, where its smallest E4M3
 * steps fall under bf16's smallest subnormal, 2^-133: a block amax under about 2^-116), at
 * half the bytes of f32. */
static inline cg_dtype cdt(ir_dtype t) { return t == DT_BF16 || t == DT_E4M3 ? CG_DT_BF16 : CG_DT_F32; }
static inline size_t dsize(ir_dtype t) { return t == DT_BF16 || t == DT_E4M3 ? 2 : 4; }
static inline cg_dtype DT(gx *x, int v) { return cdt(x->g->nodes[v].type.dtype); }

/* The result of id, rows rows (and `slack` more allocated, unused: an FP8 GEMM's 16-row blocks
 * may write past an expert's rows, gpu_fp8.h). */
static inline int alloc_out_slack(gx *x, int id, int64_t rows, int zero, int64_t slack) {
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

static inline int alloc_out(gx *x, int id, int64_t rows, int zero) { return alloc_out_slack(x, id, rows, zero, 0); }

/* gpu_exec.c */
int exec_CAST(gx *x, int id);
/* Parameter i's bf16 copy made current (for cast node id). */
int fresh_copy(gx *x, int id, int i);

/* gpu_exec_stacks.c */
int plan_stacks(gx *x, char *err, size_t errlen);
int squares_refresh(gx *x, int id, dev_stack *sk);
int squares_plan(gx *x, int id, cg_dtype gt, const rt_cuda_adamw_tensor *t, int n, int *stack_of, int *first);
int squares_update(gx *x, int id, cg_dtype gt, const rt_cuda_adamw_hp *hp, gpu_ptr gnorm, int s,
                   const rt_cuda_adamw_tensor *t0);

/* gpu_exec_update.c: AdamW beside the next forward (dev_update) */
int update_settle(gpu_runtime *rt);
int update_wait_inputs(gx *x, int id);
int update_begin(gx *x, int id);
int update_mark(gx *x, int id, const int *params, int n);
void update_reads(gx *x, int v, int ev);
int update_end(gx *x, int id);
void update_run_end(gpu_runtime *rt);
void update_free(gpu_runtime *rt);

/* gpu_exec_grouped.c: the fusion passes' ops (exec_table) */
int exec_EXPERT_COUNTS(gx *x, int id);
int exec_EXPERT_SORT(gx *x, int id);
int exec_EXPERT_PERMUTE(gx *x, int id);
int exec_EXPERT_UNPERMUTE(gx *x, int id);
int exec_EXPERT_PROBS(gx *x, int id);
int exec_EXPERT_PROBS_BWD(gx *x, int id);
int exec_EXPERT_WEIGHT_GRAD(gx *x, int id);
int exec_STACK(gx *x, int id);
int exec_UNSTACK(gx *x, int id);
int exec_PAD_COLS(gx *x, int id);
int exec_GROUPED_LINEAR(gx *x, int id);
int exec_GROUPED_LINEAR_DGRAD(gx *x, int id);
int exec_GROUPED_LINEAR_WGRAD(gx *x, int id);
int exec_GROUPED_COLSUM(gx *x, int id);
int exec_GROUPED_MLP(gx *x, int id);
int exec_GROUPED_MLP_BWD(gx *x, int id);
int exec_MXFP8_QUANTIZE(gx *x, int id);
int exec_MXFP8_DEQUANTIZE(gx *x, int id);
/* store_q: each FP8 grouped_mlp whose gate_up window is quantized for keeping (FP8_STORE) in its
 * act quantize's block mode, with MOEC_ACT_STORE=1 (off by default: not yet faster than the two kernels). */
void plan_gate_up_stores(gx *x);

#endif
