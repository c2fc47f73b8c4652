/* diag.c -- the diagnostics engine: message lines, quoted source with a caret, the error
 * limit, and "did you mean" suggestions. */
#include "diag.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SHOW_MAX 160 /* a longer line is clipped to a window of about this many columns */
#define SHOW_LEAD 60 /* columns kept before the caret in a clipped window */

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) {
    fputs("moec: error: out of memory\n", stderr);
    exit(1);
  }
  return q;
}

void diag_init(diag_engine *d, FILE *out) {
  memset(d, 0, sizeof *d);
  d->out = out ? out : stderr;
  d->max_errors = DIAG_MAX_ERRORS;
}

void diag_free(diag_engine *d) {
  for (int i = 0; i < d->n_files; i++) {
    free(d->files[i]->path);
    free(d->files[i]->text);
    free(d->files[i]->lines);
    free(d->files[i]);
  }
  free(d->files);
  d->files = NULL;
  d->n_files = d->cap_files = 0;
}

diag_file *diag_add_file(diag_engine *d, const char *path, char *text, size_t len, int plain) {
  diag_file *f = xrealloc(NULL, sizeof *f);
  memset(f, 0, sizeof *f);
  size_t pl = strlen(path) + 1;
  f->path = xrealloc(NULL, pl);
  memcpy(f->path, path, pl);
  f->text = text;
  f->len = len;
  f->plain = plain;
  if (d->n_files == d->cap_files) {
    d->cap_files = d->cap_files ? 2 * d->cap_files : 8;
    d->files = xrealloc(d->files, (size_t)d->cap_files * sizeof *d->files);
  }
  d->files[d->n_files++] = f;
  return f;
}

diag_span diag_span_make(const diag_file *f, int line, int col, int end_col) {
  diag_span s = {f, line, col, line, end_col > col ? end_col : col + 1};
  return s;
}

diag_span diag_span_join(diag_span a, diag_span b) {
  if (!a.file) return b;
  if (!b.file || a.file != b.file) return a;
  diag_span s = a;
  if (b.line < s.line || (b.line == s.line && b.col < s.col)) {
    s.line = b.line;
    s.col = b.col;
  }
  if (b.end_line > s.end_line || (b.end_line == s.end_line && b.end_col > s.end_col)) {
    s.end_line = b.end_line;
    s.end_col = b.end_col;
  }
  return s;
}

int diag_utf8_len(const unsigned char *p, size_t n) {
  if (n == 0) return 0;
  unsigned c = p[0];
  if (c < 0x80) return 1;
  int len;
  unsigned min;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) len = 2, min = 0x80, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF) len = 3, min = 0x800, cp = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4) len = 4, min = 0x10000, cp = c & 0x07;
  else return 0;
  if (n < (size_t)len) return 0;
  for (int i = 1; i < len; i++) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (p[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

/* Finds line `line` (1-based) of a text: its start and length without the newline. */
static int find_line(const char *text, size_t len, int line, const char **start, size_t *n) {
  const char *p = text, *end = text + len;
  for (int l = 1; l < line; l++) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) return -1;
    p = nl + 1;
  }
  const char *nl = memchr(p, '\n', (size_t)(end - p));
  *start = p;
  *n = (size_t)((nl ? nl : end) - p);
  if (*n && p[*n - 1] == '\r') (*n)--;
  return 0;
}

/* Prints one displayed character of s (at most n bytes); returns the bytes it used. */
static size_t put_char(FILE *out, const unsigned char *s, size_t n) {
  int k = diag_utf8_len(s, n);
  if (k > 1) {
    fwrite(s, 1, (size_t)k, out);
    return (size_t)k;
  }
  if (k == 1 && s[0] >= 0x20 && s[0] < 0x7F) fputc(s[0], out);
  else if (k == 1 && s[0] == '\t') fputc(' ', out);
  else fputc('?', out);
  return 1;
}

/* Quotes a line with a gutter, and (when c0 >= 0) a caret line under bytes [c0, c1). */
static void show_line(FILE *out, int lineno, const char *line, size_t n, long c0, long c1) {
  const unsigned char *s = (const unsigned char *)line;
  size_t ws = 0, we = n;
  if (n > SHOW_MAX) {
    size_t at = c0 < 0 ? 0 : (size_t)c0 > n ? n : (size_t)c0;
    ws = at > SHOW_LEAD ? at - SHOW_LEAD : 0;
    while (ws > 0 && ws < n && (s[ws] & 0xC0) == 0x80) ws++;
    we = ws + SHOW_MAX < n ? ws + SHOW_MAX : n;
    while (we < n && (s[we] & 0xC0) == 0x80) we++;
  }
  fprintf(out, "%5d | %s", lineno, ws > 0 ? "..." : "");
  long before = 0, under = 0; /* displayed columns before the caret, and under it */
  for (size_t i = ws; i < we;) {
    size_t k = put_char(out, s + i, we - i);
    if ((long)i < c0) before++;
    else if ((long)i < c1) under++;
    i += k;
  }
  fprintf(out, "%s\n", we < n ? "..." : "");
  if (c0 < 0) return;
  if (c0 >= (long)we) {
    /* past the end of the window: the end of the line (or a clipped tail) */
    if (we < n) before += 3;
    under = 1;
  }
  if (under < 1) under = 1;
  fputs("      | ", out);
  for (long i = 0; i < before + (ws > 0 ? 3 : 0); i++) fputc(' ', out);
  fputc('^', out);
  for (long i = 1; i < under; i++) fputc('~', out);
  fputc('\n', out);
}

