#include "tests/comm/stranger.h"

#include <algorithm>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/store_client.h"

namespace loom::comm::testing {
namespace {

std::string loom_client(const std::string& host, int port, const std::string& secret,
                        double timeout_s) {
  try {
    auto store = StoreClient::connect(
        host, port, secret, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    store->set("loom/joined/1", std::vector<uint8_t>{'1'});
    return "ADMITTED: a loom client with secret '" + secret + "' set loom/joined/1";
  } catch (const std::exception& e) {
    return std::string("refused: ") + e.what();
  }
}

std::string c10d_client(const std::string& host, int port, double timeout_s) {
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(port);
    opts.isServer = false;
    opts.waitWorkers = false;
    opts.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    c10d::TCPStore store(host, opts);
    store.set("loom/joined/1", std::vector<uint8_t>{'1'});
    return "ADMITTED: a c10d TCPStore client set loom/joined/1";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return "refused: c10d TCPStore client: " + what.substr(0, what.find('\n'));
  }
}

}  // namespace

std::vector<std::string> try_as_stranger(const std::string& host, int port, double timeout_s) {
  // The wrong secret first: it waits for the store to listen, so the others find it up.
  std::vector<std::string> out;
  out.push_back(loom_client(host, port, "not-this-jobs-secret", timeout_s));
  out.push_back(loom_client(host, port, "", timeout_s));
  // c10d's client retries a failed handshake until its timeout: a short one will do.
  out.push_back(c10d_client(host, port, std::min(timeout_s, 1.0)));
  return out;
}

}  // namespace loom::comm::testing
