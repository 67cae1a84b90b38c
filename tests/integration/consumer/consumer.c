/* Allocates under an 8 MiB budget through the installed C API. */
#include <stdio.h>
#include <string.h>

#include <zicoum/zicoum.h>

int main(void) {
  void* ptr = NULL;
  if (zico_malloc(&ptr, 4u << 20, 0, NULL) != ZICO_OK) return 1;
  memset(ptr, 1, 4u << 20);
  void* too_much = NULL;
  if (zico_malloc(&too_much, 8u << 20, 0, NULL) != ZICO_ERROR_OUT_OF_MEMORY) return 2;
  zico_stats_t stats = {.struct_size = sizeof stats};
  if (zico_get_stats(0, &stats) != ZICO_OK || stats.budget_bytes != (8u << 20)) return 3;
  if (zico_free(ptr, NULL) != ZICO_OK) return 4;
  printf("consumer OK\n");
  return 0;
}