/* The message line and the quoted source of a diagnostic at a span of a loaded file. */
static void emit(diag_engine *d, const char *kind, diag_span at, const char *fmt, va_list ap) {
  FILE *out = d->out;
  const diag_file *f = at.file;
  if (!f) {
    fprintf(out, "moec: %s: ", kind);
  } else if (f->plain || at.line <= 0) {
    fprintf(out, "%s: %s: ", f->path, kind);
  } else {
    fprintf(out, "%s:%d:%d: %s: ", f->path, at.line, at.col, kind);
  }
  vfprintf(out, fmt, ap);
  fputc('\n', out);
  if (!f || f->plain || at.line <= 0) return;
  const char *start;
  size_t n;
  if (find_line(f->text, f->len, at.line, &start, &n) != 0) return;
  long c0 = at.col - 1, c1 = at.end_line > at.line ? (long)n : at.end_col - 1;
  if (c1 <= c0) c1 = c0 + 1;
  show_line(out, at.line, start, n, c0, c1);
}

void diag_verror(diag_engine *d, diag_span at, const char *fmt, va_list ap) {
  if (d->stopped) {
    d->muted = 1;
    return;
  }
  if (d->errors >= d->max_errors) {
    d->stopped = 1;
    d->muted = 1;
    const char *where = at.file ? at.file->path : "moec";
    fprintf(d->out, "%s: error: too many errors (more than %d), stopping\n", where, d->max_errors);
    return;
  }
  d->muted = 0;
  d->errors++;
  emit(d, "error", at, fmt, ap);
}

void diag_error(diag_engine *d, diag_span at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_verror(d, at, fmt, ap);
  va_end(ap);
}

void diag_note(diag_engine *d, diag_span at, const char *fmt, ...) {
  if (d->muted) return;
  va_list ap;
  va_start(ap, fmt);
  emit(d, "note", at, fmt, ap);
  va_end(ap);
}

void diag_error_at(diag_engine *d, const char *where, const char *fmt, ...) {
  diag_file tmp = {(char *)where, (char *)"", 0, 1, NULL, 0};
  diag_span at = {&tmp, 0, 0, 0, 0};
  va_list ap;
  va_start(ap, fmt);
  diag_verror(d, at, fmt, ap);
  va_end(ap);
}

void diag_vprint(FILE *out, const char *kind, const char *path, int line, int col, int end_col,
                 const char *fmt, va_list ap) {
  if (line <= 0) fprintf(out, "%s: %s: ", path, kind);
  else if (col <= 0) fprintf(out, "%s:%d: %s: ", path, line, kind);
  else fprintf(out, "%s:%d:%d: %s: ", path, line, col, kind);
  vfprintf(out, fmt, ap);
  fputc('\n', out);
  if (line <= 0) return;
  /* Read only as far as the line needs: the file may be a large FASTA. */
  FILE *f = fopen(path, "rb");
  if (!f) return;
  char *buf = NULL;
  size_t len = 0, cap = 0;
  int nl = 0, c;
  while ((c = fgetc(f)) != EOF) {
    if (len + 1 >= cap) {
      cap = cap ? 2 * cap : 4096;
      buf = xrealloc(buf, cap);
    }
    buf[len++] = (char)c;
    if (c == '\n' && ++nl >= line) break;
    if (len > ((size_t)1 << 30)) break;
  }
  fclose(f);
  const char *start;
  size_t n;
  if (buf && find_line(buf, len, line, &start, &n) == 0)
    show_line(out, line, start, n, col > 0 ? col - 1 : -1, end_col > col ? end_col - 1 : col);
  free(buf);
}

void diag_print(FILE *out, const char *kind, const char *path, int line, int col, int end_col,
                const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vprint(out, kind, path, line, col, end_col, fmt, ap);
  va_end(ap);
}

int diag_edit_distance(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  if (n > 64 || m > 64) return 1000;
  int d[65][65];
  for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= n; i++)
    for (size_t j = 1; j <= m; j++) {
      int cost = a[i - 1] != b[j - 1];
      int v = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
      if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
        v = d[i - 2][j - 2] + 1;
      d[i][j] = v;
    }
  return d[n][m];
}

const char *diag_suggest(const char *name, const char *const *cands, int n) {
  const char *best = NULL;
  int best_d = 1000;
  int len = (int)strlen(name);
  int limit = len <= 3 ? 1 : len <= 6 ? 2 : 3;
  for (int i = 0; i < n; i++) {
    if (!cands[i] || strcmp(cands[i], name) == 0) continue;
    int dist = diag_edit_distance(name, cands[i]);
    if (dist <= limit && dist < best_d && dist < (int)strlen(cands[i])) {
      best = cands[i];
      best_d = dist;
    }
  }
  return best;
}
