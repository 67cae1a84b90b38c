#include "svg_plot.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace zico::plot {
namespace {

bool between(double a, double b, double c) { return (a <= b && b <= c) || (c <= b && b <= a); }

}  // namespace

std::string escape_xml(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // XML 1.0 forbids the other C0 controls even as references.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n' || c == '\r') out += c;
    }
  }
  return out;
}

std::string fixed(double value, int decimals) {
  if (std::abs(value) < 0.5 * std::pow(10.0, -decimals)) value = 0;
  char text[64];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, value, std::chars_format::fixed, decimals);
  return ec == std::errc() ? std::string(text, end) : std::string("0");
}

double nice_step(double raw) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / magnitude;
  return (fraction < 1.5 ? 1 : fraction < 3 ? 2 : fraction < 7 ? 5 : 10) * magnitude;
}

int decimals_for(double step) { return std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9))); }

double Frame::x(uint64_t time) const {
  const uint64_t clamped = std::clamp(time, t0, t0 + span);
  return x0 + (x1 - x0) * static_cast<double>(clamped - t0) / static_cast<double>(span);
}

double y_top_for(double top_gib) {
  if (!(top_gib > 0)) return 1;
  const double wanted = top_gib * 1.05;
  const double step = nice_step(wanted / 6);
  double top = std::ceil(wanted / step - 1e-9) * step;
  if (top < wanted) top += step;
  return top;
}

double Frame::y(double bytes) const { return y1 - (y1 - y0) * (bytes / kBytesPerGiB) / y_top_gib; }

std::string points_text(const std::vector<Point>& points) {
  std::vector<Point> kept;
  kept.reserve(points.size());
  for (Point p : points) {
    p = {std::round(p.x * 10) / 10, std::round(p.y * 10) / 10};  // what the text will say
    if (!kept.empty() && kept.back().x == p.x && kept.back().y == p.y) continue;
    while (kept.size() >= 2) {
      const Point& a = kept[kept.size() - 2];
      const Point& b = kept.back();
      if (!(a.y == b.y && b.y == p.y && between(a.x, b.x, p.x)) && !(a.x == b.x && b.x == p.x && between(a.y, b.y, p.y))) {
        break;
      }
      kept.pop_back();
    }
    kept.push_back(p);
  }
  std::string out;
  out.reserve(kept.size() * 12);
  for (const Point& p : kept) {
    if (!out.empty()) out += ' ';
    out += fixed(p.x, 1);
    out += ',';
    out += fixed(p.y, 1);
  }
  return out;
}

double text_width(std::string_view text, double font_px) { return static_cast<double>(text.size()) * 0.6 * font_px; }

std::vector<std::string> wrap_text(std::string_view text, double width_px, double font_px) {
  std::vector<std::string> words;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find(' ', at), text.size());
    if (end > at) words.emplace_back(text.substr(at, end - at));
    at = end + 1;
  }
  const auto join = [&](size_t from, size_t to) {
    std::string line;
    for (size_t i = from; i < to; ++i) line += (i == from ? "" : " ") + words[i];
    return line;
  };
  std::vector<std::string> lines;
  size_t first = 0;  // the current line's first word
  for (size_t i = 0; i < words.size(); ++i) {
    if (i == first || text_width(join(first, i + 1), font_px) <= width_px) continue;
    // Break after the last clause ("...;", "...,") when that fills half the
    // line: "peak 19.99 GiB" stays whole.
    size_t cut = i;
    for (size_t j = i; j-- > first + 1;) {
      if (!words[j - 1].ends_with(';') && !words[j - 1].ends_with(',')) continue;
      if (text_width(join(first, j), font_px) >= width_px / 2) cut = j;
      break;
    }
    lines.push_back(join(first, cut));
    first = cut;
    i = cut - 1;  // the words moved down may not fit beside word i either
  }
  if (first < words.size() || lines.empty()) lines.push_back(join(first, words.size()));
  return lines;
}

void text(std::string* svg, double x, double y, std::string_view attributes, std::string_view content) {
  *svg += "<text x=\"" + fixed(x, 1) + "\" y=\"" + fixed(y, 1) + "\" " + std::string(attributes) + ">" +
          escape_xml(content) + "</text>\n";
}

void line(std::string* svg, double x1, double y1, double x2, double y2, std::string_view attributes) {
  *svg += "<line x1=\"" + fixed(x1, 1) + "\" y1=\"" + fixed(y1, 1) + "\" x2=\"" + fixed(x2, 1) + "\" y2=\"" +
          fixed(y2, 1) + "\" " + std::string(attributes) + "/>\n";
}

