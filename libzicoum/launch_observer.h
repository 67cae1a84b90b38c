// Kernel launches, copies and memsets as the pager's ops, in UM mode: what
// unmodified programs tell zicoum without a line of theirs changed
// (zico_op_begin / zico_op_end say the same explicitly).
//
// A launch gets an execution ID: its function and launch shape, hashed, with
// the start offsets of the blocks it uses, which the pager adds
// (prefetch/exec_id.h): the same kernel on the same tensors in the next
// iteration has the same ID, and the layers of a model built of identical
// layers have different ones. The blocks it uses are read from its
// parameters: every aligned 8-byte word
// of a parameter that points into a zicoum arena is taken for a use of that
// block (pointers inside structs passed by value too). Where the parameters
// are is asked of the driver once per function (cuFuncGetParamInfo, CUDA
// 12.4+; the runtime's functions through cudaGetFuncBySymbol; the library
// kernels of CUDA 13's `<<<...>>>`, which calls __cudaLaunchKernel with a
// cudaKernel_t, through cuKernelGetParamInfo); a driver that
// cannot tell leaves kernelParams unread (their count is unknown, and reading
// past it would be reading garbage) and only a packed parameter buffer
// (CU_LAUNCH_PARAM_BUFFER_POINTER) is scanned. Blocks a kernel reaches only
// through memory (pointer arrays on the device) are not seen here: their
// pages fault in, and the pager learns them from the driver's fault reports
// (prefetch/unseen_uses.h) for the next iteration.
//
// A copy or memset (cudaMemcpy[Async], cudaMemset[Async], the driver's
// one-dimensional cuMemcpy* and cuMemsetD*) names its blocks itself: the
// destination and the source, where they are in a zicoum arena. Announced,
// its blocks come to the GPU within the budget; unannounced, the driver would
// bring what it touches in behind the pager's back, over the budget. Its
// execution ID is its kind and size, with its blocks' offsets (a copy of the
// same tensor in the next iteration has the same).
//
// Work captured into a CUDA graph is not announced (it runs at each
// replay, not now). Layouts are forgotten when a module or library is
// unloaded (its functions' handles may be given to new ones). In VMM mode,
// or before anything started zicoum, a launch costs one atomic load and a
// branch on top of the real call.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda.h>

namespace zico {

// What a launch names its kernel by.
enum class Callee : uint8_t {
  kFunction,       // a CUfunction (the driver's launches)
  kRuntimeStub,    // the runtime's host stub (cudaLaunchKernel)
  kLibraryKernel,  // a cudaKernel_t, which is a CUkernel (__cudaLaunchKernel)
};

// The launch shape that, with the function, identifies a launch.
struct LaunchShape {
  unsigned grid[3];
  unsigned block[3];
};

// Announces a launch to the pager for the lifetime of the object: its blocks
// come to the GPU (within the budget) before the constructor returns, and
// the op ends in the destructor, after the real launch was queued. Nothing
// happens in VMM mode, for a launch that uses no zicoum memory, or inside an
// explicit zico_op_begin / zico_op_end on the same thread (that op covers it).
class ObservedLaunch {
 public:
  // `key` is what `callee` says: a CUfunction, the runtime's host stub
  // (resolved through cudaGetFuncBySymbol) or a library kernel. `args`:
  // kernelParams (may be null); `extra`: the driver's extra list (may be null).
  ObservedLaunch(const void* key, Callee callee, const LaunchShape& shape, void** args, void** extra,
                 CUstream stream) noexcept;
  ~ObservedLaunch();
  ObservedLaunch(const ObservedLaunch&) = delete;
  ObservedLaunch& operator=(const ObservedLaunch&) = delete;
  // Swapped pages (ZICO_UM_MEMORY=swap): the pager could not map a page the
  // kernel uses. A driver-API launch returns out-of-memory instead of
  // launching. A runtime-API launch goes ahead (an illegal address, said
  // in the log first): `<<<...>>>` drops its launch's result and the caller
  // reads the error back from cudaGetLastError, which only the runtime's
  // own failures set, so a refusal there would vanish without a trace.
  [[nodiscard]] bool refused() const { return refused_; }

 private:
  bool begun_ = false;
  bool refused_ = false;
};

// What a copy does to its destination, for its execution ID (not umm/driver.h's
// CopyKind, which is a direction).
enum class CopyOp : uint8_t {
  kCopy,      // from `src` (cudaMemcpy*, cuMemcpy*)
  kSet,       // to a value (cudaMemset*, cuMemsetD*); no source
  kFromHost,  // from `src`, host memory by the call's word (cudaMemcpyHostToDevice, cuMemcpyHtoD*)
};

// Announces a copy or memset to the pager for the lifetime of the object, as
// ObservedLaunch does a launch: its zicoum blocks (the destination's and the
// source's) come to the GPU first. `src` is null for a memset; either pointer
// may be host memory or another allocator's (then it is not a zicoum block).
// A copy from the host into a zicoum block, of up to
// prefetch::kTableBytesRead, is also read for addresses in the arena: a
// pointer table, whose blocks the pager then names for every kernel that
// names the table's (prefetch/pointer_table.h). The host bytes are read
// with process_vm_readv, so a source that is not host memory after all
// fails the read, not the process.
class ObservedCopy {
 public:
  ObservedCopy(CopyOp kind, const void* dst, const void* src, size_t bytes, CUstream stream) noexcept;
  ~ObservedCopy();
  ObservedCopy(const ObservedCopy&) = delete;
  ObservedCopy& operator=(const ObservedCopy&) = delete;
  // As ObservedLaunch::refused(): the copy must not be made.
  [[nodiscard]] bool refused() const { return refused_; }

 private:
  bool begun_ = false;
  bool refused_ = false;
};

// Launches observed in UM mode so far, in the whole process (not in a graph
// capture nor inside an explicit op), how many of those had no pointer into
// zicoum memory among the parameters read, and the copies and memsets
// announced (those that touched zicoum memory).
struct LaunchCounts {
  uint64_t launches = 0;
  uint64_t without_blocks = 0;
  uint64_t copies = 0;
};
[[nodiscard]] LaunchCounts launch_counts() noexcept;

// A module or library was unloaded: every parameter layout is asked again.
void forget_launch_layouts() noexcept;

// The kernel halves of a launch's and a copy's execution IDs, before the
// pager adds their blocks (exposed for tests).
[[nodiscard]] uint64_t launch_id(const void* key, const LaunchShape& shape) noexcept;
[[nodiscard]] uint64_t copy_id(CopyOp kind, bool dst_is_zicoum, bool src_is_zicoum, size_t bytes) noexcept;

}  // namespace zico
