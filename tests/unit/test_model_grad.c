/* test_model_grad.c -- gradient check of whole models: the training step's gradients
 * (autodiff + the CPU executor) against central finite differences of the forward loss, on
 * random DNA tokens, for every parameter tensor (a few random elements of each). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_exec.h"
#include "frontend.h"
#include "params.h"
#include "pipeline.h"

static uint64_t rng = 88172645463325252ull;
static uint64_t next_u64(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static ir_graph *load(const char *path, const moec_set *sets, int n, int train) {
  ir_graph *g = moec_frontend_load(path, sets, n, stderr);
  if (!g) return NULL;
  pipeline_opts o = {.dump = stdout, .train = train};
  if (pipeline_run(&g, &o, stderr)) {
    ir_graph_free(g);
    return NULL;
  }
  return g;
}

static float forward_loss(cpu_exec *fx, const int32_t *tok, const int32_t *lab) {
  float out[8];
  char err[512];
  if (cpu_exec_run(fx, tok, lab, 0, out, NULL, err, sizeof err)) {
    fprintf(stderr, "forward failed: %s\n", err);
    exit(1);
  }
  return out[0];
}

/* Returns the number of failed elements. */
static int check_model(const char *path, const moec_set *sets, int n_sets) {
  ir_graph *fwd = load(path, sets, n_sets, 0), *step = load(path, sets, n_sets, 1);
  if (!fwd || !step) return 1000;
  int64_t T = step->cfg.batch * step->cfg.seq;
  int32_t *tok = malloc((size_t)T * 4), *lab = malloc((size_t)T * 4);
  static const char bases[] = "ACGTACGTACGTN";
  for (int64_t t = 0; t < T; t++) tok[t] = bases[next_u64() % 13];
  for (int64_t t = 0; t < T; t++) lab[t] = (t + 1) % step->cfg.seq ? (tok[(t + 1) % T] == 'N' ? -1 : tok[(t + 1) % T]) : -1;

  rt_params *ps = rt_params_new(step, 7);
  char err[512];
  cpu_exec *sx = cpu_exec_new(step, ps, err, sizeof err), *fx = cpu_exec_new(fwd, ps, err, sizeof err);
  if (!sx || !fx) {
    fprintf(stderr, "exec: %s\n", err);
    return 1000;
  }
  /* analytic gradients: run the step (which also updates the weights), then restore them */
  float **saved = calloc((size_t)ps->n, sizeof *saved);
  for (int i = 0; i < ps->n; i++) {
    saved[i] = malloc((size_t)ps->p[i].numel * 4);
    memcpy(saved[i], ps->p[i].w, (size_t)ps->p[i].numel * 4);
  }
  float out[8];
  cpu_exec_keep_all(sx, 1);
  if (cpu_exec_run(sx, tok, lab, 1, out, NULL, err, sizeof err)) {
    fprintf(stderr, "step failed: %s\n", err);
    return 1000;
  }
  for (int i = 0; i < ps->n; i++) memcpy(ps->p[i].w, saved[i], (size_t)ps->p[i].numel * 4);
  float loss0 = forward_loss(fx, tok, lab);
  if (fabsf(loss0 - out[0]) > 1e-6f * fabsf(loss0)) {
    fprintf(stderr, "%s: step loss %.9g differs from forward loss %.9g\n", path, out[0], loss0);
    return 1000;
  }
  int failed = 0, checked = 0, adamw = 0;
  for (int id = 0; id < step->n_nodes; id++) {
    const ir_node *n = &step->nodes[id];
    if (n->op != OP_ADAMW) continue;
    adamw++;
    rt_param *p = rt_params_find(ps, ir_get_str(&step->nodes[n->in[0]], "name", ""));
    int64_t numel;
    const float *grad = cpu_exec_value(sx, n->in[1], &numel);
    if (!p || !grad || numel != p->numel) {
      fprintf(stderr, "%s: no gradient for a parameter\n", path);
      return 1000;
    }
    /* directional derivative along a random unit direction r of the whole tensor: the
     * difference quotient of L(w + h r) must equal <grad, r>. A direction whose quotient
     * changes with h crosses a routing decision (top-k is piecewise constant): draw another. */
    float *w0 = malloc((size_t)p->numel * 4), *r = malloc((size_t)p->numel * 4);
    memcpy(w0, p->w, (size_t)p->numel * 4);
    int ok = 0;
    double fd = 0, an = 0, tol = 0;
    for (int attempt = 0; attempt < 4 && !ok; attempt++) {
      double norm = 0;
      for (int64_t j = 0; j < p->numel; j++) {
        r[j] = (float)((double)(next_u64() >> 11) * 0x1.0p-53 - 0.5);
        norm += (double)r[j] * r[j];
      }
      an = 0;
      for (int64_t j = 0; j < p->numel; j++) {
        r[j] = (float)(r[j] / sqrt(norm));
        an += (double)grad[j] * r[j];
      }
      double q[2];
      for (int k = 0; k < 2; k++) {
        float h = k ? 5e-4f : 1e-3f;
        for (int64_t j = 0; j < p->numel; j++) p->w[j] = w0[j] + h * r[j];
        double lp = forward_loss(fx, tok, lab);
        for (int64_t j = 0; j < p->numel; j++) p->w[j] = w0[j] - h * r[j];
        double lm = forward_loss(fx, tok, lab);
        q[k] = (lp - lm) / (2.0 * (double)h);
      }
      memcpy(p->w, w0, (size_t)p->numel * 4);
      fd = q[0];
      /* float losses (~5.5, ulp 5e-7) leave ~1e-3 of noise in a quotient with h = 1e-3 */
      tol = 1e-2 * fabs(an) + 2e-3;
      int smooth = fabs(q[0] - q[1]) <= 2 * tol;
      ok = smooth && fabs(fd - an) <= tol;
      if (!smooth) continue;
      break;
    }
    checked++;
    if (!ok) {
      failed++;
      fprintf(stderr, "  %s: <grad, r> = %.6g but the finite difference is %.6g (tolerance %.2g)\n", p->name, an, fd, tol);
    }
    free(w0);
    free(r);
  }
  printf("%s: %d parameters, %d tensors checked, %d outside tolerance (loss %.5f)\n", path, adamw, checked, failed,
         loss0);
  if (adamw != ps->n) {
    fprintf(stderr, "%s: %d adamw updates for %d parameters\n", path, adamw, ps->n);
    failed++;
  }
  for (int i = 0; i < ps->n; i++) free(saved[i]);
  free(saved);
  cpu_exec_free(sx);
  cpu_exec_free(fx);
  rt_params_free(ps);
  ir_graph_free(fwd);
  ir_graph_free(step);
  free(tok);
  free(lab);
  return failed;
}

int main(void) {
  /* small sizes so that finite differences over every tensor stay fast */
  const moec_set tiny[] = {{"hidden", "32"}, {"ffn", "48"}, {"seq", "16"}, {"batch", "2"}, {"heads", "4"},
                           {"kv_heads", "2"}, {"precision", "fp32"}};
  const moec_set odd[] = {{"hidden", "24"}, {"ffn", "40"}, {"seq", "12"}, {"batch", "2"}, {"heads", "6"},
                          {"kv_heads", "2"}, {"experts", "6"}, {"top_k", "3"}, {"precision", "fp32"}};
  int failed = check_model("models/tiny.moe", tiny, 7) + check_model("models/tiny.moe", odd, 9);
  if (failed) {
    fprintf(stderr, "test_model_grad: %d failures\n", failed);
    return 1;
  }
  printf("test_model_grad: whole-model gradients match finite differences\n");
  return 0;
}
