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

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "driver_entry_points.h"

#if defined(__x86_64__) && defined(__linux__)

using Dlsym = void* (*)(void*, const char*);

// A sanitizer runtime asks dlsym for its interceptors' targets while it
// starts, before its shadow memory is in place: nothing here is instrumented.
#define ZICO_UNINSTRUMENTED __attribute__((no_sanitize("address", "undefined")))

namespace {

// glibc's own dlsym: the next definition after libzicoum (libc from 2.34 on,
// libdl before), asked with dlvsym, which libzicoum does not define, so never
// ourselves; where libzicoum comes after libc (dlopen'ed), from libc by handle.
// No dlopen first: a sanitizer runtime asks dlsym for its interceptors'
// targets before its own dlopen interceptor is ready.
ZICO_UNINSTRUMENTED Dlsym find_real_dlsym() {
  for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5"}) {
    if (void* found = dlvsym(RTLD_NEXT, "dlsym", version)) return reinterpret_cast<Dlsym>(found);
  }
  for (const char* library : {"libc.so.6", "libdl.so.2"}) {
    void* handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    void* found = dlvsym(handle, "dlsym", "GLIBC_2.34");
    if (found == nullptr) found = dlvsym(handle, "dlsym", "GLIBC_2.2.5");
    dlclose(handle);
    if (found != nullptr) return reinterpret_cast<Dlsym>(found);
  }
  return nullptr;
}

ZICO_UNINSTRUMENTED bool swap_static_runtimes() {
  static const bool on = [] {
    const char* value = std::getenv("ZICO_STATIC_RUNTIMES");
    return value != nullptr && std::strcmp(value, "on") == 0;
  }();
  return on;
}

// Whether `address` lies in libzicoum (its own lookups of the driver, by
// CudaDriver and RealFunction, must get the driver's functions).
ZICO_UNINSTRUMENTED bool in_libzicoum(const void* address) {
  static const void* base = [] {
    Dl_info self{};
    return dladdr(reinterpret_cast<const void*>(&in_libzicoum), &self) != 0 ? self.dli_fbase : nullptr;
  }();
  Dl_info info{};
  return dladdr(address, &info) != 0 && info.dli_fbase == base;
}

}  // namespace

// Read by the jump below: 0 until the first dlsym resolves it.
extern "C" {
__attribute__((visibility("hidden"))) std::atomic<Dlsym> zico_real_dlsym{nullptr};
}

extern "C" __attribute__((visibility("hidden"))) ZICO_UNINSTRUMENTED Dlsym zico_resolve_real_dlsym() {
  Dlsym real = zico_real_dlsym.load(std::memory_order_acquire);
  if (real == nullptr) {
    real = find_real_dlsym();
    zico_real_dlsym.store(real, std::memory_order_release);
  }
  return real;
}

// dlsym on a real handle: the loader's answer, or libzicoum's lookup where a
// library other than libzicoum asked the driver for its own.
extern "C" __attribute__((visibility("hidden"))) ZICO_UNINSTRUMENTED void* zico_dlsym_on_handle(void* handle,
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
