#include "launch/verify.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <tuple>

#include "comm/local_comm.h"
#include "comm/make_comm.h"
#include "launch/planned_trainer.h"
#include "launch/run_device.h"
#include "launch/single_device_run.h"
#include "plan/plan.h"
#include "planner/chimera.h"
#include "runtime/executor.h"
#include "runtime/inputs.h"
#include "runtime/oracle.h"
#include "runtime/tolerance.h"
#include "runtime/trainer.h"

namespace loom::launch {

// The runtime's pieces a comparison reads: trainers, executors, the oracle and the bounds.
using namespace loom::runtime;

// One device running the plan's micro-batches: micro x dp samples each, so a loss that is not
// a sum over samples (a mixture of experts' load-balancing loss) sees the same tokens.
Config single_device_config(const Config& config) {
  Config c = config;
  c.batch.micro = config.batch.micro * config.parallel.dp;
  c.parallel = ParallelConfig{};
  return c;
}

std::vector<std::string> rounding_noise_parameters() { return {"attn.k.b", "msa_row.pair_ln.b"}; }

namespace {

bool is_noise(const std::string& name, const std::vector<std::string>& noise) {
  return std::any_of(noise.begin(), noise.end(),
                     [&](const std::string& n) { return name.find(n) != std::string::npos; });
}

// Relative difference that a NaN or infinity cannot pass.
double relative(double err, double scale) {
  const double rel = err / (scale > 0 ? scale : 1.0);
  return std::isfinite(rel) ? rel : 1e300;
}

std::string describe(const Config& c, int64_t world_size) {
  const ParallelConfig& p = c.parallel;
  std::ostringstream os;
  os << "dp " << p.dp << (p.ep > 1 ? " (ep " + std::to_string(p.ep) + ")" : std::string())
     << (p.cp > 1 ? " x cp " + std::to_string(p.cp) : std::string()) << " x tp " << p.tp << " x pp "
     << p.pp << " (" << world_size << " ranks; " << p.policy;
  if (p.sp) os << ", sp";
  if (p.pp > 1) os << ", schedule " << p.schedule << ", chunks " << p.chunks;
  if (p.zero > 0) os << ", zero " << p.zero;
  if (p.recompute != "none") os << ", recompute " << p.recompute;
  os << ")";
  return os.str();
}

// The worst difference of each (step, kind, tensor) over the pieces every rank reports.
class TensorTable {
 public:
  void add(TensorDifference d, size_t tensor_order) {
    std::lock_guard<std::mutex> lock(mu_);
    ++compared_;
    const auto key = std::make_tuple(d.step, d.kind == "gradient" ? 0 : 1, tensor_order);
    auto it = worst_.find(key);
    if (it == worst_.end() || d.rel_diff / d.bound > it->second.rel_diff / it->second.bound)
      worst_[key] = std::move(d);
  }
  std::vector<TensorDifference> rows() const {
    std::vector<TensorDifference> out;
    for (const auto& [key, d] : worst_) out.push_back(d);
    return out;
  }
  int64_t compared() const { return compared_; }

  // The rows with their keys and the count, to merge on another process (launched ranks).
  nlohmann::json to_json() const {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& [key, d] : worst_)
      rows.push_back({{"order", std::get<2>(key)},
                      {"tensor", d.tensor},
                      {"kind", d.kind},
                      {"step", d.step},
                      {"rank", d.rank},
                      {"piece", d.piece},
                      {"rel_diff", d.rel_diff},
                      {"bound", d.bound},
                      {"judged", d.judged}});
    return {{"rows", rows}, {"compared", compared_}};
  }
  void merge(const nlohmann::json& table) {
    for (const auto& row : table.at("rows")) {
      TensorDifference d;
      d.tensor = row.at("tensor").get<std::string>();
      d.kind = row.at("kind").get<std::string>();
      d.step = row.at("step").get<int64_t>();
      d.rank = row.at("rank").get<int64_t>();
      d.piece = row.at("piece").get<std::string>();
      d.rel_diff = row.at("rel_diff").get<double>();
      d.bound = row.at("bound").get<double>();
      d.judged = row.at("judged").get<bool>();
      add(std::move(d), row.at("order").get<size_t>());
    }
    // add() counted each row once; the sender compared this many pieces.
    std::lock_guard<std::mutex> lock(mu_);
    compared_ +=
        table.at("compared").get<int64_t>() - static_cast<int64_t>(table.at("rows").size());
  }

