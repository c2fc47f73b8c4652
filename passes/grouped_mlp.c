/* grouped_mlp.c -- the grouped-mlp pass: an expert MLP over expert-sorted tokens becomes one
 * fused op.
 *
 * Pattern (what group-linear makes of `linear(silu(linear(h)) * linear(h))`):
 *   gu   = grouped_linear(xs, w_gu, counts)            : [S, 2F]  (gate | up, no bias)
 *   g    = slice_cols(gu) {start = 0, width = F}
 *   u    = slice_cols(gu) {start = F, width = F}
 *   a    = mul(silu(g), u)                             (either operand order)
 *   y    = grouped_linear(a, w_down, counts)           : [S, H]   (same counts, no bias)
 *   out  = expert_unpermute(y, perm, w)                : [T, H]   (the combine, with weights)
 * Rewrite:
 *   p    = expert_probs(w, perm)                       : f32[S, 1]
 *   mlp  = grouped_mlp(xs, w_gu, w_down, counts, p)    : [S, H + 2F] = y' | gate_up
 *   out  = expert_unpermute(slice_cols(mlp, 0, H), perm)          (no weights)
 * with y' = (p * silu(g) * u) . w_down[e]. The routing probability moves from the combine into
 * the MLP; that is legal only because the down projection has no bias: s * (a.W) = (s*a).W,
 * while s * (a.W + b) != (s*a).W + b. The pass checks it and refuses otherwise.
 *
 * Every intermediate must have no other use, both GEMMs must read the same counts, and gate
 * must be the first half of gate_up (when it is the second and the stacked weight has no other
 * use, the stack is rebuilt with the halves swapped). A block that does not match keeps its ops
 * and the unpermute carries a note saying why.
 *
 * What the backward keeps: xs (for the gate_up weight gradient), gate_up (SwiGLU and the
 * scaled activation are recomputed from it) and p; the grouped_mlp op says so (saved=...).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "rewrite.h"

typedef struct {
  int unperm, down, mul, silu, gate, up, gu;
  int w_gu, swap; /* swap: rebuild w_gu (a stack) with gate first */
  int64_t F, H;
  int ok;
  char why[320];
} mlp_match;

__attribute__((format(printf, 2, 3))) static int refuse(mlp_match *m, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->why, sizeof m->why, fmt, ap);
  va_end(ap);
  m->ok = 0;
  return 0;
}

static int single_use(const ir_uses *u, int v) { return !u->out[v] && uses_count(u, v) == 1; }

static int match(const ir_graph *g, const ir_uses *u, int unperm, mlp_match *m) {
  memset(m, 0, sizeof *m);
  m->ok = 1;
  m->unperm = unperm;
#define N(id) (&g->nodes[id])
  const ir_node *un = N(unperm);
  if (un->n_in != 3) return refuse(m, "the unpermute applies no routing weights");
  m->down = un->in[0];
  const ir_node *d = N(m->down);
  if (d->op != OP_GROUPED_LINEAR) return refuse(m, "the expert output %%%d is a %s, not a grouped down projection", m->down, ir_ops[d->op].name);
  if (d->n_in == 4)
    return refuse(m, "the down projection %%%d has a bias, so the routing probability cannot move into the MLP "
                     "(s*(a.W + b) != (s*a).W + b)", m->down);
  if (!single_use(u, m->down)) return refuse(m, "the down projection %%%d has another use", m->down);
  m->mul = d->in[0];
  const ir_node *mu = N(m->mul);
  if (mu->op != OP_MUL) return refuse(m, "the down projection reads a %s, not silu(gate) * up", ir_ops[mu->op].name);
  if (!single_use(u, m->mul)) return refuse(m, "%%%d (silu(gate) * up) has another use", m->mul);
  int s = N(mu->in[0])->op == OP_SILU ? 0 : N(mu->in[1])->op == OP_SILU ? 1 : -1;
  if (s < 0) return refuse(m, "%%%d is not silu(gate) * up", m->mul);
  m->silu = mu->in[s];
  m->up = mu->in[1 - s];
  m->gate = N(m->silu)->in[0];
  if (!single_use(u, m->silu)) return refuse(m, "silu %%%d has another use", m->silu);
  const ir_node *ga = N(m->gate), *up = N(m->up);
  if (ga->op != OP_SLICE_COLS || up->op != OP_SLICE_COLS || ga->in[0] != up->in[0])
    return refuse(m, "gate %%%d and up %%%d are not the two halves of one grouped gate_up projection", m->gate, m->up);
  if (!single_use(u, m->gate) || !single_use(u, m->up)) return refuse(m, "gate or up has another use");
  m->gu = ga->in[0];
  const ir_node *gu = N(m->gu);
  if (gu->op != OP_GROUPED_LINEAR) return refuse(m, "gate_up %%%d is not a grouped_linear", m->gu);
  if (gu->n_in == 4) return refuse(m, "the gate_up projection %%%d has a bias (grouped_mlp has none)", m->gu);
  if (uses_count(u, m->gu) != 2 || u->out[m->gu]) return refuse(m, "gate_up %%%d has another use", m->gu);
  if (gu->in[2] != d->in[2]) return refuse(m, "gate_up and down read different expert counts");
  m->F = ga->type.dims[1];
  m->H = N(gu->in[0])->type.dims[1];
  int64_t gs = ir_get_int(ga, "start", -1), us = ir_get_int(up, "start", -1);
  if (up->type.dims[1] != m->F || gu->type.dims[1] != 2 * m->F || d->type.dims[1] != m->H)
    return refuse(m, "the shapes are not [S,H] -> [S,2F] -> [S,F] -> [S,H]");
  ir_dtype dt = gu->type.dtype;
  if (N(gu->in[0])->type.dtype != dt || mu->type.dtype != dt || d->type.dtype != dt)
    return refuse(m, "the MLP changes dtype inside (a cast between its ops)");
  m->w_gu = gu->in[1];
  if (gs == 0 && us == m->F) return 1;
  if (gs == m->F && us == 0) {
    const ir_node *w = N(m->w_gu);
    int64_t E = ir_get_int(w, "experts", 0);
    if (w->op == OP_STACK && E > 0 && w->n_in == 2 * E && single_use(u, m->w_gu)) {
      m->swap = 1;
      return 1;
    }
    return refuse(m, "gate is the second half of gate_up and its weight cannot be restacked");
  }
  return refuse(m, "gate and up do not split gate_up in halves");
#undef N
}

