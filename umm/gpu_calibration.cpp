#include "gpu_calibration.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

namespace zico {
namespace {

// A JSON value as the file's shape needs it: objects keep their members'
// order, and every value keeps its text so that an error can quote it.
struct JsonMember;
struct JsonValue {
  enum class Kind : uint8_t { kNull, kBool, kNumber, kString, kObject, kArray };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<JsonMember> members;  // (a pair would need JsonValue complete here)
  std::vector<JsonValue> items;
  std::string_view text;
};
struct JsonMember {
  std::string key;
  JsonValue value;
};

// Recursive descent over RFC 8259 JSON; the first error stops it.
class JsonReader {
 public:
  explicit JsonReader(std::string_view text) : text_(text) {}

  bool read_document(JsonValue* out) {
    skip_space();
    if (!read_value(out, 0)) return false;
    skip_space();
    if (pos_ != text_.size()) return fail("text after the JSON value");
    return true;
  }
  [[nodiscard]] const std::string& error() const { return error_; }

 private:
  static constexpr int kMaxDepth = 16;  // the file nests two deep

  bool fail(const std::string& what) {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    error_ = "not JSON at line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + what;
    return false;
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool take(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool take_word(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  bool read_value(JsonValue* out, int depth) {
    if (depth > kMaxDepth) return fail("nested too deep");
    const size_t start = pos_;
    if (pos_ >= text_.size()) return fail("the text ends where a value should be");
    const char c = text_[pos_];
    bool ok = true;
    if (c == '{') {
      out->kind = JsonValue::Kind::kObject;
      ok = read_object(out, depth);
    } else if (c == '[') {
      out->kind = JsonValue::Kind::kArray;
      ok = read_array(out, depth);
    } else if (c == '"') {
      out->kind = JsonValue::Kind::kString;
      ok = read_string(&out->string);
    } else if (take_word("true") || take_word("false")) {
      out->kind = JsonValue::Kind::kBool;
      out->boolean = c == 't';
    } else if (take_word("null")) {
      out->kind = JsonValue::Kind::kNull;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      out->kind = JsonValue::Kind::kNumber;
      ok = read_number(&out->number);
    } else {
      return fail(std::string("unexpected '") + c + "'");
    }
    out->text = text_.substr(start, pos_ - start);
    return ok;
  }

  bool read_object(JsonValue* out, int depth) {
    ++pos_;
    skip_space();
    if (take('}')) return true;
    while (true) {
      skip_space();
      if (pos_ >= text_.size() || text_[pos_] != '"') return fail("expected a key in double quotes");
      std::string key;
      if (!read_string(&key)) return false;
      skip_space();
      if (!take(':')) return fail("expected ':' after key \"" + key + "\"");
      skip_space();
      JsonValue value;
      if (!read_value(&value, depth + 1)) return false;
      out->members.push_back(JsonMember{std::move(key), std::move(value)});
      skip_space();
      if (take('}')) return true;
      if (!take(',')) return fail("expected ',' or '}'");
    }
  }

  bool read_array(JsonValue* out, int depth) {
    ++pos_;
    skip_space();
    if (take(']')) return true;
    while (true) {
      skip_space();
      JsonValue value;
      if (!read_value(&value, depth + 1)) return false;
      out->items.push_back(std::move(value));
      skip_space();
      if (take(']')) return true;
      if (!take(',')) return fail("expected ',' or ']'");
    }
  }

  static void append_utf8(uint32_t code, std::string* out) {
    if (code < 0x80) {
      *out += static_cast<char>(code);
    } else if (code < 0x800) {
      *out += static_cast<char>(0xc0 | (code >> 6));
      *out += static_cast<char>(0x80 | (code & 0x3f));
    } else {
      *out += static_cast<char>(0xe0 | (code >> 12));
      *out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      *out += static_cast<char>(0x80 | (code & 0x3f));
    }
  }

  bool read_string(std::string* out) {
    ++pos_;
    while (pos_ < text_.size()) {
      const char c = text_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("a control character inside a string");
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (pos_ >= text_.size()) break;
      const char escape = text_[pos_++];
      switch (escape) {
        case '"': *out += '"'; break;
        case '\\': *out += '\\'; break;
        case '/': *out += '/'; break;
        case 'b': *out += '\b'; break;
        case 'f': *out += '\f'; break;
        case 'n': *out += '\n'; break;
        case 'r': *out += '\r'; break;
        case 't': *out += '\t'; break;
        case 'u': {
          uint32_t code = 0;
          const auto [end, ec] = std::from_chars(text_.data() + pos_, text_.data() + std::min(pos_ + 4, text_.size()),
                                                 code, 16);
          if (ec != std::errc() || end != text_.data() + pos_ + 4) return fail("expected four hex digits after \\u");
          pos_ += 4;
          append_utf8(code, out);  // a surrogate pair stays two code units: only free text holds one
          break;
        }
        default: --pos_; return fail(std::string("unknown escape \\") + escape);
      }
    }
    return fail("a string that does not end");
  }

  bool read_number(double* out) {
    const size_t start = pos_;
    take('-');
    const auto digits = [this] {
      const size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ - from;
    };
    if (take('0')) {
      // JSON has no leading zeros.
    } else if (digits() == 0) {
      return fail("a number without digits");
    }
    if (take('.') && digits() == 0) return fail("a number with no digits after '.'");
    if (take('e') || take('E')) {
      if (!take('+')) take('-');
      if (digits() == 0) return fail("a number with no digits in its exponent");
    }
    const auto [end, ec] = std::from_chars(text_.data() + start, text_.data() + pos_, *out);
    if (ec != std::errc() || end != text_.data() + pos_) return fail("a number out of range");
    return true;
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::string error_;
};

// A value as an error quotes it: its text, cut short.
std::string quoted(const JsonValue& value) {
  constexpr size_t kMost = 40;
  std::string text(value.text.substr(0, kMost));
  if (value.text.size() > kMost) text += "...";
  return text;
}

std::string calibration_keys_text() {
  std::string text;
  for (const std::string_view key : kCalibrationKeys) {
    if (!text.empty()) text += ", ";
    text += key;
  }
  return text;
}

bool is_calibration_key(std::string_view key) {
  return std::find(std::begin(kCalibrationKeys), std::end(kCalibrationKeys), key) != std::end(kCalibrationKeys);
}

Status bad(std::string* error, std::string message) {
  *error = std::move(message);
  return Status(Errc::kConfigError);
}

Status bad_model_value(std::string* error, const std::string& key, const JsonValue& value, const char* accepted) {
  return bad(error, "model key \"" + key + "\" is " + quoted(value) + "; expected " + accepted);
}

// One "model" member into *out.
Status read_model_key(const std::string& key, const JsonValue& value, GpuCalibration* out, std::string* error) {
  const bool number = value.kind == JsonValue::Kind::kNumber && std::isfinite(value.number);
  const auto rate = [&](std::optional<double>* field) -> Status {
    if (!number || value.number <= 0) return bad_model_value(error, key, value, "a number above 0 (bytes per second)");
    *field = value.number;
    return Status::ok();
  };
  // Nanoseconds; a fraction is rounded (a median of a few timings need not be whole).
  const auto nanoseconds = [&](std::optional<uint64_t>* field) -> Status {
    if (!number || value.number < 0 || value.number > 1e15) {
      return bad_model_value(error, key, value, "a number of nanoseconds from 0 to 1e15");
    }
    *field = static_cast<uint64_t>(std::llround(value.number));
    return Status::ok();
  };
  if (key == "h2d_bytes_per_s") return rate(&out->h2d_bytes_per_s);
  if (key == "d2h_bytes_per_s") return rate(&out->d2h_bytes_per_s);
  if (key == "fault_bytes_per_s") return rate(&out->fault_bytes_per_s);
  if (key == "duplex_factor") {
    if (!number || value.number <= 0 || value.number > 1) {
      return bad_model_value(error, key, value, "a number in (0, 1], each direction's share while both run");
    }
    out->duplex_factor = value.number;
    return Status::ok();
  }
  if (key == "to_host_sync") {
    if (!number || (value.number != 0 && value.number != 1)) {
      return bad_model_value(error, key, value, "0 or 1 (1: a move to the host returns after its copy)");
    }
    out->to_host_sync = value.number == 1;
    return Status::ok();
  }
  if (key == "ordered_call_waits") {
    if (!number || (value.number != 0 && value.number != 1)) {
      return bad_model_value(error, key, value, "0 or 1 (1: a migration call waits for its stream's earlier work)");
    }
    out->ordered_call_waits = value.number == 1;
    return Status::ok();
  }
  if (key == "fault_block_ns") return nanoseconds(&out->fault_block_ns);
  if (key == "call_ns") return nanoseconds(&out->call_ns);
  if (key == "range_ns") return nanoseconds(&out->range_ns);
  if (key == "block_ns") return nanoseconds(&out->block_ns);
  if (key == "cpu_map_block_ns") return nanoseconds(&out->cpu_map_block_ns);
  if (key == "discard_call_ns") return nanoseconds(&out->discard_call_ns);
  if (key == "launch_ns") return nanoseconds(&out->launch_ns);
  if (key == "chunk_create_ns") return nanoseconds(&out->chunk_create_ns);
  if (key == "chunk_map_ns") return nanoseconds(&out->chunk_map_ns);
  if (key == "chunk_access_ns") return nanoseconds(&out->chunk_access_ns);
  if (key == "chunk_unmap_ns") return nanoseconds(&out->chunk_unmap_ns);
  if (key == "chunk_release_ns") return nanoseconds(&out->chunk_release_ns);
  return bad(error, "unknown model key \"" + key + "\"; expected one of " + calibration_keys_text());
}

// The members of an object, each key once.
Status check_unique(const JsonValue& object, const char* where, std::string* error) {
  for (size_t i = 0; i < object.members.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (object.members[i].key == object.members[j].key) {
        return bad(error, std::string(where) + "key \"" + object.members[i].key + "\" appears twice; expected it once");
      }
    }
  }
  return Status::ok();
}

}  // namespace

Status parse_gpu_calibration(std::string_view text, GpuCalibration* out, std::string* error) {
  JsonValue root;
  JsonReader reader(text);
  if (!reader.read_document(&root)) return bad(error, reader.error());
  if (root.kind != JsonValue::Kind::kObject) {
    return bad(error, "the file holds " + quoted(root) + "; expected a JSON object with \"model\" and \"sources\"");
  }
  ZICO_RETURN_IF_ERROR(check_unique(root, "", error));
  GpuCalibration calibration;
  for (const auto& [key, value] : root.members) {
    std::string* field = key == "device"   ? &calibration.device
                         : key == "driver" ? &calibration.driver
                         : key == "cuda"   ? &calibration.cuda
                         : key == "commit" ? &calibration.commit
                         : key == "date"   ? &calibration.date
                                           : nullptr;
    if (field != nullptr) {
      if (value.kind != JsonValue::Kind::kString) {
        return bad(error, "key \"" + key + "\" is " + quoted(value) + "; expected a string");
      }
      *field = value.string;
    } else if (key == "model") {
      if (value.kind != JsonValue::Kind::kObject) {
        return bad(error, "key \"model\" is " + quoted(value) + "; expected an object of figures");
      }
      ZICO_RETURN_IF_ERROR(check_unique(value, "model ", error));
      for (const auto& [name, figure] : value.members) {
        ZICO_RETURN_IF_ERROR(read_model_key(name, figure, &calibration, error));
      }
    } else if (key == "sources") {
      if (value.kind != JsonValue::Kind::kObject) {
        return bad(error, "key \"sources\" is " + quoted(value) + "; expected an object of model key: text");
      }
      ZICO_RETURN_IF_ERROR(check_unique(value, "sources ", error));
      for (const auto& [name, source] : value.members) {
        if (!is_calibration_key(name)) {
          return bad(error, "unknown sources key \"" + name + "\"; expected one of " + calibration_keys_text());
        }
        if (source.kind != JsonValue::Kind::kString) {
          return bad(error, "sources key \"" + name + "\" is " + quoted(source) + "; expected a string");
        }
        calibration.sources[name] = source.string;
      }
    } else {
      return bad(error, "unknown key \"" + key + "\"; expected device, driver, cuda, commit, date, model or sources");
    }
  }
  *out = std::move(calibration);
  return Status::ok();
}

Status read_gpu_calibration_file(const std::string& path, GpuCalibration* out, std::string* error) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  std::string text;
  bool read = file != nullptr;
  if (read) {
    char buffer[4096];
    size_t n = 0;
    while ((n = std::fread(buffer, 1, sizeof buffer, file)) > 0) text.append(buffer, n);
    read = std::ferror(file) == 0;  // a directory opens, then fails to read
    std::fclose(file);
  }
  if (!read) return bad(error, "cannot read '" + path + "'; expected a readable calibration file (JSON)");
  return parse_gpu_calibration(text, out, error);
}

}  // namespace zico
