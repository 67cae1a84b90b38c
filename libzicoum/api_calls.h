// The allocate and free that every entry point (C API, PyTorch ABI, CUDA
// interposition) shares: runtime lookup, and a last-error text on failure.
#pragma once

#include <cstddef>

#include "driver.h"
#include "exec_id.h"
#include "status.h"
#include "types.h"

namespace zico {

[[nodiscard]] Status api_allocate(size_t bytes, DeviceId device, StreamHandle stream, void** out) noexcept;
// kNotFound when no zicoum arena holds `ptr` (the caller may forward it).
// `stream` is where the block was last used.
[[nodiscard]] Status api_free(void* ptr, StreamHandle stream) noexcept;
// cudaFree's contract: the device is synchronized first, so the block is
// reusable by every stream at once.
[[nodiscard]] Status api_free_synchronous(void* ptr) noexcept;
// Work queued on `stream` uses the live block at `ptr`, which was allocated
// for another stream (PyTorch's Tensor.record_stream): the block is not
// reused, nor its pages discarded, before that work is done. kNotFound when no
// zicoum arena holds `ptr`; kInvalidArgument for an address that is not a
// live block's start, or cudaStreamPerThread (a different stream in every
// thread: pass the stream's own handle).
[[nodiscard]] Status api_record_stream(void* ptr, StreamHandle stream) noexcept;
// The application is destroying `stream`: fence its cached blocks; the
// pagers forget what it waited for (its handle may come back as a new stream's).
void api_stream_destroyed(StreamHandle stream) noexcept;
// UM mode: an op that uses the blocks `ptrs` point into is about to be
// launched / was launched (zico_op_begin, zico_op_end). No-ops otherwise.
// `stream`: where the op's kernels are launched (the legacy default stream
// when the caller does not say): it waits for the pager's migrations.
// `given`: what op_id names (um_pager.h): the caller's op, or only the
// kernel, the blocks it uses added by the pager (the launch observer's).
[[nodiscard]] Status api_op_begin(uint64_t op_id, const void* const* ptrs, size_t count, uint64_t expected_ns,
                                  StreamHandle stream = StreamHandle{},
                                  prefetch::GivenId given = prefetch::GivenId::kOp) noexcept;
[[nodiscard]] Status api_op_end() noexcept;
// Whether this thread is between an api_op_begin that reached a pager and its api_op_end.
[[nodiscard]] bool api_op_pending() noexcept;
// Whether this thread's last api_op_begin refused its op (kOutOfMemory):
// a swapped page it uses could not be mapped, so its work must not be
// launched (it would read unmapped memory).
[[nodiscard]] bool api_op_refused() noexcept;
// Whether work on `stream` now would be captured into a CUDA graph, or break
// another stream's capture. zicoum has no private pool for graph memory: a
// block it handed out or cached during a capture could reach eager tensors
// while replays still write it, so the entry points refuse there (or hand the
// call to CUDA) rather than corrupt. kNone when the driver cannot tell.
[[nodiscard]] CaptureState api_capture_state(StreamHandle stream) noexcept;

// CUDA's special stream handles.
inline constexpr StreamHandle kLegacyStream{0x1};
inline constexpr StreamHandle kPerThreadStream{0x2};

}  // namespace zico
