// The rendezvous store's server, hosted by rank 0: keys and values in memory, served to the
// members of one job. It listens on one address (the master address; loopback for a job on one
// node), never on every interface unless told "0.0.0.0", and admits a connection only when it
// presents the job's secret: a stranger is refused and logged, so it can never be taken for a
// rank. Plain sockets, no LibTorch; store_client.h is its client.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "core/result.h"

namespace loom::comm {

class StoreServer {
 public:
  // Called with one line per refused connection.
  using Log = std::function<void(const std::string& line)>;

  // Listens on host:port (port 0: a free one) for connections that present `secret` (not
  // empty). The error names the address.
  static Result<std::shared_ptr<StoreServer>> start(const std::string& host, int port,
                                                    std::string secret, Log log);
  // Stops listening, ends every connection (their blocked waits too) and frees the port.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // The address it listens on, "127.0.0.1:29500".
  const std::string& address() const { return address_; }
  // Connections refused so far.
  int refused() const;

  struct State;

 private:
  StoreServer(std::shared_ptr<State> state, int listen_fd, int port, std::string address);
  std::shared_ptr<State> state_;
  int listen_fd_;
  int port_;
  std::string address_;
  std::thread acceptor_;
};

}  // namespace loom::comm
