/* gpu_cudnn_attn.c -- cuDNN fused flash attention through the backend C API (see
 * gpu_cudnn_attn.h). Three layers:
 *   1. the library: dlopen, a table of entry points, the enum values we use;
 *   2. the graphs, as plain data (ca_graph: tensors and operations), built and checked with no
 *      library at all -- the same sequence of operations cudnn-frontend's CompositeSDPANode and
 *      CompositeSDPABackwardNode emit for bf16 causal GQA training without dropout or bias;
 *   3. the translation of a ca_graph into backend descriptors, heuristics, an execution plan,
 *      and its execution with a variant pack; plans cached by shape, stats cached by buffer. */
#include "gpu_cudnn_attn.h"

#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_rowstats.h"

#ifdef MOEC_HAVE_CUDNN_GRAPH_H
#include <cudnn_graph.h> /* only to check the values below */
#endif

/* ---- 1. the library ---- */

/* Values of cuDNN 9's cudnn_graph.h (9.19 at hand; every one of these exists since 8.x, so
 * the 9.14 on the device has them too). Names are cuDNN's without the CUDNN_ prefix. */
#define CD_DESCRIPTORS(X)                                                                                              \
  X(BACKEND_POINTWISE_DESCRIPTOR, 0)                                                                                   \
  X(BACKEND_ENGINE_DESCRIPTOR, 2)                                                                                      \
  X(BACKEND_ENGINECFG_DESCRIPTOR, 3)                                                                                   \
  X(BACKEND_ENGINEHEUR_DESCRIPTOR, 4)                                                                                  \
  X(BACKEND_EXECUTION_PLAN_DESCRIPTOR, 5)                                                                              \
  X(BACKEND_OPERATION_POINTWISE_DESCRIPTOR, 13)                                                                        \
  X(BACKEND_OPERATIONGRAPH_DESCRIPTOR, 15)                                                                             \
  X(BACKEND_VARIANT_PACK_DESCRIPTOR, 16)                                                                               \
  X(BACKEND_TENSOR_DESCRIPTOR, 17)                                                                                     \
  X(BACKEND_MATMUL_DESCRIPTOR, 18)                                                                                     \
  X(BACKEND_OPERATION_MATMUL_DESCRIPTOR, 19)                                                                           \
  X(BACKEND_REDUCTION_DESCRIPTOR, 21)                                                                                  \
  X(BACKEND_OPERATION_REDUCTION_DESCRIPTOR, 22)                                                                        \
  X(BACKEND_OPERATION_RESHAPE_DESCRIPTOR, 31)
#define CD_ATTRS(X)                                                                                                    \
  X(ATTR_POINTWISE_MODE, 0)                                                                                            \
  X(ATTR_POINTWISE_MATH_PREC, 1)                                                                                       \
  X(ATTR_POINTWISE_AXIS, 9)                                                                                            \
  X(ATTR_ENGINEHEUR_MODE, 200)                                                                                         \
  X(ATTR_ENGINEHEUR_OPERATION_GRAPH, 201)                                                                              \
  X(ATTR_ENGINEHEUR_RESULTS, 202)                                                                                      \
  X(ATTR_ENGINECFG_ENGINE, 300)                                                                                        \
  X(ATTR_EXECUTION_PLAN_HANDLE, 400)                                                                                   \
  X(ATTR_EXECUTION_PLAN_ENGINE_CONFIG, 401)                                                                            \
  X(ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, 402)                                                                           \
  X(ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, 750)                                                                       \
  X(ATTR_OPERATION_POINTWISE_XDESC, 751)                                                                               \
  X(ATTR_OPERATION_POINTWISE_BDESC, 752)                                                                               \
  X(ATTR_OPERATION_POINTWISE_YDESC, 753)                                                                               \
  X(ATTR_OPERATION_POINTWISE_ALPHA1, 754)                                                                              \
  X(ATTR_OPERATION_POINTWISE_ALPHA2, 755)                                                                              \
  X(ATTR_OPERATION_POINTWISE_TDESC, 758)                                                                               \
  X(ATTR_OPERATIONGRAPH_HANDLE, 800)                                                                                   \
  X(ATTR_OPERATIONGRAPH_OPS, 801)                                                                                      \
  X(ATTR_TENSOR_BYTE_ALIGNMENT, 900)                                                                                   \
  X(ATTR_TENSOR_DATA_TYPE, 901)                                                                                        \
  X(ATTR_TENSOR_DIMENSIONS, 902)                                                                                       \
  X(ATTR_TENSOR_STRIDES, 903)                                                                                          \
  X(ATTR_TENSOR_UNIQUE_ID, 906)                                                                                        \
  X(ATTR_TENSOR_IS_VIRTUAL, 907)                                                                                       \
  X(ATTR_TENSOR_IS_BY_VALUE, 908)                                                                                      \
  X(ATTR_VARIANT_PACK_UNIQUE_IDS, 1000)                                                                                \
  X(ATTR_VARIANT_PACK_DATA_POINTERS, 1001)                                                                             \
  X(ATTR_VARIANT_PACK_WORKSPACE, 1003)                                                                                 \
  X(ATTR_ENGINE_GLOBAL_INDEX, 1301)                                                                                    \
  X(ATTR_ENGINE_NUMERICAL_NOTE, 1303)                                                                                  \
  X(ATTR_MATMUL_COMP_TYPE, 1500)                                                                                       \
  X(ATTR_OPERATION_MATMUL_ADESC, 1520)                                                                                 \
  X(ATTR_OPERATION_MATMUL_BDESC, 1521)                                                                                 \
  X(ATTR_OPERATION_MATMUL_CDESC, 1522)                                                                                 \
  X(ATTR_OPERATION_MATMUL_DESC, 1523)                                                                                  \
  X(ATTR_REDUCTION_OPERATOR, 1600)                                                                                     \
  X(ATTR_REDUCTION_COMP_TYPE, 1601)                                                                                    \
  X(ATTR_OPERATION_REDUCTION_XDESC, 1610)                                                                              \
  X(ATTR_OPERATION_REDUCTION_YDESC, 1611)                                                                              \
  X(ATTR_OPERATION_REDUCTION_DESC, 1612)                                                                               \
  X(ATTR_OPERATION_RESHAPE_XDESC, 2200)                                                                                \
  X(ATTR_OPERATION_RESHAPE_YDESC, 2201)
#define CD_TYPES(X)                                                                                                    \
  X(TYPE_HANDLE, 0)                                                                                                    \
  X(TYPE_DATA_TYPE, 1)                                                                                                 \
  X(TYPE_BOOLEAN, 2)                                                                                                   \
  X(TYPE_INT64, 3)                                                                                                     \
  X(TYPE_FLOAT, 4)                                                                                                     \
  X(TYPE_VOID_PTR, 6)                                                                                                  \
  X(TYPE_HEUR_MODE, 8)                                                                                                 \
  X(TYPE_NUMERICAL_NOTE, 11)                                                                                           \
  X(TYPE_POINTWISE_MODE, 14)                                                                                           \
  X(TYPE_BACKEND_DESCRIPTOR, 15)                                                                                       \
  X(TYPE_REDUCTION_OPERATOR_TYPE, 18)
#define CD_VALUES(X)                                                                                                   \
  X(DATA_FLOAT, 0)                                                                                                     \
  X(DATA_INT32, 4)                                                                                                     \
  X(DATA_BFLOAT16, 9)                                                                                                  \
  X(DATA_BOOLEAN, 11)                                                                                                  \
  X(POINTWISE_ADD, 0)                                                                                                  \
  X(POINTWISE_MUL, 1)                                                                                                  \
  X(POINTWISE_DIV, 6)                                                                                                  \
  X(POINTWISE_SUB, 9)                                                                                                  \
  X(POINTWISE_EXP, 13)                                                                                                 \
  X(POINTWISE_LOG, 15)                                                                                                 \
  X(POINTWISE_IDENTITY, 21)                                                                                            \
  X(POINTWISE_CMP_GE, 303)                                                                                             \
  X(POINTWISE_GEN_INDEX, 501)                                                                                          \
  X(POINTWISE_BINARY_SELECT, 601)                                                                                      \
  X(REDUCE_TENSOR_ADD, 0)                                                                                              \
  X(REDUCE_TENSOR_MAX, 3)                                                                                              \
  X(HEUR_MODE_INSTANT, 0)                                                                                              \
  X(HEUR_MODE_FALLBACK, 2)                                                                                             \
  X(HEUR_MODE_A, 3)                                                                                                    \
  X(NUMERICAL_NOTE_NONDETERMINISTIC, 4)                                                                                \
  X(STATUS_SUCCESS, 0)

