/* pipeline.h -- the pass manager: one flat list of named passes, the verifier between them,
 * and dumps after any of them. */
#ifndef MOEC_PIPELINE_H
#define MOEC_PIPELINE_H

#include <stdint.h>
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
  int print_after_change;   /* print only after passes that changed the IR (alone: after every such pass) */
  const char *dump_dir;     /* also write DIR/NN-after-NAME.mir after lower and each pass run, or NULL */
  int pass_timing;          /* print each pass's time and op counts to err at the end */
} pipeline_opts;

/* Checks that every name in opts is a known pass; prints "moec: error: ..." and returns -1
 * otherwise. */
int pipeline_check_opts(const pipeline_opts *o, FILE *err);

/* Prints the "after lower" dump if asked, then runs the passes in order, verifying after each.
 * Returns 0, or -1 naming the pass that failed. */
int pipeline_run(ir_graph **g, const pipeline_opts *o, FILE *err);

/* As pipeline_run, with another pass table (tests use it to run a pass of their own). */
int pipeline_run_table(ir_graph **g, const pass_info *table, int n, const pipeline_opts *o, FILE *err);

/* A hash of everything the text dump shows (ops, operands, attributes, types, locations,
 * notes, outputs): the pass manager's "did this pass change the IR". */
uint64_t ir_hash(const ir_graph *g);

/* The header of each dump section. */
void pipeline_print_header(const char *pass, FILE *out);

/* Passes (one file each under passes/). */
int pass_group_linear(ir_graph **g, FILE *err);
int pass_grouped_mlp(ir_graph **g, FILE *err);
int pass_parallelize(ir_graph **g, FILE *err);
int pass_mxfp8_projections(ir_graph **g, FILE *err);
int pass_autodiff(ir_graph **g, FILE *err);
int pass_sync(ir_graph **g, FILE *err);
int pass_fold_grad_cast(ir_graph **g, FILE *err);
int pass_mxfp8(ir_graph **g, FILE *err);
int pass_fuse_residual(ir_graph **g, FILE *err);
int pass_fuse_gemm_add(ir_graph **g, FILE *err);
int pass_dce(ir_graph **g, FILE *err);

/* Linear weights are stored [in, out]; Hugging Face checkpoints hold [out, in]. 1 when param
 * node id is the weight of a linear, directly or through a cast, or one of the weights that
 * group-linear stacked for a grouped GEMM. */
int pass_param_is_linear_weight(const ir_graph *g, int id);

#endif
