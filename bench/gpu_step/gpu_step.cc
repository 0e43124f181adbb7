// bench/gpu_step: loom's training step on one GPU, against the GPU's peak and against PyTorch.
// 1. A bf16 8192^3 matrix product, timed: the FLOP rate this GPU actually reaches.
// 2. The GPU's dense bf16 peak from a table by its name (nvidia-smi), or the measured one.
// 3. loom's Trainer on GPT gpt3-1.3b, run.device=cuda, run.precision=bf16, AdamW: median step,
//    tokens/s, peak device memory, and MFU = tokens/s x model FLOPs per token / peak.
// 4. The same model and step in PyTorch eager (eager_gpt.py, autocast bf16, fused AdamW) in its
//    own process after loom's memory is handed back, and the same under torch.compile (default
//    mode and max-autotune-no-cudagraphs): the ratios of tokens/s.
// 5. loom again with run.deterministic (the cost of bitwise repeatability) and with
//    run.precision fp8 (tensorwise and rowwise) on the same model.
// 6. A Llama-3-8B-shaped layer stack (hidden 4096, SwiGLU 14336, 32 query / 8 kv heads, seq
//    8192; --llama-layers layers, vocabulary 32000) in fp8 against bf16: the ratio of tokens/s.
// Targets: MFU >= 45 %, loom / eager >= 1.00, loom / torch.compile >= 1.00, fp8 / bf16 on the
// Llama stack >= 1.25. The figures are read, never asserted (exit 0),
// and a last line `bench_gpu_step_json {...}` carries them all for scripts/gpu-check's log.
// Where no GPU is usable it prints one `bench_gpu_step: skipped: <reason>` line and exits 0.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <sys/wait.h>
#include <torch/version.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "launch/planned_trainer.h"
#include "launch/run_device.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "runtime/device.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"

#if LOOM_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#include <torch/csrc/autograd/profiler_kineto.h>

#include <map>

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

constexpr double kMfuTarget = 0.45;
constexpr double kRatioTarget = 1.00;
constexpr double kFp8Target = 1.25;

struct Options {
  bool quick = false;
  int64_t micro = 8;   // sequences per step (batch.global = batch.micro: one micro-batch)
  int64_t steps = 10;  // timed steps
  int64_t warmup = 3;  // untimed steps first
  std::string python = "python3";  // $PYTHON when set, as scripts/gpu-check
  std::string script = LOOM_SOURCE_DIR "/bench/gpu_step/eager_gpt.py";
  std::string profile;  // one more step after the timed ones, profiled: its chrome trace here
  // torch.compile modes of the PyTorch baseline, each in its own process (empty: eager only).
  std::vector<std::string> compile_modes = {"default", "max-autotune-no-cudagraphs"};
  int64_t peer_timeout_s = 300;  // each baseline process, compilation included
  bool variants = true;          // loom deterministic and fp8 on the same model
  int64_t llama_layers = 4;      // the Llama-3-8B-shaped stack (0: not run)
  bool only_llama = false;       // that stack alone; --profile then profiles its fp8 step
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_gpu_step: %s\nusage: bench_gpu_step [--quick] [--micro M] [--steps N] "
               "[--warmup W] [--python PATH (default $PYTHON or python3)] [--script eager_gpt.py] "
               "[--profile TRACE.json] [--compile MODE,MODE|none] [--peer-timeout S] "
               "[--no-variants] [--llama-layers N (0: none)] [--only-llama]\n",
               why);
  std::exit(2);
}

