/* test_passes.c -- what the fusion passes refuse, and the pass manager.
 *
 * - group-linear leaves a block alone, and says why in a note on its combine, when an expert
 *   linear has a bias, an op has no grouped form, two experts share a weight, a value of a body
 *   has another use, or the bodies differ.
 * - grouped-mlp refuses a down projection with a bias (the routing probability cannot move
 *   into the MLP) and a body that is not SwiGLU, and restacks gate_up when up comes first.
 * - A pass that breaks the IR is reported by the verifier with the pass's name, the node and
 *   its source location.
 * - --print-after-change prints only after passes that changed the IR; --dump-dir writes the
 *   numbered files.
 * - fold-grad-cast feeds the optimizer bf16 gradients, and leaves all_reduce'd ones alone.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend.h"
#include "pipeline.h"
#include "rewrite.h"

#include "check.h"

static const moec_set small[] = {{"hidden", "32"}, {"ffn", "48"}, {"seq", "16"}, {"batch", "2"}, {"layers", "1"}};

static ir_graph *load(const char *path, int tiny_sets) {
  ir_graph *g = moec_frontend_load(path, small, tiny_sets ? 5 : 0, stderr);
  if (!g) {
    printf("cannot load %s\n", path);
    exit(1);
  }
  return g;
}

static char *dump(const ir_graph *g) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ir_print(g, f);
  fclose(f);
  return buf;
}

static int count_op(const ir_graph *g, ir_op op) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
  return n;
}

/* Runs `passes` (no train) and returns the graph; the dump must contain `want`. */
static ir_graph *run_expect(ir_graph *g, const char *passes, const char *want, const char *what) {
  pipeline_opts o = {.passes = passes, .dump = stdout};
  int rc = pipeline_run(&g, &o, stdout);
  CHECK(rc == 0, "%s: pipeline failed", what);
  char *text = dump(g);
  CHECK(!want || strstr(text, want), "%s: the dump does not say '%s'", what, want);
  free(text);
  return g;
}

static int node_with(const ir_graph *g, ir_op op, int nth) {
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == op && nth-- == 0) return i;
  return -1;
}

/* The linear of expert e that reads weight param named `suffix` (e.g. "w1.weight"). */
static int expert_linear(const ir_graph *g, int e, const char *suffix) {
  char want[128];
  snprintf(want, sizeof want, "experts.%d.%s", e, suffix);
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    if (n->op != OP_LINEAR) continue;
    int w = n->in[1];
    if (g->nodes[w].op == OP_CAST) w = g->nodes[w].in[0];
    if (strstr(ir_get_str(&g->nodes[w], "name", ""), want)) return i;
  }
  return -1;
}

static void test_group_linear_refusals(void) {
  ir_graph *g = run_expect(load("tests/passes/bias_down.moe", 0), "group-linear", "group-linear: left alone: linear %", "bias");
  CHECK(count_op(g, OP_GROUPED_LINEAR) == 0 && count_op(g, OP_COMBINE) == 1, "bias: the block must stay naive");
  ir_graph_free(g);
  g = run_expect(load("tests/passes/norm_in_expert.moe", 0), "group-linear", "(rmsnorm) in the expert body has no grouped form",
                 "rmsnorm in an expert");
  ir_graph_free(g);

  /* shared weights: expert 1's gate linear reads expert 0's gate weight */
  g = load("models/tiny.moe", 1);
  int l0 = expert_linear(g, 0, "w1.weight"), l1 = expert_linear(g, 1, "w1.weight");
  CHECK(l0 >= 0 && l1 >= 0, "tiny: expert linears not found");
  g->nodes[l1].in[1] = g->nodes[l0].in[1];
  g = run_expect(g, "group-linear,dce", "(shared weights)", "shared weights");
  CHECK(count_op(g, OP_GROUPED_LINEAR) == 0, "shared weights: grouped anyway");
  ir_graph_free(g);

  /* another use in between: a value of expert 2's body read outside the block */
  g = load("models/tiny.moe", 1);
  int l2 = expert_linear(g, 2, "w1.weight");
  ir_loc at = g->nodes[l2].loc;
  CHECK(ir_add(g, OP_SILU, &l2, 1, NULL, 0, at) >= 0, "silu: %s", g->err);
  g = run_expect(g, "group-linear", "outside the experts block (another use in between)", "another use");
  CHECK(count_op(g, OP_GROUPED_LINEAR) == 0, "another use: grouped anyway");
  ir_graph_free(g);

  /* different ops: expert 3's silu becomes a cast */
  g = load("models/tiny.moe", 1);
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == OP_SILU && g->nodes[i].type.dims[0] == g->nodes[expert_linear(g, 3, "w1.weight")].type.dims[0])
      g->nodes[i].op = OP_CAST;
  g = run_expect(g, "group-linear", "differs from expert 0's", "different ops");
  ir_graph_free(g);

  /* and the pattern that holds: one grouped_linear for gate+up, one for down, no expert linear */
  g = run_expect(load("models/tiny.moe", 1), "group-linear", "(2 siblings reading one input, merged)", "tiny");
  CHECK(count_op(g, OP_GROUPED_LINEAR) == 2 && count_op(g, OP_DISPATCH) == 0 && count_op(g, OP_COMBINE) == 0,
        "tiny: expected 2 grouped_linear and no dispatch/combine");
  for (int i = 0; i < g->n_nodes; i++)
    CHECK(g->nodes[i].op != OP_LINEAR || g->nodes[i].type.dims[0] >= 0, "tiny: linear %%%d over expert rows left", i);
  CHECK(g->n_syms == 0, "tiny: the per-expert row symbols should be gone (%d left)", g->n_syms);
  ir_graph_free(g);
}

