#include "scheduler/render.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

namespace loom::sched {

namespace {

constexpr double kMicrosPerUnit = 1000;  // one time unit is drawn as 1 ms

std::string slice_name(const Block& b) { return block_slice_name(to_char(b.kind), b.stage, b.mb); }

// Distinct hues for neighbouring micro-batches (golden angle); lightness by kind.
std::string colour(const Block& b) {
  const double hue = std::fmod(b.mb.value() * 137.508, 360.0);
  int light = 55;
  switch (b.kind) {
    case BlockKind::kF:
      light = 70;
      break;
    case BlockKind::kB:
      light = 42;
      break;
    case BlockKind::kI:
      light = 50;
      break;
    case BlockKind::kW:
      light = 82;
      break;
  }
  std::ostringstream os;
  os << "hsl(" << static_cast<int>(hue) << ",65%," << light << "%)";
  return os.str();
}

}  // namespace

std::string block_slice_name(char kind, StageId stage, MicroBatch mb) {
  return std::string(1, kind) + " s" + stage.to_string() + " mb" + mb.to_string();
}

std::string to_chrome_trace(const Schedule& s, const Timeline& t) {
  using nlohmann::json;
  json events = json::array();
  for (int d = 0; d < s.num_devices(); ++d) {
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", d},
                      {"tid", 0},
                      {"args", {{"name", "device " + std::to_string(d)}}}});
    for (int i : s.order()[d]) {
      const Block& b = s.workload().block(i);
      events.push_back({{"name", slice_name(b)},
                        {"cat", std::string(1, to_char(b.kind))},
                        {"ph", "X"},
                        {"pid", d},
                        {"tid", 0},
                        {"ts", t.start[i] * kMicrosPerUnit},
                        {"dur", (t.end[i] - t.start[i]) * kMicrosPerUnit},
                        {"args",
                         {{"block", b.id().to_string()},
                          {"stage", b.stage.value()},
                          {"micro_batch", b.mb.value()},
                          {"kind", std::string(1, to_char(b.kind))}}}});
    }
    for (const auto& point : t.memory_trace[d])
      events.push_back({{"name", "memory"},
                        {"ph", "C"},
                        {"pid", d},
                        {"tid", 0},
                        {"ts", point.time * kMicrosPerUnit},
                        {"args", {{"activations", point.memory}}}});
  }
  json doc = {
      {"traceEvents", events},
      {"displayTimeUnit", "ms"},
      {"otherData",
       {{"schedule", s.name()}, {"makespan", t.makespan}, {"bubble_ratio", t.bubble_ratio}}}};
  return doc.dump(1) + "\n";
}

std::string to_svg(const Schedule& s, const Timeline& t) {
  const double left = 70, top = 30, row_h = 28, gap = 6;
  const double span = t.makespan > 0 ? t.makespan : 1;
  const double width = std::max(600.0, std::min(2400.0, span * 24));
  const double scale = width / span;
  const int p = s.num_devices();
  const double height = top + p * (row_h + gap) + 40;
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << left + width + 20 << "\" height=\""
     << height << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  os << "<title>loom schedule " << s.name() << ": makespan " << t.makespan << ", bubble ratio "
     << t.bubble_ratio << "</title>\n";
  os << "<text x=\"" << left << "\" y=\"18\">" << (s.name().empty() ? "schedule" : s.name())
     << " — makespan " << t.makespan << ", bubble " << std::round(t.bubble_ratio * 1000) / 10
     << "%</text>\n";
  for (int d = 0; d < p; ++d) {
    const double y = top + d * (row_h + gap);
    os << "<text x=\"8\" y=\"" << y + row_h * 0.65 << "\">device " << d << "</text>\n";
    os << "<line x1=\"" << left << "\" y1=\"" << y + row_h << "\" x2=\"" << left + width
       << "\" y2=\"" << y + row_h << "\" stroke=\"#ccc\"/>\n";
    for (int i : s.order()[d]) {
      const Block& b = s.workload().block(i);
      const double x = left + t.start[i] * scale, w = (t.end[i] - t.start[i]) * scale;
      os << "<rect class=\"block\" x=\"" << x << "\" y=\"" << y << "\" width=\"" << w
         << "\" height=\"" << row_h << "\" fill=\"" << colour(b)
         << "\" stroke=\"#333\" stroke-width=\"0.5\""
         << (b.kind == BlockKind::kW ? " stroke-dasharray=\"2,1\"" : "") << "><title>"
         << b.id().describe() << " [" << t.start[i] << ", " << t.end[i] << ")</title></rect>\n";
      if (w >= 14)
        os << "<text x=\"" << x + w / 2 << "\" y=\"" << y + row_h * 0.65
           << "\" text-anchor=\"middle\" font-size=\"10\">" << to_char(b.kind) << b.mb.value()
           << "</text>\n";
    }
  }
  // Time axis: about ten ticks.
  const double axis_y = top + p * (row_h + gap) + 4;
  os << "<line x1=\"" << left << "\" y1=\"" << axis_y << "\" x2=\"" << left + width << "\" y2=\""
     << axis_y << "\" stroke=\"#000\"/>\n";
  double step = std::pow(10, std::floor(std::log10(span / 10)));
  if (span / step > 20)
    step *= 5;
  else if (span / step > 10)
    step *= 2;
  for (double x = 0; x <= span + 1e-9; x += step) {
    os << "<line x1=\"" << left + x * scale << "\" y1=\"" << axis_y << "\" x2=\""
       << left + x * scale << "\" y2=\"" << axis_y + 4 << "\" stroke=\"#000\"/><text x=\""
       << left + x * scale << "\" y=\"" << axis_y + 16 << "\" text-anchor=\"middle\">" << x
       << "</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace loom::sched
