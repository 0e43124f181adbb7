#include "launch/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <tuple>

#include "core/check.h"
#include "lower/path.h"

namespace loom::calibrate {
namespace {

using runtime::CalibrationRequest;
using runtime::CommSample;
using runtime::LinearShape;
using runtime::RankMeasurements;

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}
std::string num(double v) { return fmt("%.4g", v); }

double linear_flops(const LinearShape& s) {
  return 2.0 * static_cast<double>(s.m) * static_cast<double>(s.k) * static_cast<double>(s.n);
}

// One rank's FLOP-weighted rate: every product's FLOPs over every product's time, each linear
// counted as often as the model has it.
double flops_per_s(const CalibrationRequest& req,
                   const std::vector<std::array<double, 3>>& linear_seconds) {
  double flops = 0, seconds = 0;
  for (size_t i = 0; i < req.linears.size(); ++i) {
    const auto count = static_cast<double>(req.linears[i].count);
    for (double s : linear_seconds[i]) {
      flops += count * linear_flops(req.linears[i]);
      seconds += count * s;
    }
  }
  return seconds > 0 ? flops / seconds : 0;
}

// The link values: the fit over every primitive; where noise makes it non-physical (alpha or
// beta not positive), the median of the primitives' own positive values.
AlphaBetaFit intra_fit(const std::vector<FitPoint>& all,
                       const std::vector<std::pair<std::string, AlphaBetaFit>>& per) {
  AlphaBetaFit joint;
  if (auto f = fit_alpha_beta(all); f.ok()) joint = *f;
  auto positive_median = [&](double AlphaBetaFit::*field) {
    std::vector<double> v;
    for (const auto& [name, f] : per)
      if (f.*field > 0) v.push_back(f.*field);
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  if (!(joint.alpha_s > 0)) joint.alpha_s = positive_median(&AlphaBetaFit::alpha_s);
  if (!(joint.beta_s_per_byte > 0))
    joint.beta_s_per_byte = positive_median(&AlphaBetaFit::beta_s_per_byte);
  return joint;
}

}  // namespace

Result<AlphaBetaFit> fit_alpha_beta(const std::vector<FitPoint>& points) {
  // Normal equations of min sum_i (a_i x + b_i y - 1)^2 with rows scaled by 1 / t_i.
  double saa = 0, sab = 0, sbb = 0, sa = 0, sb = 0;
  for (const FitPoint& p : points) {
    if (!(p.seconds > 0)) return Error::at("calibrate", "a measured time is not positive");
    const double a = p.alpha_coef / p.seconds, b = p.beta_coef / p.seconds;
    saa += a * a;
    sab += a * b;
    sbb += b * b;
    sa += a;
    sb += b;
  }
  const double det = saa * sbb - sab * sab;
  if (points.size() < 2 || !(std::abs(det) > 1e-12 * saa * sbb))
    return Error::at("calibrate",
                     "an alpha-beta fit needs two measurements of different message sizes");
  AlphaBetaFit fit;
  fit.alpha_s = (sa * sbb - sb * sab) / det;
  fit.beta_s_per_byte = (sb * saa - sa * sab) / det;
  fit.points = static_cast<int64_t>(points.size());
  double sq = 0;
  for (const FitPoint& p : points) {
    const double r =
        (p.alpha_coef * fit.alpha_s + p.beta_coef * fit.beta_s_per_byte) / p.seconds - 1;
    sq += r * r;
  }
  fit.rms_relative_residual = std::sqrt(sq / static_cast<double>(points.size()));
  return fit;
}

FitPoint fit_point(const CommSample& s) {
  const auto bytes = static_cast<double>(s.piece_bytes);
  const lower::PrimitiveRule* rule = lower::find_primitive(s.primitive);
  LOOM_CHECK(rule) << "no cost formula for primitive " << s.primitive;
  return {rule->cost(s.ranks, bytes, 1, 0), rule->cost(s.ranks, bytes, 0, 1), s.seconds};
}

std::vector<LinearShape> linear_shapes(const graph::Graph& planned) {
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> counts;
  for (const graph::Op& op : planned.ops()) {
    if (!op.def->weight_product || op.inputs.size() < 2) continue;
    const Shape x = op.inputs[0].shape(), w = op.inputs[1].shape();
    if (x.empty() || w.empty()) continue;
    const int64_t k = x.back();
    ++counts[{numel(x) / std::max<int64_t>(k, 1), k, w.front()}];
  }
  std::vector<LinearShape> shapes;
  for (const auto& [mkn, count] : counts)
    shapes.push_back({std::get<0>(mkn), std::get<1>(mkn), std::get<2>(mkn), count});
  return shapes;
}

std::vector<LinearShape> default_linear_mix(bool quick) {
  // Attention projections (h x h, four per block) and the MLP (h x 4h and 4h x h).
  const int64_t tokens = quick ? 512 : 2048, h = quick ? 512 : 768;
  return {{tokens, h, h, 4}, {tokens, h, 4 * h, 1}, {tokens, 4 * h, h, 1}};
}

std::vector<int64_t> default_message_bytes(bool quick) {
  std::vector<int64_t> sizes;
  const int64_t last = quick ? int64_t{4} << 20 : int64_t{64} << 20;
  for (int64_t b = 1024; b <= last; b *= quick ? 16 : 4) sizes.push_back(b);
  return sizes;
}

namespace {

double mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// Each rank's matrix-product rate with all ranks busy, rank 0's alone, and the FLOPs of the mix.
Status rank_rates(const CalibrationRequest& request, const std::vector<RankMeasurements>& ranks,
                  Calibration& c) {
  for (const RankMeasurements& m : ranks) {
    if (m.linear_seconds.size() != request.linears.size())
      return Error::at("calibrate", "rank " + std::to_string(m.rank) + " timed " +
                                        std::to_string(m.linear_seconds.size()) + " linears of " +
                                        std::to_string(request.linears.size()));
    c.rank_flops_per_s.push_back(flops_per_s(request, m.linear_seconds));
  }
  const auto& alone = ranks.front().alone_linear_seconds;
  if (alone.size() == request.linears.size()) c.alone_flops_per_s = flops_per_s(request, alone);
  for (const LinearShape& s : request.linears)
    c.linear_flops += 3 * linear_flops(s) * static_cast<double>(s.count);
  return Status::success();
}

// Alpha and beta per primitive from rank 0's timings (it takes part in each, send/recv
// included), and one fit over all of them.
Status fit_primitives(const RankMeasurements& timer, Calibration& c) {
  std::vector<FitPoint> all;
  for (const std::string& primitive : runtime::calibrated_primitives()) {
    std::vector<FitPoint> points;
    for (const CommSample& s : timer.comm)
      if (s.primitive == primitive) points.push_back(fit_point(s));
    if (points.empty()) continue;
    auto fit = fit_alpha_beta(points);
    if (!fit.ok()) return Error::at("calibrate", primitive + ": " + fit.error().message);
    c.per_primitive.emplace_back(primitive, *fit);
    all.insert(all.end(), points.begin(), points.end());
  }
  c.intra = intra_fit(all, c.per_primitive);
  return Status::success();
}

// The node's rate: the most its busy ranks sustain together, over every number of them
// measured (time-slicing more ranks than cores costs some of it).
double node_rate(const CalibrationRequest& request, const std::vector<RankMeasurements>& ranks,
                 const Calibration& c) {
  double together = std::accumulate(c.rank_flops_per_s.begin(), c.rank_flops_per_s.end(), 0.0);
  for (size_t level = 0; level < runtime::partial_busy_levels(ranks.front().world_size).size();
       ++level) {
    double sum = 0;
    for (const RankMeasurements& m : ranks)
      if (level < m.level_linear_seconds.size() &&
          m.level_linear_seconds[level].size() == request.linears.size())
        sum += flops_per_s(request, m.level_linear_seconds[level]);
    together = std::max(together, sum);
  }
  return together;
}

// Every value the calibrated model rests on is positive and finite.
Status check_measured(const CostModel& model) {
  const std::pair<const char*, double> values[] = {
      {"device_flops_per_s", model.device_flops_per_s},
      {"node_flops_per_s", model.node_flops_per_s},
      {"device_memory_bytes", model.device_memory_bytes},
      {"local_beta_s_per_byte", model.local_beta_s_per_byte},
      {"intra_alpha_s", model.intra_alpha_s},
      {"intra_beta_s_per_byte", model.intra_beta_s_per_byte}};
  for (const auto& [key, v] : values)
    if (!(v > 0) || !std::isfinite(v))
      return Error::at(
          key, std::string(key) + ": the measurement gave " + num(v) + ", not a positive value");
  return Status::success();
}

}  // namespace

Result<Calibration> combine(const CalibrationRequest& request,
                            const std::vector<RankMeasurements>& ranks,
                            const std::string& base_preset, std::vector<std::string> header) {
  if (ranks.empty()) return Error::at("calibrate", "no rank reported its measurements");
  const CostModelFile& builtin = builtin_cost_models();
  Calibration c;
  c.base_preset = base_preset;
  c.header = std::move(header);
  for (const auto& [name, m] : builtin.presets)
    if (name == base_preset) c.model = m;
  LOOM_TRY(rank_rates(request, ranks, c));
  std::vector<double> copy, memory;
  for (const RankMeasurements& m : ranks) {
    copy.push_back(m.copy_seconds_per_byte);
    memory.push_back(m.memory_bytes);
  }
  const RankMeasurements& timer = ranks.front();
  LOOM_TRY(fit_primitives(timer, c));

  c.model.name = "calibrated";
  // A device's rate is what it sustains alone; the node's, what all its ranks sustain at once
  // (less than the sum of the devices' where ranks share cores).
  c.model.device_flops_per_s =
      c.alone_flops_per_s > 0 ? c.alone_flops_per_s : mean(c.rank_flops_per_s);
  c.model.node_flops_per_s = node_rate(request, ranks, c);
  for (const auto& [name, fit] : c.per_primitive)
    if (fit.alpha_s > 0 && fit.beta_s_per_byte > 0)
      c.model.set_intra_link(name, {fit.alpha_s, fit.beta_s_per_byte});
  c.model.device_memory_bytes = std::floor(*std::min_element(memory.begin(), memory.end()));
  c.model.local_beta_s_per_byte = mean(copy);
  c.model.intra_alpha_s = c.intra.alpha_s;
  c.model.intra_beta_s_per_byte = c.intra.beta_s_per_byte;
  c.model.devices_per_node = timer.world_size;
  LOOM_TRY(check_measured(c.model));
  return c;
}

std::string to_yaml(const Calibration& c) {
  const CostModel& m = c.model;
  std::ostringstream y;
  for (const std::string& line : c.header) y << "# " << line << "\n";
  y << "#\n# A flat cost model (cost.file: FILE, or loom plan --cost-model FILE).\n";
  std::string per_rank;
  for (double f : c.rank_flops_per_s) per_rank += (per_rank.empty() ? "" : ", ") + num(f);
  if (c.alone_flops_per_s > 0)
    y << "device_flops_per_s: " << num(m.device_flops_per_s)
      << "  # FLOP-weighted matrix-product rate of rank 0 computing alone\n";
  else
    y << "device_flops_per_s: " << num(m.device_flops_per_s)
      << "  # mean over ranks of FLOP-weighted matrix-product rates\n";
  y << "node_flops_per_s: " << num(m.node_flops_per_s)
    << "  # the most the ranks sustain together, of 2, 4, ... and all of them at once (all: "
    << per_rank << ")\n";
  y << "device_memory_bytes: " << fmt("%.0f", m.device_memory_bytes) << "  # "
    << fmt("%.2f", m.device_memory_bytes / double(1ull << 30)) << " GiB per rank\n";
  y << "local_beta_s_per_byte: " << num(m.local_beta_s_per_byte) << "  # a large copy at "
    << num(1e-9 / m.local_beta_s_per_byte) << " GB/s\n";
  y << "intra_alpha_s: " << num(m.intra_alpha_s)
    << "  # least squares over every primitive below, rms relative residual "
    << fmt("%.3f", c.intra.rms_relative_residual) << "\n";
  y << "intra_beta_s_per_byte: " << num(m.intra_beta_s_per_byte) << "  # "
    << num(1e-9 / m.intra_beta_s_per_byte) << " GB/s\n";
  y << "# Per primitive, fitted through lower's cost formula of each (rms relative "
       "residual, sizes);\n# a primitive whose fit is not positive takes the values above.\n";
  for (const auto& [name, f] : c.per_primitive) {
    const CostModel::Link own = m.intra_link(name);
    y << "intra_" << name << "_alpha_s: " << num(own.alpha_s) << "  # residual "
      << fmt("%.3f", f.rms_relative_residual) << ", " << f.points << " sizes\n";
    y << "intra_" << name << "_beta_s_per_byte: " << num(own.beta_s_per_byte) << "  # "
      << num(1e-9 / own.beta_s_per_byte) << " GB/s\n";
  }
  y << "# Not measured (one machine has no link between nodes): the " << c.base_preset
    << " preset's values.\n";
  y << "inter_alpha_s: " << num(m.inter_alpha_s) << "\n";
  y << "inter_beta_s_per_byte: " << num(m.inter_beta_s_per_byte) << "\n";
  y << "devices_per_node: " << m.devices_per_node << "  # the ranks of this run\n";
  return y.str();
}

std::string to_table(const Calibration& c) {
  const CostModel& m = c.model;
  std::ostringstream t;
  char line[160];
  auto row = [&](const char* key, const std::string& value, const std::string& note) {
    std::snprintf(line, sizeof line, "%-24s %-14s %s\n", key, value.c_str(), note.c_str());
    t << line;
  };
  row("key", "value", "measured as");
  row("device_flops_per_s", num(m.device_flops_per_s),
      c.alone_flops_per_s > 0 ? "matrix products, FLOP-weighted, rank 0 alone"
                              : "matrix products, FLOP-weighted, mean of " +
                                    std::to_string(c.rank_flops_per_s.size()) + " ranks");
  row("node_flops_per_s", num(m.node_flops_per_s),
      "the most of 2, 4, ... and " + std::to_string(c.rank_flops_per_s.size()) +
          " ranks at once, summed");
  row("device_memory_bytes", fmt("%.0f", m.device_memory_bytes), "per rank");
  row("local_beta_s_per_byte", num(m.local_beta_s_per_byte),
      num(1e-9 / m.local_beta_s_per_byte) + " GB/s copy");
  row("intra_alpha_s", num(m.intra_alpha_s),
      "all primitives, residual " + fmt("%.3f", c.intra.rms_relative_residual));
  row("intra_beta_s_per_byte", num(m.intra_beta_s_per_byte),
      num(1e-9 / m.intra_beta_s_per_byte) + " GB/s");
  for (const auto& [name, f] : c.per_primitive)
    row(("  " + name).c_str(), num(f.alpha_s),
        "beta " + num(f.beta_s_per_byte) + ", residual " + fmt("%.3f", f.rms_relative_residual));
  row("inter_alpha_s", num(m.inter_alpha_s), "the " + c.base_preset + " preset's (not measured)");
  row("inter_beta_s_per_byte", num(m.inter_beta_s_per_byte),
      "the " + c.base_preset + " preset's (not measured)");
  row("devices_per_node", std::to_string(m.devices_per_node), "ranks of this run");
  return t.str();
}

std::string request_to_json(const CalibrationRequest& r) {
  nlohmann::json linears = nlohmann::json::array();
  for (const LinearShape& s : r.linears) linears.push_back({s.m, s.k, s.n, s.count});
  return nlohmann::json{{"device", r.device},          {"precision", r.precision},
                        {"backend", r.backend},        {"timeout_s", r.timeout_s},
                        {"linears", linears},          {"message_bytes", r.message_bytes},
                        {"copy_bytes", r.copy_bytes},  {"seconds_per_point", r.seconds_per_point},
                        {"max_repeats", r.max_repeats}}
      .dump();
}

Result<CalibrationRequest> request_from_json(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    CalibrationRequest r;
    r.device = j.at("device").get<std::string>();
    r.precision = j.at("precision").get<std::string>();
    r.backend = j.at("backend").get<std::string>();
    r.timeout_s = j.at("timeout_s");
    for (const auto& s : j.at("linears"))
      r.linears.push_back({s.at(0).get<int64_t>(), s.at(1).get<int64_t>(), s.at(2).get<int64_t>(),
                           s.at(3).get<int64_t>()});
    r.message_bytes = j.at("message_bytes").get<std::vector<int64_t>>();
    r.copy_bytes = j.at("copy_bytes");
    r.seconds_per_point = j.at("seconds_per_point");
    r.max_repeats = j.at("max_repeats");
    return r;
  } catch (const nlohmann::json::exception& e) {
    return Error::at("--worker-request", std::string("malformed calibration request: ") + e.what());
  }
}

