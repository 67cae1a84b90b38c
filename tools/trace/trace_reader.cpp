#include "trace_reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include <array>
#include <charconv>
#include <unordered_map>

namespace zico::trace {
namespace {

// A decompressed trace larger than this is refused rather than exhausting memory.
constexpr size_t kMaxTextBytes = size_t{4} << 30;

constexpr std::array<const char*, static_cast<size_t>(Category::kCount)> kCategoryNames = {
    "param", "grad", "optim", "act", "temp", "input", "other"};

constexpr std::array<const char*, 6> kRequiredMeta = {"model", "command", "source", "batch", "iterations", "timing"};

class Parser {
 public:
  Parser(std::string_view text, const std::string& name, Trace* out) : text_(text), trace_(*out) {
    trace_ = Trace{};
    trace_.name = name;
  }

  Status run(std::string* error) {
    const Status status = parse_all();
    if (!status.is_ok()) {
      *error = trace_.name + ":" + std::to_string(line_number_) + ": " + problem_;
      const std::string name = trace_.name;
      trace_ = Trace{};
      trace_.name = name;
    }
    return status;
  }

 private:
  Status fail(std::string problem) {
    problem_ = std::move(problem);
    return Status(Errc::kInvalidArgument);
  }

  bool next_line(std::string_view* line) {
    if (pos_ >= text_.size()) return false;
    const size_t end = text_.find('\n', pos_);
    if (end == std::string_view::npos) {
      *line = text_.substr(pos_);
      pos_ = text_.size();
    } else {
      *line = text_.substr(pos_, end - pos_);
      pos_ = end + 1;
    }
    ++line_number_;
    return true;
  }

  static std::vector<std::string_view> split(std::string_view line) {
    std::vector<std::string_view> fields;
    size_t start = 0;
    while (true) {
      const size_t space = line.find(' ', start);
      fields.push_back(line.substr(start, space == std::string_view::npos ? std::string_view::npos : space - start));
      if (space == std::string_view::npos) break;
      start = space + 1;
    }
    return fields;
  }

  Status number(std::string_view field, const char* what, uint64_t* out) {
    if (field.empty() || field.front() == '+' || field.front() == '-') {
      return fail(std::string("expected an unsigned integer for ") + what + ", got '" + std::string(field) + "'");
    }
    const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), *out);
    if (ec != std::errc() || end != field.data() + field.size()) {
      return fail(std::string("expected an unsigned integer for ") + what + ", got '" + std::string(field) + "'");
    }
    return Status::ok();
  }

  Status time(std::string_view field, uint64_t* out) {
    ZICO_RETURN_IF_ERROR(number(field, "time", out));
    if (*out < last_time_) {
      return fail("time goes backwards: " + std::to_string(*out) + " after " + std::to_string(last_time_));
    }
    last_time_ = *out;
    return Status::ok();
  }

  Status live_block(std::string_view field, const char* what, uint32_t* out) {
    uint64_t id = 0;
    ZICO_RETURN_IF_ERROR(number(field, what, &id));
    auto it = ids_.find(id);
    if (it == ids_.end()) return fail(std::string(what) + " of unknown id " + std::to_string(id));
    if (trace_.blocks[it->second].free_time != kNever) {
      return fail(std::string(what) + " of id " + std::to_string(id) + ", which was already freed");
    }
    *out = it->second;
    return Status::ok();
  }

  Status id_list(std::string_view field, const char* what, std::vector<uint32_t>* out) {
    if (field == "-") return Status::ok();
    size_t start = 0;
    while (true) {
      const size_t comma = field.find(',', start);
      uint32_t block = 0;
      ZICO_RETURN_IF_ERROR(live_block(field.substr(start, comma == std::string_view::npos ? comma : comma - start),
                                      what, &block));
      out->push_back(block);
      if (comma == std::string_view::npos) return Status::ok();
      start = comma + 1;
    }
  }

  Status expect_fields(const std::vector<std::string_view>& fields, size_t count, const char* form) {
    if (fields.size() != count) {
      return fail("expected '" + std::string(form) + "' (" + std::to_string(count) + " fields), got " +
                  std::to_string(fields.size()));
    }
    return Status::ok();
  }

