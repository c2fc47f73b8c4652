/* check.h -- the assertion the unit tests share: CHECK(cond, fmt, ...) counts a failure and
 * says where and why, without stopping the test; main returns failures != 0. */
#ifndef MOEC_TEST_CHECK_H
#define MOEC_TEST_CHECK_H

#include <stdio.h>

static int failures;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      failures++;                                          \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fputc('\n', stderr);                                 \
    }                                                      \
  } while (0)

#endif
