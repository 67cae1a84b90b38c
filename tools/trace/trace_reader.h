// Reading and validating memory traces (docs/trace-format.md).
//
// Every rule in the format's "must reject" list is checked. On failure the
// trace is left empty and *error says "NAME:LINE: what is wrong", so a bad
// file is never half-loaded.
#pragma once

#include <string>
#include <string_view>

#include "status.h"
#include "trace.h"

namespace zico::trace {

// Reads a gzip-compressed trace file.
[[nodiscard]] Status read_trace_file(const std::string& path, Trace* out, std::string* error);
// Parses decompressed trace text; `name` is used in messages.
[[nodiscard]] Status parse_trace(std::string_view text, const std::string& name, Trace* out, std::string* error);

}  // namespace zico::trace