std::string measurements_to_json(const RankMeasurements& m) {
  nlohmann::json comm = nlohmann::json::array();
  for (const CommSample& s : m.comm)
    comm.push_back({s.primitive, s.ranks, s.piece_bytes, s.seconds});
  return nlohmann::json{{"rank", m.rank},
                        {"world_size", m.world_size},
                        {"intra_op_threads", m.intra_op_threads},
                        {"device", m.device},
                        {"linear_seconds", m.linear_seconds},
                        {"alone_linear_seconds", m.alone_linear_seconds},
                        {"level_linear_seconds", m.level_linear_seconds},
                        {"copy_seconds_per_byte", m.copy_seconds_per_byte},
                        {"memory_bytes", m.memory_bytes},
                        {"comm", comm}}
      .dump();
}

Result<RankMeasurements> measurements_from_json(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    RankMeasurements m;
    m.rank = j.at("rank");
    m.world_size = j.at("world_size");
    m.intra_op_threads = j.at("intra_op_threads");
    m.device = j.at("device").get<std::string>();
    m.linear_seconds = j.at("linear_seconds").get<std::vector<std::array<double, 3>>>();
    m.alone_linear_seconds = j.at("alone_linear_seconds").get<std::vector<std::array<double, 3>>>();
    m.level_linear_seconds =
        j.at("level_linear_seconds").get<std::vector<std::vector<std::array<double, 3>>>>();
    m.copy_seconds_per_byte = j.at("copy_seconds_per_byte");
    m.memory_bytes = j.at("memory_bytes");
    for (const auto& s : j.at("comm"))
      m.comm.push_back({s.at(0).get<std::string>(), s.at(1).get<int64_t>(), s.at(2).get<int64_t>(),
                        s.at(3).get<double>()});
    return m;
  } catch (const nlohmann::json::exception& e) {
    return Error::at("calibrate", std::string("malformed rank measurements: ") + e.what());
  }
}

}  // namespace loom::calibrate
