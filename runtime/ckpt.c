/* ckpt.c -- crash-safe checkpoint directories (see ckpt.h). */
#include "ckpt.h"
#include "ckpt_int.h"
#include "sbuf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MOEC_VERSION
#define MOEC_VERSION "unknown"
#endif

#define PATHMAX 4096

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* ================================================================ small helpers */

/* a float that Python's json reads back as a float: %.17g, plus ".0" when it looks integral */
static int sb_float(sbuf *b, double d) {
  char tmp[64];
  if (st_json_fmt_double(d, tmp, sizeof tmp - 2) != 0) return -1;
  if (!strpbrk(tmp, ".eEn")) strcat(tmp, ".0");
  sb_add(b, tmp, strlen(tmp));
  return 0;
}

static int is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int mkdir_p(const char *dir, char *err, size_t errlen) {
  char buf[PATHMAX];
  if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) {
    seterr(err, errlen, "%.200s...: path too long", dir);
    return -1;
  }
  for (char *p = buf + 1;; p++) {
    if (*p == '/' || *p == 0) {
      char c = *p;
      *p = 0;
      if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
        int e = errno;
        seterr(err, errlen, "cannot create checkpoint directory %s: %s: %s%s", dir, buf,
               strerror(e), e == EACCES || e == EROFS ? " (choose a writable checkpoint directory)"
                                                      : "");
        return -1;
      }
      if (!is_dir(buf)) {
        seterr(err, errlen, "cannot create checkpoint directory %s: %s exists and is not a "
               "directory", dir, buf);
        return -1;
      }
      *p = c;
      if (!c) break;
    }
  }
  return 0;
}

static int rmtree_at(int dfd, const char *name) {
  struct stat sb;
  if (fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : -1;
  if (!S_ISDIR(sb.st_mode)) return unlinkat(dfd, name, 0) == 0 || errno == ENOENT ? 0 : -1;
  int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -1;
  }
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (rmtree_at(fd, e->d_name) != 0) rc = -1;
  }
  closedir(d);
  if (rc == 0 && unlinkat(dfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) rc = -1;
  return rc;
}

int ckpt_rmtree(const char *path) { return rmtree_at(AT_FDCWD, path); }

/* reads a small file whole (NUL-terminated); NULL with err set */
static char *read_small(const char *path, size_t max, size_t *len_out, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    seterr(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (!buf) break;
    if (n + 1 >= cap) {
      if (cap > max) {
        seterr(err, errlen, "%s: larger than %zu bytes; not a file moec wrote", path, max);
        goto fail;
      }
      char *nb = realloc(buf, cap * 2);
      if (!nb) break;
      buf = nb;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + n, cap - 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      seterr(err, errlen, "%s: read failed: %s", path, strerror(errno));
      goto fail;
    }
    if (r == 0) {
      close(fd);
      buf[n] = 0;
      if (len_out) *len_out = n;
      return buf;
    }
    n += (size_t)r;
  }
  seterr(err, errlen, "%s: out of memory", path);
fail:
  free(buf);
  close(fd);
  return NULL;
}

st_json *ckpt_read_json(const char *path, char *err, size_t errlen) {
  size_t n;
  char *txt = read_small(path, 16u << 20, &n, err, errlen);
  if (!txt) return NULL;
  char jerr[256];
  st_json *j = st_json_parse(txt, n, jerr, sizeof jerr);
  free(txt);
  if (!j) seterr(err, errlen, "%s: corrupt JSON: %s", path, jerr);
  else if (j->type != ST_JSON_OBJ) {
    seterr(err, errlen, "%s: not a JSON object", path);
    st_json_free(j);
    j = NULL;
  }
  return j;
}

static int64_t numel_of(const ckpt_param *p) {
  int64_t n = 1;
  for (int i = 0; i < p->ndim; i++) n *= p->shape[i];
  return n;
}

/* "step-00000100" -> 100; -1 when name is not a step directory name (8+ digits) */
static int64_t parse_step_name(const char *name) {
  if (strncmp(name, "step-", 5) != 0) return -1;
  const char *p = name + 5;
  if (strlen(p) < 8) return -1; /* we always write at least 8 digits */
  int64_t v = 0;
  for (; *p; p++) {
    if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return -1;
    v = v * 10 + (*p - '0');
  }
  return v;
}

static void step_name(int64_t step, char *buf, size_t len) {
  snprintf(buf, len, "step-%08lld", (long long)step);
}

/* ================================================================ config.json */