/* Gives the down grouped_linear of the first experts block a bias [E, H]. */
static ir_graph *with_down_bias(ir_graph *g) {
  int down = node_with(g, OP_GROUPED_LINEAR, 1);
  rw_ctx r;
  if (down < 0 || rw_begin(&r, g, "test", stdout)) return g;
  for (int id = 0; id < g->n_nodes; id++) {
    if (id != down) {
      rw_copy(&r, id);
      continue;
    }
    const ir_node *n = &g->nodes[id];
    const ir_type *w = &g->nodes[n->in[1]].type;
    ir_attr pa[] = {ir_attr_str("name", "test.down_bias"), ir_attr_str("init", "zeros")};
    int b = rw_emit_typed(&r, OP_PARAM, NULL, 0, pa, 2, (ir_type){DT_F32, 2, {w->dims[0], w->dims[2], 0, 0}}, n->loc);
    r.map[id] = rw_emit(&r, OP_GROUPED_LINEAR, (int[]){r.map[n->in[0]], r.map[n->in[1]], r.map[n->in[2]], b}, 4, NULL, 0, n->loc);
  }
  rw_finish(&r, &g);
  return g;
}

static void test_grouped_mlp_refusals(void) {
  ir_graph *g = run_expect(load("models/tiny.moe", 1), "group-linear", NULL, "tiny");
  g = with_down_bias(g);
  CHECK(ir_verify(g, "test", stdout) == 0, "down bias graph invalid");
  g = run_expect(g, "grouped-mlp", "the down projection %", "down bias");
  char *text = dump(g);
  CHECK(strstr(text, "has a bias, so the routing probability cannot move into the MLP"), "down bias: message");
  free(text);
  CHECK(count_op(g, OP_GROUPED_MLP) == 0, "down bias: fused anyway");
  ir_graph_free(g);
  g = run_expect(load("tests/passes/plain_mlp.moe", 0), "group-linear,grouped-mlp", "grouped-mlp: left alone: the down projection reads a silu",
                 "plain MLP");
  CHECK(count_op(g, OP_GROUPED_LINEAR) == 2 && count_op(g, OP_GROUPED_MLP) == 0, "plain MLP: grouped but not fused");
  ir_graph_free(g);
  g = run_expect(load("tests/passes/up_first.moe", 0), "group-linear,grouped-mlp", "saved=\"xs,gate_up,probs\"", "up first");
  CHECK(count_op(g, OP_GROUPED_MLP) == 2 && count_op(g, OP_GROUPED_LINEAR) == 0, "up first: one grouped_mlp per layer");
  ir_graph_free(g);
}

/* A pass that gives the first linear a wrong result type. */
static int pass_break(ir_graph **g, FILE *err) {
  (void)err;
  (*g)->nodes[node_with(*g, OP_LINEAR, 0)].type.dims[1] += 1;
  return 0;
}
static int pass_nothing(ir_graph **g, FILE *err) {
  (void)g;
  (void)err;
  return 0;
}

