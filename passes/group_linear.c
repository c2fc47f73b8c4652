/* group_linear.c -- the group-linear pass: the E per-expert copies of an experts block become
 * one computation over expert-sorted tokens, with one grouped GEMM per linear of the body.
 *
 * Pattern (what lowering makes of `x = x + experts(h, r) { ... }`):
 *   xe_e = dispatch(x, idx) {expert = e}                          for e < E
 *   body_e: the ops from xe_e to y_e, per expert, with its own weights
 *   out  = combine(idx, w, y_0 .. y_{E-1}) {experts = E}
 * Rewrite (S = T*k sorted rows; the weights keep their per-expert params, so checkpoints and
 * Hugging Face names are unchanged):
 *   counts = expert_counts(idx)               : i32[E]   rows of each expert, on the device
 *   perm   = expert_sort(idx)                 : i32[S]   sorted row -> (t, j) pair
 *   xs     = expert_permute(x, perm)          : [S, H]
 *   body_0 over xs, where each linear(a, w_0) becomes
 *     grouped_linear(a, stack(w_0 .. w_{E-1}), counts)           [E, in, out] weights
 *   and sibling linears that read the same input (gate and up) become one grouped_linear over
 *   stack(gate_0 .. gate_{E-1}, up_0 .. up_{E-1}) followed by slice_cols per sibling.
 *   out    = expert_unpermute(y, perm, w)     : [T, H]   the combine, weights included
 *
 * Legality. The bodies must be the same ops with the same attributes and shapes (but for each
 * expert's run-time row count), built from row-wise ops only (linear, silu, mul, add, cast,
 * slice_cols); every linear has no bias and reads its own expert's parameter (`expert = e`),
 * used nowhere else; nothing outside the block reads a value of a body. Otherwise the block
 * is left as it is and the combine carries a note saying why.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "rewrite.h"

typedef struct {
  int combine, E, x, idx, rw;
  int64_t k;
  int *disp;  /* (E) dispatch node of each expert */
  int *body;  /* (E * nb) body[e*nb + i]: the i-th op of expert e's body, in graph order */
  int nb;
  int ok;
  char why[320];
} block;

typedef struct {
  const ir_graph *g;
  ir_uses u;
  int *anc, *desc; /* (n_nodes) stamps: ancestor of the expert output / descendant of its dispatch */
  int *pos;        /* (n_nodes) index of a node in its expert's body, -1 */
  int stamp;
} finder;

#define NODE(id) (&f->g->nodes[id])

__attribute__((format(printf, 2, 3))) static int refuse(block *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->why, sizeof b->why, fmt, ap);
  va_end(ap);
  b->ok = 0;
  return 0;
}

static int row_wise(ir_op op) {
  return op == OP_LINEAR || op == OP_SILU || op == OP_MUL || op == OP_ADD || op == OP_CAST || op == OP_SLICE_COLS;
}

/* The parameter behind a linear's weight operand (through a cast), or -1. */
static int weight_param(const ir_graph *g, int w) {
  if (g->nodes[w].op == OP_CAST) w = g->nodes[w].in[0];
  return g->nodes[w].op == OP_PARAM ? w : -1;
}

/* Types equal except that rows_a in a stands for rows_b in b. */
static int types_match(const ir_type *a, const ir_type *b, int64_t rows_a, int64_t rows_b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return 0;
  for (int d = 0; d < a->rank; d++)
    if (a->dims[d] != b->dims[d] && !(a->dims[d] == rows_a && b->dims[d] == rows_b)) return 0;
  return 1;
}

