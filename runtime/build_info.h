// What this build of loom is: its version, the build id of the binary that holds it, and the
// LibTorch, CUDA and NCCL it was built with. `loom --version` prints it; at start every rank
// checks that it runs the build rank 0 runs (rank_agreement.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace loom::runtime {

struct BuildInfo {
  std::string loom;      // loom's version, "0.1.0"
  std::string build_id;  // the GNU build id of the binary holding loom's code (hex), or "unknown"
  std::string libtorch;  // LibTorch's version
  std::string cuda;      // the CUDA LibTorch was built with, or "none (a CPU build)"
  std::string nccl;      // the nccl backend's NCCL, or "none (no nccl backend in this build)"

  // (name, value) lines in this order.
  std::vector<std::pair<std::string, std::string>> lines() const;
};

BuildInfo build_info();

}  // namespace loom::runtime