Options parse_options(int argc, char** argv) {
  Options o;
  if (const char* p = std::getenv("PYTHON"); p && *p) o.python = p;
  bool steps_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    auto positive = [&](const std::string& v) -> int64_t {
      const long long n = std::atoll(v.c_str());
      if (n < 1) usage((a + " needs a positive number, got '" + v + "'").c_str());
      return n;
    };
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--micro") {
      o.micro = positive(value());
    } else if (a == "--steps") {
      o.steps = positive(value());
      steps_given = true;
    } else if (a == "--warmup") {
      o.warmup = std::max<int64_t>(0, std::atoll(value().c_str()));
    } else if (a == "--python") {
      o.python = value();
    } else if (a == "--script") {
      o.script = value();
    } else if (a == "--profile") {
      o.profile = value();
    } else if (a == "--compile") {
      o.compile_modes.clear();
      const std::string v = value();
      for (size_t at = 0; v != "none" && at <= v.size();) {
        const size_t comma = std::min(v.find(',', at), v.size());
        if (comma > at) o.compile_modes.push_back(v.substr(at, comma - at));
        at = comma + 1;
      }
    } else if (a == "--peer-timeout") {
      o.peer_timeout_s = positive(value());
    } else if (a == "--no-variants") {
      o.variants = false;
    } else if (a == "--only-llama") {
      o.only_llama = true;
    } else if (a == "--llama-layers") {
      o.llama_layers = std::max<int64_t>(0, std::atoll(value().c_str()));
    } else {
      usage(("unknown argument '" + a + "'").c_str());
    }
  }
  if (o.quick && !steps_given) o.steps = 3;
  if (o.quick) {
    o.warmup = std::min<int64_t>(o.warmup, 1);
    o.compile_modes.clear();
    o.variants = false;
    o.llama_layers = 0;
  }
  return o;
}

// ---- 1. the matrix-product peak --------------------------------------------------------------

// TFLOP/s of a bf16 n x n x n at::matmul; one host read after the timed products waits for them
// all (the device runs them in order).
double matmul_tflops(const at::Device& device, int64_t n, int warmup, int iters) {
  const auto opts = at::TensorOptions().device(device).dtype(at::kBFloat16);
  at::Tensor a = at::randn({n, n}, opts), b = at::randn({n, n}, opts), c;
  auto wait = [&] { (void)c.select(0, 0).select(0, 0).item<float>(); };
  for (int i = 0; i < warmup; ++i) c = at::matmul(a, b);
  wait();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) c = at::matmul(a, b);
  wait();
  const double s = seconds_since(t0);
  return 2.0 * static_cast<double>(n) * n * n * iters / s / 1e12;
}

// ---- 2. the GPU's peak from its name ---------------------------------------------------------

// The GPU's name as nvidia-smi reports it (the first of CUDA_VISIBLE_DEVICES: that is cuda:0).
std::string gpu_name() {
  std::string index = "0";
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v) {
    index = std::string(v).substr(0, std::string(v).find(','));
    for (char ch : index)
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-') return "";
  }
  const std::string cmd =
      "nvidia-smi --query-gpu=name --format=csv,noheader -i " + index + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  char buf[256] = {0};
  std::string name = std::fgets(buf, sizeof buf, p) ? buf : "";
  pclose(p);
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  return name;
}

struct Peak {
  double tflops = 0;
  std::string source;  // "table: H100 SXM" or why the measured rate stands in
};

// Dense (not 2:4 sparse) bf16 tensor-core peaks from NVIDIA's data sheets, TFLOP/s. Checked in
// order: the first entry whose key is in the name wins ("H100 NVL" before "H100"; nvidia-smi
// calls the SXM part "NVIDIA H100 80GB HBM3").
Peak peak_of(const std::string& name, double measured) {
  struct Entry {
    const char* key;
    const char* label;
    double tflops;
  };
  static const Entry kTable[] = {
      {"H100 NVL", "H100 NVL", 835}, {"H100 PCIe", "H100 PCIe", 756}, {"H100", "H100 SXM", 989.4},
      {"H200 NVL", "H200 NVL", 835}, {"H200", "H200", 989.4},         {"A100", "A100", 312},
      {"L40S", "L40S", 362},
  };
  for (const Entry& e : kTable)
    if (name.find(e.key) != std::string::npos) return {e.tflops, std::string("table: ") + e.label};
  return {measured, "measured matmul: '" + (name.empty() ? std::string("(no name)") : name) +
                        "' is not in the table"};
}

// ---- 3. loom ---------------------------------------------------------------------------------