#define CD_ENUM(n, v) CD_##n = v,
enum { CD_DESCRIPTORS(CD_ENUM) CD_ATTRS(CD_ENUM) CD_TYPES(CD_ENUM) CD_VALUES(CD_ENUM) CD_ENUM_END_ };
#undef CD_ENUM
#ifdef MOEC_HAVE_CUDNN_GRAPH_H
#define CD_CHECK(n, v) _Static_assert(CD_##n == (int)CUDNN_##n, "cuDNN enum CUDNN_" #n " differs");
CD_DESCRIPTORS(CD_CHECK)
CD_ATTRS(CD_CHECK)
CD_TYPES(CD_CHECK)
CD_VALUES(CD_CHECK)
#undef CD_CHECK
#endif

#define CD_NAME(n, v) case v: return "CUDNN_" #n;
static const char *attr_name(int a) {
  switch (a) { CD_ATTRS(CD_NAME) }
  return "(attribute)";
}
static const char *desc_type_name(int t) {
  switch (t) { CD_DESCRIPTORS(CD_NAME) }
  return "(descriptor)";
}
#undef CD_NAME

typedef int cd_status;
typedef struct {
  size_t (*GetVersion)(void);
  cd_status (*Create)(void **handle);
  cd_status (*Destroy)(void *handle);
  cd_status (*SetStream)(void *handle, void *stream);
  const char *(*GetErrorString)(cd_status);
  void (*GetLastErrorString)(char *message, size_t max_size); /* optional */
  cd_status (*CreateDescriptor)(int type, void **desc);
  cd_status (*DestroyDescriptor)(void *desc);
  cd_status (*Finalize)(void *desc);
  cd_status (*SetAttribute)(void *desc, int name, int type, int64_t count, const void *elements);
  cd_status (*GetAttribute)(void *desc, int name, int type, int64_t requested, int64_t *count, void *elements);
  cd_status (*Execute)(void *handle, void *plan, void *variant_pack);
} cd_api;

static cd_api api;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_state; /* 0 absent, 1 loaded, -1 broken */
static char load_err[1024];

