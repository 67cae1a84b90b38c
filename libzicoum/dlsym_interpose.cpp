// dlsym, for libraries that carry the CUDA runtime inside them (cuBLAS,
// cuDNN and most of NVIDIA's libraries link it statically). Such a runtime
// opens libcuda itself and asks `dlsym(handle, "cuGetProcAddress_v2")` for
// the driver's lookup, then takes every driver function from it: LD_PRELOAD
// reaches none of them, so their workspaces are outside the budget and, in UM
// mode, their kernels go unseen (their pages fault in behind the pager's
// count). With ZICO_STATIC_RUNTIMES=on such a lookup on the driver gets
// libzicoum's cuGetProcAddress instead (driver_entry_points.cpp), which swaps
// the memory calls and launches it hands out as for any other caller.
//
// The dynamic loader answers RTLD_NEXT and RTLD_DEFAULT relative to the
// object that calls dlsym: a wrapper that called the real dlsym itself would
// answer for libzicoum, not for its caller. So dlsym is a jump, not a call:
// for those two handles it jumps to the real dlsym with the caller's return
// address still on the stack; for a real handle (where the caller does not
// matter) it jumps to zico_dlsym_on_handle below. x86-64 only: elsewhere
// libzicoum defines no dlsym, and the setting does nothing.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

#include "driver_entry_points.h"

#if defined(__x86_64__) && defined(__linux__)

using Dlsym = void* (*)(void*, const char*);

// A sanitizer runtime asks dlsym for its interceptors' targets while it
// starts, before its shadow memory is in place: nothing on that path is
// instrumented, and it calls no C++ library function (an atomic's load or an
// initializer_list's begin would be a call, instrumented), only builtins.
#define ZICO_UNINSTRUMENTED __attribute__((no_sanitize("address", "undefined")))

