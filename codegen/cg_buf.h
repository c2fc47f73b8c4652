/* cg_buf.h -- a growing string for code generation. Allocation failure is sticky: the buffer
 * records it and cg_buf_take returns NULL, so generators need not check every append. */
#ifndef MOEC_CG_BUF_H
#define MOEC_CG_BUF_H

#include <stddef.h>

typedef struct {
  char *s;
  size_t len, cap;
  int oom;
} cg_buf;

void cg_buf_init(cg_buf *b);
void cg_buf_free(cg_buf *b);
void cg_puts(cg_buf *b, const char *s);
void cg_printf(cg_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends `tmpl` with every ${KEY} replaced by the value that follows KEY in the NULL-ended
 * list of key, value pairs (an unknown key is kept as written, and flagged by the test). */
void cg_subst(cg_buf *b, const char *tmpl, const char *const *kv);
/* The string (caller frees), or NULL after an allocation failure; b is left empty. */
char *cg_buf_take(cg_buf *b);

#endif
