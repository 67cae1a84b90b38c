// From a memory trace to the access stream the paging planners work on.
//
// Blocks are laid out as PyTorch's caching allocator would place them
// (tools/replay/caching_model.h, the allocator a job on cudaMallocManaged
// gets), so blocks share pages the way they would on the GPU and a freed
// block's pages are reused by later ones. Offsets count from the first
// segment. Each op uses the pages of every block it reads or writes; its
// execution ID hashes its name with its blocks' offsets, as DeepUM hashes a
// kernel with its arguments: the same launch on the same tensors repeats its
// ID from one iteration to the next.
#pragma once

#include <cstdint>
#include <string>

#include "access_stream.h"
#include "trace.h"

namespace zico::page {

// The first `iterations` iterations of the trace (0: all), with everything
// before the first mark. False, with *error naming the trace and the problem,
// for a trace without ops (a version 1 trace written without access records)
// or a page size that is not a power of two from 4 KiB to 1 GiB.
[[nodiscard]] bool build_access_stream(const trace::Trace& trace, uint64_t page_bytes, uint32_t iterations,
                                       prefetch::AccessStream* out, std::string* error);

}  // namespace zico::page
