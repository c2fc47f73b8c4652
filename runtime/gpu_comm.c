/* gpu_comm.c -- see gpu_comm.h. */
#include "gpu_comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "errf.h"
#include "gpu_nccl.h"

struct gpu_comm {
  gpu_comm_kind kind;
  comm_world *w;
  int rank;
  gpu_ctx *g;
  gpu_nccl *nc[COMM_GROUPS]; /* NCCL: one per group of size > 1 */
  /* NCCL: every collective on one stream of its own (so they run in the order queued), after
     the work queued on g's stream so far (`ready` marks it); `done` marks a synchronous
     collective's end, which g's stream then waits for */
  void *stream, *ready, *done;
  void *host;                /* host-staged: the staging buffer */
  size_t host_cap;
};

const char *gpu_comm_kind_name(gpu_comm_kind k) { return k == GPU_COMM_NCCL ? "NCCL" : "host-staged"; }

void gpu_comm_gpu_id(gpu_ctx *g, char *id, size_t len) {
  char host[64] = "?";
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
  host[sizeof host - 1] = 0;
  const gpu_device_info *d = gpu_info(g);
  snprintf(id, len, "%s/%04x:%02x:%02x", host, d->pci_domain, d->pci_bus, d->pci_device);
}

/* Why this rank cannot use NCCL (0 when it can): NCCL missing, or its GPU shared with another
 * rank (ids: every rank's gpu_id, GPU_COMM_ID_LEN bytes each, in rank order). */
static int nccl_unfit(int rank, int n, const char *ids, char *why, size_t len) {
  char lerr[1024];
  if (gpu_nccl_load(NULL, lerr, sizeof lerr) != 0) return snprintf(why, len, "%s", lerr), 1;
  for (int j = 0; j < n; j++)
    if (j != rank && strncmp(ids + (size_t)j * GPU_COMM_ID_LEN, ids + (size_t)rank * GPU_COMM_ID_LEN, GPU_COMM_ID_LEN) == 0)
      return snprintf(why, len, "ranks %d and %d share GPU %s (NCCL needs a GPU per rank)", rank < j ? rank : j,
                      rank < j ? j : rank, ids + (size_t)rank * GPU_COMM_ID_LEN), 1;
  return 0;
}

int gpu_comm_agree(comm_world *w, int rank, const char *gpu_id, gpu_comm_kind *kind, char *note, size_t notelen, char *err,
                   size_t errlen) {
  const char *env = getenv("MOEC_GPU_COMM");
  note[0] = 0;
  if (env && *env && strcmp(env, "host") != 0 && strcmp(env, "nccl") != 0 && strcmp(env, "auto") != 0)
    return errf(err, errlen, "MOEC_GPU_COMM=%s: expected host, nccl or auto", env);
  comm *wc = comm_get(w, rank, COMM_WORLD);
  int n = comm_size(wc);
  char mine[GPU_COMM_ID_LEN] = {0}, *ids = calloc((size_t)n, GPU_COMM_ID_LEN);
  if (!ids) return errf(err, errlen, "out of host memory");
  snprintf(mine, sizeof mine, "%s", gpu_id);
  if (comm_all_gather(wc, mine, sizeof mine, ids, err, errlen) != 0) {
    free(ids);
    return -1;
  }
  char why[1024] = "";
  int32_t unfit = nccl_unfit(rank, n, ids, why, sizeof why);
  free(ids);
  if (comm_all_reduce_sum(wc, &unfit, 1, COMM_I32, err, errlen) != 0) return -1;
  if (env && strcmp(env, "host") == 0) {
    *kind = GPU_COMM_HOST;
    return 0;
  }
  if (unfit && env && strcmp(env, "nccl") == 0)
    return why[0] ? errf(err, errlen, "MOEC_GPU_COMM=nccl: %s; install NCCL or set MOEC_LIBNCCL, start fewer ranks per node, "
                         "or MOEC_GPU_COMM=host (collectives through host memory; ranks may share a GPU)", why)
                  : errf(err, errlen, "MOEC_GPU_COMM=nccl: %d other rank(s) cannot use NCCL (their messages say why)", unfit);
  *kind = unfit ? GPU_COMM_HOST : GPU_COMM_NCCL;
  if (unfit && why[0])
    snprintf(note, notelen, "%s: the collectives go through host memory (slower; install NCCL for one GPU per rank)", why);
  else if (unfit)
    snprintf(note, notelen, "%d rank(s) cannot use NCCL: the collectives go through host memory", unfit);
  return 0;
}