struct Shape {
  std::string preset;
  loom::models::GptSpec spec;
};

struct LoomFigures {
  double step_s = 0;       // median of StepStats::step_time_s
  double loop_step_s = 0;  // the timed steps' wall time / steps, closed by a host read
  double tokens_per_s = 0;
  int64_t peak_mem_bytes = 0;  // most over the timed steps
  double first_loss = 0, last_loss = 0;
  std::string error;  // empty when it ran
};

loom::Result<loom::Config> bench_config(const std::string& preset, const Options& o) {
  const std::string yaml =
      "run: {seed: 1, steps: 1000000, device: cuda, precision: bf16}\n"
      "model: {type: gpt, preset: " +
      preset +
      "}\n"
      "optimizer: {type: adamw, lr: 0.0003, betas: [0.9, 0.95], weight_decay: 0.1}\n"
      "data: {type: synthetic}\n";
  std::vector<std::string> overrides = {"batch.global=" + std::to_string(o.micro),
                                        "batch.micro=" + std::to_string(o.micro)};
  if (o.quick) overrides.push_back("model.args.seq=512");
  return loom::parse_config(yaml, "bench_gpu_step", overrides);
}

// One step under LibTorch's profiler (Kineto: host ops and CUDA kernels): its chrome trace to
// `path`, and where the device's time went: the kernels by total time, and the device's idle
// share of the step's wall time. Read, never asserted.
void profile_step(loom::runtime::Trainer& trainer, const std::string& path) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities = {ActivityType::CPU, ActivityType::CUDA};
  try {
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    const Clock::time_point t0 = Clock::now();
    auto st = trainer.step();
    (void)trainer.executor().parameters().front().flatten()[0].item<float>();
    const double wall_ms = seconds_since(t0) * 1e3;
    std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
    if (!st.ok()) {
      std::printf("profile: the profiled step failed: %s\n", st.error().message.c_str());
      return;
    }
    result->save(path);
    std::map<std::string, std::pair<double, int>> kernels;  // name -> (ms, count)
    double busy_ms = 0;
    for (const auto& e : result->events()) {
      if (e.deviceType() != c10::DeviceType::CUDA) continue;
      const double ms = static_cast<double>(e.durationNs()) / 1e6;
      auto& k = kernels[e.name().substr(0, 90)];
      k.first += ms;
      k.second += 1;
      busy_ms += ms;
    }
    std::vector<std::pair<double, std::string>> order;
    for (const auto& [name, k] : kernels) order.push_back({k.first, name});
    std::sort(order.rbegin(), order.rend());
    std::printf("profile: one step %.1f ms wall, device busy %.1f ms (%.1f %% idle), trace %s\n",
                wall_ms, busy_ms, 100.0 * std::max(0.0, 1.0 - busy_ms / wall_ms), path.c_str());
    for (size_t i = 0; i < std::min<size_t>(order.size(), 20); ++i)
      std::printf("profile: %8.2f ms %5.1f %% x%-5d %s\n", order[i].first,
                  100.0 * order[i].first / busy_ms, kernels[order[i].second].second,
                  order[i].second.c_str());
  } catch (const std::exception& e) {
    std::printf("profile: %s\n", e.what());
  }
}

// Tokens per sample of a GPT or Llama config.
int64_t sequence_of(const loom::Config& config) {
  if (config.model.type == "llama") return loom::models::llama_spec(config)->seq;
  return loom::models::gpt_spec(config)->seq;
}

