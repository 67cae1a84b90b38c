#include "real_function.h"

#include <dlfcn.h>
#include <link.h>

#include <cstring>
#include <new>
#include <string>
#include <vector>

namespace zico::real_function_detail {
namespace {

// The library that defines `name` for real: cudart for cuda* (and its
// internal __cuda*), the driver for cu*. Wheels vendor renamed copies
// (libcudart-d0da41ae.so.11.0), so the stem is followed by '.' or '-';
// "libcuda" then never matches libcudart.
const char* library_stem(const char* name) {
  while (*name == '_') ++name;
  return std::strncmp(name, "cuda", 4) == 0 ? "libcudart" : "libcuda";
}

struct LoadedLibraries {
  const char* stem;
  std::vector<std::string> paths;  // loaded objects named stem.* or stem-*
  unsigned long long adds = 0;     // objects ever loaded, to tell when to look again
};

// Only collects: the loader's lock is held here, and dlopen inside would take
// another in the opposite order from a thread that is loading a library.
int collect_library(dl_phdr_info* info, size_t, void* data) {
  auto* found = static_cast<LoadedLibraries*>(data);
  found->adds = info->dlpi_adds;
  if (found->stem == nullptr) return 1;  // only the count was wanted
  if (info->dlpi_name == nullptr || info->dlpi_name[0] == '\0') return 0;
  const char* slash = std::strrchr(info->dlpi_name, '/');
  const char* file = slash != nullptr ? slash + 1 : info->dlpi_name;
  const size_t length = std::strlen(found->stem);
  if (std::strncmp(file, found->stem, length) == 0 && (file[length] == '.' || file[length] == '-')) {
    try {
      found->paths.emplace_back(info->dlpi_name);
    } catch (const std::bad_alloc&) {
      return 1;
    }
  }
  return 0;
}

}  // namespace

unsigned long long libraries_loaded() {
  LoadedLibraries count{nullptr, {}};
  dl_iterate_phdr(collect_library, &count);
  return count.adds;
}

void* find(const char* name, unsigned long long* loaded_count) {
  void* found = dlsym(RTLD_NEXT, name);
  LoadedLibraries loaded{library_stem(name), {}};
  if (found == nullptr) dl_iterate_phdr(collect_library, &loaded);
  for (size_t i = 0; found == nullptr && i < loaded.paths.size(); ++i) {
    void* handle = dlopen(loaded.paths[i].c_str(), RTLD_NOLOAD | RTLD_LAZY);
    if (handle == nullptr) continue;
    found = dlsym(handle, name);
    if (found == nullptr) dlclose(handle);
  }
  *loaded_count = loaded.adds;
  return found;
}

}  // namespace zico::real_function_detail