int ckpt_hf_config_json(const moec_config *cfg, int64_t bos_id, int64_t eos_id, int64_t pad_id,
                        char **out, char *err, size_t errlen) {
  *out = NULL;
  if (!cfg) {
    seterr(err, errlen, "config.json: no model config given");
    return -1;
  }
  const struct {
    const char *name;
    int64_t v;
  } req[] = {{"vocab", cfg->vocab}, {"hidden", cfg->hidden}, {"layers", cfg->layers},
             {"seq", cfg->seq},     {"heads", cfg->heads},   {"experts", cfg->experts},
             {"top_k", cfg->top_k}, {"ffn", cfg->ffn}};
  for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
    if (req[i].v <= 0) {
      seterr(err, errlen, "config.json: model size '%s' is %lld; it must be set (> 0) in the .moe "
             "file", req[i].name, (long long)req[i].v);
      return -1;
    }
  int64_t kv = cfg->kv_heads ? cfg->kv_heads : cfg->heads;
  int64_t hd = cfg->head_dim;
  if (!hd) {
    if (cfg->hidden % cfg->heads) {
      seterr(err, errlen, "config.json: hidden %lld is not a multiple of heads %lld; give "
             "head_dim explicitly", (long long)cfg->hidden, (long long)cfg->heads);
      return -1;
    }
    hd = cfg->hidden / cfg->heads;
  }
  if (kv < 0 || hd < 0 || cfg->heads % kv || cfg->top_k > cfg->experts) {
    seterr(err, errlen, "config.json: inconsistent sizes (heads %lld, kv_heads %lld, head_dim "
           "%lld, experts %lld, top_k %lld)", (long long)cfg->heads, (long long)kv, (long long)hd,
           (long long)cfg->experts, (long long)cfg->top_k);
    return -1;
  }
  if (!(cfg->norm_eps > 0) || !(cfg->rope_theta > 0) || !isfinite(cfg->norm_eps) ||
      !isfinite(cfg->rope_theta) || !isfinite(cfg->aux_loss) || cfg->aux_loss < 0) {
    seterr(err, errlen, "config.json: norm eps (%g) and rope_theta (%g) must be finite and > 0, "
           "aux_loss (%g) finite and >= 0", cfg->norm_eps, cfg->rope_theta, cfg->aux_loss);
    return -1;
  }
  sbuf b = {0};
  sb_printf(&b, "{\n  \"architectures\": [\"MixtralForCausalLM\"],\n");
  sb_printf(&b, "  \"attention_dropout\": 0.0,\n");
#define TOKEN(key, id)                                                                             \
  do {                                                                                             \
    if ((id) < 0) sb_printf(&b, "  \"%s\": null,\n", key);                                         \
    else sb_printf(&b, "  \"%s\": %lld,\n", key, (long long)(id));                                 \
  } while (0)
  TOKEN("bos_token_id", bos_id);
  TOKEN("eos_token_id", eos_id);
  sb_printf(&b, "  \"head_dim\": %lld,\n", (long long)hd);
  sb_printf(&b, "  \"hidden_act\": \"silu\",\n");
  sb_printf(&b, "  \"hidden_size\": %lld,\n", (long long)cfg->hidden);
  sb_printf(&b, "  \"initializer_range\": 0.02,\n");
  sb_printf(&b, "  \"intermediate_size\": %lld,\n", (long long)cfg->ffn);
  sb_printf(&b, "  \"max_position_embeddings\": %lld,\n", (long long)cfg->seq);
  sb_printf(&b, "  \"model_type\": \"mixtral\",\n");
  sb_printf(&b, "  \"num_attention_heads\": %lld,\n", (long long)cfg->heads);
  sb_printf(&b, "  \"num_experts_per_tok\": %lld,\n", (long long)cfg->top_k);
  sb_printf(&b, "  \"num_hidden_layers\": %lld,\n", (long long)cfg->layers);
  sb_printf(&b, "  \"num_key_value_heads\": %lld,\n", (long long)kv);
  sb_printf(&b, "  \"num_local_experts\": %lld,\n", (long long)cfg->experts);
  sb_printf(&b, "  \"output_router_logits\": false,\n");
  TOKEN("pad_token_id", pad_id);
#undef TOKEN
  sb_printf(&b, "  \"rms_norm_eps\": ");
  sb_float(&b, cfg->norm_eps);
  sb_printf(&b, ",\n  \"rope_theta\": ");
  sb_float(&b, cfg->rope_theta);
  sb_printf(&b, ",\n  \"router_aux_loss_coef\": ");
  sb_float(&b, cfg->aux_loss);
  sb_printf(&b, ",\n  \"router_jitter_noise\": 0.0,\n");
  sb_printf(&b, "  \"sliding_window\": null,\n");
  sb_printf(&b, "  \"tie_word_embeddings\": false,\n");
  sb_printf(&b, "  \"torch_dtype\": \"float32\",\n");
  sb_printf(&b, "  \"use_cache\": true,\n");
  sb_printf(&b, "  \"vocab_size\": %lld\n}\n", (long long)cfg->vocab);
  if (b.oom) {
    free(b.p);
    seterr(err, errlen, "config.json: out of memory");
    return -1;
  }
  *out = b.p;
  return 0;
}

/* ================================================================ save */

static int validate_contents(const ckpt_contents *c, int saving, char *err, size_t errlen) {
  if (!c || !c->config || (c->n_params && !c->params)) {
    seterr(err, errlen, "checkpoint: no contents (config and parameters) given");
    return -1;
  }
  for (size_t i = 0; i < c->n_params; i++) {
    const ckpt_param *p = &c->params[i];
    if (!p->name || !*p->name) {
      seterr(err, errlen, "checkpoint: parameter %zu has no name", i);
      return -1;
    }
    const int fetched = saving ? p->fetch != NULL : p->store != NULL; /* instead of pointing */
    if (p->ndim < 0 || p->ndim > CKPT_MAX_DIMS || (!fetched && (!p->w || !p->m != !p->v))) {
      seterr(err, errlen, "checkpoint: parameter '%s': bad rank %d, or missing data (w must be "
             "set; m and v both or neither)", p->name, p->ndim);
      return -1;
    }
    for (int d = 0; d < p->ndim; d++)
      if (p->shape[d] < 0) {
        seterr(err, errlen, "checkpoint: parameter '%s': negative dimension", p->name);
        return -1;
      }
    if (p->shard_n < 0 || p->shard_lo < 0 || p->shard_lo + p->shard_n > numel_of(p) || (p->shard_t && p->ndim != 2)) {
      seterr(err, errlen, "checkpoint: parameter '%s': shard [%lld, +%lld) outside its %lld values (or transposed and "
             "not 2-D)", p->name, (long long)p->shard_lo, (long long)p->shard_n, (long long)numel_of(p));
      return -1;
    }
    for (size_t j = 0; j < i; j++)
      if (!strcmp(c->params[j].name, p->name)) {
        seterr(err, errlen, "checkpoint: parameter name '%s' appears twice", p->name);
        return -1;
      }
  }
  if (saving) {
    for (size_t i = 0; i < c->n_state; i++) {
      const ckpt_kv *kv = &c->state[i];
      if (!kv->key || !strcmp(kv->key, "step") || !strcmp(kv->key, "seed") ||
          !strcmp(kv->key, "moec_version") || (kv->kind == CKPT_STR && !kv->s) ||
          (kv->kind == CKPT_F64 && !isfinite(kv->d)) ||
          (kv->kind != CKPT_INT && kv->kind != CKPT_F64 && kv->kind != CKPT_STR)) {
        seterr(err, errlen, "checkpoint: state key %zu (\"%s\") is reserved or has no valid value",
               i, kv->key ? kv->key : "(null)");
        return -1;
      }
      for (size_t j = 0; j < i; j++)
        if (!strcmp(c->state[j].key, kv->key)) {
          seterr(err, errlen, "checkpoint: state key \"%s\" given twice", kv->key);
          return -1;
        }
    }
  }
  return 0;
}