 private:
  std::mutex mu_;
  std::map<std::tuple<int64_t, int, size_t>, TensorDifference> worst_;
  int64_t compared_ = 0;
};

// Per gradient tensor (FullTensor name), per step: how far bf16's roundings moved it in the
// single-device run, relative to its largest element (bf16_gradient_tolerance).
using MeasuredRounding = std::map<std::string, std::vector<double>>;

MeasuredRounding measured_rounding(const SingleDeviceRun& bf16, const SingleDeviceRun& fp32) {
  MeasuredRounding out;
  for (size_t s = 0; s < bf16.grads.size() && s < fp32.grads.size(); ++s)
    for (const auto& [name, g] : bf16.grads[s]) {
      const at::Tensor want = g.to(at::kDouble), exact = fp32.grads[s].at(name).to(at::kDouble);
      out[name].push_back(
          relative((want - exact).abs().max().item<double>(), want.abs().max().item<double>()));
    }
  return out;
}

// The bound on `name`'s gradient differences over steps 1..`step` (the largest: AdamW's
// allowance reads one rounding for every step).
double gradient_bound(const OptimizerTrace& trace, const MeasuredRounding& measured,
                      const std::string& name, int64_t step) {
  auto it = measured.find(name);
  if (trace.precision == Precision::kFp32 || it == measured.end()) return gradient_tolerance(trace);
  double bound = 0;
  for (size_t s = 0; s < static_cast<size_t>(step) && s < it->second.size(); ++s)
    bound = std::max(bound, bf16_gradient_tolerance(it->second[s]));
  return bound;
}

// One rank's pieces after step `step` (1-based) against the single-device run.
void compare_pieces(Trainer& trainer, const SingleDeviceRun& single,
                    const MeasuredRounding& measured, int64_t step,
                    const std::vector<std::string>& noise, TensorTable& table) {
  const Executor& exec = trainer.executor();
  const auto owned = exec.parameter_owned();
  const bool zero1 = trainer.config().parallel.zero == 1;
  const OptimizerTrace trace = single.trace_until(static_cast<size_t>(step));
  const auto& grads = single.grads[static_cast<size_t>(step - 1)];
  const auto& params = single.params[static_cast<size_t>(step - 1)];
  for (size_t i = 0; i < exec.parameters().size(); ++i) {
    const graph::SubTensor& piece = exec.parameter_pieces()[i];
    const std::string& name = trainer.graph().tensor(piece.tensor).name;
    const size_t order = static_cast<size_t>(piece.tensor.value());
    TensorDifference base;
    base.tensor = name;
    base.step = step;
    base.rank = trainer.rank();
    base.piece = piece.ranges_string();
    base.judged = !is_noise(name, noise);

    const at::Tensor value = exec.parameters()[i].detach().to(at::kCPU);
    // Gradients, on the elements this rank updates. Under parallel.zero 1 the gradient buckets'
    // buffers carry the gathered updated values after the step (measured: the shared pieces'
    // .grad equals their values), so only the values are compared there.
    const at::Tensor grad = exec.parameters()[i].grad();
    const auto [begin, end] = owned[i];
    if (grad.defined() && end > begin && !zero1) {
      const at::Tensor got = grad.detach().to(at::kCPU).reshape({-1}).slice(0, begin, end);
      const at::Tensor want =
          cut_piece(grads.at(name), piece).contiguous().reshape({-1}).slice(0, begin, end);
      TensorDifference d = base;
      d.kind = "gradient";
      // AdamW's later gradients come from parameters that already differ by up to
      // adam_noise_allowance: reported, judged at the first step (and under SGD at every step).
      d.judged = base.judged && (trace.type != OptimizerKind::kAdamw || step == 1);
      d.rel_diff = relative((got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>(),
                            grads.at(name).abs().max().item<double>());
      d.bound = gradient_bound(trace, measured, name, step);
      table.add(std::move(d), order);
    }
    at::Tensor allowance;
    if (trace.type == OptimizerKind::kAdamw) {
      std::vector<at::Tensor> piece_grads;
      for (int64_t u = 0; u < step; ++u)
        piece_grads.push_back(cut_piece(single.grads[static_cast<size_t>(u)].at(name), piece));
      allowance = adam_noise_allowance(piece_grads, trace.grad_max.at(name), trace.lr,
                                       gradient_bound(trace, measured, name, step));
    }
    const ParameterDifference pd = parameter_difference(
        value, cut_piece(params.at(name), piece), cut_piece(single.init.at(name), piece),
        parameter_tolerance(trace, name), allowance);
    TensorDifference d = base;
    d.kind = "parameter";
    d.rel_diff = relative(pd.err, pd.max_abs);
    d.bound = relative(pd.bound, pd.max_abs);
    table.add(std::move(d), order);
  }
}

// The oracle on the plan's sub-operators: every tensor's value from the one-device graph on the
// first micro-batch, with the one-device run's parameters after its last step (a bias that
// starts at zero has moved by then, so a kernel that mishandles it shows).
Result<OracleReport> run_oracle(const Config& config, const plan::Plan& plan,
                                const SingleDeviceRun& single, const KernelRegistry& kernels,
                                double tolerance) {
  LOOM_ASSIGN_OR_RETURN(auto feeder, InputFeeder::create(config, plan.model));
  LOOM_ASSIGN_OR_RETURN(auto inputs, feeder->micro_batch(0));
  // In float32 like every value the oracle compares (a bf16 model's images arrive as bf16).
  for (auto& [id, value] : inputs)
    if (value.is_floating_point()) value = value.to(at::kFloat);
  for (const auto& [name, value] : single.params.back())
    if (auto id = plan.model.find_tensor(name)) inputs[id->value()] = value;
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> single_values =
      reference_values(plan.model, kernels, static_cast<uint64_t>(config.run.seed), inputs);
  // The planned graph's tensors by name: Chimera's up pipeline adds a copy of every tensor of the
  // model (planner/chimera.h), which takes its original's value.
  const std::string up = planner::kUpPipelineSuffix;
  std::vector<at::Tensor> values(plan.file.graph.tensors().size());
  for (size_t t = 0; t < values.size(); ++t) {
    std::string name = plan.file.graph.tensors()[t].name;
    if (name.size() > up.size() && name.compare(name.size() - up.size(), up.size(), up) == 0)
      name.resize(name.size() - up.size());
    if (const auto id = plan.model.find_tensor(name))
      values[t] = single_values[static_cast<size_t>(id->value())];
  }
  return check_plan_ops(plan.file.graph, values, kernels, tolerance);
}

// Every rank's text on every rank: the lengths first, then the texts padded to the longest.
Result<std::vector<std::string>> all_gather_text(comm::Comm& world, const RunDevice& device,
                                                 const std::string& mine) {
  const int64_t n = world.size();
  const at::Tensor lengths = at::empty({n}, device.options(at::kLong));
  LOOM_TRY(world.all_gather_flat(
      lengths, at::full({1}, static_cast<int64_t>(mine.size()), device.options(at::kLong))));
  const at::Tensor host_lengths = lengths.to(at::kCPU);
  const int64_t longest = std::max<int64_t>(1, host_lengths.max().item<int64_t>());
  // Staged on the host (the text is there), then moved to the run's device for the Comm.
  at::Tensor text = at::zeros({longest}, at::TensorOptions().device(at::kCPU).dtype(at::kByte));
  std::memcpy(text.data_ptr(), mine.data(), mine.size());
  const at::Tensor all = at::empty({n * longest}, device.options(at::kByte));
  LOOM_TRY(world.all_gather_flat(all, text.to(device.device)));
  const at::Tensor host = all.to(at::kCPU);
  std::vector<std::string> out;
  const auto* bytes = static_cast<const char*>(host.data_ptr());
  for (int64_t j = 0; j < n; ++j)
    out.emplace_back(bytes + j * longest, static_cast<size_t>(host_lengths[j].item<int64_t>()));
  return out;
}

// This process as one rank of a world a launcher started (loomrun, torchrun, mpirun): the
// world's Comm and device, sized against the plan before anything runs.
struct Launched {
  std::shared_ptr<comm::Comm> world;
  RunDevice device;
};
Result<Launched> join_launched_world(const Config& config, int64_t plan_ranks) {
  const comm::EnvLookup env = comm::process_env();
  comm::configure_worker_threads(env);
  Launched out;
  LOOM_ASSIGN_OR_RETURN(out.device, launch::select_device(config, comm::local_rank(env)));
  LOOM_ASSIGN_OR_RETURN(out.world, comm::make_comm(config.comm, env, out.device.cuda()));
  if (out.world->size() != plan_ranks)
    return Error::at("WORLD_SIZE", "the launcher started " + std::to_string(out.world->size()) +
                                       " processes; the plan of this config has " +
                                       std::to_string(plan_ranks) +
                                       " ranks (parallel.dp x cp x tp x pp)");
  return out;
}

}  // namespace

bool VerifyReport::losses_ok() const {
  return std::all_of(losses.begin(), losses.end(), [](const auto& l) { return l.ok(); });
}
bool VerifyReport::tensors_ok() const {
  return std::all_of(tensors.begin(), tensors.end(), [](const auto& t) { return t.ok(); });
}

std::string VerifyReport::first_failure() const {
  if (!run_error.empty()) return "the plan failed to run: " + run_error;
  if (!oracle.ok())
    return oracle.mismatches.empty() ? "the oracle checked no op"
                                     : "first op whose output differs: " + oracle.mismatches[0];
  char buf[256];
  for (const auto& l : losses)
    if (!l.ok()) {
      std::snprintf(buf, sizeof buf, "step %lld's loss differs: %.8g vs %.8g, rel %.2e > %.1e",
                    static_cast<long long>(l.step), l.plan, l.single, l.rel_diff, l.bound);
      return buf;
    }
  for (const auto& t : tensors)
    if (!t.ok()) {
      std::snprintf(buf, sizeof buf,
                    "first tensor that drifts: %s of '%s' piece %s on rank %lld "
                    "after step %lld: rel %.2e > %.1e",
                    t.kind.c_str(), t.tensor.c_str(), t.piece.c_str(),
                    static_cast<long long>(t.rank), static_cast<long long>(t.step), t.rel_diff,
                    t.bound);
      return buf;
    }
  return "";
}

namespace {

// Whether the model has an op whose output jumps at ties (graph::OpRules::discrete).
bool has_discrete_op(const graph::Graph& model) {
  return std::any_of(model.ops().begin(), model.ops().end(),
                     [](const graph::Op& op) { return op.def->rules.discrete; });
}

// Per step, the bound on the plan's loss: loss_tolerance, or in bf16 with a discrete op
// bf16_routed_loss_tolerance of the largest move bf16 made to one device's loss so far
// (`fp32`: the single-device run in float32; null when not bf16).
std::vector<double> loss_bounds(const SingleDeviceRun& single, const SingleDeviceRun* fp32,
                                bool discrete, int64_t steps) {
  std::vector<double> out(static_cast<size_t>(steps), loss_tolerance(single.trace));
  if (!fp32 || !discrete) return out;
  double measured = 0;
  for (size_t s = 0; s < out.size(); ++s) {
    const double exact = fp32->losses.at(s);
    measured = std::max(measured, relative(std::abs(single.losses.at(s) - exact), std::abs(exact)));
    out[s] = bf16_routed_loss_tolerance(measured);
  }
  return out;
}

// Per step, the rank whose loss is furthest from the single device's, relative to it.
std::vector<LossDifference> loss_differences(const SingleDeviceRun& single,
                                             const std::vector<std::vector<double>>& losses,
                                             const std::vector<double>& bounds) {
  std::vector<LossDifference> out;
  for (size_t s = 0; s < bounds.size(); ++s) {
    LossDifference l;
    l.step = static_cast<int64_t>(s) + 1;
    l.single = single.losses[s];
    l.bound = bounds[s];
    for (const auto& rank_losses : losses) {
      const double plan_loss = rank_losses.at(s);
      const double rel = relative(std::abs(plan_loss - l.single), std::abs(l.single));
      if (rel >= l.rel_diff) {
        l.rel_diff = rel;
        l.plan = plan_loss;
      }
    }
    out.push_back(l);
  }
  return out;
}

// The plan's ranks stepping against the single-device run: each rank's losses, and its pieces
// compared with the single-device run's.
struct RankRuns {
  const Config& config;
  const plan::Plan& plan;
  const std::shared_ptr<const Extensions>& extensions;
  const SingleDeviceRun& single;
  const MeasuredRounding& measured;
  const VerifyOptions& options;
  std::mutex mu;
  std::vector<std::vector<double>> losses;

