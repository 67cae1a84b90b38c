#include "paging_plot.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "svg_plot.h"

namespace zico::page {
namespace {

constexpr double kWidth = 1100;
constexpr double kPanelHeight = 190;
constexpr double kStripHeight = 9;
constexpr double kLeft = 70;
constexpr double kRight = 20;
constexpr double kTop = 50;
constexpr double kGap = 70;  // below each panel: the tick labels, the strips, the x axis's name
// Under the frame's bottom (y1): tick labels to 17, then the strips, then the
// axis's name, clear of both.
constexpr double kH2dStrip = 24;
constexpr double kD2hStrip = kH2dStrip + kStripHeight + 3;
constexpr double kAxisName = kD2hStrip + kStripHeight + 17;

// One rectangle per stretch of busy time as drawn: copies closer than half a
// pixel merge, so the strip costs at most a rectangle per pixel column
// however many pages moved.
void draw_strip(std::string* svg, const plot::Frame& frame, double y, const PagingResult& run, bool to_device,
                const char* colour) {
  plot::line(svg, frame.x0, y + kStripHeight / 2, frame.x1, y + kStripHeight / 2,
             "stroke=\"#e3e3e3\" stroke-width=\"1\"");
  std::vector<std::pair<double, double>> spans;
  for (const PagingResult::Transfer& t : run.last_iteration_transfers) {
    if (t.to_device == to_device) spans.emplace_back(frame.x(t.start_ns), frame.x(t.end_ns));
  }
  std::sort(spans.begin(), spans.end());
  auto emit = [&](double x0, double x1) {
    x1 = std::max(x1, x0 + 0.3);
    *svg += "<rect x=\"" + plot::fixed(x0, 1) + "\" y=\"" + plot::fixed(y, 1) + "\" width=\"" +
            plot::fixed(x1 - x0, 1) + "\" height=\"" + plot::fixed(kStripHeight, 1) + "\" fill=\"" + colour + "\"/>\n";
  };
  for (size_t i = 0; i < spans.size();) {
    double x0 = spans[i].first, x1 = spans[i].second;
    for (++i; i < spans.size() && spans[i].first <= x1 + 0.5; ++i) x1 = std::max(x1, spans[i].second);
    emit(x0, x1);
  }
}

// Resident bytes reduced to one sample per pixel column: the column's
// largest, so the peak survives.
void reduce_to_columns(const plot::Frame& frame, const std::vector<Probe>& probes, uint64_t page_bytes,
                       std::vector<uint64_t>* times, std::vector<uint64_t>* bytes) {
  long column = -1;
  for (const Probe& probe : probes) {
    const long c = static_cast<long>(frame.x(probe.time_ns));
    const uint64_t b = uint64_t{probe.resident_pages} * page_bytes;
    if (c != column || times->empty()) {
      column = c;
      times->push_back(probe.time_ns);
      bytes->push_back(b);
    } else {
      bytes->back() = std::max(bytes->back(), b);
    }
  }
}

// A vertical line at `ns` into the steady iteration, named at the panel's
// top: the in-memory time and the lower bound, the two times a policy's is
// read against. Names at two heights, so that close lines keep both legible,
// on a white halo over the resident area.
void draw_reference(std::string* svg, const plot::Frame& frame, uint64_t ns, const char* id, const char* label,
                    int row) {
  const double x = frame.x(frame.t0 + ns);
  plot::line(svg, x, frame.y0, x, frame.y1,
             std::string("class=\"") + id + "\" stroke=\"#444\" stroke-width=\"1.2\" stroke-dasharray=\"2 3\"");
  const bool right_half = x > (frame.x0 + frame.x1) / 2;
  plot::text(svg, right_half ? x - 4 : x + 4, frame.y0 + 12 + 14 * row,
             std::string("class=\"") + id + "-label\" font-size=\"11\" fill=\"#222\" stroke=\"white\" " +
                 "stroke-width=\"3\" paint-order=\"stroke\" text-anchor=\"" + (right_half ? "end" : "start") + "\"",
             label);
}

}  // namespace

std::string render_paging_plot(const PagingStudy& study) {
  uint64_t span = 1;
  for (const PolicySummary& p : study.policies) span = std::max(span, p.iteration_ns);
  const double height = kTop + static_cast<double>(study.policies.size()) * (kPanelHeight + kGap);
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + plot::fixed(kWidth, 0) + "\" height=\"" +
                    plot::fixed(height, 0) + "\" font-family=\"sans-serif\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  plot::text(&svg, kLeft, 22, "font-size=\"15\" font-weight=\"bold\"",
             plot::escape_xml(study.name) + ": steady iteration under each paging policy");
  plot::text(&svg, kLeft, 40, "font-size=\"12\"",
             "budget " + plot::fixed(static_cast<double>(study.budget_bytes) / plot::kBytesPerGiB, 2) +
                 " GiB, peak live " + plot::fixed(static_cast<double>(study.peak_live_bytes) / plot::kBytesPerGiB, 2) +
                 " GiB; in memory " + plot::fixed(static_cast<double>(study.in_memory_iteration_ns) / 1e6, 1) +
                 " ms, lower bound " + plot::fixed(static_cast<double>(study.lower_bound_iteration_ns) / 1e6, 1) +
                 " ms (dotted lines); strips: host to device (H2D, orange), device to host (D2H, green)");
  const double top_gib = static_cast<double>(study.budget_bytes) / plot::kBytesPerGiB * 1.1;
  for (size_t i = 0; i < study.policies.size(); ++i) {
    const PolicySummary& p = study.policies[i];
    const PagingResult& run = p.run;
    const IterationStats& steady = run.iterations.back();
    plot::Frame frame;
    frame.x0 = kLeft;
    frame.x1 = kWidth - kRight;
    frame.y0 = kTop + static_cast<double>(i) * (kPanelHeight + kGap) + 20;
    frame.y1 = frame.y0 + kPanelHeight - 20;
    frame.t0 = steady.start_ns;
    frame.span = span;
    frame.y_top_gib = top_gib;
    plot::draw_axes(&svg, frame, steady.start_ns, 1e6, "", "GiB resident");
    plot::text(&svg, (frame.x0 + frame.x1) / 2, frame.y1 + kAxisName, "class=\"x-label\" text-anchor=\"middle\" font-size=\"12\"",
               "ms into the steady iteration");
    plot::text(&svg, frame.x0, frame.y0 - 6, "font-size=\"13\" font-weight=\"bold\"",
               plot::escape_xml(p.policy) + ": " + plot::fixed(static_cast<double>(p.iteration_ns) / 1e6, 1) +
                   " ms (" +
                   plot::fixed(static_cast<double>(p.iteration_ns) /
                                   static_cast<double>(std::max<uint64_t>(study.in_memory_iteration_ns, 1)),
                               2) +
                   "x in memory), " + std::to_string(p.faults) + " faults");
    std::vector<uint64_t> times;
    plot::Layer resident{"resident-" + p.policy, plot::kOkabeIto[0], "0.85", {}};
    reduce_to_columns(frame, run.last_iteration_residency, study.page_bytes, &times, &resident.bytes);
    if (!times.empty()) plot::draw_stacked_steps(&svg, frame, times, {resident});
    const double budget_y = frame.y(static_cast<double>(study.budget_bytes));
    plot::line(&svg, frame.x0, budget_y, frame.x1, budget_y,
               "class=\"budget\" stroke=\"black\" stroke-width=\"1.5\" stroke-dasharray=\"6 3\"");
    draw_reference(&svg, frame, study.in_memory_iteration_ns, "in-memory", "in memory", 0);
    draw_reference(&svg, frame, study.lower_bound_iteration_ns, "bound", "lower bound", 1);
    draw_strip(&svg, frame, frame.y1 + kH2dStrip, run, true, plot::kOkabeIto[1]);
    draw_strip(&svg, frame, frame.y1 + kD2hStrip, run, false, plot::kOkabeIto[2]);
    for (const auto& [offset, name] : {std::pair{kH2dStrip, "H2D"}, std::pair{kD2hStrip, "D2H"}}) {
      plot::text(&svg, frame.x0 - 6, frame.y1 + offset + kStripHeight - 1, "text-anchor=\"end\" font-size=\"10\"", name);
    }
  }
  svg += "</svg>\n";
  return svg;
}

bool write_paging_plot(const PagingStudy& study, const std::string& path, std::string* error) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) out << render_paging_plot(study);
  if (!out) {
    *error = "cannot write the plot to '" + path + "': " + std::strerror(errno);
    return false;
  }
  return true;
}

}  // namespace zico::page
