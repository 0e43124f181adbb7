#include "comm/store_client.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "comm/store_server.h"
#include "comm/store_wire.h"

namespace loom::comm {
namespace {

using wire::Clock;

// Longer than any wait a request asks for: a server that lets it pass has stopped answering.
constexpr auto kAnswerMargin = std::chrono::seconds(5);

std::chrono::milliseconds bounded(std::chrono::milliseconds t) {
  // c10d's kNoTimeout (zero) waits for ever; a year is for ever here.
  return t.count() <= 0 ? std::chrono::milliseconds(365LL * 24 * 3600 * 1000) : t;
}

std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }
std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

c10::intrusive_ptr<StoreClient> StoreClient::connect(const std::string& host, int port,
                                                     const std::string& secret,
                                                     std::chrono::milliseconds timeout,
                                                     std::shared_ptr<StoreServer> server) {
  Result<sockaddr_in> address = wire::resolve(host, port);
  if (!address.ok()) throw std::runtime_error(address.error().message);
  const auto deadline = Clock::now() + bounded(timeout);
  auto pause = std::chrono::milliseconds(10);
  while (true) {
    std::string why;
    bool refused = false;
    const int fd = wire::connect_admitted(*address, secret, deadline, &why, &refused);
    if (fd >= 0) {
      return c10::make_intrusive<StoreClient>(fd, host, port, secret, timeout, std::move(server));
    }
    if (refused || Clock::now() + pause >= deadline) throw std::runtime_error(why);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

StoreClient::StoreClient(int fd, std::string host, int port, std::string secret,
                         std::chrono::milliseconds timeout, std::shared_ptr<StoreServer> server)
    : c10d::Store(timeout),
      fd_(fd),
      host_(std::move(host)),
      port_(port),
      secret_(std::move(secret)),
      server_(std::move(server)) {}

StoreClient::~StoreClient() {
  if (fd_ >= 0) close(fd_);
}

c10::intrusive_ptr<c10d::Store> StoreClient::clone() {
  return connect(host_, port_, secret_, timeout_, server_);
}

std::vector<std::string> StoreClient::call(uint8_t op, const std::vector<std::string>& fields,
                                           std::chrono::milliseconds waits,
                                           const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) throw std::runtime_error(what + ": the connection to the store was lost earlier");
  std::string why = "the store closed the connection";
  uint8_t status = 0;
  std::vector<std::string> reply;
  const auto deadline =
      Clock::now() + (waits.count() > 0 ? waits + kAnswerMargin : bounded(timeout_));
  if (!wire::send_message(fd_, op, fields) ||
      !wire::recv_message(fd_, deadline, &status, &reply, &why)) {
    close(fd_);  // a reply may still come; the connection cannot be trusted to be in step
    fd_ = -1;
    throw std::runtime_error(what + ": " + why);
  }
  if (status == wire::kTimedOut) {
    throw std::runtime_error(what + ": timed out after " + std::to_string(waits.count()) + " ms");
  }
  if (status != wire::kOk) {
    throw std::runtime_error(what + ": " + (reply.empty() ? "failed" : reply[0]));
  }
  return reply;
}

void StoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  call(wire::kSet, {key, text(value)}, {}, "setting " + key);
}

std::vector<uint8_t> StoreClient::compareSet(const std::string& key,
                                             const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  return bytes(
      call(wire::kCompareSet, {key, text(expected), text(desired)}, {}, "compareSet of " + key)
          .at(0));
}

std::vector<uint8_t> StoreClient::get(const std::string& key) {
  const auto t = bounded(timeout_);
  return bytes(call(wire::kGet, {key, std::to_string(t.count())}, t, "waiting for " + key).at(0));
}

int64_t StoreClient::add(const std::string& key, int64_t value) {
  return std::stoll(call(wire::kAdd, {key, std::to_string(value)}, {}, "adding to " + key).at(0));
}

bool StoreClient::deleteKey(const std::string& key) {
  return call(wire::kDelete, {key}, {}, "deleting " + key).at(0) == "1";
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  return call(wire::kCheck, keys, {}, "checking keys").at(0) == "1";
}

int64_t StoreClient::getNumKeys() {
  return std::stoll(call(wire::kNumKeys, {}, {}, "counting keys").at(0));
}

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void StoreClient::wait(const std::vector<std::string>& keys,
                       const std::chrono::milliseconds& timeout) {
  const auto t = bounded(timeout);
  std::vector<std::string> fields{std::to_string(t.count())};
  fields.insert(fields.end(), keys.begin(), keys.end());
  call(wire::kWait, fields, t, "waiting for " + std::to_string(keys.size()) + " keys");
}

}  // namespace loom::comm