gpu_comm_kind gpu_comm_kind_of(const gpu_comm *c) { return c->kind; }

const char *gpu_comm_failure(gpu_comm *c) {
  for (int i = 0; c && i < COMM_GROUPS; i++) {
    const char *f = gpu_nccl_failure(c->nc[i]);
    if (f) return f;
  }
  return NULL;
}
comm *gpu_comm_host_group(gpu_comm *c, comm_group grp) { return comm_get(c->w, c->rank, grp); }

void gpu_comm_free(gpu_comm *c, int abort) {
  if (!c) return;
  for (int i = 0; i < COMM_GROUPS; i++) gpu_nccl_free(c->nc[i], abort);
  if (c->ready) gpu_event_free(c->g, c->ready);
  if (c->done) gpu_event_free(c->g, c->done);
  gpu_stream_free(c->g, c->stream); /* destroying a stream with queued work waits for it in the driver */
  free(c->host);
  free(c);
}

gpu_comm *gpu_comm_new(gpu_comm_kind kind, comm_world *w, int rank, gpu_ctx *g, char *err, size_t errlen) {
  gpu_comm *c = calloc(1, sizeof *c);
  if (!c) return errf(err, errlen, "out of host memory"), NULL;
  c->kind = kind, c->w = w, c->rank = rank, c->g = g;
  if (kind != GPU_COMM_NCCL) return c;
  if (gpu_stream_new(g, &c->stream) != 0 || gpu_event_new(g, &c->ready) != 0 || gpu_event_new(g, &c->done) != 0) {
    errf(err, errlen, "the communication stream: %s", gpu_error(g));
    gpu_comm_free(c, 1);
    return NULL;
  }
  /* the same order on every rank: world, EP, DP; a group's rank 0 draws its id */
  for (int grp = 0; grp < COMM_GROUPS; grp++) {
    comm *h = comm_get(w, rank, (comm_group)grp);
    if (!h || comm_size(h) < 2) continue;
    gpu_nccl_id id;
    memset(&id, 0, sizeof id);
    char m[1024];
    if (comm_rank(h) == 0 && gpu_nccl_unique_id(&id, m, sizeof m) != 0) {
      comm_abort(w, rank, m); /* the others wait in the broadcast below */
      errf(err, errlen, "%s", m);
      gpu_comm_free(c, 1);
      return NULL;
    }
    if (comm_broadcast(h, &id, sizeof id, 0, m, sizeof m) != 0 ||
        !(c->nc[grp] = gpu_nccl_new(g, comm_size(h), comm_rank(h), &id, m, sizeof m))) {
      errf(err, errlen, "NCCL communicator of the %s group (rank %d of %d): %s", comm_group_name((comm_group)grp),
           comm_rank(h), comm_size(h), m);
      gpu_comm_free(c, 1);
      return NULL;
    }
  }
  return c;
}

static void *staging(gpu_comm *c, size_t bytes, char *err, size_t errlen) {
  if (bytes > c->host_cap) {
    void *p = realloc(c->host, bytes);
    if (!p) return errf(err, errlen, "out of host memory staging %zu bytes for a collective", bytes), NULL;
    c->host = p, c->host_cap = bytes;
  }
  return c->host;
}

static int gpu_fail(gpu_comm *c, char *err, size_t errlen) { return errf(err, errlen, "%s", gpu_error(c->g)); }

