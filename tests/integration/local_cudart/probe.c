/* Loads the shim with RTLD_LOCAL or RTLD_GLOBAL and prints what three CUDA
 * calls made from inside it returned:
 *   local_cudart_probe SHIM local|global
 * Under LD_PRELOAD=libzicoum.so both modes must print the same: the real
 * cudart answers the calls zicoum passes on, wherever it was loaded. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: local_cudart_probe SHIM local|global\n");
    return 64;
  }
  const int mode = strcmp(argv[2], "global") == 0 ? RTLD_GLOBAL : RTLD_LOCAL;
  void* shim = dlopen(argv[1], RTLD_NOW | mode);
  if (shim == NULL) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  int (*calls[3])(void);
  const char* names[3] = {"shim_stream_destroy", "shim_free_foreign", "shim_free_null"};
  for (int i = 0; i < 3; ++i) {
    *(void**)&calls[i] = dlsym(shim, names[i]);
    if (calls[i] == NULL) {
      fprintf(stderr, "dlsym %s: %s\n", names[i], dlerror());
      return 1;
    }
  }
  /* Twice: a lookup that failed once must not be remembered. */
  for (int round = 0; round < 2; ++round) {
    printf("%s=%d %s=%d %s=%d\n", names[0], calls[0](), names[1], calls[1](), names[2], calls[2]());
  }
  return 0;
}
