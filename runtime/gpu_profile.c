/* gpu_profile.c -- per-op GPU time of the training step; see gpu_profile.h. */
#include "gpu_profile.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { KNAMES = 512 };

struct gpu_profile {
  gpu_ctx *g;
  const ir_graph *graph;
  void **ev;          /* (n_nodes + 1) events, one before each op and one at the end */
  unsigned char *hit; /* (n_nodes + 1) marked this step */
  double *node_ms;    /* (n_nodes) GPU time, summed over counted steps */
  double *host_t;     /* (n_nodes + 1) host clock at each mark this step, ms */
  double *host_ms;    /* (n_nodes) host time spent submitting the op, summed */
  /* MOEC_PROFILE=host: no events (the GPU's timeline untouched); the host's time per op split
   * into queueing work, waiting for the GPU, and moec's own work (gpu_host_stats) */
  int host_only;
  gpu_host_stats *hs_t; /* (n_nodes + 1) at each mark this step */
  double *issue_ms, *wait_ms; /* (n_nodes) summed */
  int steps, skip, seen;
  /* MOEC_PROFILE=kernels: an event before each launch or library call as well (gpu_work_hook),
   * each interval charged to the work that starts it; an op's mark starts a "(gap)" interval,
   * the GPU idle while the host issues */
  int kernels;
  void **kev;              /* (kcap) events, reused from step to step */
  int *krec;               /* (kcap) this step's records: name index */
  int kn, kcap;
  char *names[KNAMES];     /* interned work names */
  double name_ms[KNAMES];  /* summed over counted steps */
  long name_calls[KNAMES];
  int n_names;
};

/* Index of name in the table, added when new; -1 when the table is full. */
static int intern(gpu_profile *p, const char *name) {
  for (int i = 0; i < p->n_names; i++)
    if (strcmp(p->names[i], name) == 0) return i;
  if (p->n_names == KNAMES || !(p->names[p->n_names] = strdup(name))) return -1;
  return p->n_names++;
}

/* Records an event now, charged to name (the kernel about to be launched). */
static void kernel_mark(gpu_profile *p, const char *name) {
  if (p->kn == p->kcap) {
    int cap = p->kcap ? 2 * p->kcap : 4096;
    void **ev = realloc(p->kev, (size_t)cap * sizeof *ev);
    if (ev) p->kev = ev;
    int *rec = realloc(p->krec, (size_t)cap * sizeof *rec);
    if (rec) p->krec = rec;
    if (!ev || !rec) return;
    for (int i = p->kcap; i < cap; i++) p->kev[i] = NULL;
    p->kcap = cap;
  }
  if (!p->kev[p->kn] && gpu_event_new(p->g, &p->kev[p->kn]) != 0) return;
  const int id = intern(p, name);
  if (id < 0 || gpu_event_record(p->g, p->kev[p->kn]) != 0) return;
  p->krec[p->kn++] = id;
}

static void on_work(void *ud, const char *name) { kernel_mark(ud, name); }

