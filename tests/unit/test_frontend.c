/* test_frontend.c -- the five shipped models lower to the graphs they should (node counts
 * by op, every parameter's name and shape, the config), --set overrides reach the config,
 * and diag_print formats like the engine. Run from the source root. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "frontend.h"
#include "ir.h"

#include "check.h"

typedef struct {
  const char *file;
  int64_t L, H, nh, nkv, E, k, F, V, seq;
  double theta, aux, z;
  moec_precision prec;
  int64_t block, ep;
} model_spec;

static const model_spec specs[] = {
    {"models/tiny.moe", 2, 128, 4, 4, 4, 2, 256, 256, 256, 1e4, 1e-2, 1e-3, PREC_FP32, 32, 1},
    {"models/l0_sanity.moe", 2, 384, 6, 6, 4, 2, 1536, 256, 256, 1e4, 1e-2, 1e-3, PREC_BF16, 32, 1},
    {"models/genos_1b.moe", 12, 1024, 16, 8, 8, 2, 4096, 128, 8192, 5e7, 1e-3, 1e-3, PREC_BF16, 32, 1},
    {"models/og2_8x1b.moe", 16, 2048, 16, 8, 8, 2, 4096, 256, 8192, 5e5, 1e-3, 0, PREC_MXFP8, 128, 1},
    {"models/og2_8x7b.moe", 32, 4096, 32, 8, 8, 2, 14336, 256, 8192, 5e5, 1e-3, 0, PREC_MXFP8, 128, 8},
};

static int count_op(const ir_graph *g, ir_op op) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
  return n;
}

/* The parameter a linear reads (through a cast). */
static const ir_node *weight_of(const ir_graph *g, const ir_node *lin) {
  const ir_node *w = &g->nodes[lin->in[1]];
  if (w->op == OP_CAST) w = &g->nodes[w->in[0]];
  return w->op == OP_PARAM ? w : NULL;
}

/* The shape a Mixtral parameter name should have; 0 if the name is not one we know. */
static int expected_shape(const model_spec *s, const char *name, int64_t *d0, int64_t *d1) {
  int64_t hd = s->H / s->nh;
  const char *p;
  *d1 = -1;
  if (!strcmp(name, "model.embed_tokens.weight")) *d0 = s->V, *d1 = s->H;
  else if (!strcmp(name, "lm_head.weight")) *d0 = s->H, *d1 = s->V;
  else if (!strcmp(name, "model.norm.weight")) *d0 = s->H;
  else if (strncmp(name, "model.layers.", 13) != 0) return 0;
  else if ((p = strstr(name, "layernorm.weight"))) *d0 = s->H;
  else if (strstr(name, "q_proj.weight")) *d0 = s->H, *d1 = s->nh * hd;
  else if (strstr(name, "k_proj.weight") || strstr(name, "v_proj.weight")) *d0 = s->H, *d1 = s->nkv * hd;
  else if (strstr(name, "o_proj.weight")) *d0 = s->nh * hd, *d1 = s->H;
  else if (strstr(name, "gate.weight")) *d0 = s->H, *d1 = s->E;
  else if (strstr(name, ".w1.weight") || strstr(name, ".w3.weight")) *d0 = s->H, *d1 = s->F;
  else if (strstr(name, ".w2.weight")) *d0 = s->F, *d1 = s->H;
  else return 0;
  return 1;
}

