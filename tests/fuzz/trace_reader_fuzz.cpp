// libFuzzer target for the trace parser: any input must either load or be
// rejected with a message; nothing may crash, hang or leak. Build and run:
//   tests/fuzz/run_trace_reader_fuzz.sh 60
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "trace_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zico::trace::Trace trace;
  std::string error;
  const zico::Status status =
      zico::trace::parse_trace(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz", &trace, &error);
  if (!status.is_ok() && error.empty()) __builtin_trap();  // every rejection must say why
  return 0;
}
