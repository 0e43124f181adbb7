// loom plan CONFIG [key=value ...] --world-size N --out DIR: the plan without processes or
// LibTorch (plan/plan.h's make_plan). Writes every rank's program (programs/rank_K.txt), the
// pipeline schedule (CSV in torch.distributed.pipelining's format, chrome trace, SVG), plan.json
// and a per-rank summary (summary.txt, also printed, and summary.json) of the plan's estimate on
// the run's cost model (plan/estimate.h): parameters held, peak memory, step time, bytes sent.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/config.h"
#include "core/durable_file.h"
#include "graph/ops_moe.h"
#include "launch/cli_parse.h"
#include "launch/command.h"
#include "launch/config_file.h"
#include "lower/plan_file.h"
#include "plan/auto_plan.h"
#include "plan/plan.h"

namespace loom::cli {
namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "loom plan: error: %s\n", message.c_str());
  return kExitBadInput;
}

// What a mixture of experts routes per micro-batch: the experts, the slots per expert, the
// tokens a balanced router sends each expert, and how many experts a rank holds. Empty for a
// dense model.
std::string experts_line(const Config& config, const plan::Plan& plan) {
  int64_t layers = 0, top_k = 0, experts = 0, slots = 0, samples = 0, seq = 0;
  bool capacity = false;
  for (const graph::Op& op : plan.model.ops()) {
    if (op.type() == graph::kMoeRoute) {
      top_k = op.attrs().get<int64_t>("top_k");
      capacity = op.attrs().get_or<int64_t>("c", 0) > 0;
      const Shape& scores = plan.model.tensor(op.inputs[0].tensor).shape;  // [b, s, e]
      samples = scores[0];
      seq = scores[1];
      experts = scores[2];
      ++layers;
    }
    if (op.type() == graph::kMoeDispatch) slots = op.attrs().get<int64_t>("c");
  }
  if (layers == 0) return "";
  std::ostringstream os;
  const int64_t ep = config.parallel.ep;
  os << "experts: " << layers << " layers of " << experts << " routed experts, top " << top_k
     << ", " << slots << " slots per expert and sample ("
     << (capacity ? "capacity: later tokens dropped" : "dropless") << "); a balanced router sends "
     << samples * seq * top_k / experts << " tokens to each expert per micro-batch; ep " << ep
     << ": " << experts / ep << " experts per rank, tokens moved by all_to_all\n";
  return os.str();
}

// summary.txt: a header line and one line per rank.
std::string summary_table(const Config& config, const plan::Plan& plan) {
  const auto& par = config.parallel;
  const plan::Estimate& e = plan.estimate;
  std::ostringstream table;
  table << "plan: " << config.model.type << " " << config.model.preset << " on "
        << plan.world_size() << " ranks (dp " << par.dp
        << (par.ep > 1 ? " (ep " + std::to_string(par.ep) + " within)" : std::string())
        << (par.cp > 1 ? " x cp " + std::to_string(par.cp) + " " + par.cp_kind : std::string())
        << " x tp " << par.tp << " x pp " << par.pp << "), " << config.micro_batches()
        << " micro-batches per step, schedule " << par.schedule;
  if (par.pp > 1) table << ", bubble ratio " << e.bubble_ratio;
  table << ", est. step time " << human_seconds(e.step_s) << " at "
        << plan.cost.device_flops_per_s / 1e12 << " TFLOP/s per device\n";
  if (plan.schedule.read_as)
    table << "schedule file: " << par.schedule_csv << ", actions "
          << sched::describe(*plan.schedule.read_as) << "\n";
  table << "cost model: " << plan.cost.name << "\n";
  table << experts_line(config, plan);
  table << "rank  parameters  est. peak memory (params+grads+optimizer+working set: the largest of "
           "activations, "
           "grad buckets, optimizer temporaries)  est. step (compute + comm, bubble)  sent per "
           "step\n";
  for (size_t r = 0; r < e.ranks.size(); ++r) {
    const plan::RankEstimate& re = e.ranks[r];
    double total_sent = 0;
    std::string kinds;
    for (const auto& [k, b] : re.sent) {
      total_sent += b;
      kinds += " " + k + " " + human_bytes(b) + ";";
    }
    char line[384];
    std::snprintf(
        line, sizeof line, "%4lld  %10.3fM  %10s = %s + %s + %s + %s  %s (%s + %s, %.2f)  %s",
        static_cast<long long>(r), re.parameters / 1e6, human_bytes(re.peak_bytes).c_str(),
        human_bytes(re.param_bytes).c_str(), human_bytes(re.grad_bytes).c_str(),
        human_bytes(re.optimizer_bytes).c_str(), human_bytes(re.working_set_bytes).c_str(),
        human_seconds(re.step_s).c_str(), human_seconds(re.compute_s).c_str(),
        human_seconds(re.comm_s).c_str(), re.bubble, human_bytes(total_sent).c_str());
    table << line << (kinds.empty() ? "" : "  (" + kinds.substr(1) + ")") << "\n";
  }
  if (e.max_peak_bytes() > plan.cost.device_memory_bytes)
    table << "warning: the largest estimated peak, " << human_bytes(e.max_peak_bytes())
          << ", exceeds a device's " << human_bytes(plan.cost.device_memory_bytes) << "\n";
  return table.str();
}