// A step's host read (loss and norm) comes before its optimizer update, which the device still
// runs when step() returns: in a steady loop each step_time_s spans one period all the same, and
// the loop's wall time, closed by reading a parameter, checks that.
void take_steps(loom::runtime::Trainer& trainer, const Options& o, LoomFigures& f) {
  std::vector<double> times;
  Clock::time_point loop_start;
  for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
    if (i == o.warmup) loop_start = Clock::now();
    auto st = trainer.step();
    if (!st.ok()) {
      f.error = st.error().message;
      return;
    }
    if (i == 0) f.first_loss = st->loss;
    f.last_loss = st->loss;
    if (i < o.warmup) continue;
    times.push_back(st->step_time_s);
    f.peak_mem_bytes = std::max(f.peak_mem_bytes, st->peak_mem_bytes);
  }
  (void)trainer.executor().parameters().front().flatten()[0].item<float>();
  f.loop_step_s = seconds_since(loop_start) / static_cast<double>(o.steps);
  f.step_s = median(times);
  f.tokens_per_s = static_cast<double>(trainer.config().batch.global) *
                   static_cast<double>(sequence_of(trainer.config())) / f.step_s;
  if (!o.profile.empty()) profile_step(trainer, o.profile);
}

// The trainer lives only in here, so its device memory is free when this returns. LibTorch's
// errors (running out of device memory among them) become the figures' error, so the eager
// baseline still runs and the JSON line is still written.
LoomFigures run_loom(const loom::Config& config, const Options& o) {
  LoomFigures f;
  try {
    auto trainer = loom::launch::create_trainer(config);
    if (!trainer.ok())
      f.error = trainer.error().message;
    else
      take_steps(**trainer, o, f);
  } catch (const std::exception& e) {
    f.error = e.what();
  }
  if (f.error.find("out of memory") != std::string::npos)
    f.error +=
        " (a smaller batch: --micro " + std::to_string(std::max<int64_t>(1, o.micro / 2)) + ")";
  return f;
}

// The caching allocator keeps freed blocks reserved for this process; the eager baseline runs
// in another process and needs them back.
void release_cached_device_memory() {
#if LOOM_TORCH_CUDA
  c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

// Model FLOPs per token of one training step (forward + backward), as PaLM's MFU counts them:
// 6 per parameter (2 forward, 4 backward: every weight is in one matrix product per token) plus
// 12 L h s for the attention scores and their weighted sum (the full s x s, causal or not).
// parameter_count() counts the tied V x h matrix once, which is right: it does one product per
// token (the LM head) and its other use, the token lookup, costs no FLOPs. Biases, norms and the
// position table are counted though they do no product (0.3 % of gpt3-1.3b, the convention).
double flops_per_token(const loom::models::GptSpec& s) {
  return 6.0 * static_cast<double>(s.parameter_count()) +
         12.0 * static_cast<double>(s.layers * s.hidden * s.seq);
}

// ---- 4. PyTorch eager ------------------------------------------------------------------------

struct EagerFigures {
  double step_s = 0, tokens_per_s = 0;
  int64_t peak_mem_bytes = 0, params = 0;
  std::string error;  // empty when it ran
};

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs eager_gpt.py on the same shape and reads its `eager tokens_per_s=...` line; echoes what
// it prints so a failure explains itself in the log.
EagerFigures run_eager(const loom::models::GptSpec& s, const Options& o,
                       const std::string& compile_mode = "") {
  EagerFigures e;
  if (FILE* f = std::fopen(o.script.c_str(), "r")) {
    std::fclose(f);
  } else {
    e.error = "no eager script at " + o.script + " (--script PATH)";
    return e;
  }
  const std::string cmd =
      "timeout " + std::to_string(o.peer_timeout_s) + " " + shell_quote(o.python) + " " +
      shell_quote(o.script) + " --layers " + std::to_string(s.layers) + " --hidden " +
      std::to_string(s.hidden) + " --heads " + std::to_string(s.heads) + " --vocab " +
      std::to_string(s.vocab) + " --seq " + std::to_string(s.seq) + " --micro " +
      std::to_string(o.micro) + " --steps " + std::to_string(o.steps) + " --warmup " +
      std::to_string(o.warmup) + " --tied " + (s.tied ? "1" : "0") +
      (compile_mode.empty() ? "" : " --compile " + shell_quote(compile_mode)) + " 2>&1";
  std::printf("eager: %s\n", cmd.c_str());
  std::fflush(stdout);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    e.error = "cannot start " + o.python;
    return e;
  }
  char buf[4096];
  std::string last;
  bool parsed = false;
  while (std::fgets(buf, sizeof buf, p)) {
    std::printf("  | %s", buf);
    long long mem = 0, params = 0;
    if (std::sscanf(buf, "eager tokens_per_s=%lf step_s=%lf peak_mem_bytes=%lld params=%lld",
                    &e.tokens_per_s, &e.step_s, &mem, &params) >= 3) {
      parsed = true;
      e.peak_mem_bytes = mem;
      e.params = params;
    }
    if (buf[0] != '\n') last = buf;
  }
  std::fflush(stdout);
  const int status = pclose(p);
  const int rc = status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  while (!last.empty() && last.back() == '\n') last.pop_back();
  if (rc != 0 || !parsed)
    e.error = o.python + " " + o.script + " exited with " + std::to_string(rc) +
              (last.empty() ? std::string() : ": " + last);
  return e;
}