static void load(void) {
  static const char *const names[] = {"libcudnn.so.9", "libcudnn.so"};
  char tried[768], path[512];
  void *h = gpu_dlopen_lib("MOEC_LIBCUDNN", names, 2, path, sizeof path, tried, sizeof tried);
  if (!h) {
    snprintf(load_err, sizeof load_err, "libcudnn not found (tried %s)", tried);
    load_state = getenv("MOEC_LIBCUDNN") && *getenv("MOEC_LIBCUDNN") ? -1 : 0; /* asked for by path: an error */
    return;
  }
  static const struct {
    void **slot;
    const char *sym;
  } syms[] = {
      {(void **)&api.GetVersion, "cudnnGetVersion"},
      {(void **)&api.Create, "cudnnCreate"},
      {(void **)&api.Destroy, "cudnnDestroy"},
      {(void **)&api.SetStream, "cudnnSetStream"},
      {(void **)&api.GetErrorString, "cudnnGetErrorString"},
      {(void **)&api.CreateDescriptor, "cudnnBackendCreateDescriptor"},
      {(void **)&api.DestroyDescriptor, "cudnnBackendDestroyDescriptor"},
      {(void **)&api.Finalize, "cudnnBackendFinalize"},
      {(void **)&api.SetAttribute, "cudnnBackendSetAttribute"},
      {(void **)&api.GetAttribute, "cudnnBackendGetAttribute"},
      {(void **)&api.Execute, "cudnnBackendExecute"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
    if (!(*syms[i].slot = dlsym(h, syms[i].sym))) {
      snprintf(load_err, sizeof load_err, "%s lacks %s (moec needs cuDNN 9)", path, syms[i].sym);
      load_state = -1;
      return;
    }
  *(void **)&api.GetLastErrorString = dlsym(h, "cudnnGetLastErrorString"); /* 9.0 on */
  const size_t ver = api.GetVersion();
  if (ver < 90000) {
    snprintf(load_err, sizeof load_err, "%s is cuDNN %zu.%zu.%zu; moec needs cuDNN 9", path, ver / 10000,
             ver / 100 % 100, ver % 100);
    load_state = -1;
    return;
  }
  load_state = 1;
}

static int debug_on(void) {
  static int v = -1;
  if (v < 0) {
    const char *e = getenv("MOEC_CUDNN_DEBUG");
    v = e && *e && strcmp(e, "0") != 0;
  }
  return v;
}

static void dbg(const char *fmt, ...) {
  if (!debug_on()) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "moec cudnn: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

/* err = "cuDNN: <call> failed: <status name> (<code>): <last error>" */
static int fail_status(cd_status st, char *err, size_t errlen, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  char last[512] = "";
  if (api.GetLastErrorString) api.GetLastErrorString(last, sizeof last);
  snprintf(err, errlen, "cuDNN: %s failed: %s (%d)%s%s", what, api.GetErrorString ? api.GetErrorString(st) : "?",
           st, last[0] ? ": " : "", last);
  dbg("%s", err);
  return -1;
}

/* ---- 2. the graphs as data ---- */

/* What a non-virtual tensor is bound to at execution. */
enum { BIND_NONE, BIND_Q, BIND_K, BIND_V, BIND_O, BIND_DO, BIND_STATS, BIND_DQ, BIND_DK, BIND_DV, BIND_SCALE,
       BIND_NEG_INF, BIND_ONE, BIND_SOFTMAX_SUM, BIND_DQ_ACCUM, BIND_COUNT };
static const char *const bind_names[BIND_COUNT] = {"-",     "q",      "k",     "v",           "out",
                                                   "dout",  "stats",  "dq",    "dk",          "dv",
                                                   "scale", "-inf",   "one",   "softmax_sum", "dq_accum"};

enum { OP_MATMUL, OP_POINTWISE, OP_REDUCTION, OP_RESHAPE };
enum { MAX_TENSORS = 48, MAX_OPS = 40 };

typedef struct {
  const char *name;
  int64_t uid;
  int64_t dim[4], stride[4];
  int dtype; /* CD_DATA_* */
  int is_virtual, by_value;
  int bind; /* BIND_*: BIND_NONE exactly when virtual */
} ca_tensor;

typedef struct {
  int kind;
  const char *name;
  int mode;            /* pointwise mode or reduction operator */
  int comp;            /* compute type */
  int64_t axis;        /* GEN_INDEX only */
  int x, b, t, y;      /* tensor indices; -1 none. matmul: A = x, B = b, C = y */
} ca_op;

typedef struct {
  ca_tensor t[MAX_TENSORS];
  ca_op op[MAX_OPS];
  int nt, nop;
  int overflow;
} ca_graph;

static int add_tensor(ca_graph *g, const char *name, int64_t uid, int dtype, int is_virtual, int by_value, int bind,
                      const int64_t dim[4], const int64_t stride[4]) {
  if (g->nt >= MAX_TENSORS) {
    g->overflow = 1;
    return 0;
  }
  ca_tensor *t = &g->t[g->nt];
  t->name = name;
  t->uid = uid;
  memcpy(t->dim, dim, sizeof t->dim);
  memcpy(t->stride, stride, sizeof t->stride);
  t->dtype = dtype;
  t->is_virtual = is_virtual;
  t->by_value = by_value;
  t->bind = bind;
  return g->nt++;
}

static int virt(ca_graph *g, const char *name, int dtype, const int64_t dim[4], const int64_t stride[4]) {
  return add_tensor(g, name, 100 + g->nt, dtype, 1, 0, BIND_NONE, dim, stride);
}

/* A by-value f32 scalar: dims and strides [1, 1, 1, 1], as the frontend expands them. */
static int scalar(ca_graph *g, const char *name, int64_t uid, int bind) {
  static const int64_t one[4] = {1, 1, 1, 1};
  return add_tensor(g, name, uid, CD_DATA_FLOAT, 0, 1, bind, one, one);
}

static int view_tensor(ca_graph *g, const char *name, int64_t uid, int dtype, int bind, const gpu_cudnn_view *v,
                       int transpose23) {
  int64_t dim[4], stride[4];
  memcpy(dim, v->dim, sizeof dim);
  memcpy(stride, v->stride, sizeof stride);
  if (transpose23) {
    int64_t t = dim[2];
    dim[2] = dim[3], dim[3] = t;
    t = stride[2];
    stride[2] = stride[3], stride[3] = t;
  }
  return add_tensor(g, name, uid, dtype, 0, 0, bind, dim, stride);
}

static void add_op(ca_graph *g, int kind, const char *name, int mode, int comp, int64_t axis, int x, int b, int t,
                   int y) {
  if (g->nop >= MAX_OPS) {
    g->overflow = 1;
    return;
  }
  ca_op o = {kind, name, mode, comp, axis, x, b, t, y};
  g->op[g->nop++] = o;
}

static void pw(ca_graph *g, const char *name, int mode, int x, int b, int y) {
  add_op(g, OP_POINTWISE, name, mode, CD_DATA_FLOAT, -1, x, b, -1, y);
}
static void mm(ca_graph *g, const char *name, int a, int b, int c) {
  add_op(g, OP_MATMUL, name, 0, CD_DATA_FLOAT, -1, a, b, -1, c);
}
static void red(ca_graph *g, const char *name, int op, int x, int y) {
  add_op(g, OP_REDUCTION, name, op, CD_DATA_FLOAT, -1, x, -1, -1, y);
}
static void reshape(ca_graph *g, const char *name, int x, int y) {
  add_op(g, OP_RESHAPE, name, 0, CD_DATA_FLOAT, -1, x, -1, -1, y);
}

void gpu_cudnn_attn_views(const gpu_cudnn_shape *s, gpu_cudnn_view v[GPU_CUDNN_NVIEWS]) {
  const int64_t B = s->B, S = s->seq, nh = s->nh, nkv = s->nkv, d = s->hd, W = (nh + 2 * nkv) * d;
  const gpu_cudnn_view q = {{B, nh, S, d}, {S * nh * d, d, nh * d, 1}, 0};
  const gpu_cudnn_view kv = {{B, nkv, S, d}, {S * nkv * d, d, nkv * d, 1}, 0};
  const gpu_cudnn_view st = {{B, nh, S, 1}, {nh * S, S, 1, 1}, 0};
  const gpu_cudnn_view dq = {{B, nh, S, d}, {S * W, d, W, 1}, 0};
  const gpu_cudnn_view dk = {{B, nkv, S, d}, {S * W, d, W, 1}, nh * d};
  const gpu_cudnn_view dv = {{B, nkv, S, d}, {S * W, d, W, 1}, (nh + nkv) * d};
  v[GPU_CUDNN_Q] = q;
  v[GPU_CUDNN_K] = kv;
  v[GPU_CUDNN_V] = kv;
  v[GPU_CUDNN_O] = q;
  v[GPU_CUDNN_DO] = q;
  v[GPU_CUDNN_STATS] = st;
  v[GPU_CUDNN_DQ] = dq;
  v[GPU_CUDNN_DK] = dk;
  v[GPU_CUDNN_DV] = dv;
}

/* The causal mask on scores x: keep (row >= col), else -inf (cudnn-frontend's diagonal band
 * mask with right bound 0, top-left aligned). Returns the masked scores. */
static int causal_mask(ca_graph *g, int x, int neg_inf) {
  const ca_tensor *s = &g->t[x];
  int64_t dim[4], stride[4];
  memcpy(dim, s->dim, sizeof dim);
  memcpy(stride, s->stride, sizeof stride);
  const int row = virt(g, "row_index", CD_DATA_INT32, dim, stride);
  add_op(g, OP_POINTWISE, "gen_row_index", CD_POINTWISE_GEN_INDEX, CD_DATA_FLOAT, 2, x, -1, -1, row);
  const int col = virt(g, "col_index", CD_DATA_INT32, dim, stride);
  add_op(g, OP_POINTWISE, "gen_col_index", CD_POINTWISE_GEN_INDEX, CD_DATA_FLOAT, 3, x, -1, -1, col);
  const int keep = virt(g, "row>=col", CD_DATA_BOOLEAN, dim, stride);
  add_op(g, OP_POINTWISE, "row>=col", CD_POINTWISE_CMP_GE, CD_DATA_BOOLEAN, -1, row, col, -1, keep);
  const int y = virt(g, "masked_scores", CD_DATA_FLOAT, dim, stride);
  add_op(g, OP_POINTWISE, "binary_select", CD_POINTWISE_BINARY_SELECT, CD_DATA_FLOAT, -1, x, neg_inf, keep, y);
  return y;
}

/* UIDs of the bound tensors; virtual ones count from 100. */
enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV, UID_SCALE, UID_NEG_INF, UID_ONE,
       UID_SOFTMAX_SUM, UID_DQ_ACCUM };

/* Forward, training (stats written):
 *   S = Q K^T (f32) ; S1 = S * scale ; [causal mask] ; M = rowmax ; E = exp(S - M) ; Z = rowsum E
 *   Stats = M + log Z ; P = E / Z (bf16) ; O = P V */
static void build_fwd(ca_graph *g, const gpu_cudnn_shape *s) {
  gpu_cudnn_view v[GPU_CUDNN_NVIEWS];
  gpu_cudnn_attn_views(s, v);
  const int64_t b = s->B, h = s->nh, sq = s->seq, skv = s->seq;
  const int64_t sd[4] = {b, h, sq, skv}, ss[4] = {h * sq * skv, sq * skv, skv, 1};
  const int64_t rd[4] = {b, h, sq, 1}, rs[4] = {h * sq, sq, 1, 1};
  const int Q = view_tensor(g, "Q", UID_Q, CD_DATA_BFLOAT16, BIND_Q, &v[GPU_CUDNN_Q], 0);
  const int KT = view_tensor(g, "K^T", UID_K, CD_DATA_BFLOAT16, BIND_K, &v[GPU_CUDNN_K], 1);
  const int V = view_tensor(g, "V", UID_V, CD_DATA_BFLOAT16, BIND_V, &v[GPU_CUDNN_V], 0);
  const int scale = scalar(g, "attn_scale", UID_SCALE, BIND_SCALE);
  const int S = virt(g, "S", CD_DATA_FLOAT, sd, ss);
  mm(g, "bmm1 Q.K^T", Q, KT, S);
  int last = virt(g, "S*scale", CD_DATA_FLOAT, sd, ss);
  pw(g, "attn_scale", CD_POINTWISE_MUL, S, scale, last);
  if (s->causal) last = causal_mask(g, last, scalar(g, "neg_inf", UID_NEG_INF, BIND_NEG_INF));
  const int M = virt(g, "rowmax", CD_DATA_FLOAT, rd, rs);
  red(g, "max", CD_REDUCE_TENSOR_MAX, last, M);
  const int sub = virt(g, "S-M", CD_DATA_FLOAT, sd, ss);
  pw(g, "sub", CD_POINTWISE_SUB, last, M, sub);
  const int E = virt(g, "exp(S-M)", CD_DATA_FLOAT, sd, ss);
  pw(g, "exp", CD_POINTWISE_EXP, sub, -1, E);
  const int Z = virt(g, "rowsum", CD_DATA_FLOAT, rd, rs);
  red(g, "sum", CD_REDUCE_TENSOR_ADD, E, Z);
  const int L = virt(g, "log(rowsum)", CD_DATA_FLOAT, rd, rs);
  pw(g, "log", CD_POINTWISE_LOG, Z, -1, L);
  const int stats = view_tensor(g, "Stats", UID_STATS, CD_DATA_FLOAT, BIND_STATS, &v[GPU_CUDNN_STATS], 0);
  pw(g, "add (stats)", CD_POINTWISE_ADD, M, L, stats);
  const int P = virt(g, "P", CD_DATA_BFLOAT16, sd, ss);
  pw(g, "div", CD_POINTWISE_DIV, E, Z, P);
  const int O = view_tensor(g, "O", UID_O, CD_DATA_BFLOAT16, BIND_O, &v[GPU_CUDNN_O], 0);
  mm(g, "bmm2 P.V", P, V, O);
}

/* Backward (no dropout), as CompositeSDPABackwardNode:
 *   softmax_sum = rowsum(dO * O) * 1 (f32, in memory)
 *   P = exp(Q K^T * scale - Stats) [causal mask before exp] ; dV = P^T dO (summed over a KV group)
 *   dS = (dO V^T - softmax_sum) * P * scale ; dK = dS^T Q (summed over a group)
 *   dQ_accum = dS K (f32, in memory) ; dQ = identity(dQ_accum) */
static void build_bwd(ca_graph *g, const gpu_cudnn_shape *s) {
  gpu_cudnn_view v[GPU_CUDNN_NVIEWS];
  gpu_cudnn_attn_views(s, v);
  const int64_t b = s->B, h = s->nh, hk = s->nkv, sq = s->seq, skv = s->seq, d = s->hd;
  const int gqa = h != hk;
  const int64_t sd[4] = {b, h, sq, skv}, ss[4] = {h * sq * skv, sq * skv, skv, 1};
  const int64_t td[4] = {b, h, skv, sq}, ts[4] = {h * sq * skv, sq * skv, 1, skv}; /* the same memory, transposed */
  const int64_t rd[4] = {b, h, sq, 1}, rs[4] = {h * sq, sq, 1, 1};
  const int Q = view_tensor(g, "Q", UID_Q, CD_DATA_BFLOAT16, BIND_Q, &v[GPU_CUDNN_Q], 0);
  const int KT = view_tensor(g, "K^T", UID_K, CD_DATA_BFLOAT16, BIND_K, &v[GPU_CUDNN_K], 1);
  const int VT = view_tensor(g, "V^T", UID_V, CD_DATA_BFLOAT16, BIND_V, &v[GPU_CUDNN_V], 1);
  const int O = view_tensor(g, "O", UID_O, CD_DATA_BFLOAT16, BIND_O, &v[GPU_CUDNN_O], 0);
  const int dO = view_tensor(g, "dO", UID_DO, CD_DATA_BFLOAT16, BIND_DO, &v[GPU_CUDNN_DO], 0);
  const int stats = view_tensor(g, "Stats", UID_STATS, CD_DATA_FLOAT, BIND_STATS, &v[GPU_CUDNN_STATS], 0);
  const int scale = scalar(g, "attn_scale", UID_SCALE, BIND_SCALE);
  const int one = scalar(g, "one", UID_ONE, BIND_ONE);

  /* dO * O -> rowsum -> softmax_sum; the frontend's strides for the virtual product */
  const int64_t pd[4] = {b, h, sq, d}, ps[4] = {h * sq * d, sq * d, h * d, 1};
  const int dOO = virt(g, "dO*O", CD_DATA_FLOAT, pd, ps);
  pw(g, "mul_dO_O", CD_POINTWISE_MUL, dO, O, dOO);
  const int rsum = virt(g, "rowsum(dO*O)", CD_DATA_FLOAT, rd, rs);
  red(g, "reduce_dO_O", CD_REDUCE_TENSOR_ADD, dOO, rsum);
  const int ssum = add_tensor(g, "softmax_sum", UID_SOFTMAX_SUM, CD_DATA_FLOAT, 0, 0, BIND_SOFTMAX_SUM, rd, rs);
  pw(g, "scale_dropout_inv", CD_POINTWISE_MUL, rsum, one, ssum);

  /* P = exp(S * scale - Stats), masked */
  const int S = virt(g, "S", CD_DATA_FLOAT, sd, ss);
  mm(g, "matmul_Q_KT", Q, KT, S);
  const int S1 = virt(g, "S*scale", CD_DATA_FLOAT, sd, ss);
  pw(g, "mul_s_attn_scale", CD_POINTWISE_MUL, S, scale, S1);
  int last = virt(g, "S-stats", CD_DATA_FLOAT, sd, ss);
  pw(g, "sub_s_m", CD_POINTWISE_SUB, S1, stats, last);
  if (s->causal) last = causal_mask(g, last, scalar(g, "neg_inf", UID_NEG_INF, BIND_NEG_INF));
  const int P = virt(g, "P", CD_DATA_FLOAT, sd, ss);
  pw(g, "exp_s", CD_POINTWISE_EXP, last, -1, P);

  /* dV = P^T dO */
  const int Pt = virt(g, "P^T", CD_DATA_BFLOAT16, td, ts);
  reshape(g, "reshape_p", P, Pt);
  const int dV = view_tensor(g, "dV", UID_DV, CD_DATA_BFLOAT16, BIND_DV, &v[GPU_CUDNN_DV], 0);
  const int64_t fd[4] = {b, h, skv, d}, fs[4] = {h * skv * d, skv * d, d, 1}; /* per query head, before the group sum */
  if (!gqa) {
    mm(g, "matmul_pT_dO", Pt, dO, dV);
  } else {
    const int dVf = virt(g, "dV per query head", CD_DATA_BFLOAT16, fd, fs);
    mm(g, "matmul_pT_dO", Pt, dO, dVf);
    red(g, "red_dV_head", CD_REDUCE_TENSOR_ADD, dVf, dV);
  }

  /* dS = (dO V^T - softmax_sum) * P * scale */
  const int dP = virt(g, "dP", CD_DATA_FLOAT, sd, ss);
  mm(g, "matmul_dO_VT", dO, VT, dP);
  const int d1 = virt(g, "dP-softmax_sum", CD_DATA_FLOAT, sd, ss);
  pw(g, "sub_dP_softmax_sum", CD_POINTWISE_SUB, dP, ssum, d1);
  const int d2 = virt(g, "(dP-softmax_sum)*P", CD_DATA_FLOAT, sd, ss);
  pw(g, "mul_dP_exp_s", CD_POINTWISE_MUL, d1, P, d2);
  const int dS = virt(g, "dS", CD_DATA_FLOAT, sd, ss);
  pw(g, "mul_dS_attn_scale", CD_POINTWISE_MUL, d2, scale, dS);

  /* dK = dS^T Q */
  const int dSt = virt(g, "dS^T", CD_DATA_BFLOAT16, td, ts);
  reshape(g, "reshape_dS", dS, dSt);
  const int dK = view_tensor(g, "dK", UID_DK, CD_DATA_BFLOAT16, BIND_DK, &v[GPU_CUDNN_DK], 0);
  if (!gqa) {
    mm(g, "matmul_dST_Q", dSt, Q, dK);
  } else {
    const int dKf = virt(g, "dK per query head", CD_DATA_BFLOAT16, fd, fs);
    mm(g, "matmul_dST_Q", dSt, Q, dKf);
    red(g, "red_dK_head", CD_REDUCE_TENSOR_ADD, dKf, dK);
  }

  /* dQ = dS K, through an f32 accumulator in memory. The frontend leaves the reshaped K's
   * type unset, so it takes the intermediate type (f32); so do we. */
  const int K = virt(g, "K", CD_DATA_FLOAT, v[GPU_CUDNN_K].dim, v[GPU_CUDNN_K].stride);
  reshape(g, "reshape_k", KT, K);
  const int64_t ad[4] = {b, h, sq, d}, as[4] = {h * sq * d, sq * d, d, 1};
  const int acc = add_tensor(g, "dQ_accum", UID_DQ_ACCUM, CD_DATA_FLOAT, 0, 0, BIND_DQ_ACCUM, ad, as);
  mm(g, "matmul_dS_K", dS, K, acc);
  const int dQ = view_tensor(g, "dQ", UID_DQ, CD_DATA_BFLOAT16, BIND_DQ, &v[GPU_CUDNN_DQ], 0);
  pw(g, "identity_dQ", CD_POINTWISE_IDENTITY, acc, -1, dQ);
}

static void build_graph(ca_graph *g, int bwd, const gpu_cudnn_shape *s) {
  memset(g, 0, sizeof *g);
  if (bwd) build_bwd(g, s);
  else build_fwd(g, s);
}

static const char *dtype_name(int t) {
  switch (t) {
  case CD_DATA_FLOAT: return "f32";
  case CD_DATA_INT32: return "i32";
  case CD_DATA_BFLOAT16: return "bf16";
  case CD_DATA_BOOLEAN: return "bool";
  }
  return "?";
}

static const char *op_mode_name(const ca_op *o) {
  if (o->kind == OP_MATMUL) return "matmul";
  if (o->kind == OP_RESHAPE) return "reshape";
  if (o->kind == OP_REDUCTION) return o->mode == CD_REDUCE_TENSOR_MAX ? "reduce MAX" : "reduce ADD";
  switch (o->mode) {
  case CD_POINTWISE_ADD: return "pointwise ADD";
  case CD_POINTWISE_MUL: return "pointwise MUL";
  case CD_POINTWISE_DIV: return "pointwise DIV";
  case CD_POINTWISE_SUB: return "pointwise SUB";
  case CD_POINTWISE_EXP: return "pointwise EXP";
  case CD_POINTWISE_LOG: return "pointwise LOG";
  case CD_POINTWISE_IDENTITY: return "pointwise IDENTITY";
  case CD_POINTWISE_CMP_GE: return "pointwise CMP_GE";
  case CD_POINTWISE_GEN_INDEX: return "pointwise GEN_INDEX";
  case CD_POINTWISE_BINARY_SELECT: return "pointwise BINARY_SELECT";
  }
  return "pointwise ?";
}

static int tensor_line(const ca_tensor *t, char *buf, size_t len) {
  return snprintf(buf, len, "tensor %-20s uid %3lld %-4s dims [%lld %lld %lld %lld] strides [%lld %lld %lld %lld]%s%s%s%s",
                  t->name, (long long)t->uid, dtype_name(t->dtype), (long long)t->dim[0], (long long)t->dim[1],
                  (long long)t->dim[2], (long long)t->dim[3], (long long)t->stride[0], (long long)t->stride[1],
                  (long long)t->stride[2], (long long)t->stride[3], t->is_virtual ? " virtual" : "",
                  t->by_value ? " by-value" : "", t->bind ? " <- " : "", t->bind ? bind_names[t->bind] : "");
}

static int op_line(const ca_graph *g, int i, char *buf, size_t len) {
  const ca_op *o = &g->op[i];
  char axis[32] = "";
  if (o->axis >= 0) snprintf(axis, sizeof axis, " axis %lld", (long long)o->axis);
  return snprintf(buf, len, "op %2d %-24s %-22s%s x=%s%s%s%s%s -> %s (compute %s)", i, o->name, op_mode_name(o), axis,
                  g->t[o->x].name, o->b >= 0 ? " b=" : "", o->b >= 0 ? g->t[o->b].name : "", o->t >= 0 ? " t=" : "",
                  o->t >= 0 ? g->t[o->t].name : "", g->t[o->y].name, dtype_name(o->comp));
}

/* a broadcasts to y: every dim equal or 1 */
static int broadcasts(const ca_tensor *a, const ca_tensor *y) {
  for (int i = 0; i < 4; i++)
    if (a->dim[i] != y->dim[i] && a->dim[i] != 1) return 0;
  return 1;
}

static int check_graph(const ca_graph *g, const gpu_cudnn_shape *s, char *err, size_t errlen) {
  if (g->overflow) return snprintf(err, errlen, "graph: too many tensors or operations"), -1;
  int produced[MAX_TENSORS] = {0}, used[MAX_TENSORS] = {0}, bound[BIND_COUNT] = {0};
  for (int i = 0; i < g->nt; i++) {
    const ca_tensor *t = &g->t[i];
    for (int j = 0; j < i; j++)
      if (g->t[j].uid == t->uid)
        return snprintf(err, errlen, "graph: tensors %s and %s share uid %lld", g->t[j].name, t->name,
                        (long long)t->uid), -1;
    if (t->is_virtual != (t->bind == BIND_NONE) || (t->by_value && t->is_virtual))
      return snprintf(err, errlen, "graph: tensor %s: virtual/bound mismatch", t->name), -1;
    for (int k = 0; k < 4; k++)
      if (t->dim[k] < 1 || t->stride[k] < 1)
        return snprintf(err, errlen, "graph: tensor %s: dim/stride %d not positive", t->name, k), -1;
    if (!t->is_virtual && !t->by_value && t->stride[3] != 1 && t->stride[2] != 1) /* K^T, V^T: dim 2 */
      return snprintf(err, errlen, "graph: tensor %s: no unit stride in its last two dims", t->name), -1;
    if (t->bind != BIND_NONE) {
      if (bound[t->bind]++) return snprintf(err, errlen, "graph: buffer %s bound twice", bind_names[t->bind]), -1;
    }
  }
  for (int i = 0; i < g->nop; i++) {
    const ca_op *o = &g->op[i];
    char line[512];
    op_line(g, i, line, sizeof line);
    const int ins[3] = {o->x, o->b, o->t};
    for (int k = 0; k < 3; k++) {
      if (ins[k] < 0) continue;
      if (g->t[ins[k]].is_virtual && !produced[ins[k]])
        return snprintf(err, errlen, "graph: %s reads %s before it is produced", line, g->t[ins[k]].name), -1;
      used[ins[k]] = 1;
    }
    if (o->y < 0 || produced[o->y]++)
      return snprintf(err, errlen, "graph: %s: output missing or produced twice", line), -1;
    if (g->t[o->y].by_value) return snprintf(err, errlen, "graph: %s writes a by-value tensor", line), -1;
    const ca_tensor *x = &g->t[o->x], *y = &g->t[o->y];
    if (o->kind == OP_MATMUL) {
      const ca_tensor *b = &g->t[o->b];
      /* [.., m, k] x [.., k, n] -> [.., m, n]; batch dims broadcast (GQA: A or B's heads divide C's) */
      if (x->dim[3] != b->dim[2] || y->dim[2] != x->dim[2] || y->dim[3] != b->dim[3])
        return snprintf(err, errlen, "graph: %s: matmul shapes do not chain", line), -1;
      for (int k = 0; k < 2; k++)
        if (y->dim[k] % x->dim[k] || y->dim[k] % b->dim[k])
          return snprintf(err, errlen, "graph: %s: batch dim %d does not broadcast", line, k), -1;
    } else if (o->kind == OP_POINTWISE) {
      const int n_in = o->mode == CD_POINTWISE_EXP || o->mode == CD_POINTWISE_LOG || o->mode == CD_POINTWISE_IDENTITY ||
                               o->mode == CD_POINTWISE_GEN_INDEX
                           ? 1
                           : o->mode == CD_POINTWISE_BINARY_SELECT ? 3 : 2;
      if ((n_in >= 2) != (o->b >= 0) || (n_in == 3) != (o->t >= 0))
        return snprintf(err, errlen, "graph: %s: wrong number of inputs", line), -1;
      if (!broadcasts(x, y) || (o->b >= 0 && !broadcasts(&g->t[o->b], y)) || (o->t >= 0 && !broadcasts(&g->t[o->t], y)))
        return snprintf(err, errlen, "graph: %s: inputs do not broadcast to the output", line), -1;
      if (o->mode == CD_POINTWISE_GEN_INDEX && (o->axis < 0 || o->axis > 3 || y->dtype != CD_DATA_INT32))
        return snprintf(err, errlen, "graph: %s: gen_index axis/type", line), -1;
      if (o->mode == CD_POINTWISE_CMP_GE && y->dtype != CD_DATA_BOOLEAN)
        return snprintf(err, errlen, "graph: %s: comparison not boolean", line), -1;
      if (o->mode == CD_POINTWISE_BINARY_SELECT && g->t[o->t].dtype != CD_DATA_BOOLEAN)
        return snprintf(err, errlen, "graph: %s: select mask not boolean", line), -1;
    } else if (o->kind == OP_REDUCTION) {
      /* reduced dims become 1; a KV-group sum divides the head dim */
      for (int k = 0; k < 4; k++)
        if (y->dim[k] != x->dim[k] && (y->dim[k] != 1 && x->dim[k] % y->dim[k]))
          return snprintf(err, errlen, "graph: %s: reduction dim %d", line, k), -1;
    } else { /* reshape: same elements */
      if (x->dim[0] * x->dim[1] * x->dim[2] * x->dim[3] != y->dim[0] * y->dim[1] * y->dim[2] * y->dim[3])
        return snprintf(err, errlen, "graph: %s: reshape changes the element count", line), -1;
    }
  }
  for (int i = 0; i < g->nt; i++) {
    const ca_tensor *t = &g->t[i];
    if (t->is_virtual && (!produced[i] || !used[i]))
      return snprintf(err, errlen, "graph: virtual tensor %s is %s", t->name, produced[i] ? "never read" : "never produced"),
             -1;
    if (!t->is_virtual && !produced[i] && !used[i])
      return snprintf(err, errlen, "graph: tensor %s is not connected", t->name), -1;
  }
  /* the buffers each graph must bind */
  static const int fwd_binds[] = {BIND_Q, BIND_K, BIND_V, BIND_O, BIND_STATS, BIND_SCALE};
  static const int bwd_binds[] = {BIND_Q, BIND_K, BIND_V, BIND_O, BIND_DO, BIND_STATS, BIND_DQ, BIND_DK, BIND_DV,
                                  BIND_SCALE, BIND_ONE, BIND_SOFTMAX_SUM, BIND_DQ_ACCUM};
  const int bwd = bound[BIND_DO] > 0;
  const int *need = bwd ? bwd_binds : fwd_binds;
  const int n_need = bwd ? (int)(sizeof bwd_binds / sizeof *bwd_binds) : (int)(sizeof fwd_binds / sizeof *fwd_binds);
  for (int i = 0; i < n_need; i++)
    if (!bound[need[i]]) return snprintf(err, errlen, "graph: buffer %s is not bound", bind_names[need[i]]), -1;
  if (s->causal != (bound[BIND_NEG_INF] > 0)) return snprintf(err, errlen, "graph: causal mask missing"), -1;
  return 0;
}

static int valid_shape(const gpu_cudnn_shape *s, char *err, size_t errlen) {
  if (s->B < 1 || s->seq < 1 || s->nkv < 1 || s->nh < s->nkv || s->nh % s->nkv || s->hd < 8 || s->hd % 8) {
    snprintf(err, errlen, "cuDNN attention: unsupported shape (batch %lld, seq %lld, heads %lld, kv_heads %lld, head dim %lld)",
             (long long)s->B, (long long)s->seq, (long long)s->nh, (long long)s->nkv, (long long)s->hd);
    return -1;
  }
  return 0;
}

int gpu_cudnn_attn_graph_check(int bwd, const gpu_cudnn_shape *s, size_t version, char *err, size_t errlen) {
  (void)version;
  if (valid_shape(s, err, errlen)) return -1;
  ca_graph g;
  build_graph(&g, bwd, s);
  return check_graph(&g, s, err, errlen);
}

int gpu_cudnn_attn_graph_dump(int bwd, const gpu_cudnn_shape *s, size_t version, char *buf, size_t len) {
  (void)version;
  ca_graph g;
  build_graph(&g, bwd, s);
  size_t at = 0;
  char line[512];
  if (len) buf[0] = 0;
  for (int i = 0; i < g.nt + g.nop; i++) {
    if (i < g.nt) tensor_line(&g.t[i], line, sizeof line);
    else op_line(&g, i - g.nt, line, sizeof line);
    if (at < len) at += (size_t)snprintf(buf + at, len - at, "%s\n", line);
  }
  return g.nop;
}

/* ---- 3. descriptors, plans and execution ---- */

typedef struct {
  int used; /* 0: free; else the clock of its last use */
  int bwd;
  gpu_cudnn_shape s;
  void **descs; /* everything created for the plan, destroyed with it */
  int n_descs, cap_descs;
  void *plan;
  int64_t workspace;
  int64_t engine;
  int nondeterministic;
} plan_entry;
enum { PLAN_SLOTS = 32 };


struct gpu_cudnn_attn {
  gpu_ctx *g;
  void *handle;
  size_t version;
  plan_entry plans[PLAN_SLOTS];
  int plan_clock;
  gpu_rowstats *stats; /* f32 (B, nh, seq): the softmax logsumexp each forward leaves for its backward */
  gpu_ptr workspace, ssum, dq_accum, out_scratch;
  size_t cap_workspace, cap_ssum, cap_dq_accum, cap_out;
};

static void plan_release(plan_entry *p) {
  for (int i = p->n_descs - 1; i >= 0; i--)
    if (p->descs[i]) api.DestroyDescriptor(p->descs[i]);
  free(p->descs);
  memset(p, 0, sizeof *p);
}

/* Creates a descriptor owned by plan p. */
static void *new_desc(plan_entry *p, int type, const char *what, char *err, size_t errlen) {
  if (p->n_descs == p->cap_descs) {
    int cap = p->cap_descs ? 2 * p->cap_descs : 64;
    void **d = realloc(p->descs, (size_t)cap * sizeof *d);
    if (!d) return snprintf(err, errlen, "out of host memory"), NULL;
    p->descs = d;
    p->cap_descs = cap;
  }
  void *d = NULL;
  cd_status st = api.CreateDescriptor(type, &d);
  if (st != CD_STATUS_SUCCESS || !d) {
    fail_status(st, err, errlen, "cudnnBackendCreateDescriptor(%s) for %s", desc_type_name(type), what);
    return NULL;
  }
  p->descs[p->n_descs++] = d;
  return d;
}

static int set(void *d, const char *what, int attr, int type, int64_t n, const void *v, char *err, size_t errlen) {
  cd_status st = api.SetAttribute(d, attr, type, n, v);
  if (st != CD_STATUS_SUCCESS)
    return fail_status(st, err, errlen, "cudnnBackendSetAttribute(%s, %s)", what, attr_name(attr));
  return 0;
}

static int fin(void *d, const char *what, char *err, size_t errlen) {
  cd_status st = api.Finalize(d);
  if (st != CD_STATUS_SUCCESS) return fail_status(st, err, errlen, "cudnnBackendFinalize(%s)", what);
  return 0;
}

static int make_tensor(plan_entry *p, const ca_tensor *t, void **out, char *err, size_t errlen) {
  char what[96];
  snprintf(what, sizeof what, "tensor '%s' uid %lld", t->name, (long long)t->uid);
  void *d = new_desc(p, CD_BACKEND_TENSOR_DESCRIPTOR, what, err, errlen);
  if (!d) return -1;
  const int dtype = t->dtype;
  const int64_t align = 16;
  const bool yes = true;
  if (set(d, what, CD_ATTR_TENSOR_DATA_TYPE, CD_TYPE_DATA_TYPE, 1, &dtype, err, errlen) ||
      set(d, what, CD_ATTR_TENSOR_DIMENSIONS, CD_TYPE_INT64, 4, t->dim, err, errlen) ||
      set(d, what, CD_ATTR_TENSOR_STRIDES, CD_TYPE_INT64, 4, t->stride, err, errlen) ||
      set(d, what, CD_ATTR_TENSOR_UNIQUE_ID, CD_TYPE_INT64, 1, &t->uid, err, errlen) ||
      set(d, what, CD_ATTR_TENSOR_BYTE_ALIGNMENT, CD_TYPE_INT64, 1, &align, err, errlen) ||
      (t->is_virtual && set(d, what, CD_ATTR_TENSOR_IS_VIRTUAL, CD_TYPE_BOOLEAN, 1, &yes, err, errlen)) ||
      (t->by_value && set(d, what, CD_ATTR_TENSOR_IS_BY_VALUE, CD_TYPE_BOOLEAN, 1, &yes, err, errlen)) ||
      fin(d, what, err, errlen))
    return -1;
  *out = d;
  return 0;
}

static int make_op(plan_entry *p, const ca_graph *g, int i, void *const *td, void **out, char *err, size_t errlen) {
  const ca_op *o = &g->op[i];
  char what[128], what2[192];
  snprintf(what, sizeof what, "op %d '%s' (%s)", i, o->name, op_mode_name(o));
  void *x = td[o->x], *y = td[o->y], *b = o->b >= 0 ? td[o->b] : NULL, *t = o->t >= 0 ? td[o->t] : NULL;
  void *inner = NULL, *op = NULL;
  const int comp = o->comp;
  if (o->kind == OP_MATMUL) {
    snprintf(what2, sizeof what2, "%s: its MATMUL descriptor", what);
    if (!(inner = new_desc(p, CD_BACKEND_MATMUL_DESCRIPTOR, what2, err, errlen)) ||
        set(inner, what2, CD_ATTR_MATMUL_COMP_TYPE, CD_TYPE_DATA_TYPE, 1, &comp, err, errlen) ||
        fin(inner, what2, err, errlen) ||
        !(op = new_desc(p, CD_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what, err, errlen)) ||
        set(op, what, CD_ATTR_OPERATION_MATMUL_ADESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &x, err, errlen) ||
        set(op, what, CD_ATTR_OPERATION_MATMUL_BDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &b, err, errlen) ||
        set(op, what, CD_ATTR_OPERATION_MATMUL_CDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &y, err, errlen) ||
        set(op, what, CD_ATTR_OPERATION_MATMUL_DESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &inner, err, errlen))
      return -1;
  } else if (o->kind == OP_POINTWISE) {
    snprintf(what2, sizeof what2, "%s: its POINTWISE descriptor", what);
    const int mode = o->mode;
    const float alpha = 1.0f;
    if (!(inner = new_desc(p, CD_BACKEND_POINTWISE_DESCRIPTOR, what2, err, errlen)) ||
        set(inner, what2, CD_ATTR_POINTWISE_MODE, CD_TYPE_POINTWISE_MODE, 1, &mode, err, errlen) ||
        set(inner, what2, CD_ATTR_POINTWISE_MATH_PREC, CD_TYPE_DATA_TYPE, 1, &comp, err, errlen) ||
        (o->axis >= 0 && set(inner, what2, CD_ATTR_POINTWISE_AXIS, CD_TYPE_INT64, 1, &o->axis, err, errlen)) ||
        fin(inner, what2, err, errlen) ||
        !(op = new_desc(p, CD_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what, err, errlen)) ||
        set(op, what, CD_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CD_TYPE_BACKEND_DESCRIPTOR, 1, &inner, err, errlen) ||
        set(op, what, CD_ATTR_OPERATION_POINTWISE_XDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &x, err, errlen) ||
        set(op, what, CD_ATTR_OPERATION_POINTWISE_YDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &y, err, errlen) ||
        (b && set(op, what, CD_ATTR_OPERATION_POINTWISE_BDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &b, err, errlen)) ||
        (t && set(op, what, CD_ATTR_OPERATION_POINTWISE_TDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &t, err, errlen)) ||
        set(op, what, CD_ATTR_OPERATION_POINTWISE_ALPHA1, CD_TYPE_FLOAT, 1, &alpha, err, errlen) ||
        set(op, what, CD_ATTR_OPERATION_POINTWISE_ALPHA2, CD_TYPE_FLOAT, 1, &alpha, err, errlen))
      return -1;
  } else if (o->kind == OP_REDUCTION) {
    snprintf(what2, sizeof what2, "%s: its REDUCTION descriptor", what);
    const int mode = o->mode;
    if (!(inner = new_desc(p, CD_BACKEND_REDUCTION_DESCRIPTOR, what2, err, errlen)) ||
        set(inner, what2, CD_ATTR_REDUCTION_COMP_TYPE, CD_TYPE_DATA_TYPE, 1, &comp, err, errlen) ||
        set(inner, what2, CD_ATTR_REDUCTION_OPERATOR, CD_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, err, errlen) ||
        fin(inner, what2, err, errlen) ||
        !(op = new_desc(p, CD_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what, err, errlen)) ||
        set(op, what, CD_ATTR_OPERATION_REDUCTION_DESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &inner, err, errlen) ||
        set(op, what, CD_ATTR_OPERATION_REDUCTION_XDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &x, err, errlen) ||
        set(op, what, CD_ATTR_OPERATION_REDUCTION_YDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &y, err, errlen))
      return -1;
  } else {
    if (!(op = new_desc(p, CD_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what, err, errlen)) ||
        set(op, what, CD_ATTR_OPERATION_RESHAPE_XDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &x, err, errlen) ||
        set(op, what, CD_ATTR_OPERATION_RESHAPE_YDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &y, err, errlen))
      return -1;
  }
  if (fin(op, what, err, errlen)) return -1;
  *out = op;
  return 0;
}

/* The engine behind an engine config: its global index and whether cuDNN notes it as
 * non-deterministic (-1 / 0 when it cannot tell; debugging aids only). */
static void engine_info(plan_entry *p, void *cfg, int64_t *index, int *nondet) {
  *index = -1;
  *nondet = 0;
  char scratch[256];
  void *engine = new_desc(p, CD_BACKEND_ENGINE_DESCRIPTOR, "engine of a config", scratch, sizeof scratch);
  int64_t n = 0;
  if (!engine || api.GetAttribute(cfg, CD_ATTR_ENGINECFG_ENGINE, CD_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine) != 0)
    return;
  api.GetAttribute(engine, CD_ATTR_ENGINE_GLOBAL_INDEX, CD_TYPE_INT64, 1, &n, index);
  int notes[16];
  if (api.GetAttribute(engine, CD_ATTR_ENGINE_NUMERICAL_NOTE, CD_TYPE_NUMERICAL_NOTE, 16, &n, notes) == 0)
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
  void *heur = new_desc(p, CD_BACKEND_ENGINEHEUR_DESCRIPTOR, what, err, errlen);
  if (!heur || set(heur, what, CD_ATTR_ENGINEHEUR_OPERATION_GRAPH, CD_TYPE_BACKEND_DESCRIPTOR, 1, &og, err, errlen) ||
      set(heur, what, CD_ATTR_ENGINEHEUR_MODE, CD_TYPE_HEUR_MODE, 1, &mode, err, errlen) || fin(heur, what, err, errlen))
    return -1;
  int64_t count = 0;
  cd_status st = api.GetAttribute(heur, CD_ATTR_ENGINEHEUR_RESULTS, CD_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
  if (st != CD_STATUS_SUCCESS)
    return fail_status(st, err, errlen, "cudnnBackendGetAttribute(%s, CUDNN_ATTR_ENGINEHEUR_RESULTS count)", what);
  dbg("heuristics mode %s: %lld engine configs", heur_name(mode), (long long)count);
  if (count < 1) return snprintf(err, errlen, "cuDNN: %s found no engine for the graph", what), -1;
  if (count > 64) count = 64;
  void *cfgs[64];
  for (int64_t i = 0; i < count; i++)
    if (!(cfgs[i] = new_desc(p, CD_BACKEND_ENGINECFG_DESCRIPTOR, "an engine config", err, errlen))) return -1;
  int64_t got = 0;
  st = api.GetAttribute(heur, CD_ATTR_ENGINEHEUR_RESULTS, CD_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs);
  if (st != CD_STATUS_SUCCESS)
    return fail_status(st, err, errlen, "cudnnBackendGetAttribute(%s, CUDNN_ATTR_ENGINEHEUR_RESULTS)", what);
  char first_err[1024] = "";
  for (int64_t i = 0; i < got && i < count; i++) {
    int64_t engine;
    int nondet;
    engine_info(p, cfgs[i], &engine, &nondet);
    char pw_what[96];
    snprintf(pw_what, sizeof pw_what, "execution plan (config %lld, engine %lld)", (long long)i, (long long)engine);
    char e[1024] = "";
    void *plan = new_desc(p, CD_BACKEND_EXECUTION_PLAN_DESCRIPTOR, pw_what, e, sizeof e);
    if (plan) {
      if (api.SetAttribute(plan, CD_ATTR_EXECUTION_PLAN_HANDLE, CD_TYPE_HANDLE, 1, &c->handle) != 0)
        dbg("%s: setting CUDNN_ATTR_EXECUTION_PLAN_HANDLE refused (deprecated); going on", pw_what);
      if (set(plan, pw_what, CD_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CD_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i], e,
              sizeof e) == 0 &&
          fin(plan, pw_what, e, sizeof e) == 0) {
        int64_t ws = 0, n = 0;
        st = api.GetAttribute(plan, CD_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CD_TYPE_INT64, 1, &n, &ws);
        if (st != CD_STATUS_SUCCESS)
          return fail_status(st, err, errlen, "cudnnBackendGetAttribute(%s, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)",
                             pw_what);
        p->plan = plan;
        p->workspace = ws;
        p->engine = engine;
        p->nondeterministic = nondet;
        dbg("plan: config %lld of mode %s, engine %lld%s, workspace %lld bytes", (long long)i, heur_name(mode),
            (long long)engine, nondet ? " (non-deterministic)" : "", (long long)ws);
        return 0;
      }
    }
    dbg("config %lld (engine %lld) refused: %s", (long long)i, (long long)engine, e);
    if (!first_err[0]) snprintf(first_err, sizeof first_err, "%s", e);
  }
  snprintf(err, errlen, "cuDNN: no engine config of %s finalizes (%lld tried); the first refusal: %s", what,
           (long long)got, first_err);
  return -1;
}

static int build_plan(gpu_cudnn_attn *c, plan_entry *p, int bwd, const gpu_cudnn_shape *s, char *err, size_t errlen) {
  ca_graph g;
  build_graph(&g, bwd, s);
  if (check_graph(&g, s, err, errlen)) return -1;
  dbg("building the %s graph: B %lld seq %lld heads %lld kv_heads %lld hd %lld %s (cuDNN %zu)",
      bwd ? "backward" : "forward", (long long)s->B, (long long)s->seq, (long long)s->nh, (long long)s->nkv,
      (long long)s->hd, s->causal ? "causal" : "full", c->version);
  void *td[MAX_TENSORS], *ops[MAX_OPS];
  char line[512];
  for (int i = 0; i < g.nt; i++) {
    tensor_line(&g.t[i], line, sizeof line);
    dbg("%s", line);
    if (make_tensor(p, &g.t[i], &td[i], err, errlen)) return -1;
  }
  for (int i = 0; i < g.nop; i++) {
    op_line(&g, i, line, sizeof line);
    dbg("%s", line);
    if (make_op(p, &g, i, td, &ops[i], err, errlen)) return -1;
  }
  const char *what = bwd ? "operation graph (attention backward)" : "operation graph (attention forward)";
  void *og = new_desc(p, CD_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what, err, errlen);
  if (!og || set(og, what, CD_ATTR_OPERATIONGRAPH_OPS, CD_TYPE_BACKEND_DESCRIPTOR, g.nop, ops, err, errlen)) return -1;
  if (api.SetAttribute(og, CD_ATTR_OPERATIONGRAPH_HANDLE, CD_TYPE_HANDLE, 1, &c->handle) != 0)
    dbg("%s: setting CUDNN_ATTR_OPERATIONGRAPH_HANDLE refused (deprecated); going on", what);
  if (fin(og, what, err, errlen)) return -1;
  dbg("%s finalized: %d tensors, %d operations", what, g.nt, g.nop);
  char err_a[1024];
  if (pick_plan(c, p, og, CD_HEUR_MODE_A, err_a, sizeof err_a) == 0) return 0;
  dbg("heuristics mode A gave no plan (%s); trying the fallback mode", err_a);
  if (pick_plan(c, p, og, CD_HEUR_MODE_FALLBACK, err, errlen) == 0) return 0;
  size_t n = strlen(err);
  if (n < errlen) snprintf(err + n, errlen - n, "; heuristics mode A: %s", err_a);
  return -1;
}

static int same_shape(const gpu_cudnn_shape *a, const gpu_cudnn_shape *b) {
  return a->B == b->B && a->seq == b->seq && a->nh == b->nh && a->nkv == b->nkv && a->hd == b->hd &&
         (a->causal != 0) == (b->causal != 0);
}

static plan_entry *get_plan(gpu_cudnn_attn *c, int bwd, const gpu_cudnn_shape *s, char *err, size_t errlen) {
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
    plan_release(e);
  }
  if (build_plan(c, e, bwd, s, err, errlen)) {
    plan_release(e);
    return NULL;
  }
  e->bwd = bwd;
  e->s = *s;
  e->used = ++c->plan_clock;
  return e;
}

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
  build_graph(&g, p->bwd, &p->s);
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
    if (!ptrs[n]) return snprintf(err, errlen, "cuDNN attention: no buffer for %s", bind_names[t->bind]), -1;
    n++;
  }
  size_t ws_bytes = p->workspace > 0 ? (size_t)p->workspace : 0;
  if (grow(c, &c->workspace, &c->cap_workspace, ws_bytes < 256 ? 256 : ws_bytes, "the cuDNN attention workspace", err,
           errlen))
    return -1;
  void *ws = dptr(c->workspace);
  void *vp = NULL;
  const char *what = p->bwd ? "variant pack (attention backward)" : "variant pack (attention forward)";
  cd_status st = api.CreateDescriptor(CD_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  if (st != CD_STATUS_SUCCESS)
    return fail_status(st, err, errlen, "cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)");
  int rc = set(vp, what, CD_ATTR_VARIANT_PACK_UNIQUE_IDS, CD_TYPE_INT64, n, uids, err, errlen) ||
           set(vp, what, CD_ATTR_VARIANT_PACK_DATA_POINTERS, CD_TYPE_VOID_PTR, n, ptrs, err, errlen) ||
           set(vp, what, CD_ATTR_VARIANT_PACK_WORKSPACE, CD_TYPE_VOID_PTR, 1, &ws, err, errlen) ||
           fin(vp, what, err, errlen);
  if (!rc) {
    dbg("execute %s: B %lld seq %lld heads %lld/%lld hd %lld, %d buffers, workspace %zu bytes",
        p->bwd ? "backward" : "forward", (long long)p->s.B, (long long)p->s.seq, (long long)p->s.nh,
        (long long)p->s.nkv, (long long)p->s.hd, n, ws_bytes);
    gpu_note_work(c->g, p->bwd ? "cudnn attention backward" : "cudnn attention forward");
    st = api.Execute(c->handle, p->plan, vp);
    if (st != CD_STATUS_SUCCESS)
      rc = fail_status(st, err, errlen, "cudnnBackendExecute(attention %s, engine %lld)",
                       p->bwd ? "backward" : "forward", (long long)p->engine);
  }
  api.DestroyDescriptor(vp);
  if (!rc && debug_on() && gpu_sync(c->g) != 0)
    return snprintf(err, errlen, "cuDNN attention %s: %s", p->bwd ? "backward" : "forward", gpu_error(c->g)), -1;
  return rc ? -1 : 0;
}

