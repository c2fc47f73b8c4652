/* gpu_exec_update.c -- AdamW beside the next forward (dev_update, gpu_exec_int.h).
 *
 * The update needs the whole gradient's norm (clipping), so it cannot start before the backward
 * ends; but the next step's forward needs layer l's weights only when it reaches layer l. So
 * exec_ADAMW queues the update on a stream of its own, an event after each launch, and the
 * main stream goes on: the step's closing reads (loss, norm) wait only for the backward, and
 * the next forward's first reader of a parameter waits for the event after that parameter's
 * launch (update_wait_inputs). The values are those of the serial order -- the same kernels on
 * the same inputs -- because nothing else writes what the update reads (gradients, norm,
 * moments) or reads what it writes (weights, copies, squares) before those waits:
 *   - the gradients and the norm are pool blocks released while the update may still read
 *     them; their release holds them out of the pool (pool_put_after) until the main stream
 *     has waited for the event after their reader, so the forward's first layers reuse the
 *     gradients of the first layers' parameters and the peak does not grow;
 *   - every other way to the weights (download, fetch, store, upload, the squares check, the
 *     runtime's end, an out-of-memory retry) first settles: the main stream waits for the
 *     whole update.
 * MOEC_ADAMW_OVERLAP=1 turns it on (off by default: overlap_mode says why); =high / =low also
 * give the update's stream the device's greatest or least priority. Off under data or expert
 * parallelism (the collectives have their own stream ordering), when the executor keeps every
 * value (gpu_exec_keep_all: released at the next run's start, past the holds) and under
 * MOEC_PROFILE (its events time one stream). MOEC_ADAMW_DELAY=MiB (tests): the update's stream
 * first writes that many MiB of scratch, a slow update that a missing wait would race. */
#include <stdlib.h>
#include <string.h>

#include "gpu_exec_int.h"

/* Off unless asked for: on an H100 the genos_1b mxfp8 step ran no faster with it (70.8 ms
 * against 70.1; bench/RESULTS.md, 2026-12-06 third session) -- the step keeps every SM busy, and
 * cuBLASLt's FP8 GEMMs leave no room on an SM for the update's blocks -- while it holds the
 * gradients 2.3 GB longer. */
static int overlap_mode(void) {
  const char *e = getenv("MOEC_ADAMW_OVERLAP");
  if (!e) return 0;
  if (strcmp(e, "1") == 0) return 1;
  if (strcmp(e, "high") == 0) return 2;
  if (strcmp(e, "low") == 0) return 3;
  return 0; /* "0", or anything else: off */
}

/* The held blocks whose reader the main stream waited for back in the pool: whatever it queues
 * in them comes after the update's reads. */
static void unhold_waited(gpu_runtime *rt) {
  dev_update *u = &rt->upd;
  int k = 0;
  for (int i = 0; i < u->n_held; i++)
    if (u->held[i].ev < u->waited) gpu_pool_put(rt->pool, u->held[i].p);
    else u->held[k++] = u->held[i];
  u->n_held = k;
}

/* The main stream ordered after ev[e] (and so every launch before it). */
static int wait_for(gpu_runtime *rt, int e) {
  dev_update *u = &rt->upd;
  if (e < u->waited) return 0;
  if (gpu_stream_wait(rt->g, u->swapped ? u->main : NULL, u->ev[e])) return -1;
  u->waited = e + 1;
  unhold_waited(rt);
  return 0;
}

/* The main stream ordered after everything queued on the update's stream, marked or not (a
 * run that failed between a launch and its event), and every held block back in the pool. */
int update_settle(gpu_runtime *rt) {
  dev_update *u = &rt->upd;
  if (!u->stream) return 0; /* the overlap never ran */
  if (!u->tail && gpu_event_new(rt->g, &u->tail)) return -1;
  if (gpu_event_record_on(rt->g, u->tail, u->stream) || gpu_stream_wait(rt->g, u->swapped ? u->main : NULL, u->tail))
    return -1;
  u->waited = u->n_ev;
  unhold_waited(rt);
  return 0;
}

