/* frontend.h -- the front end's entry point: a .moe file in, a verified forward graph out. */
#ifndef MOEC_FRONTEND_H
#define MOEC_FRONTEND_H

#include <stdio.h>

#include "ir.h"

typedef struct { const char *name; const char *value; } moec_set; /* one --set NAME=VALUE */

/* Reads, parses, checks and lowers the .moe file at path, applying the --set overrides.
 * Prints every diagnostic to diag and returns NULL if there was any error; otherwise the
 * verified forward graph (caller frees with ir_graph_free). */
ir_graph *moec_frontend_load(const char *path, const moec_set *sets, int n_sets, FILE *diag);

#endif