nlohmann::json summary_json(const Config& config, const plan::Plan& plan) {
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < plan.estimate.ranks.size(); ++r) {
    const plan::RankEstimate& re = plan.estimate.ranks[r];
    ranks.push_back({{"rank", r},
                     {"parameters", re.parameters},
                     {"param_bytes", re.param_bytes},
                     {"grad_bytes", re.grad_bytes},
                     {"optimizer_bytes", re.optimizer_bytes},
                     {"grad_bucket_bytes", re.grad_bucket_bytes},
                     {"activation_bytes", re.activation_bytes},
                     {"optimizer_temporary_bytes", re.optimizer_temporary_bytes},
                     {"working_set_bytes", re.working_set_bytes},
                     {"micro_batches_in_flight", re.micro_batches_in_flight},
                     {"peak_bytes", re.peak_bytes},
                     {"compute_s", re.compute_s},
                     {"comm_s", re.comm_s},
                     {"step_s", re.step_s},
                     {"bubble", re.bubble},
                     {"sent_bytes", re.sent}});
  }
  nlohmann::json summary = {{"world_size", plan.world_size()},
                            {"micro_batches", config.micro_batches()},
                            {"schedule", config.parallel.schedule},
                            {"bubble_ratio", plan.estimate.bubble_ratio},
                            {"step_s", plan.estimate.step_s},
                            {"device_flops_per_s", plan.cost.device_flops_per_s},
                            {"device_memory_bytes", plan.cost.device_memory_bytes},
                            {"cost_model", plan.cost.name},
                            {"ranks", ranks}};
  if (plan.schedule.read_as)
    summary["schedule_csv_actions"] = sched::to_string(*plan.schedule.read_as);
  return summary;
}

