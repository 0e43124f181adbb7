// What the per-op oracle (oracle.h) found; LibTorch-free so command-line code reads it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::runtime {

struct OracleReport {
  int64_t ops_checked = 0;
  int64_t pieces_checked = 0;
  // Each names the sub-op and the tensor piece, in program order (a piece of value chunks under
  // the first sub-op that made one of them).
  std::vector<std::string> mismatches;
  std::string first_op;     // the sub-op of mismatches[0]; empty when there is none
  std::string first_piece;  // its output: "name[ranges]"
  bool ok() const { return mismatches.empty() && ops_checked > 0; }
};

}  // namespace loom::runtime