/* The values of a save's fetched tensors written so far, for ckpt_contents.progress. */
typedef struct {
  const ckpt_contents *c;
  int64_t done, total;
} save_progress;

/* A fetched tensor (ckpt_param.fetch) as the safetensors writer's producer. */
typedef struct {
  const ckpt_param *p;
  int which; /* 0 weight, 1 exp_avg, 2 exp_avg_sq */
  save_progress *sp;
} fetch_job;

/* The values a save writes of tensor `which` of p: a ZeRO shard's, or all. */
static int64_t values_written(const ckpt_param *p, int which) { return which && p->shard_n > 0 ? p->shard_n : numel_of(p); }

/* What a save of kind `which` (0 weights, 1 moments, 2 both) fetches of c, in values. */
static int64_t fetched_values(const ckpt_contents *c, int which) {
  int64_t n = 0;
  for (size_t i = 0; i < c->n_params; i++) {
    const ckpt_param *p = &c->params[i];
    if (!p->fetch) continue;
    if (which != 1) n += numel_of(p);
    if (which != 0 && p->has_moments) n += 2 * values_written(p, 1);
  }
  return n;
}

static int produce_fetched(void *ctx, void *dst, uint64_t bytes, char *err, size_t errlen) {
  const fetch_job *j = ctx;
  const int64_t n = values_written(j->p, j->which);
  if (bytes != (uint64_t)n * 4) {
    seterr(err, errlen, "%llu bytes asked for %lld values", (unsigned long long)bytes, (long long)n);
    return -1;
  }
  if (j->p->fetch(j->p->fetch_ctx, j->which, dst, err, errlen)) return -1;
  if (j->sp && j->sp->c->progress) {
    j->sp->done += n;
    j->sp->c->progress(j->sp->c->progress_ctx, j->sp->done, j->sp->total);
  }
  return 0;
}

static int write_tensors(const char *path, const ckpt_contents *c, int which, save_progress *sp, char *err,
                         size_t errlen) {
  /* which: 0 = weights, 1 = moments */
  size_t n = 0, cap = c->n_params * (which ? 2 : 1);
  st_tensor *t = calloc(cap ? cap : 1, sizeof *t);
  char **names = calloc(cap ? cap : 1, sizeof *names);
  fetch_job *jobs = calloc(cap ? cap : 1, sizeof *jobs);
  int rc = -1;
  if (!t || !names || !jobs) {
    seterr(err, errlen, "%s: out of memory", path);
    goto out;
  }
  for (size_t i = 0; i < c->n_params; i++) {
    const ckpt_param *p = &c->params[i];
    for (int k = 0; k < (which ? 2 : 1); k++) {
      const float *data = which ? (k ? p->v : p->m) : p->w;
      if (p->fetch ? which && !p->has_moments : !data) continue;
      st_tensor *s = &t[n];
      if (p->fetch) {
        jobs[n] = (fetch_job){p, which ? 1 + k : 0, sp};
        s->produce = produce_fetched, s->produce_ctx = &jobs[n];
        data = NULL;
      }
      if (which) {
        size_t len = strlen(p->name) + 48;
        names[n] = malloc(len);
        if (!names[n]) {
          seterr(err, errlen, "%s: out of memory", path);
          goto out;
        }
        int at = snprintf(names[n], len, "%s.%s", p->name, k ? "exp_avg_sq" : "exp_avg");
        if (p->shard_n > 0) /* ZeRO: this rank's values, named by where they start (ckpt.h) */
          snprintf(names[n] + at, len - (size_t)at, ".shard%s.%lld", p->shard_t ? "_t" : "", (long long)p->shard_lo);
        s->name = names[n];
      } else {
        s->name = p->name;
      }
      s->dtype = ST_F32;
      s->ndim = which && p->shard_n > 0 ? 1 : p->ndim;
      memcpy(s->shape, p->shape, sizeof s->shape);
      if (which && p->shard_n > 0) s->shape[0] = p->shard_n;
      s->data = data;
      n++;
    }
  }
  st_kv meta[] = {{"format", "pt"}};
  rc = st_write(path, t, n, meta, 1, err, errlen);
out:
  for (size_t i = 0; names && i < cap; i++) free(names[i]);
  free(names);
  free(t);
  free(jobs);
  return rc;
}