static void check_model(const model_spec *s) {
  ir_graph *g = moec_frontend_load(s->file, NULL, 0, stderr);
  CHECK(g != NULL, "%s does not load", s->file);
  if (!g) return;
  const moec_config *c = &g->cfg;
  int64_t L = s->L, E = s->E;
  int bf = s->prec != PREC_FP32;
  CHECK(c->layers == L && c->hidden == s->H && c->heads == s->nh && c->kv_heads == s->nkv && c->experts == E &&
            c->top_k == s->k && c->ffn == s->F && c->vocab == s->V && c->seq == s->seq && c->head_dim == s->H / s->nh,
        "%s: config sizes", s->file);
  CHECK(c->rope_theta == s->theta && c->aux_loss == s->aux && c->z_loss == s->z && c->norm_eps == 1e-5,
        "%s: theta/aux/z/eps", s->file);
  CHECK(c->precision == s->prec && (s->prec != PREC_MXFP8 || c->mx_block == s->block) && c->ep == s->ep && c->dp == 1,
        "%s: precision %d block %" PRId64 " ep %" PRId64, s->file, c->precision, c->mx_block, c->ep);
  CHECK(c->batch >= 1 && c->steps >= 1 && c->lr > 0 && c->beta1 == 0.9 && c->beta2 == 0.95 && c->stride == c->seq,
        "%s: train defaults", s->file);
  CHECK(c->data[0] == '/' && strstr(c->data, "/models/../data/chr20"), "%s: data path %s", s->file, c->data);
  int naux = (s->aux > 0) * (int)L, nz = (s->z > 0) * (int)L;
  /* per op */
  CHECK(count_op(g, OP_INPUT) == 2, "%s: inputs", s->file);
  CHECK(count_op(g, OP_EMBEDDING) == 1 && count_op(g, OP_CROSS_ENTROPY) == 1, "%s: embedding/ce", s->file);
  CHECK(count_op(g, OP_RMSNORM) == 2 * L + 1, "%s: rmsnorm %d", s->file, count_op(g, OP_RMSNORM));
  CHECK(count_op(g, OP_ATTENTION) == L && count_op(g, OP_ROPE) == 2 * L, "%s: attention/rope", s->file);
  CHECK(count_op(g, OP_TOPK) == L && count_op(g, OP_ROUTE_WEIGHTS) == L && count_op(g, OP_COMBINE) == L, "%s: routing", s->file);
  CHECK(count_op(g, OP_DISPATCH) == L * E && count_op(g, OP_SILU) == L * E && count_op(g, OP_MUL) == L * E, "%s: experts", s->file);
  CHECK(count_op(g, OP_AUX_LOSS) == naux && count_op(g, OP_Z_LOSS) == nz, "%s: aux %d z %d", s->file,
        count_op(g, OP_AUX_LOSS), count_op(g, OP_Z_LOSS));
  CHECK(count_op(g, OP_ADD) == 2 * L + naux + nz, "%s: adds %d", s->file, count_op(g, OP_ADD));
  int64_t linears = 4 * L + L + 3 * L * E + 1; /* attention, router gate, experts, lm_head */
  CHECK(count_op(g, OP_LINEAR) == linears, "%s: linears %d, want %" PRId64, s->file, count_op(g, OP_LINEAR), linears);
  int64_t params = 1 + L * (2 + 4 + 1 + 3 * E) + 2;
  CHECK(count_op(g, OP_PARAM) == params, "%s: params %d, want %" PRId64, s->file, count_op(g, OP_PARAM), params);
  int64_t casts = bf ? 1 + L * (4 + 3 * E) + 1 + L : 0; /* weights, plus the router's f32 input */
  CHECK(count_op(g, OP_CAST) == casts, "%s: casts %d, want %" PRId64, s->file, count_op(g, OP_CAST), casts);
  int64_t total = 2 + 1 + 1 + (2 * L + 1) + 3 * L + 3 * L + L * E * 3 + naux + nz + (2 * L + naux + nz) + linears + params + casts;
  CHECK(g->n_nodes == total, "%s: %d nodes, want %" PRId64, s->file, g->n_nodes, total);
  /* expert linears: layers * experts * 3, each over its own rows */
  int expert_linears = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    if (n->op != OP_LINEAR) continue;
    const ir_node *w = weight_of(g, n);
    CHECK(w != NULL, "%s: linear %%%d has no parameter weight", s->file, i);
    if (w && ir_get_int(w, "expert", -1) >= 0) {
      expert_linears++;
      CHECK(n->type.dims[0] < 0, "%s: expert linear %%%d over static rows", s->file, i);
    }
    ir_dtype want = n->in[0] >= 0 && w && strstr(ir_get_str(w, "name", ""), "gate.weight") ? DT_F32 : bf ? DT_BF16 : DT_F32;
    CHECK(n->type.dtype == want, "%s: linear %%%d dtype %s", s->file, i, ir_dtype_name(n->type.dtype));
  }
  CHECK(expert_linears == L * E * 3, "%s: expert linears %d", s->file, expert_linears);
  /* every parameter: a known Mixtral name, the right shape, init and expert index */
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    if (n->op != OP_PARAM) continue;
    const char *name = ir_get_str(n, "name", "");
    int64_t d0, d1;
    CHECK(expected_shape(s, name, &d0, &d1), "%s: unexpected parameter name %s", s->file, name);
    if (!expected_shape(s, name, &d0, &d1)) continue;
    CHECK(n->type.dtype == DT_F32 && n->type.rank == (d1 < 0 ? 1 : 2) && n->type.dims[0] == d0 && (d1 < 0 || n->type.dims[1] == d1),
          "%s: %s has the wrong shape", s->file, name);
    const char *init = ir_get_str(n, "init", "");
    int norm = strstr(name, "norm") != NULL;
    CHECK(!strcmp(init, norm ? "ones" : "normal"), "%s: %s init %s", s->file, name, init);
    CHECK(norm || ir_get_float(n, "std", 0) == 0.02, "%s: %s std", s->file, name);
    const char *ex = strstr(name, ".experts.");
    CHECK(ir_get_int(n, "expert", -2) == (ex ? atoi(ex + 9) : -1), "%s: %s expert attr", s->file, name);
    CHECK(n->loc.file && n->loc.line > 0, "%s: %s has no location", s->file, name);
  }
  /* names are unique */
  for (int i = 0; i < g->n_nodes; i++)
    for (int j = i + 1; j < g->n_nodes && g->nodes[i].op == OP_PARAM; j++)
      if (g->nodes[j].op == OP_PARAM)
        CHECK(strcmp(ir_get_str(&g->nodes[i], "name", ""), ir_get_str(&g->nodes[j], "name", "")) != 0, "%s: duplicate name %s",
              s->file, ir_get_str(&g->nodes[i], "name", ""));
  /* outputs: total loss, then the cross entropy */
  CHECK(g->n_outputs == 2 && g->nodes[g->outputs[1]].op == OP_CROSS_ENTROPY, "%s: outputs", s->file);
  CHECK(g->nodes[g->outputs[0]].type.rank == 0 && g->nodes[g->outputs[0]].type.dtype == DT_F32, "%s: loss type", s->file);
  CHECK(g->n_syms == L * E && g->syms[0].bound == c->batch * c->seq && !strcmp(g->syms[0].name, "n0_0"), "%s: symbols", s->file);
  CHECK(ir_verify(g, "test", stderr) == 0, "%s: verifies", s->file);
  ir_graph_free(g);
}

