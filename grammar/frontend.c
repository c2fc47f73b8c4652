/* frontend.c -- moec_frontend_load: reads the file and its includes, checks their bytes,
 * parses them, parses the --set values, runs sema, then lowering. */
#include "frontend.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ast.h"
#include "diag.h"
#include "parser.h"
#include "sema.h"

#define FE_MAX_FILE ((size_t)16 << 20) /* largest .moe file */
#define FE_MAX_INCLUDE_DEPTH 16
#define FE_MAX_BYTE_ERRORS 5

typedef struct {
  diag_engine *d;
  ast_arena *arena;
  char *stack[FE_MAX_INCLUDE_DEPTH + 2]; /* real paths of the files being read, outermost first */
  const char *shown[FE_MAX_INCLUDE_DEPTH + 2];
  int depth;
  const moec_sources *from; /* read files from memory instead of the disk */
  moec_sources *record;     /* every file read, when not NULL */
} frontend;

/* Reads a whole file; -1 with errno set on failure. */
static int read_all(const char *path, char **text, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    errno = EISDIR;
    return -1;
  }
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap + 1);
  if (!buf) {
    close(fd);
    errno = ENOMEM;
    return -1;
  }
  for (;;) {
    if (n == cap) {
      if (cap >= FE_MAX_FILE) {
        free(buf);
        close(fd);
        errno = EFBIG;
        return -1;
      }
      cap *= 2;
      char *nb = realloc(buf, cap + 1);
      if (!nb) {
        free(buf);
        close(fd);
        errno = ENOMEM;
        return -1;
      }
      buf = nb;
    }
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      free(buf);
      close(fd);
      errno = e;
      return -1;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  close(fd);
  buf[n] = 0;
  *text = buf;
  *len = n;
  return 0;
}

void moec_sources_free(moec_sources *s) {
  for (int i = 0; i < s->n; i++) {
    free(s->v[i].path);
    free(s->v[i].text);
  }
  free(s->v);
  memset(s, 0, sizeof *s);
}

int moec_sources_add(moec_sources *s, const char *path, const char *text, size_t len) {
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 8;
    moec_source *v = realloc(s->v, (size_t)cap * sizeof *v);
    if (!v) return -1;
    s->v = v;
    s->cap = cap;
  }
  moec_source *e = &s->v[s->n];
  e->path = strdup(path);
  e->text = malloc(len + 1);
  if (!e->path || !e->text) {
    free(e->path);
    free(e->text);
    return -1;
  }
  memcpy(e->text, text, len);
  e->text[len] = 0;
  e->len = len;
  s->n++;
  return 0;
}

/* Reads a file from the in-memory sources or the disk, recording it if asked. */
static int read_source(frontend *fe, const char *path, char **text, size_t *len) {
  if (fe->from) {
    const moec_source *hit = NULL;
    for (int i = 0; i < fe->from->n && !hit; i++)
      if (strcmp(fe->from->v[i].path, path) == 0) hit = &fe->from->v[i];
    if (!hit || !(*text = malloc(hit->len + 1))) {
      errno = hit ? ENOMEM : ENOENT;
      return -1;
    }
    memcpy(*text, hit->text, hit->len + 1);
    *len = hit->len;
  } else if (read_all(path, text, len) != 0) {
    return -1;
  }
  if (fe->record && moec_sources_add(fe->record, path, *text, *len) != 0) {
    free(*text);
    errno = ENOMEM;
    return -1;
  }
  return 0;
}

/* The identity of a file for include-cycle checks: its real path (its name in memory). */
static char *file_identity(frontend *fe, const char *path) { return fe->from ? strdup(path) : realpath(path, NULL); }

/* NUL bytes and invalid UTF-8 are reported with their line, column and byte offset. */
static int check_bytes(frontend *fe, diag_file *f) {
  const unsigned char *s = (const unsigned char *)f->text;
  int line = 1, col = 1, bad = 0;
  for (size_t i = 0; i < f->len && bad < FE_MAX_BYTE_ERRORS;) {
    unsigned c = s[i];
    int k = 1;
    if (c == 0) {
      diag_error(fe->d, diag_span_make(f, line, col, col + 1), "NUL byte (at byte offset %zu); .moe files are UTF-8 text", i);
      bad++;
    } else if (c >= 0x80 && (k = diag_utf8_len(s + i, f->len - i)) == 0) {
      diag_error(fe->d, diag_span_make(f, line, col, col + 1), "invalid UTF-8 byte 0x%02X (at byte offset %zu)", c, i);
      bad++;
      k = 1;
    }
    if (c == '\n') {
      line++;
      col = 1;
    } else if (col < INT_MAX - 8) {
      col += k;
    }
    i += (size_t)k;
  }
  return bad;
}

static int only_blank(const diag_file *f) {
  for (size_t i = 0; i < f->len; i++)
    if (f->text[i] != ' ' && f->text[i] != '\t' && f->text[i] != '\n' && f->text[i] != '\r') return 0;
  return 1;
}