static int write_state(const char *path, int64_t step, const ckpt_contents *c, char *err,
                       size_t errlen) {
  sbuf b = {0};
  sb_printf(&b, "{\n  \"step\": %lld,\n  \"seed\": %lld,\n  \"moec_version\": ", (long long)step,
            (long long)c->config->seed);
  sb_quote(&b, MOEC_VERSION);
  for (size_t i = 0; i < c->n_state; i++) {
    const ckpt_kv *kv = &c->state[i];
    sb_printf(&b, ",\n  ");
    sb_quote(&b, kv->key);
    sb_printf(&b, ": ");
    if (kv->kind == CKPT_INT) sb_printf(&b, "%lld", (long long)kv->i);
    else if (kv->kind == CKPT_F64) sb_float(&b, kv->d);
    else sb_quote(&b, kv->s);
  }
  sb_printf(&b, "\n}\n");
  int rc = -1;
  if (b.oom) seterr(err, errlen, "%s: out of memory", path);
  else rc = st_write_atomic(path, b.p, b.n, err, errlen);
  free(b.p);
  return rc;
}

/* pid encoded in a temporary name we (or another moec) created, or 0 */
static long tmp_owner(const char *name) {
  const char *p;
  if (!strncmp(name, ".tmp-", 5)) p = strrchr(name, '-') + 1;
  else if (!strncmp(name, ".latest.tmp-", 12)) p = name + 12;
  else return 0;
  char *end;
  long pid = strtol(p, &end, 10);
  return end != p && pid > 0 ? pid : 0;
}

static int owner_alive(long pid) {
  if (pid == (long)getpid()) return 0; /* ours: left by an earlier failed save */
  return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* removes .tmp-* entries of writers that are gone */
static void remove_stale(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  int dfd = dirfd(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    long pid = tmp_owner(e->d_name);
    if (pid && !owner_alive(pid)) rmtree_at(dfd, e->d_name);
  }
  closedir(d);
}

typedef struct {
  int64_t step;
  char name[64];
} step_ent;

static int cmp_step_desc(const void *a, const void *b) {
  const step_ent *x = a, *y = b;
  return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

/* deletes step-* directories older than step beyond the newest keep-1 of them */
static int prune(const char *dir, int64_t step, int keep, char *warn, size_t warnlen) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  step_ent *v = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    int64_t s = parse_step_name(e->d_name);
    if (s < 0 || s >= step || strlen(e->d_name) >= sizeof v->name) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      step_ent *nv = realloc(v, cap * sizeof *v);
      if (!nv) break;
      v = nv;
    }
    v[n].step = s;
    memcpy(v[n].name, e->d_name, strlen(e->d_name) + 1); /* length checked above */
    n++;
  }
  closedir(d);
  if (n) qsort(v, n, sizeof *v, cmp_step_desc);
  int rc = 0;
  for (size_t i = (size_t)(keep - 1); i < n; i++) {
    char from[PATHMAX], to[PATHMAX];
    snprintf(from, sizeof from, "%s/%s", dir, v[i].name);
    snprintf(to, sizeof to, "%s/.tmp-del-%s-%ld", dir, v[i].name, (long)getpid());
    /* rename first: a half-deleted checkpoint never looks like a complete one */
    if (rename(from, to) != 0 || ckpt_rmtree(to) != 0) {
      if (!rc)
        seterr(warn, warnlen, "warning: could not delete old checkpoint %s: %s", from,
               strerror(errno));
      rc = -1;
    }
  }
  free(v);
  return rc;
}

/* A save in progress: DIR/.tmp-step-N-<pid> filled, then put in place as DIR/step-N. */
typedef struct {
  char name[64], tmp[PATHMAX], final[PATHMAX], prev[PATHMAX], keep_note[PATHMAX + 96];
  int64_t prev_step;
  int have_prev;
} save_ctx;

/* What a save starts from: the previous checkpoint (for the messages) and the paths; tmp
 * given (a sharded save's, made by rank 0) or this process's. */
static int save_init(save_ctx *s, const char *dir, int64_t step, const char *tmp, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  s->prev_step = -1;
  if (!dir || !*dir || step < 0) {
    seterr(err, errlen, "checkpoint: invalid directory or step %lld", (long long)step);
    return -1;
  }
  if (strlen(dir) > PATHMAX - 128) {
    seterr(err, errlen, "checkpoint directory %.200s...: path too long", dir);
    return -1;
  }
  s->have_prev = ckpt_latest(dir, s->prev, sizeof s->prev, &s->prev_step) == 1;
  if (s->have_prev)
    snprintf(s->keep_note, sizeof s->keep_note, "; the previous checkpoint %s is intact", s->prev);
  else
    snprintf(s->keep_note, sizeof s->keep_note, "; no earlier checkpoint exists in %s", dir);
  step_name(step, s->name, sizeof s->name);
  if (tmp) snprintf(s->tmp, sizeof s->tmp, "%s", tmp);
  else snprintf(s->tmp, sizeof s->tmp, "%s/.tmp-%s-%ld", dir, s->name, (long)getpid());
  snprintf(s->final, sizeof s->final, "%s/%s", dir, s->name);
  return 0;
}

/* DIR (with parents), stale temporaries gone, and a fresh, empty s->tmp. */
static int save_begin(save_ctx *s, const char *dir, int64_t step, char *err, size_t errlen) {
  if (save_init(s, dir, step, NULL, err, errlen) != 0 || mkdir_p(dir, err, errlen) != 0) return -1;
  remove_stale(dir);
  ckpt_rmtree(s->tmp);
  if (mkdir(s->tmp, 0777) != 0) {
    int e = errno;
    seterr(err, errlen, "checkpoint step %lld not saved: cannot create %s: %s%s%s", (long long)step, s->tmp, strerror(e),
           e == EACCES || e == EROFS ? " (make the checkpoint directory writable, or choose another)" : "",
           s->keep_note);
    return -1;
  }
  return 0;
}