void pool_put_after(gpu_runtime *rt, gpu_ptr p, int ev) {
  dev_update *u = &rt->upd;
  if (ev < u->waited) {
    gpu_pool_put(rt->pool, p);
    return;
  }
  if (u->n_held == u->cap_held) {
    int cap = u->cap_held ? 2 * u->cap_held : 256;
    held_block *h = realloc(u->held, (size_t)cap * sizeof *h);
    if (!h) { /* no room to hold it: order the main stream after its reader instead */
      if (wait_for(rt, ev) == 0) gpu_pool_put(rt->pool, p);
      return; /* (else leaked, never reused while the update may read it; the step fails later) */
    }
    u->held = h, u->cap_held = cap;
  }
  u->held[u->n_held++] = (held_block){p, ev};
}

int pool_get(gpu_runtime *rt, size_t bytes, gpu_ptr *p) {
  if (gpu_pool_get(rt->pool, bytes, p) == 0) return 0;
  if (rt->upd.n_held == 0 || update_settle(rt)) return -1;
  return gpu_pool_get(rt->pool, bytes, p); /* out of memory with blocks held: the overlap given up for them */
}

/* A node that reads a parameter (or its bf16 copy, or the stack or squares made from it) waits
 * for that parameter's update. The update's own nodes run on its stream and wait for nothing. */
int update_wait_inputs(gx *x, int id) {
  dev_update *u = &x->rt->upd;
  if (u->waited >= u->n_ev || N(id)->op == OP_ADAMW) return 0;
  int need = -1;
  for (int j = 0; j < N(id)->n_in; j++) {
    int v = N(id)->in[j];
    if (N(v)->op == OP_CAST && N(N(v)->in[0])->op == OP_PARAM) v = N(v)->in[0];
    if (N(v)->op == OP_PARAM && x->param_index[v] >= 0 && u->param_ev[x->param_index[v]] > need)
      need = u->param_ev[x->param_index[v]];
  }
  return need >= 0 && wait_for(x->rt, need) ? fail(x, id, "%s", gpu_error(x->rt->g)) : 0;
}

/* MOEC_ADAMW_DELAY's scratch written on the update's stream (swapped in). */
static int delay(gx *x, int id) {
  dev_update *u = &x->rt->upd;
  if (!u->delay_bytes) {
    const char *e = getenv("MOEC_ADAMW_DELAY");
    const long long mib = e ? atoll(e) : 0;
    if (mib <= 0) return 0;
    u->delay_bytes = (size_t)(mib < 512 ? mib : 512) << 20, u->delay_reps = (int)((mib + 511) / 512);
    if (gpu_alloc(x->rt->g, &u->delay, u->delay_bytes, "MOEC_ADAMW_DELAY's scratch")) return fail(x, id, "%s", gpu_error(x->rt->g));
  }
  for (int r = 0; u->delay && r < u->delay_reps; r++)
    if (gpu_memset8(x->rt->g, u->delay, (unsigned char)r, u->delay_bytes)) return fail(x, id, "%s", gpu_error(x->rt->g));
  return 0;
}

/* Before a run of AdamW launches: 1 when they go on the update's stream (which then waits for
 * the main stream's work so far), 0 when they stay on the main stream, -1 on an error. */
