/* diag.h -- moec's diagnostics: "FILE:LINE:COL: error: MESSAGE", the source line, and a
 * caret under the offending range, chibicc/clang style:
 *
 *   tiny.moe:14:20: error: unknown name 'hiden'; did you mean 'hidden'?
 *      14 |   x = embedding(tokens, vocab, hiden)
 *         |                                ^~~~~
 *   tiny.moe:3:3: note: 'hidden' defined here
 *       3 |   hidden = 128
 *         |   ^~~~~~
 *
 * Lines are shown sanitised (control bytes and invalid UTF-8 become '?', tabs a space) and
 * very long lines are clipped to a window around the column. Columns count bytes, from 1.
 *
 * Two interfaces: the engine (diag_engine) the front end uses, which owns the source text
 * of every file it reports on and stops after max_errors; and diag_print, for the driver,
 * the data loader and anyone else who wants an error to look the same.
 */
#ifndef MOEC_DIAG_H
#define MOEC_DIAG_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#define DIAG_FMT(a, b) __attribute__((format(printf, a, b)))

/* A source the engine can quote: a .moe file, or a command-line value (--set NAME=VALUE),
 * which is "plain": its messages read "--set NAME=VALUE: error: ..." without line or column. */
typedef struct diag_file {
  char *path; /* as shown in messages */
  char *text; /* the bytes, NUL-terminated (and possibly with NULs inside) */
  size_t len;
  int plain;
  size_t *lines; /* (n_lines) byte offset of each line start, built on first use */
  int n_lines;
} diag_file;

/* A range of source: first byte (line, col) to end (end_line, end_col exclusive). */
typedef struct diag_span {
  const diag_file *file;
  int line, col;
  int end_line, end_col;
} diag_span;

typedef struct diag_engine {
  FILE *out;
  int errors;     /* errors printed */
  int max_errors; /* after this many, one "too many errors" line and silence */
  int stopped;    /* the limit was hit: callers should wind down */
  int muted;      /* the last error was not printed, so neither are its notes */
  diag_file **files;
  int n_files, cap_files;
} diag_engine;

#define DIAG_MAX_ERRORS 20

void diag_init(diag_engine *d, FILE *out);
void diag_free(diag_engine *d); /* frees every file it owns */

/* Registers a source; the engine takes ownership of text (malloc'ed, len bytes + a NUL). */
diag_file *diag_add_file(diag_engine *d, const char *path, char *text, size_t len, int plain);

/* Reports at a span (span.file NULL: no location). */
void diag_error(diag_engine *d, diag_span at, const char *fmt, ...) DIAG_FMT(3, 4);
void diag_verror(diag_engine *d, diag_span at, const char *fmt, va_list ap);
void diag_note(diag_engine *d, diag_span at, const char *fmt, ...) DIAG_FMT(3, 4);
/* "WHERE: error: MESSAGE" -- a whole file, or a command-line argument. */
void diag_error_at(diag_engine *d, const char *where, const char *fmt, ...) DIAG_FMT(3, 4);

/* A span from 1-based line and columns of f (end_col exclusive). */
diag_span diag_span_make(const diag_file *f, int line, int col, int end_col);
/* The smallest span covering a and b (same file). */
diag_span diag_span_join(diag_span a, diag_span b);

/* For the rest of moec. Prints "PATH:LINE:COL: KIND: MESSAGE\n" followed by the source line
 * and a caret under columns [col, end_col) -- reading PATH to find the line -- so that every
 * error of moec looks alike. kind is "error", "warning" or "note". line <= 0 prints just
 * "PATH: KIND: MESSAGE"; col <= 0 prints "PATH:LINE: KIND: MESSAGE" and the line without a
 * caret; end_col <= col underlines one column. */
void diag_print(FILE *out, const char *kind, const char *path, int line, int col, int end_col,
                const char *fmt, ...) DIAG_FMT(7, 8);
void diag_vprint(FILE *out, const char *kind, const char *path, int line, int col, int end_col,
                 const char *fmt, va_list ap);

/* Length of the valid UTF-8 sequence at p (1-4; ASCII is 1), or 0 when the bytes there
 * are not valid UTF-8 (overlong forms, surrogates and code points past U+10FFFF included). */
int diag_utf8_len(const unsigned char *p, size_t n);

/* Edit distance (optimal string alignment) between a and b, for "did you mean". */
int diag_edit_distance(const char *a, const char *b);
/* The candidate closest to name, or NULL if none is close enough to suggest. */
const char *diag_suggest(const char *name, const char *const *cands, int n);

#endif
