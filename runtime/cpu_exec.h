/* cpu_exec.h -- the CPU reference executor: runs any IR graph in fp32 through the ck_
 * kernels, rounding to bf16 wherever a value's dtype is bf16, and applying the AdamW updates
 * of a training-step graph to the parameters in place. */
#ifndef MOEC_CPU_EXEC_H
#define MOEC_CPU_EXEC_H

#include <stdint.h>

#include "ir.h"
#include "params.h"

typedef struct cpu_exec cpu_exec;

/* Binds g's param ops to ps by name. NULL with a message in err when a param is missing. */
cpu_exec *cpu_exec_new(const ir_graph *g, rt_params *ps, char *err, size_t errlen);
void cpu_exec_free(cpu_exec *x);
/* The communicator of this rank (data/expert parallelism): all_reduce ops sum over its
 * groups. Without one, a graph with collectives fails at its first all_reduce. */
struct comm_world;
void cpu_exec_set_comm(cpu_exec *x, struct comm_world *w, int rank);

/* Runs the graph once on tokens and labels (batch*seq each). outputs receives the scalar
 * value of each graph output (loss, cross-entropy); step (1-based) sets the learning rate of
 * the AdamW ops, grad_norm (if not NULL) receives the global gradient norm before clipping.
 * Returns 0, or -1 with a message naming the op and its source location. */
int cpu_exec_run(cpu_exec *x, const int32_t *tokens, const int32_t *labels, int64_t step,
                 float *outputs, double *grad_norm, char *err, size_t errlen);

/* After a run, the value of a node (NULL if freed or not a float value), for tests. Keeps
 * every value alive when keep_all is set before the run. */
void cpu_exec_keep_all(cpu_exec *x, int keep_all);
const float *cpu_exec_value(const cpu_exec *x, int id, int64_t *numel);

#endif