/* Host-staged all-reduce: bf16 is summed in f32 and rounded once, as the CPU ranks do. */
static int host_all_reduce(gpu_comm *c, comm *h, gpu_ptr buf, int64_t n, gpu_comm_dtype t, char *err, size_t errlen) {
  int bf = t == GPU_COMM_BF16;
  size_t es = bf ? 2 : 4;
  char *host = staging(c, (size_t)n * (4 + (bf ? 2 : 0)), err, errlen); /* n f32/i32, then n bf16 */
  if (!host) return -1;
  float *f = (float *)host;
  uint16_t *b = (uint16_t *)(host + (size_t)n * 4);
  if (gpu_download(c->g, bf ? (void *)b : (void *)host, buf, (size_t)n * es) != 0) return gpu_fail(c, err, errlen);
  for (int64_t i = 0; bf && i < n; i++) f[i] = ck_bf16_to_float(b[i]);
  if (comm_all_reduce_sum(h, host, n, t == GPU_COMM_I32 ? COMM_I32 : COMM_F32, err, errlen) != 0) return -1;
  for (int64_t i = 0; bf && i < n; i++) b[i] = ck_float_to_bf16(f[i]);
  return gpu_upload(c->g, buf, bf ? (void *)b : (void *)host, (size_t)n * es) != 0 ? gpu_fail(c, err, errlen) : 0;
}

/* The communication stream waits for what g's stream has queued so far. */
static int comm_stream_after_compute(gpu_comm *c, char *err, size_t errlen) {
  return gpu_event_record_on(c->g, c->ready, NULL) || gpu_stream_wait(c->g, c->stream, c->ready) ? gpu_fail(c, err, errlen)
                                                                                                   : 0;
}
/* done recorded behind the collective just queued; g's stream waits for it unless `later`. */
static int compute_after_comm(gpu_comm *c, void *done, int later, char *err, size_t errlen) {
  if (gpu_event_record_on(c->g, done, c->stream) != 0) return gpu_fail(c, err, errlen);
  return !later && gpu_stream_wait(c->g, NULL, done) != 0 ? gpu_fail(c, err, errlen) : 0;
}

int gpu_comm_all_reduce_sum_async(gpu_comm *c, comm_group grp, gpu_ptr buf, int64_t n, gpu_comm_dtype t, void *done,
                                  int *pending, char *err, size_t errlen) {
  *pending = 0;
  comm *h = gpu_comm_host_group(c, grp);
  if (!h) return errf(err, errlen, "no %s group for world rank %d", comm_group_name(grp), c->rank);
  if (comm_size(h) == 1 || n == 0) return 0;
  if (c->kind == GPU_COMM_HOST) return host_all_reduce(c, h, buf, n, t, err, errlen);
  if (comm_stream_after_compute(c, err, errlen) != 0) return -1;
  int rc = t == GPU_COMM_I32
               ? gpu_nccl_all_reduce_sum_i32(c->nc[grp], c->stream, buf, n, err, errlen)
               : gpu_nccl_all_reduce_sum(c->nc[grp], c->stream, buf, n, t == GPU_COMM_BF16 ? CG_DT_BF16 : CG_DT_F32, err,
                                         errlen);
  if (rc != 0 || compute_after_comm(c, done ? done : c->done, done != NULL, err, errlen) != 0) return -1;
  *pending = done != NULL;
  return 0;
}

int gpu_comm_all_reduce_sum(gpu_comm *c, comm_group grp, gpu_ptr buf, int64_t n, gpu_comm_dtype t, char *err,
                            size_t errlen) {
  int pending;
  return gpu_comm_all_reduce_sum_async(c, grp, buf, n, t, NULL, &pending, err, errlen);
}

