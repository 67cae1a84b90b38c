// libFuzzer target for the trace parser and what consumes its access records:
// any input must either load or be rejected with a message; a trace that
// loads is turned into an access stream and run under every paging policy at
// the tightest budget it allows, where the budget must hold and a running op
// must find its pages. Nothing may crash, hang or leak. Build and run:
//   tests/fuzz/run_trace_reader_fuzz.sh 60
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "paging_simulator.h"
#include "trace_reader.h"
#include "trace_stream.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zico::trace::Trace trace;
  std::string error;
  const zico::Status status =
      zico::trace::parse_trace(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz", &trace, &error);
  if (!status.is_ok() && error.empty()) __builtin_trap();  // every rejection must say why
  if (!status.is_ok()) return 0;

  zico::prefetch::AccessStream stream;
  if (!zico::page::build_access_stream(trace, 64 << 10, 0, &stream, &error)) {
    if (error.empty()) __builtin_trap();
    return 0;
  }
  if (!zico::prefetch::stream_error(stream).empty()) __builtin_trap();  // the builder makes valid streams
  const uint32_t slots = zico::prefetch::stream_facts(stream).max_op_pages;
  zico::page::PagingOptions options;
  options.budget_bytes = uint64_t{slots == 0 ? 1 : slots} * stream.page_bytes;
  options.check = [&](const zico::prefetch::Residency& r, std::span<const zico::prefetch::PageId> running) {
    if (r.occupied_pages() > r.budget_pages()) __builtin_trap();
    for (const auto page : running) {
      if (r.state(page) != zico::prefetch::PageState::kResident) __builtin_trap();
    }
  };
  for (const std::string_view policy : zico::prefetch::kPolicyNames) {
    zico::page::PagingResult result;
    if (!zico::page::run_paging(stream, std::string(policy), options, &result, &error) || result.live_discards != 0) {
      __builtin_trap();
    }
  }
  return 0;
}
