/* sbuf.c -- the growable byte buffer. */
#include "sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

void sb_add(sbuf *b, const void *data, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 256;
    while (b->n + n + 1 > nc) nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = nc;
  }
  memcpy(b->p + b->n, data, n);
  b->n += n;
  b->p[b->n] = 0;
}

void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  char *tmp = malloc((size_t)n + 1);
  if (!tmp) {
    b->oom = 1;
    return;
  }
  va_start(ap, fmt);
  vsnprintf(tmp, (size_t)n + 1, fmt, ap);
  va_end(ap);
  sb_add(b, tmp, (size_t)n);
  free(tmp);
}

void sb_quote(sbuf *b, const char *s) {
  size_t need = st_json_quote(s, NULL, 0);
  char *tmp = malloc(need + 1);
  if (!tmp) {
    b->oom = 1;
    return;
  }
  st_json_quote(s, tmp, need + 1);
  sb_add(b, tmp, need);
  free(tmp);
}