gpu_profile *gpu_profile_from_env(gpu_ctx *g, const ir_graph *graph) {
  const char *e = getenv("MOEC_PROFILE");
  if (!e || !*e || strcmp(e, "0") == 0) return NULL;
  gpu_profile *p = calloc(1, sizeof *p);
  int n = graph->n_nodes + 1;
  if (!p || !(p->ev = calloc((size_t)n, sizeof *p->ev)) || !(p->hit = calloc((size_t)n, 1)) ||
      !(p->node_ms = calloc((size_t)n, sizeof *p->node_ms)) || !(p->host_t = calloc((size_t)n, sizeof *p->host_t)) ||
      !(p->host_ms = calloc((size_t)n, sizeof *p->host_ms)) || !(p->hs_t = calloc((size_t)n, sizeof *p->hs_t)) ||
      !(p->issue_ms = calloc((size_t)n, sizeof *p->issue_ms)) || !(p->wait_ms = calloc((size_t)n, sizeof *p->wait_ms))) {
    gpu_profile_free(p);
    return NULL;
  }
  p->g = g;
  p->graph = graph;
  p->skip = 2;
  p->host_only = strcmp(e, "host") == 0;
  for (int i = 0; i < n && !p->host_only; i++)
    if (gpu_event_new(g, &p->ev[i]) != 0) {
      gpu_profile_free(p);
      return NULL;
    }
  p->kernels = strcmp(e, "kernels") == 0;
  return p;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void gpu_profile_mark(gpu_profile *p, int id) {
  if (!p) return;
  p->host_t[id] = now_ms();
  p->hs_t[id] = gpu_host_stats_of(p->g);
  if (p->host_only) {
    p->hit[id] = 1;
    return;
  }
  if (gpu_event_record(p->g, p->ev[id]) == 0) p->hit[id] = 1;
  if (!p->kernels) return;
  /* the hook is this step's alone: a second executor (validation) keeps its own profile */
  kernel_mark(p, id == p->graph->n_nodes ? "(end of step)" : "(gap: the GPU waits for the host)");
  gpu_set_work_hook(p->g, id == p->graph->n_nodes ? NULL : on_work, id == p->graph->n_nodes ? NULL : p);
}

void gpu_profile_step_done(gpu_profile *p) {
  if (!p) return;
  int n = p->graph->n_nodes;
  if (++p->seen > p->skip) {
    int prev = -1;
    for (int i = 0; i <= n; i++) {
      if (!p->hit[i]) continue;
      float ms = 0;
      if (prev >= 0 && !p->host_only && gpu_event_elapsed(p->g, p->ev[prev], p->ev[i], &ms) == 0) p->node_ms[prev] += ms;
      if (prev >= 0) {
        p->host_ms[prev] += p->host_t[i] - p->host_t[prev];
        p->issue_ms[prev] += 1e3 * (p->hs_t[i].issue_s - p->hs_t[prev].issue_s);
        p->wait_ms[prev] += 1e3 * (p->hs_t[i].wait_s - p->hs_t[prev].wait_s);
      }
      prev = i;
    }
    for (int i = 0; i + 1 < p->kn; i++) {
      float ms = 0;
      if (gpu_event_elapsed(p->g, p->kev[i], p->kev[i + 1], &ms) == 0) p->name_ms[p->krec[i]] += ms;
      p->name_calls[p->krec[i]]++;
    }
    p->steps++;
  }
  p->kn = 0;
  memset(p->hit, 0, (size_t)n + 1);
}

void gpu_profile_step_abort(gpu_profile *p) {
  if (!p) return;
  if (p->kernels) gpu_set_work_hook(p->g, NULL, NULL);
  p->kn = 0;
  memset(p->hit, 0, (size_t)p->graph->n_nodes + 1);
}

static const double *sort_key;
static int by_time_desc(const void *a, const void *b) {
  double x = sort_key[*(const int *)a], y = sort_key[*(const int *)b];
  return (x < y) - (x > y);
}

/* MOEC_PROFILE=host's table: per op kind, the host's time split three ways, by own work. */
static void print_host(const gpu_profile *p, FILE *out) {
  int n = p->graph->n_nodes;
  double host[OP_COUNT] = {0}, issue[OP_COUNT] = {0}, wait[OP_COUNT] = {0}, own[OP_COUNT] = {0}, t[4] = {0};
  int op_n[OP_COUNT] = {0};
  for (int i = 0; i < n; i++) {
    int o = p->graph->nodes[i].op;
    host[o] += p->host_ms[i] / p->steps, issue[o] += p->issue_ms[i] / p->steps, wait[o] += p->wait_ms[i] / p->steps;
    op_n[o]++;
  }
  for (int o = 0; o < OP_COUNT; o++) {
    own[o] = host[o] - issue[o] - wait[o];
    t[0] += host[o], t[1] += own[o], t[2] += issue[o], t[3] += wait[o];
  }
  int order[OP_COUNT];
  for (int i = 0; i < OP_COUNT; i++) order[i] = i;
  sort_key = own;
  qsort(order, OP_COUNT, sizeof order[0], by_time_desc);
  fprintf(out, "host profile: %.2f ms per step issuing ops: %.2f moec's own work, %.2f queueing GPU work, %.2f waiting "
               "for the GPU, mean of %d steps (MOEC_PROFILE=host)\n", t[0], t[1], t[2], t[3], p->steps);
  fprintf(out, "  %-22s %10s %10s %10s %10s %6s\n", "op", "host ms", "own", "queueing", "waiting", "count");
  for (int k = 0; k < OP_COUNT && host[order[k]] > 0; k++)
    fprintf(out, "  %-22s %10.3f %10.3f %10.3f %10.3f %6d\n", ir_ops[order[k]].name, host[order[k]], own[order[k]],
            issue[order[k]], wait[order[k]], op_n[order[k]]);
}

void gpu_profile_print(const gpu_profile *p, FILE *out) {
  if (!p || p->steps == 0) return;
  if (p->host_only) {
    print_host(p, out);
    return;
  }
  int n = p->graph->n_nodes;
  double op_ms[OP_COUNT] = {0}, op_host[OP_COUNT] = {0}, total = 0, host = 0;
  int op_n[OP_COUNT] = {0};
  for (int i = 0; i < n; i++) {
    op_ms[p->graph->nodes[i].op] += p->node_ms[i] / p->steps;
    op_host[p->graph->nodes[i].op] += p->host_ms[i] / p->steps;
    op_n[p->graph->nodes[i].op]++;
    total += p->node_ms[i] / p->steps;
    host += p->host_ms[i] / p->steps;
  }
  int order[OP_COUNT];
  for (int i = 0; i < OP_COUNT; i++) order[i] = i;
  sort_key = op_ms;
  qsort(order, OP_COUNT, sizeof order[0], by_time_desc);
  /* host ms: time the host spent issuing the op (launches, cuBLASLt calls, synchronisations);
   * where it approaches the GPU time the GPU waits for the host */
  fprintf(out, "GPU profile: %.2f ms per step on the GPU, %.2f ms issuing on the host, mean of %d steps (MOEC_PROFILE)\n",
          total, host, p->steps);
  fprintf(out, "  %-22s %10s %6s %10s %6s\n", "op", "ms/step", "%", "host ms", "count");
  for (int k = 0; k < OP_COUNT && op_ms[order[k]] > 0; k++)
    fprintf(out, "  %-22s %10.3f %6.1f %10.3f %6d\n", ir_ops[order[k]].name, op_ms[order[k]], 100 * op_ms[order[k]] / total,
            op_host[order[k]], op_n[order[k]]);
  int *nodes = malloc((size_t)n * sizeof *nodes);
  if (!nodes) return;
  for (int i = 0; i < n; i++) nodes[i] = i;
  sort_key = p->node_ms;
  qsort(nodes, (size_t)n, sizeof nodes[0], by_time_desc);
  fprintf(out, "  slowest ops:\n");
  for (int k = 0; k < 16 && k < n; k++) {
    const ir_node *nd = &p->graph->nodes[nodes[k]];
    char ty[96], in0[96];
    ir_type_str(p->graph, &nd->type, ty, sizeof ty);
    ir_type_str(p->graph, nd->n_in ? &p->graph->nodes[nd->in[0]].type : &nd->type, in0, sizeof in0);
    fprintf(out, "  %%%-6d %-20s %9.3f ms  %s <- %s, axis %lld  %s:%d\n", nodes[k], ir_ops[nd->op].name,
            p->node_ms[nodes[k]] / p->steps, ty, in0, (long long)ir_get_int(nd, "axis", -1),
            nd->loc.file ? nd->loc.file : "?", nd->loc.line);
  }
  free(nodes);
  if (!p->kernels) return;
  int order_k[KNAMES];
  for (int i = 0; i < p->n_names; i++) order_k[i] = i;
  sort_key = p->name_ms;
  qsort(order_k, (size_t)p->n_names, sizeof order_k[0], by_time_desc);
  fprintf(out, "  kernels and library calls (MOEC_PROFILE=kernels; each until the next one starts):\n");
  fprintf(out, "  %-48s %10s %6s %8s\n", "kernel", "ms/step", "%", "calls");
  for (int k = 0; k < 48 && k < p->n_names && p->name_calls[order_k[k]] > 0; k++)
    fprintf(out, "  %-48s %10.3f %6.1f %8.0f\n", p->names[order_k[k]], p->name_ms[order_k[k]] / p->steps,
            100 * p->name_ms[order_k[k]] / p->steps / total, (double)p->name_calls[order_k[k]] / p->steps);
}

void gpu_profile_free(gpu_profile *p) {
  if (!p) return;
  if (p->kernels) gpu_set_work_hook(p->g, NULL, NULL); /* a step cut short left it set */
  for (int i = 0; i < p->kcap; i++)
    if (p->kev && p->kev[i]) gpu_event_free(p->g, p->kev[i]);
  free(p->kev);
  free(p->krec);
  for (int i = 0; i < p->n_names; i++) free(p->names[i]);
  if (p->ev)
    for (int i = 0; i <= p->graph->n_nodes; i++) gpu_event_free(p->g, p->ev[i]);
  free(p->ev);
  free(p->hit);
  free(p->node_ms);
  free(p->host_t);
  free(p->hs_t);
  free(p->issue_ms);
  free(p->wait_ms);
  free(p->host_ms);
  free(p);
}
