#include "loom/loom.h"

#include <filesystem>
#include <fstream>

#include "core/durable_file.h"
#include "launch/extensions.h"
#include "launch/planned_trainer.h"
#include "loom/kernel.h"
#include "models/hf_config.h"
#include "plan/plan.h"
#include "plan/plan_dump.h"
#include "plan/plan_for.h"
#include "runtime/trainer.h"

namespace loom {
namespace {

// model.from_hf applied, as every `loom` command reads its config (launch/config_file.h); a
// config that had it applied already is unchanged.
Result<Config> with_hf_args(const Config& given) {
  Config config = given;
  LOOM_TRY(models::apply_from_hf(config));
  return config;
}

}  // namespace

Setup::Setup() : ext_(std::make_shared<launch::Extensions>()) {}
Setup::Setup(const Setup& other) : ext_(std::make_shared<launch::Extensions>(*other.ext_)) {}
Setup& Setup::operator=(const Setup& other) {
  if (this != &other) ext_ = std::make_shared<launch::Extensions>(*other.ext_);
  return *this;
}
Setup::~Setup() = default;

Status Setup::add_op(graph::OpSchema schema) { return ext_->ops.add(std::move(schema)); }
Status Setup::add_policy(const std::string& name, planner::Policy policy) {
  return ext_->policies.add(name, std::move(policy));
}
Status Setup::add_model(
    const std::string& name, ModelBuilder builder,
    std::function<Status(const Config&, const planner::SpaceSpec&)> check_parallel) {
  models::ModelType type;
  type.name = name;
  type.build = std::move(builder);
  type.check_parallel = std::move(check_parallel);
  return ext_->models.add(std::move(type));
}
void Setup::set_model(ModelBuilder builder) { ext_->model = std::move(builder); }
const graph::OpRegistry& Setup::ops() const { return ext_->ops; }
const planner::PolicyRegistry& Setup::policies() const { return ext_->policies; }
launch::Extensions& Setup::extensions() { return *ext_; }
std::shared_ptr<const launch::Extensions> Setup::shared() const { return ext_; }

Status add_kernel(Setup& setup, const std::string& type, Kernel kernel) {
  if (!setup.ops().find(type))
    return Error::at(
        type, "kernel for op type '" + type + "', which is not registered (Setup::add_op first)");
  return setup.extensions().kernels.add(type, std::move(kernel));
}

Result<lower::PlanFile> make_plan(const Config& given, const Setup& setup) {
  LOOM_ASSIGN_OR_RETURN(Config config, with_hf_args(given));
  LOOM_ASSIGN_OR_RETURN(plan::PlanChoice chosen, launch::plan_run(config, *setup.shared()));
  return std::move(chosen.plan.file);
}

Status write_plan(const lower::PlanFile& plan, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "programs", ec);
  if (ec) return Error::at(dir, "cannot create '" + dir + "': " + ec.message());
  LOOM_ASSIGN_OR_RETURN(std::string json, lower::plan_to_json(plan));
  LOOM_TRY(write_file_durably(fs::path(dir) / "plan.json", json));
  for (int64_t r = 0; r < plan.world_size; ++r)
    LOOM_TRY(write_file_durably(fs::path(dir) / "programs" / ("rank_" + std::to_string(r) + ".txt"),
                                lower::listing(plan.graph, plan.lowered, Rank(r))));
  return Status::success();
}

Trainer::Trainer(std::unique_ptr<runtime::Trainer> impl, Setup setup,
                 std::shared_ptr<const plan::PlanChoice> plan)
    : impl_(std::move(impl)), setup_(std::move(setup)), plan_(std::move(plan)) {}
Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::from_file(const std::string& config_path,
                                                    const std::vector<std::string>& overrides,
                                                    const Setup& setup) {
  LOOM_ASSIGN_OR_RETURN(Config config, load_config(config_path, overrides));
  return create(config, setup);
}

Result<std::unique_ptr<Trainer>> Trainer::create(const Config& given, const Setup& setup) {
  LOOM_ASSIGN_OR_RETURN(Config config, with_hf_args(given));
  LOOM_ASSIGN_OR_RETURN(plan::PlanChoice chosen, launch::plan_run(config, *setup.shared()));
  auto held = std::make_shared<const plan::PlanChoice>(chosen);
  LOOM_ASSIGN_OR_RETURN(auto impl, launch::create_trainer(chosen.config, std::move(chosen.plan),
                                                          nullptr, setup.shared()));
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl), setup, std::move(held)));
}

Result<StepStats> Trainer::step() {
  LOOM_ASSIGN_OR_RETURN(runtime::StepStats s, impl_->step());
  StepStats out{s.step,         s.loss,           s.lr,      s.grad_norm, s.step_time_s,
                s.tokens_per_s, s.peak_mem_bytes, s.has_val, s.val_loss};
  for (const auto& hook : hooks_) hook(out);
  return out;
}

Status Trainer::fit(int64_t steps) {
  const int64_t until = steps < 0 ? impl_->config().run.steps : impl_->steps_done() + steps;
  while (impl_->steps_done() < until) LOOM_TRY(step());
  return Status::success();
}

void Trainer::on_step(std::function<void(const StepStats&)> hook) {
  hooks_.push_back(std::move(hook));
}

const lower::PlanFile& Trainer::plan() const { return plan_->plan.file; }

Status Trainer::dump_plan(const std::string& dir) const {
  Result<std::string> summary = plan::write_plan_dump(dir, plan_->config, plan_->plan);
  if (!summary.ok()) return summary.error();
  return Status::success();
}

int64_t Trainer::rank() const { return impl_->rank(); }
int64_t Trainer::world_size() const { return impl_->config().parallel.world_size(); }
int64_t Trainer::steps_done() const { return impl_->steps_done(); }
const Config& Trainer::config() const { return impl_->config(); }

}  // namespace loom
