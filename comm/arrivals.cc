#include "comm/arrivals.h"

namespace loom::comm {

Status LocalArrivals::mark(const std::string& key, uint64_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t& slot = counts_[key];
  if (count > slot) slot = count;
  return Status::success();
}

Result<std::vector<uint64_t>> LocalArrivals::read(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) {
    auto it = counts_.find(key);
    out.push_back(it == counts_.end() ? 0 : it->second);
  }
  return out;
}

}  // namespace loom::comm