gpu_cudnn_attn *gpu_cudnn_attn_new(gpu_ctx *g, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  pthread_once(&load_once, load);
  if (load_state != 1) {
    dbg("%s", load_err);
    if (load_state < 0) snprintf(err, errlen, "%s", load_err);
    return NULL;
  }
  gpu_cudnn_attn *c = calloc(1, sizeof *c);
  if (!c || !(c->stats = gpu_rowstats_new(g, "attention softmax stats (cuDNN)"))) {
    free(c);
    return snprintf(err, errlen, "out of host memory"), NULL;
  }
  c->g = g;
  c->version = api.GetVersion();
  cd_status st = api.Create(&c->handle);
  if (st != CD_STATUS_SUCCESS) {
    fail_status(st, err, errlen, "cudnnCreate");
    gpu_rowstats_free(c->stats);
    free(c);
    return NULL;
  }
  st = api.SetStream(c->handle, gpu_stream(g));
  if (st != CD_STATUS_SUCCESS) {
    fail_status(st, err, errlen, "cudnnSetStream");
    gpu_cudnn_attn_free(c);
    return NULL;
  }
  dbg("cuDNN %zu loaded; handle on the context's stream", c->version);
  return c;
}

void gpu_cudnn_attn_free(gpu_cudnn_attn *c) {
  if (!c) return;
  gpu_sync(c->g);
  for (int i = 0; i < PLAN_SLOTS; i++) plan_release(&c->plans[i]);
  gpu_rowstats_free(c->stats);
  gpu_free(c->g, c->workspace);
  gpu_free(c->g, c->ssum);
  gpu_free(c->g, c->dq_accum);
  gpu_free(c->g, c->out_scratch);
  if (c->handle) api.Destroy(c->handle);
  free(c);
}

