#include "runtime/machine.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/version.h>

#include <cstdlib>
#include <sstream>

namespace loom::runtime {
namespace {

// The value after "CPU capability usage:" in ATen's build description: what its dispatch picked
// for this CPU, after ATEN_CPU_CAPABILITY.
std::string aten_cpu_capability() {
  std::istringstream in(at::show_config());
  const std::string key = "CPU capability usage:";
  for (std::string line; std::getline(in, line);)
    if (auto at = line.find(key); at != std::string::npos) {
      std::string v = line.substr(at + key.size());
      v.erase(0, v.find_first_not_of(' '));
      return v;
    }
  return "unknown";
}

// The line of ATen's build description that holds `key`, after it (trimmed), or "unknown".
std::string config_line(const std::string& key) {
  std::istringstream in(at::show_config());
  for (std::string line; std::getline(in, line);)
    if (auto at = line.find(key); at != std::string::npos) {
      std::string v = line.substr(at);
      v.erase(0, v.find_first_not_of(' '));
      while (!v.empty() && (v.back() == ' ' || v.back() == ',')) v.pop_back();
      return v;
    }
  return "unknown";
}

std::string env_or_unset(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "(unset)";
}

}  // namespace

std::vector<std::pair<std::string, std::string>> describe_machine() {
  std::vector<std::pair<std::string, std::string>> out = {
      {"libtorch", TORCH_VERSION},
      {"aten_cpu_capability", aten_cpu_capability()},
      {"blas", config_line("Math Kernel Library")},
      {"onednn", config_line("MKL-DNN")},
      {"intra_op_threads", std::to_string(at::get_num_threads())},
  };
  // What moves float results besides loom's code: ATen's and MKL's and oneDNN's instruction
  // sets, and the thread counts.
  for (const char* name : {"ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
                           "OMP_NUM_THREADS", "MKL_NUM_THREADS"})
    out.emplace_back(name, env_or_unset(name));
  return out;
}

}  // namespace loom::runtime