// ---- 5. the report ---------------------------------------------------------------------------

const char* verdict(double value, double target) { return value >= target ? "met" : "NOT met"; }

void print_model(const Shape& sh, const Options& o) {
  const auto& s = sh.spec;
  std::printf(
      "model: GPT %s: %lld layers, hidden %lld, %lld heads, vocab %lld, seq %lld, %s head, "
      "%.1f M parameters; micro-batch %lld, %lld warm-up + %lld timed steps\n",
      sh.preset.c_str(), static_cast<long long>(s.layers), static_cast<long long>(s.hidden),
      static_cast<long long>(s.heads), static_cast<long long>(s.vocab),
      static_cast<long long>(s.seq), s.tied ? "tied" : "untied", s.parameter_count() / 1e6,
      static_cast<long long>(o.micro), static_cast<long long>(o.warmup),
      static_cast<long long>(o.steps));
}

void print_loom(const LoomFigures& f, double fpt, const Peak& peak, double matmul) {
  if (!f.error.empty()) {
    std::printf("loom: FAILED: %s\n", f.error.c_str());
    return;
  }
  std::printf(
      "loom: median step %.4f s (loop mean %.4f s), %.0f tokens/s, peak memory %.2f GiB, "
      "loss %.4f -> %.4f\n",
      f.step_s, f.loop_step_s, f.tokens_per_s, gib(f.peak_mem_bytes), f.first_loss, f.last_loss);
  const double mfu = f.tokens_per_s * fpt / (peak.tflops * 1e12);
  std::printf("MFU against the peak (%.1f TFLOP/s, %s): %.1f %%   target >= %.0f %%: %s\n",
              peak.tflops, peak.source.c_str(), 100 * mfu, 100 * kMfuTarget,
              verdict(mfu, kMfuTarget));
  std::printf("MFU against the measured matmul (%.1f TFLOP/s): %.1f %%\n", matmul,
              100 * f.tokens_per_s * fpt / (matmul * 1e12));
}

void print_eager(const EagerFigures& e, const LoomFigures& f, int64_t loom_params) {
  if (!e.error.empty()) {
    std::printf("eager: not measured: %s\n", e.error.c_str());
    return;
  }
  std::printf("eager: median step %.4f s, %.0f tokens/s, peak memory %.2f GiB\n", e.step_s,
              e.tokens_per_s, gib(e.peak_mem_bytes));
  if (e.params != 0 && e.params != loom_params)
    std::printf("eager: WARNING: %lld parameters, loom's model has %lld: not the same model\n",
                static_cast<long long>(e.params), static_cast<long long>(loom_params));
  if (f.error.empty())
    std::printf("loom / eager tokens/s ratio: %.3f   target >= %.2f: %s\n",
                f.tokens_per_s / e.tokens_per_s, kRatioTarget,
                verdict(f.tokens_per_s / e.tokens_per_s, kRatioTarget));
}

