/* nvrtc_check.h -- what the NVRTC compile tests share: the failure counter, the LeakSanitizer
 * suppression for NVRTC's process-lifetime allocations, and the check of NVRTC's log. */
#ifndef MOEC_NVRTC_CHECK_H
#define MOEC_NVRTC_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* LeakSanitizer: NVRTC keeps process-lifetime allocations we cannot free. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libnvrtc\n"; }

static int failures;
#define FAIL(...)                                                                                  \
  do {                                                                                             \
    failures++;                                                                                    \
    printf("FAIL: ");                                                                              \
    printf(__VA_ARGS__);                                                                           \
    printf("\n");                                                                                  \
  } while (0)

enum { SPILL_LIMIT = 64 };

/* Splits NVRTC's log: ptxas spill / local-memory notes are printed (and counted against
 * SPILL_LIMIT); any other non-blank line is a warning and fails. */
static void check_nvrtc_log(const char *mod, const char *arch, const char *log) {
  const char *p = log;
  while (*p) {
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)n, p);
    const char *note = strstr(line, "ptxas warning : Local memory used") ? strstr(line, "stack frame: ")
                     : strstr(line, "ptxas warning : Registers are spilled") ? strstr(line, "function '")
                                                                           : NULL;
    if (note) {
      const char *b = strstr(line, "frame: ") ? strstr(line, "frame: ") + 7 : strstr(line, "', ") ? strstr(line, "', ") + 3 : "0";
      long bytes = strtol(b, NULL, 10);
      printf("  note: %s %s: %s\n", mod, arch, line + strlen("ptxas warning : "));
      if (bytes > SPILL_LIMIT) FAIL("%s for %s: %ld bytes of local memory or spills (limit %d)", mod, arch, bytes, SPILL_LIMIT);
    } else if (strspn(line, " \t\r") != strlen(line)) {
      FAIL("%s for %s: NVRTC warned:\n%s", mod, arch, log);
      return;
    }
    p += n + (e ? 1 : 0);
  }
}

#endif
