// Arrivals: where each rank announces how far it got (collective #k of a group, the k-th send
// to a peer), so that a timed-out or failed call can name the ranks that never arrived.
// Process backends keep the board in the rendezvous store; the local backend in memory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/result.h"

namespace loom::comm {

class Arrivals {
 public:
  virtual ~Arrivals() = default;
  // Records that the caller reached `count` at `key` (counts only grow).
  virtual Status mark(const std::string& key, uint64_t count) = 0;
  // The counts recorded at `keys`, 0 where nothing was recorded.
  virtual Result<std::vector<uint64_t>> read(const std::vector<std::string>& keys) = 0;
};

// In memory, shared by the threads of one process.
class LocalArrivals : public Arrivals {
 public:
  Status mark(const std::string& key, uint64_t count) override;
  Result<std::vector<uint64_t>> read(const std::vector<std::string>& keys) override;

 private:
  std::mutex mu_;
  std::map<std::string, uint64_t> counts_;
};

// For a world without a store: reads say why nothing is known.
class NoArrivals : public Arrivals {
 public:
  explicit NoArrivals(std::string why) : why_(std::move(why)) {}
  Status mark(const std::string&, uint64_t) override { return Status::success(); }
  Result<std::vector<uint64_t>> read(const std::vector<std::string>&) override {
    return Error{"arrivals unknown: " + why_, {}};
  }

 private:
  std::string why_;
};

}  // namespace loom::comm
