#include "json_writer.h"

#include <cmath>
#include <cstdio>

namespace zico::umctl {

void JsonWriter::value(double number) {
  separate();
  if (!std::isfinite(number)) {
    text_ += "null";  // JSON has no NaN or infinity
    return;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.6g", number);
  text_ += buffer;
}

void JsonWriter::value(double number, int decimals) {
  separate();
  if (!std::isfinite(number)) {
    text_ += "null";
    return;
  }
  char buffer[400];  // DBL_MAX has 309 digits before the point
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, number);
  text_ += buffer;
}

void JsonWriter::write_string(std::string_view s) {
  text_ += '"';
  for (const char c : s) {
    switch (c) {
      case '"': text_ += "\\\""; break;
      case '\\': text_ += "\\\\"; break;
      case '\n': text_ += "\\n"; break;
      case '\t': text_ += "\\t"; break;
      case '\r': text_ += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          text_ += escaped;
        } else {
          text_ += c;
        }
    }
  }
  text_ += '"';
}

}  // namespace zico::umctl
