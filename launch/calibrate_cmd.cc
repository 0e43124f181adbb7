// loom calibrate [CONFIG [key=value ...]] [--out FILE] [--backend gloo|mpi|nccl] [--ranks N]
// [--quick]: measures this machine and writes a cost model (launch/calibration.h). The ranks are
// worker processes started by loomrun (mpirun for --backend mpi), each this same binary with
// --worker-request; they measure at once and write their results into a temporary directory.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/config.h"
#include "core/durable_file.h"
#include "core/run_spec.h"
#include "launch/calibration.h"
#include "launch/cli_parse.h"
#include "launch/command.h"
#include "launch/config_file.h"
#include "plan/plan.h"
#ifdef LOOM_HAVE_RUNTIME
#include "comm/make_comm.h"
#include "runtime/machine.h"
#endif

namespace loom::cli {
namespace {

namespace fs = std::filesystem;

int fail(const std::string& message, int code = kExitBadInput) {
  std::fprintf(stderr, "loom calibrate: error: %s\n", message.c_str());
  return code;
}

#ifdef LOOM_HAVE_RUNTIME

Result<std::string> read_text(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return Error::at(path.string(), "cannot read '" + path.string() + "'");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Options {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string out = "cost-model.calibrated.yaml";
  std::string backend;  // empty: nccl on a GPU, else gloo
  int64_t ranks = 2;
  bool quick = false;
  double timeout_s = 0;  // unset (timeout_given false): 120 s with --quick, else 900 s
  bool timeout_given = false;
  std::string worker_request, worker_result_dir;
};

// `key : value` of the first /proc/cpuinfo line that has `key`.
std::string cpuinfo(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0)
      if (auto colon = line.find(':'); colon != std::string::npos)
        return line.substr(line.find_first_not_of(' ', colon + 1));
  return "unknown";
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

// Runs `argv` in its own process group with stdout sent to stderr; kills the group when
// `timeout_s` passes. Returns the exit code (128 + signal when a signal ended it).
Result<int> run_bounded(const std::vector<std::string>& argv, double timeout_s) {
  const pid_t pid = fork();
  if (pid < 0) return Error::at("calibrate", "cannot start " + argv[0]);
  if (pid == 0) {
    setpgid(0, 0);
    dup2(STDERR_FILENO, STDOUT_FILENO);  // the table alone goes to stdout
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "loom calibrate: cannot run %s\n", argv[0].c_str());
    _exit(127);
  }
  setpgid(pid, pid);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-pid, SIGTERM);  // loomrun stops its workers on SIGTERM
      std::this_thread::sleep_for(std::chrono::seconds(3));
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      return Error::at("--timeout", "the calibration ranks did not finish within --timeout " +
                                        std::to_string(static_cast<int>(timeout_s)) +
                                        " s and were stopped");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The launcher's command line: loomrun next to this binary (else on PATH) starting `ranks`
// copies of this binary as workers; mpirun for the mpi backend.
std::vector<std::string> launcher_argv(const Options& o, const fs::path& request,
                                       const fs::path& results) {
  const fs::path self = fs::read_symlink("/proc/self/exe");
  std::vector<std::string> argv;
  if (o.backend == "mpi") {
    argv = {"mpirun", "--allow-run-as-root",  "--oversubscribe", "--bind-to", "none",
            "-np",    std::to_string(o.ranks)};
  } else {
    const fs::path beside = self.parent_path() / "loomrun";
    argv = {fs::exists(beside) ? beside.string() : "loomrun", "--standalone", "--nproc-per-node",
            std::to_string(o.ranks)};
  }
  for (const std::string& a :
       {self.string(), std::string("calibrate"), std::string("--worker-request"), request.string(),
        std::string("--worker-result-dir"), results.string()})
    argv.push_back(a);
  return argv;
}

int worker_main(const Options& o) {
  auto text = read_text(o.worker_request);
  if (!text.ok()) return fail(text.error().message);
  auto request = calibrate::request_from_json(*text);
  if (!request.ok()) return fail(request.error().message);
  auto measured = runtime::measure_rank(*request);
  if (!measured.ok()) return fail(measured.error().to_string(), kExitFailure);
  const fs::path out =
      fs::path(o.worker_result_dir) / ("rank_" + std::to_string(measured->rank) + ".json");
  if (Status s = write_file_atomically(out, calibrate::measurements_to_json(*measured)); !s.ok())
    return fail(s.error().message, kExitFailure);
  return kExitOk;
}

// The linears to time and where they come from: the planned graph of CONFIG, else a default mix.
Result<std::pair<std::vector<runtime::LinearShape>, std::string>> linears_of(const Options& o,
                                                                             const Config* config) {
  if (config == nullptr)
    return std::make_pair(calibrate::default_linear_mix(o.quick),
                          std::string("a GPT block's linears (the default mix)"));
  LOOM_ASSIGN_OR_RETURN(CostModel cost, resolve_cost_model(*config));
  LOOM_ASSIGN_OR_RETURN(plan::Plan made, plan::make_plan(*config, plan::Registries{}, cost));
  std::vector<runtime::LinearShape> shapes = calibrate::linear_shapes(made.file.graph);
  if (shapes.empty())
    return std::make_pair(calibrate::default_linear_mix(o.quick),
                          o.config_path + " has no linear; the default mix");
  return std::make_pair(shapes, "the linears of " + o.config_path + "'s plan on " +
                                    std::to_string(made.world_size()) + " ranks");
}

// Starts the ranks on `request` in a temporary directory and reads back what each measured.
Result<std::vector<runtime::RankMeasurements>> measure_ranks(
    const Options& o, const runtime::CalibrationRequest& request) {
  char dir_template[] = "/tmp/loom-calibrate-XXXXXX";
  if (mkdtemp(dir_template) == nullptr)
    return Error::at("calibrate", "cannot create a temporary directory in /tmp");
  const fs::path tmp(dir_template);
  struct Remove {
    fs::path dir;
    ~Remove() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove{tmp};
  LOOM_TRY(write_file_atomically(tmp / "request.json", calibrate::request_to_json(request)));
  std::fprintf(stderr, "loom calibrate: measuring %lld ranks over %s (%s) ...\n",
               static_cast<long long>(o.ranks), o.backend.c_str(), o.quick ? "quick" : "full");
  LOOM_ASSIGN_OR_RETURN(int code,
                        run_bounded(launcher_argv(o, tmp / "request.json", tmp), o.timeout_s));
  if (code != 0)
    return Error::at("calibrate", "the calibration ranks failed (exit " + std::to_string(code) +
                                      "); their output is above");
  std::vector<runtime::RankMeasurements> ranks;
  for (int64_t r = 0; r < o.ranks; ++r) {
    auto text = read_text(tmp / ("rank_" + std::to_string(r) + ".json"));
    if (!text.ok())
      return Error::at("calibrate", "rank " + std::to_string(r) + ": " + text.error().message);
    auto m = calibrate::measurements_from_json(*text);
    if (!m.ok())
      return Error::at("calibrate", "rank " + std::to_string(r) + ": " + m.error().message);
    ranks.push_back(std::move(m).value());
  }
  return ranks;
}

// --backend (default: nccl on a GPU, else gloo), refused unless it is one this build has of
// gloo, mpi and nccl.
Result<CommBackend> backend_of(Options& o, bool gpu) {
  if (o.backend.empty())
    o.backend = std::string(name(gpu ? CommBackend::kNccl : CommBackend::kGloo));
  const Result<CommBackend> backend = parse_backend(o.backend);
  if (!backend.ok() || *backend == CommBackend::kAuto || *backend == CommBackend::kLocal)
    return Error::at("--backend", "--backend: expected gloo, mpi or nccl, got '" + o.backend + "'");
  const std::vector<std::string> built = comm::built_backends();
  if (std::find(built.begin(), built.end(), o.backend) == built.end())
    return Error::at("--backend",
                     "--backend " + o.backend + ": this build of loom has no " + o.backend);
  return backend;
}

int calibrate_main_checked(Options o) {
  if (!o.worker_request.empty()) return worker_main(o);
  // Arguments first, so a mistake costs no measurement.
  Config config;
  const bool have_config = !o.config_path.empty();
  if (have_config) {
    auto loaded = load_config_file(o.config_path, o.overrides);
    if (!loaded.ok()) return fail(loaded.error().message);
    config = *loaded;
  } else if (!o.overrides.empty()) {
    return fail("key=value overrides need a CONFIG before them");
  } else {
    config.run.device = runtime::default_calibration_device();
  }
  Result<Device> device = parse_device(config.run.device);
  if (!device.ok()) return fail(config.error("run.device", device.error().message).message);
  const bool gpu = *device == Device::kCuda;
  const Result<CommBackend> backend = backend_of(o, gpu);
  if (!backend.ok()) return fail(backend.error().message);
  if (o.ranks < 2 || o.ranks > 1024)
    return fail("--ranks: expected 2 to 1024 ranks (communication needs two), got " +
                std::to_string(o.ranks));
  if (o.timeout_given && !(o.timeout_s > 0)) {
    std::ostringstream given;
    given << o.timeout_s;
    return fail("--timeout: expected seconds > 0, got " + given.str());
  }
  if (!o.timeout_given) o.timeout_s = o.quick ? 120 : 900;
  const fs::path out(o.out);
  if (o.out.empty() || fs::is_directory(out)) return fail("--out: '" + o.out + "' is not a file");
  if (const fs::path dir = out.parent_path(); !dir.empty() && !fs::is_directory(dir))
    return fail("--out: no directory '" + dir.string() + "'");
  auto linears = linears_of(o, have_config ? &config : nullptr);
  if (!linears.ok()) return fail(linears.error().message);

  runtime::CalibrationRequest request;
  request.device = config.run.device;
  request.precision = config.run.precision;
  request.backend = o.backend;
  request.timeout_s = std::min(60.0, o.timeout_s);
  request.linears = linears->first;
  request.message_bytes = calibrate::default_message_bytes(o.quick);
  request.copy_bytes = o.quick ? int64_t{64} << 20 : int64_t{256} << 20;
  request.seconds_per_point = o.quick ? 0.05 : 0.3;
  request.max_repeats = o.quick ? 20 : 100;

  auto ranks = measure_ranks(o, request);
  if (!ranks.ok()) return fail(ranks.error().message, kExitFailure);

  std::map<std::string, std::string> machine;
  for (const auto& [k, v] : runtime::describe_machine()) machine[k] = v;
  const auto& sizes = request.message_bytes;
  const std::vector<std::string> header = {
      "loom calibrate, " + utc_now() + ", on " + cpuinfo("model name") + " (" +
          std::to_string(std::thread::hardware_concurrency()) + " cores), " + (*ranks)[0].device,
      std::to_string(o.ranks) + " ranks started by " +
          (*backend == CommBackend::kMpi ? "mpirun" : "loomrun") + " over " + o.backend + ", " +
          std::to_string((*ranks)[0].intra_op_threads) + " intra-op thread(s) per rank; LibTorch " +
          machine["libtorch"] + ", ATEN_CPU_CAPABILITY " + machine["aten_cpu_capability"],
      "compute: " + config.run.precision +
          " matrix products (forward, input and weight "
          "gradient) of " +
          linears->second + ", all ranks at once",
      "memory: " + std::string(gpu ? "the GPU's total" : "MemTotal / ranks on this machine") +
          "; copy bandwidth from a " + std::to_string(request.copy_bytes >> 20) + " MiB copy",
      "communication: " + std::to_string(sizes.size()) + " sizes from " +
          std::to_string(sizes.front() >> 10) + " KiB to " + std::to_string(sizes.back() >> 10) +
          " KiB per rank, medians of repeats timed on rank 0" + (o.quick ? " (--quick)" : "")};
  const std::string base = gpu ? "h100" : "cpu";
  auto calibration = calibrate::combine(request, *ranks, base, header);
  if (!calibration.ok()) return fail(calibration.error().message, kExitFailure);
  if (Status s = write_file_atomically(out, calibrate::to_yaml(*calibration)); !s.ok())
    return fail("--out: " + s.error().message, kExitFailure);
  std::fputs(calibrate::to_table(*calibration).c_str(), stdout);
  std::printf("loom calibrate: wrote %s\n", out.string().c_str());
  return kExitOk;
}

#endif  // LOOM_HAVE_RUNTIME

}  // namespace

int calibrate_main(const Args& args) {
#ifdef LOOM_HAVE_RUNTIME
  CLI::App app{
      "Measure this machine (matrix products, memory, communication between ranks) and "
      "write a cost model that loom plan --cost-model and cost.file read.",
      "loom calibrate"};
  Options o;
  app.add_option("config", o.config_path,
                 "a run's YAML config: time its model's linears in its precision");
  app.add_option("overrides", o.overrides, "key=value overrides of CONFIG");
  app.add_option("--out", o.out, "the cost-model file to write")->capture_default_str();
  app.add_option("--backend", o.backend, "gloo | mpi | nccl (default: nccl on GPUs, else gloo)");
  app.add_option("--ranks", o.ranks, "worker processes on this machine")->capture_default_str();
  app.add_flag("--quick", o.quick, "fewer sizes and repeats (seconds instead of a minute)");
  app.add_option("--timeout", o.timeout_s,
                 "seconds before the ranks are stopped (default 120 with --quick, else 900)");
  app.add_option("--worker-request", o.worker_request)->group("");  // the ranks' own arguments
  app.add_option("--worker-result-dir", o.worker_result_dir)->group("");
  if (auto code = parse_args(app, args, "calibrate")) return *code;
  o.timeout_given = app.count("--timeout") > 0;
  return calibrate_main_checked(std::move(o));
#else
  (void)args;
  return fail("this build of loom has no runtime (LOOM_WITH_RUNTIME=OFF)", kExitFailure);
#endif
}

}  // namespace loom::cli
