/* gpu_cudnn_attn_int.h -- internal to gpu_cudnn_attn*.c: the cuDNN enum values and entry
 * points (checked against cudnn_graph.h in gpu_cudnn_attn.c), the graphs as plain data, the
 * plan cache entries and the gpu_cudnn_attn object, and the helpers the files share. */
#ifndef MOEC_GPU_CUDNN_ATTN_INT_H
#define MOEC_GPU_CUDNN_ATTN_INT_H

#include <stddef.h>
#include <stdint.h>

#include "gpu_cudnn_attn.h"
#include "gpu_rowstats.h"

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

extern cd_api cda_api; /* filled by the loader (gpu_cudnn_attn.c) */
int cda_debug_on(void);
void cda_dbg(const char *fmt, ...);
/* err = "cuDNN: <call> failed: <status name> (<code>): <last error>"; returns -1 */
int cda_fail_status(cd_status st, char *err, size_t errlen, const char *fmt, ...);

/* What a non-virtual tensor is bound to at execution. */
enum { BIND_NONE, BIND_Q, BIND_K, BIND_V, BIND_O, BIND_DO, BIND_STATS, BIND_DQ, BIND_DK, BIND_DV, BIND_SCALE,
       BIND_NEG_INF, BIND_ONE, BIND_SOFTMAX_SUM, BIND_DQ_ACCUM, BIND_COUNT };
extern const char *const cda_bind_names[BIND_COUNT];

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

/* gpu_cudnn_attn_graph.c */
void cda_build_graph(ca_graph *g, int bwd, const gpu_cudnn_shape *s);
/* gpu_cudnn_attn_check.c */
const char *cda_op_mode_name(const ca_op *o);
int cda_tensor_line(const ca_tensor *t, char *buf, size_t len);
int cda_op_line(const ca_graph *g, int i, char *buf, size_t len);
int cda_check_graph(const ca_graph *g, const gpu_cudnn_shape *s, char *err, size_t errlen);
int cda_valid_shape(const gpu_cudnn_shape *s, char *err, size_t errlen);

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

/* gpu_cudnn_attn_desc.c: descriptors owned by a plan entry */
void cda_plan_release(plan_entry *p);
void *cda_new_desc(plan_entry *p, int type, const char *what, char *err, size_t errlen);
int cda_set(void *d, const char *what, int attr, int type, int64_t n, const void *v, char *err, size_t errlen);
int cda_fin(void *d, const char *what, char *err, size_t errlen);
int cda_make_tensor(plan_entry *p, const ca_tensor *t, void **out, char *err, size_t errlen);
int cda_make_op(plan_entry *p, const ca_graph *g, int i, void *const *td, void **out, char *err, size_t errlen);
/* gpu_cudnn_attn_plan.c: the cached plan of (bwd, s), built on first use; NULL with err */
plan_entry *cda_get_plan(gpu_cudnn_attn *c, int bwd, const gpu_cudnn_shape *s, char *err, size_t errlen);

#endif
