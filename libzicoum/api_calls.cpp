#include "api_calls.h"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "last_error.h"
#include "log.h"
#include "node_client.h"
#include "runtime.h"
#include "sim_driver.h"
#include "sizes.h"

namespace zico {

Status api_allocate(size_t bytes, DeviceId device, StreamHandle stream, void** out) noexcept {
  // Before the runtime's first use, whose registration is part of this call's wait.
  const sharing::AllocationWaitScope one_timeout;
  Runtime& runtime = Runtime::instance();
  // Both name the legacy default stream: one cache for both, as for frees.
  if (stream == kLegacyStream) stream = StreamHandle{};
  runtime.pause_point();
  DeviceAllocator* allocator = nullptr;
  Status status = runtime.allocator(device, &allocator);
  if (!status.is_ok()) {
    try {
      set_last_error(runtime.device_error(device, status));
    } catch (...) {
    }
    return status;
  }
  status = allocator->allocate(bytes, stream, out);
  if (status.is_ok()) {
    if (prefetch::UmPager* pager = runtime.pager(device)) pager->on_allocate(*out, bytes);
    // Under zico-umd, an allocation that begins a detected iteration waits
    // at the time-shift gate, like an explicit zico_mark_iteration.
    if (sharing::NodeClient* node = runtime.node(); node != nullptr && node->on_allocated(device, *out, bytes)) {
      node->iteration_gate(false, [&runtime] { runtime.pause_point(); });
    }
    return status;
  }
  try {
    const AllocatorStats stats = allocator->stats();
    std::string text = "device " + std::to_string(device.value) + ": cannot allocate " + format_size(bytes) + ": " +
                       status.message() + "; " + format_size(stats.allocated_bytes);
    sharing::NodeClient* node = runtime.node();
    // Under zico-umd the budget is the node's, lent as needed: the job's own is only the device's size.
    if (runtime.pager(device) != nullptr) {
      // UM mode: no budget binds allocations (it binds pages on the GPU); the arena, or the host, ran out.
      text += " allocated in a " + format_size(allocator->arena().bytes) + " arena";
    } else if (const uint64_t share = node != nullptr ? node->share_bytes(device) : 0; share != 0) {
      text += " allocated of the " + format_size(share) + " zico-umd could lend this job";
    } else {
      text += " of the " + format_size(stats.budget_bytes) + " budget allocated";
    }
    if (runtime.pager(device) == nullptr) text += ", " + format_size(stats.mapped_bytes) + " mapped";
    if (node != nullptr) {
      if (const std::string why = node->take_last_failure(); !why.empty()) text += "; " + why;
    }
    ZICO_LOG(kInfo, "%s", text.c_str());
    set_last_error(std::move(text));
  } catch (...) {
  }
  return status;
}

namespace {

void describe_free_failure(const void* ptr, Status status) {
  try {
    char address[32];
    std::snprintf(address, sizeof address, "%p", ptr);
    switch (status.code()) {
      case Errc::kNotFound: set_last_error(std::string("free of ") + address + ": not allocated by zicoum"); break;
      case Errc::kInvalidArgument:
        set_last_error(std::string("free of ") + address + ": not a live allocation (double free or interior pointer)");
        break;
      default: set_last_error(std::string("free of ") + address + " failed: " + status.message()); break;
    }
  } catch (...) {
  }
}

}  // namespace

Status api_free(void* ptr, StreamHandle stream) noexcept {
  Runtime* created = Runtime::if_created();
  DeviceAllocator* allocator = created != nullptr ? created->owner_of(ptr) : nullptr;
  if (allocator == nullptr) {
    describe_free_failure(ptr, Status(Errc::kNotFound));
    return Status(Errc::kNotFound);
  }
  Runtime& runtime = *created;
  if (stream == kLegacyStream) stream = StreamHandle{};  // both name the legacy default stream
  // Streams other than `stream` whose work may still use the block (record_stream).
  const std::vector<StreamHandle> also_used_on = allocator->stream_uses(ptr);
  if (stream == kPerThreadStream) {
    // This handle names a different stream in every thread, so no fence could
    // be recorded on the right one later: wait for this thread's stream now.
    // The other streams that used the block still need their fences, which
    // deallocate records beside one on the legacy stream (standing in for
    // this thread's stream, which is done).
    if (!runtime.driver()->stream_synchronize(stream).is_ok()) {
      (void)runtime.driver()->device_synchronize(allocator->device());
    }
    stream = also_used_on.empty() ? kNoPendingWork : StreamHandle{};
  }
  // Told before the free: once freed, another thread may get the same
  // address, and its allocation must not be taken for this free.
  if (sharing::NodeClient* node = runtime.node()) node->on_freed(allocator->device(), ptr);
  if (prefetch::UmPager* pager = runtime.pager(allocator->device())) {
    pager->on_free(ptr, stream == kNoPendingWork ? std::nullopt : std::optional<StreamHandle>(stream), also_used_on);
  }
  const Status status = allocator->deallocate(ptr, stream);
  if (!status.is_ok()) describe_free_failure(ptr, status);
  if (sharing::NodeClient* node = runtime.node()) node->after_free(allocator->device());
  return status;
}

Status api_record_stream(void* ptr, StreamHandle stream) noexcept {
  Runtime* created = Runtime::if_created();
  DeviceAllocator* allocator = created != nullptr ? created->owner_of(ptr) : nullptr;
  Status status = Status::ok();
  if (allocator == nullptr) {
    status = Status(Errc::kNotFound);
  } else if (stream == kPerThreadStream) {
    status = Status(Errc::kInvalidArgument);
  } else {
    status = allocator->record_stream(ptr, stream == kLegacyStream ? StreamHandle{} : stream);
  }
  if (status.is_ok()) return status;
  try {
    char address[32];
    std::snprintf(address, sizeof address, "%p", ptr);
    const std::string what = std::string("record_stream of ") + address;
    if (status.code() == Errc::kNotFound) {
      set_last_error(what + ": not allocated by zicoum");
    } else if (stream == kPerThreadStream) {
      set_last_error(what + ": cudaStreamPerThread names a different stream in every thread; "
                            "pass the stream's own handle");
    } else if (status.code() == Errc::kInvalidArgument) {
      set_last_error(what + ": not the start of a live allocation");
    } else {
      set_last_error(what + " failed: " + status.message());
    }
  } catch (...) {
  }
  return status;
}

Status api_free_synchronous(void* ptr) noexcept {
  Runtime* created = Runtime::if_created();
  DeviceAllocator* allocator = created != nullptr ? created->owner_of(ptr) : nullptr;
  if (allocator == nullptr) return api_free(ptr, StreamHandle{});  // reports kNotFound
  Runtime& runtime = *created;
  const bool idle = runtime.driver()->device_synchronize(allocator->device()).is_ok();
  // Without a completed synchronize, fall back to the legacy stream's fence.
  if (sharing::NodeClient* node = runtime.node()) node->on_freed(allocator->device(), ptr);
  if (prefetch::UmPager* pager = runtime.pager(allocator->device())) {
    pager->on_free(ptr, idle ? std::nullopt : std::optional<StreamHandle>(StreamHandle{}));
  }
  const Status status = allocator->deallocate(ptr, idle ? kNoPendingWork : StreamHandle{});
  if (!status.is_ok()) describe_free_failure(ptr, status);
  if (sharing::NodeClient* node = runtime.node()) node->after_free(allocator->device());
  return status;
}

CaptureState api_capture_state(StreamHandle stream) noexcept {
  Runtime& runtime = Runtime::instance();
  CaptureState state = CaptureState::kNone;
  if (runtime.driver() == nullptr || !runtime.driver()->stream_capture_state(stream, &state).is_ok()) {
    return CaptureState::kNone;
  }
  return state;
}

void api_stream_destroyed(StreamHandle stream) noexcept {
  Runtime* runtime = Runtime::if_created();
  if (runtime == nullptr) return;  // nothing of ours can be on it
  for (int device = 0; device < Runtime::kMaxDevices; ++device) {
    if (DeviceAllocator* allocator = runtime->existing_allocator(DeviceId{device})) allocator->fence_stream(stream);
    if (prefetch::UmPager* pager = runtime->pager(DeviceId{device})) pager->forget_stream(stream);
  }
}

namespace {

// The op between zico_op_begin and zico_op_end on this thread.
struct PendingOp {
  prefetch::UmPager* pager = nullptr;
  bool refused = false;  // the last op begun here may not run: its pages are not on the GPU
  std::vector<VaRange> blocks;
  uint64_t expected_ns = 0;
  StreamHandle stream{};
  // A thread that ends inside an op gives its pager's announcement back,
  // which the other threads' ops wait for (before any static is destroyed,
  // the pagers included).
  ~PendingOp() {
    if (pager != nullptr) pager->after_kernel();
  }
};
thread_local PendingOp t_op;

}  // namespace

Status api_op_begin(uint64_t op_id, const void* const* ptrs, size_t count, uint64_t expected_ns,
                    StreamHandle stream, prefetch::GivenId given) noexcept {
  if (count > 0 && ptrs == nullptr) {
    try {
      set_last_error("zico_op_begin: ptrs is NULL with a count of " + std::to_string(count));
    } catch (...) {
    }
    return Status(Errc::kInvalidArgument);
  }
  // An op this thread began and did not end ends here, unrun: it holds its
  // pager's announcement, which this one may need (um_pager.h).
  if (prefetch::UmPager* pending = std::exchange(t_op.pager, nullptr)) pending->after_kernel();
  t_op.refused = false;
  Runtime* runtime = Runtime::if_created();
  if (runtime == nullptr || count == 0) return Status::ok();
  DeviceAllocator* allocator = nullptr;
  for (size_t i = 0; i < count && allocator == nullptr; ++i) allocator = runtime->owner_of(ptrs[i]);
  prefetch::UmPager* pager = allocator != nullptr ? runtime->pager(allocator->device()) : nullptr;
  if (pager == nullptr) return Status::ok();  // VMM mode, or nothing of zicoum's
  try {
    std::vector<VaRange> used;
    used.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      if (allocator->owns(ptrs[i])) used.push_back(VaRange{reinterpret_cast<uintptr_t>(ptrs[i]), 1});
    }
    if (const uint64_t needs = pager->working_set_bytes(used); needs > pager->budget_bytes()) {
      runtime->make_room_for_kernel(allocator->device(), needs);
    }
    pager->before_kernel(op_id, used, expected_ns, &t_op.blocks, stream, given);
  } catch (const std::bad_alloc&) {
    return Status(Errc::kOutOfMemory);
  }
  if (pager->kernel_refused()) {
    pager->after_kernel();  // the announcement goes back; the op does not run
    t_op.refused = true;
    try {
      set_last_error("zico_op_begin: a swapped page the op uses could not be brought back to the GPU (no device "
                     "memory to map it); the op must not run");
    } catch (...) {
    }
    return Status(Errc::kOutOfMemory);
  }
  t_op.pager = pager;
  t_op.expected_ns = expected_ns;
  t_op.stream = stream;
  return Status::ok();
}

bool api_op_pending() noexcept { return t_op.pager != nullptr; }

bool api_op_refused() noexcept { return t_op.refused; }

Status api_op_end() noexcept {
  prefetch::UmPager* pager = t_op.pager;
  if (pager == nullptr) return Status::ok();
  t_op.pager = nullptr;
  Status status = Status::ok();
  // The simulated backend has no kernels of its own: the op runs here, on its
  // modelled clock, using the blocks the pager resolved.
  if (auto* sim = dynamic_cast<SimDriver*>(Runtime::instance().driver())) {
    status = sim->run_kernel(t_op.blocks, t_op.expected_ns, t_op.stream);
    if (!status.is_ok()) {
      try {
        set_last_error(std::string("zico_op_end: the simulated op could not run: ") + status.message());
      } catch (...) {
      }
    }
  }
  pager->after_kernel();
  return status;
}

}  // namespace zico