namespace {

// glibc's own dlsym: the next definition after libzicoum (libc from 2.34 on,
// libdl before), asked with dlvsym, which libzicoum does not define, so never
// ourselves; where libzicoum comes after libc (dlopen'ed), from libc by handle.
// No dlopen first: a sanitizer runtime asks dlsym for its interceptors'
// targets before its own dlopen interceptor is ready.
ZICO_UNINSTRUMENTED Dlsym find_real_dlsym() {
  static const char* const kVersions[] = {"GLIBC_2.34", "GLIBC_2.2.5"};
  static const char* const kLibraries[] = {"libc.so.6", "libdl.so.2"};
  for (size_t i = 0; i < 2; ++i) {
    if (void* found = dlvsym(RTLD_NEXT, "dlsym", kVersions[i])) return reinterpret_cast<Dlsym>(found);
  }
  for (size_t i = 0; i < 2; ++i) {
    void* handle = dlopen(kLibraries[i], RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    void* found = dlvsym(handle, "dlsym", "GLIBC_2.34");
    if (found == nullptr) found = dlvsym(handle, "dlsym", "GLIBC_2.2.5");
    dlclose(handle);
    if (found != nullptr) return reinterpret_cast<Dlsym>(found);
  }
  return nullptr;
}

// The setting and where libzicoum is loaded, read when it is loaded: asked
// later under a guarded static, dladdr (which takes the loader's lock) could
// deadlock against a thread in dlopen whose library constructor calls dlsym.
// Until then nothing is swapped.
bool g_swap_static_runtimes = false;
void* g_libzicoum_base = nullptr;
// Unset, it is on where UM mode swaps its pages (ZICO_MODE=um,
// ZICO_UM_MEMORY=swap): a kernel there that zicoum does not see touches
// unmapped pages.
__attribute__((constructor)) void read_static_runtimes_setting() {
  const char* value = std::getenv("ZICO_STATIC_RUNTIMES");
  const char* mode = std::getenv("ZICO_MODE");
  const char* memory = std::getenv("ZICO_UM_MEMORY");
  const bool swapping = mode != nullptr && std::strcmp(mode, "um") == 0 && memory != nullptr &&
                        std::strcmp(memory, "swap") == 0;
  Dl_info self{};
  if (dladdr(reinterpret_cast<const void*>(&read_static_runtimes_setting), &self) != 0) {
    __atomic_store_n(&g_libzicoum_base, self.dli_fbase, __ATOMIC_RELEASE);
  }
  const bool on = value != nullptr ? std::strcmp(value, "on") == 0 : swapping;
  __atomic_store_n(&g_swap_static_runtimes, on, __ATOMIC_RELEASE);
}

ZICO_UNINSTRUMENTED bool swap_static_runtimes() { return __atomic_load_n(&g_swap_static_runtimes, __ATOMIC_ACQUIRE); }

// Whether `address` lies in libzicoum (its own lookups of the driver, by
// CudaDriver and RealFunction, must get the driver's functions). Before the
// base is known nothing is swapped.
ZICO_UNINSTRUMENTED bool in_libzicoum(const void* address) {
  const void* base = __atomic_load_n(&g_libzicoum_base, __ATOMIC_ACQUIRE);
  Dl_info info{};
  return base == nullptr || (dladdr(address, &info) != 0 && info.dli_fbase == base);
}

}  // namespace

// Read by the jump below (an aligned 8-byte load): 0 until the first dlsym
// resolves it. Accessed with atomic builtins, not std::atomic (see above).
extern "C" {
__attribute__((visibility("hidden"), used)) Dlsym zico_real_dlsym = nullptr;
}

extern "C" __attribute__((visibility("hidden"), used)) ZICO_UNINSTRUMENTED Dlsym zico_resolve_real_dlsym() {
  Dlsym real = __atomic_load_n(&zico_real_dlsym, __ATOMIC_ACQUIRE);
  if (real == nullptr) {
    real = find_real_dlsym();
    __atomic_store_n(&zico_real_dlsym, real, __ATOMIC_RELEASE);
  }
  return real;
}

// dlsym on a real handle: the loader's answer, or libzicoum's lookup where a
// library other than libzicoum asked the driver for its own.
extern "C" __attribute__((visibility("hidden"), used)) ZICO_UNINSTRUMENTED void* zico_dlsym_on_handle(void* handle,
                                                                                     const char* name) {
  const void* caller = __builtin_return_address(0);  // dlsym's caller: the jump pushed nothing
  const Dlsym real = zico_resolve_real_dlsym();
  if (real == nullptr) return nullptr;
  void* found = real(handle, name);
  if (found == nullptr || name == nullptr || !swap_static_runtimes() || in_libzicoum(caller)) return found;
  return zico::substitute_driver_lookup(name, found);
}

// The jump. The stack is as dlsym's caller left it whenever the real dlsym
// or zico_dlsym_on_handle runs; resolving the real dlsym the first time saves
// the arguments around a call, keeping the stack 16-byte aligned.
__asm__(
    ".text\n"
    ".globl dlsym\n"
    ".type dlsym, @function\n"
    "dlsym:\n"
    "  testq %rdi, %rdi\n"  // RTLD_DEFAULT
    "  je 1f\n"
    "  cmpq $-1, %rdi\n"  // RTLD_NEXT
    "  je 1f\n"
    "  jmp zico_dlsym_on_handle\n"
    "1:\n"
    "  movq zico_real_dlsym(%rip), %rax\n"
    "  testq %rax, %rax\n"
    "  je 2f\n"
    "  jmp *%rax\n"
    "2:\n"
    "  pushq %rdi\n"
    "  pushq %rsi\n"
    "  subq $8, %rsp\n"
    "  call zico_resolve_real_dlsym\n"
    "  addq $8, %rsp\n"
    "  popq %rsi\n"
    "  popq %rdi\n"
    "  testq %rax, %rax\n"
    "  je 3f\n"
    "  jmp *%rax\n"
    "3:\n"
    "  ret\n"
    ".size dlsym, .-dlsym\n");

#endif