int update_begin(gx *x, int id) {
  gpu_runtime *rt = x->rt;
  dev_update *u = &rt->upd;
  if (u->mode < 0) u->mode = overlap_mode();
  if (!u->mode || x->comm || x->keep_all || x->prof) /* on the main stream, after any update in flight */
    return update_settle(rt) ? fail(x, id, "%s", gpu_error(rt->g)) : 0;
  if (!u->open) { /* the step's first run: whatever the last update still holds goes back */
    if (update_settle(rt)) return fail(x, id, "%s", gpu_error(rt->g));
    u->n_ev = u->waited = 0;
    if (!u->param_ev && !(u->param_ev = malloc((size_t)(rt->ps->n + 1) * sizeof(int))))
      return fail(x, id, "out of host memory");
    for (int i = 0; i < rt->ps->n; i++) u->param_ev[i] = -1;
    u->open = 1;
  }
  if (!u->stream && gpu_stream_new_prio(rt->g, &u->stream, u->mode == 2 ? 1 : u->mode == 3 ? -1 : 0))
    return fail(x, id, "%s", gpu_error(rt->g));
  if (!u->start && gpu_event_new(rt->g, &u->start)) return fail(x, id, "%s", gpu_error(rt->g));
  if (gpu_event_record_on(rt->g, u->start, NULL) || gpu_stream_wait(rt->g, u->stream, u->start))
    return fail(x, id, "%s", gpu_error(rt->g));
  u->main = gpu_stream_swap(rt->g, u->stream);
  u->swapped = 1;
  if (delay(x, id)) {
    update_end(x, id);
    return -1;
  }
  return 1;
}

/* After a launch on the update's stream that updated parameters params[0 .. n): its event. */
int update_mark(gx *x, int id, const int *params, int n) {
  gpu_runtime *rt = x->rt;
  dev_update *u = &rt->upd;
  if (u->n_ev == u->cap_ev) {
    int cap = u->cap_ev ? 2 * u->cap_ev : 64;
    void **ev = realloc(u->ev, (size_t)cap * sizeof *ev);
    if (!ev) return fail(x, id, "out of host memory");
    memset(ev + u->cap_ev, 0, (size_t)(cap - u->cap_ev) * sizeof *ev);
    u->ev = ev, u->cap_ev = cap;
  }
  if (!u->ev[u->n_ev] && gpu_event_new(rt->g, &u->ev[u->n_ev])) return fail(x, id, "%s", gpu_error(rt->g));
  if (gpu_event_record_on(rt->g, u->ev[u->n_ev], u->stream)) return fail(x, id, "%s", gpu_error(rt->g));
  for (int k = 0; k < n; k++) u->param_ev[params[k]] = u->n_ev;
  u->n_ev++;
  return 0;
}

/* Value v (a gradient, the norm) is read by the launches up to event ev: the root of its view
 * chain, which owns the memory, is held until then when released. */
void update_reads(gx *x, int v, int ev) {
  const int r = gpu_view_root(x->g, x->view, v);
  if (ev > x->upd_ev[r]) x->upd_ev[r] = ev;
}

/* After the run of launches: the main stream is the context's again. */
int update_end(gx *x, int id) {
  dev_update *u = &x->rt->upd;
  (void)id;
  if (!u->swapped) return 0;
  gpu_stream_swap(x->rt->g, u->main);
  u->swapped = 0, u->main = NULL;
  return 0;
}

int gpu_runtime_update_launches(const gpu_runtime *rt) { return rt->upd.n_ev; }

/* The run is over: the next one's first update settles this one's. */
void update_run_end(gpu_runtime *rt) { rt->upd.open = 0; }

void update_free(gpu_runtime *rt) {
  dev_update *u = &rt->upd;
  if (u->swapped) gpu_stream_swap(rt->g, u->main), u->swapped = 0;
  if (u->stream) gpu_stream_sync(rt->g, u->stream); /* every launch, an event after it or not (a failed run) */
  u->waited = u->n_ev;
  unhold_waited(rt);
  for (int i = 0; i < u->n_held; i++) gpu_pool_put(rt->pool, u->held[i].p);
  if (u->stream) gpu_stream_free(rt->g, u->stream);
  for (int i = 0; i < u->cap_ev; i++)
    if (u->ev[i]) gpu_event_free(rt->g, u->ev[i]);
  if (u->start) gpu_event_free(rt->g, u->start);
  if (u->tail) gpu_event_free(rt->g, u->tail);
  gpu_free(rt->g, u->delay);
  free(u->ev), free(u->param_ev), free(u->held);
  memset(u, 0, sizeof *u);
}