Json figures_json(const std::string& gpu, double matmul, const Peak& peak, const Shape& sh,
                  const Options& o, const LoomFigures& f, const EagerFigures& e) {
  const double fpt = flops_per_token(sh.spec);
  Json j = {{"gpu", gpu},
            {"torch", TORCH_VERSION},
            {"matmul_bf16_tflops", matmul},
            {"peak_bf16_tflops", peak.tflops},
            {"peak_source", peak.source},
            {"preset", sh.preset},
            {"layers", sh.spec.layers},
            {"hidden", sh.spec.hidden},
            {"heads", sh.spec.heads},
            {"vocab", sh.spec.vocab},
            {"seq", sh.spec.seq},
            {"tied", sh.spec.tied},
            {"params", sh.spec.parameter_count()},
            {"flops_per_token", fpt},
            {"micro", o.micro},
            {"warmup_steps", o.warmup},
            {"steps", o.steps},
            {"quick", o.quick},
            {"mfu_target", kMfuTarget},
            {"ratio_target", kRatioTarget}};
  if (f.error.empty()) {
    j["loom_step_s"] = f.step_s;
    j["loom_loop_step_s"] = f.loop_step_s;
    j["loom_tokens_per_s"] = f.tokens_per_s;
    j["loom_peak_mem_bytes"] = f.peak_mem_bytes;
    j["loom_first_loss"] = f.first_loss;
    j["loom_last_loss"] = f.last_loss;
    j["mfu"] = f.tokens_per_s * fpt / (peak.tflops * 1e12);
    j["mfu_vs_matmul"] = f.tokens_per_s * fpt / (matmul * 1e12);
  } else {
    j["loom_error"] = f.error;
  }
  if (e.error.empty()) {
    j["eager_step_s"] = e.step_s;
    j["eager_tokens_per_s"] = e.tokens_per_s;
    j["eager_peak_mem_bytes"] = e.peak_mem_bytes;
    j["eager_params"] = e.params;
    if (f.error.empty()) j["loom_over_eager"] = f.tokens_per_s / e.tokens_per_s;
  } else {
    j["eager_error"] = e.error;
  }
  return j;
}

int config_error(const loom::Error& e) {
  std::fprintf(stderr, "bench_gpu_step: %s\n", e.message.c_str());
  return 2;
}

// ---- 6. the peers under torch.compile, loom's variants, the Llama stack -----------------------

// The baseline under each torch.compile mode: printed and added to `j`.
void run_compiled_peers(const Shape& sh, const Options& o, const LoomFigures& f, Json& j) {
  for (const std::string& mode : o.compile_modes) {
    const EagerFigures c = run_eager(sh.spec, o, mode);
    const std::string key = "compile_" + mode;
    if (!c.error.empty()) {
      std::printf("torch.compile %s: not measured: %s\n", mode.c_str(), c.error.c_str());
      j[key + "_error"] = c.error;
      continue;
    }
    std::printf("torch.compile %s: median step %.4f s, %.0f tokens/s, peak memory %.2f GiB\n",
                mode.c_str(), c.step_s, c.tokens_per_s, gib(c.peak_mem_bytes));
    j[key + "_tokens_per_s"] = c.tokens_per_s;
    j[key + "_step_s"] = c.step_s;
    if (!f.error.empty()) continue;
    const double ratio = f.tokens_per_s / c.tokens_per_s;
    std::printf("loom / torch.compile %s tokens/s ratio: %.3f   target >= %.2f: %s\n", mode.c_str(),
                ratio, kRatioTarget, verdict(ratio, kRatioTarget));
    j["loom_over_" + key] = ratio;
  }
}