/* Finds expert e's dispatch and body; 0 with b->why when the block cannot be grouped. */
static int find_body(finder *f, block *b, int e, int **body, int *nb) {
  const ir_graph *g = f->g;
  int y = NODE(b->combine)->in[2 + e];
  int anc = ++f->stamp;
  f->anc[y] = anc;
  int disp = -1;
  for (int id = y; id >= 0; id--) {
    if (f->anc[id] != anc) continue;
    const ir_node *n = NODE(id);
    if (n->op == OP_DISPATCH && n->in[1] == b->idx && ir_get_int(n, "expert", -1) == e) {
      if (disp >= 0) return refuse(b, "expert %d's output reads two dispatches (%%%d, %%%d)", e, disp, id);
      disp = id;
      continue; /* the body starts here */
    }
    for (int j = 0; j < n->n_in; j++) f->anc[n->in[j]] = anc;
  }
  if (disp < 0) return refuse(b, "expert %d's output %%%d does not come from a dispatch of the router's indices %%%d", e, y, b->idx);
  b->disp[e] = disp;
  int desc = ++f->stamp;
  f->desc[disp] = desc;
  *nb = 0;
  for (int id = disp + 1; id < g->n_nodes; id++) {
    if (id == b->combine) continue;
    const ir_node *n = NODE(id);
    int d = 0;
    for (int j = 0; j < n->n_in && !d; j++) d = f->desc[n->in[j]] == desc;
    if (!d) continue;
    f->desc[id] = desc;
    if (f->anc[id] != anc)
      return refuse(b, "%%%d (%s) reads expert %d's rows outside the experts block (another use in between)", id,
                    ir_ops[n->op].name, e);
    (*body)[(*nb)++] = id;
  }
  if (y != disp && f->desc[y] != desc) return refuse(b, "expert %d's output %%%d does not depend on its dispatch", e, y);
  if (f->u.out[y] || uses_count(&f->u, y) != 1)
    return refuse(b, "expert %d's output %%%d is used besides the combine (another use in between)", e, y);
  return 1;
}

/* Checks a linear's weight operand w of expert e: its own parameter, used once, no bias. */
static int check_weight(finder *f, block *b, int e, int lin, const ir_type *w0) {
  const ir_node *n = NODE(lin);
  if (n->n_in == 3) return refuse(b, "linear %%%d of expert %d has a bias", lin, e);
  int w = n->in[1], p = weight_param(f->g, w);
  if (p < 0) return refuse(b, "the weight %%%d of linear %%%d is computed, not a parameter", w, lin);
  const char *name = ir_get_str(NODE(p), "name", "?");
  if (ir_get_int(NODE(p), "expert", -1) != e)
    return refuse(b, "linear %%%d of expert %d reads %s, which is not expert %d's own parameter (shared weights)", lin, e,
                  name, e);
  if (uses_count(&f->u, w) != 1 || (w != p && uses_count(&f->u, p) != 1))
    return refuse(b, "the weight %s of linear %%%d is used elsewhere too (shared weights)", name, lin);
  if (!ir_type_equal(&f->g->nodes[w].type, w0))
    return refuse(b, "linear %%%d of expert %d has a weight of another shape or type than expert 0's (different shapes)",
                  lin, e);
  return 1;
}

/* a is an op of expert e's body. */
static int in_body(const finder *f, const block *b, int e, int a) {
  return f->pos[a] >= 0 && f->pos[a] < b->nb && b->body[e * b->nb + f->pos[a]] == a;
}

/* Decides whether the block ending at `combine` can be grouped; fills b. */
static void analyze(finder *f, block *b, int combine) {
  const ir_graph *g = f->g;
  const ir_node *c = NODE(combine);
  b->combine = combine;
  b->E = c->n_in - 2;
  b->idx = c->in[0];
  b->rw = c->in[1];
  b->k = g->nodes[b->idx].type.dims[1];
  b->ok = 1;
  b->disp = malloc((size_t)b->E * sizeof *b->disp);
  int *tmp = malloc((size_t)g->n_nodes * sizeof *tmp);
  if (!b->disp || !tmp) {
    free(tmp);
    refuse(b, "out of memory");
    return;
  }
  for (int e = 0; e < b->E && b->ok; e++) {
    int nb = 0;
    if (!find_body(f, b, e, &tmp, &nb)) break;
    if (e == 0) {
      b->nb = nb;
      b->body = malloc(((size_t)b->E * (size_t)nb + 1) * sizeof *b->body);
      if (!b->body) {
        refuse(b, "out of memory");
        break;
      }
      b->x = NODE(b->disp[0])->in[0];
    } else if (nb != b->nb) {
      refuse(b, "expert %d's body has %d ops, expert 0's %d (different bodies)", e, nb, b->nb);
      break;
    } else if (NODE(b->disp[e])->in[0] != b->x) {
      refuse(b, "expert %d dispatches %%%d, expert 0 %%%d", e, NODE(b->disp[e])->in[0], b->x);
      break;
    }
    memcpy(b->body + (size_t)e * (size_t)nb, tmp, (size_t)nb * sizeof *tmp);
  }
  free(tmp);
  if (!b->ok) return;
  for (int e = 0; e < b->E; e++)
    for (int i = 0; i < b->nb; i++) f->pos[b->body[e * b->nb + i]] = i;
  int64_t rows0 = NODE(b->disp[0])->type.dims[0];
  for (int i = 0; i < b->nb && b->ok; i++) {
    const ir_node *n0 = NODE(b->body[i]);
    if (!row_wise(n0->op)) {
      refuse(b, "%%%d (%s) in the expert body has no grouped form", b->body[i], ir_ops[n0->op].name);
      break;
    }
    for (int e = 0; e < b->E && b->ok; e++) {
      int id = b->body[e * b->nb + i];
      const ir_node *n = NODE(id);
      int64_t rows = NODE(b->disp[e])->type.dims[0];
      if (n->op != n0->op || n->n_in != n0->n_in || !attrs_equal(n, n0) || !types_match(&n->type, &n0->type, rows, rows0)) {
        refuse(b, "expert %d's %%%d differs from expert 0's %%%d (different shapes or ops)", e, id, b->body[i]);
        break;
      }
      for (int j = 0; j < n->n_in && b->ok; j++) {
        int a = n->in[j], a0 = n0->in[j];
        if (a == b->disp[e]) {
          if (a0 != b->disp[0]) refuse(b, "expert %d's %%%d reads its rows where expert 0's does not", e, id);
        } else if (in_body(f, b, e, a)) {
          if (!in_body(f, b, 0, a0) || f->pos[a0] != f->pos[a]) refuse(b, "expert %d's %%%d is wired differently", e, id);
        } else if (n->op == OP_LINEAR && j == 1) {
          check_weight(f, b, e, id, &g->nodes[n0->in[1]].type);
        } else {
          refuse(b, "%%%d of expert %d reads %%%d from outside the block (only weights may come from outside)", id, e, a);
        }
      }
    }
  }
}

