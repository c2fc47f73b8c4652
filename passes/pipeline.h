/* pipeline.h -- the pass manager: one flat list of named passes, the verifier between them,
 * and dumps after any of them. */
#ifndef MOEC_PIPELINE_H
#define MOEC_PIPELINE_H

#include <stdio.h>

#include "ir.h"

/* A pass rewrites the graph in place (or replaces it through *g). It returns 0, or -1 after
 * printing an error to err. */
typedef int (*pass_fn)(ir_graph **g, FILE *err);

typedef struct {
  const char *name;
  pass_fn run;
  const char *summary; /* one line for --help */
  int default_on;      /* part of the default pipeline */
  int train_only;      /* runs only when building the training step (--train, train, compile) */
} pass_info;

const pass_info *pass_table(int *n);
const pass_info *pass_find(const char *name);

typedef struct {
  const char *passes;       /* comma-separated list replacing the default pipeline, or NULL */
  const char *disable;      /* comma-separated passes to skip, or NULL */
  const char *print_after;  /* "all" or a comma-separated list, or NULL */
  FILE *dump;               /* where --print-after dumps go */
  int train;                /* build the training step (forward + backward + optimizer) */
} pipeline_opts;

/* Checks that every name in opts is a known pass; prints "moec: error: ..." and returns -1
 * otherwise. */
int pipeline_check_opts(const pipeline_opts *o, FILE *err);

/* Prints the "after lower" dump if asked, then runs the passes in order, verifying after each.
 * Returns 0, or -1 naming the pass that failed. */
int pipeline_run(ir_graph **g, const pipeline_opts *o, FILE *err);

/* The header of each dump section. */
void pipeline_print_header(const char *pass, FILE *out);

/* Passes (one file each under passes/). */
int pass_dce(ir_graph **g, FILE *err);
int pass_autodiff(ir_graph **g, FILE *err);

#endif