/* Reads, checks and parses one file, then its includes, appending the items to out. */
static int load(frontend *fe, const char *path, const diag_span *site, ast_block *out) {
  char *text;
  size_t len;
  if (read_source(fe, path, &text, &len) != 0) {
    const char *why = errno == EFBIG ? "file too large (the limit is 16 MiB)" : strerror(errno);
    if (site) diag_error(fe->d, *site, "cannot open '%s': %s", path, why);
    else diag_error_at(fe->d, path, "cannot open: %s", why);
    return -1;
  }
  diag_file *f = diag_add_file(fe->d, path, text, len, 0);
  if (!site && only_blank(f)) {
    diag_error_at(fe->d, path, "empty file, expected 'model NAME { ... }'");
    return -1;
  }
  if (check_bytes(fe, f)) return -1;
  ast_block *items = NULL;
  if (parse_source(fe->d, f, fe->arena, 0, &items, NULL) != 0 || !items) return -1;
  if (!site && items->n == 0) {
    diag_error_at(fe->d, path, "empty file, expected 'model NAME { ... }'");
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < items->n && !fe->d->stopped; i++) {
    ast_stmt *it = items->v[i];
    if (it->kind != ST_INCLUDE) {
      ast_block_push(fe->arena, out, it);
      continue;
    }
    /* include "x.moe": relative to the including file's folder */
    char sub[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (it->name[0] == '/' || !slash) snprintf(sub, sizeof sub, "%s", it->name);
    else snprintf(sub, sizeof sub, "%.*s/%s", (int)(slash - path), path, it->name);
    if (!it->name[0]) {
      diag_error(fe->d, it->name_span, "include needs a file name");
      rc = -1;
      continue;
    }
    char *real = file_identity(fe, sub);
    if (!real) {
      diag_error(fe->d, it->name_span, "cannot open '%s': %s", sub, strerror(errno));
      rc = -1;
      continue;
    }
    int cycle = -1;
    for (int k = 0; k < fe->depth; k++)
      if (strcmp(fe->stack[k], real) == 0) cycle = k;
    if (cycle >= 0) {
      char chain[1024];
      size_t n = 0;
      for (int k = cycle; k < fe->depth && n < sizeof chain; k++)
        n += (size_t)snprintf(chain + n, sizeof chain - n, "%.200s -> ", fe->shown[k]);
      if (n < sizeof chain) snprintf(chain + n, sizeof chain - n, "%.200s", sub);
      diag_error(fe->d, it->name_span, "include cycle: %s", chain);
      free(real);
      rc = -1;
      continue;
    }
    if (fe->depth >= FE_MAX_INCLUDE_DEPTH) {
      diag_error(fe->d, it->name_span, "includes nested too deeply (more than %d files)", FE_MAX_INCLUDE_DEPTH);
      free(real);
      rc = -1;
      continue;
    }
    fe->stack[fe->depth] = real;
    fe->shown[fe->depth] = sub;
    fe->depth++;
    if (load(fe, sub, &it->name_span, out) != 0) rc = -1;
    fe->depth--;
    free(real);
  }
  return rc;
}

static int valid_name(const char *s) {
  if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_')) return 0;
  return 1;
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (!p) {
    fputs("moec: error: out of memory\n", stderr);
    exit(1);
  }
  memcpy(p, s, n);
  return p;
}

/* Parses each --set value as an expression (data takes a bare path too). */
static sema_set *parse_sets(frontend *fe, const moec_set *sets, int n) {
  sema_set *out = calloc((size_t)(n > 0 ? n : 1), sizeof *out);
  if (!out) exit(1);
  for (int i = 0; i < n; i++) {
    const char *name = sets[i].name ? sets[i].name : "", *value = sets[i].value ? sets[i].value : "";
    size_t wl = strlen(name) + strlen(value) + 8;
    char *where = malloc(wl);
    if (!where) exit(1);
    snprintf(where, wl, "--set %s=%s", name, value);
    diag_file *f = diag_add_file(fe->d, where, dup_str(value), strlen(value), 1);
    free(where);
    out[i].name = name;
    out[i].file = f;
    out[i].used = 0;
    if (!valid_name(name)) {
      diag_error_at(fe->d, f->path, "'%s' is not a name (names are letters, digits and _)", name);
      out[i].used = 1;
      continue;
    }
    if (!value[0]) {
      diag_error_at(fe->d, f->path, "missing value after '='");
      continue;
    }
    if (strcmp(name, "data") == 0 && value[0] != '"') {
      ast_expr *e = ast_expr_new(fe->arena, EX_STR, diag_span_make(f, 1, 1, 2));
      e->s = ast_strndup(fe->arena, value, strlen(value));
      out[i].expr = e;
      continue;
    }
    if (check_bytes(fe, f)) continue;
    ast_expr *e = NULL;
    if (parse_source(fe->d, f, fe->arena, 1, NULL, &e) == 0) out[i].expr = e;
  }
  return out;
}

ir_graph *moec_frontend_load(const char *path, const moec_set *sets, int n_sets, FILE *diag) {
  return moec_frontend_load_ex(path, sets, n_sets, diag, NULL, NULL);
}

ir_graph *moec_frontend_load_ex(const char *path, const moec_set *sets, int n_sets, FILE *diag,
                                const moec_sources *from, moec_sources *record) {
  diag_engine d;
  diag_init(&d, diag);
  frontend fe;
  memset(&fe, 0, sizeof fe);
  fe.d = &d;
  fe.from = from;
  fe.record = record;
  fe.arena = ast_arena_new();
  ir_graph *g = NULL;
  sema_set *ss = parse_sets(&fe, sets, n_sets);
  ast_block *items = ast_alloc(fe.arena, sizeof *items);
  char *real = path ? file_identity(&fe, path) : NULL;
  if (real) {
    fe.stack[0] = real;
    fe.shown[0] = path;
    fe.depth = 1;
  }
  int rc = path ? load(&fe, path, NULL, items) : -1;
  free(real);
  if (rc == 0 && d.errors == 0 && !d.stopped) {
    sema_program prog;
    memset(&prog, 0, sizeof prog);
    if (sema_check(&d, fe.arena, items, ss, n_sets, &prog) == 0 && d.errors == 0 && prog.model)
      g = lower_program(&prog, diag ? diag : stderr);
  }
  free(ss);
  ast_arena_free(fe.arena);
  diag_free(&d);
  return g;
}
