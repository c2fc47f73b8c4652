/* errf.h -- the error-message idiom of the runtime's C files: format into a caller's buffer
 * (err may be NULL) and return -1, so that `return errf(err, errlen, "...", ...);` reports and
 * fails in one line. */
#ifndef MOEC_ERRF_H
#define MOEC_ERRF_H

#include <stddef.h>

int errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
