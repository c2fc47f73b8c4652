/* gpu_cudnn_attn_desc.c -- the translation of a ca_graph into backend descriptors: tensors
 * and operations (matmul, pointwise, reduction, reshape), each descriptor owned by the plan
 * entry it was made for and destroyed with it; failures name the call, descriptor and
 * attribute. */
#include "gpu_cudnn_attn_int.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void cda_plan_release(plan_entry *p) {
  for (int i = p->n_descs - 1; i >= 0; i--)
    if (p->descs[i]) cda_api.DestroyDescriptor(p->descs[i]);
  free(p->descs);
  memset(p, 0, sizeof *p);
}

/* Creates a descriptor owned by plan p. */
void *cda_new_desc(plan_entry *p, int type, const char *what, char *err, size_t errlen) {
  if (p->n_descs == p->cap_descs) {
    int cap = p->cap_descs ? 2 * p->cap_descs : 64;
    void **d = realloc(p->descs, (size_t)cap * sizeof *d);
    if (!d) return snprintf(err, errlen, "out of host memory"), NULL;
    p->descs = d;
    p->cap_descs = cap;
  }
  void *d = NULL;
  cd_status st = cda_api.CreateDescriptor(type, &d);
  if (st != CD_STATUS_SUCCESS || !d) {
    cda_fail_status(st, err, errlen, "cudnnBackendCreateDescriptor(%s) for %s", desc_type_name(type), what);
    return NULL;
  }
  p->descs[p->n_descs++] = d;
  return d;
}

int cda_set(void *d, const char *what, int attr, int type, int64_t n, const void *v, char *err, size_t errlen) {
  cd_status st = cda_api.SetAttribute(d, attr, type, n, v);
  if (st != CD_STATUS_SUCCESS)
    return cda_fail_status(st, err, errlen, "cudnnBackendSetAttribute(%s, %s)", what, attr_name(attr));
  return 0;
}

int cda_fin(void *d, const char *what, char *err, size_t errlen) {
  cd_status st = cda_api.Finalize(d);
  if (st != CD_STATUS_SUCCESS) return cda_fail_status(st, err, errlen, "cudnnBackendFinalize(%s)", what);
  return 0;
}

int cda_make_tensor(plan_entry *p, const ca_tensor *t, void **out, char *err, size_t errlen) {
  char what[96];
  snprintf(what, sizeof what, "tensor '%s' uid %lld", t->name, (long long)t->uid);
  void *d = cda_new_desc(p, CD_BACKEND_TENSOR_DESCRIPTOR, what, err, errlen);
  if (!d) return -1;
  const int dtype = t->dtype;
  const int64_t align = 16;
  const bool yes = true;
  if (cda_set(d, what, CD_ATTR_TENSOR_DATA_TYPE, CD_TYPE_DATA_TYPE, 1, &dtype, err, errlen) ||
      cda_set(d, what, CD_ATTR_TENSOR_DIMENSIONS, CD_TYPE_INT64, 4, t->dim, err, errlen) ||
      cda_set(d, what, CD_ATTR_TENSOR_STRIDES, CD_TYPE_INT64, 4, t->stride, err, errlen) ||
      cda_set(d, what, CD_ATTR_TENSOR_UNIQUE_ID, CD_TYPE_INT64, 1, &t->uid, err, errlen) ||
      cda_set(d, what, CD_ATTR_TENSOR_BYTE_ALIGNMENT, CD_TYPE_INT64, 1, &align, err, errlen) ||
      (t->is_virtual && cda_set(d, what, CD_ATTR_TENSOR_IS_VIRTUAL, CD_TYPE_BOOLEAN, 1, &yes, err, errlen)) ||
      (t->by_value && cda_set(d, what, CD_ATTR_TENSOR_IS_BY_VALUE, CD_TYPE_BOOLEAN, 1, &yes, err, errlen)) ||
      cda_fin(d, what, err, errlen))
    return -1;
  *out = d;
  return 0;
}