int gpu_comm_all_to_all_v(gpu_comm *c, comm_group grp, gpu_ptr send, const size_t *send_off, const size_t *send_bytes,
                          gpu_ptr recv, const size_t *recv_off, const size_t *recv_bytes, char *err, size_t errlen) {
  comm *h = gpu_comm_host_group(c, grp);
  if (!h) return errf(err, errlen, "no %s group for world rank %d", comm_group_name(grp), c->rank);
  int P = comm_size(h);
  if (P == 1) { /* to itself */
    if (send_bytes[0] != recv_bytes[0])
      return errf(err, errlen, "all_to_all_v: sends %zu bytes to itself, expects %zu", send_bytes[0], recv_bytes[0]);
    return send_bytes[0] && gpu_copy(c->g, recv + recv_off[0], send + send_off[0], send_bytes[0]) ? gpu_fail(c, err, errlen) : 0;
  }
  if (c->kind == GPU_COMM_NCCL) /* on the communication stream, g's stream waiting for it */
    return comm_stream_after_compute(c, err, errlen) ||
                   gpu_nccl_all_to_all_v(c->nc[grp], c->stream, send, send_off, send_bytes, recv, recv_off, recv_bytes, err,
                                         errlen) ||
                   compute_after_comm(c, c->done, 0, err, errlen)
               ? -1
               : 0;
  /* host-staged: the segments packed in peer order (comm.h's layout), then unpacked */
  size_t ns = 0, nr = 0;
  for (int j = 0; j < P; j++) ns += send_bytes[j], nr += recv_bytes[j];
  char *host = staging(c, ns + nr + 1, err, errlen);
  if (!host) return -1;
  char *hs = host, *hr = host + ns;
  for (int j = 0; j < P; j++) {
    if (send_bytes[j] && gpu_download(c->g, hs, send + send_off[j], send_bytes[j]) != 0) return gpu_fail(c, err, errlen);
    hs += send_bytes[j];
  }
  if (comm_all_to_all_v(h, host, send_bytes, hr, recv_bytes, err, errlen) != 0) return -1;
  for (int j = 0; j < P; j++) {
    if (recv_bytes[j] && gpu_upload(c->g, recv + recv_off[j], hr, recv_bytes[j]) != 0) return gpu_fail(c, err, errlen);
    hr += recv_bytes[j];
  }
  return 0;
}

int gpu_comm_reduce_scatter_sum(gpu_comm *c, comm_group grp, gpu_ptr send, gpu_ptr recv, int64_t chunk, char *err,
                                size_t errlen) {
  comm *h = gpu_comm_host_group(c, grp);
  if (!h) return errf(err, errlen, "no %s group for world rank %d", comm_group_name(grp), c->rank);
  const int P = comm_size(h);
  const size_t bytes = (size_t)chunk * 4;
  if (P == 1 || chunk == 0)
    return bytes && gpu_copy(c->g, recv, send, bytes) ? gpu_fail(c, err, errlen) : 0;
  if (c->kind == GPU_COMM_NCCL)
    return comm_stream_after_compute(c, err, errlen) ||
                   gpu_nccl_reduce_scatter_sum(c->nc[grp], c->stream, send, recv, chunk, err, errlen) ||
                   compute_after_comm(c, c->done, 0, err, errlen)
               ? -1
               : 0;
  float *host = staging(c, (size_t)(P + 1) * bytes, err, errlen); /* every rank's P x chunk, then my chunk */
  if (!host) return -1;
  if (gpu_download(c->g, host, send, (size_t)P * bytes) != 0) return gpu_fail(c, err, errlen);
  if (comm_reduce_scatter_sum(h, host, (int64_t)P * chunk, host + (size_t)P * (size_t)chunk, err, errlen) != 0) return -1;
  return gpu_upload(c->g, recv, host + (size_t)P * (size_t)chunk, bytes) != 0 ? gpu_fail(c, err, errlen) : 0;
}

int gpu_comm_all_gather(gpu_comm *c, comm_group grp, gpu_ptr send, gpu_ptr recv, size_t bytes, char *err, size_t errlen) {
  comm *h = gpu_comm_host_group(c, grp);
  if (!h) return errf(err, errlen, "no %s group for world rank %d", comm_group_name(grp), c->rank);
  const int P = comm_size(h);
  if (P == 1 || bytes == 0) return bytes && gpu_copy(c->g, recv, send, bytes) ? gpu_fail(c, err, errlen) : 0;
  if (c->kind == GPU_COMM_NCCL)
    return comm_stream_after_compute(c, err, errlen) ||
                   gpu_nccl_all_gather(c->nc[grp], c->stream, send, recv, bytes, err, errlen) ||
                   compute_after_comm(c, c->done, 0, err, errlen)
               ? -1
               : 0;
  char *host = staging(c, (size_t)(P + 1) * bytes, err, errlen); /* mine, then every rank's */
  if (!host) return -1;
  if (gpu_download(c->g, host, send, bytes) != 0) return gpu_fail(c, err, errlen);
  if (comm_all_gather(h, host, bytes, host + bytes, err, errlen) != 0) return -1;
  return gpu_upload(c->g, recv, host + bytes, (size_t)P * bytes) != 0 ? gpu_fail(c, err, errlen) : 0;
}
