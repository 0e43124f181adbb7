#include "plan/plan_dump.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/durable_file.h"
#include "core/strings.h"
#include "graph/ops_moe.h"
#include "lower/plan_file.h"

namespace loom::plan {
namespace {

// What a mixture of experts routes per micro-batch: the experts, the slots per expert, the
// tokens a balanced router sends each expert, and how many experts a rank holds. Empty for a
// dense model.
std::string experts_line(const Config& config, const Plan& plan) {
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

nlohmann::json summary_json(const Config& config, const Plan& plan) {
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < plan.estimate.ranks.size(); ++r) {
    const RankEstimate& re = plan.estimate.ranks[r];
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

}  // namespace

std::string summary_table(const Config& config, const Plan& plan) {
  const auto& par = config.parallel;
  const Estimate& e = plan.estimate;
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
    const RankEstimate& re = e.ranks[r];
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

Result<std::string> write_plan_dump(const std::string& dir, const Config& config, const Plan& plan,
                                    const DumpOptions& options) {
  namespace fs = std::filesystem;
  const fs::path out(dir);
  std::error_code ec;
  fs::create_directories(out / "programs", ec);
  if (ec) return Error::at(dir, "cannot create '" + out.string() + "': " + ec.message());
  // plan.json is made and written on a second thread while the programs are listed; a listing's
  // error is reported first.
  Status json_written = Status::success();
  std::thread json_writer;
  if (options.plan_json)
    json_writer = std::thread([&] {
      auto json = lower::plan_to_json(plan.file);
      json_written =
          json.ok() ? write_file_atomically(out / "plan.json", *json) : Status(json.error());
    });
  Status listed = Status::success();
  for (int64_t r = 0; r < plan.world_size() && listed.ok(); ++r)
    listed = write_file_atomically(out / "programs" / ("rank_" + std::to_string(r) + ".txt"),
                                   lower::listing(plan.file.graph, plan.file.lowered, Rank(r)));
  if (json_writer.joinable()) json_writer.join();
  LOOM_TRY(listed);
  LOOM_TRY(json_written);
  const ScheduleDrawings drawn = draw_schedule(plan);
  const std::pair<const char*, const std::string*> schedule_files[] = {
      {"schedule.csv", &plan.schedule.csv},
      {"timeline.json", &drawn.chrome_trace},
      {"schedule.svg", &drawn.svg}};
  for (const auto& [name, text] : schedule_files)
    if (!text->empty()) LOOM_TRY(write_file_atomically(out / name, *text));
  const std::string table = summary_table(config, plan);
  LOOM_TRY(write_file_atomically(out / "summary.json", summary_json(config, plan).dump(1)));
  LOOM_TRY(write_file_atomically(out / "summary.txt", table));
  return table;
}

}  // namespace loom::plan
