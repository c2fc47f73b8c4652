/* ops.c -- the op table as data: names, arities and codegen classes from ops.def. */
#include <string.h>

#include "ir.h"

const ir_op_info ir_ops[OP_COUNT] = {
#define OP(id, name, min_in, max_in, cg) [OP_##id] = {name, min_in, max_in, cg},
#include "ops.def"
#undef OP
};

ir_op ir_op_by_name(const char *name) {
  for (int i = 0; i < OP_COUNT; i++)
    if (strcmp(ir_ops[i].name, name) == 0) return (ir_op)i;
  return OP_COUNT;
}

const char *ir_dtype_name(ir_dtype t) {
  static const char *names[DT_COUNT] = {"f32", "bf16", "i32", "e4m3", "e8m0"};
  return (unsigned)t < DT_COUNT ? names[t] : "?";
}
