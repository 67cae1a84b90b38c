/* Four threads race on the C API from the very first call (runtime creation
 * included): allocations on their own streams and the default stream, frees
 * on either, blocks used on a second stream (zico_record_stream), stats,
 * iteration marks and cache trims, under a tight budget.
 * Every block's first and last byte are checked before it is freed; at the
 * end nothing is allocated and the budget was never exceeded. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "zicoum/zicoum.h"

enum { kThreads = 4, kSlots = 64, kOps = 4000 };

struct Slot {
  unsigned char* ptr;
  size_t bytes;
  unsigned char tag;
};

static int g_failures = 0;
static pthread_mutex_t g_failure_lock = PTHREAD_MUTEX_INITIALIZER;

static void fail(const char* what) {
  pthread_mutex_lock(&g_failure_lock);
  if (g_failures++ < 5) fprintf(stderr, "FAIL: %s (%s)\n", what, zico_last_error());
  pthread_mutex_unlock(&g_failure_lock);
}

static void* worker(void* arg) {
  const uintptr_t id = (uintptr_t)arg;
  void* own_stream = (void*)(0x1000 + id);
  struct Slot slots[kSlots] = {{0}};
  uint64_t rng = 0x9e3779b97f4a7c15ULL * (id + 1);
  for (int op = 0; op < kOps; ++op) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    struct Slot* s = &slots[rng % kSlots];
    void* stream = (rng >> 20) % 2 ? own_stream : NULL;
    if (s->ptr != NULL) {
      if (s->ptr[0] != s->tag || s->ptr[s->bytes - 1] != s->tag) fail("a block lost its data");
      if (zico_free(s->ptr, stream) != ZICO_OK) fail("zico_free");
      s->ptr = NULL;
    } else {
      s->bytes = 256 + (size_t)((rng >> 8) % (3u << 20));
      const zico_status_t status = zico_malloc((void**)&s->ptr, s->bytes, 0, stream);
      if (status == ZICO_OK) {
        s->tag = (unsigned char)(rng >> 40);
        s->ptr[0] = s->tag;
        s->ptr[s->bytes - 1] = s->tag;
        void* reader = (void*)(0x2000 + id);  /* another stream reads it */
        if ((rng >> 30) % 4 == 0 && zico_record_stream(s->ptr, reader) != ZICO_OK) fail("zico_record_stream");
      } else if (status != ZICO_ERROR_OUT_OF_MEMORY) {
        fail("zico_malloc returned an unexpected status");
      }
    }
    if (op % 500 == 0) {
      zico_stats_t stats = {sizeof stats};
      if (zico_get_stats(0, &stats) != ZICO_OK || stats.peak_mapped_bytes > stats.budget_bytes) fail("stats");
      if (zico_mark_iteration() != ZICO_OK) fail("zico_mark_iteration");
    }
    if (op % 1500 == 0 && zico_empty_cache(0) != ZICO_OK) fail("zico_empty_cache");
  }
  for (int k = 0; k < kSlots; ++k) {
    if (slots[k].ptr != NULL && zico_free(slots[k].ptr, NULL) != ZICO_OK) fail("final zico_free");
  }
  return NULL;
}

int main(void) {
  pthread_t threads[kThreads];
  for (uintptr_t i = 0; i < kThreads; ++i) pthread_create(&threads[i], NULL, worker, (void*)i);
  for (int i = 0; i < kThreads; ++i) pthread_join(threads[i], NULL);
  zico_stats_t stats = {sizeof stats};
  if (zico_get_stats(0, &stats) != ZICO_OK) fail("final stats");
  if (stats.allocated_bytes != 0) fail("memory still allocated after every block was freed");
  if (stats.peak_mapped_bytes > stats.budget_bytes) fail("the budget was exceeded");
  printf("%llu allocations, %llu refused, peak mapped %llu of %llu bytes\n",
         (unsigned long long)stats.allocations, (unsigned long long)stats.failed_allocations,
         (unsigned long long)stats.peak_mapped_bytes, (unsigned long long)stats.budget_bytes);
  printf("%d passed, %d failed\n", g_failures == 0 ? 1 : 0, g_failures == 0 ? 0 : 1);
  return g_failures == 0 ? 0 : 1;
}