  Status parse_all() {
    std::string_view line;
    if (!next_line(&line) || line != "zicoum-trace 1") {
      if (line.starts_with("zicoum-trace ")) return fail("unsupported version '" + std::string(line.substr(13)) + "'; this reader knows 1");
      return fail("not a zicoum trace: the first line must be 'zicoum-trace 1'");
    }
    bool seen_event = false;
    bool seen_end = false;
    uint64_t records = 0;
    while (next_line(&line)) {
      if (seen_end) return fail("content after the 'end' record");
      if (line.empty()) return fail("empty line");
      const std::vector<std::string_view> f = split(line);
      const std::string_view kind = f[0];
      if (kind == "meta") {
        if (seen_event) return fail("'meta' after the first event");
        if (f.size() < 3) return fail("expected 'meta KEY VALUE'");
        for (char c : f[1]) {
          if (!(c >= 'a' && c <= 'z') && c != '_') return fail("meta key '" + std::string(f[1]) + "' is not [a-z_]+");
        }
        const size_t value_start = 5 + f[1].size() + 1;
        trace_.meta[std::string(f[1])] = std::string(line.substr(value_start));
        continue;
      }
      if (kind == "end") {
        ZICO_RETURN_IF_ERROR(expect_fields(f, 2, "end COUNT"));
        uint64_t count = 0;
        ZICO_RETURN_IF_ERROR(number(f[1], "record count", &count));
        if (count != records) {
          return fail("'end' says " + std::to_string(count) + " records, the file has " + std::to_string(records));
        }
        seen_end = true;
        continue;
      }
      if (!seen_event) {
        for (const char* key : kRequiredMeta) {
          if (!trace_.meta.contains(key)) return fail(std::string("required 'meta ") + key + "' is missing");
        }
        seen_event = true;
      }
      ++records;
      if (kind == "a") {
        ZICO_RETURN_IF_ERROR(parse_allocate(f));
      } else if (kind == "f") {
        ZICO_RETURN_IF_ERROR(parse_free(f));
      } else if (kind == "o") {
        ZICO_RETURN_IF_ERROR(parse_op(f));
      } else if (kind == "i") {
        ZICO_RETURN_IF_ERROR(parse_iteration(f));
      } else {
        return fail("unknown record type '" + std::string(kind) + "'");
      }
    }
    if (!seen_end) return fail("no 'end' record: the trace is truncated");
    return Status::ok();
  }

  uint32_t current_iteration() const {
    return trace_.iteration_starts.empty() ? 0 : static_cast<uint32_t>(trace_.iteration_starts.size() - 1);
  }

  Status parse_allocate(const std::vector<std::string_view>& f) {
    ZICO_RETURN_IF_ERROR(expect_fields(f, 6, "a ID BYTES T CAT OP"));
    uint64_t id = 0, bytes = 0, t = 0;
    ZICO_RETURN_IF_ERROR(number(f[1], "id", &id));
    ZICO_RETURN_IF_ERROR(number(f[2], "size", &bytes));
    if (bytes == 0) return fail("block " + std::to_string(id) + " has size 0");
    ZICO_RETURN_IF_ERROR(time(f[3], &t));
    Block block;
    block.bytes = bytes;
    block.alloc_time = t;
    block.alloc_iteration = current_iteration();
    bool known = false;
    for (size_t c = 0; c < kCategoryNames.size(); ++c) {
      if (f[4] == kCategoryNames[c]) {
        block.category = static_cast<Category>(c);
        known = true;
      }
    }
    if (!known) return fail("unknown category '" + std::string(f[4]) + "'");
    if (f[5] != "-1") {
      uint64_t op = 0;
      ZICO_RETURN_IF_ERROR(number(f[5], "op index", &op));
      if (op != trace_.ops.size()) {
        return fail("block " + std::to_string(id) + " names op " + std::to_string(op) + ", but the next op is " +
                    std::to_string(trace_.ops.size()));
      }
      block.op = static_cast<int64_t>(op);
    }
    if (trace_.blocks.size() >= UINT32_MAX) return fail("too many blocks");
    if (!ids_.emplace(id, static_cast<uint32_t>(trace_.blocks.size())).second) {
      return fail("id " + std::to_string(id) + " is allocated twice");
    }
    trace_.events.push_back({Event::Kind::kAllocate, static_cast<uint32_t>(trace_.blocks.size()), t});
    trace_.blocks.push_back(block);
    return Status::ok();
  }

  Status parse_free(const std::vector<std::string_view>& f) {
    ZICO_RETURN_IF_ERROR(expect_fields(f, 3, "f ID T"));
    uint32_t block = 0;
    ZICO_RETURN_IF_ERROR(live_block(f[1], "free", &block));
    uint64_t t = 0;
    ZICO_RETURN_IF_ERROR(time(f[2], &t));
    trace_.blocks[block].free_time = t;
    trace_.blocks[block].free_iteration = current_iteration();
    trace_.events.push_back({Event::Kind::kFree, block, t});
    return Status::ok();
  }