static char *capture_load(const char *path, const moec_set *sets, int n, ir_graph **out) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  *out = moec_frontend_load(path, sets, n, f);
  fclose(f);
  return buf;
}

static void check_sets(void) {
  moec_set sets[] = {{"top_k", "1"}, {"precision", "bf16"}, {"ep", "2"}, {"lr", "1e-4"}, {"steps", "10"},
                     {"hidden", "2 * 64"}, {"schedule", "linear"}, {"beta2", "0.99"}, {"seq", "128"}, {"rc_augment", "true"}};
  ir_graph *g;
  char *err = capture_load("models/tiny.moe", sets, 10, &g);
  CHECK(g != NULL && err[0] == 0, "tiny with --set: %s", err);
  if (g) {
    const moec_config *c = &g->cfg;
    CHECK(c->top_k == 1 && c->precision == PREC_BF16 && c->ep == 2 && c->lr == 1e-4 && c->steps == 10 && c->hidden == 128 &&
              c->schedule == SCHED_LINEAR && c->beta2 == 0.99 && c->beta1 == 0.9 && c->seq == 128 && c->rc_augment == 1 &&
              c->min_lr == 1e-5,
          "--set values reached the config");
    CHECK(count_op(g, OP_CAST) > 0 && g->syms[0].bound == 8 * 128, "--set precision/seq reached the graph");
    ir_graph_free(g);
  }
  free(err);
  moec_set mx[] = {{"precision", "mxfp8(block = 128)"}};
  err = capture_load("models/tiny.moe", mx, 1, &g);
  CHECK(g && g->cfg.precision == PREC_MXFP8 && g->cfg.mx_block == 128, "mxfp8(block=128): %s", err);
  ir_graph_free(g);
  free(err);
  moec_set bad[] = {{"hiden", "3"}};
  err = capture_load("models/tiny.moe", bad, 1, &g);
  CHECK(!g && strcmp(err, "--set hiden=3: error: unknown name 'hiden'; did you mean 'hidden'?\n") == 0, "bad --set: %s", err);
  free(err);
}

