/* CHECK for the driver-hook probes: a failed check is printed with its line
 * and counted; the probe prints OK and exits 0 only if none failed. */
#ifndef ZICOUM_TESTS_PROBE_CHECK_H
#define ZICOUM_TESTS_PROBE_CHECK_H

#include <stdio.h>

static int failures = 0;
#define CHECK(condition, what)                                                 \
  do {                                                                         \
    if (!(condition)) {                                                        \
      fprintf(stderr, "FAIL line %d: %s (%s)\n", __LINE__, what, #condition); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

#endif