size_t gpu_cudnn_attn_version(const gpu_cudnn_attn *c) { return c ? c->version : 0; }
int gpu_cudnn_attn_supports(const gpu_cudnn_attn *c, int64_t hd) { return c && (hd == 64 || hd == 128); }
void gpu_cudnn_attn_new_run(gpu_cudnn_attn *c) {
  if (c) gpu_rowstats_new_run(c->stats);
}

int gpu_cudnn_attn_bwd_nondeterministic(const gpu_cudnn_attn *c, const gpu_cudnn_shape *s) {
  for (int i = 0; c && i < PLAN_SLOTS; i++)
    if (c->plans[i].used && c->plans[i].bwd && same_shape(&c->plans[i].s, s)) return c->plans[i].nondeterministic;
  return -1;
}

static int check_call(const gpu_cudnn_attn *c, const gpu_cudnn_shape *s, gpu_ptr ptrs_or, char *err, size_t errlen) {
  if (valid_shape(s, err, errlen)) return -1;
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
  plan_entry *p = get_plan(c, 0, s, err, errlen);
  if (!p) return -1;
  gpu_ptr bind[BIND_COUNT] = {0};
  bind[BIND_Q] = q, bind[BIND_K] = k, bind[BIND_V] = v, bind[BIND_O] = out, bind[BIND_STATS] = stats;
  return execute(c, p, bind, err, errlen);
}

int gpu_cudnn_attn_bwd(gpu_cudnn_attn *c, const gpu_cudnn_shape *s, gpu_ptr q, gpu_ptr k, gpu_ptr v, gpu_ptr out,
                       gpu_ptr dout, gpu_ptr stats, gpu_ptr packed, char *err, size_t errlen) {
  if (check_call(c, s, q | k | v | out | dout | stats | packed, err, errlen)) return -1;
  plan_entry *p = get_plan(c, 1, s, err, errlen);
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
    dbg("backward with no cached stats: a forward into scratch first");
    const size_t bytes = (size_t)(s->B * s->seq * s->nh * s->hd) * 2;
    if (grow(c, &c->out_scratch, &c->cap_out, bytes, "attention output (recomputed, cuDNN)", err, errlen) ||
        gpu_cudnn_attn_fwd(c, s, q, k, v, c->out_scratch, stats, err, errlen)) {
      gpu_rowstats_drop(c->stats, &key);
      return -1;
    }
  }
  return gpu_cudnn_attn_bwd(c, s, q, k, v, out, dout, stats, packed, err, errlen);
}