/* config.json and state.json into s->tmp, then the directory fsynced. *stage names the step. */
static int save_meta(const save_ctx *s, int64_t step, const ckpt_contents *c, const char **stage, char *inner,
                     size_t innerlen) {
  char file[PATHMAX + 64], *cfg_json = NULL;
  *stage = "config.json";
  snprintf(file, sizeof file, "%s/config.json", s->tmp);
  int rc = ckpt_hf_config_json(c->config, c->bos_id, c->eos_id, c->pad_id, &cfg_json, inner, innerlen) != 0 ||
           st_write_atomic(file, cfg_json, strlen(cfg_json), inner, innerlen) != 0;
  free(cfg_json);
  if (rc) return -1;
  *stage = "state.json";
  snprintf(file, sizeof file, "%s/state.json", s->tmp);
  if (write_state(file, step, c, inner, innerlen) != 0) return -1;
  *stage = "the checkpoint directory";
  return st_fsync_dir(s->tmp, inner, innerlen);
}

/* The complete s->tmp into place as DIR/step-N, `latest` naming it, old ones pruned. */
static int save_place(const save_ctx *s, const char *dir, int64_t step, int keep, char *err, size_t errlen) {
  char inner[1024] = "", file[PATHMAX + 32];
  if (rename(s->tmp, s->final) != 0) {
    if (errno != EEXIST && errno != ENOTEMPTY) {
      seterr(inner, sizeof inner, "rename %s -> %s: %s", s->tmp, s->final, strerror(errno));
      goto fail;
    }
    /* step-N exists (an abandoned run, or a re-save): swap atomically, drop the old one */
    if (renameat2(AT_FDCWD, s->tmp, AT_FDCWD, s->final, RENAME_EXCHANGE) != 0) {
      int e = errno;
      if (s->have_prev && s->prev_step == step) {
        seterr(inner, sizeof inner, "%s exists, is the latest checkpoint, and this file system "
               "cannot swap directories atomically (%s); save under another step or delete it",
               s->final, strerror(e));
        goto fail;
      }
      char aside[PATHMAX];
      snprintf(aside, sizeof aside, "%s/.tmp-old-%s-%ld", dir, s->name, (long)getpid());
      if (rename(s->final, aside) != 0) {
        seterr(inner, sizeof inner, "cannot move existing %s aside: %s", s->final, strerror(errno));
        goto fail;
      }
      if (rename(s->tmp, s->final) != 0) {
        seterr(inner, sizeof inner, "cannot replace existing %s: %s", s->final, strerror(errno));
        rename(aside, s->final); /* put the old one back */
        goto fail;
      }
      ckpt_rmtree(aside);
    } else {
      ckpt_rmtree(s->tmp); /* now holds the old contents */
    }
  }
  if (st_fsync_dir(dir, inner, sizeof inner) != 0) goto fail_placed;

  /* latest -> step-N */
  snprintf(file, sizeof file, "%s/latest", dir);
  char line[80];
  snprintf(line, sizeof line, "%s\n", s->name);
  if (st_write_atomic(file, line, strlen(line), inner, sizeof inner) != 0) goto fail_placed;

  /* only now: delete what falls out of the window, and leftovers */
  prune(dir, step, keep > 0 ? keep : CKPT_DEFAULT_KEEP, err, errlen);
  remove_stale(dir);
  st_fsync_dir(dir, NULL, 0);
  return 0;

fail:
  ckpt_rmtree(s->tmp);
  seterr(err, errlen, "checkpoint step %lld not saved (the rename into place): %s%s", (long long)step, inner,
         s->keep_note);
  return -1;
fail_placed:
  /* step-N is complete on disk but `latest` does not name it (yet) */
  seterr(err, errlen, "checkpoint step %lld not saved: %s; %s is complete but `latest` still "
         "names %s", (long long)step, inner, s->final, s->have_prev ? s->prev : "nothing");
  return -1;
}

/* A save that failed writing `stage` (why: inner): the temporary directory goes, -1. */
static int save_failed(const save_ctx *s, int64_t step, const char *stage, const char *inner, char *err, size_t errlen) {
  ckpt_rmtree(s->tmp);
  seterr(err, errlen, "checkpoint step %lld not saved (writing %s): %s%s", (long long)step, stage, inner, s->keep_note);
  return -1;
}

int ckpt_save(const char *dir, int64_t step, const ckpt_contents *c, char *err, size_t errlen) {
  char file[PATHMAX + 32], inner[1024] = "";
  save_ctx s;
  if (err && errlen) err[0] = 0;
  if (validate_contents(c, 1, err, errlen) != 0 || save_begin(&s, dir, step, err, errlen) != 0) return -1;
  /* every file of the checkpoint, each fsynced, in the temporary directory */
  const char *stage = "model.safetensors";
  save_progress sp = {c, 0, fetched_values(c, 2)};
  snprintf(file, sizeof file, "%s/model.safetensors", s.tmp);
  if (write_tensors(file, c, 0, &sp, inner, sizeof inner) != 0) goto fail;
  stage = "optimizer.safetensors";
  snprintf(file, sizeof file, "%s/optimizer.safetensors", s.tmp);
  if (write_tensors(file, c, 1, &sp, inner, sizeof inner) != 0) goto fail;
  if (save_meta(&s, step, c, &stage, inner, sizeof inner) != 0) goto fail;
  return save_place(&s, dir, step, c->keep, err, errlen);
fail:
  return save_failed(&s, step, stage, inner, err, errlen);
}

/* ================================================================ sharded save */

