#include "comm/store.h"

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/backend.h"

namespace loom::comm {
namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// Marks waiting for the background thread of StoreArrivals.
class MarkQueue {
 public:
  // The first store failure seen so far, or empty.
  std::string push(const std::string& key, uint64_t count) {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t& slot = pending_[key];
    if (count > slot) slot = count;
    cv_.notify_one();
    return failure_;
  }

  void stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    cv_.notify_one();
  }

  void drain(c10d::Store& store) {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopped_ || !pending_.empty(); });
      if (stopped_) return;
      std::map<std::string, uint64_t> batch;
      batch.swap(pending_);
      lock.unlock();
      std::string failure;
      for (const auto& [key, count] : batch) {
        try {
          store.set(key, bytes(std::to_string(count)));
        } catch (const std::exception& e) {
          failure = exception_message(e);
        }
      }
      lock.lock();
      if (!failure.empty() && failure_.empty()) failure_ = failure;
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, uint64_t> pending_;
  std::string failure_;
  bool stopped_ = false;
};

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// Arrival counts as decimal strings under "loom/arrive/<key>". A store round trip per call would
// sit on every call's critical path, so marks go to the store from a background thread, newest
// count per key; they are read only seconds later, when a call failed or timed out.
class StoreArrivals : public Arrivals {
 public:
  StoreArrivals(c10::intrusive_ptr<c10d::Store> store, std::string where)
      : store_(std::move(store)), where_(std::move(where)), q_(std::make_shared<MarkQueue>()) {
    // The thread owns what it touches, so it can be left behind if the store hangs.
    std::thread([q = q_, store = store_] { q->drain(*store); }).detach();
  }

  ~StoreArrivals() override { q_->stop(); }

  Status mark(const std::string& key, uint64_t count) override {
    std::string failure = q_->push("loom/arrive/" + key, count);
    if (!failure.empty()) return Error{where_ + " is unreachable (" + failure + ")", {}};
    return Status::success();
  }

  Result<std::vector<uint64_t>> read(const std::vector<std::string>& keys) override {
    std::vector<uint64_t> out;
    try {
      for (const std::string& key : keys) {
        const std::string full = "loom/arrive/" + key;
        if (!store_->check({full})) {
          out.push_back(0);
          continue;
        }
        std::vector<uint8_t> v = store_->get(full);
        out.push_back(std::stoull(std::string(v.begin(), v.end())));
      }
    } catch (const std::exception& e) {
      return Error{"arrivals unknown: " + where_ + " is unreachable, so rank 0 probably died (" +
                       exception_message(e) + ")",
                   {}};
    }
    return out;
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::string where_;
  std::shared_ptr<MarkQueue> q_;
};

}  // namespace

Result<std::shared_ptr<RendezvousStore>> RendezvousStore::connect(const std::string& host, int port,
                                                                  int rank, int world_size,
                                                                  double timeout_s) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = rank == 0;
  opts.numWorkers = static_cast<size_t>(world_size);
  opts.waitWorkers = false;  // joining is checked below, with names
  opts.timeout = millis(timeout_s);
  const std::string at = host + ":" + std::to_string(port);
  const auto start = std::chrono::steady_clock::now();
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(host, opts);
  } catch (const std::exception& e) {
    const std::string why = exception_message(e);
    if (rank == 0) {
      return Error{"rank 0 could not host the rendezvous store at " + at + ": " + why, {}};
    }
    return Error{"rank " + std::to_string(rank) + " could not reach the rendezvous store at " + at +
                     " within " + format_seconds(timeout_s) +
                     " s (is rank 0 running? check MASTER_ADDR and MASTER_PORT): " + why,
                 {}};
  }
  const int actual = store->getPort();
  std::string where =
      "the rendezvous store at " + host + ":" + std::to_string(actual) + " (hosted by rank 0)";
  // Everyone announces itself, then waits for the others, so that a rank that never comes is
  // named instead of surfacing later as a backend's socket timeout.
  std::vector<std::string> joined;
  for (int r = 0; r < world_size; ++r) joined.push_back("loom/joined/" + std::to_string(r));
  try {
    store->set(joined[rank], bytes("1"));
    const auto deadline = start + millis(timeout_s);
    while (!store->check(joined)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        std::string missing;
        int count = 0;
        for (int r = 0; r < world_size; ++r) {
          if (store->check({joined[r]})) continue;
          missing += (count++ ? ", " : "") + std::to_string(r);
        }
        return Error{std::string(count == 1 ? "rank " : "ranks ") + missing + " of " +
                         std::to_string(world_size) + " did not join " + where + " within " +
                         format_seconds(timeout_s) + " s",
                     {}};
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception& e) {
    return Error{where + " failed during the rendezvous: " + exception_message(e), {}};
  }
  return std::shared_ptr<RendezvousStore>(new RendezvousStore(
      c10::intrusive_ptr<c10d::Store>(std::move(store)), actual, std::move(where)));
}

std::shared_ptr<Arrivals> RendezvousStore::arrivals() {
  return std::make_shared<StoreArrivals>(store_, where_);
}

Status RendezvousStore::set(const std::string& key, const std::string& value) {
  try {
    store_->set(key, bytes(value));
  } catch (const std::exception& e) {
    return Error{where_ + ": setting " + key + " failed: " + exception_message(e), {}};
  }
  return Status::success();
}

Result<std::string> RendezvousStore::get(const std::string& key) {
  try {
    std::vector<uint8_t> v = store_->get(key);
    return std::string(v.begin(), v.end());
  } catch (const std::exception& e) {
    return Error{where_ + ": waiting for " + key + " failed: " + exception_message(e), {}};
  }
}

Result<bool> RendezvousStore::has(const std::string& key) {
  try {
    return store_->check({key});
  } catch (const std::exception& e) {
    return Error{where_ + ": checking " + key + " failed: " + exception_message(e), {}};
  }
}

}  // namespace loom::comm
