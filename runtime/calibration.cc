#include "runtime/calibration.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>

#include "comm/make_comm.h"
#include "runtime/device.h"

#if LOOM_TORCH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace loom::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  LOOM_CHECK(!v.empty()) << "median of no samples";
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// A non-negative integer from the launcher's environment, or `fallback` when unset.
int64_t env_int(const comm::EnvLookup& env, const char* name, int64_t fallback) {
  const std::optional<std::string> v = env(name);
  return v ? std::max<int64_t>(0, std::atoll(v->c_str())) : fallback;
}

// Median seconds of one product, repeated for `budget_s` after a warm-up (at least three times):
// the median, as a machine shared with other work stalls a few repeats.
double time_product(const std::function<at::Tensor()>& product, const RunDevice& d, double budget_s,
                    int64_t max_repeats) {
  product();
  synchronize_device(d);
  std::vector<double> t;
  const auto start = Clock::now();
  do {
    const auto t0 = Clock::now();
    product();
    synchronize_device(d);
    t.push_back(seconds_since(t0));
  } while (t.size() < 3 ||
           (seconds_since(start) < budget_s && static_cast<int64_t>(t.size()) < max_repeats));
  return median(t);
}

// Forward, input-gradient and weight-gradient products of one linear, laid out as the linear
// kernel and its autograd backward lay them out.
std::array<double, 3> time_linear(const LinearShape& s, const RunDevice& d, double budget_s,
                                  int64_t max_repeats) {
  const at::TensorOptions opts = d.options(d.compute);
  const at::Tensor x = at::rand({s.m, s.k}, d.options(at::kFloat)).to(opts);
  const at::Tensor w = at::rand({s.n, s.k}, d.options(at::kFloat)).to(opts);
  const at::Tensor dy = at::rand({s.m, s.n}, d.options(at::kFloat)).to(opts);
  const std::array<std::function<at::Tensor()>, 3> products = {[&] { return at::mm(x, w.t()); },
                                                               [&] { return at::mm(dy, w); },
                                                               [&] { return at::mm(dy.t(), x); }};
  std::array<double, 3> seconds{};
  for (size_t i = 0; i < products.size(); ++i)
    seconds[i] = time_product(products[i], d, budget_s / 3, max_repeats);
  return seconds;
}

double copy_seconds_per_byte(const RunDevice& d, int64_t bytes, double budget_s,
                             int64_t max_repeats) {
  const at::Tensor src = at::ones({bytes / 4}, d.options(at::kFloat));
  at::Tensor dst = at::empty_like(src);
  dst.copy_(src);
  synchronize_device(d);
  std::vector<double> t;
  const auto start = Clock::now();
  while (t.size() < 3 ||
         (seconds_since(start) < budget_s && static_cast<int64_t>(t.size()) < max_repeats)) {
    const auto t0 = Clock::now();
    dst.copy_(src);
    synchronize_device(d);
    t.push_back(seconds_since(t0));
  }
  return median(t) / static_cast<double>(src.numel() * 4);
}

// One primitive at one size, called as a step calls it: right after compute (`before`), with no
// barrier, so that the time includes waiting for the slowest rank. Repeats are chosen by rank 0
// from the warm-up so that every rank runs the same number of calls; the median is returned.
Result<double> time_collective(comm::Comm& world, const RunDevice& d,
                               const std::function<Status()>& op,
                               const std::function<void()>& before, const CalibrationRequest& req) {
  LOOM_TRY(world.barrier());
  auto t0 = Clock::now();
  LOOM_TRY(op());
  const double warm_s = std::max(seconds_since(t0), 1e-7);
  at::Tensor repeats = at::full(
      {1},
      std::clamp<int64_t>(static_cast<int64_t>(req.seconds_per_point / warm_s), 3, req.max_repeats),
      d.options(at::kLong));
  LOOM_TRY(world.broadcast_async(repeats, Rank(0)).synchronize());
  const int64_t n = repeats.cpu().item<int64_t>();
  std::vector<double> t;
  LOOM_TRY(world.barrier());
  for (int64_t i = 0; i < n; ++i) {
    before();
    t0 = Clock::now();
    LOOM_TRY(op());
    t.push_back(seconds_since(t0));
  }
  return median(t);
}

// The operation of `primitive` on `piece_bytes` per rank (rounded to whole float32 elements that
// split evenly over the ranks), and the piece actually sent.
std::pair<std::function<Status()>, int64_t> make_op(comm::Comm& world, const RunDevice& d,
                                                    const std::string& primitive,
                                                    int64_t piece_bytes) {
  const int64_t k = world.size();
  const at::TensorOptions opts = d.options(at::kFloat);
  const int64_t per_rank = std::max<int64_t>(1, piece_bytes / 4 / k);
  const int64_t elements =
      primitive == "send_recv" || primitive == "all_reduce" || primitive == "all_gather"
          ? std::max<int64_t>(1, piece_bytes / 4)
          : per_rank * k;
  const at::Tensor in = at::ones({elements}, opts);
  const int64_t bytes = elements * 4;
  const int64_t me = world.rank().value();
  if (primitive == "send_recv") {
    // Half a ping-pong between ranks 0 and 1; the others wait at the barrier.
    return {[&world, in, me]() -> Status {
              if (me == 0) {
                LOOM_TRY(world.send_async(in, Rank(1)).synchronize());
                return world.recv_async(in, Rank(1)).synchronize();
              }
              if (me == 1) {
                LOOM_TRY(world.recv_async(in, Rank(0)).synchronize());
                return world.send_async(in, Rank(0)).synchronize();
              }
              return Status::success();
            },
            bytes};
  }
  if (primitive == "all_reduce")
    return {[&world, in] { return world.all_reduce_async(in).synchronize(); }, bytes};
  if (primitive == "all_gather") {
    const at::Tensor out = at::empty({elements * k}, opts);
    return {[&world, in, out] { return world.all_gather_flat_async(out, in).synchronize(); },
            bytes};
  }
  if (primitive == "reduce_scatter") {
    const at::Tensor out = at::empty({per_rank}, opts);
    return {[&world, in, out] { return world.reduce_scatter_flat_async(out, in).synchronize(); },
            bytes};
  }
  LOOM_CHECK(primitive == "all_to_all") << "no calibration of primitive " << primitive;
  std::vector<at::Tensor> ins, outs;
  for (int64_t j = 0; j < k; ++j) {
    ins.push_back(in.narrow(0, j * per_rank, per_rank));
    outs.push_back(at::empty({per_rank}, opts));
  }
  return {[&world, ins, outs] { return world.all_to_all_async(outs, ins).synchronize(); }, bytes};
}

