// The rendezvous store of a process world, hosted by rank 0 (store_server.h): it listens on the
// master address only and admits only the ranks that present the job's secret. The gloo and nccl
// backends rendezvous through it, and every process backend keeps its arrival board in it.
#pragma once

#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/arrivals.h"
#include "core/result.h"

namespace loom::comm {

// Where a world's store is and what admits a rank to it.
struct StoreAddress {
  std::string host = "127.0.0.1";  // rank 0's address; the other ranks connect there
  int port = 0;                    // 0: a free port (rank 0 alone, or a test in one process)
  std::string secret;              // the job's secret (LOOM_RDZV_TOKEN); never empty
  std::string listen;              // the address rank 0 listens on; empty: host
};

class RendezvousStore {
 public:
  // Rank 0 hosts the store on at.listen (port 0: a free port, see port()), the others connect
  // to at.host; then every rank waits until all world_size ranks joined. Bounded by timeout_s;
  // the error names the ranks that did not join, or why the store refused this rank.
  static Result<std::shared_ptr<RendezvousStore>> connect(const StoreAddress& at, int rank,
                                                          int world_size, double timeout_s);

  const c10::intrusive_ptr<c10d::Store>& c10d_store() const { return store_; }
  int port() const { return port_; }
  // An arrival board kept in this store.
  std::shared_ptr<Arrivals> arrivals();

  Status set(const std::string& key, const std::string& value);
  // Waits for `key` up to the store's timeout.
  Result<std::string> get(const std::string& key);
  // Whether `key` is set; never waits.
  Result<bool> has(const std::string& key);

 private:
  RendezvousStore(c10::intrusive_ptr<c10d::Store> store, int port, std::string where)
      : store_(std::move(store)), port_(port), where_(std::move(where)) {}
  c10::intrusive_ptr<c10d::Store> store_;
  int port_;
  std::string where_;  // "the rendezvous store at host:port (hosted by rank 0)"
};

}  // namespace loom::comm