int ckpt_parts_begin(const char *dir, int64_t step, char *tmp_out, size_t len, char *err, size_t errlen) {
  save_ctx s;
  if (err && errlen) err[0] = 0;
  if (save_begin(&s, dir, step, err, errlen) != 0) return -1;
  if (strlen(s.tmp) >= len) {
    ckpt_rmtree(s.tmp);
    seterr(err, errlen, "checkpoint directory %.200s...: path too long", dir);
    return -1;
  }
  memcpy(tmp_out, s.tmp, strlen(s.tmp) + 1);
  return 0;
}

int ckpt_parts_write(const char *tmp, const char *kind, int k, int n, const ckpt_contents *c, char *err, size_t errlen) {
  char file[PATHMAX + 128], part[96], inner[1024] = "";
  ckpt_contents params_only = *c; /* a part: no state keys to check */
  params_only.n_state = 0;
  if (validate_contents(&params_only, 1, err, errlen) != 0) return -1;
  const int which = !strcmp(kind, "optimizer");
  if (k < 0 || k >= n || (!which && strcmp(kind, "model"))) {
    seterr(err, errlen, "checkpoint: part %d of %d of '%s'", k, n, kind);
    return -1;
  }
  if (n == 1) snprintf(part, sizeof part, "%s.safetensors", kind);
  else ckpt_part_name(part, sizeof part, kind, k, n);
  snprintf(file, sizeof file, "%s/%s", tmp, part);
  save_progress sp = {c, 0, fetched_values(c, which)};
  if (write_tensors(file, c, which, &sp, inner, sizeof inner) != 0) {
    seterr(err, errlen, "checkpoint part %s not written: %s", part, inner);
    return -1;
  }
  return 0;
}

int ckpt_parts_finish(const char *dir, int64_t step, const char *tmp, int n_model, int n_opt, const ckpt_contents *c,
                      char *err, size_t errlen) {
  char inner[1024] = "";
  save_ctx s;
  if (err && errlen) err[0] = 0;
  if (save_init(&s, dir, step, tmp, err, errlen) != 0) return -1;
  const char *stage = "model.safetensors.index.json";
  if (n_model > 1 && ckpt_write_index(tmp, "model", n_model, inner, sizeof inner) != 0) goto fail;
  stage = "optimizer.safetensors.index.json";
  if (n_opt > 1 && ckpt_write_index(tmp, "optimizer", n_opt, inner, sizeof inner) != 0) goto fail;
  if (save_meta(&s, step, c, &stage, inner, sizeof inner) != 0) goto fail;
  return save_place(&s, dir, step, c->keep, err, errlen);
fail:
  return save_failed(&s, step, stage, inner, err, errlen);
}

void ckpt_parts_abandon(const char *tmp) { ckpt_rmtree(tmp); }

/* ================================================================ latest */

int ckpt_latest_err(const char *dir, char *path_out, size_t len, int64_t *step_out, char *err,
                    size_t errlen) {
  char file[PATHMAX + 16];
  if (err && errlen) err[0] = 0;
  if (!is_dir(dir)) {
    seterr(err, errlen, "%s: no such checkpoint directory", dir);
    return 0;
  }
  snprintf(file, sizeof file, "%s/latest", dir);
  if (access(file, F_OK) != 0 && errno == ENOENT) {
    seterr(err, errlen, "%s: no checkpoint yet (no 'latest' file)", dir);
    return 0;
  }
  size_t n;
  char inner[512];
  char *txt = read_small(file, 4096, &n, inner, sizeof inner);
  if (!txt) {
    seterr(err, errlen, "%s", inner);
    return -1;
  }
  if (n && txt[n - 1] == '\n') txt[--n] = 0;
  int64_t step = parse_step_name(txt);
  if (step < 0 || strlen(txt) != n) {
    seterr(err, errlen, "%s: malformed (expected one line 'step-NNNNNNNN'); fix or delete it and "
           "resume from a step-* directory explicitly", file);
    free(txt);
    return -1;
  }
  char full[PATHMAX + 80];
  snprintf(full, sizeof full, "%s/%s", dir, txt);
  free(txt);
  if (!is_dir(full)) {
    seterr(err, errlen, "%s names %s, which does not exist; was it deleted by hand?", file, full);
    return -1;
  }
  if (strlen(full) + 1 > len) {
    seterr(err, errlen, "%s: path longer than the caller's buffer", full);
    return -1;
  }
  memcpy(path_out, full, strlen(full) + 1);
  if (step_out) *step_out = step;
  return 1;
}

int ckpt_latest(const char *dir, char *path_out, size_t len, int64_t *step_out) {
  return ckpt_latest_err(dir, path_out, len, step_out, NULL, 0);
}

/* ================================================================ load */

void ckpt_state_free(ckpt_state *s) {
  if (!s) return;
  st_json_free(s->json);
  s->json = NULL;
}

int ckpt_state_i64(const ckpt_state *s, const char *key, int64_t *out) {
  const st_json *j = st_json_get(s->json, key);
  if (!j || j->type != ST_JSON_INT) return -1;
  *out = j->i;
  return 0;
}
int ckpt_state_f64(const ckpt_state *s, const char *key, double *out) {
  const st_json *j = st_json_get(s->json, key);
  if (!j || (j->type != ST_JSON_INT && j->type != ST_JSON_NUM)) return -1;
  *out = j->d;
  return 0;
}
const char *ckpt_state_str(const ckpt_state *s, const char *key) {
  const st_json *j = st_json_get(s->json, key);
  return j && j->type == ST_JSON_STR ? j->s : NULL;
}

/* A load reads p's moments: into m and v, or through store when has_moments. */
static int wants_moments(const ckpt_param *p) { return p->store ? p->has_moments : p->m != NULL; }

/* Tensor `which` of p (the weight, or moment name) from t into its place, or through a buffer
 * of the largest tensor's size to p->store. */