static void block_free(block *b) {
  free(b->disp);
  free(b->body);
}

/* ---- the rewrite ---- */

/* New id of an operand of an expert-0 body op. */
static int operand(rw_ctx *r, const block *b, const int *nmap, const finder *f, int a) {
  if (a == b->disp[0]) return nmap[b->nb];
  if (in_body(f, b, 0, a)) return nmap[f->pos[a]];
  return r->map[a];
}

static void emit_block(rw_ctx *r, const finder *f, const block *b) {
  const ir_graph *g = f->g;
  const ir_node *c = NODE(b->combine);
  int idx = r->map[b->idx], E = b->E, nb = b->nb;
  ir_attr ea = ir_attr_int("experts", E), ka = ir_attr_int("top_k", b->k);
  int counts = rw_emit(r, OP_EXPERT_COUNTS, &idx, 1, &ea, 1, c->loc);
  int perm = rw_emit(r, OP_EXPERT_SORT, &idx, 1, &ea, 1, c->loc);
  int *nmap = malloc(((size_t)nb + 1) * sizeof *nmap); /* new id of each body-0 op; [nb]: xs */
  int *parts = malloc(((size_t)nb + 1) * sizeof *parts);
  int *w_in = malloc(((size_t)nb * (size_t)E + 1) * sizeof *w_in);
  if (!nmap || !parts || !w_in) {
    fprintf(r->err, "moec: error: out of memory in pass %s\n", r->pass);
    r->failed = 1;
    goto done;
  }
  for (int i = 0; i < nb; i++) nmap[i] = -1;
  nmap[nb] = rw_emit(r, OP_EXPERT_PERMUTE, (int[]){r->map[b->x], perm}, 2, &ka, 1, NODE(b->disp[0])->loc);
  for (int i = 0; i < nb && !r->failed; i++) {
    if (nmap[i] >= 0) continue; /* a sibling merged into an earlier grouped_linear */
    const ir_node *n = NODE(b->body[i]);
    int in[3];
    for (int j = 0; j < n->n_in && j < 3; j++) in[j] = operand(r, b, nmap, f, n->in[j]);
    if (n->op == OP_LINEAR) {
      /* this linear and its later siblings reading the same input: one grouped GEMM */
      int np = 0;
      for (int s = i; s < nb; s++)
        if (NODE(b->body[s])->op == OP_LINEAR && NODE(b->body[s])->in[0] == n->in[0] &&
            g->nodes[NODE(b->body[s])->in[1]].type.dtype == g->nodes[n->in[1]].type.dtype)
          parts[np++] = s;
      for (int p = 0; p < np; p++)
        for (int e = 0; e < E; e++) w_in[p * E + e] = r->map[NODE(b->body[e * nb + parts[p]])->in[1]];
      int w = rw_emit(r, OP_STACK, w_in, np * E, &ea, 1, n->loc);
      int gl = rw_emit(r, OP_GROUPED_LINEAR, (int[]){in[0], w, counts}, 3, NULL, 0, n->loc);
      char note[600], pat[300];
      size_t k = (size_t)snprintf(note, sizeof note, "group-linear: %d per-expert linears -> one grouped GEMM over %d experts; weights",
                                  np * E, E);
      for (int p = 0; p < np && k < sizeof note; p++) {
        const ir_node *p0 = NODE(weight_param(g, NODE(b->body[parts[p]])->in[1]));
        const ir_node *p1 = NODE(weight_param(g, NODE(b->body[(E > 1) * nb + parts[p]])->in[1]));
        k += (size_t)snprintf(note + k, sizeof note - k, "%s %s", p ? "," : "",
                              name_pattern(ir_get_str(p0, "name", "?"), ir_get_str(p1, "name", "?"), pat, sizeof pat));
      }
      if (np > 1 && k < sizeof note) snprintf(note + k, sizeof note - k, " (%d siblings reading one input, merged)", np);
      if (gl >= 0) ir_set_note(r->g, gl, note);
      if (np == 1) {
        nmap[i] = gl;
      } else {
        int64_t start = 0;
        for (int p = 0; p < np; p++) {
          int64_t width = NODE(b->body[parts[p]])->type.dims[1];
          ir_attr sa[] = {ir_attr_int("start", start), ir_attr_int("width", width)};
          nmap[parts[p]] = rw_emit(r, OP_SLICE_COLS, &gl, 1, sa, 2, NODE(b->body[parts[p]])->loc);
          start += width;
        }
      }
    } else if (n->op == OP_CAST) {
      ir_type t = r->g->nodes[in[0]].type;
      t.dtype = n->type.dtype;
      nmap[i] = rw_emit_typed(r, OP_CAST, in, 1, n->attrs, n->n_attrs, t, n->loc);
    } else {
      nmap[i] = rw_emit(r, n->op, in, n->n_in, n->attrs, n->n_attrs, n->loc);
    }
  }
  int y = operand(r, b, nmap, f, c->in[2]);
  r->map[b->combine] = rw_emit(r, OP_EXPERT_UNPERMUTE, (int[]){y, perm, r->map[b->rw]}, 3, &ka, 1, c->loc);
done:
  free(nmap);
  free(parts);
  free(w_in);
}