/* A custom expert body: parameters are named after their variables. */
static void check_custom(void) {
  ir_graph *g;
  char *err = capture_load("tests/unit/data/custom_expert.moe", NULL, 0, &g);
  CHECK(g != NULL, "custom_expert.moe: %s", err);
  free(err);
  if (!g) return;
  static const char *const want[] = {"model.layers.1.block_sparse_moe.experts.3.a.weight",
                                     "model.layers.1.block_sparse_moe.experts.3.a.bias",
                                     "model.layers.1.block_sparse_moe.experts.3.w", "model.layers.0.p.weight",
                                     "model.layers.0.self_attn.q_proj.weight"};
  for (int k = 0; k < 5; k++) {
    const ir_node *found = NULL;
    for (int i = 0; i < g->n_nodes; i++)
      if (g->nodes[i].op == OP_PARAM && !strcmp(ir_get_str(&g->nodes[i], "name", ""), want[k])) found = &g->nodes[i];
    CHECK(found != NULL, "custom: no parameter %s", want[k]);
    if (found && k == 2) CHECK(!strcmp(ir_get_str(found, "init", ""), "zeros") && found->type.dims[0] == 128, "custom: w");
    if (found && k == 4) CHECK(found->type.dims[1] == 128, "custom: head_dim 32 x 4 heads");
  }
  CHECK(count_op(g, OP_LINEAR) == 2 * (4 + 1 + 4 * 2 + 1) + 1 && count_op(g, OP_AUX_LOSS) == 0 && g->cfg.seq == 16 &&
            g->cfg.batch == 1 && g->cfg.top_k == 1 && g->cfg.data[0] == 0,
        "custom: counts and defaults");
  ir_graph_free(g);
}

static void check_diag_print(void) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  diag_print(f, "error", "models/tiny.moe", 20, 7, 16, "demo %d", 1);
  diag_print(f, "warning", "no/such/file.fa", 3, 1, 0, "no source line");
  diag_print(f, "error", "data.fa", 0, 0, 0, "whole file");
  fclose(f);
  const char *want =
      "models/tiny.moe:20:7: error: demo 1\n"
      "   20 |   x = embedding(tokens, vocab, hidden)\n"
      "      |       ^~~~~~~~~\n"
      "no/such/file.fa:3:1: warning: no source line\n"
      "data.fa: error: whole file\n";
  CHECK(strcmp(buf, want) == 0, "diag_print:\n%s", buf);
  free(buf);
  CHECK(diag_edit_distance("hiden", "hidden") == 1 && diag_edit_distance("kv_haeds", "kv_heads") == 1, "edit distance");
}

int main(void) {
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) check_model(&specs[i]);
  check_sets();
  check_custom();
  check_diag_print();
  if (failures) {
    fprintf(stderr, "test_frontend: %d failures\n", failures);
    return 1;
  }
  printf("test_frontend: 5 models, --set, diag_print: ok\n");
  return 0;
}