  Status parse_op(const std::vector<std::string_view>& f) {
    ZICO_RETURN_IF_ERROR(expect_fields(f, 7, "o K T DUR NAME READS WRITES"));
    uint64_t index = 0, t = 0, duration = 0;
    ZICO_RETURN_IF_ERROR(number(f[1], "op index", &index));
    if (index != trace_.ops.size()) {
      return fail("op " + std::to_string(index) + " out of sequence; expected " + std::to_string(trace_.ops.size()));
    }
    ZICO_RETURN_IF_ERROR(time(f[2], &t));
    ZICO_RETURN_IF_ERROR(number(f[3], "duration", &duration));
    if (f[4].empty()) return fail("empty op name");
    Op op;
    op.start = t;
    op.duration = duration;
    auto [name, inserted] = op_name_index_.emplace(std::string(f[4]), static_cast<uint32_t>(trace_.op_names.size()));
    if (inserted) trace_.op_names.emplace_back(f[4]);
    op.name = name->second;
    ZICO_RETURN_IF_ERROR(id_list(f[5], "read", &op.reads));
    ZICO_RETURN_IF_ERROR(id_list(f[6], "write", &op.writes));
    trace_.events.push_back({Event::Kind::kOp, static_cast<uint32_t>(trace_.ops.size()), t});
    trace_.ops.push_back(std::move(op));
    return Status::ok();
  }

  Status parse_iteration(const std::vector<std::string_view>& f) {
    ZICO_RETURN_IF_ERROR(expect_fields(f, 3, "i N T"));
    uint64_t n = 0, t = 0;
    ZICO_RETURN_IF_ERROR(number(f[1], "iteration", &n));
    if (n != trace_.iteration_starts.size()) {
      return fail("iteration " + std::to_string(n) + " out of sequence; expected " +
                  std::to_string(trace_.iteration_starts.size()));
    }
    ZICO_RETURN_IF_ERROR(time(f[2], &t));
    trace_.iteration_starts.push_back(trace_.events.size());
    trace_.events.push_back({Event::Kind::kIteration, static_cast<uint32_t>(n), t});
    return Status::ok();
  }

  std::string_view text_;
  Trace& trace_;
  size_t pos_ = 0;
  size_t line_number_ = 0;
  uint64_t last_time_ = 0;
  std::string problem_;
  std::unordered_map<uint64_t, uint32_t> ids_;
  std::unordered_map<std::string, uint32_t> op_name_index_;
};

}  // namespace

const char* to_string(Category category) {
  const auto i = static_cast<size_t>(category);
  return i < kCategoryNames.size() ? kCategoryNames[i] : "?";
}

Status parse_trace(std::string_view text, const std::string& name, Trace* out, std::string* error) {
  try {
    return Parser(text, name, out).run(error);
  } catch (const std::bad_alloc&) {
    *error = name + ": out of memory while loading";
    *out = Trace{};
    return Status(Errc::kOutOfMemory);
  }
}

Status read_trace_file(const std::string& path, Trace* out, std::string* error) {
  const std::string name = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  // gzopen opens a folder, and its first read fails as if the data were corrupt.
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    *error = path + ": is a directory, not a trace file (its traces are " + path + "/*.ztrace.gz)";
    return Status(Errc::kInvalidArgument);
  }
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    *error = path + ": cannot open: " + std::strerror(errno);
    return Status(Errc::kOsError, errno);
  }
  std::string text;
  std::array<char, 1 << 16> buffer;
  int n = 0;
  while ((n = gzread(file, buffer.data(), static_cast<unsigned>(buffer.size()))) > 0) {
    if (text.size() + static_cast<size_t>(n) > kMaxTextBytes) {
      gzclose(file);
      *error = path + ": more than 4 GiB once decompressed; refusing to load it";
      return Status(Errc::kInvalidArgument);
    }
    text.append(buffer.data(), static_cast<size_t>(n));
  }
  int gz_error = Z_OK;
  const char* message = gzerror(file, &gz_error);
  if (n < 0 || (gz_error != Z_OK && gz_error != Z_STREAM_END)) {
    *error = path + ": corrupt or truncated gzip data (" + message + ")";
    gzclose(file);
    return Status(Errc::kInvalidArgument);
  }
  gzclose(file);
  // Errors name the file as given; the trace is named by its file's name.
  const Status status = parse_trace(text, path, out, error);
  out->name = name;
  return status;
}

}  // namespace zico::trace