void draw_axes(std::string* svg, const Frame& f, uint64_t origin_ns, double ns_per_unit, std::string_view x_label,
               std::string_view y_label) {
  // y: GiB, from 0 to the top tick, with light grid lines.
  const double y_step = nice_step(f.y_top_gib / 6);
  const int y_decimals = decimals_for(y_step);
  for (int k = 0; k * y_step <= f.y_top_gib * (1 + 1e-9); ++k) {
    const double gib = k * y_step;
    const double y = f.y(gib * kBytesPerGiB);
    line(svg, f.x0, y, f.x1, y, "stroke=\"#e3e3e3\" stroke-width=\"1\"");
    text(svg, f.x0 - 6, y + 4, "class=\"y-tick\" text-anchor=\"end\" font-size=\"11\"", fixed(gib, y_decimals));
  }
  text(svg, 18, (f.y0 + f.y1) / 2,
       "text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 18 " + fixed((f.y0 + f.y1) / 2, 1) + ")\"",
       y_label);

  // x: time in the given unit, ticks at multiples of a nice step.
  const double u0 = (static_cast<double>(f.t0) - static_cast<double>(origin_ns)) / ns_per_unit;
  const double u1 = u0 + static_cast<double>(f.span) / ns_per_unit;
  const double x_step = nice_step((u1 - u0) / 8);
  const int x_decimals = decimals_for(x_step);
  for (double k = std::ceil(u0 / x_step - 1e-9); k * x_step <= u1 * (1 + 1e-12) + 1e-12; ++k) {
    const double u = k * x_step;
    const double x = f.x0 + (f.x1 - f.x0) * (u - u0) / (u1 - u0);
    line(svg, x, f.y1, x, f.y1 + 4, "stroke=\"#333\" stroke-width=\"1\"");
    text(svg, x, f.y1 + 17, "class=\"x-tick\" text-anchor=\"middle\" font-size=\"11\"", fixed(u, x_decimals));
  }
  if (!x_label.empty()) text(svg, (f.x0 + f.x1) / 2, f.y1 + 38, "text-anchor=\"middle\" font-size=\"12\"", x_label);
  line(svg, f.x0, f.y1, f.x1, f.y1, "stroke=\"#333\" stroke-width=\"1\"");
  line(svg, f.x0, f.y0, f.x0, f.y1, "stroke=\"#333\" stroke-width=\"1\"");
}

void draw_stacked_steps(std::string* svg, const Frame& f, const std::vector<uint64_t>& times,
                        const std::vector<Layer>& layers) {
  // Step vertices: each sample holds its value until the next one starts.
  std::vector<double> xs;
  std::vector<size_t> sample_of;  // which sample's value each vertex shows
  xs.reserve(times.size() * 2);
  sample_of.reserve(times.size() * 2);
  for (size_t i = 0; i < times.size(); ++i) {
    const double x = f.x(times[i]);
    if (i > 0) {
      xs.push_back(x);
      sample_of.push_back(i - 1);
    }
    xs.push_back(x);
    sample_of.push_back(i);
  }
  std::vector<uint64_t> below(times.size(), 0);
  std::vector<Point> outline;
  for (const Layer& layer : layers) {
    outline.clear();
    for (size_t v = 0; v < xs.size(); ++v) {
      const size_t i = sample_of[v];
      outline.push_back({xs[v], f.y(static_cast<double>(below[i] + layer.bytes[i]))});
    }
    for (size_t v = xs.size(); v-- > 0;) outline.push_back({xs[v], f.y(static_cast<double>(below[sample_of[v]]))});
    for (size_t i = 0; i < times.size(); ++i) below[i] += layer.bytes[i];
    *svg += "<polygon id=\"" + escape_xml(layer.id) + "\" fill=\"" + layer.fill +
            "\" fill-opacity=\"" + layer.fill_opacity + "\" stroke=\"none\" points=\"" + points_text(outline) + "\"/>\n";
  }
}

void draw_legend(std::string* svg, const Frame& frame, const std::vector<LegendEntry>& entries, bool budget_line) {
  double y = frame.y0 + 4;
  const double x = frame.x1 + 16;
  for (size_t e = entries.size(); e-- > 0;) {
    *svg += "<rect x=\"" + fixed(x, 1) + "\" y=\"" + fixed(y, 1) + "\" width=\"12\" height=\"12\" fill=\"" +
            entries[e].fill + "\"/>\n";
    text(svg, x + 18, y + 10, "class=\"legend\" font-size=\"12\"", entries[e].name);
    y += 20;
  }
  if (budget_line) {
    line(svg, x, y + 6, x + 12, y + 6, "stroke=\"#000\" stroke-width=\"1.5\"");
    text(svg, x + 18, y + 10, "class=\"legend\" font-size=\"12\"", "budget");
  }
}

}  // namespace zico::plot