static int load_tensor(const ckpt_tset *t, const ckpt_param *p, int which, const char *name, float *buf, char *err,
                       size_t errlen) {
  float *dst = p->store ? buf : which == 0 ? p->w : which == 1 ? p->m : p->v;
  int rc = ckpt_tset_read(t, name, p->ndim, p->shape, dst, err, errlen);
  return rc == 0 && p->store ? p->store(p->fetch_ctx, which, buf, err, errlen) : rc;
}

/* checks that t holds the expected tensors (names from the params, with suffixes): exactly
 * those, or with c->subset those and others whose names contain it (the other EP ranks'
 * experts, not read) */
static int check_tensor_set(const ckpt_tset *t, const ckpt_contents *c, int moments, char *err,
                            size_t errlen) {
  const char *file = t->label;
  const char *what = moments ? "the optimizer state" : "the model";
  size_t expected = 0;
  for (size_t i = 0; i < c->n_params; i++) {
    const ckpt_param *p = &c->params[i];
    if (moments && !wants_moments(p)) continue;
    for (int k = 0; k < (moments ? 2 : 1); k++) {
      char nm[1024];
      snprintf(nm, sizeof nm, "%s%s", p->name, moments ? (k ? ".exp_avg_sq" : ".exp_avg") : "");
      const st_view *v = ckpt_tset_find(t, nm, NULL);
      char a[160], b[160];
      size_t shards;
      int order, r = moments && !v ? ckpt_tset_shards(t, nm, numel_of(p), &shards, &order, err, errlen) : 1;
      if (r < 0) return -1;
      if (r == 0 && order != p->shard_t) {
        seterr(err, errlen, "%s: the ZeRO shards of '%s' are in its %s order, but this model holds it in its %s: a "
               "checkpoint of a different model?", file, nm, order ? "transpose's" : "shape's",
               p->shard_t ? "transpose's" : "shape's");
        return -1;
      }
      if (r == 0) {
        expected += shards;
        continue;
      }
      if (moments && v && ckpt_tset_shards(t, nm, numel_of(p), &shards, &order, err, errlen) != 1) {
        seterr(err, errlen, "%s: '%s' is there both whole and in ZeRO shards: parts of different checkpoints mixed?",
               file, nm);
        return -1;
      }
      if (!v) {
        seterr(err, errlen, "%s: no tensor '%s', which %s needs: this checkpoint was written for "
               "a different model (compare its config.json with the .moe file)", file, nm, what);
        return -1;
      }
      if (v->ndim != p->ndim || memcmp(v->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim)) {
        seterr(err, errlen, "%s: tensor '%s' has shape %s but the model expects %s: this "
               "checkpoint was written for a different model size", file, nm,
               st_shape_str(v->shape, v->ndim, a, sizeof a),
               st_shape_str(p->shape, p->ndim, b, sizeof b));
        return -1;
      }
      if (v->dtype != ST_F32 && v->dtype != ST_BF16 && v->dtype != ST_F16) {
        seterr(err, errlen, "%s: tensor '%s' is %s; expected F32 (or BF16/F16)", file, nm,
               st_dtype_name(v->dtype));
        return -1;
      }
      expected++;
    }
  }
  if (!c->subset && ckpt_tset_count(t) == expected) return 0;
  for (size_t f = 0; f < t->n; f++)
    for (size_t i = 0; i < st_count(t->files[f]); i++) {
      const char *nm = st_at(t->files[f], i)->name;
      int found = c->subset && strstr(nm, c->subset) != NULL;
      for (size_t j = 0; j < c->n_params && !found; j++) {
        const ckpt_param *p = &c->params[j];
        size_t L = strlen(p->name);
        int64_t lo;
        int tr;
        const size_t M = moments ? ckpt_shard_name(nm, &lo, &tr) : 0;
        const size_t end = M ? M : strlen(nm); /* the moment's name: a shard's prefix, or all of nm */
        if (!moments) found = !strcmp(nm, p->name);
        else if (wants_moments(p) && end > L && !strncmp(nm, p->name, L))
          found = (end - L == 8 && !strncmp(nm + L, ".exp_avg", 8)) || (end - L == 11 && !strncmp(nm + L, ".exp_avg_sq", 11));
      }
      if (!found) {
        seterr(err, errlen, "%s: unexpected tensor '%s', which %s does not have: this checkpoint "
               "was written for a different model", st_path(t->files[f]), nm, what);
        return -1;
      }
    }
  if (!c->subset) { /* every name expected, each found once: so some name is there twice */
    seterr(err, errlen, "%s: holds %zu tensors where %zu are expected: a tensor in two parts? (parts of different "
           "checkpoints mixed)", file, ckpt_tset_count(t), expected);
    return -1;
  }
  return 0;
}

static int check_config(const char *file, const st_json *j, const moec_config *cfg, char *err,
                        size_t errlen) {
  const st_json *mt = st_json_get(j, "model_type");
  if (!mt || mt->type != ST_JSON_STR || strcmp(mt->s, "mixtral") != 0) {
    seterr(err, errlen, "%s: model_type is not \"mixtral\": not a moec checkpoint", file);
    return -1;
  }
  int64_t kv = cfg->kv_heads ? cfg->kv_heads : cfg->heads;
  int64_t hd = cfg->head_dim ? cfg->head_dim : (cfg->heads ? cfg->hidden / cfg->heads : 0);
  const struct {
    const char *key, *moe;
    int64_t want;
  } chk[] = {
      {"vocab_size", "vocab", cfg->vocab},          {"hidden_size", "hidden", cfg->hidden},
      {"intermediate_size", "ffn", cfg->ffn},       {"num_hidden_layers", "layers", cfg->layers},
      {"num_attention_heads", "heads", cfg->heads}, {"num_key_value_heads", "kv_heads", kv},
      {"head_dim", "head_dim", hd},                 {"num_local_experts", "experts", cfg->experts},
      {"num_experts_per_tok", "top_k", cfg->top_k},
  };
  for (size_t i = 0; i < sizeof chk / sizeof chk[0]; i++) {
    const st_json *v = st_json_get(j, chk[i].key);
    if (!v || v->type != ST_JSON_INT) {
      seterr(err, errlen, "%s: \"%s\" is missing or not an integer", file, chk[i].key);
      return -1;
    }
    if (v->i != chk[i].want) {
      seterr(err, errlen, "%s: %s is %lld but the model has %s = %lld: resume with the .moe "
             "file (and --set overrides) this checkpoint was trained with", file, chk[i].key,
             (long long)v->i, chk[i].moe, (long long)chk[i].want);
      return -1;
    }
  }
  return 0;
}

