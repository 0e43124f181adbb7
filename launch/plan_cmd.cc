// loom plan CONFIG [key=value ...] --world-size N --out DIR: the plan without processes or
// LibTorch. Writes every rank's program (programs/rank_K.txt), the pipeline schedule (CSV in
// torch.distributed.pipelining's format, chrome trace, SVG) and a per-rank summary
// (summary.txt, also printed): parameters held, an estimate of peak memory, and the bytes each
// rank sends per step by primitive.
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "exec/lower/plan_file.h"
#include "exec/lower/program.h"
#include "exec/lower/schedule_order.h"
#include "graph/op_registry.h"
#include "launch/cli_parse.h"
#include "launch/command.h"
#include "launch/files.h"
#include "launch/plan_figures.h"
#include "models/model.h"
#include "planner/cost.h"
#include "scheduler/csv.h"
#include "scheduler/predefined.h"
#include "scheduler/render.h"
#include "scheduler/simulator.h"

namespace loom::cli {
namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "loom plan: error: %s\n", message.c_str());
  return kExitBadInput;
}

// Seconds of the steps of `path` that `rank` takes part in (their cost-model cost).
double path_seconds(const lower::CommPath& path, int64_t rank) {
  double t = 0;
  for (const lower::CommStep& st : path.steps) {
    bool in = false;
    for (const auto& layout : {&st.before, &st.after})
      for (DeviceId d : layout->devices) in = in || d.value() == rank;
    if (in) t += st.cost_s;
  }
  return t;
}

// A ring all-reduce of `bytes` over `devices`: 2 (k - 1) messages of bytes / k, over the
// network when the group spans nodes.
double all_reduce_seconds(const lower::CostModel& cost, const std::vector<DeviceId>& devices, double bytes) {
  const double k = static_cast<double>(devices.size());
  if (k < 2) return 0;
  bool inter = false;
  for (DeviceId d : devices) inter = inter || d.value() / cost.devices_per_node != devices[0].value() / cost.devices_per_node;
  const double alpha = inter ? cost.inter_alpha_s : cost.intra_alpha_s;
  const double beta = inter ? cost.inter_beta_s_per_byte : cost.intra_beta_s_per_byte;
  return 2 * (k - 1) * (alpha + bytes / k * beta);
}

// Adds a "communication" track under every pipeline device of the chrome trace: after each
// forward (backward) block, the cost-model time of the adapters' forward (gradient) paths the
// device's slowest rank takes part in for one micro-batch. The simulated blocks do not wait
// for it: the track shows how much communication each block brings, not a re-simulation.
std::string with_comm_track(const std::string& trace, const lower::Lowered& lowered, int64_t ranks_per_stage) {
  auto json = nlohmann::json::parse(trace, nullptr, false);
  if (json.is_discarded() || !json.contains("traceEvents")) return trace;
  const int64_t world = static_cast<int64_t>(lowered.programs.size());
  std::map<int64_t, std::pair<double, double>> per_device;  // pp index -> (forward s, backward s)
  for (int64_t r = 0; r < world; ++r) {
    double f = 0, b = 0;
    for (const auto& a : lowered.adapters) {
      f += path_seconds(a.forward, r);
      b += path_seconds(a.backward, r);
    }
    auto& slot = per_device[r / ranks_per_stage];
    slot.first = std::max(slot.first, f);
    slot.second = std::max(slot.second, b);
  }
  nlohmann::json added = nlohmann::json::array();
  std::set<int64_t> named;
  for (const auto& e : json["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    const std::string cat = e.value("cat", "");
    if (cat != "F" && cat != "B") continue;
    const int64_t pid = e.value("pid", 0);
    const auto it = per_device.find(pid);
    const double dur_us = it == per_device.end() ? 0 : (cat == "F" ? it->second.first : it->second.second) * 1e6;
    if (dur_us <= 0) continue;
    if (named.insert(pid).second)
      added.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 1},
                       {"args", {{"name", "communication"}}}});
    added.push_back({{"name", "comm after " + e.value("name", std::string())},
                     {"cat", "comm"},
                     {"ph", "X"},
                     {"pid", pid},
                     {"tid", 1},
                     {"ts", e.value("ts", 0.0) + e.value("dur", 0.0)},
                     {"dur", dur_us}});
  }
  for (auto& e : added) json["traceEvents"].push_back(std::move(e));
  return json.dump(1);
}

