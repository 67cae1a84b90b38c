/* hold_memory SIZE: a job that holds GPU memory until told to stop. It
 * allocates SIZE bytes ("8MiB", "1.5GB"...) with zico_malloc on device 0,
 * fills them, prints "ready", then marks an iteration every 50 ms (where
 * zico-umctl suspend takes effect) and checks after each that its data is
 * intact, until its standard input closes or a signal ends it. It prints
 * "total BYTES" (zico_mem_get_info's total) at the start and whenever that
 * changes. With
 * ZICO_SOCKET naming a running zico-umd the memory is borrowed from the
 * daemon, which is what umctl_node_test.sh looks at. Runs on the sim backend
 * only: it touches device memory from the host. Exit status: 0, 1 if the
 * allocation failed or the data changed, 2 for bad usage. */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "zicoum/zicoum.h"

enum { kMarkIntervalMs = 50, kPattern = 0x5a };

static int intact(const unsigned char* bytes, size_t size) {
  for (size_t i = 0; i < size; ++i) {
    if (bytes[i] != kPattern) return 0;
  }
  return 1;
}

int main(int argc, char** argv) {
  uint64_t size = 0;
  if (argc != 2 || zico_parse_size(argv[1], &size) != ZICO_OK || size == 0) {
    fprintf(stderr, "usage: hold_memory SIZE (e.g. 8MiB)\n");
    return 2;
  }
  void* ptr = NULL;
  const zico_status_t status = zico_malloc(&ptr, (size_t)size, 0, NULL);
  if (status != ZICO_OK) {
    fprintf(stderr, "hold_memory: zico_malloc(%s): %s: %s\n", argv[1], zico_status_string(status), zico_last_error());
    return 1;
  }
  memset(ptr, kPattern, (size_t)size);
  printf("ready\n");
  size_t total_seen = 0;
  for (;;) {
    size_t free_bytes = 0, total = 0;
    if (zico_mem_get_info(0, &free_bytes, &total) == ZICO_OK && total != total_seen) {
      printf("total %zu\n", total);
      total_seen = total;
    }
    fflush(stdout);
    struct pollfd input = {STDIN_FILENO, POLLIN, 0};
    if (poll(&input, 1, kMarkIntervalMs) > 0) {
      char buffer[256];
      if (read(STDIN_FILENO, buffer, sizeof buffer) <= 0) break;
    }
    zico_mark_iteration(); /* a suspended job waits in here until it is resumed */
    if (!intact(ptr, (size_t)size)) {
      fprintf(stderr, "hold_memory: the data changed\n");
      return 1;
    }
  }
  zico_free(ptr, NULL);
  return 0;
}