  Status run(std::shared_ptr<comm::Comm> comm, TensorTable& into) {
    LOOM_ASSIGN_OR_RETURN(auto trainer, create_trainer(config, plan, comm, extensions));
    const auto rank = static_cast<size_t>(comm->world_rank().value());
    for (int64_t s = 1; s <= options.steps; ++s) {
      LOOM_ASSIGN_OR_RETURN(StepStats st, trainer->step());
      {
        std::lock_guard<std::mutex> lock(mu);
        losses[rank].push_back(st.loss);
      }
      compare_pieces(*trainer, single, measured, s, options.noise, into);
    }
    return Status::success();
  }
};

// Launched: each rank runs its part, then every rank gathers every rank's losses and
// differences, so all reach the same verdict. Returns the first rank's error, or "".
std::string run_launched(RankRuns& runs, const Launched& launched, TensorTable& table) {
  const auto rank = static_cast<size_t>(launched.world->rank().value());
  TensorTable mine;
  const Status ran = runs.run(launched.world, mine);
  const nlohmann::json part = {{"error", ran.ok() ? "" : ran.error().to_string()},
                               {"losses", runs.losses[rank]},
                               {"table", mine.to_json()}};
  auto parts = all_gather_text(*launched.world, launched.device, part.dump());
  if (!parts.ok())
    return "rank " + std::to_string(rank) + ": " +
           (ran.ok() ? parts.error().to_string() : ran.error().to_string());
  for (size_t r = 0; r < parts->size(); ++r) {
    const nlohmann::json got = nlohmann::json::parse((*parts)[r]);
    if (const std::string e = got.at("error").get<std::string>(); !e.empty())
      return "rank " + std::to_string(r) + ": " + e;
    runs.losses[r] = got.at("losses").get<std::vector<double>>();
    table.merge(got.at("table"));
  }
  return "";
}

// The plan's ranks as threads, each with one intra-op thread so they do not oversubscribe.
// Returns the first rank's error, or "".
std::string run_threads(RankRuns& runs, int world_size, double timeout_s, TensorTable& table) {
  comm::LocalWorld world(world_size, timeout_s);
  const std::vector<Status> statuses = world.run([&](comm::Comm& comm) -> Status {
    at::set_num_threads(1);
    return runs.run(comm.shared_from_this(), table);
  });
  for (int r = 0; r < world_size; ++r)
    if (!statuses[static_cast<size_t>(r)].ok())
      return "rank " + std::to_string(r) + ": " +
             statuses[static_cast<size_t>(r)].error().to_string();
  return "";
}

}  // namespace

Result<VerifyReport> verify_plan(const Config& config, const VerifyOptions& options) {
  if (options.steps < 1)
    return Error::at("--steps", "--steps must be at least 1, got " + std::to_string(options.steps));
  auto extensions = options.extensions ? options.extensions : std::make_shared<const Extensions>();
  LOOM_ASSIGN_OR_RETURN(plan::Plan plan, plan::make_plan(config, *extensions));

  VerifyReport report;
  report.world_size = plan.world_size();
  report.plan = describe(config, report.world_size);
  std::optional<Launched> launched;
  if (options.launched) {
    LOOM_ASSIGN_OR_RETURN(launched, join_launched_world(config, plan.world_size()));
  }
  LOOM_ASSIGN_OR_RETURN(SingleDeviceRun single,
                        run_single_device(single_device_config(config), options.steps, extensions));
  MeasuredRounding measured;
  std::optional<SingleDeviceRun> fp32;
  if (config.run.precision != "fp32") {
    // The same run in float32: what bf16's (or fp8's) roundings did to one device's gradients and
    // loss.
    Config exact = single_device_config(config);
    exact.run.precision = "fp32";
    LOOM_ASSIGN_OR_RETURN(fp32, run_single_device(exact, options.steps, extensions));
    measured = measured_rounding(single, *fp32);
  }
  const std::vector<double> bounds =
      loss_bounds(single, fp32 ? &*fp32 : nullptr, has_discrete_op(plan.model), options.steps);

  const int world_size = static_cast<int>(plan.world_size());
  TensorTable table;
  RankRuns runs{config, plan, extensions, single, measured, options, {}, {}};
  runs.losses.resize(static_cast<size_t>(world_size));
  // Launched, rank 0 prints the verdict.
  if (launched) report.prints = launched->world->rank().value() == 0;
  report.run_error = launched ? run_launched(runs, *launched, table)
                              : run_threads(runs, world_size, options.comm_timeout_s, table);
  if (!report.run_error.empty()) return report;

  report.losses = loss_differences(single, runs.losses, bounds);
  report.tensors = table.rows();
  report.tensors_compared = table.compared();
  // Each sub-op against the one-device values, both in float32 on the host (kOracleTolerance says
  // why this much).
  report.oracle_tolerance = kOracleTolerance;
  if (report.prints) {  // launched: rank 0's report is the one read
    LOOM_ASSIGN_OR_RETURN(report.oracle, run_oracle(config, plan, single, extensions->kernels,
                                                    report.oracle_tolerance));
  }
  return report;
}

}  // namespace loom::launch