int pass_group_linear(ir_graph **gp, FILE *err) {
  ir_graph *g = *gp;
  finder f;
  memset(&f, 0, sizeof f);
  f.g = g;
  size_t n = (size_t)g->n_nodes + 1;
  f.anc = calloc(n, sizeof *f.anc);
  f.desc = calloc(n, sizeof *f.desc);
  f.pos = malloc(n * sizeof *f.pos);
  char *skip = calloc(n, 1);
  int n_blocks = 0;
  for (int id = 0; id < g->n_nodes; id++) n_blocks += g->nodes[id].op == OP_COMBINE;
  block *blocks = calloc((size_t)n_blocks + 1, sizeof *blocks);
  int rc = -1;
  if (!f.anc || !f.desc || !f.pos || !skip || !blocks || uses_build(g, &f.u)) {
    fprintf(err, "moec: error: out of memory in pass group-linear\n");
    goto done;
  }
  for (size_t i = 0; i < n; i++) f.pos[i] = -1;
  int nbk = 0;
  for (int id = 0; id < g->n_nodes; id++) {
    if (g->nodes[id].op != OP_COMBINE) continue;
    block *b = &blocks[nbk++];
    analyze(&f, b, id);
    if (!b->ok) continue;
    skip[id] = 1;
    for (int e = 0; e < b->E; e++) {
      skip[b->disp[e]] = 1;
      for (int i = 0; i < b->nb; i++) skip[b->body[e * b->nb + i]] = 1;
    }
  }
  rw_ctx r;
  if (rw_begin(&r, g, "group-linear", err)) goto done;
  int bi = 0;
  for (int id = 0; id < g->n_nodes && !r.failed; id++) {
    if (g->nodes[id].op == OP_COMBINE) {
      block *b = &blocks[bi++];
      if (b->ok) {
        emit_block(&r, &f, b);
      } else {
        int v = rw_copy(&r, id);
        char note[400];
        snprintf(note, sizeof note, "group-linear: left alone: %s", b->why);
        if (v >= 0) ir_set_note(r.g, v, note);
      }
    } else if (!skip[id]) {
      rw_copy(&r, id);
    }
  }
  rc = rw_finish(&r, gp);
done:
  for (int i = 0; i < n_blocks; i++) block_free(&blocks[i]);
  free(blocks);
  free(f.anc);
  free(f.desc);
  free(f.pos);
  free(skip);
  uses_free(&f.u);
  return rc;
}
