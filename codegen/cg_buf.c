/* cg_buf.c -- the code generators' string builder. */
#include "cg_buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cg_buf_init(cg_buf *b) { memset(b, 0, sizeof *b); }

void cg_buf_free(cg_buf *b) {
  free(b->s);
  memset(b, 0, sizeof *b);
}

static int reserve(cg_buf *b, size_t extra) {
  if (b->oom) return -1;
  if (b->len + extra + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + extra + 1) cap *= 2;
  char *s = realloc(b->s, cap);
  if (!s) {
    b->oom = 1;
    return -1;
  }
  b->s = s;
  b->cap = cap;
  return 0;
}

static void append(cg_buf *b, const char *s, size_t n) {
  if (reserve(b, n)) return;
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = '\0';
}

void cg_puts(cg_buf *b, const char *s) { append(b, s, strlen(s)); }

void cg_printf(cg_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || reserve(b, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

void cg_subst(cg_buf *b, const char *t, const char *const *kv) {
  while (*t) {
    const char *d = strstr(t, "${");
    if (!d) {
      cg_puts(b, t);
      return;
    }
    append(b, t, (size_t)(d - t));
    const char *end = strchr(d, '}');
    const char *val = NULL;
    if (end)
      for (int i = 0; kv[i]; i += 2)
        if (strlen(kv[i]) == (size_t)(end - d - 2) && strncmp(kv[i], d + 2, (size_t)(end - d - 2)) == 0) val = kv[i + 1];
    if (val) {
      cg_puts(b, val);
      t = end + 1;
    } else {
      append(b, d, 2);
      t = d + 2;
    }
  }
}

char *cg_buf_take(cg_buf *b) {
  char *s = b->oom ? NULL : b->s;
  if (b->oom) free(b->s);
  if (s == NULL && !b->oom) s = calloc(1, 1);
  memset(b, 0, sizeof *b);
  return s;
}
