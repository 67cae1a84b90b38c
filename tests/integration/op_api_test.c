/* zico_op_begin / zico_op_end through the C API: a bad argument is refused
 * with a reason; in VMM mode they do nothing; in UM mode (ZICO_MODE=um in the
 * environment) the op's blocks come to the GPU, within the budget, and an op
 * begun and never ended (by this thread, or by a thread that ended) does not
 * keep the next op waiting. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zicoum/zicoum.h>

#define CHECK(cond, ...)                              \
  do {                                                \
    if (!(cond)) {                                    \
      fprintf(stderr, "FAIL line %d: ", __LINE__);    \
      fprintf(stderr, __VA_ARGS__);                   \
      fprintf(stderr, "\n");                          \
      return 1;                                       \
    }                                                 \
  } while (0)

/* Begins an op on `arg`'s block and ends the thread without ending the op. */
static void* begin_and_leave(void* arg) {
  const void* used[1] = {arg};
  return (void*)(intptr_t)(zico_op_begin(10, used, 1, 1000) == ZICO_OK);
}

int main(void) {
  alarm(60); /* a hang fails the test instead of stalling the run */
  const char* mode = getenv("ZICO_MODE");
  const int um = mode != NULL && strcmp(mode, "um") == 0;
  void* blocks[3] = {NULL, NULL, NULL};
  for (int i = 0; i < 3; ++i) {
    CHECK(zico_malloc(&blocks[i], (size_t)8 << 20, 0, NULL) == ZICO_OK, "zico_malloc: %s", zico_last_error());
  }
  CHECK(zico_op_begin(1, NULL, 2, 0) == ZICO_ERROR_INVALID_VALUE, "NULL ptrs accepted");
  CHECK(strstr(zico_last_error(), "ptrs is NULL") != NULL, "unclear reason: %s", zico_last_error());
  const void* used[2] = {(const char*)blocks[0] + 100, blocks[2]}; /* any interior pointer */
  CHECK(zico_op_begin(7, used, 2, 1000) == ZICO_OK, "zico_op_begin: %s", zico_last_error());
  CHECK(zico_op_end() == ZICO_OK, "zico_op_end: %s", zico_last_error());
  CHECK(zico_op_end() == ZICO_OK, "a second zico_op_end is a no-op");
  CHECK(zico_op_begin(8, used, 1, 1000) == ZICO_OK, "zico_op_begin: %s", zico_last_error());
  CHECK(zico_op_begin(9, used + 1, 1, 1000) == ZICO_OK, "a second zico_op_begin: %s", zico_last_error());
  CHECK(zico_op_end() == ZICO_OK, "zico_op_end after two begins: %s", zico_last_error());
  pthread_t thread;
  void* begun = NULL;
  CHECK(pthread_create(&thread, NULL, begin_and_leave, blocks[1]) == 0, "pthread_create");
  CHECK(pthread_join(thread, &begun) == 0 && begun != NULL, "the other thread's zico_op_begin failed");
  CHECK(zico_op_begin(11, used, 1, 1000) == ZICO_OK, "zico_op_begin after a thread left its op: %s",
        zico_last_error());
  CHECK(zico_op_end() == ZICO_OK, "zico_op_end: %s", zico_last_error());
  zico_stats_t stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  CHECK(zico_get_stats(0, &stats) == ZICO_OK, "zico_get_stats");
  if (um) {
    CHECK(stats.resident_bytes >= (uint64_t)16 << 20, "the op's 16 MiB are not on the GPU: %llu",
          (unsigned long long)stats.resident_bytes);
    CHECK(stats.resident_bytes <= stats.peak_resident_bytes, "peak below current");
    CHECK(stats.modelled_ns >= 1000, "the simulated op did not run: %llu", (unsigned long long)stats.modelled_ns);
  } else {
    CHECK(stats.resident_bytes == 0 && stats.faulted_pages == 0, "VMM mode reports paging");
  }
  for (int i = 0; i < 3; ++i) CHECK(zico_free(blocks[i], NULL) == ZICO_OK, "zico_free");
  printf("OK\n");
  return 0;
}