// Bytes an op keeps for its backward pass besides its outputs: attention keeps its softmax
// probabilities [b, h, s, t] and contiguous per-head copies of q, k and v.
double saved_extra_bytes(const graph::Op& op) {
  if (op.type() != "attention" || op.inputs.size() < 3) return 0;
  const Shape q = op.inputs[0].shape(), k = op.inputs[1].shape();
  const int64_t d = op.attrs().get_or<int64_t>("d", 0);
  if (q.size() != 3 || k.size() != 3 || d <= 0) return 0;
  const double heads = static_cast<double>(q[2] / d);
  const double probs = static_cast<double>(q[0]) * heads * static_cast<double>(q[1]) * static_cast<double>(k[1]);
  return 4 * (probs + 3 * static_cast<double>(numel(q)));
}

std::string seconds(double s) {
  char buf[32];
  if (s >= 1) std::snprintf(buf, sizeof buf, "%.2f s", s);
  else if (s >= 1e-3) std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  return buf;
}

}  // namespace

int plan_main(const Args& args) {
  CLI::App app{"Make a plan without starting processes: per-rank programs, schedule, memory and "
               "communication estimates.", "loom plan"};
  std::string config_path, out_dir;
  std::vector<std::string> overrides;
  int64_t world_size = 0;
  bool no_plan_json = false;
  app.add_option("config", config_path, "the run's YAML config")->required();
  app.add_option("overrides", overrides, "key=value overrides");
  app.add_option("--world-size", world_size, "ranks to plan for (default: dp x tp x pp)");
  app.add_option("--out", out_dir, "directory for the plan files")->required();
  app.add_flag("--no-plan-json", no_plan_json, "skip plan.json (the whole plan; large for thousands of ranks)");
  if (auto code = parse_args(app, args, "plan")) return *code;
  auto config = load_config(config_path, overrides);
  if (!config.ok()) return fail(config.error().message);
  if (world_size == 0) world_size = config->parallel.world_size();
  if (world_size < 1) return fail("--world-size must be positive, got " + std::to_string(world_size));

  auto ops = graph::OpRegistry::with_builtin_ops();
  auto planned = models::build_plan(*config, ops, planner::PolicyRegistry::with_builtin_policies(), world_size);
  if (!planned.ok()) return fail(planned.error().message);
  auto order = lower::pipeline_order(*config, config->micro_batches());
  if (!order.ok()) return fail(order.error().message);
  lower::PathFinder paths;
  auto lowered = lower::lower(*planned, world_size, config->micro_batches(), paths,
                              order->empty() ? nullptr : &*order);
  if (!lowered.ok()) return fail(lowered.error().message);

  // Compute time per micro-batch from the cost model: forward FLOPs of each rank's ops at the
  // device's sustained rate, backward twice that. A pipeline stage takes as long as its slowest
  // rank; the simulated schedule (in microseconds) gives the step's compute time and bubbles.
  const auto& par = config->parallel;
  const lower::CostModel cost;
  const double m = static_cast<double>(config->micro_batches());
  std::vector<double> fwd_s(static_cast<size_t>(world_size), 0);
  for (const auto& op : planned->ops())
    fwd_s[static_cast<size_t>(op.device.value())] += planner::op_flops(op) / cost.device_flops_per_s;
  const int64_t ranks_per_stage = par.tp * par.dp;
  double unit_s = 0;  // the slowest stage's forward per micro-batch
  for (double f : fwd_s) unit_s = std::max(unit_s, f);
  // Micro-batches whose activations a rank holds at once: the schedule's peak for pipelines; all
  // of them without one when several ranks run (the lowered program runs every forward before
  // the backwards); one in the single-process executor.
  const double flat_units = world_size > 1 ? m : 1.0;
  std::vector<double> peak_units(static_cast<size_t>(par.pp), flat_units);
  std::vector<double> compute_s(static_cast<size_t>(world_size), 0), bubble_of(static_cast<size_t>(world_size), 0);
  for (int64_t r = 0; r < world_size; ++r) compute_s[static_cast<size_t>(r)] = 3 * m * fwd_s[static_cast<size_t>(r)];
  double bubble = 0;
  std::string csv, trace, svg;
  if (par.pp > 1 || par.chunks > 1) {
    auto kind = sched::parse_schedule_kind(par.schedule == "search" ? "1f1b" : par.schedule);
    if (kind.ok()) {
      auto spec = sched::PipelineSpec::of(static_cast<int>(par.pp), static_cast<int>(config->micro_batches()),
                                          static_cast<int>(par.chunks));
      // The renderer draws one time unit as 1 ms: simulate in milliseconds.
      const double unit_ms = std::max(unit_s / static_cast<double>(par.chunks), 1e-15) * 1e3;
      spec.fwd = unit_ms;
      spec.bwd = 2 * unit_ms;
      auto schedule = sched::build_predefined(*kind, spec);
      if (!schedule.ok()) return fail(config->where("parallel.schedule") + ": parallel.schedule: " + schedule.error().message);
      auto timeline = sched::simulate(*schedule);
      if (timeline.ok()) {
        for (size_t d = 0; d < peak_units.size() && d < timeline->peak_memory.size(); ++d)
          peak_units[d] = timeline->peak_memory[d];
        bubble = timeline->bubble_ratio;
        for (int64_t r = 0; r < world_size; ++r) {
          const size_t d = static_cast<size_t>(r / ranks_per_stage);
          compute_s[static_cast<size_t>(r)] = timeline->makespan * 1e-3;
          if (d < timeline->busy.size() && timeline->makespan > 0)
            bubble_of[static_cast<size_t>(r)] = 1 - timeline->busy[d] / timeline->makespan;
        }
        if (auto c = sched::to_csv(*schedule); c.ok()) csv = *c;
        trace = with_comm_track(sched::to_chrome_trace(*schedule, *timeline), *lowered, ranks_per_stage);
        svg = sched::to_svg(*schedule, *timeline);
      }
    }
  }

  namespace fs = std::filesystem;
  const fs::path out(out_dir);
  std::error_code ec;
  fs::create_directories(out / "programs", ec);
  if (ec) return fail("--out: cannot create '" + out.string() + "': " + ec.message());
  for (int64_t r = 0; r < world_size; ++r)
    if (Status s = write_file_atomically(out / "programs" / ("rank_" + std::to_string(r) + ".txt"),
                                         lower::listing(*planned, *lowered, Rank(r)));
        !s.ok())
      return fail(s.error().message);
  if (!no_plan_json) {
    auto model = models::build_model(*config, ops);
    if (!model.ok()) return fail(model.error().message);
    lower::PlanFile plan;
    plan.code_fingerprint =
        lower::code_fingerprint(ops.types(), planner::PolicyRegistry::with_builtin_policies().names());
    plan.model_digest = lower::model_digest(*model);
    plan.hash = lower::plan_hash(*config, plan.model_digest, plan.code_fingerprint);
    plan.config_yaml = to_yaml(*config);
    plan.world_size = world_size;
    plan.micro_batches = config->micro_batches();
    plan.graph = std::move(*planned);
    plan.lowered = std::move(*lowered);
    plan.schedule_csv = csv;
    auto json = lower::plan_to_json(plan);
    if (!json.ok()) return fail(json.error().message);
    if (Status s = write_file_atomically(out / "plan.json", *json); !s.ok()) return fail(s.error().message);
    *planned = std::move(plan.graph);
    *lowered = std::move(plan.lowered);
  }
  if (!csv.empty()) (void)write_file_atomically(out / "schedule.csv", csv);
  if (!trace.empty()) (void)write_file_atomically(out / "timeline.json", trace);
  if (!svg.empty()) (void)write_file_atomically(out / "schedule.svg", svg);

  // Per-rank figures.
  // The optimizer keeps two moments (AdamW) or one buffer (SGD, allocated with or without
  // momentum); its step makes temporaries the size of the piece it updates: AdamW's sqrt and
  // denominator, SGD's decayed gradient.
  const bool adamw = config->optimizer.type == "adamw";
  const double opt_copies = adamw ? 2 : 1;
  const double opt_temporaries = adamw ? 2 : config->optimizer.weight_decay != 0 ? 1 : 0;
  std::vector<double> largest_piece(static_cast<size_t>(world_size), 0);
  // Autograd sums the gradients of a parameter read by several ops (a tied embedding and LM
  // head) in its input buffer before accumulating: the two incoming gradients and their sum.
  std::vector<std::map<std::string, std::pair<double, int>>> uses(static_cast<size_t>(world_size));
  std::vector<double> params(static_cast<size_t>(world_size), 0), acts(static_cast<size_t>(world_size), 0);
  std::vector<std::map<std::string, double>> sent(static_cast<size_t>(world_size));
  std::vector<std::set<std::string>> seen(static_cast<size_t>(world_size));
  for (const auto& op : planned->ops()) {
    const size_t r = static_cast<size_t>(op.device.value());
    acts[r] += planner::op_output_bytes(*planned, op) + saved_extra_bytes(op);
    for (const auto& in : op.inputs) {
      const auto& t = planned->tensor(in.tensor);
      if (t.role == graph::TensorRole::kParameter) {
        auto& u = uses[r][t.name + in.ranges_string()];
        u.first = static_cast<double>(numel(in.shape()) * 4);
        ++u.second;
      }
      if (t.role == graph::TensorRole::kParameter && seen[r].insert(t.name + in.ranges_string()).second) {
        params[r] += static_cast<double>(numel(in.shape()));
        largest_piece[r] = std::max(largest_piece[r], static_cast<double>(numel(in.shape()) * 4));
      }
    }
  }
  // What an adapter delivers is a new tensor on each consumer rank (an all-reduced sum, a
  // gathered or received piece), held while its micro-batch is in flight like an op output.
  for (const auto& a : lowered->adapters) {
    const auto& t = planned->tensor(a.tensor);
    for (int64_t pos = 0; pos < a.to.size(); ++pos)
      acts[static_cast<size_t>(a.to.devices[static_cast<size_t>(pos)].value())] +=
          static_cast<double>(numel(a.to.piece(pos, a.tensor, t.shape).shape()) * size_bytes(t.dtype));
  }
  // The flat buffer each gradient all-reduce bucket is copied into while it is reduced.
  std::vector<double> sync_buffer(static_cast<size_t>(world_size), 0);
  for (int64_t r = 0; r < world_size; ++r)
    for (int64_t id : lowered->programs[static_cast<size_t>(r)].grad_syncs)
      sync_buffer[static_cast<size_t>(r)] +=
          static_cast<double>(numel(lowered->grad_syncs[static_cast<size_t>(id)].piece.shape()) * 4);
  // Communication time: each adapter's forward and gradient paths per micro-batch (the steps
  // this rank takes part in), and the gradient all-reduces once per step, from the cost model.
  std::vector<double> comm_s(static_cast<size_t>(world_size), 0);
  for (int64_t r = 0; r < world_size; ++r) {
    for (const auto& a : lowered->adapters)
      comm_s[static_cast<size_t>(r)] += m * (path_seconds(a.forward, r) + path_seconds(a.backward, r));
    for (int64_t id : lowered->programs[static_cast<size_t>(r)].grad_syncs) {
      const auto& g = lowered->grad_syncs[static_cast<size_t>(id)];
      comm_s[static_cast<size_t>(r)] += all_reduce_seconds(cost, g.devices, static_cast<double>(numel(g.piece.shape()) * 4));
    }
  }
  for (int64_t r = 0; r < world_size; ++r) {
    for (const auto& a : lowered->adapters) {
      const auto& t = planned->tensor(a.tensor);
      add_path_bytes(a.forward, t.shape, size_bytes(t.dtype), r, m, sent[static_cast<size_t>(r)]);
      add_path_bytes(a.backward, t.shape, size_bytes(t.dtype), r, m, sent[static_cast<size_t>(r)]);
    }
    for (int64_t id : lowered->programs[static_cast<size_t>(r)].grad_syncs) {
      const auto& s = lowered->grad_syncs[static_cast<size_t>(id)];
      const double k = static_cast<double>(s.devices.size());
      sent[static_cast<size_t>(r)]["grad all_reduce"] +=
          2 * (k - 1) / k * static_cast<double>(numel(s.piece.shape()) * 4);
    }
  }
  std::ostringstream table;
  table << "plan: " << config->model.type << " " << config->model.preset << " on " << world_size
        << " ranks (dp " << par.dp << " x tp " << par.tp << " x pp " << par.pp << "), "
        << config->micro_batches() << " micro-batches per step, schedule " << par.schedule;
  if (par.pp > 1) table << ", bubble ratio " << bubble;
  double step_s = 0;
  for (int64_t r = 0; r < world_size; ++r)
    step_s = std::max(step_s, compute_s[static_cast<size_t>(r)] + comm_s[static_cast<size_t>(r)]);
  table << ", est. step time " << seconds(step_s) << " at " << cost.device_flops_per_s / 1e12
        << " TFLOP/s per device\n";
  table << "rank  parameters  est. peak memory (params+grads+optimizer+working set: the largest of activations, "
           "grad buckets, optimizer temporaries)  est. step (compute + comm, bubble)  sent per step\n";
  nlohmann::json ranks_json = nlohmann::json::array();
  for (int64_t r = 0; r < world_size; ++r) {
    const size_t i = static_cast<size_t>(r);
    const double p_bytes = params[i] * 4;
    const double pp_index = static_cast<double>(r / (par.tp * par.dp));
    // A pipeline stage also holds, while it runs a backward, about half a micro-batch more: the
    // received output gradients and the boundary tensors of the blocks around it (measured on
    // GPT tiny; tests/e2e/multiprocess_test.cc checks the estimate on a gpt2-124m variant).
    const double units = peak_units[static_cast<size_t>(pp_index)] + (par.pp > 1 ? 0.5 : 0.0);
    // Gradient buckets are reduced after the last backward, when activations are gone.
    // Activations, gradient buckets and the optimizer's temporaries come one after the other.
    // The backward also holds a parameter's incoming gradients before they are accumulated.
    double incoming = 0;  // the largest transient parameter gradient of the backward
    for (const auto& [name, u] : uses[i]) incoming = std::max(incoming, u.first * (u.second > 1 ? 2 : 1));
    const double working =
        std::max({sync_buffer[i], acts[i] * units + incoming, opt_temporaries * largest_piece[i]});
    const double peak = p_bytes * (2 + opt_copies) + working;
    double total_sent = 0;
    std::string kinds;
    for (const auto& [k, b] : sent[i]) {
      total_sent += b;
      kinds += " " + k + " " + human_bytes(b) + ";";
    }
    char line[384];
    std::snprintf(line, sizeof line, "%4lld  %10.3fM  %10s = %s + %s + %s + %s  %s (%s + %s, %.2f)  %s",
                  static_cast<long long>(r), params[i] / 1e6, human_bytes(peak).c_str(), human_bytes(p_bytes).c_str(),
                  human_bytes(p_bytes).c_str(), human_bytes(p_bytes * opt_copies).c_str(), human_bytes(working).c_str(),
                  seconds(compute_s[i] + comm_s[i]).c_str(), seconds(compute_s[i]).c_str(),
                  seconds(comm_s[i]).c_str(), bubble_of[i], human_bytes(total_sent).c_str());
    table << line << (kinds.empty() ? "" : "  (" + kinds.substr(1) + ")") << "\n";
    ranks_json.push_back({{"rank", r},
                          {"parameters", params[i]},
                          {"param_bytes", p_bytes},
                          {"grad_bytes", p_bytes},
                          {"optimizer_bytes", p_bytes * opt_copies},
                          {"grad_bucket_bytes", sync_buffer[i]},
                          {"activation_bytes", acts[i] * units},
                          {"optimizer_temporary_bytes", opt_temporaries * largest_piece[i]},
                          {"working_set_bytes", working},
                          {"micro_batches_in_flight", units},
                          {"peak_bytes", peak},
                          {"compute_s", compute_s[i]},
                          {"comm_s", comm_s[i]},
                          {"step_s", compute_s[i] + comm_s[i]},
                          {"bubble", bubble_of[i]},
                          {"sent_bytes", sent[i]}});
  }
  nlohmann::json summary = {{"world_size", world_size}, {"micro_batches", config->micro_batches()},
                            {"schedule", par.schedule}, {"bubble_ratio", bubble}, {"step_s", step_s},
                            {"device_flops_per_s", cost.device_flops_per_s}, {"ranks", ranks_json}};
  if (Status s = write_file_atomically(out / "summary.json", summary.dump(1)); !s.ok()) return fail(s.error().message);
  if (Status s = write_file_atomically(out / "summary.txt", table.str()); !s.ok()) return fail(s.error().message);
  std::fputs(table.str().c_str(), stdout);
  std::printf("loom plan: wrote %s (%sprograms/rank_K.txt%s, summary.txt, summary.json)\n", out.string().c_str(),
              no_plan_json ? "" : "plan.json, ", csv.empty() ? "" : ", schedule.csv, timeline.json, schedule.svg");
  return kExitOk;
}

}  // namespace loom::cli
