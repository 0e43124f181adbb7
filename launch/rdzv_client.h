// An agent's connection to loom's rendezvous store (comm/store_server.h) for loomrun, which
// links no LibTorch: the same wire and handshake as the workers' client (comm/store_client.h),
// with failures as values, since a lost store is something loomrun reports, not a crash.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"

namespace loom::launch {

class RdzvClient {
 public:
  // Connects to host:port presenting `secret`; a refused connection (the store not up yet) is
  // retried until `timeout`. A wrong secret is an error at once.
  static Result<std::unique_ptr<RdzvClient>> connect(const std::string& host, int port,
                                                     const std::string& secret,
                                                     std::chrono::milliseconds timeout);
  ~RdzvClient();
  RdzvClient(const RdzvClient&) = delete;
  RdzvClient& operator=(const RdzvClient&) = delete;

  Status set(const std::string& key, const std::string& value);
  // The value of `key`, waiting up to `wait` for it to be set; nullopt when it was not.
  Result<std::optional<std::string>> get(const std::string& key, std::chrono::milliseconds wait);
  // Adds `delta` to the integer at `key` (absent: 0) and returns the new value.
  Result<int64_t> add(const std::string& key, int64_t delta);
  // Sets `desired` when `key` holds `expected` (absent and `expected` empty counts); returns the
  // value afterwards, so the first of several racing agents wins and all learn which.
  Result<std::string> compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired);
  // "127.0.0.1:29400", the store's address.
  const std::string& address() const { return address_; }
  // This end's IPv4 address: the interface through which the store (and so the other agents)
  // reach this node.
  std::string local_host() const;

 private:
  RdzvClient(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  Result<std::vector<std::string>> call(uint8_t op, const std::vector<std::string>& fields,
                                        std::chrono::milliseconds wait);
  int fd_;
  std::string address_;
};

}  // namespace loom::launch