static void test_verifier_names_the_pass(void) {
  ir_graph *g = load("models/tiny.moe", 1);
  const pass_info table[] = {{"nothing", pass_nothing, "", 1, 0}, {"break-it", pass_break, "", 1, 0}};
  char *buf = NULL;
  size_t len = 0;
  FILE *err = open_memstream(&buf, &len);
  pipeline_opts o = {.dump = stdout};
  int rc = pipeline_run_table(&g, table, 2, &o, err);
  fclose(err);
  CHECK(rc != 0, "a broken IR passed the verifier");
  char want[96];
  snprintf(want, sizeof want, "error: IR invalid after pass break-it: %%%d = linear(", node_with(g, OP_LINEAR, 0));
  CHECK(strstr(buf, want) && strstr(buf, "loc(\"models/tiny.moe\":23:13)") &&
            strstr(buf, "result type should be"),
        "verifier message: %s", buf);
  CHECK(strstr(buf, "pass break-it left an invalid IR"), "pass manager message: %s", buf);
  free(buf);
  ir_graph_free(g);
}

static void test_print_after_change(void) {
  ir_graph *g = load("models/tiny.moe", 1);
  const pass_info table[] = {{"nothing", pass_nothing, "", 1, 0}, {"group-linear", pass_group_linear, "", 1, 0}};
  char *buf = NULL, dir[] = "/tmp/moec_dumpXXXXXX";
  size_t len = 0;
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  FILE *out = open_memstream(&buf, &len);
  pipeline_opts o = {.dump = out, .print_after_change = 1, .dump_dir = dir};
  CHECK(pipeline_run_table(&g, table, 2, &o, stdout) == 0, "pipeline");
  fclose(out);
  CHECK(strstr(buf, "IR after lower") && strstr(buf, "IR after group-linear") && !strstr(buf, "IR after nothing"),
        "--print-after-change printed: %.200s", buf);
  char path[512];
  snprintf(path, sizeof path, "%s/00-after-lower.mir", dir);
  CHECK(access(path, R_OK) == 0, "no %s", path);
  snprintf(path, sizeof path, "%s/02-after-group-linear.mir", dir);
  CHECK(access(path, R_OK) == 0, "no %s", path);
  snprintf(path, sizeof path, "%s/01-after-nothing.mir", dir);
  CHECK(access(path, R_OK) != 0, "%s written though the pass changed nothing", path);
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  if (d) closedir(d);
  rmdir(dir);
  free(buf);
  ir_graph_free(g);
}

/* In the mxfp8 step only the expert GEMMs and the attention projections' (one-group grouped
 * GEMMs, mxfp8-projections) read MXFP8 values; router, embedding, norms, the attention op
 * itself, lm_head and the loss stay high precision. */
static void test_mxfp8_placement(void) {
  const moec_set sets[] = {{"hidden", "64"}, {"ffn", "96"}, {"seq", "16"}, {"batch", "2"}, {"precision", "mxfp8"}};
  ir_graph *g = moec_frontend_load("models/tiny.moe", sets, 5, stderr);
  pipeline_opts o = {.dump = stdout, .train = 1};
  CHECK(g && pipeline_run(&g, &o, stdout) == 0, "mxfp8 step");
  if (!g) return;
  int readers = 0, seed = -1, saved = 0;
  for (int i = 0; i < g->n_nodes && seed < 0; i++)
    if (g->nodes[i].op == OP_FILL && ir_get_int(&g->nodes[i], "seed", 0)) seed = i;
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    /* the saved gate_up is quantized in the forward (so the forward keeps its e4m3 form, not
       bf16), even with mxfp8-projections' i32 fills ahead of the loss seed */
    if (n->op == OP_MXFP8_QUANTIZE && strstr(ir_get_str(n, "role", ""), "saved")) {
      saved++;
      CHECK(i < seed, "saved quantize %%%d comes after the loss seed %%%d (in the backward)", i, seed);
    }
    for (int j = 0; j < n->n_in; j++) {
      if (g->nodes[n->in[j]].op != OP_MXFP8_DEQUANTIZE) continue;
      readers++;
      CHECK(n->op == OP_GROUPED_MLP || n->op == OP_GROUPED_MLP_BWD || n->op == OP_GROUPED_LINEAR ||
                n->op == OP_GROUPED_LINEAR_DGRAD || n->op == OP_GROUPED_LINEAR_WGRAD,
            "%%%d (%s) reads an MXFP8 value", i, ir_ops[n->op].name);
    }
    if (n->op == OP_MXFP8_QUANTIZE) {
      const ir_node *src = &g->nodes[n->in[0]];
      CHECK(src->op != OP_MXFP8_DEQUANTIZE, "%%%d quantizes a quantized value (not from the high-precision one)", i);
    }
  }
  /* per layer: grouped_mlp 3, grouped_mlp_bwd 3, dgrad 2, wgrad 2 x 2; and 4 projections x
     (forward 2, dgrad 2, wgrad 2) */
  CHECK(readers == 2 * (12 + 24), "expected 72 MXFP8 operands, found %d", readers);
  CHECK(seed > 0 && saved == 2, "%d saved quantizes, want one a layer", saved);
  ir_graph_free(g);
}

