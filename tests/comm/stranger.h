// What a stranger to a job gets from its rendezvous store: a loom client with a wrong secret,
// one with none, and a plain c10d TCPStore client (what torch.distributed would use) that tries
// to pass for rank 1. Shared by the in-process tests and comm_worker's `stranger` scenario.
#pragma once

#include <string>
#include <vector>

namespace loom::comm::testing {

// One line per attempt, "refused: <why>" when the store turned it away, else "ADMITTED: ...".
std::vector<std::string> try_as_stranger(const std::string& host, int port, double timeout_s);

}  // namespace loom::comm::testing