// loom on `config` with `overrides`, against `base` (tokens/s ratio), printed as `label` and
// added to `j` under `key`.
void run_variant(const loom::Config& config, const std::vector<std::string>& overrides,
                 const std::string& label, const std::string& key, const LoomFigures& base,
                 const Options& o, Json& j, bool profiled = false) {
  auto changed = loom::parse_config(loom::to_yaml(config), "bench_gpu_step", overrides);
  if (!changed.ok()) {
    std::printf("%s: not measured: %s\n", label.c_str(), changed.error().message.c_str());
    return;
  }
  Options plain = o;
  if (!profiled) plain.profile.clear();
  const LoomFigures v = run_loom(*changed, plain);
  release_cached_device_memory();
  if (!v.error.empty()) {
    std::printf("%s: FAILED: %s\n", label.c_str(), v.error.c_str());
    j[key + "_error"] = v.error;
    return;
  }
  std::printf("%s: median step %.4f s, %.0f tokens/s, peak memory %.2f GiB, loss %.4f -> %.4f",
              label.c_str(), v.step_s, v.tokens_per_s, gib(v.peak_mem_bytes), v.first_loss,
              v.last_loss);
  j[key + "_tokens_per_s"] = v.tokens_per_s;
  j[key + "_last_loss"] = v.last_loss;
  if (base.error.empty()) {
    std::printf("; %.3f x the bf16 run's tokens/s", v.tokens_per_s / base.tokens_per_s);
    j[key + "_over_bf16"] = v.tokens_per_s / base.tokens_per_s;
  }
  std::printf("\n");
  std::fflush(stdout);
}

// The Llama-3-8B-shaped stack in bf16, then fp8 tensorwise and rowwise.
void run_llama_stack(const Options& o, Json& j) {
  const std::string yaml =
      "run: {seed: 1, steps: 1000000, device: cuda, precision: bf16}\n"
      "model: {type: llama, preset: llama3-8b, args: {layers: " +
      std::to_string(o.llama_layers) +
      ", vocab: 32000}}\n"
      "batch: {global: 1, micro: 1}\n"
      "optimizer: {type: adamw, lr: 0.0003, betas: [0.9, 0.95], weight_decay: 0.1}\n"
      "data: {type: synthetic}\n";
  auto config = loom::parse_config(yaml, "bench_gpu_step llama", {});
  if (!config.ok()) {
    std::printf("llama stack: not measured: %s\n", config.error().message.c_str());
    return;
  }
  Options plain = o;
  plain.profile.clear();
  plain.steps = std::min<int64_t>(o.steps, 5);
  plain.warmup = std::min<int64_t>(o.warmup, 2);
  std::printf(
      "llama stack: llama3-8b shape, %lld layers, vocabulary 32000, seq 8192, one "
      "sequence per step, %lld warm-up + %lld timed steps\n",
      static_cast<long long>(o.llama_layers), static_cast<long long>(plain.warmup),
      static_cast<long long>(plain.steps));
  std::fflush(stdout);
  const LoomFigures bf16 = run_loom(*config, plain);
  release_cached_device_memory();
  if (!bf16.error.empty()) {
    std::printf("llama stack bf16: FAILED: %s\n", bf16.error.c_str());
    j["llama_bf16_error"] = bf16.error;
    return;
  }
  std::printf("llama stack bf16: median step %.4f s, %.0f tokens/s, peak memory %.2f GiB\n",
              bf16.step_s, bf16.tokens_per_s, gib(bf16.peak_mem_bytes));
  j["llama_layers"] = o.llama_layers;
  j["llama_bf16_tokens_per_s"] = bf16.tokens_per_s;
  for (const char* scaling : {"tensorwise", "rowwise"}) {
    const std::string key = std::string("llama_fp8_") + scaling;
    // --only-llama --profile: the fp8 tensorwise step is profiled (where its time goes).
    Options variant = plain;
    variant.profile = o.only_llama ? o.profile : std::string();
    run_variant(*config, {"run.precision=fp8", std::string("fp8.scaling=") + scaling},
                std::string("llama stack fp8 ") + scaling, key, bf16, variant, j,
                std::string(scaling) == "tensorwise");
    if (j.contains(key + "_over_bf16"))
      std::printf("llama stack fp8 %s / bf16: %.3f   target >= %.2f: %s\n", scaling,
                  j[key + "_over_bf16"].get<double>(), kFp8Target,
                  verdict(j[key + "_over_bf16"].get<double>(), kFp8Target));
  }
}

