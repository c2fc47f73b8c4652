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

/* Source files in memory: what `moec compile` records and embeds in an executable. */
typedef struct {
  char *path; /* as the front end opened it (includes: joined to the including file's folder) */
  char *text;
  size_t len;
} moec_source;
typedef struct {
  moec_source *v;
  int n, cap;
} moec_sources;
void moec_sources_free(moec_sources *s);
/* Appends a copy of (path, text) to s; 0, or -1 when out of memory. */
int moec_sources_add(moec_sources *s, const char *path, const char *text, size_t len);

/* As moec_frontend_load, but when `from` is not NULL every file is read from it (by path)
 * instead of the disk, and when `record` is not NULL every file read is appended to it,
 * the main file first. */
ir_graph *moec_frontend_load_ex(const char *path, const moec_set *sets, int n_sets, FILE *diag,
                                const moec_sources *from, moec_sources *record);

#endif
