// A minimal streaming JSON writer for zico-umctl's --json output: objects,
// arrays, strings (escaped), integers, doubles and null. Commas are placed for
// the caller; misuse (a value where a key is due) is the caller's bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zico::umctl {

class JsonWriter {
 public:
  void begin_object() { open('{'); }
  void end_object() { close('}'); }
  void begin_array() { open('['); }
  void end_array() { close(']'); }
  void key(std::string_view name) {
    separate();
    write_string(name);
    text_ += ':';
    after_key_ = true;
  }
  void value(std::string_view text) {
    separate();
    write_string(text);
  }
  void value(uint64_t number) {
    separate();
    text_ += std::to_string(number);
  }
  void value(double number);
  // With exactly `decimals` digits after the point ("%.3f"), for values whose
  // magnitude grows, like an uptime, where "%.6g" would drop digits.
  void value(double number, int decimals);
  void value(std::nullptr_t) {
    separate();
    text_ += "null";
  }
  // Not an overload of value(): a string literal would convert to bool.
  void boolean(bool b) {
    separate();
    text_ += b ? "true" : "false";
  }
  template <typename T>
  void field(std::string_view name, const T& v) {
    key(name);
    value(v);
  }
  void field(std::string_view name, const char* v) { field(name, std::string_view(v)); }
  // `v` when `present`, null when not: the key is there either way.
  template <typename T>
  void field_or_null(std::string_view name, bool present, const T& v) {
    key(name);
    if (present) {
      value(v);
    } else {
      value(nullptr);
    }
  }
  void field(std::string_view name, const std::string& v) { field(name, std::string_view(v)); }

  [[nodiscard]] const std::string& text() const { return text_; }

 private:
  void open(char bracket) {
    separate();
    text_ += bracket;
    first_.push_back(true);
  }
  void close(char bracket) {
    text_ += bracket;
    first_.pop_back();
  }
  void separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) text_ += ',';
      first_.back() = false;
    }
  }
  void write_string(std::string_view s);

  std::string text_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace zico::umctl
