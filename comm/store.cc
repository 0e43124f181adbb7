#include "comm/store.h"

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "comm/backend.h"
#include "comm/store_client.h"
#include "comm/store_server.h"
#include "core/log.h"
#include "core/secret.h"

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

// Rank 0: the server on at.listen (or at.host) and a client of it; the others: a client of
// at.host:at.port. Throws std::runtime_error.
c10::intrusive_ptr<StoreClient> open_store(const StoreAddress& at, int rank, double timeout_s) {
  const auto timeout = millis(timeout_s);
  if (rank != 0) return StoreClient::connect(at.host, at.port, at.secret, timeout);
  const std::string listen = at.listen.empty() ? at.host : at.listen;
  Result<std::shared_ptr<StoreServer>> server = StoreServer::start(
      listen, at.port, at.secret, [](const std::string& line) { log_warning(line); });
  if (!server.ok()) throw std::runtime_error(server.error().message);
  // Listening on every interface, rank 0 reaches itself on loopback.
  const std::string self = listen == "0.0.0.0" ? "127.0.0.1" : listen;
  return StoreClient::connect(self, (*server)->port(), at.secret, timeout, *server);
}

}  // namespace

Result<std::shared_ptr<RendezvousStore>> RendezvousStore::connect(const StoreAddress& at, int rank,
                                                                  int world_size,
                                                                  double timeout_s) {
  const std::string where_to = at.host + ":" + std::to_string(at.port);
  if (at.secret.empty()) {
    return Error{"no secret for the rendezvous store at " + where_to + ": set " +
                     std::string(kRdzvTokenEnv) +
                     " to the same value for every rank (loomrun does this)",
                 {}};
  }
  const auto start = std::chrono::steady_clock::now();
  c10::intrusive_ptr<StoreClient> store;
  try {
    store = open_store(at, rank, timeout_s);
  } catch (const std::exception& e) {
    const std::string why = exception_message(e);
    if (rank == 0) {
      return Error{"rank 0 could not host the rendezvous store at " + where_to + ": " + why, {}};
    }
    if (why.find("refused by the store") != std::string::npos) {
      return Error{"rank " + std::to_string(rank) + " was turned away by the rendezvous store at " +
                       where_to + " (" + why + "): give every rank the same " +
                       std::string(kRdzvTokenEnv),
                   {}};
    }
    return Error{"rank " + std::to_string(rank) + " could not reach the rendezvous store at " +
                     where_to + " within " + format_seconds(timeout_s) +
                     " s (is rank 0 running? check MASTER_ADDR and MASTER_PORT): " + why,
                 {}};
  }
  const int actual = store->port();
  std::string where =
      "the rendezvous store at " + at.host + ":" + std::to_string(actual) + " (hosted by rank 0)";
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
