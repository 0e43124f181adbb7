// A member's connection to the rendezvous store (store_server.h) as a c10d::Store, so that
// gloo's and nccl's rendezvous run through it. It presents the job's secret on connecting;
// a refusal is an error that says why, never retried.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace loom::comm {

class StoreServer;

class StoreClient : public c10d::Store {
 public:
  // Connects to host:port and presents `secret`; a refused connection (the server not yet
  // up) is retried until `timeout`, which also bounds every call. `server`: the server this
  // process hosts (rank 0), kept alive by this client and its clones. Throws std::runtime_error.
  static c10::intrusive_ptr<StoreClient> connect(const std::string& host, int port,
                                                 const std::string& secret,
                                                 std::chrono::milliseconds timeout,
                                                 std::shared_ptr<StoreServer> server = nullptr);
  // Takes the connected socket `fd`; connect() makes one.
  StoreClient(int fd, std::string host, int port, std::string secret,
              std::chrono::milliseconds timeout, std::shared_ptr<StoreServer> server);
  ~StoreClient() override;
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;
  // The port it is connected to (rank 0: the port its server took).
  int port() const { return port_; }

  c10::intrusive_ptr<c10d::Store> clone() override;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  // Sends a request and returns the reply's fields; throws on a failure or a timeout (`waits`:
  // how long the server may hold the request before answering).
  std::vector<std::string> call(uint8_t op, const std::vector<std::string>& fields,
                                std::chrono::milliseconds waits, const std::string& what);

  std::mutex mu_;  // one request at a time on the connection
  int fd_;
  std::string host_;
  int port_;
  std::string secret_;
  std::shared_ptr<StoreServer> server_;
};

}  // namespace loom::comm
