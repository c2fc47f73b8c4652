/* memplan.h -- predicts the device memory of a graph from liveness: parameters (fp32 masters),
 * AdamW moments, their bf16 copies, and the peak of activations alive at once when every value is freed after
 * its last use (plus each attention op's scratch while it runs). */
#ifndef MOEC_MEMPLAN_H
#define MOEC_MEMPLAN_H

#include <stdint.h>

#include "ir.h"

typedef struct {
  int64_t params;      /* bytes of fp32 master weights */
  int64_t optimizer;   /* bytes of AdamW moments (0 for a graph without adamw) */
  int64_t copies;      /* bytes of the parameters' bf16 compute copies (kept between steps; a
                          stack of them is their storage, runtime/gpu_views.h) */
  int64_t activations; /* peak bytes of values alive at once, scratch included */
  int peak_at;         /* the node at which the activations peak */
  int64_t total;       /* params + optimizer + copies + activations */
} memplan;

void memplan_estimate(const ir_graph *g, memplan *out);

#endif
