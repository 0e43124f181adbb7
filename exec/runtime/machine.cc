#include "exec/runtime/machine.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <dlfcn.h>
#include <torch/version.h>

#include <climits>
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

// The shared object that provides sgemm_ to this process (Debian's libblas.so.3 alternative),
// resolved through its links.
std::string blas_library() {
  void* sym = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info info;
  if (sym == nullptr || dladdr(sym, &info) == 0 || info.dli_fname == nullptr) return "not loaded";
  char real[PATH_MAX];
  return realpath(info.dli_fname, real) != nullptr ? real : info.dli_fname;
}

// OpenBLAS's own description and the kernel family it chose for this CPU (OPENBLAS_CORETYPE
// overrides it); "n/a" for another BLAS.
std::string openblas_string(const char* fn) {
  using Get = char* (*)();
  auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, fn));
  if (get == nullptr) return "n/a";
  std::string s = get();
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string openblas_threads() {
  using Get = int (*)();
  auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get != nullptr ? std::to_string(get()) : "n/a";
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
      {"blas_library", blas_library()},
      {"blas_config", openblas_string("openblas_get_config")},
      {"blas_core", openblas_string("openblas_get_corename")},
      {"intra_op_threads", std::to_string(at::get_num_threads())},
      {"blas_threads", openblas_threads()},
  };
  for (const char* name :
       {"ATEN_CPU_CAPABILITY", "OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"})
    out.emplace_back(name, env_or_unset(name));
  return out;
}

}  // namespace loom::runtime
