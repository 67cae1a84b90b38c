/* A stand-in for libcupti (SONAME libcupti.so.13) with the entry points
 * CuptiFaults uses, for tests on machines without a GPU. Records are queued
 * by the test (fake_cupti_*), each in a fixed 128-byte slot laid out as
 * CUPTI lays the fields CuptiFaults reads, and handed over through the
 * registered buffer callbacks at the next cuptiActivityFlushAll. */
#include <stdint.h>
#include <string.h>

typedef void (*RequestBuffer)(uint8_t** buffer, size_t* size, size_t* max_records);
typedef void (*BufferDone)(void* context, uint32_t stream, uint8_t* buffer, size_t size, size_t valid);

enum { kSlot = 128, kMaxQueued = 64, kMaxKinds = 64 };

static RequestBuffer g_request;
static BufferDone g_done;
static uint8_t g_queue[kMaxQueued][kSlot];
static int g_queued;
static int g_counter_enabled[16];  /* by unified-memory counter kind */
static int g_activity_enabled[kMaxKinds];
static int g_last_flush_flag = -1;
static int g_incomplete;  /* a record is still open: only a forced flush hands the buffer over */

int cuptiGetVersion(uint32_t* version) {
  *version = 26;
  return 0;
}

int cuptiGetResultString(int result, const char** name) {
  (void)result;
  *name = "CUPTI_ERROR_FAKE";
  return 0;
}

int cuptiActivityRegisterCallbacks(RequestBuffer request, BufferDone done) {
  g_request = request;
  g_done = done;
  return 0;
}

typedef struct {
  uint32_t scope, kind, device_id, enable;
} CounterConfig;

int cuptiActivityConfigureUnifiedMemoryCounter(CounterConfig* config, uint32_t count) {
  for (uint32_t i = 0; i < count; ++i) {
    if (config[i].kind < 16) g_counter_enabled[config[i].kind] = (int)config[i].enable;
  }
  return 0;
}

int cuptiActivityEnable(int kind) {
  if (kind >= 0 && kind < kMaxKinds) g_activity_enabled[kind] = 1;
  return 0;
}

int cuptiActivityDisable(int kind) {
  if (kind >= 0 && kind < kMaxKinds) g_activity_enabled[kind] = 0;
  return 0;
}

int cuptiActivityFlushAll(uint32_t flag) {
  g_last_flush_flag = (int)flag;
  if (g_queued == 0 || g_request == NULL || (g_incomplete && (flag & 1) == 0)) return 0;
  uint8_t* buffer = NULL;
  size_t size = 0, max_records = 0;
  g_request(&buffer, &size, &max_records);
  if (buffer == NULL || size < (size_t)g_queued * kSlot) return 1;
  memcpy(buffer, g_queue, (size_t)g_queued * kSlot);
  const size_t valid = (size_t)g_queued * kSlot;
  g_queued = 0;
  g_done(NULL, 0, buffer, size, valid);
  return 0;
}

int cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid, void** record) {
  uint8_t* next = *record == NULL ? buffer : (uint8_t*)*record + kSlot;
  if (next + kSlot > buffer + valid) return 12; /* CUPTI_ERROR_MAX_LIMIT_REACHED */
  *record = next;
  return 0;
}

int cuptiActivityPushExternalCorrelationId(int kind, uint64_t id) {
  (void)kind;
  (void)id;
  return 0;
}

int cuptiActivityPopExternalCorrelationId(int kind, uint64_t* id) {
  (void)kind;
  *id = 0;
  return 0;
}

/* --- the test's controls ------------------------------------------------- */

static uint8_t* queue_slot(int32_t kind) {
  if (g_queued == kMaxQueued) return NULL;
  uint8_t* slot = g_queue[g_queued++];
  memset(slot, 0, kSlot);
  memcpy(slot, &kind, sizeof kind);
  return slot;
}

/* CUpti_ActivityKernel*: start at 16, end at 24, correlationId at 92. */
void fake_cupti_kernel(uint32_t correlation_id, uint64_t start, uint64_t end) {
  uint8_t* slot = queue_slot(10);
  if (slot == NULL) return;
  memcpy(slot + 16, &start, sizeof start);
  memcpy(slot + 24, &end, sizeof end);
  memcpy(slot + 92, &correlation_id, sizeof correlation_id);
}

/* CUpti_ActivityUnifiedMemoryCounter3: counterKind at 4, start at 16,
 * address at 32, flags (a transfer's migration cause) at 56. */
void fake_cupti_unified_memory(uint32_t counter_kind, uint64_t start, uint64_t address, uint32_t flags) {
  uint8_t* slot = queue_slot(25);
  if (slot == NULL) return;
  memcpy(slot + 4, &counter_kind, sizeof counter_kind);
  memcpy(slot + 16, &start, sizeof start);
  memcpy(slot + 32, &address, sizeof address);
  memcpy(slot + 56, &flags, sizeof flags);
}

/* CUpti_ActivityExternalCorrelation: externalKind at 4, externalId at 8,
 * correlationId at 16. */
void fake_cupti_tag(uint32_t external_kind, uint64_t external_id, uint32_t correlation_id) {
  uint8_t* slot = queue_slot(39);
  if (slot == NULL) return;
  memcpy(slot + 4, &external_kind, sizeof external_kind);
  memcpy(slot + 8, &external_id, sizeof external_id);
  memcpy(slot + 16, &correlation_id, sizeof correlation_id);
}

int fake_cupti_counter_enabled(uint32_t counter_kind) { return counter_kind < 16 ? g_counter_enabled[counter_kind] : 0; }
int fake_cupti_activity_enabled(int kind) { return kind >= 0 && kind < kMaxKinds ? g_activity_enabled[kind] : 0; }
int fake_cupti_last_flush_flag(void) { return g_last_flush_flag; }
void fake_cupti_set_incomplete(int incomplete) { g_incomplete = incomplete; }
