/* bundle.h -- `moec compile`: a training executable is a copy of moec with the model's
 * source files and its --set values appended, behind a trailer that moec looks for at start. */
#ifndef MOEC_BUNDLE_H
#define MOEC_BUNDLE_H

#include <stddef.h>

#include "frontend.h"

typedef struct {
  moec_sources sources; /* the main .moe file first, then its includes */
  moec_set *sets;       /* (n_sets) baked-in --set values, names and values owned */
  int n_sets;
} moec_bundle;

/* Writes the executable `out`: this program's own binary plus the bundle, atomically
 * (temporary file, fsync, rename), mode 0755. 0, or -1 with a message in err. */
int bundle_write(const char *out, const moec_bundle *b, char *err, size_t errlen);

/* Reads the bundle appended to this program's binary: 1 found, 0 none (plain moec), -1 a
 * damaged bundle (message in err). */
int bundle_read_self(moec_bundle *b, char *err, size_t errlen);

void bundle_free(moec_bundle *b);

#endif