static void emit_mlp(rw_ctx *r, const mlp_match *m) {
  const ir_graph *g = r->old;
  const ir_node *un = &g->nodes[m->unperm], *gu = &g->nodes[m->gu], *d = &g->nodes[m->down];
  int w_gu = r->map[m->w_gu];
  if (m->swap) {
    const ir_node *w = &g->nodes[m->w_gu];
    int E = (int)ir_get_int(w, "experts", 0), in[256];
    int *ops = w->n_in <= 256 ? in : malloc((size_t)w->n_in * sizeof *ops);
    if (!ops) {
      r->failed = 1;
      return;
    }
    for (int e = 0; e < E; e++) {
      ops[e] = r->map[w->in[E + e]];
      ops[E + e] = r->map[w->in[e]];
    }
    w_gu = rw_emit(r, OP_STACK, ops, 2 * E, w->attrs, w->n_attrs, w->loc);
    if (ops != in) free(ops);
  }
  int perm = r->map[un->in[1]];
  int probs = rw_emit(r, OP_EXPERT_PROBS, (int[]){r->map[un->in[2]], perm}, 2, NULL, 0, un->loc);
  char absorbed[400];
  const int parts[] = {m->gu, m->gate, m->up, m->silu, m->mul, m->down};
  size_t k = 0;
  for (int i = 0; i < 6 && k < sizeof absorbed; i++)
    k += (size_t)snprintf(absorbed + k, sizeof absorbed - k, "%s%s@%d:%d", i ? "," : "", ir_ops[g->nodes[parts[i]].op].name,
                          g->nodes[parts[i]].loc.line, g->nodes[parts[i]].loc.col);
  if (k < sizeof absorbed) snprintf(absorbed + k, sizeof absorbed - k, ",routing-weight multiply of expert_unpermute@%d:%d", un->loc.line, un->loc.col);
  ir_attr a[] = {ir_attr_int("ffn", m->F), ir_attr_str("saved", "xs,gate_up,probs"), ir_attr_str("absorbed", absorbed)};
  int mlp = rw_emit(r, OP_GROUPED_MLP, (int[]){r->map[gu->in[0]], w_gu, r->map[d->in[1]], r->map[d->in[2]], probs}, 5, a, 3,
                    d->loc);
  if (mlp >= 0)
    ir_set_note(r->g, mlp,
                "grouped-mlp: gate_up GEMM, SwiGLU, x routing prob (moved out of the combine: down has no bias, "
                "s*(a.W) equals (s*a).W) and down GEMM in one op; result y | gate_up; the backward keeps xs, gate_up and "
                "probs and recomputes SwiGLU from gate_up");
  ir_attr sa[] = {ir_attr_int("start", 0), ir_attr_int("width", m->H)};
  int y = rw_emit(r, OP_SLICE_COLS, &mlp, 1, sa, 2, d->loc);
  ir_attr ka = ir_attr_int("top_k", ir_get_int(un, "top_k", 1));
  r->map[m->unperm] = rw_emit(r, OP_EXPERT_UNPERMUTE, (int[]){y, perm}, 2, &ka, 1, un->loc);
}

int pass_grouped_mlp(ir_graph **gp, FILE *err) {
  ir_graph *g = *gp;
  ir_uses u;
  mlp_match *ms = calloc((size_t)g->n_nodes + 1, sizeof *ms); /* (n_nodes) indexed by the unpermute */
  char *skip = calloc((size_t)g->n_nodes + 1, 1);
  if (!ms || !skip || uses_build(g, &u)) {
    free(ms);
    free(skip);
    fprintf(err, "moec: error: out of memory in pass grouped-mlp\n");
    return -1;
  }
  for (int id = 0; id < g->n_nodes; id++) {
    if (g->nodes[id].op != OP_EXPERT_UNPERMUTE) continue;
    mlp_match *m = &ms[id];
    if (!match(g, &u, id, m)) continue;
    const int parts[] = {m->gu, m->gate, m->up, m->silu, m->mul, m->down};
    for (int i = 0; i < 6; i++) skip[parts[i]] = 1;
    if (m->swap) skip[m->w_gu] = 1;
  }
  uses_free(&u);
  rw_ctx r;
  int rc = -1;
  if (rw_begin(&r, g, "grouped-mlp", err) == 0) {
    for (int id = 0; id < g->n_nodes && !r.failed; id++) {
      if (skip[id]) continue;
      if (g->nodes[id].op != OP_EXPERT_UNPERMUTE) {
        rw_copy(&r, id);
      } else if (ms[id].ok) {
        emit_mlp(&r, &ms[id]);
      } else {
        int v = rw_copy(&r, id);
        char note[400];
        snprintf(note, sizeof note, "grouped-mlp: left alone: %s", ms[id].why);
        if (v >= 0) ir_set_note(r.g, v, note);
      }
    }
    rc = rw_finish(&r, gp);
  }
  free(ms);
  free(skip);
  return rc;
}
