/* hash.h -- the two hashes moec uses: splitmix64's mixer (seeded streams: weight init, data
 * order) and FNV-1a (names, cache keys, "did this pass change the IR"). */
#ifndef MOEC_HASH_H
#define MOEC_HASH_H

#include <stddef.h>
#include <stdint.h>

#define HASH_GOLDEN 0x9E3779B97F4A7C15ull
#define HASH_FNV_INIT 1469598103934665603ull

/* splitmix64 output for state z (the stream's next state is z + HASH_GOLDEN). */
static inline uint64_t hash_mix64(uint64_t z) {
  z += HASH_GOLDEN;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* One FNV-1a step: folds v into h. */
static inline uint64_t hash_fnv(uint64_t h, uint64_t v) { return (h ^ v) * 1099511628211ull; }

static inline uint64_t hash_str(const char *s) {
  uint64_t h = HASH_FNV_INIT;
  for (; *s; s++) h = hash_fnv(h, (unsigned char)*s);
  return h;
}

#endif
