/* sbuf.h -- a growable byte buffer for building files in memory (JSON headers, payloads).
 * Kept NUL-terminated; an allocation failure sets oom and later appends do nothing, so a
 * writer checks once at the end. */
#ifndef MOEC_SBUF_H
#define MOEC_SBUF_H

#include <stddef.h>

typedef struct {
  char *p;
  size_t n, cap;
  int oom;
} sbuf;

void sb_add(sbuf *b, const void *data, size_t n);
void sb_str(sbuf *b, const char *s);
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_quote(sbuf *b, const char *s); /* s as a JSON string literal */

#endif