Result<RankMeasurements> measure(const CalibrationRequest& req) {
  const comm::EnvLookup env = comm::process_env();
  CommConfig comm_config;
  comm_config.backend = req.backend;
  comm_config.timeout_s = req.timeout_s;
  RankMeasurements m;
  m.intra_op_threads = comm::configure_worker_threads(env);
  DeviceRequest device;
  LOOM_ASSIGN_OR_RETURN(device.device, parse_device(req.device));
  LOOM_ASSIGN_OR_RETURN(device.precision, parse_precision(req.precision));
  LOOM_ASSIGN_OR_RETURN(RunDevice d, select_device(device, comm::local_rank(env)));
  LOOM_ASSIGN_OR_RETURN(std::shared_ptr<comm::Comm> world,
                        comm::make_comm(comm_config, env, d.cuda()));
  m.rank = world->rank().value();
  m.world_size = world->size();
  m.device = d.to_string();
  if (world->size() < 2)
    return Error::at("WORLD_SIZE", "calibration needs at least 2 ranks to time communication");

  // Rank 0's products alone (what one busy device of a node sustains while the others idle, as
  // in a pipeline's bubble), then compute and the copy on every rank at once, as in a step.
  LOOM_TRY(world->barrier());
  if (m.rank == 0)
    for (const LinearShape& s : req.linears)
      m.alone_linear_seconds.push_back(time_linear(s, d, req.seconds_per_point, req.max_repeats));
  LOOM_TRY(world->barrier());
  for (const LinearShape& s : req.linears)
    m.linear_seconds.push_back(time_linear(s, d, req.seconds_per_point, req.max_repeats));
  // Then 2, 4, ... ranks at once (the others waiting): how many busy ranks a node sustains best.
  for (int64_t busy : partial_busy_levels(m.world_size)) {
    LOOM_TRY(world->barrier());
    m.level_linear_seconds.emplace_back();
    if (m.rank < busy)
      for (const LinearShape& s : req.linears)
        m.level_linear_seconds.back().push_back(
            time_linear(s, d, req.seconds_per_point, req.max_repeats));
  }
  LOOM_TRY(world->barrier());
  m.copy_seconds_per_byte =
      copy_seconds_per_byte(d, req.copy_bytes, req.seconds_per_point, req.max_repeats);
  const int64_t per_machine =
      env_int(env, "LOCAL_WORLD_SIZE", env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1));
  m.memory_bytes = device_memory_bytes(d, std::max<int64_t>(1, per_machine));

  // The compute before each call: the forward product of the model's smallest linear.
  std::function<void()> before = [] {};
  at::Tensor x, w;
  if (!req.linears.empty()) {
    const LinearShape s = *std::min_element(req.linears.begin(), req.linears.end(),
                                            [](const LinearShape& a, const LinearShape& b) {
                                              return a.m * a.k * a.n < b.m * b.k * b.n;
                                            });
    x = at::rand({s.m, s.k}, d.options(at::kFloat)).to(d.options(d.compute));
    w = at::rand({s.n, s.k}, d.options(at::kFloat)).to(d.options(d.compute));
    before = [&] {
      at::mm(x, w.t());
      synchronize_device(d);
    };
  }
  for (const std::string& primitive : calibrated_primitives())
    for (int64_t bytes : req.message_bytes) {
      auto [op, sent] = make_op(*world, d, primitive, bytes);
      LOOM_ASSIGN_OR_RETURN(double seconds, time_collective(*world, d, op, before, req));
      if (primitive == "send_recv") seconds /= 2;  // a round trip is two messages
      m.comm.push_back({primitive, primitive == "send_recv" ? 2 : m.world_size, sent, seconds});
    }
  LOOM_TRY(world->barrier());
  return m;
}

}  // namespace

// The memory one rank may use: the GPU's total, or the machine's MemTotal shared by the ranks on
// it (LOCAL_WORLD_SIZE).
double device_memory_bytes(const RunDevice& d, int64_t ranks_per_machine) {
#if LOOM_TORCH_CUDA
  if (d.cuda()) {
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
      return static_cast<double>(total_bytes);
  }
#else
  (void)d;
#endif
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("MemTotal:", 0) == 0) {
      std::istringstream fields(line.substr(9));
      double kib = 0;
      fields >> kib;
      return kib * 1024 / static_cast<double>(ranks_per_machine);
    }
  return 0;
}

std::string default_calibration_device() { return cuda_device_count() > 0 ? "cuda" : "cpu"; }

Result<RankMeasurements> measure_rank(const CalibrationRequest& request) {
  try {
    return measure(request);
  } catch (const std::exception& e) {  // LibTorch reports failures (allocation, dtype) by throwing
    return Error::at("calibrate", std::string("a measurement failed: ") + e.what());
  }
}

}  // namespace loom::runtime