int ckpt_load(const char *path, const ckpt_contents *c, ckpt_state *state, char *err,
              size_t errlen) {
  /* the tensors: one file each, or the parts of a sharded (expert-parallel) save and their index */
  static const char *files[] = {"model.safetensors", "optimizer.safetensors", "config.json",
                                "state.json"};
  char file[PATHMAX + 32];
  ckpt_tset model = {0}, opt = {0};
  st_json *cfg = NULL, *stj = NULL;
  int rc = -1;
  if (state) memset(state, 0, sizeof *state);
  if (validate_contents(c, 0, err, errlen) != 0) return -1;
  if (!is_dir(path)) {
    seterr(err, errlen, "checkpoint %s: no such directory (give a step-* directory, or the "
           "checkpoint root's 'latest')", path);
    return -1;
  }
  for (size_t i = 0; i < 4; i++) {
    snprintf(file, sizeof file, "%s/%s%s", path, files[i], i < 2 ? ".index.json" : "");
    if (i < 2 && access(file, R_OK) == 0) continue;
    snprintf(file, sizeof file, "%s/%s", path, files[i]);
    if (access(file, R_OK) != 0) {
      seterr(err, errlen, "checkpoint %s: missing %s (%s): not a complete moec checkpoint; use "
             "the one named by the checkpoint root's 'latest'", path, files[i], strerror(errno));
      return -1;
    }
  }
  if (ckpt_tset_open(&model, path, "model", err, errlen) != 0) goto out;
  if (check_tensor_set(&model, c, 0, err, errlen) != 0) goto out;
  if (ckpt_tset_open(&opt, path, "optimizer", err, errlen) != 0) goto out;
  if (check_tensor_set(&opt, c, 1, err, errlen) != 0) goto out;
  snprintf(file, sizeof file, "%s/config.json", path);
  if (!(cfg = ckpt_read_json(file, err, errlen))) goto out;
  if (check_config(file, cfg, c->config, err, errlen) != 0) goto out;
  snprintf(file, sizeof file, "%s/state.json", path);
  if (!(stj = ckpt_read_json(file, err, errlen))) goto out;
  const st_json *sj = st_json_get(stj, "step"), *sd = st_json_get(stj, "seed"),
                *sv = st_json_get(stj, "moec_version");
  if (!sj || sj->type != ST_JSON_INT || sj->i < 0 || !sd || sd->type != ST_JSON_INT ||
      !sv || sv->type != ST_JSON_STR) {
    seterr(err, errlen, "%s: \"step\" (integer >= 0), \"seed\" (integer) or \"moec_version\" "
           "(string) missing or of the wrong type", file);
    goto out;
  }
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  int64_t dir_step = parse_step_name(base);
  if (dir_step >= 0 && dir_step != sj->i) {
    seterr(err, errlen, "%s: step is %lld but the directory is %s: files from different "
           "checkpoints were mixed", file, (long long)sj->i, base);
    goto out;
  }
  if (c->check_only) {
    rc = 0;
    goto out;
  }
  /* everything checks out: copy (a stored tensor through one buffer) */
  int64_t most = 0, total = 0, done = 0;
  for (size_t i = 0; i < c->n_params; i++) {
    if (c->params[i].store && numel_of(&c->params[i]) > most) most = numel_of(&c->params[i]);
    total += numel_of(&c->params[i]) * (wants_moments(&c->params[i]) ? 3 : 1);
  }
  float *buf = most ? malloc((size_t)most * sizeof *buf) : NULL;
  if (most && !buf) {
    seterr(err, errlen, "checkpoint %s: out of host memory for a tensor of %lld values", path, (long long)most);
    goto out;
  }
  for (size_t i = 0; i < c->n_params; i++) {
    const ckpt_param *p = &c->params[i];
    char nm[1024];
    int bad = load_tensor(&model, p, 0, p->name, buf, err, errlen);
    for (int k = 1; k <= 2 && !bad && wants_moments(p); k++) { /* whole, or its ZeRO shards assembled */
      snprintf(nm, sizeof nm, "%s.%s", p->name, k == 1 ? "exp_avg" : "exp_avg_sq");
      bad = load_tensor(&opt, p, k, nm, buf, err, errlen);
    }
    if (bad) {
      free(buf);
      goto out;
    }
    done += numel_of(p) * (wants_moments(p) ? 3 : 1);
    if (c->progress) c->progress(c->progress_ctx, done, total);
  }
  free(buf);
  if (state) {
    state->step = sj->i;
    state->seed = sd->i;
    snprintf(state->moec_version, sizeof state->moec_version, "%s", sv->s);
    state->json = stj;
    stj = NULL;
  }
  rc = 0;
out:
  ckpt_tset_close(&model);
  ckpt_tset_close(&opt);
  st_json_free(cfg);
  st_json_free(stj);
  return rc;
}