// The dump in `out_dir`: every rank's program, plan.json, the schedule files and the summary,
// each written atomically; the summary is printed too.
int write_dump(const std::string& out_dir, const Config& config, const plan::Plan& plan,
               bool no_plan_json) {
  namespace fs = std::filesystem;
  const fs::path out(out_dir);
  std::error_code ec;
  fs::create_directories(out / "programs", ec);
  if (ec) return fail("--out: cannot create '" + out.string() + "': " + ec.message());
  auto write = [&](const fs::path& path, const std::string& text) {
    return write_file_atomically(path, text);
  };
  // plan.json (the whole plan: ~100 MB at 1024 ranks) is made and written on a second thread
  // while the programs are listed; a listing's error is reported first, as before.
  Status json_written = Status::success();
  std::thread json_writer;
  if (!no_plan_json)
    json_writer = std::thread([&] {
      auto json = lower::plan_to_json(plan.file);
      json_written = json.ok() ? write(out / "plan.json", *json) : Status(json.error());
    });
  Status listed = Status::success();
  for (int64_t r = 0; r < plan.world_size() && listed.ok(); ++r)
    listed = write(out / "programs" / ("rank_" + std::to_string(r) + ".txt"),
                   lower::listing(plan.file.graph, plan.file.lowered, Rank(r)));
  if (json_writer.joinable()) json_writer.join();
  if (!listed.ok()) return fail(listed.error().message);
  if (!json_written.ok()) return fail(json_written.error().message);
  const loom::plan::ScheduleDrawings drawn = loom::plan::draw_schedule(plan);
  const std::pair<const char*, const std::string*> schedule_files[] = {
      {"schedule.csv", &plan.schedule.csv},
      {"timeline.json", &drawn.chrome_trace},
      {"schedule.svg", &drawn.svg}};
  for (const auto& [name, text] : schedule_files)
    if (!text->empty())
      if (Status s = write(out / name, *text); !s.ok()) return fail(s.error().message);

  const std::string table = summary_table(config, plan);
  if (Status s = write(out / "summary.json", summary_json(config, plan).dump(1)); !s.ok())
    return fail(s.error().message);
  if (Status s = write(out / "summary.txt", table); !s.ok()) return fail(s.error().message);
  std::fputs(table.c_str(), stdout);
  std::printf("loom plan: wrote %s (%sprograms/rank_K.txt%s, summary.txt, summary.json)\n",
              out.string().c_str(), no_plan_json ? "" : "plan.json, ",
              plan.schedule.csv.empty() ? "" : ", schedule.csv, timeline.json, schedule.svg");
  return kExitOk;
}

}  // namespace

int plan_main(const Args& args) {
  CLI::App app{
      "Make a plan without starting processes: per-rank programs, schedule, memory and "
      "communication estimates.",
      "loom plan"};
  std::string config_path, out_dir, cost_file;
  std::vector<std::string> overrides;
  int64_t world_size = 0;
  bool no_plan_json = false;
  app.add_option("config", config_path, "the run's YAML config")->required();
  app.add_option("overrides", overrides, "key=value overrides");
  app.add_option("--world-size", world_size, "ranks to plan for (default: dp x tp x pp)");
  app.add_option("--out", out_dir, "directory for the plan files")->required();
  app.add_option("--cost-model", cost_file,
                 "a cost-model file (presets, or one model) instead of the built-in "
                 "configs/cost-model.yaml; the same as cost.file=FILE");
  int64_t top = 5;
  // Checked below rather than with CLI11's PositiveNumber, whose message prints the range as
  // 0 to the largest double, in full.
  app.add_option("--top", top,
                 "with parallel.policy=auto: how many of the best plans to list (at least 1)");
  app.add_flag("--no-plan-json", no_plan_json,
               "skip plan.json (the whole plan; large for thousands of ranks)");
  if (auto code = parse_args(app, args, "plan")) return *code;
  if (top < 1)
    return fail("--top must be at least 1 (the plans to list, the chosen one first), got " +
                std::to_string(top));
  if (!cost_file.empty()) overrides.push_back("cost.file=" + cost_file);
  auto config = load_config_file(config_path, overrides);
  if (!config.ok()) return fail(config.error().message);
  if (app.count("--world-size") == 0) world_size = config->parallel.world_size();
  if (world_size < 1)
    return fail("--world-size must be positive, got " + std::to_string(world_size));
  auto cost = resolve_cost_model(*config);
  if (!cost.ok()) return fail(cost.error().message);
  Result<plan::Plan> made = Error::at("plan", "not made");
  if (config->parallel.policy == "auto") {
    plan::AutoOptions options;
    options.top = top;
    auto chosen = plan::auto_plan(*config, plan::Registries{}, *cost, world_size, options);
    if (!chosen.ok()) return fail(chosen.error().message);
    std::fputs(plan::describe(*chosen).c_str(), stdout);
    *config = chosen->config;  // the dump is the winner's
    made = std::move(chosen->plan);
  } else {
    made = plan::make_plan(*config, plan::Registries{}, *cost, world_size);
  }
  if (!made.ok()) return fail(made.error().message);
  return write_dump(out_dir, *config, *made, no_plan_json);
}

}  // namespace loom::cli