/* fold-grad-cast: in a bf16 step grad_norm and adamw read the bf16 gradients (no widening cast
 * left in front of them); disabled, they read casts; in a dp=2 step they read the all_reduce'd
 * f32 gradients, which it leaves alone. */
static int optimizer_reads(const ir_graph *g, ir_op src_op, ir_dtype dt) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->op != OP_ADAMW && nd->op != OP_GRAD_NORM) continue;
    for (int j = nd->op == OP_ADAMW ? 1 : 0; j < (nd->op == OP_ADAMW ? 2 : nd->n_in); j++) {
      const ir_node *v = &g->nodes[nd->in[j]];
      n += v->op == src_op && v->type.dtype == dt;
    }
  }
  return n;
}

static void test_fold_grad_cast(void) {
  const moec_set sets[] = {{"hidden", "32"}, {"ffn", "48"}, {"seq", "16"}, {"batch", "2"}, {"precision", "bf16"}, {"dp", "2"}};
  for (int mode = 0; mode < 3; mode++) {
    ir_graph *g = moec_frontend_load("models/tiny.moe", sets, mode == 2 ? 6 : 5, stderr);
    pipeline_opts o = {.dump = stdout, .train = 1, .disable = mode == 1 ? "fold-grad-cast" : NULL};
    CHECK(g && pipeline_run(&g, &o, stdout) == 0, "bf16 step (mode %d)", mode);
    if (!g) continue;
    int casts = optimizer_reads(g, OP_CAST, DT_F32), bf16 = 0, reduced = optimizer_reads(g, OP_ALL_REDUCE, DT_F32);
    for (int op = 0; op < OP_COUNT; op++)
      if (op != OP_PARAM) bf16 += optimizer_reads(g, (ir_op)op, DT_BF16);
    if (mode == 0) CHECK(casts == 0 && bf16 > 0, "folded: %d optimizer operands still casts, %d bf16", casts, bf16);
    if (mode == 1) CHECK(casts > 0 && bf16 == 0, "disabled: %d casts, %d bf16 operands", casts, bf16);
    if (mode == 2) CHECK(reduced > 0 && bf16 == 0, "dp=2: %d all_reduce operands, %d bf16", reduced, bf16);
    ir_graph_free(g);
  }
}

/* sync: in a dp=2 step each parameter gradient's all_reduce stands right behind the gradient
 * (so the collective can overlap the rest of the backward), not at grad_norm; every optimizer
 * operand is one of them. */
static void test_sync_placement(void) {
  const moec_set sets[] = {{"hidden", "32"}, {"ffn", "48"}, {"seq", "16"}, {"batch", "2"}, {"dp", "2"}};
  ir_graph *g = moec_frontend_load("models/tiny.moe", sets, 5, stderr);
  pipeline_opts o = {.dump = stdout, .train = 1};
  CHECK(g && pipeline_run(&g, &o, stdout) == 0, "dp=2 step");
  if (!g) return;
  int first_opt = g->n_nodes, reads = 0, placed = 0;
  for (int i = 0; i < g->n_nodes; i++)
    if ((g->nodes[i].op == OP_ADAMW || g->nodes[i].op == OP_GRAD_NORM) && i < first_opt) first_opt = i;
  for (int i = 0; i < g->n_nodes; i++) {
    if (g->nodes[i].op != OP_ADAMW) continue;
    const int r = g->nodes[i].in[1];
    reads++;
    placed += g->nodes[r].op == OP_ALL_REDUCE && g->nodes[r].in[0] == r - 1 && r < first_opt;
  }
  CHECK(reads > 0 && placed == reads, "%d of %d optimizer gradients reduced right where they are complete", placed, reads);
  ir_graph_free(g);
}

int main(void) {
  test_fold_grad_cast();
  test_sync_placement();
  test_mxfp8_placement();
  test_group_linear_refusals();
  test_grouped_mlp_refusals();
  test_verifier_names_the_pass();
  test_print_after_change();
  if (failures) {
    printf("test_passes: %d failures\n", failures);
    return 1;
  }
  printf("test_passes: refusals, verifier report and pass manager flags ok\n");
  return 0;
}