int cda_make_op(plan_entry *p, const ca_graph *g, int i, void *const *td, void **out, char *err, size_t errlen) {
  const ca_op *o = &g->op[i];
  char what[128], what2[192];
  snprintf(what, sizeof what, "op %d '%s' (%s)", i, o->name, cda_op_mode_name(o));
  void *x = td[o->x], *y = td[o->y], *b = o->b >= 0 ? td[o->b] : NULL, *t = o->t >= 0 ? td[o->t] : NULL;
  void *inner = NULL, *op = NULL;
  const int comp = o->comp;
  if (o->kind == OP_MATMUL) {
    snprintf(what2, sizeof what2, "%s: its MATMUL descriptor", what);
    if (!(inner = cda_new_desc(p, CD_BACKEND_MATMUL_DESCRIPTOR, what2, err, errlen)) ||
        cda_set(inner, what2, CD_ATTR_MATMUL_COMP_TYPE, CD_TYPE_DATA_TYPE, 1, &comp, err, errlen) ||
        cda_fin(inner, what2, err, errlen) ||
        !(op = cda_new_desc(p, CD_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what, err, errlen)) ||
        cda_set(op, what, CD_ATTR_OPERATION_MATMUL_ADESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &x, err, errlen) ||
        cda_set(op, what, CD_ATTR_OPERATION_MATMUL_BDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &b, err, errlen) ||
        cda_set(op, what, CD_ATTR_OPERATION_MATMUL_CDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &y, err, errlen) ||
        cda_set(op, what, CD_ATTR_OPERATION_MATMUL_DESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &inner, err, errlen))
      return -1;
  } else if (o->kind == OP_POINTWISE) {
    snprintf(what2, sizeof what2, "%s: its POINTWISE descriptor", what);
    const int mode = o->mode;
    const float alpha = 1.0f;
    if (!(inner = cda_new_desc(p, CD_BACKEND_POINTWISE_DESCRIPTOR, what2, err, errlen)) ||
        cda_set(inner, what2, CD_ATTR_POINTWISE_MODE, CD_TYPE_POINTWISE_MODE, 1, &mode, err, errlen) ||
        cda_set(inner, what2, CD_ATTR_POINTWISE_MATH_PREC, CD_TYPE_DATA_TYPE, 1, &comp, err, errlen) ||
        (o->axis >= 0 && cda_set(inner, what2, CD_ATTR_POINTWISE_AXIS, CD_TYPE_INT64, 1, &o->axis, err, errlen)) ||
        cda_fin(inner, what2, err, errlen) ||
        !(op = cda_new_desc(p, CD_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what, err, errlen)) ||
        cda_set(op, what, CD_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CD_TYPE_BACKEND_DESCRIPTOR, 1, &inner, err, errlen) ||
        cda_set(op, what, CD_ATTR_OPERATION_POINTWISE_XDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &x, err, errlen) ||
        cda_set(op, what, CD_ATTR_OPERATION_POINTWISE_YDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &y, err, errlen) ||
        (b && cda_set(op, what, CD_ATTR_OPERATION_POINTWISE_BDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &b, err, errlen)) ||
        (t && cda_set(op, what, CD_ATTR_OPERATION_POINTWISE_TDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &t, err, errlen)) ||
        cda_set(op, what, CD_ATTR_OPERATION_POINTWISE_ALPHA1, CD_TYPE_FLOAT, 1, &alpha, err, errlen) ||
        cda_set(op, what, CD_ATTR_OPERATION_POINTWISE_ALPHA2, CD_TYPE_FLOAT, 1, &alpha, err, errlen))
      return -1;
  } else if (o->kind == OP_REDUCTION) {
    snprintf(what2, sizeof what2, "%s: its REDUCTION descriptor", what);
    const int mode = o->mode;
    if (!(inner = cda_new_desc(p, CD_BACKEND_REDUCTION_DESCRIPTOR, what2, err, errlen)) ||
        cda_set(inner, what2, CD_ATTR_REDUCTION_COMP_TYPE, CD_TYPE_DATA_TYPE, 1, &comp, err, errlen) ||
        cda_set(inner, what2, CD_ATTR_REDUCTION_OPERATOR, CD_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, err, errlen) ||
        cda_fin(inner, what2, err, errlen) ||
        !(op = cda_new_desc(p, CD_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what, err, errlen)) ||
        cda_set(op, what, CD_ATTR_OPERATION_REDUCTION_DESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &inner, err, errlen) ||
        cda_set(op, what, CD_ATTR_OPERATION_REDUCTION_XDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &x, err, errlen) ||
        cda_set(op, what, CD_ATTR_OPERATION_REDUCTION_YDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &y, err, errlen))
      return -1;
  } else {
    if (!(op = cda_new_desc(p, CD_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what, err, errlen)) ||
        cda_set(op, what, CD_ATTR_OPERATION_RESHAPE_XDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &x, err, errlen) ||
        cda_set(op, what, CD_ATTR_OPERATION_RESHAPE_YDESC, CD_TYPE_BACKEND_DESCRIPTOR, 1, &y, err, errlen))
      return -1;
  }
  if (cda_fin(op, what, err, errlen)) return -1;
  *out = op;
  return 0;
}
