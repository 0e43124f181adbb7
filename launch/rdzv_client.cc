#include "launch/rdzv_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "comm/store_wire.h"

namespace loom::launch {

namespace wire = comm::wire;
using wire::Clock;

// Longer than any wait a request asks for: a store that lets it pass has stopped answering.
constexpr auto kAnswerMargin = std::chrono::seconds(5);

Result<std::unique_ptr<RdzvClient>> RdzvClient::connect(const std::string& host, int port,
                                                        const std::string& secret,
                                                        std::chrono::milliseconds timeout) {
  LOOM_ASSIGN_OR_RETURN(sockaddr_in address, wire::resolve(host, port));
  const std::string at = wire::to_string(address);
  const auto deadline = Clock::now() + timeout;
  auto pause = std::chrono::milliseconds(10);
  while (true) {
    std::string why;
    bool refused = false;
    const int fd = wire::connect_admitted(address, secret, deadline, &why, &refused);
    if (fd >= 0) return std::unique_ptr<RdzvClient>(new RdzvClient(fd, at));
    if (refused || Clock::now() + pause >= deadline)
      return Error{"cannot join the rendezvous store at " + at + ": " + why, {}};
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

RdzvClient::~RdzvClient() {
  if (fd_ >= 0) close(fd_);
}

std::string RdzvClient::local_host() const {
  sockaddr_in self{};
  socklen_t len = sizeof self;
  if (fd_ < 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&self), &len) != 0) return "";
  char text[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &self.sin_addr, text, sizeof text);
  return text;
}

Result<std::vector<std::string>> RdzvClient::call(uint8_t op,
                                                  const std::vector<std::string>& fields,
                                                  std::chrono::milliseconds wait) {
  const std::string lost = "lost the rendezvous store at " + address_;
  if (fd_ < 0) return Error{lost, {}};
  std::string why = "it closed the connection";
  uint8_t status = 0;
  std::vector<std::string> reply;
  if (!wire::send_message(fd_, op, fields) ||
      !wire::recv_message(fd_, Clock::now() + wait + kAnswerMargin, &status, &reply, &why)) {
    close(fd_);  // a late reply would be taken for the next request's
    fd_ = -1;
    return Error{lost + ": " + why, {}};
  }
  if (status == wire::kTimedOut) return std::vector<std::string>{};
  if (status != wire::kOk)
    return Error{"the rendezvous store at " + address_ +
                     " failed a request: " + (reply.empty() ? "no reason" : reply[0]),
                 {}};
  return reply;
}

Status RdzvClient::set(const std::string& key, const std::string& value) {
  Result<std::vector<std::string>> r = call(wire::kSet, {key, value}, {});
  if (!r.ok()) return r.error();
  return Status::success();
}

Result<std::optional<std::string>> RdzvClient::get(const std::string& key,
                                                   std::chrono::milliseconds wait) {
  LOOM_ASSIGN_OR_RETURN(std::vector<std::string> r,
                        call(wire::kGet, {key, std::to_string(wait.count())}, wait));
  if (r.empty()) return std::optional<std::string>();
  return std::optional<std::string>(r[0]);
}

Result<int64_t> RdzvClient::add(const std::string& key, int64_t delta) {
  LOOM_ASSIGN_OR_RETURN(std::vector<std::string> r,
                        call(wire::kAdd, {key, std::to_string(delta)}, {}));
  if (r.empty()) return Error{"the rendezvous store gave no value for " + key, {}};
  return static_cast<int64_t>(std::strtoll(r[0].c_str(), nullptr, 10));
}

Result<std::string> RdzvClient::compare_set(const std::string& key, const std::string& expected,
                                            const std::string& desired) {
  LOOM_ASSIGN_OR_RETURN(std::vector<std::string> r,
                        call(wire::kCompareSet, {key, expected, desired}, {}));
  if (r.empty()) return Error{"the rendezvous store gave no value for " + key, {}};
  return r[0];
}

}  // namespace loom::launch
