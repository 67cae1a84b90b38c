/* fill_until_refused BLOCK: a job that allocates BLOCK-sized blocks with
 * zico_malloc on device 0 and writes every byte of each, until zicoum says
 * no. What a runaway job does to a host whose simulated GPU memory (or UM
 * mode's unified memory) is host memory: zicoum must refuse it cleanly,
 * with the numbers, before the kernel's OOM killer ends anything. Runs on
 * the sim backend only (it writes device memory from the host); run it in a
 * memory cgroup (tests/lib/in_memory_cgroup.sh), never bare.
 * Prints "refused after N MiB: STATUS: WHY". Exit status: 0 when the refusal
 * is an out-of-memory, 1 for any other error, 2 for bad usage. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "zicoum/zicoum.h"

int main(int argc, char** argv) {
  uint64_t block = 0;
  if (argc != 2 || zico_parse_size(argv[1], &block) != ZICO_OK || block == 0) {
    fprintf(stderr, "usage: fill_until_refused BLOCK (e.g. 64MiB)\n");
    return 2;
  }
  uint64_t filled = 0;
  for (;;) {
    void* ptr = NULL;
    const zico_status_t status = zico_malloc(&ptr, (size_t)block, 0, NULL);
    if (status != ZICO_OK) {
      printf("refused after %llu MiB: %s: %s\n", (unsigned long long)(filled >> 20), zico_status_string(status),
             zico_last_error());
      return status == ZICO_ERROR_OUT_OF_MEMORY ? 0 : 1;
    }
    memset(ptr, 0x5a, (size_t)block);  /* the pages cost the host only once written */
    filled += block;
  }
}