int run(const Options& o) {
  const std::string preset = o.quick ? "gpt2-124m" : "gpt3-1.3b";
  auto config = bench_config(preset, o);
  if (!config.ok()) return config_error(config.error());
  auto spec = loom::models::gpt_spec(*config);
  if (!spec.ok()) return config_error(spec.error());
  const Shape shape{preset, *spec};
  auto device = loom::launch::select_device(*config, 0);
  if (!device.ok()) return config_error(device.error());

  const std::string gpu = gpu_name();
  std::printf("bench/gpu_step%s: %s (%s), LibTorch %s\n", o.quick ? " --quick" : "",
              gpu.empty() ? "(nvidia-smi gave no name)" : gpu.c_str(), device->to_string().c_str(),
              TORCH_VERSION);
  if (o.only_llama) {
    Json j = {{"gpu", gpu}, {"torch", TORCH_VERSION}};
    run_llama_stack(o, j);
    std::printf("bench_gpu_step_json %s\n", j.dump().c_str());
    return j.contains("llama_bf16_error") ? 1 : 0;
  }
  print_model(shape, o);
  std::fflush(stdout);

  const int64_t n = 8192;
  const double matmul = matmul_tflops(device->device, n, o.quick ? 2 : 3, o.quick ? 5 : 20);
  std::printf("matmul: bf16 %lld x %lld x %lld: %.1f TFLOP/s\n", static_cast<long long>(n),
              static_cast<long long>(n), static_cast<long long>(n), matmul);
  const Peak peak = peak_of(gpu, matmul);
  std::printf("peak: dense bf16 %.1f TFLOP/s (%s)\n", peak.tflops, peak.source.c_str());
  std::fflush(stdout);
  release_cached_device_memory();

  const LoomFigures f = run_loom(*config, o);  // the trainer is gone when it returns
  release_cached_device_memory();
  print_loom(f, flops_per_token(shape.spec), peak, matmul);
  std::fflush(stdout);

  const EagerFigures e = run_eager(shape.spec, o);
  print_eager(e, f, shape.spec.parameter_count());
  Json j = figures_json(gpu, matmul, peak, shape, o, f, e);
  // Every figure so far after each section: a run cut off by its time limit keeps what it has.
  auto figures = [&] {
    std::printf("bench_gpu_step_json %s\n", j.dump().c_str());
    std::fflush(stdout);
  };
  figures();
  // The figures first (fp8 on the Llama stack, torch.compile's default mode), then the
  // rest; max-autotune's compilation, the longest, last.
  Options first = o, later = o;
  first.compile_modes.resize(std::min<size_t>(1, o.compile_modes.size()));
  later.compile_modes.erase(
      later.compile_modes.begin(),
      later.compile_modes.begin() + static_cast<std::ptrdiff_t>(first.compile_modes.size()));
  if (o.llama_layers > 0) {
    run_llama_stack(o, j);
    figures();
  }
  run_compiled_peers(shape, first, f, j);
  figures();
  if (o.variants) {
    run_variant(*config, {"run.precision=fp8"}, "loom fp8 tensorwise", "loom_fp8_tensorwise", f, o,
                j);
    run_variant(*config, {"run.precision=fp8", "fp8.scaling=rowwise"}, "loom fp8 rowwise",
                "loom_fp8_rowwise", f, o, j);
    // Last of loom's runs: it turns LibTorch's deterministic algorithms on for the process.
    run_variant(*config, {"run.deterministic=true"}, "loom deterministic", "loom_deterministic", f,
                o, j);
    figures();
  }
  run_compiled_peers(shape, later, f, j);
  figures();
  return f.error.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  if (loom::runtime::cuda_device_count() < 1) {
    std::printf("bench_gpu_step: skipped: %s\n",
                at::hasCUDA() ? "CUDA sees no usable GPU (check the driver and "
                                "CUDA_VISIBLE_DEVICES)"
                              : "this LibTorch has no CUDA (a CPU-only build); "
                                "scripts/gpu-check runs it on a GPU machine");
    return 0;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {  // LibTorch's errors (an out-of-memory among them)
    std::printf("bench_gpu_step: FAILED: %s\n", e.what());
    return 1;
  }
}
